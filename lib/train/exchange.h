/* SPDX-License-Identifier: MIT */
/* Where the training helpers' buffers live and how long they wait; the
 * comparison of their arguments across ranks is comm/agree.h's. */
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

#endif
