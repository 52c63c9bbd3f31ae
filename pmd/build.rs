//! Generates the direct-verbs bindings (`manadv.h`, `mlx5dv.h`) with bindgen, links the
//! provider libraries, compiles the `static inline` functions of `<infiniband/verbs.h>` that
//! the PMD calls into a small static library (bindgen's `wrap_static_fns`), and runs a small C
//! probe that records the C compiler's view of the structures we share with rdma-core, so the
//! tests can compare it with the Rust view.

#[cfg(feature = "verbs")]
use std::env;
#[cfg(feature = "verbs")]
use std::path::PathBuf;
#[cfg(feature = "verbs")]
use std::process::Command;

const HEADER: &str = "src/sys/dv.h";
const PROBE: &str = "src/sys/layout_probe.c";
const INLINE_HEADER: &str = "src/sys/verbs_inline.h";

fn main() {
    println!("cargo:rerun-if-changed={HEADER}");
    println!("cargo:rerun-if-changed={PROBE}");
    println!("cargo:rerun-if-changed={INLINE_HEADER}");
    println!("cargo:rerun-if-changed=build.rs");
    // rdma-core is needed (headers, libraries) only with feature `verbs`; the device-model
    // build (`--no-default-features --features emu`) needs none of it.
    #[cfg(feature = "verbs")]
    verbs();
}

#[cfg(feature = "verbs")]
fn verbs() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));

    // libibverbs' include path (normally /usr/include) and the rdma-core version.
    let verbs = pkg_config_probe("libibverbs");
    let mut clang_args: Vec<String> = verbs
        .include_dirs
        .iter()
        .map(|p| format!("-I{p}"))
        .collect();
    clang_args.push("-I/usr/include".into());
    println!("cargo:rustc-env=PMD_RDMA_CORE_VERSION={}", verbs.version);
    for header in ["infiniband/manadv.h", "infiniband/mlx5dv.h"] {
        let found = verbs
            .include_dirs
            .iter()
            .map(String::as_str)
            .chain(["/usr/include"])
            .any(|dir| std::path::Path::new(dir).join(header).exists());
        assert!(
            found,
            "{header} not found: libibverbs {} is too old or incomplete. The MANA provider \
             (manadv.h) first shipped in rdma-core v44; install libibverbs-dev from rdma-core v44 \
             or newer (Debian bookworm has it)",
            verbs.version
        );
    }
    println!("cargo:rustc-link-lib=dylib=mana");
    println!("cargo:rustc-link-lib=dylib=mlx5");
    println!("cargo:rustc-link-lib=dylib=ibverbs");

    let bindings = bindgen::Builder::default()
        .header(HEADER)
        .clang_args(&clang_args)
        .allowlist_function("manadv_.*")
        .allowlist_function("mlx5dv_init_obj")
        .allowlist_function("mlx5dv_query_device")
        .allowlist_function("mlx5dv_is_supported")
        .allowlist_function("mlx5dv_set_context_attr")
        .allowlist_function("mlx5dv_create_cq")
        .allowlist_function("mlx5dv_create_wq")
        .allowlist_type("manadv_.*")
        .allowlist_type("mlx5dv_(qp|cq|rwq|obj|context|srq|dm|ah|pd|devx_obj)")
        .allowlist_type(
            "mlx5dv_(ctx_allocators|cq_init_attr|wq_init_attr|striding_rq_init_attr|cqe_comp_caps|striding_rq_caps)",
        )
        .allowlist_type("mlx5dv_.*_(flags|mask|type|format|formats)")
        .allowlist_var("MLX5DV_.*")
        .allowlist_type("mlx5_wqe_.*")
        .allowlist_type("mlx5_cqe64")
        .allowlist_type("mlx5_mini_cqe8")
        .allowlist_type("mlx5_err_cqe")
        .allowlist_var("MLX5_.*")
        .allowlist_var("MANADV_.*")
        // Verbs objects are opaque here: their real definitions live in rdma-sys, and
        // `pmd::sys` casts between the two views of the same pointer in one place.
        .opaque_type("ibv_.*")
        .opaque_type("pthread_.*")
        // `packed` together with `aligned(4)` has no Rust equivalent; the hw::mlx5 view owns
        // this format, the binding only keeps its size.
        .opaque_type("mlx5_wqe_ctrl_seg")
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .prepend_enum_name(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("bindgen failed on manadv.h / mlx5dv.h: install libibverbs-dev and libclang-dev (see README)");
    bindings
        .write_to_file(out.join("dv_bindings.rs"))
        .expect("write dv_bindings.rs");

    verbs_inline(&out, &clang_args);
    run_layout_probe(&out, &clang_args);
}

/// The `static inline` functions of `<infiniband/verbs.h>` the PMD calls. They dispatch
/// through the `struct verbs_context` op table of the context, so they exist only in the
/// header; `ibv_query_port` is a macro for `___ibv_query_port`.
#[cfg(feature = "verbs")]
const VERBS_INLINES: &[&str] = &[
    "ibv_query_device_ex",
    "ibv_alloc_parent_domain",
    "ibv_create_cq_ex",
    "ibv_cq_ex_to_cq",
    "ibv_create_wq",
    "ibv_modify_wq",
    "ibv_destroy_wq",
    "ibv_create_rwq_ind_table",
    "ibv_destroy_rwq_ind_table",
    "ibv_create_qp_ex",
    "ibv_create_flow",
    "ibv_destroy_flow",
    "___ibv_query_port",
];

/// Compiles the header's own inlines (see `pmd::sys::verbs`): bindgen writes one C wrapper
/// per inline, `<name>__extern`, into `verbs_inline.c`, which `cc` builds into a static
/// library, and Rust declarations of those wrappers into `verbs_inline.rs`. Only the
/// functions are generated; every type in their signatures is rdma-sys's (the generated
/// module starts with `use rdma_sys::*`), so the wrappers take and return the same pointers
/// as the rest of the verbs calls.
#[cfg(feature = "verbs")]
fn verbs_inline(out: &std::path::Path, clang_args: &[String]) {
    // The generated C file starts with `#include "<this path>"`, and it is compiled from
    // OUT_DIR, so the path must be absolute. (`header_contents` would not do: bindgen 0.73
    // leaves in-memory headers out of the generated C file.)
    let header =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join(INLINE_HEADER);
    let mut builder = bindgen::Builder::default()
        .header(header.to_str().expect("the source path is UTF-8"))
        .clang_args(clang_args)
        .wrap_static_fns(true)
        .wrap_static_fns_path(out.join("verbs_inline"))
        // Nothing but the listed functions: no types, no constants.
        .allowlist_recursively(false)
        .raw_line("use rdma_sys::*;")
        .size_t_is_usize(true)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for f in VERBS_INLINES {
        builder = builder.allowlist_function(format!("^{f}$"));
    }
    let bindings = builder
        .generate()
        .expect("bindgen failed on infiniband/verbs.h: install libibverbs-dev and libclang-dev (see README)");
    bindings
        .write_to_file(out.join("verbs_inline.rs"))
        .expect("write verbs_inline.rs");

    cc::Build::new()
        .file(out.join("verbs_inline.c"))
        .includes(clang_args.iter().filter_map(|a| a.strip_prefix("-I")))
        .warnings(true)
        .compile("verbs_inline");
}

#[cfg(feature = "verbs")]
struct PkgConfig {
    version: String,
    include_dirs: Vec<String>,
}

#[cfg(feature = "verbs")]
fn pkg_config_probe(name: &str) -> PkgConfig {
    let run = |arg: &str| -> Option<String> {
        let o = Command::new("pkg-config").args([arg, name]).output().ok()?;
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let version = run("--modversion").unwrap_or_else(|| {
        panic!("pkg-config cannot find {name}: install libibverbs-dev and pkg-config (see README)")
    });
    let include_dirs = run("--cflags-only-I")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.strip_prefix("-I").map(str::to_string))
        .collect();
    PkgConfig {
        version,
        include_dirs,
    }
}

#[cfg(feature = "verbs")]
/// Compiles and runs `layout_probe.c` for the host, turning what the C compiler says about
/// sizes and offsets into a Rust table (`layout_expected.rs`).
fn run_layout_probe(out: &std::path::Path, clang_args: &[String]) {
    let exe = out.join("layout_probe");
    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    let status = compiler
        .to_command()
        .args(clang_args)
        .arg("-o")
        .arg(&exe)
        .arg(PROBE)
        .status()
        .expect("run the C compiler for the layout probe");
    assert!(status.success(), "the C layout probe did not compile");
    let o = Command::new(&exe).output().expect("run the layout probe");
    assert!(o.status.success(), "the layout probe failed");
    std::fs::write(out.join("layout_expected.rs"), o.stdout).expect("write layout_expected.rs");
}
