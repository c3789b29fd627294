/* SPDX-License-Identifier: MIT */
/* Per-context CPU state. */
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

struct cpi_cpu_state {
    int num_threads;
};

cp_status cpi_cpu_state_create(int num_threads, cpi_cpu_state **out)
{
    cpi_cpu_state *s = cpi_calloc(1, sizeof *s);
    if (!s)
        return CP_ERROR_OUT_OF_MEMORY;
    s->num_threads = num_threads;
    *out = s;
    return CP_SUCCESS;
}

void cpi_cpu_state_destroy(void *state)
{
    free(state);
}

int cpi_cpu_state_threads(const cpi_cpu_state *s)
{
    return s->num_threads;
}
