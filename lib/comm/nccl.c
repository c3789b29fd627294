/* SPDX-License-Identifier: MIT */
/* Communicators over NCCL: the transport lives in the CUDA backend module,
 * which the core loads anyway for CUDA contexts. */
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
