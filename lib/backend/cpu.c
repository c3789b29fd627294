/* SPDX-License-Identifier: MIT */
/* The built-in CPU backend: host memory, and the kernels of kernels/cpu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/elem.h"
#include "kernels/cpu/cpu.h"

static cp_status cpu_open(int device_index, void *stream, int num_threads, void **state)
{
    (void)device_index;
    (void)stream;
    if (num_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        num_threads = n > 0 ? (int)n : 1;
    }
    return cpi_cpu_state_create(num_threads, (cpi_cpu_state **)state);
}

static void cpu_close(void *state)
{
    cpi_cpu_state_destroy(state);
}

static cp_status cpu_set_stream(void *state, void *stream)
{
    (void)state;
    (void)stream;
    return CP_SUCCESS;
}

static cp_status cpu_synchronize(void *state)
{
    (void)state; /* CPU work is complete when the call returns */
    return CP_SUCCESS;
}

static cp_status cpu_alloc(void *state, size_t bytes, void **ptr)
{
    (void)state;
    /* 64-byte alignment: whole cache lines and any vector width. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "allocation of %zu bytes overflows", bytes);
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "out of host memory allocating %zu bytes", bytes);
    *ptr = p;
    return CP_SUCCESS;
}

static void cpu_free(void *state, void *ptr)
{
    (void)state;
    free(ptr);
}

static cp_status cpu_copy_2d(void *state, void *dst, size_t dpitch, const void *src, size_t spitch,
                             size_t width, size_t height, cp_copy_kind kind)
{
    (void)state;
    (void)kind; /* every kind is host memory here */
    if (dpitch == width && spitch == width) {
        memmove(dst, src, width * height);
        return CP_SUCCESS;
    }
    for (size_t r = 0; r < height; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return CP_SUCCESS;
}

static cp_status cpu_memset(void *state, void *dst, int value, size_t bytes)
{
    (void)state;
    memset(dst, value, bytes);
    return CP_SUCCESS;
}

static cp_status cpu_row_dot(void *state, float *d, const void *x, const void *y, cp_dtype t, int64_t batch,
                             int64_t seq, int32_t heads, int32_t dim, int64_t sb, int64_t ss, int64_t sh)
{
    (void)state;
    if (t != CP_DTYPE_F32 && t != CP_DTYPE_F16 && t != CP_DTYPE_BF16)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "cpu row_dot: t = %d (must be F32, F16 or BF16)", (int)t);
    const size_t es = cpi_dtype_size(t);
    for (int64_t b = 0; b < batch; b++)
        for (int32_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < seq; i++) {
                const size_t at = (size_t)(b * sb + i * ss + (int64_t)h * sh) * es;
                float acc = 0.0f;
                for (int32_t e = 0; e < dim; e++)
                    acc += (float)cpi_load_elem((const char *)x + at, t, (size_t)e) *
                           (float)cpi_load_elem((const char *)y + at, t, (size_t)e);
                d[((size_t)b * (size_t)heads + (size_t)h) * (size_t)seq + (size_t)i] = acc;
            }
    return CP_SUCCESS;
}

/* In double, rows in order (also the host sum of sinks.c for device
 * backends without sink_grad). */
static cp_status cpu_sink_grad(void *state, float *g, const float *sinks, const float *lse, const float *rows,
                               int64_t batch, int64_t seq, int32_t heads)
{
    (void)state;
    for (int32_t h = 0; h < heads; h++) {
        double sum = 0;
        for (int64_t b = 0; b < batch; b++)
            for (int64_t i = 0; i < seq; i++) {
                const size_t at = ((size_t)b * (size_t)heads + (size_t)h) * (size_t)seq + (size_t)i;
                if (lse[at] == -INFINITY)
                    continue; /* no key and no sink weight */
                sum -= exp((double)sinks[h] - (double)lse[at]) * (double)rows[at];
            }
        g[h] = (float)sum;
    }
    return CP_SUCCESS;
}

static const cp_backend_ops cpu_ops = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_backend_ops),
    .name = "cpu",
    .device = CP_DEVICE_CPU,
    .open = cpu_open,
    .close = cpu_close,
    .set_stream = cpu_set_stream,
    .synchronize = cpu_synchronize,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_2d = cpu_copy_2d,
    .memset = cpu_memset,
    .convert = cpi_cpu_convert,
    .reduce = cpi_cpu_reduce,
    .attn_workspace_size = cpi_cpu_attn_workspace_size,
    .attn_forward = cpi_cpu_attn_forward,
    .attn_backward = cpi_cpu_attn_backward,
    .merge = cpi_cpu_merge,
    /* No set_deterministic: every CPU kernel sums in a fixed order, so its
     * results are bitwise reproducible whatever cp_context_config says. */
    /* windows, softcaps and rectangle lists (API 1.1) */
    .kernel_args_size = sizeof(cp_kernel_attn_args),
    .row_dot = cpu_row_dot,
    .sink_grad = cpu_sink_grad,
};

const cp_backend_ops *cpi_cpu_backend(void)
{
    return &cpu_ops;
}
