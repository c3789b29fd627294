/* SPDX-License-Identifier: MIT */
/* Entry points of the CPU kernels, used by the CPU backend table. */
#ifndef INFINICP_KERNELS_CPU_H
#define INFINICP_KERNELS_CPU_H

#include "core/internal.h"
#include "kernels/cpu/tile.h"

/* Per-context CPU state: the tile primitives and a pool of worker threads. */
typedef struct cpi_cpu_state cpi_cpu_state;
cp_status cpi_cpu_state_create(int num_threads, cpi_cpu_state **out);
void cpi_cpu_state_destroy(void *state);
int cpi_cpu_state_threads(const cpi_cpu_state *s);
const cpi_tile_ops *cpi_cpu_state_tiles(const cpi_cpu_state *s);

/* Run fn(arg, t, n) for t = 0 .. n-1 on the context's threads (n is capped at
 * the thread count) and return when all have finished. */
typedef void (*cpi_task_fn)(void *arg, int t, int n);
void cpi_cpu_parallel(cpi_cpu_state *s, int n, cpi_task_fn fn, void *arg);

cp_status cpi_cpu_convert(void *state, void *dst, cp_dtype dst_type, const void *src, cp_dtype src_type,
                          size_t count);
cp_status cpi_cpu_reduce(void *state, void *acc, const void *x, cp_dtype dtype, size_t count,
                         cp_reduce_op op);

cp_status cpi_cpu_attn_workspace_size(void *state, const cp_kernel_attn_args *a, int backward,
                                      size_t *bytes);
cp_status cpi_cpu_attn_forward(void *state, const cp_kernel_attn_args *a);
cp_status cpi_cpu_attn_backward(void *state, const cp_kernel_attn_args *a);
cp_status cpi_cpu_merge(void *state, const cp_kernel_merge_args *a);

/*
 * (o, lse) <- merge((o, lse), (x, lse_x)) for one row of n values: o of type
 * ot, x in fp32, tmp n floats of scratch. A side with LSE -inf contributes
 * nothing: (o, lse) stay bit for bit when lse_x is -inf, and become exactly
 * (x, lse_x) when lse is.
 */
void cpi_cpu_merge_row(const cpi_tile_ops *t, void *o, cp_dtype ot, float *lse, float *lse_lo, const float *x,
                       double lse_x, int n, float *tmp);

#endif
