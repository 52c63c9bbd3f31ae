//! Keeps the layer arrows of `pmd` honest (see the crate docs and ARCHITECTURE.md): reads
//! every module's `crate::` paths and fails when one points up or sideways.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module and the modules it may use. Anything else is a wrong-way arrow.
const ALLOWED: &[(&str, &[&str])] = &[
    ("sys", &[]),
    ("log", &[]),
    ("hw", &[]),
    ("net", &[]),
    ("ring", &["sys"]),
    ("ethdev", &["net"]),
    ("capture", &["sys", "net"]),
    // lcore's stop signals give taken-over netdevs back before a second signal ends the process.
    ("lcore", &["sys", "log", "takeover"]),
    ("devices", &["net", "sys"]),
    ("takeover", &["devices", "sys"]),
    // Drivers: the contract below them, shared mechanics, formats; never a provider or port.
    ("mana", &["ethdev", "ring", "hw", "net", "sys", "takeover"]),
    ("mlx5", &["ethdev", "ring", "hw", "net", "sys"]),
    ("null", &["ethdev", "net"]),
    // Providers: implement a driver's provider trait; never name a port type.
    (
        "emu",
        &["mana", "mlx5", "ethdev", "ring", "hw", "net", "sys"],
    ),
    (
        "verbs",
        &["mana", "mlx5", "ethdev", "hw", "net", "sys", "devices"],
    ),
    // Multi-process control: the prefix's runtime directory is telemetry's.
    ("mp", &["sys", "telemetry"]),
    // Answers about ports from its own threads; nothing below uses it.
    ("telemetry", &["port", "ethdev", "net", "sys", "log"]),
    // The port layer; only the composition root names kinds (see KIND_NAMERS). `sys` for
    // poll(2) over the ports' event descriptors (`port::wait_events`) and the lock files.
    (
        "port",
        &[
            "ethdev", "net", "devices", "log", "mana", "mlx5", "null", "emu", "sys", "takeover",
            "capture", "verbs",
        ],
    ),
];

/// Driver and provider modules: only these files of `port` may name them.
const KINDS: &[&str] = &["mana", "null", "emu", "verbs", "mlx5"];
const KIND_NAMERS: &[&str] = &["port/probe.rs", "port/devargs.rs"];

/// Crate-root macros, not modules.
const MACROS: &[&str] = &["dp_trace", "enum_with_unknown", "queue_xstats"];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `crate::NAME` in the code of `text` (comments skipped), with its line number.
fn crate_refs(text: &str) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let tail = &rest[at + "crate::".len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `$crate::` inside macros and `super::crate` do not occur; skip `pmd_crate::`.
            let before = &rest[..at];
            if !before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
                refs.push((i + 1, name));
            }
            rest = tail;
        }
    }
    refs
}

fn violations(src: &Path) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel == "lib.rs" {
            continue;
        }
        let top = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let Some(ok) = allowed.get(top) else {
            bad.push(format!(
                "{rel}: module `{top}` has no place in the layer table"
            ));
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        for (line, name) in crate_refs(&text) {
            if name == top || MACROS.contains(&name.as_str()) {
                continue;
            }
            if !ok.contains(&name.as_str()) {
                bad.push(format!(
                    "{rel}:{line}: `{top}` uses crate::{name} (allowed: {ok:?})"
                ));
            } else if top == "port"
                && KINDS.contains(&name.as_str())
                && !KIND_NAMERS.contains(&rel.as_str())
            {
                bad.push(format!(
                    "{rel}:{line}: names the kind module crate::{name}; only {KIND_NAMERS:?} may"
                ));
            }
        }
    }
    bad
}

#[test]
fn every_arrow_points_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = violations(&src);
    assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
}

#[test]
fn the_checker_catches_a_wrong_way_arrow() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("ethdev")).unwrap();
    std::fs::create_dir_all(src.join("port")).unwrap();
    std::fs::write(src.join("ethdev/mod.rs"), "use crate::net::MacAddr;\n").unwrap();
    std::fs::write(src.join("hw.rs"), "// use crate::port::Port;\n").unwrap();
    assert!(violations(src).is_empty());
    // The contract naming a driver, and the port layer naming a kind outside the probe.
    std::fs::write(src.join("ethdev/burst.rs"), "use crate::mana::Driver;\n").unwrap();
    std::fs::write(
        src.join("port/mod.rs"),
        "fn f() { crate::emu::testing::mana(); }\n",
    )
    .unwrap();
    let bad = violations(src);
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].contains("ethdev/burst.rs:1") || bad[1].contains("ethdev/burst.rs:1"));
}

/// The modules whose files may allow unsafe code for the whole file (`#![allow(unsafe_code)]`):
/// `sys` (FFI, raw memory, barriers) and `verbs` (the RAII handles over rdma-core's objects,
/// which are FFI too: each holds a pointer rdma-core gave and frees it on drop). The crate
/// root denies unsafe code everywhere else.
const UNSAFE_MODULES: &[&str] = &["sys", "verbs"];

/// Files outside [`UNSAFE_MODULES`] that allow unsafe code on single items
/// (`#[allow(unsafe_code)]`), and how many: a device model's view of a registered chunk (the
/// model is the DMA device), and a test's view of a posted buffer.
const UNSAFE_ITEMS: &[(&str, usize)] = &[
    ("emu/mana/port.rs", 1),
    ("emu/mlx5/port.rs", 1),
    ("mlx5/rxq.rs", 1),
];

/// Where `dir`'s files allow unsafe code against the rules above, and `unsafe` blocks,
/// functions and impls without a `SAFETY` comment in the ten lines above them (or on the
/// line itself).
fn unsafe_violations(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rs_files(dir, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(dir)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let top = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let text = std::fs::read_to_string(&f).unwrap();
        let code: Vec<&str> = text.lines().collect();
        let whole = code
            .iter()
            .any(|l| l.trim_start().starts_with("#![allow(unsafe_code)]"));
        if whole && !UNSAFE_MODULES.contains(&top) {
            bad.push(format!(
                "{rel}: allows unsafe code for the whole file outside {UNSAFE_MODULES:?}"
            ));
        }
        let items = code
            .iter()
            .filter(|l| l.trim_start().starts_with("#[allow(unsafe_code)]"))
            .count();
        if items > 0 && !UNSAFE_MODULES.contains(&top) {
            let allowed = UNSAFE_ITEMS
                .iter()
                .find(|(f, _)| *f == rel)
                .map_or(0, |x| x.1);
            if items > allowed {
                bad.push(format!(
                    "{rel}: {items} items allow unsafe code ({allowed} allowed in UNSAFE_ITEMS)"
                ));
            }
        }
        if !whole && items == 0 {
            continue;
        }
        for (i, l) in code.iter().enumerate() {
            let t = l.trim_start();
            if t.starts_with("//") {
                continue;
            }
            let opens = t.contains("unsafe {")
                || t.starts_with("unsafe impl")
                || t.contains(" unsafe fn ")
                || t.starts_with("unsafe fn ")
                || t.starts_with("pub unsafe fn ")
                || t.starts_with("pub(crate) unsafe fn ")
                || t.starts_with("pub(super) unsafe fn ");
            if !opens {
                continue;
            }
            let from = i.saturating_sub(10);
            let documented = code[from..=i]
                .iter()
                .any(|l| l.contains("SAFETY") || l.contains("# Safety"));
            if !documented {
                bad.push(format!(
                    "{rel}:{}: `unsafe` without a SAFETY comment",
                    i + 1
                ));
            }
        }
    }
    bad
}

#[test]
fn unsafe_code_stays_inside_its_modules_with_a_safety_comment_each() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = unsafe_violations(&src);
    assert!(
        bad.is_empty(),
        "unsafe code out of place:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_unsafe_checker_catches_a_stray_allow_and_a_bare_block() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("mlx5")).unwrap();
    std::fs::write(
        src.join("mlx5/txq.rs"),
        "#![allow(unsafe_code)]\nfn f() {\n    let x = unsafe { g() };\n}\n",
    )
    .unwrap();
    std::fs::create_dir_all(src.join("sys")).unwrap();
    std::fs::write(
        src.join("sys/mem.rs"),
        "#![allow(unsafe_code)]\n// SAFETY: fine.\nunsafe impl Send for X {}\nunsafe impl Sync for X {}\n",
    )
    .unwrap();
    let bad = unsafe_violations(src);
    assert!(
        bad.iter()
            .any(|b| b.starts_with("mlx5/txq.rs: allows unsafe code")),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .any(|b| b == "mlx5/txq.rs:3: `unsafe` without a SAFETY comment"),
        "{bad:?}"
    );
    // Within ten lines of the comment: documented.
    assert!(!bad.iter().any(|b| b.starts_with("sys/")), "{bad:?}");
}
