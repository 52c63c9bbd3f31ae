//! Making sure the fake can never be mistaken for hardware, nor mixed with the real stack:
//! a one-line banner on stderr when the library is loaded, and a refusal to run when a real
//! libibverbs, libmana or libmlx5 is mapped in the same process.

use std::ffi::{c_int, c_void, CStr};
use std::os::unix::fs::MetadataExt;
use std::sync::Once;

/// The banner every process on the fake prints once.
fn banner() {
    let profile = std::env::var("FAKE_RDMA_PROFILE").unwrap_or_else(|_| "v44".into());
    let sysfs = std::env::var("SYSFS_PATH").unwrap_or_else(|_| "/sys".into());
    eprintln!(
        "fake-rdma: this process runs on the FAKE rdma-core (profile {profile}, devices from {sysfs}); no hardware is used"
    );
}

/// (device, inode) of the file this code was loaded from.
fn own_file() -> Option<(u64, u64)> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: `dladdr` only reads the address (of a function of this object) and writes
    // `info`, a valid local.
    let ok = unsafe { libc::dladdr(own_file as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: on success `dli_fname` is the NUL-terminated path of the loaded object, owned
    // by the loader for the life of the mapping.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino()))
}

struct Scan {
    own: (u64, u64),
    foreign: Vec<String>,
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `dl_iterate_phdr` passes a valid `info` for the duration of the callback and
    // `data` is the `&mut Scan` given below.
    let (info, scan) = unsafe { (&*info, &mut *data.cast::<Scan>()) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_name` is a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }
        .to_string_lossy()
        .into_owned();
    let base = name.rsplit('/').next().unwrap_or(&name);
    let ours = ["libibverbs.so", "libmana.so", "libmlx5.so"]
        .iter()
        .any(|l| base.starts_with(l));
    if ours {
        if let Ok(m) = std::fs::metadata(&name) {
            if (m.dev(), m.ino()) != scan.own {
                scan.foreign.push(name);
            }
        }
    }
    0
}

fn refuse_if_mixed() {
    let Some(own) = own_file() else { return };
    let mut scan = Scan {
        own,
        foreign: Vec::new(),
    };
    // SAFETY: `visit` matches the callback type and only touches `scan` through `data`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut scan as *mut Scan).cast()) };
    if !scan.foreign.is_empty() {
        eprintln!(
            "fake-rdma: refusing to run: the real {} is also mapped in this process; the fake \
             must replace rdma-core (LD_LIBRARY_PATH), never sit beside it",
            scan.foreign.join(", ")
        );
        std::process::abort();
    }
}

static ONCE: Once = Once::new();

/// Prints the banner and checks the process, once.
pub fn check_once() {
    ONCE.call_once(|| {
        banner();
        refuse_if_mixed();
    });
}

extern "C" fn on_load() {
    check_once();
}

/// Runs [`check_once`] when the loader initialises the library, so even a program that never
/// calls verbs says it is on the fake.
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

extern "C" fn on_unload() {
    crate::events::restore_at_exit();
    crate::verbs::report_at_exit();
}

/// Says at exit how many verbs objects the process left alive (0 after a clean teardown),
/// so a leak shows in every run, and tests can check it after the process is gone; first
/// puts back the devices whose servicing this process started and did not end.
#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;
