/* The header whose static inline functions build.rs compiles (bindgen wrap_static_fns). */
#include <infiniband/verbs.h>
