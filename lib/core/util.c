/* SPDX-License-Identifier: MIT */
/* Versioned config structs, dtypes, allocation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

cp_status cpi_copy_config(void *dst, size_t dst_size, const void *defaults, const void *user,
                          size_t min_size, const char *func, const char *what)
{
    memcpy(dst, defaults, dst_size);
    if (!user)
        return CP_SUCCESS;
    size_t user_size;
    memcpy(&user_size, user, sizeof user_size);
    if (user_size < min_size)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT,
                         "%s: %s->struct_size = %zu (at least %zu; initialise it with the _INIT macro)",
                         func, what, user_size, min_size);
    /* A newer caller's extra fields are unknown to us and ignored; an older
     * caller's missing fields keep their defaults. */
    size_t n = user_size < dst_size ? user_size : dst_size;
    memcpy(dst, user, n);
    memcpy(dst, &dst_size, sizeof dst_size);
    return CP_SUCCESS;
}

size_t cpi_dtype_size(cp_dtype t)
{
    switch (t) {
    case CP_DTYPE_F32: return 4;
    case CP_DTYPE_F16: return 2;
    case CP_DTYPE_BF16: return 2;
    case CP_DTYPE_F64: return 8;
    case CP_DTYPE_FP8_E4M3: return 1;
    }
    return 0;
}

bool cpi_dtype_valid(cp_dtype t)
{
    return cpi_dtype_size(t) != 0;
}

const char *cpi_dtype_name(cp_dtype t)
{
    switch (t) {
    case CP_DTYPE_F32: return "F32";
    case CP_DTYPE_F16: return "F16";
    case CP_DTYPE_BF16: return "BF16";
    case CP_DTYPE_F64: return "F64";
    case CP_DTYPE_FP8_E4M3: return "FP8_E4M3";
    }
    return "unknown";
}

void *cpi_calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        cpi_error(CP_ERROR_OUT_OF_MEMORY, "out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

void cpi_list_add(char *buf, size_t cap, size_t *used, const char *name)
{
    if (*used < cap)
        *used += (size_t)snprintf(buf + *used, cap - *used, "%s%s", *used ? ", " : "", name);
}
