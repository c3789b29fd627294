/* SPDX-License-Identifier: MIT */
/*
 * The p2p ring (DESIGN.md section 3) over p->ring_comm, R members. Member m
 * holds the queries of token set p->sub[m]; at step s it holds the keys and
 * values of member (m - s) mod R, attends to them, and passes them to m + 1
 * while receiving the next from m - 1 (double buffer). Backward: the fp32
 * dK/dV accumulator of each key block travels with it and arrives home after
 * R hops; dQ accumulates locally. The caller's dK/dV accumulators are one
 * half of that double buffer (only the other half is workspace): the ring
 * starts in whichever half makes the last hop land in the caller's.
 *
 * Overlap, on backends with streams and events: the transfers run on a comm
 * stream and the attention on a compute stream, ordered by events only, so
 * step s+1's keys and values travel while step s computes, and the host never
 * waits inside the ring. One compute stream is enough: the kernel merges
 * each block into the running result itself (accumulate mode), so the blocks
 * of a row are a chain whatever stream runs them. Backends without streams
 * run the same steps in order.
 */
#include <stdlib.h>
#include <string.h>

#include "attn/plan.h"

typedef struct ring_bufs {
    cpi_tensor k[2], v[2]; /* circulating K, V (storage type) */
    cpi_tensor dk, dv;     /* backward: the half of the fp32 accumulators' double buffer that is not the caller's */
    void *scratch;
    size_t scratch_bytes;
} ring_bufs;

static cp_status take_bufs(cp_attn_plan *p, const cpi_tensor *k, const cpi_tensor *v, int backward,
                           cpi_arena *ws, ring_bufs *b)
{
    if (p->R > 1) {
        for (int i = 0; i < 2; i++) {
            b->k[i] = cpi_tensor_take(p, ws, k->ntok, k->heads, k->dim, k->dtype);
            b->v[i] = cpi_tensor_take(p, ws, v->ntok, v->heads, v->dim, v->dtype);
        }
        if (backward) {
            b->dk = cpi_tensor_take(p, ws, k->ntok, k->heads, k->dim, CP_DTYPE_F32);
            b->dv = cpi_tensor_take(p, ws, v->ntok, v->heads, v->dim, CP_DTYPE_F32);
        }
    }
    CPI_TRY(cpi_attend_scratch(p, p->max_rows, p->max_rows, p->heads.hq, p->heads.hkv, backward, &b->scratch_bytes));
    b->scratch = cpi_arena_take(ws, b->scratch_bytes);
    return CP_SUCCESS;
}

/* Streams and events of the overlap; every call is a no-op on a backend
 * without them. */
enum { STREAM_MAIN = 0, STREAM_COMM = 1, STREAM_COMPUTE = 2 };

typedef struct ring_streams {
    const cp_backend_ops *ops;
    void *st;
    int on;
    void **ev; /* every event created, destroyed at the end */
    int nev, cap;
} ring_streams;

static cp_status rs_select(ring_streams *rs, int stream)
{
    return rs->on ? rs->ops->stream_select(rs->st, stream) : CP_SUCCESS;
}

/* An event marking the current end of the current stream (NULL when off). */
static cp_status rs_mark(ring_streams *rs, void **ev)
{
    *ev = NULL;
    if (!rs->on)
        return CP_SUCCESS;
    if (rs->nev == rs->cap)
        return cpi_error(CP_ERROR_INTERNAL, "ring: more events than planned (%d)", rs->cap);
    CPI_TRY(rs->ops->event_create(rs->st, ev));
    rs->ev[rs->nev++] = *ev;
    return rs->ops->event_record(rs->st, *ev);
}

static cp_status rs_wait(ring_streams *rs, void *ev)
{
    return rs->on && ev ? rs->ops->event_wait(rs->st, ev) : CP_SUCCESS;
}

/* Start: the comm and compute streams wait for what stream 0 holds. */
static cp_status rs_begin(cp_attn_plan *p, ring_streams *rs, int events)
{
    const cp_backend_ops *o = p->ctx->ops;
    *rs = (ring_streams){ o, p->ctx->state, 0, NULL, 0, 0 };
    rs->on = p->R > 1 && CP_BACKEND_HAS(o, stream_select) && CP_BACKEND_HAS(o, event_create) &&
             CP_BACKEND_HAS(o, event_destroy) && CP_BACKEND_HAS(o, event_record) && CP_BACKEND_HAS(o, event_wait);
    if (!rs->on)
        return CP_SUCCESS;
    rs->cap = events + 1;
    rs->ev = cpi_calloc((size_t)rs->cap, sizeof *rs->ev);
    if (!rs->ev)
        return CP_ERROR_OUT_OF_MEMORY;
    void *start;
    CPI_TRY(rs_mark(rs, &start));
    for (int sidx = STREAM_COMM; sidx <= STREAM_COMPUTE; sidx++) {
        CPI_TRY(rs_select(rs, sidx));
        CPI_TRY(rs_wait(rs, start));
    }
    return CP_SUCCESS;
}

/* End (also after a failure): stream 0 waits for the last work of the
 * others and is current again; the events go. */
static cp_status rs_end(ring_streams *rs, cp_status s)
{
    if (!rs->on)
        return s;
    void *last[2] = { NULL, NULL };
    for (int i = 0; i < 2 && s == CP_SUCCESS; i++) {
        s = rs_select(rs, i ? STREAM_COMPUTE : STREAM_COMM);
        if (s == CP_SUCCESS)
            s = rs_mark(rs, &last[i]);
    }
    cp_status t = rs_select(rs, STREAM_MAIN);
    for (int i = 0; i < 2 && s == CP_SUCCESS; i++)
        s = rs_wait(rs, last[i]);
    for (int i = 0; i < rs->nev; i++)
        rs->ops->event_destroy(rs->st, rs->ev[i]);
    free(rs->ev);
    return s != CP_SUCCESS ? s : t;
}

static int ring_rank(const cp_attn_plan *p)
{
    return p->ring_rank;
}

/* Pass `t` to the next member and receive the previous member's into `into`. */
static cp_status shift(cp_attn_plan *p, const cpi_tensor *t, const cpi_tensor *into)
{
    const int m = ring_rank(p), R = p->R;
    cp_xfer x = cpi_group_xfer(p->g);
    size_t bytes = cpi_tensor_bytes(p, t);
    return cpi_sendrecv(p->ring_comm, &x, t->p, bytes, (m + 1) % R, into->p, bytes, (m + R - 1) % R);
}

cp_status cpi_ring_forward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                           const cpi_tensor *o32, const cpi_lse *lse, cpi_arena *ws)
{
    ring_bufs b = { 0 };
    CPI_TRY(take_bufs(p, k, v, 0, ws, &b));
    if (ws->measuring)
        return CP_SUCCESS;

    const int m = ring_rank(p), R = p->R;
    ring_streams rs;
    cp_status s = rs_begin(p, &rs, 2 * R + 2);
    const cpi_tensor *ck = k, *cv = v;
    void *arrived = NULL, *done = NULL, *done_before = NULL;
    for (int step = 0; step < R && s == CP_SUCCESS; step++) {
        const int src = (m - step + R) % R;
        cpi_block_io io = { .q = q, .k = ck, .v = cv, .tq = &p->sub[m], .tk = &p->sub[src],
                            .o32 = o32, .lse = lse, .scratch = b.scratch, .scratch_bytes = b.scratch_bytes };
        /* compute this step once its keys and values are here */
        if ((s = rs_select(&rs, STREAM_COMPUTE)) || (s = rs_wait(&rs, arrived)) || (s = cpi_attend(p, &io, 0)) ||
            (s = rs_mark(&rs, &done)))
            break;
        if (step + 1 < R) {
            /* meanwhile fetch the next; the buffer it lands in was read by
             * the previous step's compute */
            const int nx = step & 1;
            if ((s = rs_select(&rs, STREAM_COMM)) || (s = rs_wait(&rs, done_before)) ||
                (s = shift(p, ck, &b.k[nx])) || (s = shift(p, cv, &b.v[nx])) || (s = rs_mark(&rs, &arrived)))
                break;
            ck = &b.k[nx];
            cv = &b.v[nx];
        }
        done_before = done;
    }
    return rs_end(&rs, s);
}

cp_status cpi_ring_backward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                            const cpi_tensor *o, const cpi_lse *lse, const cpi_tensor *dout,
                            const cpi_tensor *dq32, const cpi_tensor *dk32, const cpi_tensor *dv32,
                            cpi_arena *ws)
{
    ring_bufs b = { 0 };
    CPI_TRY(take_bufs(p, k, v, 1, ws, &b));
    /* rowsum(dO * O) of the queries: the first call over a span stores it,
     * the other R - 1 steps read it */
    float *drow = cpi_drow_take(p, ws, lse->ntok, lse->heads);
    if (ws->measuring)
        return CP_SUCCESS;

    const int m = ring_rank(p), R = p->R;
    const cpi_tensor *ck = k, *cv = v;
    /* The accumulator a member adds to changes buffer at every hop (it is
     * sent from one half while the next arrives in the other), so the last
     * of R - 1 hops lands in the half it started in when R is even. With
     * one member nothing travels. */
    const int home_first = R == 1 || R % 2 == 0;
    const cpi_tensor *cdk = home_first ? dk32 : &b.dk, *cdv = home_first ? dv32 : &b.dv;
    CPI_TRY(cpi_zero(p, dq32));
    CPI_TRY(cpi_zero(p, cdk));
    CPI_TRY(cpi_zero(p, cdv));
    memset(p->drow_ready, 0, (size_t)p->sub[m].n);
    ring_streams rs;
    cp_status s = rs_begin(p, &rs, 3 * R + 2);
    void *kv_here = NULL, *acc_here = NULL, *done = NULL, *done_before = NULL;
    for (int step = 0; step < R && s == CP_SUCCESS; step++) {
        const int src = (m - step + R) % R;
        cpi_block_io io = { .q = q, .k = ck, .v = cv, .tq = &p->sub[m], .tk = &p->sub[src], .lse = lse,
                            .o = o, .dout = dout, .dq32 = dq32, .dk32 = cdk, .dv32 = cdv, .drow = drow,
                            .drow_ready = p->drow_ready, .scratch = b.scratch, .scratch_bytes = b.scratch_bytes };
        if ((s = rs_select(&rs, STREAM_COMPUTE)) || (s = rs_wait(&rs, kv_here)) || (s = rs_wait(&rs, acc_here)) ||
            (s = cpi_attend(p, &io, 1)) || (s = rs_mark(&rs, &done)))
            break;
        if (R == 1)
            break;
        if ((s = rs_select(&rs, STREAM_COMM)))
            break;
        if (step + 1 < R) {
            /* the next keys and values travel while this step computes */
            const int nx = step & 1;
            if ((s = rs_wait(&rs, done_before)) || (s = shift(p, ck, &b.k[nx])) || (s = shift(p, cv, &b.v[nx])) ||
                (s = rs_mark(&rs, &kv_here)))
                break;
            ck = &b.k[nx];
            cv = &b.v[nx];
        }
        /* the accumulator goes with its block once this step has added to
         * it; the incoming one holds the sums of the members it visited (on
         * the last hop: every accumulator arrives home, in dk32 / dv32) */
        const cpi_tensor *ndk = cdk == dk32 ? &b.dk : dk32, *ndv = cdv == dv32 ? &b.dv : dv32;
        if ((s = rs_wait(&rs, done)) || (s = shift(p, cdk, ndk)) || (s = shift(p, cdv, ndv)) ||
            (s = rs_mark(&rs, &acc_here)))
            break;
        cdk = ndk;
        cdv = ndv;
        done_before = done;
    }
    return rs_end(&rs, s);
}
