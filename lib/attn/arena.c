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
    return a->base + start;
}
