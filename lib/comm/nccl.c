/* SPDX-License-Identifier: MIT */
/* Communicators over NCCL: the transport lives in the CUDA backend module,
 * which the core loads anyway for CUDA contexts. The core has no NCCL or
 * CUDA headers: it checks arguments and hands over to the module's slots. */
#include <stdio.h>

#include "core/context.h"

CP_EXPORT cp_status cp_comm_create_nccl(void *nccl_comm, cp_comm **out)
{
    CPI_CHECK_PTR(out);
    *out = NULL;
    CPI_CHECK_PTR(nccl_comm);
    const cp_backend_ops *ops;
    CPI_TRY(cpi_backend_for(CP_DEVICE_CUDA, &ops));
    if (!CP_BACKEND_HAS(ops, comm_create))
        return cpi_error(CP_ERROR_UNSUPPORTED, "%s: the CUDA module (%s) carries no transports (table size %zu)",
                         __func__, ops->name, ops->struct_size);
    cp_status s = ops->comm_create("nccl", nccl_comm, out);
    if (s == CP_SUCCESS && !*out)
        return cpi_error(CP_ERROR_INTERNAL, "%s: the CUDA module returned no communicator", __func__);
    return s;
}

CP_EXPORT cp_status cp_nccl_unique_id(void *id, size_t id_bytes)
{
    CPI_CHECK_PTR(id);
    CPI_CHECK(id_bytes == CP_NCCL_UNIQUE_ID_BYTES, "%s: id_bytes = %zu (an NCCL unique id is %d bytes)", __func__,
              id_bytes, CP_NCCL_UNIQUE_ID_BYTES);
    const cp_backend_ops *ops;
    if (cpi_backend_for(CP_DEVICE_CUDA, &ops) != CP_SUCCESS) {
        char why[400];
        snprintf(why, sizeof why, "%s", cp_last_error());
        return cpi_error(CP_ERROR_UNSUPPORTED, "%s: the CUDA backend module is not available: %s", __func__, why);
    }
    if (!CP_BACKEND_HAS(ops, nccl_unique_id))
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: the CUDA module (%s) has no nccl_unique_id slot (table size %zu): it is older than "
                         "libinfinicp 1.1",
                         __func__, ops->name, ops->struct_size);
    return ops->nccl_unique_id(id, id_bytes);
}

CP_EXPORT cp_status cp_comm_create_nccl_id(cp_context *ctx, const void *id, size_t id_bytes, int nranks, int rank,
                                           cp_comm **out)
{
    CPI_CHECK_PTR(out);
    *out = NULL;
    CPI_CHECK_PTR(ctx);
    CPI_CHECK_PTR(id);
    CPI_CHECK(id_bytes == CP_NCCL_UNIQUE_ID_BYTES, "%s: id_bytes = %zu (an NCCL unique id is %d bytes)", __func__,
              id_bytes, CP_NCCL_UNIQUE_ID_BYTES);
    CPI_CHECK(nranks >= 1, "%s: nranks = %d (must be >= 1)", __func__, nranks);
    CPI_CHECK(rank >= 0 && rank < nranks, "%s: rank = %d (must be 0 to nranks - 1 = %d)", __func__, rank,
              nranks - 1);
    const cp_backend_ops *ops = ctx->ops;
    if (ctx->device != CP_DEVICE_CUDA)
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: ctx is a %s context (device %d, backend \"%s\"); NCCL needs a CUDA context "
                         "(CP_DEVICE_CUDA)",
                         __func__, ctx->device == CP_DEVICE_CPU ? "CPU" : "non-CUDA", (int)ctx->device, ops->name);
    if (!CP_BACKEND_HAS(ops, nccl_comm_create))
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: the CUDA module (%s) has no nccl_comm_create slot (table size %zu): it is older than "
                         "libinfinicp 1.1",
                         __func__, ops->name, ops->struct_size);
    cp_status s = ops->nccl_comm_create(ctx->state, id, id_bytes, nranks, rank, out);
    if (s != CP_SUCCESS) {
        *out = NULL;
        return s;
    }
    if (!*out)
        return cpi_error(CP_ERROR_INTERNAL, "%s: the CUDA module returned no communicator", __func__);
    int have_rank = -1, have_size = 0;
    cp_comm_rank(*out, &have_rank);
    cp_comm_size(*out, &have_size);
    if (have_rank != rank || have_size != nranks) {
        cp_comm_destroy(*out);
        *out = NULL;
        return cpi_error(CP_ERROR_INTERNAL, "%s: the CUDA module made rank %d of %d ranks, not rank %d of %d",
                         __func__, have_rank, have_size, rank, nranks);
    }
    return CP_SUCCESS;
}
