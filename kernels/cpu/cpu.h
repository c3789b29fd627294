/* SPDX-License-Identifier: MIT */
/* Entry points of the CPU kernels, used by the CPU backend table. */
#ifndef INFINICP_KERNELS_CPU_H
#define INFINICP_KERNELS_CPU_H

#include "core/internal.h"

/* Per-context CPU state: worker threads. */
typedef struct cpi_cpu_state cpi_cpu_state;
cp_status cpi_cpu_state_create(int num_threads, cpi_cpu_state **out);
void cpi_cpu_state_destroy(void *state);
int cpi_cpu_state_threads(const cpi_cpu_state *s);

cp_status cpi_cpu_convert(void *state, void *dst, cp_dtype dst_type, const void *src, cp_dtype src_type,
                          size_t count);
cp_status cpi_cpu_reduce(void *state, void *acc, const void *x, cp_dtype dtype, size_t count,
                         cp_reduce_op op);

cp_status cpi_cpu_attn_workspace_size(void *state, const cp_kernel_attn_args *a, int backward,
                                      size_t *bytes);
cp_status cpi_cpu_attn_forward(void *state, const cp_kernel_attn_args *a);
cp_status cpi_cpu_attn_backward(void *state, const cp_kernel_attn_args *a);
cp_status cpi_cpu_merge(void *state, const cp_kernel_merge_args *a);

#endif
