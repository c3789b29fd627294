/* SPDX-License-Identifier: MIT */
/*
 * The in-process transport: the ranks of a world are threads of one process
 * (each rank driven by its own thread, as with ncclCommInitAll), and data
 * moves through the buffers' own backend tables, so buffers may live in host
 * memory or on any device.
 *
 * Every collective is two rendezvous:
 *  - arrival: each rank posts a descriptor of its call (cpi_call) and a
 *    pointer to its send buffer, then waits for all. Now every rank sees every
 *    descriptor; ranks that disagree all return CP_ERROR_MISMATCH before any
 *    byte moves. A rank that does not arrive within the timeout makes the
 *    others return CP_ERROR_TIMEOUT, and the world is marked broken.
 *  - departure: each rank pulls what it needs from its peers' send buffers
 *    into its own memory, posts its status and waits for all. After it, no
 *    rank reads another's buffers any more, so results that alias the send
 *    buffer (in-place reductions) are written only now. Every rank that
 *    arrived is inside the library and will depart, so this wait has no
 *    deadline: a rank never returns while a peer may still read its buffers.
 *
 * Slots are written by their owner only between its own arrival and
 * departure, and read by peers only in that same window, so the two
 * rendezvous (whose mutex orders memory) are all the locking data needs.
 *
 * Buffers on a device whose backend has events are exchanged in stream
 * order, as NCCL does, and the host never waits for the device: at arrival
 * each rank records an event after the work that produces its send buffer
 * and posts it; a reader's stream waits for that event before its copies;
 * at departure each reader posts an event after its copies, and an owner's
 * stream waits for the events of the ranks that read its buffer, so nothing
 * it queues later (an in-place result, the next write to that buffer) can
 * overtake their reads. A third rendezvous then lets every rank destroy its
 * events, since no peer waits on them any more. Other buffers (host memory,
 * backends without events, or INFINICP_LOCAL_HOST_SYNC=1 when the world is
 * made) take the host path: each rank synchronizes its stream before
 * arrival and after its copies.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/call.h"
#include "comm/comm.h"
#include "core/context.h"

/* Ranks of one in-process world; each needs a thread of its own. */
#define LOCAL_MAX_RANKS 4096

/* Elements widened and reduced per step: a quarter of the block (at least
 * 4096), so the staging beyond the full-size accumulator stays a fraction of
 * it while a device reduction takes a few large steps, not thousands of
 * small launches (a reduce-scatter of 16M elements a rank took 3k launches
 * per peer in steps of 64k). */
#define REDUCE_MIN_CHUNK ((size_t)4096)
#define REDUCE_PIECES 4

typedef struct world world;

struct world {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC */
    int size;
    int alive;          /* communicators not yet destroyed */
    int arrived;        /* at the current rendezvous */
    uint64_t gen;       /* rendezvous completed so far */
    cp_status broken;   /* CP_SUCCESS while usable */
    char why[256];      /* what broke it */
    /* one entry per rank */
    uint64_t *waiting;  /* gen + 1 while the rank waits in rendezvous gen */
    cpi_call *calls;    /* the call each rank entered */
    const void **sends; /* its send buffer */
    ptrdiff_t *steps;   /* all_to_all_2d: its send blocks' spacing */
    size_t *pitches;    /* all_to_all_2d: its send rows' spacing */
    int32_t *done;      /* its status at departure */
    world **made;       /* split: the new world its members share */
    /* stream order: per rank, the backend it queues on (NULL = host path)
     * and its events marking the send buffer ready and its reads done */
    const cp_backend_ops **ops;
    void **ready, **copied;
    bool host_sync;     /* INFINICP_LOCAL_HOST_SYNC=1: never stream order */
};

typedef struct local_comm {
    world *w;
    int rank;
    int32_t kind; /* the call in progress, for messages */
    /* the call in progress, in stream order: its backend and own events */
    const cp_xfer *ordered;
    void *ready, *copied;
    /* the peer's CPI_CALL_REJECT that failed the last call (kind 0: none) */
    cpi_call rejected;
} local_comm;

static void world_free_arrays(world *w)
{
    free(w->waiting);
    free(w->calls);
    free(w->sends);
    free(w->steps);
    free(w->pitches);
    free(w->done);
    free(w->made);
    free(w->ops);
    free(w->ready);
    free(w->copied);
    free(w);
}

static void world_free(world *w)
{
    if (!w)
        return;
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    world_free_arrays(w);
}

static bool init_sync(world *w)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return false;
    bool ok = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&w->cv, &attr) == 0;
    pthread_condattr_destroy(&attr);
    if (ok && pthread_mutex_init(&w->mu, NULL) != 0) {
        pthread_cond_destroy(&w->cv);
        ok = false;
    }
    return ok;
}

static world *world_create(int size, int alive)
{
    world *w = cpi_calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->size = size;
    w->alive = alive;
    w->waiting = cpi_calloc((size_t)size, sizeof *w->waiting);
    w->calls = cpi_calloc((size_t)size, sizeof *w->calls);
    w->sends = cpi_calloc((size_t)size, sizeof *w->sends);
    w->steps = cpi_calloc((size_t)size, sizeof *w->steps);
    w->pitches = cpi_calloc((size_t)size, sizeof *w->pitches);
    w->done = cpi_calloc((size_t)size, sizeof *w->done);
    w->made = cpi_calloc((size_t)size, sizeof *w->made);
    w->ops = cpi_calloc((size_t)size, sizeof *w->ops);
    w->ready = cpi_calloc((size_t)size, sizeof *w->ready);
    w->copied = cpi_calloc((size_t)size, sizeof *w->copied);
    const char *env = getenv("INFINICP_LOCAL_HOST_SYNC");
    w->host_sync = env && !strcmp(env, "1");
    if (!w->waiting || !w->calls || !w->sends || !w->steps || !w->pitches || !w->done || !w->made || !w->ops ||
        !w->ready || !w->copied || !init_sync(w)) {
        world_free_arrays(w);
        cpi_error(CP_ERROR_OUT_OF_MEMORY, "local transport: cannot create a world of %d ranks", size);
        return NULL;
    }
    return w;
}

static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* With the lock held: mark the world unusable and wake every waiter. */
static void world_break(world *w, cp_status s, const char *why)
{
    if (w->broken != CP_SUCCESS)
        return;
    w->broken = s;
    snprintf(w->why, sizeof w->why, "%s", why);
    pthread_cond_broadcast(&w->cv);
}

/* With the lock held: "rank 3" or "ranks 3, 5" for those not waiting in gen. */
static void list_missing(const world *w, char *buf, size_t cap)
{
    int n = 0;
    size_t used = 0;
    for (int j = 0; j < w->size && used < cap; j++) {
        if (w->waiting[j] == w->gen + 1)
            continue;
        int k = snprintf(buf + used, cap - used, "%s%d", n ? ", " : "", j);
        used += k > 0 ? (size_t)k : 0;
        n++;
    }
    if (n == 0)
        snprintf(buf, cap, "(none)");
}

/* Wait until every rank of the world has arrived here; timeout_ms <= 0 waits
 * as long as it takes. */
static cp_status rendezvous(local_comm *c, int timeout_ms)
{
    world *w = c->w;
    struct timespec deadline;
    if (timeout_ms > 0)
        deadline_after(&deadline, timeout_ms);
    pthread_mutex_lock(&w->mu);
    uint64_t gen = w->gen;
    if (w->broken == CP_SUCCESS) {
        w->waiting[c->rank] = gen + 1;
        if (++w->arrived == w->size) {
            w->arrived = 0;
            w->gen++;
            pthread_cond_broadcast(&w->cv);
        }
    }
    /* A completed rendezvous counts even if the world broke right after. */
    while (w->gen == gen && w->broken == CP_SUCCESS) {
        int rc = timeout_ms > 0 ? pthread_cond_timedwait(&w->cv, &w->mu, &deadline)
                                : pthread_cond_wait(&w->cv, &w->mu);
        if (rc == ETIMEDOUT && w->gen == gen && w->broken == CP_SUCCESS) {
            char missing[128], why[256];
            list_missing(w, missing, sizeof missing);
            snprintf(why, sizeof why, "%s timed out after %d ms on rank %d of %d waiting for rank(s) %s",
                     cpi_call_name(c->kind), timeout_ms, c->rank, w->size, missing);
            world_break(w, CP_ERROR_TIMEOUT, why);
        }
    }
    cp_status s = w->gen != gen ? CP_SUCCESS : w->broken;
    char why[256];
    memcpy(why, w->why, sizeof why);
    pthread_mutex_unlock(&w->mu);
    if (s != CP_SUCCESS)
        return cpi_error(s, "local %s: %s", cpi_call_name(c->kind), why);
    return CP_SUCCESS;
}

/* ---- stream order ------------------------------------------------------ */

/* Can this call's buffers be exchanged in stream order? */
static const cp_xfer *stream_ordered(const world *w, const cp_xfer *x)
{
    if (!x || w->host_sync)
        return NULL;
    const cp_backend_ops *b = x->backend;
    bool events = CP_BACKEND_HAS(b, event_create) && CP_BACKEND_HAS(b, event_destroy) &&
                  CP_BACKEND_HAS(b, event_record) && CP_BACKEND_HAS(b, event_wait);
    return b->device != CP_DEVICE_CPU && events ? x : NULL;
}

/* An event after the work queued so far on the call's stream. */
static cp_status mark(const cp_xfer *x, void **ev)
{
    CPI_TRY(x->backend->event_create(x->backend_state, ev));
    cp_status s = x->backend->event_record(x->backend_state, *ev);
    if (s != CP_SUCCESS) {
        x->backend->event_destroy(x->backend_state, *ev);
        *ev = NULL;
    }
    return s;
}

static void drop_events(local_comm *c)
{
    if (c->ordered) {
        c->ordered->backend->event_destroy(c->ordered->backend_state, c->ready);
        c->ordered->backend->event_destroy(c->ordered->backend_state, c->copied);
    }
    c->ready = c->copied = NULL;
    c->ordered = NULL;
}

/* Before reading rank j's send buffer: in stream order, wait for it. */
static cp_status reading(local_comm *c, int j)
{
    if (!c->ordered || j == c->rank)
        return CP_SUCCESS;
    return c->ordered->backend->event_wait(c->ordered->backend_state, c->w->ready[j]);
}

/* After departure: make this rank's stream wait for the reads of its buffer
 * by the ranks that made them - also when the call failed, since a reader
 * that failed half-way may have queued some of its copies. */
static cp_status after_readers(local_comm *c)
{
    const world *w = c->w;
    for (int j = 0; j < w->size; j++) {
        if (j == c->rank)
            continue;
        /* a sendrecv is read only by the rank whose source this rank is;
         * every other collective by everyone */
        if ((w->calls[j].kind == CPI_CALL_SENDRECV && w->calls[j].b != c->rank) || !w->copied[j])
            continue;
        CPI_TRY(c->ordered->backend->event_wait(c->ordered->backend_state, w->copied[j]));
    }
    return CP_SUCCESS;
}

/* Do all ranks queue this call alike: all on the host path, or all in
 * stream order on one backend? */
static bool same_order(const world *w, char *why, size_t cap)
{
    for (int j = 1; j < w->size; j++)
        if (w->ops[j] != w->ops[0]) {
            snprintf(why, cap, "rank 0 %s, rank %d %s (device buffers of every rank must be on one backend)",
                     w->ops[0] ? "queues on a device backend" : "uses host synchronization", j,
                     !w->ops[j] ? "uses host synchronization"
                     : w->ops[0] ? "queues on another device backend" : "queues on a device backend");
            return false;
        }
    return true;
}

/* ---- arrival and departure ---------------------------------------------- */

/* Departure: post this rank's status, wait for all, and fail on every rank
 * if any rank failed (each failing rank keeps its own message). */
static cp_status leave(local_comm *c, const cp_xfer *x, cp_status s)
{
    world *w = c->w;
    /* My reads of peers' buffers must be complete before they may reuse
     * them: on the host path now, in stream order for whoever reuses. Also
     * after a failure: some copies may be queued already. */
    if (x) {
        cp_status t = c->ordered ? mark(x, &c->copied) : x->backend->synchronize(x->backend_state);
        if (t != CP_SUCCESS && c->ordered)
            (void)x->backend->synchronize(x->backend_state); /* no event: finish the reads here */
        if (s == CP_SUCCESS)
            s = t;
    }
    w->done[c->rank] = (int32_t)s;
    w->copied[c->rank] = c->copied;
    cp_status r = rendezvous(c, 0);
    cp_status agg = CP_SUCCESS;
    int failed = -1;
    for (int j = 0; j < w->size && r == CP_SUCCESS && failed < 0; j++)
        if (w->done[j] != CP_SUCCESS)
            failed = j;
    if (c->ordered) {
        if (r == CP_SUCCESS)
            agg = after_readers(c);
        /* every peer has waited on my events once all are here again */
        cp_status t = rendezvous(c, 0);
        if (r == CP_SUCCESS)
            r = t;
        drop_events(c);
    }
    if (s != CP_SUCCESS)
        return s;
    if (r != CP_SUCCESS)
        return r;
    if (failed >= 0)
        return cpi_error(CP_ERROR_COMM, "local %s: rank %d failed during the exchange (%s)",
                         cpi_call_name(c->kind), failed, cp_status_string((cp_status)w->done[failed]));
    return agg;
}

/* Arrival: post this rank's call, wait for all, compare. On any failure
 * but a failed rendezvous, every rank has already departed together.
 * @p order: the call may go in stream order (its buffers are device
 * buffers read by peers; not for barriers and host-only calls). */
static cp_status enter(local_comm *c, const cp_xfer *x, cpi_call call, const void *send, int timeout_ms, bool order)
{
    world *w = c->w;
    c->kind = call.kind;
    c->rejected = (cpi_call){ 0 };
    c->ordered = order ? stream_ordered(w, x) : NULL;
    c->ready = c->copied = NULL;
    /* Peers read send as soon as all have arrived: work queued on this
     * rank's stream must have produced it by then (on the host path), or
     * their streams wait for it (in stream order). */
    if (call.status == CP_SUCCESS && x)
        call.status = (int32_t)(c->ordered ? mark(x, &c->ready) : x->backend->synchronize(x->backend_state));
    w->calls[c->rank] = call;
    w->sends[c->rank] = send;
    w->ops[c->rank] = c->ordered ? c->ordered->backend : NULL;
    w->ready[c->rank] = c->ready;
    cp_status s = rendezvous(c, timeout_ms);
    if (s != CP_SUCCESS) {
        drop_events(c); /* the world is broken: nobody waits on them */
        return s;
    }

    char why[256];
    int f = cpi_call_failed_rank(w->calls, w->size), r = cpi_call_rejecting_rank(w->calls, w->size);
    if (r >= 0 && r != c->rank)
        c->rejected = w->calls[r];
    if (call.status != CP_SUCCESS)
        s = (cp_status)call.status; /* the message is this thread's already */
    else if (r >= 0) /* the caller's agreement (agree.c) words what the peer said */
        s = cpi_error(CP_ERROR_COMM, "local %s: rank %d of %d failed before the call's first exchange (%s)",
                      cpi_call_name(call.kind), w->calls[r].a, w->calls[r].b,
                      cp_status_string((cp_status)w->calls[r].status));
    else if (f >= 0)
        s = cpi_error(CP_ERROR_COMM, "local %s: rank %d failed before the exchange (%s)",
                      cpi_call_name(call.kind), f, cp_status_string((cp_status)w->calls[f].status));
    else if (!cpi_call_agree(w->calls, w->size, why, sizeof why))
        s = cpi_error(CP_ERROR_MISMATCH, "local transport, rank %d: %s", c->rank, why);
    else if (!same_order(w, why, sizeof why))
        s = cpi_error(CP_ERROR_MISMATCH, "local %s, rank %d: %s", cpi_call_name(call.kind), c->rank, why);
    if (s != CP_SUCCESS) {
        /* Everyone failed alike; depart together so no slot is reused early
         * (and no peer waits on this rank's event any more). */
        w->done[c->rank] = (int32_t)s;
        rendezvous(c, 0);
        drop_events(c);
    }
    return s;
}

/* A copy between two buffers on (or reachable from) this rank's device. */
static cp_status copy_rows(const cp_xfer *x, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t rows)
{
    if (!width || !rows || (dst == src && dpitch == spitch))
        return CP_SUCCESS;
    cp_copy_kind kind = x->backend->device == CP_DEVICE_CPU ? CP_COPY_HOST_TO_HOST : CP_COPY_DEVICE_TO_DEVICE;
    return x->backend->copy_2d(x->backend_state, dst, dpitch, src, spitch, width, rows, kind);
}

static cp_status copy(const cp_xfer *x, void *dst, const void *src, size_t bytes)
{
    return copy_rows(x, dst, bytes, src, bytes, bytes, 1);
}

/* ---- the collectives ---------------------------------------------------- */

static cp_status local_all_gather(void *impl, const cp_xfer *xin, const void *send, void *recv, size_t bytes)
{
    local_comm *c = impl;
    cp_xfer x = cpi_xfer_resolve(xin);
    CPI_TRY(enter(c, &x, cpi_call_make(CPI_CALL_ALL_GATHER, bytes, -1, -1), send, x.timeout_ms, true));
    cp_status s = CP_SUCCESS;
    for (int j = 0; j < c->w->size && s == CP_SUCCESS; j++)
        if ((s = reading(c, j)) == CP_SUCCESS)
            s = copy(&x, (char *)recv + (size_t)j * bytes, c->w->sends[j], bytes);
    return leave(c, &x, s);
}

static cp_status local_all_to_all(void *impl, const cp_xfer *xin, const void *send, void *recv, size_t bytes)
{
    local_comm *c = impl;
    cp_xfer x = cpi_xfer_resolve(xin);
    CPI_TRY(enter(c, &x, cpi_call_make(CPI_CALL_ALL_TO_ALL, bytes, -1, -1), send, x.timeout_ms, true));
    cp_status s = CP_SUCCESS;
    for (int j = 0; j < c->w->size && s == CP_SUCCESS; j++)
        if ((s = reading(c, j)) == CP_SUCCESS)
            s = copy(&x, (char *)recv + (size_t)j * bytes, (const char *)c->w->sends[j] + (size_t)c->rank * bytes,
                 bytes);
    return leave(c, &x, s);
}

/* Each rank reads its block of every peer's send in place, with the
 * sender's step and pitch (posted beside its send pointer). */
static cp_status local_all_to_all_2d(void *impl, const cp_xfer *xin, const void *send, ptrdiff_t send_step,
                                     size_t send_pitch, void *recv, ptrdiff_t recv_step, size_t recv_pitch,
                                     size_t width, size_t rows)
{
    local_comm *c = impl;
    cp_xfer x = cpi_xfer_resolve(xin);
    cpi_call call = cpi_call_make(CPI_CALL_ALL_TO_ALL_2D, width, -1, -1);
    call.recv = rows;
    /* Peers read these only between this rank's arrival and departure, like
     * its send pointer. */
    c->w->steps[c->rank] = send_step;
    c->w->pitches[c->rank] = send_pitch;
    CPI_TRY(enter(c, &x, call, send, x.timeout_ms, true));
    cp_status s = CP_SUCCESS;
    for (int j = 0; j < c->w->size && s == CP_SUCCESS && width && rows; j++)
        if ((s = reading(c, j)) == CP_SUCCESS)
            s = copy_rows(&x, (char *)recv + (ptrdiff_t)j * recv_step, recv_pitch,
                          (const char *)c->w->sends[j] + (ptrdiff_t)c->rank * c->w->steps[j], c->w->pitches[j], width,
                          rows);
    return leave(c, &x, s);
}

static cp_status local_sendrecv(void *impl, const cp_xfer *xin, const void *send, size_t send_bytes, int dst,
                                void *recv, size_t recv_bytes, int src)
{
    local_comm *c = impl;
    cp_xfer x = cpi_xfer_resolve(xin);
    cpi_call call = cpi_call_make(CPI_CALL_SENDRECV, send_bytes, -1, -1);
    call.a = dst;
    call.b = src;
    call.recv = recv_bytes;
    CPI_TRY(enter(c, &x, call, send, x.timeout_ms, true));
    cp_status s = reading(c, src);
    if (s == CP_SUCCESS)
        s = copy(&x, recv, c->w->sends[src], recv_bytes);
    return leave(c, &x, s);
}

static cp_status local_barrier(void *impl, const cp_xfer *xin)
{
    local_comm *c = impl;
    cp_xfer x = cpi_xfer_resolve(xin);
    CPI_TRY(enter(c, &x, cpi_call_make(CPI_CALL_BARRIER, 0, -1, -1), NULL, x.timeout_ms, false));
    return leave(c, &x, CP_SUCCESS);
}

/*
 * Reductions accumulate in a buffer of their own on this rank's device:
 * F32 for F16/BF16 inputs (so a sum over any number of ranks is rounded to
 * the storage type once), the input type otherwise - or, when nothing is
 * widened and recv is apart from this rank's send, in recv itself. Peers'
 * blocks are first copied to this device, so kernels only touch local
 * memory.
 *
 * The staging comes from the caller's scratch where it fits
 * (cpi_reduce_scatter_ws, with cpi_reduce_scratch_bytes: the plans pass
 * their workspace), and then nothing is allocated or freed and the host
 * never waits, as for every other collective. Otherwise it is allocated
 * here, and freed after a host wait, since queued work still uses it.
 */
typedef struct stage {
    cp_dtype dtype, wide; /* storage and accumulation types */
    size_t count, chunk;
    void *acc;            /* count elements of wide (recv itself when it may be) */
    void *raw;            /* chunk elements of dtype: a peer's block */
    void *widened;        /* chunk elements of wide (only when wide != dtype) */
    bool owned;           /* acc (unless recv), raw and widened allocated here */
    bool in_recv;         /* acc is recv: nothing to store at the end */
} stage;

/* Staging bytes are carved in pieces aligned to 256 bytes. */
static size_t stage_piece(size_t bytes)
{
    return (bytes + 255) & ~(size_t)255;
}

static void stage_shape(size_t count, cp_dtype dtype, stage *st)
{
    st->dtype = dtype;
    st->wide = dtype == CP_DTYPE_F16 || dtype == CP_DTYPE_BF16 ? CP_DTYPE_F32 : dtype;
    st->count = count;
    st->chunk = (count + REDUCE_PIECES - 1) / REDUCE_PIECES;
    if (st->chunk < REDUCE_MIN_CHUNK)
        st->chunk = count < REDUCE_MIN_CHUNK ? count : REDUCE_MIN_CHUNK;
}

/* Bytes of staging for st's shape (its acc too unless in_recv); 0 on
 * overflow, which the caller's own check reports. */
static size_t stage_bytes(const stage *st, bool in_recv)
{
    size_t esize = cpi_dtype_size(st->dtype), wsize = cpi_dtype_size(st->wide), acc = 0, raw, wid = 0;
    if ((!in_recv && !cpi_mul(st->count, wsize, &acc)) || !cpi_mul(st->chunk, esize, &raw) ||
        (st->wide != st->dtype && !cpi_mul(st->chunk, wsize, &wid)))
        return 0;
    if (acc > SIZE_MAX / 4 || raw > SIZE_MAX / 4 || wid > SIZE_MAX / 4)
        return 0;
    return stage_piece(acc) + stage_piece(raw) + stage_piece(wid);
}

size_t cpi_reduce_scratch_bytes(size_t count, cp_dtype dtype, bool recv_apart)
{
    stage st;
    stage_shape(count, dtype, &st);
    return stage_bytes(&st, recv_apart && st.wide == dtype);
}

static void stage_free(const cp_xfer *x, stage *st)
{
    const cp_backend_ops *b = x->backend;
    if (!st->owned)
        return;
    if (st->acc || st->raw || st->widened)
        b->synchronize(x->backend_state); /* queued work may still use them */
    if (st->acc && !st->in_recv)
        b->free(x->backend_state, st->acc);
    if (st->raw)
        b->free(x->backend_state, st->raw);
    if (st->widened)
        b->free(x->backend_state, st->widened);
}

/* in_recv: recv may hold the sums (it is apart from this rank's send). */
static cp_status stage_alloc(const cp_xfer *x, size_t count, cp_dtype dtype, void *recv, bool recv_apart,
                             void *scratch, size_t scratch_bytes, stage *st)
{
    const cp_backend_ops *b = x->backend;
    stage_shape(count, dtype, st);
    st->in_recv = recv_apart && st->wide == dtype;
    size_t esize = cpi_dtype_size(dtype), wsize = cpi_dtype_size(st->wide), acc_bytes;
    if (!cpi_mul(count, wsize, &acc_bytes))
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "local reduction: count = %zu overflows", count);
    const size_t need = stage_bytes(st, st->in_recv);
    if (scratch && need && need <= scratch_bytes) {
        char *p = scratch;
        st->acc = st->in_recv ? recv : p;
        p += st->in_recv ? 0 : stage_piece(acc_bytes);
        st->raw = p;
        p += stage_piece(st->chunk * esize);
        st->widened = st->wide != dtype ? p : NULL;
        return CP_SUCCESS;
    }
    st->owned = true;
    if (st->in_recv)
        st->acc = recv;
    else
        CPI_TRY(b->alloc(x->backend_state, acc_bytes, &st->acc));
    CPI_TRY(b->alloc(x->backend_state, st->chunk * esize, &st->raw));
    if (st->wide != dtype)
        CPI_TRY(b->alloc(x->backend_state, st->chunk * wsize, &st->widened));
    return CP_SUCCESS;
}

/* acc = op over ranks j of elements [first, first + count) of send_j. */
static cp_status stage_reduce(local_comm *c, const cp_xfer *x, stage *st, size_t first, cp_reduce_op op)
{
    const cp_backend_ops *b = x->backend;
    void *bs = x->backend_state;
    size_t esize = cpi_dtype_size(st->dtype), wsize = cpi_dtype_size(st->wide);
    bool widen = st->wide != st->dtype;
    for (int j = 0; j < c->w->size; j++)
        CPI_TRY(reading(c, j));
    for (size_t i = 0; i < st->count; i += st->chunk) {
        size_t m = st->count - i < st->chunk ? st->count - i : st->chunk;
        char *acc = (char *)st->acc + i * wsize;
        for (int j = 0; j < c->w->size; j++) {
            const char *src = (const char *)c->w->sends[j] + (first + i) * esize;
            /* The first block initialises the accumulator, later ones add in. */
            void *into = j == 0 ? (void *)acc : widen ? st->widened : st->raw;
            if (widen) {
                CPI_TRY(copy(x, st->raw, src, m * esize));
                CPI_TRY(b->convert(bs, into, st->wide, st->raw, st->dtype, m));
            } else {
                CPI_TRY(copy(x, into, src, m * esize));
            }
            if (j > 0)
                CPI_TRY(b->reduce(bs, acc, into, st->wide, m, op));
        }
    }
    return CP_SUCCESS;
}

static cp_status stage_store(const cp_xfer *x, const stage *st, void *recv)
{
    if (st->in_recv)
        return CP_SUCCESS;
    if (st->wide != st->dtype)
        return x->backend->convert(x->backend_state, recv, st->dtype, st->acc, st->wide, st->count);
    return copy(x, recv, st->acc, st->count * cpi_dtype_size(st->dtype));
}

static cp_status local_reduce(local_comm *c, const cp_xfer *xin, cpi_call_kind kind, const void *send,
                              void *recv, size_t count, cp_dtype dtype, cp_reduce_op op, void *scratch,
                              size_t scratch_bytes)
{
    cp_xfer x = cpi_xfer_resolve(xin);
    stage st = { 0 };
    cpi_call call = cpi_call_make(kind, count, (int)dtype, (int)op);
    /* the caller has checked that these products do not overflow */
    const size_t esize = cpi_dtype_size(dtype);
    const size_t send_bytes = count * esize * (kind == CPI_CALL_REDUCE_SCATTER ? (size_t)c->w->size : 1);
    const bool apart = !cpi_overlap(send, send_bytes, recv, count * esize);
    call.status = (int32_t)stage_alloc(&x, count, dtype, recv, apart, scratch, scratch_bytes, &st);
    cp_status s = enter(c, &x, call, send, x.timeout_ms, true);
    if (s == CP_SUCCESS) {
        size_t first = kind == CPI_CALL_REDUCE_SCATTER ? (size_t)c->rank * count : 0;
        s = leave(c, &x, stage_reduce(c, &x, &st, first, op));
        /* Now no peer reads send any more, so recv may alias it. */
        if (s == CP_SUCCESS)
            s = stage_store(&x, &st, recv);
    }
    stage_free(&x, &st);
    return s;
}

static cp_status local_all_reduce(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                                  cp_dtype dtype, cp_reduce_op op)
{
    return local_reduce(impl, x, CPI_CALL_ALL_REDUCE, send, recv, count, dtype, op, NULL, 0);
}

static cp_status local_reduce_scatter(void *impl, const cp_xfer *x, const void *send, void *recv,
                                      size_t count, cp_dtype dtype, cp_reduce_op op)
{
    return local_reduce(impl, x, CPI_CALL_REDUCE_SCATTER, send, recv, count, dtype, op, NULL, 0);
}

static cp_status local_reduce_scatter_ws(void *impl, const cp_xfer *x, const void *send, void *recv,
                                         size_t count, cp_dtype dtype, cp_reduce_op op, void *scratch,
                                         size_t scratch_bytes)
{
    return local_reduce(impl, x, CPI_CALL_REDUCE_SCATTER, send, recv, count, dtype, op, scratch, scratch_bytes);
}

/* ---- agreement ---------------------------------------------------------- */

static cp_status local_reject(void *impl, int timeout_ms, cp_status s, int origin, int size)
{
    cpi_call call = cpi_call_make(CPI_CALL_REJECT, 0, -1, -1);
    call.status = (int32_t)s;
    call.a = origin;
    call.b = size;
    return enter(impl, NULL, call, NULL, timeout_ms, false);
}

static bool local_rejected(const void *impl, int *origin, cp_status *s)
{
    const local_comm *c = impl;
    if (c->rejected.kind != CPI_CALL_REJECT)
        return false;
    *origin = c->rejected.a;
    *s = (cp_status)c->rejected.status;
    return true;
}

/* ---- split and lifetime ------------------------------------------------- */

/* Does rank j (key kj) come before rank i (key ki) in the new communicator? */
static bool precedes(int kj, int j, int ki, int i)
{
    return kj < ki || (kj == ki && j < i);
}

/*
 * Each color's first member (new rank 0) creates the new world and posts it;
 * the others pick it up after departure. Any failure on any rank fails the
 * split everywhere and the new worlds are freed by their creators.
 */
static cp_status local_split(void *impl, int color, int key, int timeout_ms, void **out_impl, int *out_rank,
                             int *out_size)
{
    local_comm *c = impl, *nc = NULL;
    world *w = c->w;
    cpi_call call = cpi_call_make(CPI_CALL_SPLIT, 0, -1, -1);
    call.a = color < 0 ? -1 : color;
    call.b = key;
    if (color >= 0 && !(nc = cpi_calloc(1, sizeof *nc)))
        call.status = CP_ERROR_OUT_OF_MEMORY;
    cp_status s = enter(c, NULL, call, NULL, timeout_ms, false);
    if (s != CP_SUCCESS) {
        free(nc);
        return s;
    }

    int rank = 0, size = 0, first = -1;
    for (int j = 0; j < w->size && color >= 0; j++) {
        if (w->calls[j].a != color)
            continue;
        size++;
        if (precedes(w->calls[j].b, j, key, c->rank))
            rank++;
        if (first < 0 || precedes(w->calls[j].b, j, w->calls[first].b, first))
            first = j;
    }
    cp_status mine = CP_SUCCESS;
    if (color >= 0 && rank == 0) {
        w->made[c->rank] = world_create(size, size);
        if (!w->made[c->rank])
            mine = CP_ERROR_OUT_OF_MEMORY;
    }
    s = leave(c, NULL, mine);
    if (s != CP_SUCCESS) {
        if (color >= 0 && rank == 0)
            world_free(w->made[c->rank]);
        free(nc);
        return s;
    }
    if (nc) {
        nc->w = w->made[first];
        nc->rank = rank;
    }
    *out_impl = nc;
    *out_rank = nc ? rank : -1;
    *out_size = nc ? size : 0;
    return CP_SUCCESS;
}

/* Each rank destroys its own communicator; the world goes with the last.
 * Peers still waiting for this rank are woken with CP_ERROR_COMM. */
static void local_destroy(void *impl)
{
    local_comm *c = impl;
    world *w = c->w;
    pthread_mutex_lock(&w->mu);
    int left = --w->alive;
    if (left > 0) {
        char why[64];
        snprintf(why, sizeof why, "rank %d destroyed its communicator", c->rank);
        world_break(w, CP_ERROR_COMM, why);
    }
    pthread_mutex_unlock(&w->mu);
    if (left == 0)
        world_free(w);
    free(c);
}

static const cp_transport_ops local_transport = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_transport_ops),
    .name = "local",
    .all_gather = local_all_gather,
    .reduce_scatter = local_reduce_scatter,
    .all_to_all = local_all_to_all,
    .sendrecv = local_sendrecv,
    .all_reduce = local_all_reduce,
    .barrier = local_barrier,
    .split = local_split,
    .destroy = local_destroy,
    .all_to_all_2d = local_all_to_all_2d,
};

/* Every call's descriptor reaches every rank before any byte moves, so the
 * agreement's verdict can ride it (agree.h). */
static const cpi_transport_caps local_caps = {
    .reject = local_reject,
    .rejected = local_rejected,
    .reduce_scatter_ws = local_reduce_scatter_ws,
};

CP_EXPORT cp_status cp_comm_create_local(int nranks, cp_comm **comms)
{
    CPI_CHECK_PTR(comms);
    CPI_CHECK(nranks >= 1 && nranks <= LOCAL_MAX_RANKS, "%s: nranks = %d (must be in [1, %d])", __func__,
              nranks, LOCAL_MAX_RANKS);
    for (int i = 0; i < nranks; i++)
        comms[i] = NULL;
    world *w = world_create(nranks, 0);
    if (!w)
        return CP_ERROR_OUT_OF_MEMORY;
    /* Each rank's communicator keeps the world alive; on failure, destroying
     * those made so far frees it with the last. */
    cp_status s = CP_SUCCESS;
    int i = 0;
    for (; i < nranks; i++) {
        local_comm *lc = cpi_calloc(1, sizeof *lc);
        if (!lc) {
            s = CP_ERROR_OUT_OF_MEMORY;
            if (w->alive == 0)
                world_free(w);
            break;
        }
        lc->w = w;
        lc->rank = i;
        w->alive++;
        s = cpi_comm_wrap_caps(&local_transport, &local_caps, lc, i, nranks, &comms[i]);
        if (s != CP_SUCCESS) {
            local_destroy(lc);
            break;
        }
    }
    if (s == CP_SUCCESS)
        return CP_SUCCESS;
    for (int j = 0; j < i; j++) {
        cp_comm_destroy(comms[j]);
        comms[j] = NULL;
    }
    return s;
}
