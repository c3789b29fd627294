/* SPDX-License-Identifier: MIT */
/* Element i of a host buffer of any cp_dtype, as a double: exact for every
 * type (the host loops of the CPU backend and of the core read tensors
 * through it). */
#ifndef INFINICP_CORE_ELEM_H
#define INFINICP_CORE_ELEM_H

#include <stddef.h>
#include <stdint.h>

#include <infinicp/infinicp.h>

#include "core/fp8.h"
#include "core/half.h"

static inline double cpi_load_elem(const void *p, cp_dtype t, size_t i)
{
    switch (t) {
    case CP_DTYPE_F32: return ((const float *)p)[i];
    case CP_DTYPE_F16: return cpi_f16_to_f32(((const uint16_t *)p)[i]);
    case CP_DTYPE_BF16: return cpi_bf16_to_f32(((const uint16_t *)p)[i]);
    case CP_DTYPE_F64: return ((const double *)p)[i];
    case CP_DTYPE_FP8_E4M3: return cpi_fp8_e4m3_to_f32(((const uint8_t *)p)[i]);
    }
    return 0;
}

#endif
