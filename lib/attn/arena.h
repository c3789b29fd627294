/* SPDX-License-Identifier: MIT */
/* The workspace arena: a call's workspace carved into buffers by a bump
 * allocator. The same code that runs a call also sizes its workspace, by
 * running over a measuring arena that only counts. */
#ifndef INFINICP_ATTN_ARENA_H
#define INFINICP_ATTN_ARENA_H

#include "core/internal.h"

typedef struct cpi_arena {
    char *base;
    size_t used, cap;
    int measuring; /* count only: base is NULL */
    int overflow;  /* measuring: the total no longer fits in size_t */
} cpi_arena;

/* The next `bytes` of the arena, 256-byte aligned; NULL when measuring. A
 * total past SIZE_MAX sets `overflow`, and so does a real run that takes
 * more than the arena holds (then NULL: a run must fit in what was
 * measured, and cpi_arena_check says so before anything is used). */
void *cpi_arena_take(cpi_arena *a, size_t bytes);
/* CP_ERROR_INTERNAL, naming `what`, if a real run's takes overflowed. */
cp_status cpi_arena_check(const cpi_arena *a, const char *what);

#endif
