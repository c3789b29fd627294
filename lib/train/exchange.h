/* SPDX-License-Identifier: MIT */
/* The small collectives the training helpers are built on: a few host
 * numbers all-reduced through a context's device, and the comparison of
 * the arguments of a collective call before any bucket moves. */
#ifndef INFINICP_TRAIN_EXCHANGE_H
#define INFINICP_TRAIN_EXCHANGE_H

#include "comm/group.h"

/* How long the helpers wait for a peer: they take no group, so they use the
 * library's default. */
#define CPI_TRAIN_TIMEOUT_MS CPI_DEFAULT_TIMEOUT_MS

/* The backend that serves memory of ctx's device: the CPU backend (which
 * needs no state) for host memory when ctx is NULL. */
static inline const cp_backend_ops *cpi_train_ops(const cp_context *ctx, void **state)
{
    *state = ctx ? ctx->state : NULL;
    return ctx ? ctx->ops : cpi_cpu_backend();
}

/* The transfer for buffers on ctx's device (host memory when ctx is NULL). */
static inline cp_xfer cpi_train_xfer(const cp_context *ctx)
{
    cp_xfer host = { NULL, NULL, CPI_TRAIN_TIMEOUT_MS };
    return ctx ? cpi_xfer(ctx, CPI_TRAIN_TIMEOUT_MS) : host;
}

/* v[0..n) = op over the ranks of comm, v in host memory. The numbers travel
 * through memory of ctx's device, so that transports which move only device
 * memory work too. */
cp_status cpi_train_all_reduce_host(cp_context *ctx, cp_comm *comm, double *v, size_t n, cp_reduce_op op);

/*
 * Collective: every rank learns whether all ranks passed the same `n`
 * fields (named by `names` for the message) and whether any rank rejected
 * its own arguments (`local` != CP_SUCCESS, whose message is this thread's
 * last error). Every rank calls it, also one with bad arguments, so that
 * no rank waits for a peer that has already given up.
 */
cp_status cpi_train_agree(const char *func, cp_context *ctx, cp_comm *comm, const uint64_t *fields,
                          const char *const *names, int n, cp_status local);

#endif
