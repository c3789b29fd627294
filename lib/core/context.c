/* SPDX-License-Identifier: MIT */
/* cp_context: a device, its backend and the stream work is ordered on. */
#include <stdlib.h>
#include <string.h>

#include "core/context.h"

/* First published cp_context_config: everything up to num_threads. */
#define CONTEXT_CONFIG_V1_SIZE (offsetof(cp_context_config, num_threads) + sizeof(int))

#define MAX_THREADS 4096

CP_EXPORT cp_status cp_context_create(const cp_context_config *cfg, cp_context **out)
{
    CPI_CHECK_PTR(out);
    *out = NULL;
    static const cp_context_config defaults = CP_CONTEXT_CONFIG_INIT;
    cp_context_config c;
    CPI_TRY(cpi_copy_config(&c, sizeof c, &defaults, cfg, CONTEXT_CONFIG_V1_SIZE, __func__, "cfg"));

    CPI_CHECK(c.device == CP_DEVICE_CPU || c.device == CP_DEVICE_CUDA,
              "%s: cfg->device = %d (must be CP_DEVICE_CPU (0) or CP_DEVICE_CUDA (1))", __func__,
              (int)c.device);
    CPI_CHECK(c.device_index >= 0, "%s: cfg->device_index = %d (must be >= 0)", __func__,
              c.device_index);
    CPI_CHECK(c.device != CP_DEVICE_CPU || c.device_index == 0,
              "%s: cfg->device_index = %d (the CPU device has index 0 only)", __func__, c.device_index);
    CPI_CHECK(c.device != CP_DEVICE_CPU || c.stream == NULL,
              "%s: cfg->stream = %p (the CPU device takes no stream; pass NULL)", __func__, c.stream);
    CPI_CHECK(c.num_threads >= 0 && c.num_threads <= MAX_THREADS,
              "%s: cfg->num_threads = %d (must be 0 for automatic, or 1..%d)", __func__, c.num_threads,
              MAX_THREADS);
    CPI_CHECK(c.deterministic == 0 || c.deterministic == 1,
              "%s: cfg->deterministic = %d (must be 0 for the fastest backward or 1 for a bitwise "
              "reproducible one)",
              __func__, c.deterministic);
    /* Frameworks' users ask for reproducibility without touching code. */
    const char *env = getenv("INFINICP_DETERMINISTIC");
    if (env && !strcmp(env, "1"))
        c.deterministic = 1;

    const cp_backend_ops *ops;
    CPI_TRY(cpi_backend_for(c.device, &ops));

    cp_context *ctx = cpi_calloc(1, sizeof *ctx);
    if (!ctx)
        return CP_ERROR_OUT_OF_MEMORY;
    ctx->device = c.device;
    ctx->device_index = c.device_index;
    ctx->stream = c.stream;
    ctx->ops = ops;
    cp_status s = ops->open(c.device_index, c.stream, c.num_threads, &ctx->state);
    if (s != CP_SUCCESS) {
        free(ctx);
        return s;
    }
    /* A backend without the slot is deterministic always. */
    if (CP_BACKEND_HAS(ops, set_deterministic) &&
        (s = ops->set_deterministic(ctx->state, c.deterministic)) != CP_SUCCESS) {
        ops->close(ctx->state);
        free(ctx);
        return s;
    }
    ctx->num_threads = c.num_threads;
    ctx->deterministic = c.deterministic;
    *out = ctx;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_context_set_stream(cp_context *ctx, void *stream)
{
    CPI_CHECK_PTR(ctx);
    CPI_CHECK(ctx->device != CP_DEVICE_CPU || stream == NULL,
              "%s: stream = %p (the CPU device takes no stream; pass NULL)", __func__, stream);
    CPI_TRY(ctx->ops->set_stream(ctx->state, stream));
    ctx->stream = stream;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_context_synchronize(cp_context *ctx)
{
    CPI_CHECK_PTR(ctx);
    return ctx->ops->synchronize(ctx->state);
}

CP_EXPORT void cp_context_destroy(cp_context *ctx)
{
    if (!ctx)
        return;
    ctx->ops->close(ctx->state);
    free(ctx);
}
