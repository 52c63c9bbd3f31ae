/* Prints, as a Rust table, the size and field offsets of the rdma-core structures the driver
 * shares with libmana / libmlx5, as this machine's C compiler lays them out. The Rust tests
 * compare the bindgen view against it (pmd/src/sys/layout.rs). */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/manadv.h>
#include <infiniband/mlx5dv.h>

#define SZ(t) printf("    (\"%s\", %zu),\n", #t, sizeof(struct t))
#define OFF(t, f) printf("    (\"%s.%s\", %zu),\n", #t, #f, offsetof(struct t, f))

int main(void)
{
    printf("/// (name, bytes) as the C compiler sees them: `struct` size or `struct.field` offset.\n");
    printf("pub const EXPECTED: &[(&str, usize)] = &[\n");
    SZ(manadv_qp); OFF(manadv_qp, sq_buf); OFF(manadv_qp, sq_count); OFF(manadv_qp, sq_size);
    OFF(manadv_qp, sq_id); OFF(manadv_qp, tx_vp_offset); OFF(manadv_qp, db_page);
    SZ(manadv_cq); OFF(manadv_cq, buf); OFF(manadv_cq, count); OFF(manadv_cq, cq_id);
    SZ(manadv_rwq); OFF(manadv_rwq, buf); OFF(manadv_rwq, count); OFF(manadv_rwq, size);
    OFF(manadv_rwq, wq_id); OFF(manadv_rwq, db_page);
    SZ(manadv_ctx_allocators); OFF(manadv_ctx_allocators, alloc);
    OFF(manadv_ctx_allocators, free); OFF(manadv_ctx_allocators, data);
    SZ(manadv_obj); OFF(manadv_obj, qp.in); OFF(manadv_obj, qp.out); OFF(manadv_obj, cq.in);
    OFF(manadv_obj, cq.out); OFF(manadv_obj, rwq.in); OFF(manadv_obj, rwq.out);
    SZ(mlx5dv_qp); OFF(mlx5dv_qp, dbrec); OFF(mlx5dv_qp, sq.buf); OFF(mlx5dv_qp, sq.wqe_cnt);
    OFF(mlx5dv_qp, sq.stride); OFF(mlx5dv_qp, rq.buf); OFF(mlx5dv_qp, rq.wqe_cnt);
    OFF(mlx5dv_qp, rq.stride); OFF(mlx5dv_qp, bf.reg); OFF(mlx5dv_qp, bf.size);
    OFF(mlx5dv_qp, comp_mask); OFF(mlx5dv_qp, uar_mmap_offset); OFF(mlx5dv_qp, tirn);
    OFF(mlx5dv_qp, tisn); OFF(mlx5dv_qp, rqn); OFF(mlx5dv_qp, sqn); OFF(mlx5dv_qp, tir_icm_addr);
    SZ(mlx5dv_cq); OFF(mlx5dv_cq, buf); OFF(mlx5dv_cq, dbrec); OFF(mlx5dv_cq, cqe_cnt);
    OFF(mlx5dv_cq, cqe_size); OFF(mlx5dv_cq, cq_uar); OFF(mlx5dv_cq, cqn); OFF(mlx5dv_cq, comp_mask);
    SZ(mlx5dv_rwq); OFF(mlx5dv_rwq, buf); OFF(mlx5dv_rwq, dbrec); OFF(mlx5dv_rwq, wqe_cnt);
    OFF(mlx5dv_rwq, stride); OFF(mlx5dv_rwq, comp_mask);
    SZ(mlx5_cqe64); OFF(mlx5_cqe64, sop_drop_qpn); OFF(mlx5_cqe64, timestamp); OFF(mlx5_cqe64, byte_cnt);
    OFF(mlx5_cqe64, wqe_counter); OFF(mlx5_cqe64, op_own);
    SZ(mlx5_wqe_ctrl_seg); SZ(mlx5_wqe_eth_seg); SZ(mlx5_wqe_data_seg);
    OFF(mlx5_wqe_data_seg, byte_count); OFF(mlx5_wqe_data_seg, lkey); OFF(mlx5_wqe_data_seg, addr);
    printf("];\n");
    return 0;
}
