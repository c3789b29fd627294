/* SPDX-License-Identifier: MIT */
/* Private helpers shared by every part of the library. Not installed. */
#ifndef INFINICP_INTERNAL_H
#define INFINICP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infinicp/backend.h>
#include <infinicp/infinicp.h>

/* The one export macro: the library is built with hidden visibility, and
 * only definitions marked CP_EXPORT (and listed in the version script) are
 * visible to users. */
#define CP_EXPORT __attribute__((visibility("default")))

#if defined(__GNUC__)
#define CP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CP_PRINTF(a, b)
#endif

/* Record a failure for cp_last_error() and return s. The message should name
 * the function, the argument and its value: "cp_foo: bar = -1 (must be > 0)". */
cp_status cpi_error(cp_status s, const char *fmt, ...) CP_PRINTF(2, 3);

/* Return CP_ERROR_INVALID_ARGUMENT with a formatted message unless cond. */
#define CPI_CHECK(cond, ...)                                                      \
    do {                                                                          \
        if (!(cond))                                                              \
            return cpi_error(CP_ERROR_INVALID_ARGUMENT, __VA_ARGS__);             \
    } while (0)

/* The common NULL check; names the function and the argument. */
#define CPI_CHECK_PTR(ptr) CPI_CHECK((ptr) != NULL, "%s: %s is NULL", __func__, #ptr)

/* Propagate a failing status. */
#define CPI_TRY(expr)                                                             \
    do {                                                                          \
        cp_status cpi_try_s_ = (expr);                                            \
        if (cpi_try_s_ != CP_SUCCESS)                                             \
            return cpi_try_s_;                                                    \
    } while (0)

/* Copy a versioned config struct: min(user struct_size, ours) bytes over a
 * copy of the defaults. Fails for struct_size smaller than the first field
 * or than `min_size` (the size of the first published version). */
cp_status cpi_copy_config(void *dst, size_t dst_size, const void *defaults, const void *user,
                          size_t min_size, const char *func, const char *what);

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool cpi_mul(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool cpi_add(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* Do byte ranges [a, a + an) and [b, b + bn) share a byte? */
static inline bool cpi_overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* Bytes of one element; 0 for an unknown dtype. */
/* Append name to the comma-separated list in buf[cap] (*used bytes so far;
 * the list is cut where it no longer fits). */
void cpi_list_add(char *buf, size_t cap, size_t *used, const char *name);

/* For an X-macro list of a module table's required slots, in a function
 * with `ops` (the table), `buf`, `cap` and `size_t used` in scope: add the
 * name of each slot the table leaves NULL to the list in buf. */
#define CPI_LIST_NULL_SLOT(slot)                                                  \
    if (!ops->slot)                                                               \
        cpi_list_add(buf, cap, &used, #slot);

size_t cpi_dtype_size(cp_dtype t);
bool cpi_dtype_valid(cp_dtype t);
const char *cpi_dtype_name(cp_dtype t);

/* Allocation helpers (host memory) that record CP_ERROR_OUT_OF_MEMORY. */
void *cpi_calloc(size_t n, size_t size);

#endif
