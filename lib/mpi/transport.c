/* SPDX-License-Identifier: MIT */
/*
 * The MPI transport module, transport-mpi.so: cp_comm over a duplicate of a
 * caller's MPI communicator, so library traffic never mixes with the
 * caller's.
 *
 * Every collective first all-gathers the ranks' call descriptors
 * (comm/call.h): ranks that disagree all return CP_ERROR_MISMATCH before
 * any payload moves, and the exchange doubles as the rendezvous that a
 * missing rank times out on. Waits poll nonblocking requests against a
 * deadline instead of blocking in MPI.
 *
 * Payloads travel through host buffers of the module's own: device memory
 * has to be staged anyway, and a request abandoned after a timeout may
 * still write into its buffer when a late peer finally arrives - so such
 * buffers are deliberately never freed, and the caller's memory is never
 * touched after the call returns.
 *
 * Reductions of F16/BF16 are widened to F32 on the host before MPI sums
 * them, so the result is rounded to the storage type once.
 */
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/call.h"
#include "core/half.h"
#include "core/status.h"

#define MODULE_EXPORT __attribute__((visibility("default")))

/* Arbitrary, fixed: the duplicated communicator carries only our traffic. */
#define TAG_SENDRECV 7411

static const cp_module_host *host;

static cp_status fail(cp_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cp_status fail(cp_status s, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return host->set_error(s, msg);
}

static cp_status mpi_error(int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    /* Only a code MPI itself has no text for is shown as a number. */
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d (MPI_Error_string has no text for it)", rc);
    return fail(CP_ERROR_COMM, "mpi %s: %s", what, text);
}

typedef struct mpi_impl {
    MPI_Comm comm; /* ours: a duplicate */
    int rank, size;
    cp_status broken; /* after a timeout: requests may still be pending */
    char why[256];
    cpi_call mine;    /* this rank's descriptor while it travels */
    cpi_call *calls;  /* every rank's */
    size_t max_count; /* elements per MPI reduction call (MPI counts are int) */
} mpi_impl;

/* ---- waiting ------------------------------------------------------------ */

static void pause_briefly(void)
{
    struct timespec ts = { 0, 20000 }; /* 20 us: lets oversubscribed peers run */
    nanosleep(&ts, NULL);
}

/* Complete n requests, or give up at the deadline and mark m broken (the
 * requests and their buffers are then abandoned, never freed). */
static cp_status wait_all(mpi_impl *m, int n, MPI_Request *reqs, int timeout_ms, int32_t kind)
{
    double deadline = MPI_Wtime() + timeout_ms / 1000.0;
    for (unsigned polls = 0;; polls++) {
        int done = 0;
        int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            m->broken = CP_ERROR_COMM;
            snprintf(m->why, sizeof m->why, "%s failed in MPI", cpi_call_name(kind));
            return mpi_error(rc, cpi_call_name(kind));
        }
        if (done)
            return CP_SUCCESS;
        if (timeout_ms > 0 && MPI_Wtime() > deadline) {
            m->broken = CP_ERROR_TIMEOUT;
            snprintf(m->why, sizeof m->why, "%s timed out after %d ms on rank %d of %d", cpi_call_name(kind),
                     timeout_ms, m->rank, m->size);
            return fail(CP_ERROR_TIMEOUT, "mpi %s", m->why);
        }
        if (polls > 100)
            pause_briefly();
    }
}

/* All-gather the descriptors and compare them. On success every rank has
 * entered the same call; on failure every rank that got the descriptors
 * fails alike. */
static cp_status agree(mpi_impl *m, cpi_call call, int timeout_ms)
{
    if (m->broken != CP_SUCCESS)
        return fail(m->broken, "mpi %s: the communicator is unusable after an earlier failure: %s",
                    cpi_call_name(call.kind), m->why);
    m->mine = call;
    MPI_Request r;
    int rc = MPI_Iallgather(&m->mine, (int)sizeof m->mine, MPI_BYTE, m->calls, (int)sizeof m->mine, MPI_BYTE,
                            m->comm, &r);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, cpi_call_name(call.kind));
    cp_status s = wait_all(m, 1, &r, timeout_ms, call.kind);
    if (s != CP_SUCCESS)
        return s;
    int f = cpi_call_failed_rank(m->calls, m->size);
    if (f == m->rank)
        return (cp_status)call.status; /* the message is this thread's already */
    if (f >= 0)
        return fail(CP_ERROR_COMM, "mpi %s: rank %d failed before the exchange (%s)", cpi_call_name(call.kind),
                    f, cpi_status_text((cp_status)m->calls[f].status));
    char why[256];
    if (!cpi_call_agree(m->calls, m->size, why, sizeof why))
        return fail(CP_ERROR_MISMATCH, "mpi transport, rank %d: %s", m->rank, why);
    return CP_SUCCESS;
}

/* ---- host staging ------------------------------------------------------- */

static int on_host(const cp_xfer *x)
{
    return !x->backend || x->backend->device == CP_DEVICE_CPU;
}

static cp_status stage_in(const cp_xfer *x, void *h, const void *src, size_t bytes)
{
    if (!bytes)
        return CP_SUCCESS;
    if (on_host(x)) {
        memcpy(h, src, bytes);
        return CP_SUCCESS;
    }
    cp_status s = x->backend->copy_2d(x->backend_state, h, bytes, src, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST);
    return s != CP_SUCCESS ? s : x->backend->synchronize(x->backend_state);
}

static cp_status stage_out(const cp_xfer *x, void *dst, const void *h, size_t bytes)
{
    if (!bytes)
        return CP_SUCCESS;
    if (on_host(x)) {
        memcpy(dst, h, bytes);
        return CP_SUCCESS;
    }
    cp_status s = x->backend->copy_2d(x->backend_state, dst, bytes, h, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE);
    return s != CP_SUCCESS ? s : x->backend->synchronize(x->backend_state);
}

static void *host_alloc(size_t bytes, cp_status *s)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p && *s == CP_SUCCESS)
        *s = fail(CP_ERROR_OUT_OF_MEMORY, "mpi: out of host memory staging %zu bytes", bytes);
    return p;
}

/* MPI counts are int: describe bytes as count elements of a contiguous
 * type (MPI_BYTE, or a power-of-two block for large messages). */
typedef struct msg {
    int count;
    MPI_Datatype type;
} msg;

static cp_status msg_of(size_t bytes, msg *out)
{
    out->type = MPI_BYTE;
    size_t unit = 1;
    while (bytes / unit > INT_MAX && unit < ((size_t)1 << 30) && bytes % (unit * 2) == 0)
        unit *= 2;
    if (bytes / unit > INT_MAX)
        return fail(CP_ERROR_UNSUPPORTED, "mpi: a message of %zu bytes is too large for MPI's int counts", bytes);
    out->count = (int)(bytes / unit);
    if (unit > 1 && (MPI_Type_contiguous((int)unit, MPI_BYTE, &out->type) != MPI_SUCCESS ||
                     MPI_Type_commit(&out->type) != MPI_SUCCESS))
        return fail(CP_ERROR_COMM, "mpi: cannot create a %zu-byte datatype", unit);
    return CP_SUCCESS;
}

static void msg_free(msg *mm)
{
    if (mm->type != MPI_BYTE && mm->type != MPI_DATATYPE_NULL)
        MPI_Type_free(&mm->type);
}

/* A call's host buffers; kept (leaked) if the call was abandoned. */
typedef struct buffers {
    void *send, *recv;
} buffers;

static cp_status finish(mpi_impl *m, buffers *b, cp_status s)
{
    if (m->broken == CP_SUCCESS) {
        free(b->send);
        free(b->recv);
    }
    return s;
}

/* ---- the collectives ---------------------------------------------------- */

typedef enum { GATHER, ALLTOALL } exchange_kind;

/* all_gather and all_to_all: the same staging around one MPI collective. */
static cp_status exchange(mpi_impl *m, const cp_xfer *x, exchange_kind kind, const void *send, void *recv,
                          size_t bytes)
{
    cp_status s = CP_SUCCESS;
    size_t total = bytes * (size_t)m->size; /* the core checked the product */
    size_t send_bytes = kind == GATHER ? bytes : total;
    buffers b = { host_alloc(send_bytes, &s), host_alloc(total, &s) };
    msg mm = { 0, MPI_DATATYPE_NULL };
    if (s == CP_SUCCESS)
        s = msg_of(bytes, &mm);
    if (s == CP_SUCCESS)
        s = stage_in(x, b.send, send, send_bytes);
    cpi_call call = cpi_call_make(kind == GATHER ? CPI_CALL_ALL_GATHER : CPI_CALL_ALL_TO_ALL, bytes, -1, -1);
    call.status = (int32_t)s;
    s = agree(m, call, x->timeout_ms);
    if (s == CP_SUCCESS) {
        MPI_Request r;
        int rc = kind == GATHER
                     ? MPI_Iallgather(b.send, mm.count, mm.type, b.recv, mm.count, mm.type, m->comm, &r)
                     : MPI_Ialltoall(b.send, mm.count, mm.type, b.recv, mm.count, mm.type, m->comm, &r);
        s = rc != MPI_SUCCESS ? mpi_error(rc, cpi_call_name(call.kind)) : wait_all(m, 1, &r, x->timeout_ms, call.kind);
    }
    if (s == CP_SUCCESS)
        s = stage_out(x, recv, b.recv, total);
    msg_free(&mm);
    return finish(m, &b, s);
}

static cp_status mpi_all_gather(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    return exchange(impl, x, GATHER, send, recv, bytes);
}

static cp_status mpi_all_to_all(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    return exchange(impl, x, ALLTOALL, send, recv, bytes);
}

static cp_status mpi_sendrecv(void *impl, const cp_xfer *x, const void *send, size_t send_bytes, int dst,
                              void *recv, size_t recv_bytes, int src)
{
    mpi_impl *m = impl;
    cp_status s = CP_SUCCESS;
    buffers b = { host_alloc(send_bytes, &s), host_alloc(recv_bytes, &s) };
    msg ms = { 0, MPI_DATATYPE_NULL }, mr = { 0, MPI_DATATYPE_NULL };
    if (s == CP_SUCCESS)
        s = msg_of(send_bytes, &ms);
    if (s == CP_SUCCESS)
        s = msg_of(recv_bytes, &mr);
    if (s == CP_SUCCESS)
        s = stage_in(x, b.send, send, send_bytes);
    cpi_call call = cpi_call_make(CPI_CALL_SENDRECV, send_bytes, -1, -1);
    call.a = dst;
    call.b = src;
    call.recv = recv_bytes;
    call.status = (int32_t)s;
    s = agree(m, call, x->timeout_ms);
    if (s == CP_SUCCESS) {
        MPI_Request r[2];
        int rc = MPI_Irecv(b.recv, mr.count, mr.type, src, TAG_SENDRECV, m->comm, &r[0]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(b.send, ms.count, ms.type, dst, TAG_SENDRECV, m->comm, &r[1]);
        else
            r[1] = MPI_REQUEST_NULL;
        s = rc != MPI_SUCCESS ? mpi_error(rc, "sendrecv") : wait_all(m, 2, r, x->timeout_ms, call.kind);
    }
    if (s == CP_SUCCESS)
        s = stage_out(x, recv, b.recv, recv_bytes);
    msg_free(&ms);
    msg_free(&mr);
    return finish(m, &b, s);
}

/* Host element conversions around MPI's reduction. */
static void widen(float *dst, const void *src, cp_dtype t, size_t n)
{
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = t == CP_DTYPE_F16 ? cpi_f16_to_f32(h[i]) : cpi_bf16_to_f32(h[i]);
}

static void narrow(void *dst, const float *src, cp_dtype t, size_t n)
{
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++)
        h[i] = t == CP_DTYPE_F16 ? cpi_f32_to_f16(src[i]) : cpi_f32_to_bf16(src[i]);
}

static size_t dtype_size(cp_dtype t)
{
    return t == CP_DTYPE_F64 ? 8 : t == CP_DTYPE_F32 ? 4 : t == CP_DTYPE_FP8_E4M3 ? 1 : 2;
}

/* all_reduce (recv has count elements) and reduce_scatter (send has
 * size * count): widen on the host, reduce in MPI, narrow back. */
static cp_status reduction(mpi_impl *m, const cp_xfer *x, cpi_call_kind kind, const void *send, void *recv,
                           size_t count, cp_dtype dtype, cp_reduce_op op)
{
    bool half = dtype == CP_DTYPE_F16 || dtype == CP_DTYPE_BF16;
    size_t in = kind == CPI_CALL_REDUCE_SCATTER ? count * (size_t)m->size : count; /* the core checked in * esize */
    size_t esize = dtype_size(dtype), wsize = half ? 4 : esize;
    /* Widened to F32, F16/BF16 take twice the bytes the core checked. */
    cp_status s = CP_SUCCESS;
    if (in > SIZE_MAX / wsize)
        s = fail(CP_ERROR_INVALID_ARGUMENT, "mpi %s: %zu elements widened to F32 overflow size_t",
                 cpi_call_name(kind), in);
    bool room = s == CP_SUCCESS;
    /* raw: the send elements as stored; wide: as reduced (one buffer when
     * no widening is needed); out: the result, separate for reduce_scatter */
    void *raw = room ? host_alloc(in * esize, &s) : NULL;
    void *wide = half && room ? host_alloc(in * wsize, &s) : raw;
    void *out = kind == CPI_CALL_REDUCE_SCATTER && room ? host_alloc(count * wsize, &s) : wide;
    /* reduce_scatter in several calls: each call's share of every rank's block, packed */
    const size_t chunk = m->max_count;
    void *pack = kind == CPI_CALL_REDUCE_SCATTER && count > chunk && room ? host_alloc(chunk * (size_t)m->size * wsize, &s)
                                                                          : NULL;
    if (s == CP_SUCCESS)
        s = stage_in(x, raw, send, in * esize);
    if (s == CP_SUCCESS && half)
        widen(wide, raw, dtype, in);
    cpi_call call = cpi_call_make(kind, count, (int)dtype, (int)op);
    call.status = (int32_t)s;
    s = agree(m, call, x->timeout_ms);
    if (s == CP_SUCCESS) {
        MPI_Datatype type = dtype == CP_DTYPE_F64 ? MPI_DOUBLE : MPI_FLOAT;
        MPI_Op mop = op == CP_REDUCE_MAX ? MPI_MAX : MPI_SUM;
        for (size_t c0 = 0; c0 < count && s == CP_SUCCESS; c0 += chunk) {
            const size_t n = count - c0 < chunk ? count - c0 : chunk;
            MPI_Request r;
            int rc;
            if (kind == CPI_CALL_ALL_REDUCE) {
                rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)wide + c0 * wsize, (int)n, type, mop, m->comm, &r);
            } else {
                const void *src = wide;
                if (pack) {
                    for (int k = 0; k < m->size; k++)
                        memcpy((char *)pack + (size_t)k * n * wsize, (char *)wide + ((size_t)k * count + c0) * wsize,
                               n * wsize);
                    src = pack;
                }
                rc = MPI_Ireduce_scatter_block(src, (char *)out + c0 * wsize, (int)n, type, mop, m->comm, &r);
            }
            s = rc != MPI_SUCCESS ? mpi_error(rc, cpi_call_name(kind)) : wait_all(m, 1, &r, x->timeout_ms, kind);
        }
    }
    if (s == CP_SUCCESS && half)
        narrow(raw, out, dtype, count);
    if (s == CP_SUCCESS)
        s = stage_out(x, recv, half ? raw : out, count * esize);
    if (m->broken == CP_SUCCESS) {
        free(pack);
        if (out != wide)
            free(out);
        if (wide != raw)
            free(wide);
        free(raw);
    }
    return s;
}

static cp_status mpi_all_reduce(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                                cp_dtype dtype, cp_reduce_op op)
{
    return reduction(impl, x, CPI_CALL_ALL_REDUCE, send, recv, count, dtype, op);
}

static cp_status mpi_reduce_scatter(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                                    cp_dtype dtype, cp_reduce_op op)
{
    return reduction(impl, x, CPI_CALL_REDUCE_SCATTER, send, recv, count, dtype, op);
}

/* The descriptor exchange completes only once every rank has arrived. */
static cp_status mpi_barrier(void *impl, const cp_xfer *x)
{
    return agree(impl, cpi_call_make(CPI_CALL_BARRIER, 0, -1, -1), x->timeout_ms);
}

/* ---- communicators ------------------------------------------------------ */

static const cp_transport_ops mpi_ops;

/* Take ownership of comm (freed on failure). */
static cp_status impl_create(MPI_Comm comm, mpi_impl **out)
{
    mpi_impl *m = calloc(1, sizeof *m);
    int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS && m) {
        MPI_Comm_rank(comm, &m->rank);
        MPI_Comm_size(comm, &m->size);
        m->calls = calloc((size_t)m->size, sizeof *m->calls);
        /* Reductions of more elements go in several calls. The variable
         * lowers the limit so that tests can cross it with small buffers. */
        const char *env = getenv("INFINICP_MPI_MAX_COUNT");
        long long v = env ? atoll(env) : 0;
        m->max_count = v > 0 && v < INT_MAX ? (size_t)v : (size_t)INT_MAX;
    }
    if (rc != MPI_SUCCESS || !m || !m->calls) {
        if (m)
            free(m->calls);
        free(m);
        MPI_Comm_free(&comm);
        return rc != MPI_SUCCESS ? mpi_error(rc, "MPI_Comm_set_errhandler")
                                 : fail(CP_ERROR_OUT_OF_MEMORY, "mpi: out of host memory");
    }
    m->comm = comm;
    *out = m;
    return CP_SUCCESS;
}

static void mpi_destroy(void *impl)
{
    mpi_impl *m = impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Comm_free(&m->comm); /* pending requests still complete normally */
    if (m->broken != CP_SUCCESS)
        return; /* abandoned requests may still write m->calls */
    free(m->calls);
    free(m);
}

/* The descriptor exchange bounds the wait; once every rank is known to be
 * in the split, the blocking MPI_Comm_split cannot hang on a missing one. */
static cp_status mpi_split(void *impl, int color, int key, int timeout_ms, void **out_impl, int *out_rank,
                           int *out_size)
{
    mpi_impl *m = impl;
    cpi_call call = cpi_call_make(CPI_CALL_SPLIT, 0, -1, -1);
    call.a = color < 0 ? -1 : color;
    call.b = key;
    cp_status s = agree(m, call, timeout_ms);
    if (s != CP_SUCCESS)
        return s;
    MPI_Comm nc = MPI_COMM_NULL;
    int rc = MPI_Comm_split(m->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "split");
    if (nc == MPI_COMM_NULL)
        return CP_SUCCESS;
    mpi_impl *n = NULL;
    s = impl_create(nc, &n);
    if (s != CP_SUCCESS)
        return s;
    *out_impl = n;
    *out_rank = n->rank;
    *out_size = n->size;
    return CP_SUCCESS;
}

static cp_status mpi_create(const cp_module_host *h, void *foreign, cp_comm **out)
{
    (void)h;
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cp_comm_create_mpi: MPI is %s",
                    finalized ? "already finalized" : "not initialized (call MPI_Init first)");
    MPI_Comm user = *(MPI_Comm *)foreign;
    if (user == MPI_COMM_NULL)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cp_comm_create_mpi: *mpi_comm is MPI_COMM_NULL");
    int inter = 0;
    if (MPI_Comm_test_inter(user, &inter) == MPI_SUCCESS && inter)
        return fail(CP_ERROR_INVALID_ARGUMENT, "cp_comm_create_mpi: *mpi_comm is an intercommunicator");
    MPI_Comm dup;
    int rc = MPI_Comm_dup(user, &dup);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Comm_dup");
    mpi_impl *m = NULL;
    cp_status s = impl_create(dup, &m);
    if (s != CP_SUCCESS)
        return s;
    s = host->comm_wrap(&mpi_ops, m, m->rank, m->size, out);
    if (s != CP_SUCCESS)
        mpi_destroy(m);
    return s;
}

static const cp_transport_ops mpi_ops = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_transport_ops),
    .name = "mpi",
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_to_all = mpi_all_to_all,
    .sendrecv = mpi_sendrecv,
    .all_reduce = mpi_all_reduce,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .destroy = mpi_destroy,
};

static const cp_transport_module module = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_transport_module),
    .name = "mpi",
    .create = mpi_create,
};

MODULE_EXPORT const cp_transport_module *cp_transport_module_v1(const cp_module_host *h);
MODULE_EXPORT const cp_transport_module *cp_transport_module_v1(const cp_module_host *h)
{
    if (!h || h->abi_version != CP_MODULE_ABI_VERSION || h->struct_size < sizeof(cp_module_host))
        return NULL;
    host = h;
    return &module;
}
