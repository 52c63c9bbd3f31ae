//! `libmlx5`'s direct-verbs entry points. Every context of the fake is a MANA context, so
//! they answer as rdma-core v44 does for a context that is not mlx5: `mlx5_get_dv_ops`
//! finds no mlx5 ops and the call returns EOPNOTSUPP (providers/mlx5/mlx5.c, l. 2047–2107
//! for `mlx5dv_init_obj`). mlx5 devices come with the mlx5 driver.

use crate::ffi::*;
use crate::state::{addr, call_int};
use serde_json::json;
use std::ffi::{c_int, c_void};

export!("MLX5_1.2" fn mlx5dv_init_obj(o: *mut mlx5dv_obj, obj_type: u64) -> c_int {
    let _ = o;
    call_int("mlx5dv_init_obj", json!({"obj_type": obj_type}), |_| Err(libc::EOPNOTSUPP))
});

export!("MLX5_1.0" fn mlx5dv_query_device(ctx: *mut ibv_context, attrs: *mut mlx5dv_context) -> c_int {
    let _ = attrs;
    call_int("mlx5dv_query_device", json!({"context": addr(ctx)}), |_| Err(libc::EOPNOTSUPP))
});

export!("MLX5_1.2" fn mlx5dv_set_context_attr(ctx: *mut ibv_context, type_: u32, attr: *mut c_void) -> c_int {
    let _ = attr;
    call_int("mlx5dv_set_context_attr", json!({"context": addr(ctx), "type": type_}), |_| Err(libc::EOPNOTSUPP))
});

export!("MLX5_1.8" fn mlx5dv_is_supported(device: *mut ibv_device) -> bool {
    // Only devices the mlx5 provider matched are supported; the fake has none.
    call_int("mlx5dv_is_supported", json!({"device": addr(device)}), |_| Ok(0)) != 0
});
