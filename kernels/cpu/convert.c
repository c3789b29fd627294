/* SPDX-License-Identifier: MIT */
/*
 * Element-wise dtype conversion and reduction on host memory. F32 / F16 /
 * BF16 go through the vectorised tile loads and stores (widen exactly, form
 * the sum in fp32, round once to nearest even), in blocks spread over the
 * context's threads; F64, FP8 and the MAX reduction take the scalar path.
 * FP8 E4M3 converts both ways (decoded exactly, encoded rounding once from
 * the exact value) but is no type of reductions: a sum of FP8 values has no
 * FP8 meaning the library could give it.
 */
#include "core/elem.h"
#include "core/fp8.h"
#include "core/half.h"
#include "kernels/cpu/cpu.h"

/* Elements per block of the vector path, and per thread at least. */
#define BLOCK 2048
#define PER_THREAD (64 * 1024)

/* Store as type t, rounding once to nearest even (F16/BF16 go through f32,
 * which is exact for any value that came from an F32, F16 or BF16; FP8 is
 * rounded from the double itself). */
static inline void store(void *p, cp_dtype t, size_t i, double v)
{
    switch (t) {
    case CP_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case CP_DTYPE_F16: ((uint16_t *)p)[i] = cpi_f32_to_f16((float)v); break;
    case CP_DTYPE_BF16: ((uint16_t *)p)[i] = cpi_f32_to_bf16((float)v); break;
    case CP_DTYPE_F64: ((double *)p)[i] = v; break;
    case CP_DTYPE_FP8_E4M3: ((uint8_t *)p)[i] = cpi_f64_to_fp8_e4m3(v); break;
    }
}

static bool is_f32_family(cp_dtype t)
{
    return t == CP_DTYPE_F32 || t == CP_DTYPE_F16 || t == CP_DTYPE_BF16;
}

typedef struct {
    const cpi_tile_ops *tiles;
    void *dst;
    const void *src;
    cp_dtype dst_t, src_t;
    size_t count;
    int add; /* reduce: dst += src */
} elementwise_job;

static void elementwise_task(void *arg, int tid, int nt)
{
    const elementwise_job *j = arg;
    size_t lo = j->count * (size_t)tid / (size_t)nt, hi = j->count * (size_t)(tid + 1) / (size_t)nt;
    size_t ds = cpi_dtype_size(j->dst_t), ss = cpi_dtype_size(j->src_t);
    float buf[BLOCK];
    for (size_t i = lo; i < hi; i += BLOCK) {
        size_t n = hi - i < BLOCK ? hi - i : BLOCK;
        j->tiles->load(buf, (const char *)j->src + i * ss, j->src_t, n, n, 1.0f);
        j->tiles->store((char *)j->dst + i * ds, j->dst_t, buf, n, 1.0f, j->add);
    }
}

static void run_elementwise(cpi_cpu_state *s, elementwise_job *j)
{
    j->tiles = cpi_cpu_state_tiles(s);
    size_t useful = j->count / PER_THREAD + 1;
    int threads = cpi_cpu_state_threads(s);
    if ((size_t)threads > useful)
        threads = (int)useful;
    cpi_cpu_parallel(s, threads, elementwise_task, j);
}

cp_status cpi_cpu_convert(void *state, void *dst, cp_dtype dst_type, const void *src, cp_dtype src_type,
                          size_t count)
{
    if (!cpi_dtype_valid(dst_type) || !cpi_dtype_valid(src_type))
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "convert: dtype %d -> %d", (int)src_type,
                         (int)dst_type);
    if (is_f32_family(dst_type) && is_f32_family(src_type)) {
        elementwise_job j = {NULL, dst, src, dst_type, src_type, count, 0};
        run_elementwise(state, &j);
        return CP_SUCCESS;
    }
    for (size_t i = 0; i < count; i++)
        store(dst, dst_type, i, cpi_load_elem(src, src_type, i));
    return CP_SUCCESS;
}

cp_status cpi_cpu_reduce(void *state, void *acc, const void *x, cp_dtype dtype, size_t count,
                         cp_reduce_op op)
{
    if (!cpi_dtype_valid(dtype))
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "reduce: dtype = %d", (int)dtype);
    if (dtype == CP_DTYPE_FP8_E4M3)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "reduce: dtype = CP_DTYPE_FP8_E4M3 (no type of reductions)");
    if (op != CP_REDUCE_SUM && op != CP_REDUCE_MAX)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "reduce: op = %d", (int)op);
    if (op == CP_REDUCE_SUM && is_f32_family(dtype)) {
        elementwise_job j = {NULL, acc, x, dtype, dtype, count, 1};
        run_elementwise(state, &j);
        return CP_SUCCESS;
    }
    for (size_t i = 0; i < count; i++) {
        double a = cpi_load_elem(acc, dtype, i), b = cpi_load_elem(x, dtype, i);
        /* MAX: a NaN on either side wins, as in the fp32 sum */
        double r = op == CP_REDUCE_SUM ? a + b : a != a ? a : b != b ? b : a >= b ? a : b;
        if (dtype == CP_DTYPE_F32 || dtype == CP_DTYPE_F16 || dtype == CP_DTYPE_BF16)
            r = (float)r; /* the sum is formed in fp32 */
        store(acc, dtype, i, r);
    }
    return CP_SUCCESS;
}
