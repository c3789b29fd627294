// SPDX-License-Identifier: MIT
// The CUDA backend module: entry point and device management. The kernels
// (attention, merge, conversions) and the NCCL transport are added here as
// they are written; until then the table answers "unsupported" for them.
#include <cstdio>
#include <new>

#include <cuda_runtime_api.h>

#include <infinicp/backend.h>

namespace {

const cp_module_host *g_host;

cp_status fail(cp_status s, const char *what, cudaError_t e)
{
    char msg[256];
    snprintf(msg, sizeof msg, "cuda: %s: %s", what, cudaGetErrorString(e));
    return g_host ? g_host->set_error(s, msg) : s;
}

cp_status unsupported(const char *what)
{
    char msg[128];
    snprintf(msg, sizeof msg, "cuda: %s is not implemented in this module yet", what);
    return g_host ? g_host->set_error(CP_ERROR_UNSUPPORTED, msg) : CP_ERROR_UNSUPPORTED;
}

struct state {
    int device;
    cudaStream_t stream;
};

cp_status cu_open(int device_index, void *stream, int, void **out)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return fail(CP_ERROR_BACKEND, "cudaGetDeviceCount", e);
    if (device_index >= n) {
        char msg[128];
        snprintf(msg, sizeof msg, "cp_context_create: cfg->device_index = %d (%d CUDA devices)",
                 device_index, n);
        return g_host->set_error(CP_ERROR_INVALID_ARGUMENT, msg);
    }
    state *s = new (std::nothrow) state{device_index, static_cast<cudaStream_t>(stream)};
    if (!s)
        return g_host->set_error(CP_ERROR_OUT_OF_MEMORY, "cuda: out of host memory");
    *out = s;
    return CP_SUCCESS;
}

void cu_close(void *st)
{
    delete static_cast<state *>(st);
}

cp_status cu_set_stream(void *st, void *stream)
{
    static_cast<state *>(st)->stream = static_cast<cudaStream_t>(stream);
    return CP_SUCCESS;
}

cp_status cu_synchronize(void *st)
{
    state *s = static_cast<state *>(st);
    cudaError_t e = cudaSetDevice(s->device);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s->stream);
    return e == cudaSuccess ? CP_SUCCESS : fail(CP_ERROR_BACKEND, "cudaStreamSynchronize", e);
}

cp_status cu_alloc(void *st, size_t bytes, void **ptr)
{
    state *s = static_cast<state *>(st);
    cudaError_t e = cudaSetDevice(s->device);
    if (e == cudaSuccess)
        e = cudaMalloc(ptr, bytes ? bytes : 1);
    return e == cudaSuccess ? CP_SUCCESS : fail(CP_ERROR_OUT_OF_MEMORY, "cudaMalloc", e);
}

void cu_free(void *st, void *ptr)
{
    cudaSetDevice(static_cast<state *>(st)->device);
    cudaFree(ptr);
}

cp_status cu_copy_2d(void *st, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                     size_t height, cp_copy_kind kind)
{
    static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToHost, cudaMemcpyHostToDevice,
                                           cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
    state *s = static_cast<state *>(st);
    cudaError_t e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kinds[kind], s->stream);
    return e == cudaSuccess ? CP_SUCCESS : fail(CP_ERROR_BACKEND, "cudaMemcpy2DAsync", e);
}

cp_status cu_memset(void *st, void *dst, int value, size_t bytes)
{
    state *s = static_cast<state *>(st);
    cudaError_t e = cudaMemsetAsync(dst, value, bytes, s->stream);
    return e == cudaSuccess ? CP_SUCCESS : fail(CP_ERROR_BACKEND, "cudaMemsetAsync", e);
}

cp_status cu_convert(void *, void *, cp_dtype, const void *, cp_dtype, size_t)
{
    return unsupported("convert");
}
cp_status cu_reduce(void *, void *, const void *, cp_dtype, size_t, cp_reduce_op)
{
    return unsupported("reduce");
}
cp_status cu_attn_ws(void *, const cp_kernel_attn_args *, int, size_t *)
{
    return unsupported("attention");
}
cp_status cu_attn(void *, const cp_kernel_attn_args *)
{
    return unsupported("attention");
}
cp_status cu_merge(void *, const cp_kernel_merge_args *)
{
    return unsupported("merge");
}

cp_backend_ops make_ops()
{
    cp_backend_ops o = {};
    o.abi_version = CP_MODULE_ABI_VERSION;
    o.struct_size = sizeof(cp_backend_ops);
    o.name = "cuda";
    o.device = CP_DEVICE_CUDA;
    o.open = cu_open;
    o.close = cu_close;
    o.set_stream = cu_set_stream;
    o.synchronize = cu_synchronize;
    o.alloc = cu_alloc;
    o.free = cu_free;
    o.copy_2d = cu_copy_2d;
    o.memset = cu_memset;
    o.convert = cu_convert;
    o.reduce = cu_reduce;
    o.attn_workspace_size = cu_attn_ws;
    o.attn_forward = cu_attn;
    o.attn_backward = cu_attn;
    o.merge = cu_merge;
    return o;
}

const cp_backend_ops g_ops = make_ops();

} // namespace

extern "C" __attribute__((visibility("default"))) const cp_backend_ops *
cp_backend_module_v1(const cp_module_host *host)
{
    g_host = host;
    return &g_ops;
}
