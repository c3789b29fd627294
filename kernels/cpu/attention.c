/* SPDX-License-Identifier: MIT */
/* Placeholder until the fused CPU kernels land: every entry reports that the
 * kernel is not built yet. */
#include "kernels/cpu/cpu.h"

cp_status cpi_cpu_attn_workspace_size(void *state, const cp_kernel_attn_args *a, int backward,
                                      size_t *bytes)
{
    (void)state; (void)a; (void)backward; (void)bytes;
    return cpi_error(CP_ERROR_UNSUPPORTED, "CPU attention kernels are not built yet");
}
cp_status cpi_cpu_attn_forward(void *state, const cp_kernel_attn_args *a)
{
    (void)state; (void)a;
    return cpi_error(CP_ERROR_UNSUPPORTED, "CPU attention kernels are not built yet");
}
cp_status cpi_cpu_attn_backward(void *state, const cp_kernel_attn_args *a)
{
    (void)state; (void)a;
    return cpi_error(CP_ERROR_UNSUPPORTED, "CPU attention kernels are not built yet");
}
cp_status cpi_cpu_merge(void *state, const cp_kernel_merge_args *a)
{
    (void)state; (void)a;
    return cpi_error(CP_ERROR_UNSUPPORTED, "CPU merge kernel is not built yet");
}
