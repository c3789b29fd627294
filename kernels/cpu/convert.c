/* SPDX-License-Identifier: MIT */
/* Element-wise dtype conversion and reduction on host memory. */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/half.h"

/* Load element i of a buffer of type t as double (exact for every dtype). */
static inline double load(const void *p, cp_dtype t, size_t i)
{
    switch (t) {
    case CP_DTYPE_F32: return ((const float *)p)[i];
    case CP_DTYPE_F16: return cpi_f16_to_f32(((const uint16_t *)p)[i]);
    case CP_DTYPE_BF16: return cpi_bf16_to_f32(((const uint16_t *)p)[i]);
    case CP_DTYPE_F64: return ((const double *)p)[i];
    }
    return 0;
}

/* Store as type t, rounding once to nearest even (F16/BF16 go through f32,
 * which is exact for any value that came from an F32, F16 or BF16). */
static inline void store(void *p, cp_dtype t, size_t i, double v)
{
    switch (t) {
    case CP_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case CP_DTYPE_F16: ((uint16_t *)p)[i] = cpi_f32_to_f16((float)v); break;
    case CP_DTYPE_BF16: ((uint16_t *)p)[i] = cpi_f32_to_bf16((float)v); break;
    case CP_DTYPE_F64: ((double *)p)[i] = v; break;
    }
}

cp_status cpi_cpu_convert(void *state, void *dst, cp_dtype dst_type, const void *src, cp_dtype src_type,
                          size_t count)
{
    (void)state;
    if (!cpi_dtype_valid(dst_type) || !cpi_dtype_valid(src_type))
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "convert: dtype %d -> %d", (int)src_type,
                         (int)dst_type);
    for (size_t i = 0; i < count; i++)
        store(dst, dst_type, i, load(src, src_type, i));
    return CP_SUCCESS;
}

cp_status cpi_cpu_reduce(void *state, void *acc, const void *x, cp_dtype dtype, size_t count,
                         cp_reduce_op op)
{
    (void)state;
    if (!cpi_dtype_valid(dtype))
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "reduce: dtype = %d", (int)dtype);
    if (op != CP_REDUCE_SUM && op != CP_REDUCE_MAX)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "reduce: op = %d", (int)op);
    for (size_t i = 0; i < count; i++) {
        double a = load(acc, dtype, i), b = load(x, dtype, i);
        double r = op == CP_REDUCE_SUM ? a + b : (a >= b || b != b ? (b != b ? b : a) : b);
        if (dtype == CP_DTYPE_F32 || dtype == CP_DTYPE_F16 || dtype == CP_DTYPE_BF16)
            r = (float)r; /* the sum is formed in fp32 */
        store(acc, dtype, i, r);
    }
    return CP_SUCCESS;
}
