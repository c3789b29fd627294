// SPDX-License-Identifier: MIT
// The NCCL transport: a cp_transport_ops over an ncclComm_t. Collectives are
// queued on the current stream of the CUDA context whose buffers they move
// (stream-ordered, like every other backend operation); barrier waits on the
// host. All-to-all and the ring shift are grouped point-to-point calls.
// F16 / BF16 reductions are widened to fp32 first (the library's contract is
// fp32 accumulation; NCCL would add in 16 bits).
//
// Faults: NCCL reports a failed peer or network asynchronously, and a
// collective whose peer never comes spins on the device for ever. So every
// host wait here polls (cudaEventQuery / cudaStreamQuery together with
// ncclCommGetAsyncError) against the caller's timeout: an asynchronous error
// gives CP_ERROR_COMM, the deadline CP_ERROR_TIMEOUT, and either way a
// communicator the library made (by ncclCommSplit, non-blocking where NCCL
// has ncclConfig_t) is aborted, which ends its device work. A communicator the
// caller wrapped is never aborted: the error says so, and the caller aborts it.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#include "common.cuh"

#ifdef CP_HAVE_NCCL
#include <nccl.h>
#endif

namespace cu {

#ifdef CP_HAVE_NCCL
namespace {

// ncclConfig_t, non-blocking communicators, ncclInProgress and
// ncclCommFinalize came with NCCL 2.14; ncclCommSplit with 2.18.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define CP_NCCL_NONBLOCKING 1
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
#define CP_NCCL_SPLIT 1
#endif

// Streams with pending work one communicator tracks (a context offers
// MAX_STREAMS; a few contexts may share a communicator).
constexpr int MAX_PENDING = 4 * MAX_STREAMS;

struct pending {
    bool used;
    cudaStream_t stream;
    cudaEvent_t done; // recorded after this communicator's last work on stream
};

struct nccl_comm {
    ncclComm_t comm;
    bool owned;       // made by split; the wrapped one belongs to the caller
    bool nonblocking; // calls may return ncclInProgress
    bool broken;      // gave up on it (aborted when owned): later calls fail at once
    int rank, size;
    int timeout_ms;   // owned: the wait limit split was given, for destroy
    const char *last; // the last collective queued, for messages
    pending work[MAX_PENDING];
    char why[384];    // why it broke
};

// NCCL's text about the last error on comm (ncclGetLastError came with 2.13).
const char *last_text(ncclComm_t comm)
{
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    return ncclGetLastError(comm);
#else
    (void)comm;
    return "";
#endif
}

cp_status nccl_fail(const nccl_comm *c, const char *what, ncclResult_t e)
{
    const char *last = c ? last_text(c->comm) : nullptr;
    return fail(CP_ERROR_COMM, "nccl: %s: %s%s%s", what, ncclGetErrorString(e), last && *last ? ": " : "",
                last ? last : "");
}

#ifdef CP_NCCL_NONBLOCKING
constexpr ncclResult_t IN_PROGRESS = ncclInProgress;
#else
constexpr ncclResult_t IN_PROGRESS = ncclSuccess; // never reported before 2.14
#endif

bool in_progress(ncclResult_t e)
{
    return e != ncclSuccess && e == IN_PROGRESS;
}

using steady = std::chrono::steady_clock;

// A wait limit: ms <= 0 waits for ever (the cp_xfer convention).
struct deadline {
    int ms;
    steady::time_point end;
    explicit deadline(int limit) : ms(limit), end(steady::now() + std::chrono::milliseconds(limit > 0 ? limit : 0)) {}
    bool passed() const { return ms > 0 && steady::now() >= end; }
};

// Between polls: short naps first (most waits end within microseconds), then
// at most a millisecond, so a deadline is kept to about that.
void nap(int *us)
{
    std::this_thread::sleep_for(std::chrono::microseconds(*us));
    if (*us < 1000)
        *us *= 2;
}

// Stop using c: abort it if the library owns it, remember why, and return
// code with a message naming the call.
cp_status give_up(nccl_comm *c, cp_status code, const char *what, const char *why)
{
    const bool abort_now = c->owned && !c->broken;
    if (abort_now)
        ncclCommAbort(c->comm);
    if (!c->broken)
        snprintf(c->why, sizeof c->why, "%s: %s", what, why);
    c->broken = true;
    return fail(code, "nccl: %s: %s; %s", what, why,
                c->owned ? "the communicator (made by the library) was aborted"
                         : "the communicator belongs to the caller and was not aborted: abort it "
                           "(ncclCommAbort) before its streams are used again");
}

cp_status broken_error(const nccl_comm *c, const char *what)
{
    return fail(CP_ERROR_COMM, "nccl: %s: the communicator failed earlier (%s)", what, c->why);
}

// c's asynchronous state: an error becomes CP_ERROR_COMM (and c is given
// up); *busy tells a non-blocking call still being set up.
cp_status check_async(nccl_comm *c, const char *what, bool *busy)
{
    *busy = false;
    if (c->broken)
        return broken_error(c, what);
    ncclResult_t ae = ncclSuccess;
    ncclResult_t e = ncclCommGetAsyncError(c->comm, &ae);
    if (e != ncclSuccess)
        ae = e;
    if (ae == ncclSuccess)
        return CP_SUCCESS;
    if (in_progress(ae)) {
        *busy = true;
        return CP_SUCCESS;
    }
    const char *last = last_text(c->comm);
    char why[320];
    snprintf(why, sizeof why, "asynchronous error: %s%s%s", ncclGetErrorString(ae), last && *last ? ": " : "",
             last ? last : "");
    return give_up(c, CP_ERROR_COMM, what, why);
}

// The outcome of NCCL call `what` on c: an error, or (non-blocking) wait
// until the call is done, watching for asynchronous errors, until d.
cp_status settle(nccl_comm *c, ncclResult_t e, const char *what, const deadline &d)
{
    if (e == ncclSuccess)
        return CP_SUCCESS;
    if (!in_progress(e))
        return nccl_fail(c, what, e);
    for (int us = 10;; nap(&us)) {
        bool busy;
        cp_status r = check_async(c, what, &busy);
        if (r != CP_SUCCESS || !busy)
            return r;
        if (d.passed()) {
            char why[96];
            snprintf(why, sizeof why, "still in progress after %d ms", d.ms);
            return give_up(c, CP_ERROR_TIMEOUT, what, why);
        }
    }
}

// Mark the end of c's work queued on s's stream so far.
cp_status track(nccl_comm *c, state *s, const char *what)
{
    pending *slot = nullptr;
    for (pending &p : c->work)
        if (p.used && p.stream == s->stream) {
            slot = &p;
            break;
        }
    for (int pass = 0; pass < 2 && !slot; pass++)
        for (pending &p : c->work)
            // a free slot; else (second pass) one whose work has finished
            if (!p.used || (pass == 1 && cudaEventQuery(p.done) == cudaSuccess)) {
                slot = &p;
                break;
            }
    if (!slot)
        return fail(CP_ERROR_UNSUPPORTED, "nccl: %s: work pending on more than %d streams of one communicator",
                    what, MAX_PENDING);
    cudaError_t e = cudaSuccess;
    if (!slot->done)
        e = cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventRecord(slot->done, s->stream);
    if (e != cudaSuccess)
        return cuda_fail("cudaEventRecord", e);
    slot->used = true;
    slot->stream = s->stream;
    c->last = what;
    return CP_SUCCESS;
}

// Wait on the host until the work c has queued (and s's stream, if given) is
// done, until d; see the file comment.
cp_status wait_work(nccl_comm *c, const char *what, const deadline &d, const state *s)
{
    for (int us = 10;; nap(&us)) {
        bool busy = false;
        if (!c->broken) {
            cp_status r = check_async(c, what, &busy);
            if (r != CP_SUCCESS)
                return r;
        }
        for (pending &p : c->work) {
            if (!p.used)
                continue;
            cudaError_t e = cudaEventQuery(p.done);
            if (e == cudaSuccess)
                p.used = false;
            else if (e == cudaErrorNotReady)
                busy = true;
            else
                return cuda_fail("cudaEventQuery", e);
        }
        if (s) {
            cudaError_t e = cudaStreamQuery(s->stream);
            if (e == cudaErrorNotReady)
                busy = true;
            else if (e != cudaSuccess)
                return cuda_fail("cudaStreamQuery", e);
        }
        if (!busy)
            return c->broken ? broken_error(c, what) : CP_SUCCESS;
        if (d.passed()) {
            char why[96];
            snprintf(why, sizeof why, "the work queued on it had not finished after %d ms", d.ms);
            return give_up(c, CP_ERROR_TIMEOUT, what, why);
        }
    }
}

// The stream the transfer is ordered on; NCCL moves device memory only. Also
// refuses a communicator given up on and reports pending asynchronous errors.
cp_status begin(nccl_comm *c, const cp_xfer *x, const char *what, state **out)
{
    if (!x || x->backend != ops() || !x->backend_state)
        return fail(CP_ERROR_INVALID_ARGUMENT,
                    "nccl %s: the buffers are not on a CUDA context (backend \"%s\"); NCCL moves device memory only",
                    what, x && x->backend ? x->backend->name : "host");
    bool busy;
    cp_status r = check_async(c, what, &busy);
    if (r == CP_SUCCESS && busy) // a non-blocking call still being set up (not ours: ours are settled)
        r = settle(c, IN_PROGRESS, what, deadline(x->timeout_ms));
    if (r != CP_SUCCESS)
        return r;
    *out = static_cast<state *>(x->backend_state);
    return use_device(*out);
}

// After the NCCL call(s) of `what` returned e: settle and track the work.
cp_status finish(nccl_comm *c, state *s, const cp_xfer *x, const char *what, ncclResult_t e)
{
    cp_status r = settle(c, e, what, deadline(x->timeout_ms));
    return r == CP_SUCCESS ? track(c, s, what) : r;
}

bool nccl_type(cp_dtype t, ncclDataType_t *out)
{
    switch (t) {
    case CP_DTYPE_F32: *out = ncclFloat32; return true;
    case CP_DTYPE_F64: *out = ncclFloat64; return true;
    case CP_DTYPE_F16: *out = ncclFloat16; return true;
    case CP_DTYPE_BF16: *out = ncclBfloat16; return true;
    case CP_DTYPE_FP8_E4M3: return false; // moved as bytes; never reduced
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
    cp_status r = begin(c, x, "all_gather", &s);
    if (r != CP_SUCCESS)
        return r;
    return finish(c, s, x, "all_gather (ncclAllGather)", ncclAllGather(send, recv, bytes, ncclInt8, c->comm, s->stream));
}

// op over ranks of count elements (all_reduce: send -> recv; reduce_scatter:
// send holds size blocks of count).
cp_status reduce_common(nccl_comm *c, const cp_xfer *x, const void *send, void *recv, size_t count, cp_dtype t,
                        cp_reduce_op op, bool scatter)
{
    const char *what = scatter ? "reduce_scatter" : "all_reduce";
    const char *call = scatter ? "reduce_scatter (ncclReduceScatter)" : "all_reduce (ncclAllReduce)";
    cp_status r = check_reduction(what, t, op);
    state *s;
    if (r != CP_SUCCESS || (r = begin(c, x, what, &s)) != CP_SUCCESS)
        return r;
    ncclDataType_t nt = ncclFloat32;
    nccl_type(t, &nt);
    const size_t in_count = scatter ? count * (size_t)c->size : count;
    if (!narrow(t)) {
        ncclResult_t e = scatter ? ncclReduceScatter(send, recv, count, nt, nccl_op(op), c->comm, s->stream)
                                 : ncclAllReduce(send, recv, count, nt, nccl_op(op), c->comm, s->stream);
        return finish(c, s, x, call, e);
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
        r = finish(c, s, x, call, e);
        if (r == CP_SUCCESS)
            r = launch_convert(s, recv, t, wout, CP_DTYPE_F32, count);
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

// ncclGroupEnd's result unless an earlier call of the group failed.
ncclResult_t group_end(ncclResult_t e)
{
    ncclResult_t e2 = ncclGroupEnd();
    return e == ncclSuccess ? e2 : e;
}

cp_status n_all_to_all(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    state *s;
    cp_status r = begin(c, x, "all_to_all", &s);
    if (r != CP_SUCCESS)
        return r;
    ncclResult_t e = ncclGroupStart();
    for (int j = 0; j < c->size && e == ncclSuccess; j++) {
        e = ncclSend(static_cast<const char *>(send) + (size_t)j * bytes, bytes, ncclInt8, j, c->comm, s->stream);
        if (e == ncclSuccess)
            e = ncclRecv(static_cast<char *>(recv) + (size_t)j * bytes, bytes, ncclInt8, j, c->comm, s->stream);
    }
    return finish(c, s, x, "all_to_all (grouped send/recv)", group_end(e));
}

cp_status n_sendrecv(void *impl, const cp_xfer *x, const void *send, size_t send_bytes, int dst, void *recv,
                     size_t recv_bytes, int src)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    if (dst < 0 || dst >= c->size || src < 0 || src >= c->size)
        return fail(CP_ERROR_INVALID_ARGUMENT, "nccl sendrecv: dst = %d, src = %d (communicator of %d ranks)", dst,
                    src, c->size);
    state *s;
    cp_status r = begin(c, x, "sendrecv", &s);
    if (r != CP_SUCCESS)
        return r;
    ncclResult_t e = ncclGroupStart();
    if (e == ncclSuccess && send_bytes)
        e = ncclSend(send, send_bytes, ncclInt8, dst, c->comm, s->stream);
    if (e == ncclSuccess && recv_bytes)
        e = ncclRecv(recv, recv_bytes, ncclInt8, src, c->comm, s->stream);
    return finish(c, s, x, "sendrecv (grouped send/recv)", group_end(e));
}

// Waits on the host, so through wait_work: bounded by x's timeout.
cp_status n_barrier(void *impl, const cp_xfer *x)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    state *s;
    cp_status r = begin(c, x, "barrier", &s);
    if (r != CP_SUCCESS)
        return r;
    wide_buf w;
    if ((r = wide_alloc(s, 1, &w)) != CP_SUCCESS)
        return r;
    cudaError_t ce = cudaMemsetAsync(w.p, 0, sizeof(float), s->stream);
    if (ce != cudaSuccess)
        return wide_free(s, &w, cuda_fail("cudaMemsetAsync", ce));
    r = finish(c, s, x, "barrier (ncclAllReduce)",
               ncclAllReduce(w.p, w.p, 1, ncclFloat32, ncclSum, c->comm, s->stream));
    r = wide_free(s, &w, r); // stream-ordered: safe before the wait
    return r == CP_SUCCESS ? wait_work(c, "barrier", deadline(x->timeout_ms), s) : r;
}

cp_status n_wait(void *impl, const cp_xfer *x)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    const state *s = nullptr;
    if (x->backend == ops() && x->backend_state) {
        state *st = static_cast<state *>(x->backend_state);
        cp_status r = use_device(st);
        if (r != CP_SUCCESS)
            return r;
        s = st;
    }
    char what[96];
    snprintf(what, sizeof what, "waiting for %s", c->last ? c->last : "the communicator's work");
    return wait_work(c, what, deadline(x->timeout_ms), s);
}

nccl_comm *new_comm(ncclComm_t comm, bool owned, bool nonblocking)
{
    nccl_comm *c = new (std::nothrow) nccl_comm();
    if (c) {
        c->comm = comm;
        c->owned = owned;
        c->nonblocking = nonblocking;
    }
    return c;
}

cp_status read_shape(nccl_comm *c)
{
    ncclResult_t e;
    if ((e = ncclCommUserRank(c->comm, &c->rank)) != ncclSuccess || (e = ncclCommCount(c->comm, &c->size)) != ncclSuccess)
        return fail(CP_ERROR_COMM, "nccl: reading the communicator's rank and size: %s", ncclGetErrorString(e));
    return CP_SUCCESS;
}

// Release an owned communicator, waiting at most until d: its work first,
// then (non-blocking) ncclCommFinalize; whatever does not finish in time is
// aborted instead (give_up records why in cp_last_error()).
void release(nccl_comm *c, const deadline &d)
{
    if (c->broken)
        return; // aborted already
    cp_status r = wait_work(c, "destroy (waiting for queued work)", d, nullptr);
#ifdef CP_NCCL_NONBLOCKING
    if (r == CP_SUCCESS && c->nonblocking)
        r = settle(c, ncclCommFinalize(c->comm), "destroy (ncclCommFinalize)", d);
#endif
    if (c->broken)
        return;
    if (r != CP_SUCCESS) { // a CUDA or NCCL error: no wait is safe, abort
        ncclCommAbort(c->comm);
        return;
    }
    ncclCommDestroy(c->comm);
}

cp_status n_split(void *impl, int color, int key, int timeout_ms, void **out_impl, int *out_rank, int *out_size)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    *out_impl = nullptr;
#ifndef CP_NCCL_SPLIT
    (void)c, (void)color, (void)key, (void)timeout_ms, (void)out_rank, (void)out_size;
    return fail(CP_ERROR_UNSUPPORTED, "nccl split: ncclCommSplit needs NCCL 2.18 or newer (built with %d.%d)",
                NCCL_MAJOR, NCCL_MINOR);
#else
    const deadline d(timeout_ms);
    bool busy;
    cp_status r = check_async(c, "split", &busy);
    if (r == CP_SUCCESS && busy)
        r = settle(c, IN_PROGRESS, "split", d);
    if (r != CP_SUCCESS)
        return r;
    // The new communicator is non-blocking: its set-up (which waits for the
    // other members) and every later call can then be given up on and aborted.
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    // Where NCCL stores the new communicator. A non-blocking parent (those
    // the library makes, maybe the caller's) splits in the background:
    // ncclCommSplit returns at once, ncclSuccess or ncclInProgress, with the
    // slot still NULL, and NCCL's thread stores the new communicator there
    // (NULL for no color) when the split is done, maybe after this call gave
    // up; so the slot lives on the heap and is left to NCCL while its thread
    // may still be running.
    ncclComm_t *slot = new (std::nothrow) ncclComm_t(nullptr);
    if (!slot)
        return fail(CP_ERROR_OUT_OF_MEMORY, "nccl: out of host memory");
    ncclResult_t e = ncclCommSplit(c->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, slot, &cfg);
    if (e != ncclSuccess && !in_progress(e)) {
        delete slot; // NCCL clears it on a failed call
        return nccl_fail(c, "split (ncclCommSplit)", e);
    }
    if (!*slot) {
        // wait for the parent's background work, which fills the slot
        bool parent_busy = false;
        r = check_async(c, "split (ncclCommSplit)", &parent_busy);
        if (r == CP_SUCCESS && parent_busy) {
            r = settle(c, IN_PROGRESS, "split (ncclCommSplit)", d);
            e = IN_PROGRESS; // then see how the new one's set-up ended
        }
        if (r != CP_SUCCESS) {
            if (c->broken && c->owned) { // aborted, which ended NCCL's thread
                if (*slot)
                    ncclCommAbort(*slot);
                delete slot;
            }
            return r;
        }
    }
    ncclComm_t nc = *slot;
    delete slot;
    if (!nc)
        return CP_SUCCESS; // this rank joins no group
    nccl_comm *n = new_comm(nc, true, true);
    if (!n) {
        ncclCommAbort(nc);
        return fail(CP_ERROR_OUT_OF_MEMORY, "nccl: out of host memory");
    }
    n->timeout_ms = timeout_ms;
    if ((r = settle(n, e, "split (ncclCommSplit)", d)) == CP_SUCCESS && (r = read_shape(n)) != CP_SUCCESS)
        ncclCommAbort(nc);
    if (r != CP_SUCCESS) {
        delete n; // settle aborted nc if it gave up
        return r;
    }
    *out_impl = n;
    *out_rank = n->rank;
    *out_size = n->size;
    return CP_SUCCESS;
#endif
}

void n_destroy(void *impl)
{
    nccl_comm *c = static_cast<nccl_comm *>(impl);
    if (!c)
        return;
    if (c->owned)
        release(c, deadline(c->timeout_ms));
    for (pending &p : c->work)
        if (p.done)
            cudaEventDestroy(p.done); // released once its work is done, if it is not
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
    o.wait = n_wait;
    return o;
}

const cp_transport_ops g_nccl = make_ops();

// How long cp_comm_create_nccl_id waits for the other ranks to join, and its
// communicator's destroy for queued work: the 5 minutes of cp_comm_split.
constexpr int INIT_TIMEOUT_MS = 300000;

static_assert(sizeof(ncclUniqueId) == CP_NCCL_UNIQUE_ID_BYTES, "ncclUniqueId is not CP_NCCL_UNIQUE_ID_BYTES bytes");

} // namespace
#endif

#ifndef CP_HAVE_NCCL
namespace {
cp_status no_nccl(const char *func)
{
    return fail(CP_ERROR_UNSUPPORTED,
                "%s: this CUDA module was built without NCCL (install NCCL's development files, e.g. Debian's "
                "libnccl-dev, and rebuild)",
                func);
}
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
    nccl_comm *c = new_comm(static_cast<ncclComm_t>(foreign), false, false);
    if (!c)
        return fail(CP_ERROR_OUT_OF_MEMORY, "nccl: out of host memory");
    cp_status r = read_shape(c);
    if (r == CP_SUCCESS)
        r = host->comm_wrap(&g_nccl, c, c->rank, c->size, out);
    if (r != CP_SUCCESS)
        delete c;
    return r;
#else
    (void)foreign;
    return no_nccl("cp_comm_create_nccl");
#endif
}

cp_status nccl_unique_id(void *id, size_t bytes)
{
    if (!id || bytes != CP_NCCL_UNIQUE_ID_BYTES)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cp_nccl_unique_id: id %p, id_bytes = %zu (must be %d)", id, bytes,
                    CP_NCCL_UNIQUE_ID_BYTES);
#ifdef CP_HAVE_NCCL
    ncclUniqueId uid;
    ncclResult_t e = ncclGetUniqueId(&uid);
    if (e != ncclSuccess) {
        const char *last = last_text(nullptr);
        return fail(CP_ERROR_COMM, "cp_nccl_unique_id: ncclGetUniqueId: %s%s%s", ncclGetErrorString(e),
                    last && *last ? ": " : "", last ? last : "");
    }
    memcpy(id, &uid, sizeof uid);
    return CP_SUCCESS;
#else
    return no_nccl("cp_nccl_unique_id");
#endif
}

// The communicator of cp_comm_create_nccl_id: the library's own (destroy
// destroys it). Non-blocking where NCCL has ncclConfig_t, like those of
// split, so that waiting for the other ranks to join is bounded and the
// communicator can be aborted when they do not.
cp_status nccl_comm_create(void *p, const void *id, size_t bytes, int nranks, int rank, cp_comm **out)
{
    if (!out)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cp_comm_create_nccl_id: out is NULL");
    *out = nullptr;
    if (!p || !id || bytes != CP_NCCL_UNIQUE_ID_BYTES || nranks < 1 || rank < 0 || rank >= nranks)
        return fail(CP_ERROR_INVALID_ARGUMENT,
                    "cp_comm_create_nccl_id: state %p, id %p, id_bytes = %zu, nranks = %d, rank = %d", p, id, bytes,
                    nranks, rank);
#ifdef CP_HAVE_NCCL
    state *s = static_cast<state *>(p);
    cp_status r = use_device(s); // NCCL takes the calling thread's current device
    if (r != CP_SUCCESS)
        return r;
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
#ifdef CP_NCCL_NONBLOCKING
    const bool nonblocking = true;
#else
    const bool nonblocking = false;
#endif
    nccl_comm *c = new_comm(nullptr, true, nonblocking);
    if (!c)
        return fail(CP_ERROR_OUT_OF_MEMORY, "nccl: out of host memory");
    c->timeout_ms = INIT_TIMEOUT_MS;
    const deadline d(INIT_TIMEOUT_MS);
    ncclComm_t nc = nullptr;
#ifdef CP_NCCL_NONBLOCKING
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    const char *what = "cp_comm_create_nccl_id (ncclCommInitRankConfig)";
    ncclResult_t e = ncclCommInitRankConfig(&nc, nranks, uid, rank, &cfg);
#else
    const char *what = "cp_comm_create_nccl_id (ncclCommInitRank)";
    ncclResult_t e = ncclCommInitRank(&nc, nranks, uid, rank);
#endif
    if ((e != ncclSuccess && !in_progress(e)) || !nc) {
        r = e != ncclSuccess ? nccl_fail(c, what, e)
                             : fail(CP_ERROR_COMM, "nccl: %s returned no communicator", what);
        delete c; // NCCL frees what a failed init made
        return r;
    }
    c->comm = nc;
    r = settle(c, e, what, d); // gives up (aborting nc) at the deadline or on an error
    if (r == CP_SUCCESS && (r = read_shape(c)) == CP_SUCCESS && (c->rank != rank || c->size != nranks))
        r = fail(CP_ERROR_COMM, "nccl: %s made rank %d of %d ranks, not rank %d of %d", what, c->rank, c->size, rank,
                 nranks);
    if (r == CP_SUCCESS)
        r = host->comm_wrap(&g_nccl, c, c->rank, c->size, out);
    if (r != CP_SUCCESS) {
        if (!c->broken)
            ncclCommAbort(nc); // nothing was queued on it
        delete c;
        return r;
    }
    return CP_SUCCESS;
#else
    (void)p;
    return no_nccl("cp_comm_create_nccl_id");
#endif
}

} // namespace cu
