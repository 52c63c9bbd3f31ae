/* The rdma-core headers whose types the fake shares with its callers. */
#include <infiniband/verbs.h>
#include <infiniband/manadv.h>
#include <infiniband/mlx5dv.h>
