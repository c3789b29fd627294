/* SPDX-License-Identifier: MIT */
/*
 * The p2p ring (DESIGN.md section 3) over p->ring_comm, R members. Member m
 * holds the queries of token set p->sub[m]; the key / value blocks (each
 * member's own one to start with) travel around the ring, one hop per step,
 * while the steps compute (double buffer).
 *
 * Forward: at step s member m holds the block of member (m + s) mod R and
 * passes it to m - 1. Backward: at step s member m holds block
 * (m - 1 - s) mod R, received from m - 1, so that its own block comes last;
 * the fp32 dK / dV accumulator of every block travels with it and, having
 * visited the other R - 1 members, is at home for the last step, which adds
 * the diagonal in the caller's buffers (R - 1 hops, not R: the reference
 * design's return hop goes). dQ accumulates locally. The caller's dK / dV
 * accumulators are one half of the accumulators' double buffer (only the
 * other half is workspace): the tour starts in whichever half makes the
 * last hop land in the caller's.
 *
 * Partial hops: a hop carries only the rows of a block that are still of
 * use. Keys and values go with the rows that some member further along the
 * block's path sees (the causal mask hides whole spans of a block from
 * whole token sets); an accumulator goes with the rows that some member it
 * has visited saw, the rest being zero. The directions above make these the
 * short ones under causal zigzag: member m's late chunk is seen only by
 * members j <= m, which the forward visits first and the backward's
 * accumulators visit last (a quarter of the accumulator traffic goes, and a
 * quarter of the forward's). A part is one byte range when a block's rows
 * are contiguous in memory (batch 1, or the SBHD format); otherwise every
 * hop carries whole blocks. Sender and receiver work the ranges out alike.
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

/* ---- which rows of a block are of use ----------------------------------- */

/* Rows [lo, hi) of a block's buffers; empty when lo >= hi. */
typedef struct rows {
    int64_t lo, hi;
} rows;

static int rows_empty(rows r)
{
    return r.lo >= r.hi;
}

/* The smallest row range holding both. */
static rows rows_cover(rows a, rows b)
{
    if (rows_empty(a))
        return b;
    if (rows_empty(b))
        return a;
    return (rows){ a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi };
}

static int mod(int a, int R)
{
    return ((a % R) + R) % R;
}

/* The rows of block kb's keys that member qm's queries see: the cover of
 * the key spans the mask does not hide from all of qm's query spans (the
 * same test as cpi_attend's, so no call reads or adds to a row outside). */
static rows rows_seen(const cp_attn_plan *p, int qm, int kb)
{
    const cpi_tokset *tq = &p->sub[qm], *tk = &p->sub[kb];
    rows r = { 0, 0 };
    for (int j = 0; j < tk->n; j++) {
        const cpi_span k = tk->span[j];
        int seen = p->d.mask != CP_MASK_CAUSAL;
        for (int i = 0; i < tq->n && !seen; i++)
            seen = tq->span[i].len > 0 && k.offset <= tq->span[i].offset + tq->span[i].len - 1;
        if (seen && k.len > 0)
            r = rows_cover(r, (rows){ tk->row[j], tk->row[j] + k.len });
    }
    return r;
}

/* Whether a row range of a block is one byte range of its buffers. */
static int rows_contiguous(const cp_attn_plan *p)
{
    return p->d.batch == 1 || p->d.format == CP_FORMAT_SBHD;
}

/* The rows of block kb that `count` members see, members first,
 * first + dir, ... (mod R); the whole block when a part would not be one
 * byte range. */
static rows rows_seen_by(const cp_attn_plan *p, int kb, int first, int count, int dir)
{
    rows r = { 0, 0 };
    for (int i = 0; i < count; i++)
        r = rows_cover(r, rows_seen(p, mod(first + i * dir, p->R), kb));
    if (!rows_empty(r) && !rows_contiguous(p))
        r = (rows){ 0, p->sub[kb].ntok };
    return r;
}

/* Rows r of t as a tensor of their own (r within t, and one byte range of
 * it, or all of t). */
static cpi_tensor rows_of(const cp_attn_plan *p, const cpi_tensor *t, rows r)
{
    cpi_tensor v = *t;
    v.ntok = 1;
    const size_t row_bytes = cpi_tensor_bytes(p, &v);
    v.ntok = rows_empty(r) ? 0 : r.hi - r.lo;
    v.p = rows_empty(r) ? t->p : (char *)t->p + (size_t)r.lo * row_bytes;
    return v;
}

/* Zero rows `want` of t but those in `have` (have within want, or empty). */
static cp_status zero_rest(const cp_attn_plan *p, const cpi_tensor *t, rows want, rows have)
{
    if (rows_empty(have)) {
        cpi_tensor all = rows_of(p, t, want);
        return rows_empty(want) ? CP_SUCCESS : cpi_zero(p, &all);
    }
    cpi_tensor below = rows_of(p, t, (rows){ want.lo, have.lo }), above = rows_of(p, t, (rows){ have.hi, want.hi });
    if (below.ntok)
        CPI_TRY(cpi_zero(p, &below));
    return above.ntok ? cpi_zero(p, &above) : CP_SUCCESS;
}

/* ---- streams and events ------------------------------------------------- */
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

/* Send rows `out` of t to member m + dir and receive rows `in` of `into`
 * from member m - dir. */
static cp_status shift(cp_attn_plan *p, int dir, const cpi_tensor *t, rows out, const cpi_tensor *into, rows in)
{
    const int m = p->ring_rank, R = p->R;
    cp_xfer x = cpi_group_xfer(p->g);
    cpi_tensor a = rows_of(p, t, out), b = rows_of(p, into, in);
    return cpi_sendrecv(p->ring_comm, &x, a.p, cpi_tensor_bytes(p, &a), mod(m + dir, R), b.p,
                        cpi_tensor_bytes(p, &b), mod(m - dir, R));
}

cp_status cpi_ring_forward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                           const cpi_tensor *o32, const cpi_lse *lse, cpi_arena *ws)
{
    ring_bufs b = { 0 };
    CPI_TRY(take_bufs(p, k, v, 0, ws, &b));
    if (ws->measuring)
        return CP_SUCCESS;

    const int m = p->ring_rank, R = p->R;
    ring_streams rs;
    cp_status s = rs_begin(p, &rs, 2 * R + 2);
    const cpi_tensor *ck = k, *cv = v;
    void *arrived = NULL, *done = NULL, *done_before = NULL;
    for (int step = 0; step < R && s == CP_SUCCESS; step++) {
        const int src = mod(m + step, R);
        cpi_block_io io = { .q = q, .k = ck, .v = cv, .tq = &p->sub[m], .tk = &p->sub[src],
                            .o32 = o32, .lse = lse, .scratch = b.scratch, .scratch_bytes = b.scratch_bytes };
        /* compute this step once its keys and values are here */
        if ((s = rs_select(&rs, STREAM_COMPUTE)) || (s = rs_wait(&rs, arrived)) || (s = cpi_attend(p, &io, 0)) ||
            (s = rs_mark(&rs, &done)))
            break;
        if (step + 1 < R) {
            /* meanwhile this block goes to m - 1 and the next comes from
             * m + 1, each with the rows that the members yet to hold it
             * see (m - 1, m - 2, ... and m, m - 1, ...); the buffer it lands
             * in was read by the previous step's compute */
            const int nx = step & 1, left = R - 1 - step;
            const rows out = rows_seen_by(p, src, m - 1, left, -1), in = rows_seen_by(p, mod(src + 1, R), m, left, -1);
            if ((s = rs_select(&rs, STREAM_COMM)) || (s = rs_wait(&rs, done_before)) ||
                (s = shift(p, -1, ck, out, &b.k[nx], in)) || (s = shift(p, -1, cv, out, &b.v[nx], in)) ||
                (s = rs_mark(&rs, &arrived)))
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

    const int m = p->ring_rank, R = p->R;
#define BLOCK(step) mod(m - 1 - (step), R) /* the block of a step; the last is this member's own */
    /* The rows of a step's accumulator that hold sums (`have`: those that
     * the members it visited saw, the rest being zero) and that must after
     * this member has added to it (`want`: and those this member sees; at
     * home, all of them). */
#define HAVE(step) rows_seen_by(p, BLOCK(step), BLOCK(step) + 1, (step), 1)
#define WANT(step) ((step) == R - 1 ? (rows){ 0, p->sub[m].ntok } : rows_seen_by(p, BLOCK(step), BLOCK(step) + 1, (step) + 1, 1))
    /* The rows of the keys and values a step receives (those its members
     * from this one until the block's owner see) and sends. */
#define KV_IN(step) rows_seen_by(p, BLOCK(step), m, R - 1 - (step), 1)
#define KV_OUT(step) rows_seen_by(p, BLOCK((step) - 1), m + 1, R - 1 - (step), 1)
    /* The accumulator a member adds to changes buffer at every hop (it is
     * sent from one half while the next arrives in the other), so the last
     * of R - 1 hops lands in the half it started in when R is odd. */
    const int home_first = R % 2 == 1;
    const cpi_tensor *cdk = home_first ? dk32 : &b.dk, *cdv = home_first ? dv32 : &b.dv;
    memset(p->drow_ready, 0, (size_t)p->sub[m].n);
    ring_streams rs;
    cp_status s = rs_begin(p, &rs, 3 * R + 2);
    void *kv_here = NULL, *acc_here = NULL, *done = NULL, *done_before = NULL;
    /* the first keys and values travel while the sums are cleared */
    if (s == CP_SUCCESS && R > 1 &&
        ((s = rs_select(&rs, STREAM_COMM)) || (s = shift(p, 1, k, KV_OUT(0), &b.k[0], KV_IN(0))) ||
         (s = shift(p, 1, v, KV_OUT(0), &b.v[0], KV_IN(0))) || (s = rs_mark(&rs, &kv_here))))
        return rs_end(&rs, s);
    if (s == CP_SUCCESS && ((s = rs_select(&rs, STREAM_COMPUTE)) || (s = cpi_zero(p, dq32))))
        return rs_end(&rs, s);
    for (int step = 0; step < R && s == CP_SUCCESS; step++) {
        const int own = step == R - 1;
        const cpi_tensor *ck = own ? k : &b.k[step & 1], *cv = own ? v : &b.v[step & 1];
        cpi_block_io io = { .q = q, .k = ck, .v = cv, .tq = &p->sub[m], .tk = &p->sub[BLOCK(step)], .lse = lse,
                            .o = o, .dout = dout, .dq32 = dq32, .dk32 = cdk, .dv32 = cdv, .drow = drow,
                            .drow_ready = p->drow_ready, .scratch = b.scratch, .scratch_bytes = b.scratch_bytes };
        /* the rows of the accumulator that this step adds to but that did
         * not travel are cleared here, not on the comm stream: a memset is
         * a kernel, and one queued there would wait for SMs (the previous
         * step's kernel may hold all of them) and hold back the transfers
         * queued behind it (at step 0 no row travelled: HAVE(0) is empty) */
        if ((s = rs_select(&rs, STREAM_COMPUTE)) || (s = rs_wait(&rs, kv_here)) || (s = rs_wait(&rs, acc_here)) ||
            (s = zero_rest(p, cdk, WANT(step), HAVE(step))) || (s = zero_rest(p, cdv, WANT(step), HAVE(step))) ||
            (s = cpi_attend(p, &io, 1)) || (s = rs_mark(&rs, &done)))
            break;
        if (own)
            break;
        if ((s = rs_select(&rs, STREAM_COMM)))
            break;
        if (step + 1 < R - 1) {
            /* the next keys and values travel while this step computes,
             * into the buffer the previous step read */
            const int nx = (step + 1) & 1;
            if ((s = rs_wait(&rs, done_before)) || (s = shift(p, 1, ck, KV_OUT(step + 1), &b.k[nx], KV_IN(step + 1))) ||
                (s = shift(p, 1, cv, KV_OUT(step + 1), &b.v[nx], KV_IN(step + 1))) || (s = rs_mark(&rs, &kv_here)))
                break;
        }
        /* the accumulator goes on once this step has added to it; the
         * incoming one holds the sums of the members it visited (on the
         * last hop: those of every other member, in dk32 / dv32) */
        const cpi_tensor *ndk = cdk == dk32 ? &b.dk : dk32, *ndv = cdv == dv32 ? &b.dv : dv32;
        const rows out = WANT(step), in = HAVE(step + 1);
        if ((s = rs_wait(&rs, done)) || (s = shift(p, 1, cdk, out, ndk, in)) || (s = shift(p, 1, cdv, out, ndv, in)) ||
            (s = rs_mark(&rs, &acc_here)))
            break;
        cdk = ndk;
        cdv = ndv;
        done_before = done;
    }
#undef BLOCK
#undef HAVE
#undef WANT
#undef KV_IN
#undef KV_OUT
    return rs_end(&rs, s);
}
