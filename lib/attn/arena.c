/* SPDX-License-Identifier: MIT */
/* The workspace arena (see arena.h). */
#include "attn/arena.h"

void *cpi_arena_take(cpi_arena *a, size_t bytes)
{
    /* 256-byte alignment suits every vector unit and GPU access pattern. */
    size_t start, end;
    if (!cpi_add(a->used, 255, &start) || !cpi_add(start & ~(size_t)255, bytes, &end)) {
        a->overflow = 1;
        return NULL;
    }
    start &= ~(size_t)255;
    a->used = end;
    if (a->measuring)
        return NULL;
    if (end > a->cap) {
        /* the run takes more than was measured: a bug, never memory past the end */
        a->overflow = 1;
        return NULL;
    }
    return a->base + start;
}

cp_status cpi_arena_check(const cpi_arena *a, const char *what)
{
    if (!a->measuring && a->overflow)
        return cpi_error(CP_ERROR_INTERNAL, "%s: the call takes more workspace (%zu bytes so far) than the plan "
                         "measured (%zu)", what, a->used, a->cap);
    return CP_SUCCESS;
}
