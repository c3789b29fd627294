/* SPDX-License-Identifier: MIT */
#ifndef INFINICP_CONTEXT_H
#define INFINICP_CONTEXT_H

#include "backend/backend.h" /* a context is a backend's state: its users reach the tables here */
#include "core/internal.h"

struct cp_context {
    cp_device device;
    int device_index;
    int num_threads;
    int deterministic; /* as the backend was told (config or INFINICP_DETERMINISTIC=1) */
    void *stream;
    const cp_backend_ops *ops; /* never NULL */
    void *state;               /* the backend's */
};

/* Convenience: the cp_xfer describing buffers on this context. */
static inline cp_xfer cpi_xfer(const cp_context *ctx, int timeout_ms)
{
    cp_xfer x = { ctx->ops, ctx->state, timeout_ms };
    return x;
}

/* The copy kind for a copy between two buffers of this context's device. */
static inline cp_copy_kind cpi_local_copy_kind(const cp_context *ctx)
{
    return ctx->device == CP_DEVICE_CPU ? CP_COPY_HOST_TO_HOST : CP_COPY_DEVICE_TO_DEVICE;
}

#endif
