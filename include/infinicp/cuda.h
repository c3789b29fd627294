/* SPDX-License-Identifier: MIT */
/**
 * @file cuda.h
 * @brief Typed CUDA and NCCL convenience wrappers of libinfinicp.
 *
 * <infinicp/infinicp.h> takes streams and foreign communicators as `void *`
 * so that it needs no CUDA headers; this header adds typed forms for
 * programs that build with CUDA anyway. The NCCL wrapper is defined when
 * <nccl.h> is included before this header.
 */
#ifndef INFINICP_CUDA_H
#define INFINICP_CUDA_H

#include <cuda_runtime_api.h>

#include <infinicp/infinicp.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief cp_context_create() for CUDA device @p device, ordered on @p stream.
 * @param device the CUDA device ordinal.
 * @param stream the stream work is queued on (NULL = the default stream).
 * @param out receives the context.
 * @return as cp_context_create().
 */
static inline cp_status cp_context_create_cuda(int device, cudaStream_t stream, cp_context **out)
{
    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.device = CP_DEVICE_CUDA;
    cfg.device_index = device;
    cfg.stream = (void *)stream;
    return cp_context_create(&cfg, out);
}

/**
 * @brief cp_context_set_stream() taking the cudaStream_t itself.
 * @param ctx a CUDA context.
 * @param stream the stream later work is queued on.
 * @return as cp_context_set_stream().
 */
static inline cp_status cp_context_set_cuda_stream(cp_context *ctx, cudaStream_t stream)
{
    return cp_context_set_stream(ctx, (void *)stream);
}

#if defined(NCCL_H_)
/**
 * @brief cp_comm_create_nccl() taking the ncclComm_t itself.
 *
 * Defined when <nccl.h> is included before <infinicp/cuda.h>.
 * @param comm an initialised NCCL communicator; not owned, it must outlive
 *        the result.
 * @param out receives the communicator.
 * @return as cp_comm_create_nccl().
 */
static inline cp_status cp_comm_create_nccl_comm(ncclComm_t comm, cp_comm **out)
{
    return cp_comm_create_nccl((void *)comm, out);
}
#endif

#ifdef __cplusplus
}
#endif

#endif /* INFINICP_CUDA_H */
