//! The Rust (bindgen) view of the rdma-core structures we exchange with libmana / libmlx5,
//! checked field by field against what the C compiler says (`layout_probe.c`, run by build.rs).
//! A mismatch means the bindings were generated against a different header than the one the
//! provider library was built with, and every pointer we read out of them would be garbage.

mod expected {
    include!(concat!(env!("OUT_DIR"), "/layout_expected.rs"));
}

use super::dv::*;
use core::mem::{offset_of, size_of};

/// The Rust side of every entry the probe prints, by the same name.
fn rust_layout(name: &str) -> Option<usize> {
    macro_rules! table {
        ($( $t:ident { $($($f:ident).+),* } ),* $(,)?) => {
            $(
                if name == stringify!($t) { return Some(size_of::<$t>()); }
                $(
                    if name == concat!(stringify!($t), ".", stringify!($($f).+)).replace(' ', "") {
                        return Some(offset_of!($t, $($f).+));
                    }
                )*
            )*
        };
    }
    table! {
        manadv_qp { sq_buf, sq_count, sq_size, sq_id, tx_vp_offset, db_page },
        manadv_cq { buf, count, cq_id },
        manadv_rwq { buf, count, size, wq_id, db_page },
        manadv_ctx_allocators { alloc, free, data },
        manadv_obj { qp.in_, qp.out, cq.in_, cq.out, rwq.in_, rwq.out },
        mlx5dv_qp { dbrec, sq.buf, sq.wqe_cnt, sq.stride, rq.buf, rq.wqe_cnt, rq.stride,
                    bf.reg, bf.size, comp_mask, uar_mmap_offset, tirn, tisn, rqn, sqn, tir_icm_addr },
        mlx5dv_cq { buf, dbrec, cqe_cnt, cqe_size, cq_uar, cqn, comp_mask },
        mlx5dv_rwq { buf, dbrec, wqe_cnt, stride, comp_mask },
        mlx5_cqe64 { sop_drop_qpn, timestamp, byte_cnt, wqe_counter, op_own },
        mlx5_wqe_ctrl_seg { },
        mlx5_wqe_eth_seg { },
        mlx5_wqe_data_seg { byte_count, lkey, addr },
    }
    None
}

#[test]
fn rust_bindings_match_the_c_headers() {
    assert!(expected::EXPECTED.len() > 50, "probe printed too little");
    let mut mismatches = Vec::new();
    for &(name, c_value) in expected::EXPECTED {
        // bindgen renames the C field `in` (a Rust keyword) to `in_`.
        let rust_name = name.replace(".in", ".in_");
        match rust_layout(&rust_name) {
            Some(r) if r == c_value => {}
            Some(r) => mismatches.push(format!("{name}: C says {c_value}, Rust says {r}")),
            None => mismatches.push(format!("{name}: not checked on the Rust side")),
        }
    }
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn known_abi_values_of_the_mana_structs() {
    // rdma-core providers/mana/manadv.h on LP64: two pointers and four u32 in manadv_qp.
    assert_eq!(size_of::<manadv_qp>(), 32);
    assert_eq!(offset_of!(manadv_qp, db_page), 24);
    assert_eq!(size_of::<manadv_cq>(), 16);
    assert_eq!(size_of::<manadv_rwq>(), 32);
    assert_eq!(size_of::<manadv_ctx_allocators>(), 24);
    assert_eq!(MANADV_OBJ_QP | MANADV_OBJ_CQ | MANADV_OBJ_RWQ, 7);
}
