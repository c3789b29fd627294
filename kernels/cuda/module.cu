// SPDX-License-Identifier: MIT
// The CUDA backend module: entry point, device and stream management, memory
// and copies, and the backend table. The kernels live in the other files of
// this folder: elementwise.cu (convert, reduce, merge), attn.cu (choice of
// attention path), attn_mma_*.cu / attn_wgmma_*.cu / attn_simt.cu /
// attn_blas.cu (the paths) and nccl.cu (the NCCL transport); knobs.cu reads
// the environment variables, once per context.
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include <cublas_v2.h>

#include "common.cuh"

namespace cu {

const cp_module_host *host;

cp_status fail(cp_status s, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return host ? host->set_error(s, msg) : s;
}

cp_status cuda_fail(const char *what, cudaError_t e)
{
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
        return fail(CP_ERROR_NOT_FOUND,
                    "cuda: %s: %s (install the NVIDIA driver, e.g. Debian's nvidia-driver package, "
                    "matching CUDA runtime %d.%d, and check that a GPU is visible)",
                    what, cudaGetErrorString(e), CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    if (e == cudaErrorMemoryAllocation)
        return fail(CP_ERROR_OUT_OF_MEMORY, "cuda: %s: %s", what, cudaGetErrorString(e));
    return fail(CP_ERROR_BACKEND, "cuda: %s: %s", what, cudaGetErrorString(e));
}

cp_status check_launch(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail(what, e);
}

cp_status use_device(state *s)
{
    cudaError_t e = cudaSetDevice(s->device);
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail("cudaSetDevice", e);
}

cp_status allow_smem(const void *kernel, int bytes, const char *what)
{
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail(what, e);
}

namespace {

state *st(void *p)
{
    return static_cast<state *>(p);
}

cp_status cu_open(int device_index, void *stream, int, void **out)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return cuda_fail("cudaGetDeviceCount", e);
    if (device_index >= n)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cp_context_create: cfg->device_index = %d (%d CUDA devices)",
                    device_index, n);
    state *s = new (std::nothrow) state();
    if (!s)
        return fail(CP_ERROR_OUT_OF_MEMORY, "cuda: out of host memory");
    s->device = device_index;
    s->user = s->stream = static_cast<cudaStream_t>(stream);
    s->knob = read_knobs();
    int major = 0, minor = 0;
    if ((e = cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount, device_index)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&s->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index)) !=
            cudaSuccess ||
        (e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index)) != cudaSuccess) {
        delete s;
        return cuda_fail("cudaDeviceGetAttribute", e);
    }
    s->cc = major * 10 + minor;
    if (s->cc < 80) {
        delete s;
        return fail(CP_ERROR_UNSUPPORTED,
                    "cuda: device %d has compute capability %d.%d; this module needs 8.0 or newer", device_index,
                    major, minor);
    }
    // the work counters of persistent kernels (zero between launches)
    if ((e = cudaSetDevice(device_index)) != cudaSuccess ||
        (e = cudaMalloc(reinterpret_cast<void **>(&s->sched), SCHED_SLOTS * sizeof(int))) != cudaSuccess ||
        (e = cudaMemset(s->sched, 0, SCHED_SLOTS * sizeof(int))) != cudaSuccess) {
        if (s->sched)
            cudaFree(s->sched);
        delete s;
        return cuda_fail("cudaMalloc", e);
    }
    *out = s;
    return CP_SUCCESS;
}

void cu_close(void *p)
{
    state *s = st(p);
    cudaSetDevice(s->device);
    if (s->blas)
        cublasDestroy(static_cast<cublasHandle_t>(s->blas));
    for (int i = 1; i < MAX_STREAMS; i++)
        if (s->aux[i]) {
            cudaStreamSynchronize(s->aux[i]);
            cudaStreamDestroy(s->aux[i]);
        }
    rect_stage_free(s);
    // (cudaFree waits for the device: no kernel uses a counter any more)
    cudaFree(s->sched);
    delete s;
}

cp_status cu_set_stream(void *p, void *stream)
{
    state *s = st(p);
    s->user = s->stream = static_cast<cudaStream_t>(stream);
    s->current = 0;
    return CP_SUCCESS;
}

cp_status cu_synchronize(void *p)
{
    state *s = st(p);
    cp_status r = use_device(s);
    if (r != CP_SUCCESS)
        return r;
    cudaError_t e = cudaStreamSynchronize(s->stream);
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail("cudaStreamSynchronize", e);
}

cp_status cu_alloc(void *p, size_t bytes, void **ptr)
{
    state *s = st(p);
    cp_status r = use_device(s);
    if (r != CP_SUCCESS)
        return r;
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *ptr = nullptr;
        cudaGetLastError();
        return fail(CP_ERROR_OUT_OF_MEMORY, "cuda: cudaMalloc of %zu bytes on device %d: %s", bytes, s->device,
                    cudaGetErrorString(e));
    }
    return CP_SUCCESS;
}

void cu_free(void *p, void *ptr)
{
    if (!ptr)
        return;
    cudaSetDevice(st(p)->device);
    cudaFree(ptr);
}

// Whether p is memory of the state's device (not managed, host or another
// device's).
static bool on_device(const state *s, const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice && a.device == s->device;
}

cp_status cu_copy_2d(void *p, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                     size_t height, cp_copy_kind kind)
{
    static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToHost, cudaMemcpyHostToDevice,
                                           cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
    if ((unsigned)kind > CP_COPY_DEVICE_TO_DEVICE)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cuda copy_2d: kind = %d", (int)kind);
    if (width == 0 || height == 0)
        return CP_SUCCESS;
    state *s = st(p);
    cp_status r = use_device(s);
    if (r != CP_SUCCESS)
        return r;
    cudaError_t e;
    if (kind == CP_COPY_HOST_TO_HOST) {
        // Host memory is touched by the host: first finish the work queued
        // before, which may produce it.
        if ((e = cudaStreamSynchronize(s->stream)) != cudaSuccess)
            return cuda_fail("cudaStreamSynchronize", e);
        for (size_t row = 0; row < height; row++)
            memmove(static_cast<char *>(dst) + row * dpitch, static_cast<const char *>(src) + row * spitch, width);
        return CP_SUCCESS;
    }
    if (height == 1)
        dpitch = spitch = width;
    // On the context's own stream nothing else of this context runs beside a
    // copy (the overlapped transfers of the ring use a stream of their own):
    // a copy between buffers of this device is then a kernel, which reaches
    // about twice the copy engines' bandwidth and starts sooner on the small
    // pieces of an a2a exchange. Copies beside compute keep the engines, so
    // that they take no SMs from it.
    if (kind == CP_COPY_DEVICE_TO_DEVICE && s->current == 0 && on_device(s, dst) && on_device(s, src))
        return launch_copy_2d(s, dst, dpitch, src, spitch, width, height);
    if (dpitch == width && spitch == width)
        e = cudaMemcpyAsync(dst, src, width * height, kinds[kind], s->stream);
    else
        e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kinds[kind], s->stream);
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail("cudaMemcpy2DAsync", e);
}

cp_status cu_memset(void *p, void *dst, int value, size_t bytes)
{
    if (bytes == 0)
        return CP_SUCCESS;
    state *s = st(p);
    cp_status r = use_device(s);
    if (r != CP_SUCCESS)
        return r;
    cudaError_t e = cudaMemsetAsync(dst, value, bytes, s->stream);
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail("cudaMemsetAsync", e);
}

cp_status cu_convert(void *p, void *dst, cp_dtype dt, const void *src, cp_dtype sdt, size_t count)
{
    if ((unsigned)dt > CP_DTYPE_F64 || (unsigned)sdt > CP_DTYPE_F64)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cuda convert: dtype %d -> %d", (int)sdt, (int)dt);
    if (count == 0)
        return CP_SUCCESS;
    state *s = st(p);
    cp_status r = use_device(s);
    return r != CP_SUCCESS ? r : launch_convert(s, dst, dt, src, sdt, count);
}

cp_status cu_reduce(void *p, void *acc, const void *x, cp_dtype dt, size_t count, cp_reduce_op op)
{
    if ((unsigned)dt > CP_DTYPE_F64)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cuda reduce: dtype = %d", (int)dt);
    if (op != CP_REDUCE_SUM && op != CP_REDUCE_MAX)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cuda reduce: op = %d", (int)op);
    if (count == 0)
        return CP_SUCCESS;
    state *s = st(p);
    cp_status r = use_device(s);
    return r != CP_SUCCESS ? r : launch_reduce(s, acc, x, dt, count, op);
}

cp_status cu_merge(void *p, const cp_kernel_merge_args *a)
{
    state *s = st(p);
    cp_status r = use_device(s);
    return r != CP_SUCCESS ? r : launch_merge(s, a);
}

// The sinks' rowsums (API 1.2): the backward's rowsum(dO * O) kernel, on a
// problem that holds just these rows.
cp_status cu_sink_grad(void *p, float *g, const float *sinks, const float *lse, const float *rows, int64_t batch,
                       int64_t seq, int32_t heads)
{
    state *s = st(p);
    if (batch <= 0 || seq <= 0 || heads <= 0 || !g || !sinks || !lse || !rows)
        return fail(CP_ERROR_INVALID_ARGUMENT,
                    "cuda sink_grad: batch %lld, seq %lld, heads %d (must be > 0), g %p, sinks %p, lse %p, rows %p "
                    "(must not be NULL)",
                    (long long)batch, (long long)seq, heads, (void *)g, (const void *)sinks, (const void *)lse,
                    (const void *)rows);
    cp_status r = use_device(s);
    return r != CP_SUCCESS ? r : launch_sink_grad(s, g, sinks, lse, rows, batch, seq, heads);
}

cp_status cu_row_dot(void *p, float *d, const void *x, const void *y, cp_dtype t, int64_t batch, int64_t seq,
                     int32_t heads, int32_t dim, int64_t sb, int64_t ss, int64_t sh)
{
    state *s = st(p);
    if (t != CP_DTYPE_F32 && t != CP_DTYPE_F16 && t != CP_DTYPE_BF16)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cuda row_dot: t = %d (must be F32, F16 or BF16)", (int)t);
    if (batch <= 0 || seq <= 0 || heads <= 0 || dim <= 0 || batch > INT32_MAX)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cuda row_dot: batch %lld, seq %lld, heads %d, dim %d (must be > 0)",
                    (long long)batch, (long long)seq, heads, dim);
    cp_status r = use_device(s);
    if (r != CP_SUCCESS)
        return r;
    attn_params a;
    a.B = (int)batch;
    a.H = heads;
    a.Sq = seq;
    a.Dv = dim;
    a.o = tensor{x, sb, ss, sh};
    a.dout = tensor{y, sb, ss, sh};
    a.odt = t;
    a.drow = d;
    a.drb = (int64_t)heads * seq;
    a.drh = seq;
    return launch_drow(s, a);
}

// ---- overlap: streams and events ----

cp_status cu_stream_select(void *p, int index)
{
    state *s = st(p);
    if (index < 0 || index >= MAX_STREAMS)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cuda stream_select: index = %d (must be 0..%d)", index,
                    MAX_STREAMS - 1);
    if (index == 0) {
        s->stream = s->user;
        s->current = 0;
        return CP_SUCCESS;
    }
    cp_status r = use_device(s);
    if (r != CP_SUCCESS)
        return r;
    if (!s->aux[index]) {
        cudaError_t e = cudaStreamCreateWithFlags(&s->aux[index], cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            s->aux[index] = nullptr;
            return cuda_fail("cudaStreamCreateWithFlags", e);
        }
    }
    s->stream = s->aux[index];
    s->current = index;
    return CP_SUCCESS;
}

cp_status cu_event_create(void *p, void **event)
{
    *event = nullptr;
    cp_status r = use_device(st(p));
    if (r != CP_SUCCESS)
        return r;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess)
        return cuda_fail("cudaEventCreateWithFlags", e);
    *event = ev;
    return CP_SUCCESS;
}

void cu_event_destroy(void *p, void *event)
{
    if (!event)
        return;
    cudaSetDevice(st(p)->device);
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

cp_status cu_event_record(void *p, void *event)
{
    state *s = st(p);
    cp_status r = use_device(s);
    if (r != CP_SUCCESS)
        return r;
    cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(event), s->stream);
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail("cudaEventRecord", e);
}

cp_status cu_event_wait(void *p, void *event)
{
    state *s = st(p);
    cp_status r = use_device(s);
    if (r != CP_SUCCESS)
        return r;
    cudaError_t e = cudaStreamWaitEvent(s->stream, static_cast<cudaEvent_t>(event), 0);
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail("cudaStreamWaitEvent", e);
}

} // namespace

// Attention entry points (attn.cu) and the NCCL transport (nccl.cu).
cp_status attn_workspace_size(void *state, const cp_kernel_attn_args *a, int backward, size_t *bytes);
cp_status attn_forward(void *state, const cp_kernel_attn_args *a);
cp_status attn_backward(void *state, const cp_kernel_attn_args *a);
cp_status comm_create(const char *kind, void *foreign, cp_comm **out);
cp_status nccl_unique_id(void *id, size_t bytes);
cp_status nccl_comm_create(void *state, const void *id, size_t bytes, int nranks, int rank, cp_comm **out);

namespace {

cp_status cu_set_deterministic(void *p, int on)
{
    st(p)->deterministic = on != 0;
    return CP_SUCCESS;
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
    o.attn_workspace_size = attn_workspace_size;
    o.attn_forward = attn_forward;
    o.attn_backward = attn_backward;
    o.merge = cu_merge;
    o.stream_select = cu_stream_select;
    o.event_create = cu_event_create;
    o.event_destroy = cu_event_destroy;
    o.event_record = cu_event_record;
    o.event_wait = cu_event_wait;
    o.comm_create = comm_create;
    o.set_deterministic = cu_set_deterministic;
    o.nccl_unique_id = nccl_unique_id;
    o.nccl_comm_create = nccl_comm_create;
    // windows, softcaps and rectangle lists (API 1.1)
    o.kernel_args_size = sizeof(cp_kernel_attn_args);
    // the attention sinks' gradient on the device (API 1.2)
    o.row_dot = cu_row_dot;
    o.sink_grad = cu_sink_grad;
    return o;
}

const cp_backend_ops g_ops = make_ops();

} // namespace

const cp_backend_ops *ops()
{
    return &g_ops;
}

} // namespace cu

extern "C" __attribute__((visibility("default"))) const cp_backend_ops *
cp_backend_module_v1(const cp_module_host *host)
{
    cu::host = host;
    return cu::ops();
}
