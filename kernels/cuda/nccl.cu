// SPDX-License-Identifier: MIT
// The NCCL transport: a cp_transport_ops over an ncclComm_t. Collectives are
// queued on the current stream of the CUDA context whose buffers they move
// (stream-ordered, like every other backend operation); barrier waits on the
// host. All-to-all and the ring shift are grouped point-to-point calls.
// F16 / BF16 reductions are widened to fp32 first (the library's contract is
// fp32 accumulation; NCCL would add in 16 bits).
#include <cstdio>
#include <cstring>
#include <new>

#include "common.cuh"

#ifdef CP_HAVE_NCCL
#include <nccl.h>
#endif

namespace cu {

#ifdef CP_HAVE_NCCL
namespace {

struct nccl_comm {
    ncclComm_t comm;
    bool owned; // made by split; the wrapped one belongs to the caller
    int rank, size;
};

cp_status nccl_fail(const nccl_comm *c, const char *what, ncclResult_t e)
{
    const char *last = c ? ncclGetLastError(c->comm) : nullptr;
    return fail(CP_ERROR_COMM, "nccl: %s: %s%s%s", what, ncclGetErrorString(e), last && *last ? ": " : "",
                last ? last : "");
}

// The stream the transfer is ordered on; NCCL moves device memory only.
cp_status stream_of(const cp_xfer *x, const char *what, state **out)
{
    if (!x || x->backend != ops() || !x->backend_state)
        return fail(CP_ERROR_INVALID_ARGUMENT,
                    "nccl %s: the buffers are not on a CUDA context (backend \"%s\"); NCCL moves device memory only",
                    what, x && x->backend ? x->backend->name : "host");
    *out = static_cast<state *>(x->backend_state);
    return use_device(*out);
}

bool nccl_type(cp_dtype t, ncclDataType_t *out)
{
    switch (t) {
    case CP_DTYPE_F32: *out = ncclFloat32; return true;
    case CP_DTYPE_F64: *out = ncclFloat64; return true;
    case CP_DTYPE_F16: *out = ncclFloat16; return true;
    case CP_DTYPE_BF16: *out = ncclBfloat16; return true;
    }
    return false;
}

cp_status check_reduction(const char *what, cp_dtype t, cp_reduce_op op)
{
    ncclDataType_t nt;
    if (!nccl_type(t, &nt))
        return fail(CP_ERROR_INVALID_ARGUMENT, "nccl %s: dtype = %d", what, (int)t);
    if (op != CP_REDUCE_SUM && op != CP_REDUCE_MAX)
        return fail(CP_ERROR_INVALID_ARGUMENT, "nccl %s: op = %d", what, (int)op);
    return CP_SUCCESS;
}

bool narrow(cp_dtype t)
{
    return t == CP_DTYPE_F16 || t == CP_DTYPE_BF16;
}

// Stream-ordered scratch for the widened copies.
struct wide_buf {
    float *p = nullptr;
};

cp_status wide_alloc(state *s, size_t count, wide_buf *w)
{
    cudaError_t e = cudaMallocAsync(reinterpret_cast<void **>(&w->p), count * sizeof(float), s->stream);
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail("cudaMallocAsync", e);
}

cp_status wide_free(state *s, wide_buf *w, cp_status r)
{
    if (w->p) {
        cudaError_t e = cudaFreeAsync(w->p, s->stream);
        if (e != cudaSuccess && r == CP_SUCCESS)
            return cuda_fail("cudaFreeAsync", e);
    }
    return r;
}

ncclRedOp_t nccl_op(cp_reduce_op op)
{
    return op == CP_REDUCE_MAX ? ncclMax : ncclSum;
}

cp_status n_all_gather(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    state *s;
    cp_status r = stream_of(x, "all_gather", &s);
    if (r != CP_SUCCESS)
        return r;
    ncclResult_t e = ncclAllGather(send, recv, bytes, ncclInt8, c->comm, s->stream);
    return e == ncclSuccess ? CP_SUCCESS : nccl_fail(c, "ncclAllGather", e);
}

// op over ranks of count elements (all_reduce: send -> recv; reduce_scatter:
// send holds size blocks of count).
cp_status reduce_common(nccl_comm *c, const cp_xfer *x, const void *send, void *recv, size_t count, cp_dtype t,
                        cp_reduce_op op, bool scatter)
{
    const char *what = scatter ? "reduce_scatter" : "all_reduce";
    cp_status r = check_reduction(what, t, op);
    state *s;
    if (r != CP_SUCCESS || (r = stream_of(x, what, &s)) != CP_SUCCESS)
        return r;
    ncclDataType_t nt = ncclFloat32;
    nccl_type(t, &nt);
    const size_t in_count = scatter ? count * (size_t)c->size : count;
    if (!narrow(t)) {
        ncclResult_t e = scatter ? ncclReduceScatter(send, recv, count, nt, nccl_op(op), c->comm, s->stream)
                                 : ncclAllReduce(send, recv, count, nt, nccl_op(op), c->comm, s->stream);
        return e == ncclSuccess ? CP_SUCCESS : nccl_fail(c, what, e);
    }
    // widen, reduce in fp32, round once
    wide_buf w;
    if ((r = wide_alloc(s, in_count + count, &w)) != CP_SUCCESS)
        return r;
    float *win = w.p, *wout = w.p + in_count;
    r = launch_convert(s, win, CP_DTYPE_F32, send, t, in_count);
    if (r == CP_SUCCESS) {
        ncclResult_t e = scatter ? ncclReduceScatter(win, wout, count, ncclFloat32, nccl_op(op), c->comm, s->stream)
                                 : ncclAllReduce(win, wout, count, ncclFloat32, nccl_op(op), c->comm, s->stream);
        r = e == ncclSuccess ? launch_convert(s, recv, t, wout, CP_DTYPE_F32, count) : nccl_fail(c, what, e);
    }
    return wide_free(s, &w, r);
}

cp_status n_reduce_scatter(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count, cp_dtype t,
                           cp_reduce_op op)
{
    return reduce_common(static_cast<nccl_comm *>(impl), x, send, recv, count, t, op, true);
}

cp_status n_all_reduce(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count, cp_dtype t,
                       cp_reduce_op op)
{
    return reduce_common(static_cast<nccl_comm *>(impl), x, send, recv, count, t, op, false);
}

cp_status n_all_to_all(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    state *s;
    cp_status r = stream_of(x, "all_to_all", &s);
    if (r != CP_SUCCESS)
        return r;
    ncclResult_t e = ncclGroupStart();
    for (int j = 0; j < c->size && e == ncclSuccess; j++) {
        e = ncclSend(static_cast<const char *>(send) + (size_t)j * bytes, bytes, ncclInt8, j, c->comm, s->stream);
        if (e == ncclSuccess)
            e = ncclRecv(static_cast<char *>(recv) + (size_t)j * bytes, bytes, ncclInt8, j, c->comm, s->stream);
    }
    ncclResult_t e2 = ncclGroupEnd();
    if (e == ncclSuccess)
        e = e2;
    return e == ncclSuccess ? CP_SUCCESS : nccl_fail(c, "all_to_all (grouped send/recv)", e);
}

cp_status n_sendrecv(void *impl, const cp_xfer *x, const void *send, size_t send_bytes, int dst, void *recv,
                     size_t recv_bytes, int src)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    if (dst < 0 || dst >= c->size || src < 0 || src >= c->size)
        return fail(CP_ERROR_INVALID_ARGUMENT, "nccl sendrecv: dst = %d, src = %d (communicator of %d ranks)", dst,
                    src, c->size);
    state *s;
    cp_status r = stream_of(x, "sendrecv", &s);
    if (r != CP_SUCCESS)
        return r;
    ncclResult_t e = ncclGroupStart();
    if (e == ncclSuccess && send_bytes)
        e = ncclSend(send, send_bytes, ncclInt8, dst, c->comm, s->stream);
    if (e == ncclSuccess && recv_bytes)
        e = ncclRecv(recv, recv_bytes, ncclInt8, src, c->comm, s->stream);
    ncclResult_t e2 = ncclGroupEnd();
    if (e == ncclSuccess)
        e = e2;
    return e == ncclSuccess ? CP_SUCCESS : nccl_fail(c, "sendrecv (grouped send/recv)", e);
}

cp_status n_barrier(void *impl, const cp_xfer *x)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    state *s;
    cp_status r = stream_of(x, "barrier", &s);
    if (r != CP_SUCCESS)
        return r;
    wide_buf w;
    if ((r = wide_alloc(s, 1, &w)) != CP_SUCCESS)
        return r;
    cudaError_t ce = cudaMemsetAsync(w.p, 0, sizeof(float), s->stream);
    if (ce != cudaSuccess)
        return wide_free(s, &w, cuda_fail("cudaMemsetAsync", ce));
    ncclResult_t e = ncclAllReduce(w.p, w.p, 1, ncclFloat32, ncclSum, c->comm, s->stream);
    r = e == ncclSuccess ? CP_SUCCESS : nccl_fail(c, "barrier (ncclAllReduce)", e);
    r = wide_free(s, &w, r);
    if (r == CP_SUCCESS && (ce = cudaStreamSynchronize(s->stream)) != cudaSuccess)
        r = cuda_fail("cudaStreamSynchronize", ce);
    return r;
}

cp_status wrap_comm(ncclComm_t comm, bool owned, nccl_comm **out)
{
    *out = nullptr;
    int rank = -1, size = 0;
    ncclResult_t e;
    if ((e = ncclCommUserRank(comm, &rank)) != ncclSuccess || (e = ncclCommCount(comm, &size)) != ncclSuccess)
        return fail(CP_ERROR_COMM, "nccl: reading the communicator's rank and size: %s", ncclGetErrorString(e));
    nccl_comm *c = new (std::nothrow) nccl_comm{comm, owned, rank, size};
    if (!c)
        return fail(CP_ERROR_OUT_OF_MEMORY, "nccl: out of host memory");
    *out = c;
    return CP_SUCCESS;
}

cp_status n_split(void *impl, int color, int key, int, void **out_impl, int *out_rank, int *out_size)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    *out_impl = nullptr;
    ncclComm_t nc = nullptr;
    ncclResult_t e = ncclCommSplit(c->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, nullptr);
    if (e != ncclSuccess)
        return nccl_fail(c, "ncclCommSplit", e);
    if (!nc)
        return CP_SUCCESS; // this rank joins no group
    nccl_comm *n;
    cp_status r = wrap_comm(nc, true, &n);
    if (r != CP_SUCCESS) {
        ncclCommDestroy(nc);
        return r;
    }
    *out_impl = n;
    *out_rank = n->rank;
    *out_size = n->size;
    return CP_SUCCESS;
}

void n_destroy(void *impl)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    if (c && c->owned)
        ncclCommDestroy(c->comm);
    delete c;
}

cp_transport_ops make_ops()
{
    cp_transport_ops o = {};
    o.abi_version = CP_MODULE_ABI_VERSION;
    o.struct_size = sizeof(cp_transport_ops);
    o.name = "nccl";
    o.all_gather = n_all_gather;
    o.reduce_scatter = n_reduce_scatter;
    o.all_to_all = n_all_to_all;
    o.sendrecv = n_sendrecv;
    o.all_reduce = n_all_reduce;
    o.barrier = n_barrier;
    o.split = n_split;
    o.destroy = n_destroy;
    return o;
}

const cp_transport_ops g_nccl = make_ops();

} // namespace
#endif

cp_status comm_create(const char *kind, void *foreign, cp_comm **out)
{
    if (!out)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cuda comm_create: out is NULL");
    *out = nullptr;
    if (!kind || strcmp(kind, "nccl"))
        return fail(CP_ERROR_UNSUPPORTED, "cuda comm_create: kind \"%s\" (this module carries \"nccl\" only)",
                    kind ? kind : "(null)");
#ifdef CP_HAVE_NCCL
    if (!foreign)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cp_comm_create_nccl: nccl_comm is NULL");
    nccl_comm *c;
    cp_status r = wrap_comm(static_cast<ncclComm_t>(foreign), false, &c);
    if (r != CP_SUCCESS)
        return r;
    if ((r = host->comm_wrap(&g_nccl, c, c->rank, c->size, out)) != CP_SUCCESS)
        delete c;
    return r;
#else
    (void)foreign;
    return fail(CP_ERROR_UNSUPPORTED,
                "cp_comm_create_nccl: this CUDA module was built without NCCL (install NCCL's development files, "
                "e.g. Debian's libnccl-dev, and rebuild)");
#endif
}

} // namespace cu
