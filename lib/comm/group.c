/* SPDX-License-Identifier: MIT */
/* cp_group: a context, the CP communicator, and the a2a / p2p
 * sub-communicators the hybrid mode runs its two stages on. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "comm/agree.h"
#include "comm/group.h"

/* First published cp_group_config: everything up to num_streams. */
#define GROUP_CONFIG_V1_SIZE (offsetof(cp_group_config, num_streams) + sizeof(int))

/* More compute streams than this buys no further overlap. */
#define MAX_STREAMS 64

static cp_status check_config(const cp_group_config *c, int size)
{
    CPI_CHECK(c->a2a_size >= 1, "cp_group_create: cfg->a2a_size = %d (must be >= 1)", c->a2a_size);
    CPI_CHECK(size % c->a2a_size == 0,
              "cp_group_create: cfg->a2a_size = %d does not divide the communicator size %d", c->a2a_size,
              size);
    CPI_CHECK(c->timeout_ms > 0, "cp_group_create: cfg->timeout_ms = %d (must be > 0)", c->timeout_ms);
    CPI_CHECK(c->num_streams >= 1 && c->num_streams <= MAX_STREAMS,
              "cp_group_create: cfg->num_streams = %d (must be in [1, %d])", c->num_streams, MAX_STREAMS);
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_group_create(cp_context *ctx, cp_comm *comm, const cp_group_config *cfg, cp_group **out)
{
    if (out)
        *out = NULL;
    CPI_CHECK_PTR(comm);
    /* A rank with bad arguments still takes part in the agreement, so that
     * its peers fail at once. Ranks with different a2a sizes would split
     * into inconsistent sub-groups: they are compared there too. */
    static const cp_group_config defaults = CP_GROUP_CONFIG_INIT;
    cp_group_config c = defaults;
    cp_status local = CP_SUCCESS;
    if (!out)
        local = cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: out is NULL", __func__);
    else if (!ctx)
        local = cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: ctx is NULL", __func__);
    else if ((local = cpi_copy_config(&c, sizeof c, &defaults, cfg, GROUP_CONFIG_V1_SIZE, __func__, "cfg")) ==
             CP_SUCCESS)
        local = check_config(&c, comm->size);
    cp_group *g = NULL;
    if (local == CP_SUCCESS && !(g = cpi_calloc(1, sizeof *g)))
        local = CP_ERROR_OUT_OF_MEMORY;
    const cpi_agree_field fields[] = { { "cfg->a2a_size", (uint64_t)c.a2a_size, false } };
    const cpi_agree_call call = { .func = __func__,
                                  .ctx = ctx,
                                  .comm = comm,
                                  .timeout_ms = local == CP_SUCCESS ? c.timeout_ms : defaults.timeout_ms,
                                  .fields = fields,
                                  .nfields = 1 };
    cpi_agreement ag;
    cp_status s = cpi_agree_open(&ag, &call, local);
    if (s != CP_SUCCESS) {
        free(g);
        return s;
    }

    g->ctx = ctx;
    g->comm = comm;
    g->cfg = c;
    g->rank = comm->rank;
    g->size = comm->size;
    /* a2a: consecutive blocks of a2a_size ranks; p2p: one rank of each block. */
    int a = c.a2a_size;
    s = cpi_comm_split(comm, comm->rank / a, comm->rank, c.timeout_ms, &g->a2a);
    if (s == CP_SUCCESS)
        s = cpi_comm_split(comm, comm->rank % a, comm->rank, c.timeout_ms, &g->p2p);
    if (s != CP_SUCCESS) {
        cp_group_destroy(g);
        return s;
    }
    *out = g;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_group_rank(const cp_group *g, int *rank)
{
    CPI_CHECK_PTR(rank);
    *rank = -1;
    CPI_CHECK_PTR(g);
    *rank = g->rank;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_group_size(const cp_group *g, int *size)
{
    CPI_CHECK_PTR(size);
    *size = 0;
    CPI_CHECK_PTR(g);
    *size = g->size;
    return CP_SUCCESS;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The sub-communicators' pending work gets one timeout in all: each wait has
 * what is left of it (at least 1 ms, since 0 would mean forever). A
 * transport that gives up aborts the communicators it owns and records why
 * in cp_last_error(), so the destroys after this do not wait again. */
static void drain(cp_group *g)
{
    const int64_t end = now_ms() + g->cfg.timeout_ms;
    cp_comm *const subs[2] = { g->a2a, g->p2p };
    for (int i = 0; i < 2; i++) {
        if (!subs[i])
            continue;
        const int64_t left = end - now_ms();
        cp_xfer x = { NULL, NULL, left < 1 ? 1 : (int)left };
        (void)cpi_comm_wait(subs[i], &x);
    }
}

CP_EXPORT void cp_group_destroy(cp_group *g)
{
    if (!g)
        return;
    drain(g);
    cp_comm_destroy(g->a2a);
    cp_comm_destroy(g->p2p);
    free(g);
}
