//! `PMD_NO_HUGEPAGES=1` forces the 4 KiB fallback, which warns exactly once per process.
//!
//! This file holds a single test: it sets a process-wide environment variable and installs
//! the global tracing subscriber.

use std::sync::{Arc, Mutex};

use mempool::{Error, PagePolicy, PageSize, Region, RegionOptions, NO_HUGEPAGES_ENV};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() == Level::WARN && meta.target() == "mempool" {
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0);
        }
    }
}

#[test]
fn env_forces_normal_pages_with_one_warning() {
    let warnings = Warnings::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(warnings.clone()))
        .unwrap();
    std::env::set_var(NO_HUGEPAGES_ENV, "1");

    for len in [4096, 3 << 20, 5 << 20] {
        let r = Region::new(len, &RegionOptions::default()).unwrap();
        assert_eq!(r.page_size(), PageSize::Normal4K, "len {len}");
    }
    let pool = mempool::Mempool::new(mempool::PoolConfig::new("env", 100, 2048)).unwrap();
    assert_eq!(pool.page_size(), PageSize::Normal4K);

    let seen = warnings.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "exactly one warning per process: {seen:?}");
    assert!(seen[0].contains(NO_HUGEPAGES_ENV), "{}", seen[0]);
    assert!(
        seen[0].contains("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
        "{}",
        seen[0]
    );
    assert!(
        seen[0].contains("mount -t hugetlbfs nodev /dev/hugepages"),
        "{}",
        seen[0]
    );

    // Requiring hugepages while the environment forbids them is an error, not a fallback.
    let err = Region::new(
        4096,
        &RegionOptions::with_policy(PagePolicy::Require(PageSize::Huge2M)),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::HugepagesDisabled {
                page_size: PageSize::Huge2M
            }
        ),
        "{err}"
    );

    // "0" means not set.
    std::env::set_var(NO_HUGEPAGES_ENV, "0");
    assert!(!mempool::region::hugepages_disabled_by_env());
    std::env::remove_var(NO_HUGEPAGES_ENV);
}
