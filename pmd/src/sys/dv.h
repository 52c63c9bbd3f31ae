/* Headers bindgen reads: rdma-core's direct-verbs APIs for MANA and mlx5. */
#include <infiniband/verbs.h>
#include <infiniband/manadv.h>
#include <infiniband/mlx5dv.h>
