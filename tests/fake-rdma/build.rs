//! Generates the rdma-core types (verbs.h, manadv.h, mlx5dv.h; types only, no functions) and
//! gives the shared object its identity: SONAME `libibverbs.so.1` and the version nodes of
//! the real libraries (`fake.map`).

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=fake.map");
    println!("cargo:rerun-if-changed=src/rdma.h");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let map =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("fake.map");

    // Versioned exports need rust-lld's handling of `.symver` next to rustc's own anonymous
    // version script (GNU ld refuses the combination); rustc uses rust-lld by default on
    // x86_64-unknown-linux-gnu.
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");

    let bindings = bindgen::Builder::default()
        .header("src/rdma.h")
        .clang_arg("-I/usr/include")
        .allowlist_type("ibv_.*")
        .allowlist_type("_compat_ibv_port_attr")
        .allowlist_type("verbs_context")
        .allowlist_type("manadv_.*")
        .allowlist_type("mlx5dv_.*")
        .allowlist_var("IBV_.*")
        .allowlist_var("MANADV_.*")
        .allowlist_var("MLX5DV_.*")
        .blocklist_type("pthread_.*")
        .raw_line("use libc::{pthread_cond_t, pthread_mutex_t};")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        .generate()
        .expect("bindgen failed on verbs.h / manadv.h / mlx5dv.h: install libibverbs-dev and libclang-dev (see README)");
    bindings
        .write_to_file(out.join("rdma.rs"))
        .expect("write rdma.rs");
}
