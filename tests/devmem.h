/* SPDX-License-Identifier: MIT */
/*
 * Buffers on a context's device for suites whose data lives on the host and
 * that run on CPU contexts and, in their GPU builds (-DCPRUN_CUDA), on CUDA
 * ones: memory of the context's own backend (core/context.h), moved with
 * its copies. On a CPU context nothing is allocated or copied: the host
 * buffer is the device buffer, so the CPU suites run as before.
 *
 * Every function returns a status instead of asserting, so that the ranks
 * of a world (threads, where CMocka's asserts must not run) can use them.
 */
#ifndef INFINICP_TESTS_DEVMEM_H
#define INFINICP_TESTS_DEVMEM_H

#include <stddef.h>

#include "core/context.h"

static inline int devmem_on_host(const cp_context *ctx)
{
    return ctx->device == CP_DEVICE_CPU;
}

/* A device copy of `bytes` host bytes at host (*dev = host on the CPU). A
 * NULL host gives a NULL *dev. */
static inline cp_status devmem_put(cp_context *ctx, const void *host, size_t bytes, void **dev)
{
    *dev = NULL;
    if (!host)
        return CP_SUCCESS;
    if (devmem_on_host(ctx)) {
        *dev = (void *)host;
        return CP_SUCCESS;
    }
    cp_status s = ctx->ops->alloc(ctx->state, bytes ? bytes : 1, dev);
    if (s != CP_SUCCESS) {
        *dev = NULL;
        return s;
    }
    if (bytes)
        s = ctx->ops->copy_2d(ctx->state, *dev, bytes, host, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE);
    if (s != CP_SUCCESS) {
        ctx->ops->free(ctx->state, *dev);
        *dev = NULL;
    }
    return s;
}

/* `bytes` device bytes at dev into host, waiting for the context's queued
 * work first (nothing to do on the CPU, where dev is host). */
static inline cp_status devmem_get(cp_context *ctx, void *host, const void *dev, size_t bytes)
{
    if (!host || !dev || dev == host || devmem_on_host(ctx))
        return CP_SUCCESS;
    cp_status s = bytes ? ctx->ops->copy_2d(ctx->state, host, bytes, dev, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST)
                        : CP_SUCCESS;
    return s == CP_SUCCESS ? ctx->ops->synchronize(ctx->state) : s;
}

/* Free what devmem_put made (nothing on the CPU). */
static inline void devmem_free(cp_context *ctx, void *dev, const void *host)
{
    if (dev && dev != host && !devmem_on_host(ctx))
        ctx->ops->free(ctx->state, dev);
}

#endif
