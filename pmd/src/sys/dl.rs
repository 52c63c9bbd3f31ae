//! Whether a shared library can be loaded, and which file it is (`dlopen(3)`, `dladdr(3)`):
//! how `pmd-devices --check` finds the rdma-core libraries a port needs (`libmana.so.1`,
//! `libmlx5.so.1`) and their versions, without linking them.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// Loads the library `soname` (as the dynamic linker would find it: `LD_LIBRARY_PATH`, the
/// ld.so cache, the default directories) and returns the file that defines `symbol`, with
/// symbolic links resolved (`/usr/lib/x86_64-linux-gnu/libmana.so.1.0.44.0`), so its name
/// carries the version.
///
/// The library stays loaded: an rdma-core provider registers itself with libibverbs when it
/// is loaded, and libibverbs keeps that registration, so unloading it again could leave
/// libibverbs pointing into unmapped memory.
///
/// # Errors
/// The dynamic linker's message (`libmana.so.1: cannot open shared object file: No such file
/// or directory`), or that the library lacks `symbol`.
pub fn library_file(soname: &str, symbol: &str) -> Result<PathBuf, String> {
    let name = CString::new(soname).map_err(|_| format!("{soname:?}: not a library name"))?;
    let sym = CString::new(symbol).map_err(|_| format!("{symbol:?}: not a symbol name"))?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call. Loading runs the
    // library's constructors, which is what linking it into a tool does as well.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(dl_error().unwrap_or_else(|| format!("{soname}: cannot be loaded")));
    }
    // SAFETY: `handle` came from a successful dlopen above and is never closed (see the
    // function docs); `sym` is NUL-terminated and outlives the call.
    let addr = unsafe { libc::dlsym(handle, sym.as_ptr()) };
    if addr.is_null() {
        return Err(format!("{soname} was loaded but has no {symbol}"));
    }
    // SAFETY: Dl_info is plain old data (pointers that may be null); all-zero is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` is a symbol address dlsym just returned from a library that stays
    // loaded; `info` is a valid, exclusively borrowed Dl_info for the call.
    let found = unsafe { libc::dladdr(addr.cast_const(), &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return Err(format!(
            "{soname}: the dynamic linker cannot say which file it is"
        ));
    }
    // SAFETY: after a successful dladdr, `dli_fname` is the NUL-terminated path of the loaded
    // object, owned by the dynamic linker for as long as the object stays loaded (forever).
    let file = unsafe { CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(file.to_string_lossy().into_owned());
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}

/// The last dynamic-linker error of this thread, if any.
fn dl_error() -> Option<String> {
    // SAFETY: dlerror takes no arguments; it returns NULL or a NUL-terminated message that
    // stays valid until the next dl* call on this thread, and we copy it at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return None;
    }
    // SAFETY: checked non-null above; see the previous comment for its lifetime.
    Some(
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_is_found_and_a_missing_library_says_why() {
        let libc_file = library_file("libc.so.6", "getpid").unwrap();
        assert!(libc_file.is_absolute(), "{}", libc_file.display());
        assert!(
            libc_file.to_string_lossy().contains("libc"),
            "{}",
            libc_file.display()
        );
        let e = library_file("libpmd-no-such-library.so.9", "x").unwrap_err();
        assert!(e.contains("libpmd-no-such-library.so.9"), "{e}");
        let e = library_file("libc.so.6", "pmd_no_such_symbol").unwrap_err();
        assert!(e.contains("has no pmd_no_such_symbol"), "{e}");
    }
}
