/* SPDX-License-Identifier: MIT */
/*
 * The p2p ring (docs/ARCHITECTURE.md, CP modes) over p->ring_comm, of R =
 * p->ring_size members. Member m holds the queries of token set p->sub[m];
 * the key / value blocks (each member's own one to start with) travel
 * around the ring, one hop per step, while the steps compute (double
 * buffer).
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
 * hop carries whole blocks. Sender and receiver work the ranges out alike,
 * with the functions of ring.h.
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
#include "attn/ring.h"

typedef struct ring_bufs {
    cpi_tensor k[2], v[2]; /* circulating K, V (storage type) */
    cpi_tensor dk, dv;     /* backward: the half of the fp32 accumulators' double buffer that is not the caller's */
    void *scratch;
    size_t scratch_bytes;
} ring_bufs;

/* direct: the scratch of a direct call (cpi_ring_direct), which may be more
 * than the regular call's where the caller gave up its fp32 partials */
static cp_status take_bufs(cp_attn_plan *p, const cpi_tensor *k, const cpi_tensor *v, int backward, int direct,
                           cpi_arena *ws, ring_bufs *b)
{
    if (p->ring_size > 1) {
        for (int i = 0; i < 2; i++) {
            b->k[i] = cpi_tensor_take(p, ws, k->ntok, k->heads, k->dim, k->dtype);
            b->v[i] = cpi_tensor_take(p, ws, v->ntok, v->heads, v->dim, v->dtype);
        }
        if (backward) {
            b->dk = cpi_tensor_take(p, ws, k->ntok, k->heads, k->dim, CP_DTYPE_F32);
            b->dv = cpi_tensor_take(p, ws, v->ntok, v->heads, v->dim, CP_DTYPE_F32);
        }
    }
    CPI_TRY(
        cpi_attend_scratch(p, p->max_rows, p->max_rows, p->heads.hq, p->heads.hkv, backward, direct, &b->scratch_bytes));
    b->scratch = cpi_arena_take(ws, b->scratch_bytes);
    return cpi_arena_check(ws, "the ring's buffers");
}

/* ---- which rows of a block are of use (ring.h) ------------------------- */

/* The ring of p's plan. */
static cpi_ring ring_of(const cp_attn_plan *p)
{
    return (cpi_ring){ .size = p->ring_size,
                       .member = p->ring_rank,
                       .sub = p->sub,
                       .causal = p->desc.mask == CP_MASK_CAUSAL,
                       .vis = p->rects ? &p->vis : NULL,
                       .rows_contiguous = p->desc.batch == 1 || p->desc.format == CP_FORMAT_SBHD,
                       .fwd_dir = p->ring_fwd_dir };
}

/* The smallest row range holding both. */
static cpi_rows rows_cover(cpi_rows a, cpi_rows b)
{
    if (cpi_rows_empty(a))
        return b;
    if (cpi_rows_empty(b))
        return a;
    return (cpi_rows){ a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi };
}

/* The rows of block kb's keys that member qm's queries see: the cover of
 * the key spans the mask does not hide from all of qm's query spans (the
 * same test as cpi_attend's, so no call reads or adds to a row outside). */
static cpi_rows rows_seen(const cpi_ring *r, int qm, int kb)
{
    const cpi_tokset *tq = &r->sub[qm], *tk = &r->sub[kb];
    cpi_rows seen_rows = { 0, 0 };
    for (int j = 0; r->vis && j < tk->nspans; j++) {
        int64_t lo, hi;
        cpi_vis_seen(r->vis, tq, tk->span[j], &lo, &hi);
        if (lo < hi)
            seen_rows = rows_cover(seen_rows, (cpi_rows){ tk->row[j] + (lo - tk->span[j].offset),
                                                          tk->row[j] + (hi - tk->span[j].offset) });
    }
    for (int j = 0; !r->vis && j < tk->nspans; j++) {
        const cpi_span k = tk->span[j];
        bool seen = !r->causal;
        for (int i = 0; i < tq->nspans && !seen; i++)
            seen = tq->span[i].len > 0 && k.offset <= tq->span[i].offset + tq->span[i].len - 1;
        if (seen && k.len > 0)
            seen_rows = rows_cover(seen_rows, (cpi_rows){ tk->row[j], tk->row[j] + k.len });
    }
    return seen_rows;
}

cpi_rows cpi_ring_rows_seen_by(const cpi_ring *r, int block, int first, int count, int dir)
{
    cpi_rows seen = { 0, 0 };
    for (int i = 0; i < count; i++)
        seen = rows_cover(seen, rows_seen(r, cpi_ring_member(r, first + i * dir), block));
    if (!cpi_rows_empty(seen) && !r->rows_contiguous)
        seen = (cpi_rows){ 0, r->sub[block].ntok };
    return seen;
}

/* The same ring seen by member m. */
static cpi_ring as_member(const cpi_ring *r, int m)
{
    cpi_ring o = *r;
    o.member = m;
    return o;
}

int cpi_ring_pick_fwd_dir(const cpi_ring *r)
{
    int64_t rows[2] = { 0, 0 };
    for (int d = 0; d < 2; d++)
        for (int m = 0; m < r->size; m++) {
            cpi_ring o = as_member(r, m);
            o.fwd_dir = d ? -1 : 1;
            for (int step = 1; step < r->size; step++) {
                const cpi_rows in = cpi_ring_fwd_kv_in(&o, step);
                rows[d] += cpi_rows_empty(in) ? 0 : in.hi - in.lo;
            }
        }
    return rows[1] < rows[0] ? -1 : 1;
}

int cpi_ring_plan_fwd_dir(const cp_attn_plan *p)
{
    if (!p->rects || p->ring_size < 3)
        return 1;
    cpi_ring r = ring_of(p);
    r.fwd_dir = 1;
    return cpi_ring_pick_fwd_dir(&r);
}

bool cpi_ring_fwd_idle(const cpi_ring *r, int step)
{
    for (int m = 0; m < r->size; m++) {
        const cpi_ring o = as_member(r, m);
        if (!cpi_rows_empty(cpi_ring_fwd_kv_in(&o, step)) || !cpi_rows_empty(cpi_ring_fwd_kv_out(&o, step)))
            return false;
    }
    return true;
}

bool cpi_ring_bwd_idle(const cpi_ring *r, int step, int kv)
{
    for (int m = 0; m < r->size; m++) {
        const cpi_ring o = as_member(r, m);
        const bool busy = kv ? !cpi_rows_empty(cpi_ring_bwd_kv_in(&o, step)) ||
                                   !cpi_rows_empty(cpi_ring_bwd_kv_out(&o, step))
                             : !cpi_rows_empty(cpi_ring_bwd_acc_want(&o, step)) ||
                                   !cpi_rows_empty(cpi_ring_bwd_acc_have(&o, step + 1));
        if (busy)
            return false;
    }
    return true;
}

/* Rows r of t as a tensor of their own (r within t, and one byte range of
 * it, or all of t). */
static cpi_tensor rows_of(const cp_attn_plan *p, const cpi_tensor *t, cpi_rows r)
{
    cpi_tensor v = *t;
    v.ntok = 1;
    const size_t row_bytes = cpi_tensor_bytes(p, &v);
    v.ntok = cpi_rows_empty(r) ? 0 : r.hi - r.lo;
    v.data = cpi_rows_empty(r) ? t->data : (char *)t->data + (size_t)r.lo * row_bytes;
    return v;
}

/* Zero rows `want` of t but those in `have` (have within want, or empty). */
static cp_status zero_rest(const cp_attn_plan *p, const cpi_tensor *t, cpi_rows want, cpi_rows have)
{
    if (cpi_rows_empty(have)) {
        cpi_tensor all = rows_of(p, t, want);
        return cpi_rows_empty(want) ? CP_SUCCESS : cpi_zero(p, &all);
    }
    cpi_tensor below = rows_of(p, t, (cpi_rows){ want.lo, have.lo }),
               above = rows_of(p, t, (cpi_rows){ have.hi, want.hi });
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
    rs->on = p->ring_size > 1 && CP_BACKEND_HAS(o, stream_select) && CP_BACKEND_HAS(o, event_create) &&
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
static cp_status shift(cp_attn_plan *p, const cpi_ring *r, int dir, const cpi_tensor *t, cpi_rows out,
                       const cpi_tensor *into, cpi_rows in)
{
    cp_xfer x = cpi_group_xfer(p->group);
    cpi_tensor a = rows_of(p, t, out), b = rows_of(p, into, in);
    return cpi_sendrecv(p->ring_comm, &x, a.data, cpi_tensor_bytes(p, &a), cpi_ring_member(r, r->member + dir),
                        b.data, cpi_tensor_bytes(p, &b), cpi_ring_member(r, r->member - dir));
}

/* Both directions end in one place (the label `end`), which joins the
 * streams and releases the events, after a failure too. */
#define TRY(expr)                                                                 \
    do {                                                                          \
        if ((s = (expr)) != CP_SUCCESS)                                           \
            goto end;                                                             \
    } while (0)

cp_status cpi_ring_direct(const cp_attn_plan *p, int backward, size_t spare, int *direct)
{
    *direct = 0;
    if (p->ring_size != 1)
        return CP_SUCCESS;
    const cpi_tokset *t = &p->sub[p->ring_rank];
    int one;
    CPI_TRY(cpi_attend_single(p, t, t, &one));
    if (!one)
        return CP_SUCCESS;
    /* the workspace was measured for the regular call: its scratch, and the
     * partials (spare bytes) the caller does not take when direct; each
     * take may lose up to 255 bytes to alignment */
    size_t have, need;
    CPI_TRY(cpi_attend_scratch(p, p->max_rows, p->max_rows, p->heads.hq, p->heads.hkv, backward, 0, &have));
    CPI_TRY(cpi_attend_scratch(p, p->max_rows, p->max_rows, p->heads.hq, p->heads.hkv, backward, 1, &need));
    *direct = need <= have || (spare > 1024 && need <= have + spare - 1024);
    return CP_SUCCESS;
}

cp_status cpi_ring_forward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                           const cpi_tensor *o32, const cpi_lse *lse, const cpi_descale *descale,
                           const cpi_tensor *o_final, cpi_arena *ws)
{
    ring_bufs b = { 0 };
    CPI_TRY(take_bufs(p, k, v, 0, o_final != NULL, ws, &b));
    if (ws->measuring)
        return CP_SUCCESS;

    const cpi_ring r = ring_of(p);
    const cpi_tensor *ck = k, *cv = v; /* the step's keys and values */
    void *arrived = NULL, *done = NULL, *done_before = NULL;
    ring_streams rs;
    cp_status s = rs_begin(p, &rs, 2 * r.size + 2);
    if (s != CP_SUCCESS)
        goto end;
    for (int step = 0; step < r.size; step++) {
        cpi_attend_io io = { .q = q, .k = ck, .v = cv, .tq = &p->sub[r.member],
                             .tk = &p->sub[cpi_ring_fwd_block(&r, step)], .o32 = o32, .lse = lse,
                             .descale = *descale, .out = o_final, .scratch = b.scratch,
                             .scratch_bytes = b.scratch_bytes };
        /* compute this step once its keys and values are here */
        TRY(rs_select(&rs, STREAM_COMPUTE));
        TRY(rs_wait(&rs, arrived));
        TRY(cpi_attend(p, &io, 0));
        TRY(rs_mark(&rs, &done));
        if (step + 1 < r.size) {
            /* meanwhile this block goes to m - 1 and the next comes from
             * m + 1, each with the rows that the members yet to hold it
             * see; the buffer it lands in was read by the previous step's
             * compute */
            const int nx = step & 1;
            const cpi_rows out = cpi_ring_fwd_kv_out(&r, step + 1), in = cpi_ring_fwd_kv_in(&r, step + 1);
            if (!r.vis || !cpi_ring_fwd_idle(&r, step + 1)) {
                TRY(rs_select(&rs, STREAM_COMM));
                TRY(rs_wait(&rs, done_before));
                TRY(shift(p, &r, -cpi_ring_fwd_sign(&r), ck, out, &b.k[nx], in));
                TRY(shift(p, &r, -cpi_ring_fwd_sign(&r), cv, out, &b.v[nx], in));
                TRY(rs_mark(&rs, &arrived));
            }
            ck = &b.k[nx];
            cv = &b.v[nx];
        }
        done_before = done;
    }
end:
    return rs_end(&rs, s);
}

cp_status cpi_ring_backward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                            const cpi_tensor *o, const cpi_lse *lse, const cpi_tensor *dout,
                            const cpi_tensor *dq32, const cpi_tensor *dk32, const cpi_tensor *dv32,
                            const cpi_tensor *const *fin, cpi_arena *ws)
{
    ring_bufs b = { 0 };
    CPI_TRY(take_bufs(p, k, v, 1, fin != NULL, ws, &b));
    /* rowsum(dO * O) of the queries: the first call over a span stores it,
     * the other R - 1 steps read it */
    float *drow = cpi_drow_take(p, ws, lse->ntok, lse->heads);
    if (ws->measuring)
        return CP_SUCCESS;

    const cpi_ring r = ring_of(p);
    const int R = r.size;
    /* The accumulator a member adds to changes buffer at every hop (it is
     * sent from one half while the next arrives in the other), so the last
     * of R - 1 hops lands in the half it started in when R is odd. */
    const int home_first = R % 2 == 1;
    const cpi_tensor *cdk = home_first ? dk32 : &b.dk, *cdv = home_first ? dv32 : &b.dv;
    void *kv_here = NULL, *acc_here = NULL, *done = NULL, *done_before = NULL;
    memset(p->drow_ready, 0, (size_t)p->sub[r.member].nspans);
    ring_streams rs;
    cp_status s = rs_begin(p, &rs, 3 * R + 2);
    if (s != CP_SUCCESS)
        goto end;
    /* the first keys and values travel while the sums are cleared */
    if (R > 1 && (!r.vis || !cpi_ring_bwd_idle(&r, 0, 1))) {
        const cpi_rows out = cpi_ring_bwd_kv_out(&r, 0), in = cpi_ring_bwd_kv_in(&r, 0);
        TRY(rs_select(&rs, STREAM_COMM));
        TRY(shift(p, &r, 1, k, out, &b.k[0], in));
        TRY(shift(p, &r, 1, v, out, &b.v[0], in));
        TRY(rs_mark(&rs, &kv_here));
    }
    TRY(rs_select(&rs, STREAM_COMPUTE));
    if (!fin)
        TRY(cpi_zero(p, dq32));
    for (int step = 0; step < R; step++) {
        const int own = step == R - 1;
        const cpi_tensor *ck = own ? k : &b.k[step & 1], *cv = own ? v : &b.v[step & 1];
        const cpi_rows have = cpi_ring_bwd_acc_have(&r, step), want = cpi_ring_bwd_acc_want(&r, step);
        cpi_attend_io io = { .q = q, .k = ck, .v = cv, .tq = &p->sub[r.member],
                             .tk = &p->sub[cpi_ring_bwd_block(&r, step)], .lse = lse, .o = o, .dout = dout,
                             .dq32 = dq32, .dk32 = cdk, .dv32 = cdv, .drow = drow, .drow_ready = p->drow_ready,
                             .dq_out = fin ? fin[0] : NULL, .dk_out = fin ? fin[1] : NULL,
                             .dv_out = fin ? fin[2] : NULL, .scratch = b.scratch, .scratch_bytes = b.scratch_bytes };
        /* the rows of the accumulator that this step adds to but that did
         * not travel are cleared here, not on the comm stream: a memset is
         * a kernel, and one queued there would wait for SMs (the previous
         * step's kernel may hold all of them) and hold back the transfers
         * queued behind it (at step 0 no row travelled: `have` is empty) */
        TRY(rs_select(&rs, STREAM_COMPUTE));
        TRY(rs_wait(&rs, kv_here));
        TRY(rs_wait(&rs, acc_here));
        if (!fin) {
            TRY(zero_rest(p, cdk, want, have));
            TRY(zero_rest(p, cdv, want, have));
        }
        TRY(cpi_attend(p, &io, 1));
        TRY(rs_mark(&rs, &done));
        if (own)
            break;
        TRY(rs_select(&rs, STREAM_COMM));
        if (step + 1 < R - 1 && (!r.vis || !cpi_ring_bwd_idle(&r, step + 1, 1))) {
            /* the next keys and values travel while this step computes,
             * into the buffer the previous step read */
            const int nx = (step + 1) & 1;
            const cpi_rows out = cpi_ring_bwd_kv_out(&r, step + 1), in = cpi_ring_bwd_kv_in(&r, step + 1);
            TRY(rs_wait(&rs, done_before));
            TRY(shift(p, &r, 1, ck, out, &b.k[nx], in));
            TRY(shift(p, &r, 1, cv, out, &b.v[nx], in));
            TRY(rs_mark(&rs, &kv_here));
        }
        /* the accumulator goes on once this step has added to it; the
         * incoming one holds the sums of the members it visited (on the
         * last hop: those of every other member, in dk32 / dv32) */
        const cpi_tensor *ndk = cdk == dk32 ? &b.dk : dk32, *ndv = cdv == dv32 ? &b.dv : dv32;
        const cpi_rows in = cpi_ring_bwd_acc_have(&r, step + 1);
        if (!r.vis || !cpi_ring_bwd_idle(&r, step, 0)) {
            TRY(rs_wait(&rs, done));
            TRY(shift(p, &r, 1, cdk, want, ndk, in));
            TRY(shift(p, &r, 1, cdv, want, ndv, in));
            TRY(rs_mark(&rs, &acc_here));
        }
        cdk = ndk;
        cdv = ndv;
        done_before = done;
    }
end:
    return rs_end(&rs, s);
}

#undef TRY
