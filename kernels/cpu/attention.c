/* SPDX-License-Identifier: MIT */
/*
 * Block attention on the CPU: forward and backward of one Q block against one
 * K/V block, flash-style (scores live in tiles, never a seq_q x seq_k
 * matrix), multi-threaded on the context's pool, vectorised through the tile
 * primitives of tile.h.
 *
 * Numerics. Every tile is converted to fp32 when it is loaded, all products
 * and sums are fp32, and only final outputs (O, dQ, dK, dV in a 16-bit
 * storage type) are rounded, once. Probabilities are never rounded to 16
 * bits: the CPU multiplies in fp32 anyway, so rounding P (before or after
 * normalisation) would only add error. Scores are kept in base 2: Q (forward)
 * or S (backward) is multiplied by scale * log2(e) and exponentials are 2^x;
 * LSE is converted back to the natural log on output. A row that sees no key
 * gets O = 0 and LSE = -inf, and such rows / blocks contribute exactly nothing
 * when accumulated; no NaN is formed on the way.
 *
 * Non-finite inputs propagate as in exact arithmetic (docs/ARCHITECTURE.md,
 * Numerics): a NaN score, or +inf (whose softmax is inf / inf), makes its
 * row's O and LSE NaN (never the O = 0 / LSE = -inf of a row that sees no
 * key, which a merge would drop). A score of -inf weighs exactly 0, as a
 * masked key does; a row whose scores are all -inf is treated as one that
 * sees no key, the same in every block, so the answer does not depend on how
 * CP cut the keys. Masked pairs inside a tile enter the GEMMs as exact
 * zeros, and 0 * NaN = NaN would carry a non-finite element of V, dO, Q or K
 * to rows that do not see it; so such elements (found when a tile is loaded;
 * rare) are zeroed in the tile and their terms added afterwards to exactly
 * the rows that see them (fwd_fix_values, bwd_fix). Finite inputs take none
 * of this.
 *
 * Visibility. A call attends a list of rectangles (cp_kernel_attn_args.rects;
 * without them the whole block at q_offset / k_offset is the one rectangle).
 * Inside one, the mask and the window compare positions that grow by one
 * per row on both sides, so query row i sees a band of key rows [lo(i),
 * hi(i)) whose ends are non-decreasing in i, and key row j is seen by a
 * band of query rows likewise (see rect). The kernels know only bands: the
 * dense block, windows and packed documents take one code path. Each query
 * tile (forward) or key tile (backward) walks the rectangles that meet it,
 * listed once per call in memory the call mallocs (it grows with the
 * rectangles, which the workspace size does not know); a query row in
 * several rectangles runs one online softmax through all of them.
 *
 * FP8 inputs (API 1.2) load like the others, decoded exactly to fp32. Their
 * descales fold into the factors a unit already applies once: q_descale[h]
 * k_descale[kvh] into Q's factor (scale * log2(e), or scale / softcap; the
 * product formed in double and rounded once to fp32), v_descale[kvh] into
 * the 1 / l that normalises the output (v / l, also rounded once), so the
 * products and sums are those of the unscaled values.
 *
 * Softcap c: a score s becomes c tanh(s / c) before the mask. The forward
 * scales Q by scale / c (instead of scale * log2(e)) and maps each computed
 * score x to c log2(e) tanh(x); the backward maps S to c tanh(scale S / c)
 * and keeps 1 - tanh^2 in a tile of its own, the factor the chain rule puts
 * on dS.
 *
 * Forward: one work unit per (batch, head, tile of FWD_BQ query rows); each
 * streams the visible key tiles of FWD_BK rows of every rectangle that meets
 * it through one online softmax. Units are handed out dynamically (an atomic
 * counter), most expensive first; each row is computed by one thread in a
 * fixed order, so the result does not depend on the thread count.
 *
 * Backward: the work of one (batch, kv head, tile of BWD_BK key rows) owns
 * dK and dV of its keys (all query heads of the GQA group add into them) and
 * walks, rectangle by rectangle, over the query tiles that see them,
 * recomputing P from Q, K and LSE. dQ gets contributions from every key
 * tile: the key tiles of each (batch, kv head) are cut into a few runs of
 * equal work, each run adds into its own fp32 dQ slot, and a last pass sums
 * the slots in a fixed order (see bwd_split). Runs are handed out
 * dynamically; for a given thread count the result is deterministic.
 *
 * Workspace (exact, see carve_*): forward: per thread one set of tiles;
 * backward: per thread one set of tiles (with a softcap one more tile, for
 * 1 - tanh^2), `chunks` fp32 dQ slots of
 * batch * num_heads * seq_q * pad16(head_dim) floats (one slot unless there
 * are fewer than 2 * threads (batch, kv head) pairs), and two floats per
 * query row (D = rowsum(dO * O) and the base-2 LSE). Nothing grows with
 * seq_q * seq_k. The lists of rectangles per tile are not in the workspace:
 * each call mallocs and frees its own.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/*
 * Tile sizes (rows), tuned on an AVX-512 machine at head_dim 128: the key
 * tiles are multiples of the micro-kernel's 6-row block; the forward's wide
 * query tile halves how often K and V stream through the cache, and the
 * backward's key tile sets how often Q and dO do. Per-thread scratch stays
 * well inside a 1-2 MiB L2 at head_dim 128.
 */
#define FWD_BQ 256
#define FWD_BK 96
#define BWD_BQ 96
#define BWD_BK 144

#define LOG2E 1.4426950408889634
#define LN2 0.6931471805599453

/* ------------------------------------------------------------------------ */
/* Problem description                                                      */
/* ------------------------------------------------------------------------ */

typedef struct {
    const char *p;
    cp_dtype t;
    size_t es;
    int64_t sb, ss, sh;
} tview;

static tview make_view(const void *p, cp_dtype t, int64_t sb, int64_t ss, int64_t sh)
{
    tview v = {p, t, cpi_dtype_size(t), sb, ss, sh};
    return v;
}

static inline char *row_at(const tview *v, int64_t b, int64_t s, int64_t h)
{
    return (char *)v->p + (size_t)(b * v->sb + s * v->ss + h * v->sh) * v->es;
}

typedef struct {
    const cpi_tile_ops *t;
    int64_t B, Sq, Sk;
    int64_t window; /* on positions; 0 = none */
    int H, Hkv, G, D, Dv;
    int causal;
    float scale; /* softmax scale */
    float qf;    /* forward: Q's factor, scale * log2(e), or scale / softcap */
    float sf;    /* backward: S's factor into base 2, scale * log2(e), or log2(e) after the softcap */
    /* with a softcap c: c, scale / c and c * log2(e) in fp32 (a tiny c may
     * round to 0 there, so softcap is the flag, not cap) */
    bool softcap;
    float cap, cap_in, cap_out;
    /* forward with FP8 inputs (API 1.2): the descales (NULL = 1), one or
     * one per head, and Q's factor before them in double */
    const float *q_descale, *k_descale, *v_descale;
    bool descaled, descale_per_head;
    double qf_exact;
    tview q, k, v, o, dout, dq, dk, dv;
    float *lse, *lse_lo;
    int64_t lse_sb, lse_sh;
    float *drow; /* rowsum(dO * O) laid out like lse, or NULL */
    int drow_ready; /* 1: read drow; 0: store into it */
    int accumulate, grad_accumulate;
} problem;

static problem make_problem(const cpi_tile_ops *t, const cp_kernel_attn_args *a, int backward)
{
    problem p;
    memset(&p, 0, sizeof p);
    p.t = t;
    p.B = a->batch;
    p.Sq = a->seq_q;
    p.Sk = a->seq_k;
    p.window = a->window;
    p.H = a->num_heads;
    p.Hkv = a->num_kv_heads;
    p.G = a->num_heads / a->num_kv_heads;
    p.D = a->head_dim;
    p.Dv = a->head_dim_v;
    p.causal = a->mask == CP_MASK_CAUSAL;
    p.scale = (float)a->softmax_scale;
    p.qf = (float)(a->softmax_scale * LOG2E);
    p.sf = p.qf;
    if (a->softcap != 0) {
        /* the core checked that these are finite floats */
        p.softcap = true;
        p.cap = (float)a->softcap;
        p.cap_in = (float)(a->softmax_scale / a->softcap);
        p.cap_out = (float)(a->softcap * LOG2E);
        p.qf = p.cap_in;
        p.sf = (float)LOG2E;
    }
    if (!backward && (a->q_descale || a->k_descale || a->v_descale)) {
        p.descaled = true;
        p.descale_per_head = a->descale_per_head != 0;
        p.q_descale = a->q_descale;
        p.k_descale = a->k_descale;
        p.v_descale = a->v_descale;
        p.qf_exact = a->softcap != 0 ? a->softmax_scale / a->softcap : a->softmax_scale * LOG2E;
    }
    p.q = make_view(a->q, a->dtype, a->q_stride_b, a->q_stride_s, a->q_stride_h);
    p.k = make_view(a->k, a->dtype, a->k_stride_b, a->k_stride_s, a->k_stride_h);
    p.v = make_view(a->v, a->dtype, a->v_stride_b, a->v_stride_s, a->v_stride_h);
    p.o = make_view(a->o, a->o_dtype, a->o_stride_b, a->o_stride_s, a->o_stride_h);
    p.lse = a->lse;
    p.lse_lo = a->accumulate ? a->lse_lo : NULL;
    p.lse_sb = a->lse_stride_b;
    p.lse_sh = a->lse_stride_h;
    p.accumulate = a->accumulate;
    if (backward) {
        p.dout = make_view(a->dout, a->o_dtype, a->dout_stride_b, a->dout_stride_s, a->dout_stride_h);
        p.dq = make_view(a->dq, a->grad_dtype, a->dq_stride_b, a->dq_stride_s, a->dq_stride_h);
        p.dk = make_view(a->dk, a->grad_dtype, a->dk_stride_b, a->dk_stride_s, a->dk_stride_h);
        p.dv = make_view(a->dv, a->grad_dtype, a->dv_stride_b, a->dv_stride_s, a->dv_stride_h);
        p.grad_accumulate = a->grad_accumulate;
        p.drow = a->drow;
        p.drow_ready = a->drow_ready;
    }
    return p;
}

static inline float *lse_at(const problem *p, int64_t b, int64_t h)
{
    return p->lse + b * p->lse_sb + h * p->lse_sh;
}

/* Descale i of d (NULL: 1). */
static inline double descale(const problem *p, const float *d, int i)
{
    return d ? (double)d[p->descale_per_head ? i : 0] : 1.0;
}

/* ------------------------------------------------------------------------ */
/* Rectangles                                                               */
/* ------------------------------------------------------------------------ */

/*
 * A rectangle in rows: query rows [q0, q1) against key rows [k0, k1).
 * Query row q0 + t sees the key rows k0 + [t + a_lo, t + a_hi), and key row
 * k0 + u is seen by the query rows q0 + [u + b_lo, u + b_hi), each clamped
 * to the rectangle (b_lo = 1 - a_hi, b_hi = 1 - a_lo). With positions
 * q_pos + t and k_pos + u and e = q_pos - k_pos, the causal mask keeps
 * u <= t + e, a window W keeps u > t + e - W (and u < t + e + W without the
 * mask). A side without a bound, and an offset beyond int64, is saturated at
 * INT64_MIN or INT64_MAX: clamp_add then gives the whole rectangle or none
 * of it, as the exact value would.
 */
typedef struct {
    int64_t q0, q1, k0, k1;
    int64_t a_lo, a_hi, b_lo, b_hi;
} rect;

static inline int64_t sat_add(int64_t x, int64_t y)
{
    int64_t r;
    return __builtin_add_overflow(x, y, &r) ? (y > 0 ? INT64_MAX : INT64_MIN) : r;
}

static inline int64_t sat_sub(int64_t x, int64_t y)
{
    int64_t r;
    return __builtin_sub_overflow(x, y, &r) ? (y < 0 ? INT64_MAX : INT64_MIN) : r;
}

/* clamp(t + a, 0, n) for t, n >= 0 and any a, without overflow. */
static inline int64_t clamp_add(int64_t t, int64_t a, int64_t n)
{
    if (a >= n - t)
        return n;
    return t + a < 0 ? 0 : t + a;
}

static rect make_rect(const problem *p, int64_t q_row, int64_t q_len, int64_t k_row, int64_t k_len, int64_t q_pos,
                      int64_t k_pos)
{
    int64_t e = q_pos - k_pos; /* both >= 0 */
    rect r = {q_row, q_row + q_len, k_row, k_row + k_len, INT64_MIN, INT64_MAX, 0, 0};
    if (p->window)
        r.a_lo = sat_sub(e, p->window - 1);
    if (p->causal)
        r.a_hi = sat_add(e, 1);
    else if (p->window)
        r.a_hi = sat_add(e, p->window);
    r.b_lo = sat_sub(1, r.a_hi);
    r.b_hi = sat_sub(1, r.a_lo);
    return r;
}

/* The keys [*lo, *hi) of r that query row i (in r) sees; lo <= hi. */
static inline void rect_keys(const rect *r, int64_t i, int64_t *lo, int64_t *hi)
{
    int64_t n = r->k1 - r->k0, t = i - r->q0;
    *lo = r->k0 + clamp_add(t, r->a_lo, n);
    *hi = r->k0 + clamp_add(t, r->a_hi, n);
}

/* The query rows [*lo, *hi) of r that see key row j (in r); lo <= hi. */
static inline void rect_queries(const rect *r, int64_t j, int64_t *lo, int64_t *hi)
{
    int64_t n = r->q1 - r->q0, u = j - r->k0;
    *lo = r->q0 + clamp_add(u, r->b_lo, n);
    *hi = r->q0 + clamp_add(u, r->b_hi, n);
}

/*
 * The non-empty rectangles of a call, and for every tile of `tile` rows
 * along the queries (forward) or the keys (backward) those that meet it:
 * tile t's are r[list[start[t] .. start[t + 1])], in the caller's order.
 */
typedef struct {
    rect *r;
    int64_t *start; /* [tiles + 1] */
    int64_t *list;
} rect_index;

static void rect_index_free(rect_index *ix)
{
    free(ix->r);
    free(ix->start);
    free(ix->list);
    memset(ix, 0, sizeof *ix);
}

static cp_status rect_index_build(const problem *p, const cp_kernel_attn_args *a, bool by_key, int64_t tile,
                                  rect_index *ix, const char *func)
{
    memset(ix, 0, sizeof *ix);
    const int64_t n = a->rects ? a->num_rects : 1, tiles = ((by_key ? p->Sk : p->Sq) + tile - 1) / tile;
    ix->r = cpi_calloc(n ? (size_t)n : 1, sizeof *ix->r);
    ix->start = cpi_calloc((size_t)tiles + 1, sizeof *ix->start);
    size_t entries = 0;
    bool ok = ix->r && ix->start;
    int64_t m = 0;
    for (int64_t i = 0; ok && i < n; i++) {
        const cp_attn_rect *g = a->rects ? &a->rects[i] : NULL;
        rect r = g ? make_rect(p, g->q_row, g->q_len, g->k_row, g->k_len, g->q_pos, g->k_pos)
                   : make_rect(p, 0, p->Sq, 0, p->Sk, a->q_offset, a->k_offset);
        if (r.q0 == r.q1 || r.k0 == r.k1)
            continue;
        ix->r[m++] = r;
        int64_t t0 = (by_key ? r.k0 : r.q0) / tile, t1 = ((by_key ? r.k1 : r.q1) - 1) / tile;
        ok = cpi_add(entries, (size_t)(t1 - t0 + 1), &entries);
        for (int64_t t = t0; ok && t <= t1; t++)
            ix->start[t + 1]++;
    }
    if (ok)
        ix->list = cpi_calloc(entries ? entries : 1, sizeof *ix->list);
    if (!ok || !ix->list) {
        rect_index_free(ix);
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of memory listing the rectangles of %" PRId64
                         " tiles (a->num_rects = %" PRId64 ")", func, tiles, a->num_rects);
    }
    /* counts to starts; filling advances each start to the next tile's,
     * and the shift puts them back */
    for (int64_t t = 0; t < tiles; t++)
        ix->start[t + 1] += ix->start[t];
    for (int64_t i = 0; i < m; i++) {
        const rect *r = &ix->r[i];
        int64_t t0 = (by_key ? r->k0 : r->q0) / tile, t1 = ((by_key ? r->k1 : r->q1) - 1) / tile;
        for (int64_t t = t0; t <= t1; t++)
            ix->list[ix->start[t]++] = i;
    }
    for (int64_t t = tiles; t > 0; t--)
        ix->start[t] = ix->start[t - 1];
    ix->start[0] = 0;
    return CP_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Workspace carving: the same code sizes the workspace and partitions it.  */
/* ------------------------------------------------------------------------ */

#define WS_ALIGN 64

typedef struct {
    char *base; /* NULL while sizing */
    size_t off;
    bool overflow;
} carve;

static void *carve_take(carve *c, size_t count, size_t elem)
{
    size_t bytes, start, end;
    if (!cpi_mul(count, elem, &bytes) || !cpi_add(c->off, WS_ALIGN - 1, &start) ||
        !cpi_add(start & ~(size_t)(WS_ALIGN - 1), bytes, &end)) {
        c->overflow = true;
        return NULL;
    }
    start &= ~(size_t)(WS_ALIGN - 1);
    c->off = end;
    return c->base ? c->base + start : NULL;
}

/* Total bytes including the slack that aligns an arbitrary base pointer. */
static cp_status carve_total(const carve *c, const char *func, size_t *bytes)
{
    if (c->overflow || !cpi_add(c->off, WS_ALIGN, bytes))
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: the workspace size overflows size_t", func);
    return CP_SUCCESS;
}

static carve carve_begin(void *base)
{
    carve c = {NULL, 0, false};
    if (base)
        c.base = (char *)(((uintptr_t)base + WS_ALIGN - 1) & ~(uintptr_t)(WS_ALIGN - 1));
    return c;
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct {
    float *qt;  /* [D][BQ16] Q^T of the unit, times scale*log2(e) */
    float *kp;  /* [BK][D]   the key tile */
    float *vp;  /* [BK][Dv16] the value tile */
    float *st;  /* [BK][BQ16] scores, then probabilities, key-major */
    float *o;   /* [BQ][Dv16] running output */
    float *row; /* [max(D, Dv) padded] conversion row */
    float *m, *l, *alpha; /* [BQ16] */
} fwd_tiles;

typedef struct {
    const problem *p;
    rect_index ix;  /* by query tile */
    int64_t units, q_tiles;
    int64_t *order; /* [q_tiles] the query tiles, most expensive first */
    fwd_tiles *tiles; /* one per thread */
    atomic_llong next;
} fwd_job;

static void fwd_carve(carve *c, const problem *p, fwd_tiles *f)
{
    size_t bq16 = (size_t)cpi_pad16(FWD_BQ), d = (size_t)p->D, dv16 = (size_t)cpi_pad16(p->Dv);
    size_t wide = (size_t)cpi_pad16(p->D > p->Dv ? p->D : p->Dv);
    f->qt = carve_take(c, d * bq16, sizeof(float));
    f->kp = carve_take(c, (size_t)FWD_BK * d, sizeof(float));
    f->vp = carve_take(c, (size_t)FWD_BK * dv16, sizeof(float));
    f->st = carve_take(c, (size_t)FWD_BK * bq16, sizeof(float));
    f->o = carve_take(c, (size_t)FWD_BQ * dv16, sizeof(float));
    f->row = carve_take(c, wide, sizeof(float));
    f->m = carve_take(c, bq16, sizeof(float));
    f->l = carve_take(c, bq16, sizeof(float));
    f->alpha = carve_take(c, bq16, sizeof(float));
}

static int64_t fwd_units(const problem *p, int64_t *q_tiles)
{
    *q_tiles = (p->Sq + FWD_BQ - 1) / FWD_BQ;
    return *q_tiles * p->B * p->H;
}

/* The rows [*ra, *rb) of query tile [i0, i0 + nq) in r, and the keys
 * [*klo, *khi) they see (a band: the first row's first to the last row's
 * last); false if there are none. */
static bool fwd_cover(const rect *r, int64_t i0, int nq, int64_t *ra, int64_t *rb, int64_t *klo, int64_t *khi)
{
    int64_t x;
    *ra = i0 > r->q0 ? i0 : r->q0;
    *rb = i0 + nq < r->q1 ? i0 + nq : r->q1;
    if (*ra >= *rb)
        return false;
    rect_keys(r, *ra, klo, &x);
    rect_keys(r, *rb - 1, &x, khi);
    return *klo < *khi;
}

/* Rows times keys of query tile qt over its rectangles: the order of units. */
static double fwd_tile_cost(const fwd_job *job, int64_t qt)
{
    const problem *p = job->p;
    int64_t i0 = qt * FWD_BQ, ra, rb, klo, khi;
    int nq = (int)(p->Sq - i0 < FWD_BQ ? p->Sq - i0 : FWD_BQ);
    double cost = 0;
    for (int64_t e = job->ix.start[qt]; e < job->ix.start[qt + 1]; e++)
        if (fwd_cover(&job->ix.r[job->ix.list[e]], i0, nq, &ra, &rb, &klo, &khi))
            cost += (double)(rb - ra) * (double)(khi - klo);
    return cost;
}

typedef struct {
    double cost;
    int64_t tile;
} tile_cost;

/* Most expensive first; among equals the later tile (a causal block's
 * last tiles see the most keys). */
static int by_cost(const void *x, const void *y)
{
    const tile_cost *a = x, *b = y;
    if (a->cost != b->cost)
        return a->cost < b->cost ? 1 : -1;
    return a->tile < b->tile ? 1 : a->tile > b->tile ? -1 : 0;
}

static int64_t *fwd_order(const fwd_job *job)
{
    tile_cost *c = cpi_calloc((size_t)job->q_tiles, sizeof *c);
    int64_t *order = cpi_calloc((size_t)job->q_tiles, sizeof *order);
    if (c && order) {
        for (int64_t t = 0; t < job->q_tiles; t++)
            c[t] = (tile_cost){fwd_tile_cost(job, t), t};
        qsort(c, (size_t)job->q_tiles, sizeof *c, by_cost);
        for (int64_t t = 0; t < job->q_tiles; t++)
            order[t] = c[t].tile;
    } else {
        free(order);
        order = NULL;
    }
    free(c);
    return order;
}

/* Whether every query row in [ia, ib) is in r and sees all keys [k0, k1):
 * the first row sees the last key and the last row the first (bands). */
static bool fwd_all_visible(const rect *r, int64_t ia, int64_t ib, int64_t k0, int64_t k1)
{
    int64_t lo, hi, x;
    if (ia < r->q0 || ib > r->q1)
        return false;
    rect_keys(r, ia, &x, &hi);
    rect_keys(r, ib - 1, &lo, &x);
    return hi >= k1 && lo <= k0;
}

/* The columns [va, vb) of query tile i0 that see key j of r, inside the
 * tile's columns [c0, n1). */
static void fwd_seen_by(const rect *r, int64_t j, int64_t i0, int c0, int n1, int *va, int *vb)
{
    int64_t qa, qb;
    rect_queries(r, j, &qa, &qb);
    qa -= i0;
    qb -= i0;
    *va = (int)(qa < c0 ? c0 : qa > n1 ? n1 : qa);
    *vb = (int)(qb < *va ? *va : qb > n1 ? n1 : qb);
}

/* Mask, in a score tile of keys [k0, k0 + nk) (rows, pitch lds) whose first
 * column is the query column c0 of tile i0, the columns up to n1 that do not
 * see the row's key in r: those outside r and outside the key's band. */
static void fwd_mask(const rect *r, float *st, int nk, ptrdiff_t lds, int64_t k0, int64_t i0, int c0, int n1)
{
    for (int j = 0; j < nk; j++) {
        int va, vb;
        fwd_seen_by(r, k0 + j, i0, c0, n1, &va, &vb);
        float *row = st + j * lds - c0;
        for (int i = c0; i < va; i++)
            row[i] = -INFINITY;
        for (int i = vb; i < n1; i++)
            row[i] = -INFINITY;
    }
}

/* Zero the inf and NaN elements of a loaded tile (rows of n floats, pitch
 * ld) and list the rows that held any in bad[]; returns how many. Finite
 * elements stay, so every output a non-finite element does not reach keeps
 * the bits it has without it. */
static int take_nonfinite(const cpi_tile_ops *t, float *tile, int rows, int n, ptrdiff_t ld, int *bad)
{
    int nbad = 0;
    for (int r = 0; r < rows; r++) {
        float *x = tile + r * ld;
        if (t->all_finite(x, (size_t)n))
            continue;
        for (int e = 0; e < n; e++)
            if (!isfinite(x[e]))
                x[e] = 0;
        bad[nbad++] = r;
    }
    return nbad;
}

/* dst[e] += w * x[e] for the non-finite x[e], e < n: the terms of a GEMM
 * that take_nonfinite held back, added by hand where the pair is visible. */
static inline void add_nonfinite(float *dst, float w, const float *x, int n)
{
    for (int e = 0; e < n; e++)
        if (!isfinite(x[e]))
            dst[e] += w * x[e];
}

/* The forward's P V for the non-finite value rows zeroed in the tile: row j
 * adds p * v_j to the query columns in [c0, n1) that see key k0 + j in r. */
static void fwd_fix_values(const problem *p, fwd_tiles *f, const rect *r, int64_t b, int kvh, int64_t i0,
                           int64_t k0, int c0, int n1, const int *bad, int nbad)
{
    const int dv16 = (int)cpi_pad16(p->Dv), bq16 = (int)cpi_pad16(FWD_BQ);
    for (int n = 0; n < nbad; n++) {
        int j = bad[n], va, vb;
        p->t->load(f->row, row_at(&p->v, b, k0 + j, kvh), p->v.t, (size_t)p->Dv, (size_t)p->Dv, 1.0f);
        fwd_seen_by(r, k0 + j, i0, c0, n1, &va, &vb);
        for (int i = va; i < vb; i++)
            add_nonfinite(f->o + (size_t)i * dv16, f->st[(size_t)j * bq16 + i], f->row, p->Dv);
    }
}

/* The keys of rectangle r through the online softmax of query tile i0
 * (nq rows, the tile's Q^T loaded). */
static void fwd_rect(const problem *p, fwd_tiles *f, const rect *r, int64_t b, int kvh, int64_t i0, int nq)
{
    const cpi_tile_ops *t = p->t;
    const int D = p->D, Dv = p->Dv, dv16 = (int)cpi_pad16(Dv), bq16 = (int)cpi_pad16(FWD_BQ);
    int64_t ra, rb, klo, khi, x;
    if (!fwd_cover(r, i0, nq, &ra, &rb, &klo, &khi))
        return;
    for (int64_t k0 = klo; k0 < khi; k0 += FWD_BK) {
        int nk = (int)(khi - k0 < FWD_BK ? khi - k0 : FWD_BK);
        /* the rows of the tile that see any of these keys */
        int64_t qa, qb;
        rect_queries(r, k0, &qa, &x);
        rect_queries(r, k0 + nk - 1, &x, &qb);
        qa = qa > ra ? qa : ra;
        qb = qb < rb ? qb : rb;
        if (qa >= qb)
            continue;
        for (int j = 0; j < nk; j++) {
            t->load(f->kp + (size_t)j * D, row_at(&p->k, b, k0 + j, kvh), p->k.t, (size_t)D, (size_t)D, 1.0f);
            t->load(f->vp + (size_t)j * dv16, row_at(&p->v, b, k0 + j, kvh), p->v.t, (size_t)Dv,
                    (size_t)dv16, 1.0f);
        }
        int bad[FWD_BK];
        int nbad = take_nonfinite(t, f->vp, nk, Dv, dv16, bad);
        /* Only the query columns [c0, c1) of those rows take part in the
         * steps (whole vectors, so the tile stays aligned); the others keep
         * their running softmax. n1: c1 without the padding columns. */
        const int c0 = (int)((qa - i0) / CPI_TILE_PAD * CPI_TILE_PAD), c1 = (int)cpi_pad16(qb - i0);
        const int n1 = c1 < nq ? c1 : nq;
        float *st = f->st + c0;
        t->gemm(nk, c1 - c0, D, f->kp, D, 1, f->qt + c0, bq16, st, bq16, 0);
        if (p->softcap)
            t->softcap(st, nk, c1 - c0, bq16, 1.0f, p->cap_out, NULL);
        if (!fwd_all_visible(r, i0 + c0, i0 + n1, k0, k0 + nk))
            fwd_mask(r, st, nk, bq16, k0, i0, c0, n1);
        t->softmax_fwd(st, nk, c1 - c0, bq16, f->m + c0, f->l + c0, f->alpha + c0);
        t->scale_rows(f->o + (size_t)c0 * dv16, n1 - c0, dv16, dv16, f->alpha + c0);
        t->gemm(n1 - c0, dv16, nk, st, 1, bq16, f->vp, dv16, f->o + (size_t)c0 * dv16, dv16, 1);
        if (nbad)
            fwd_fix_values(p, f, r, b, kvh, i0, k0, c0, n1, bad, nbad);
    }
}

static void fwd_unit(const fwd_job *job, fwd_tiles *f, int64_t b, int h, int64_t qt)
{
    const problem *p = job->p;
    const cpi_tile_ops *t = p->t;
    const int D = p->D, Dv = p->Dv, dv16 = (int)cpi_pad16(Dv), bq16 = (int)cpi_pad16(FWD_BQ);
    const int64_t i0 = qt * FWD_BQ;
    int nq = (int)(p->Sq - i0 < FWD_BQ ? p->Sq - i0 : FWD_BQ);
    /* Columns of the tile in use: a short unit (the last query tile, or a
     * CP block of few tokens) touches only the vectors its queries fill. */
    const int w = (int)cpi_pad16(nq);

    /* Q^T, scaled into base 2 (or by scale / softcap), and by the descales
     * of q and k; padding columns up to w are 0 */
    const int kvh = h / p->G;
    const float qf =
        p->descaled ? (float)(p->qf_exact * descale(p, p->q_descale, h) * descale(p, p->k_descale, kvh)) : p->qf;
    const double vd = p->descaled ? descale(p, p->v_descale, kvh) : 1.0;
    for (int i = 0; i < nq; i++) {
        t->load(f->row, row_at(&p->q, b, i0 + i, h), p->q.t, (size_t)D, (size_t)D, qf);
        for (int d = 0; d < D; d++)
            f->qt[(size_t)d * bq16 + i] = f->row[d];
    }
    if (nq < w)
        for (int d = 0; d < D; d++)
            memset(f->qt + (size_t)d * bq16 + nq, 0, sizeof(float) * (size_t)(w - nq));
    for (int i = 0; i < w; i++) {
        f->m[i] = -INFINITY;
        f->l[i] = 0;
    }
    memset(f->o, 0, sizeof(float) * (size_t)nq * dv16);

    for (int64_t e = job->ix.start[qt]; e < job->ix.start[qt + 1]; e++)
        fwd_rect(p, f, &job->ix.r[job->ix.list[e]], b, kvh, i0, nq);

    /* normalise and write out (or merge into the running result) */
    float *lse = lse_at(p, b, h) + i0;
    float *lse_lo = p->lse_lo ? p->lse_lo + (lse - p->lse) : NULL;
    for (int i = 0; i < nq; i++) {
        float *orow = f->o + (size_t)i * dv16;
        char *dst = row_at(&p->o, b, i0 + i, h);
        float l = f->l[i];
        /* l is NaN after a NaN score (or +inf: inf / inf), and 0 when the
         * row saw no key or only scores of -inf, which weigh exactly 0:
         * such a row contributes nothing to a merge. Kept in double until
         * it is stored: a merge then rounds once */
        int saw = l != 0; /* true for NaN */
        double lse_blk = saw ? ((double)f->m[i] + log2((double)l)) * LN2 : -INFINITY;
        /* v's descale joins the normalisation (rounded once with it) */
        float inv = !saw ? 0.0f : p->descaled ? (float)(vd / l) : 1.0f / l;
        if (!p->accumulate) {
            t->store(dst, p->o.t, orow, (size_t)Dv, inv, 0);
            lse[i] = (float)lse_blk;
        } else if (saw) {
            for (int e = 0; e < Dv; e++)
                orow[e] *= inv;
            cpi_cpu_merge_row(t, dst, p->o.t, &lse[i], lse_lo ? &lse_lo[i] : NULL, orow, lse_blk, Dv, f->row);
        }
    }
}

static void fwd_task(void *arg, int tid, int n)
{
    (void)n;
    fwd_job *job = arg;
    const problem *p = job->p;
    fwd_tiles *f = &job->tiles[tid];
    int64_t per_tile = p->B * p->H;
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (u >= job->units)
            break;
        int64_t bh = u % per_tile;
        fwd_unit(job, f, bh / p->H, (int)(bh % p->H), job->order[u / per_tile]);
    }
}

static int fwd_threads(const cpi_cpu_state *s, const problem *p)
{
    int64_t qt, units = fwd_units(p, &qt);
    int n = cpi_cpu_state_threads(s);
    return units < n ? (int)units : n;
}

static cp_status fwd_layout(const problem *p, int threads, void *base, fwd_tiles *tiles, const char *func,
                            size_t *bytes)
{
    carve c = carve_begin(base);
    for (int i = 0; i < threads; i++) {
        fwd_tiles scratch;
        fwd_carve(&c, p, tiles ? &tiles[i] : &scratch);
    }
    return carve_total(&c, func, bytes);
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct {
    float *kp;  /* [BK][D16] key tile */
    float *kt;  /* [D][BK16] its transpose */
    float *vt;  /* [Dv][BK16] value tile, transposed */
    float *dk;  /* [BK][D16] dK accumulator */
    float *dv;  /* [BK][Dv16] dV accumulator */
    float *qp;  /* [BQ][D16] query tile */
    float *dop; /* [BQ][Dv16] dO tile */
    float *s;   /* [BQ][BK16] scores, then P */
    float *dp;  /* [BQ][BK16] dP, then dS */
    float *dt;  /* [BQ][BK16] 1 - tanh^2 of the softcap (only with one) */
    int *lo, *lim; /* [BQ] each query row's visible keys of the tile: [lo, lim) */
    float *row; /* [max(D, Dv) padded] a non-finite row reloaded (fix_*) */
} bwd_tiles;

/*
 * The key tiles of every (batch, kv head) are cut into `chunks` runs of about
 * equal work; a unit is one run of one (batch, kv head). Run j adds its dQ
 * contributions into dQ slot j, which no other unit of that (batch, kv head)
 * touches, so units can run on any thread in any order and the slots are
 * summed in a fixed order at the end: the result depends on the thread count
 * only through `chunks`. With at least twice as many (batch, kv head) pairs
 * as threads there is one chunk, so dQ costs one fp32 copy.
 */
typedef struct {
    int threads, chunks;
    int64_t units;
} bwd_split;

typedef struct {
    const problem *p;
    bwd_split sp;
    rect_index ix;   /* by key tile */
    int64_t *bounds; /* [chunks + 1] first key tile of each run */
    bwd_tiles *tiles; /* one per thread */
    float *dq;       /* [chunks][B][H][Sq][D16] fp32 dQ partial sums */
    float *drow;     /* [B][H][Sq] rowsum(dO * O) */
    float *lse2;     /* [B][H][Sq] LSE * log2(e), +inf for rows that see no key */
    atomic_llong next;
} bwd_job;

static size_t rows_of(const problem *p)
{
    return (size_t)p->B * (size_t)p->H * (size_t)p->Sq;
}

static int64_t bwd_key_tiles(const problem *p)
{
    return (p->Sk + BWD_BK - 1) / BWD_BK;
}

static bwd_split bwd_plan(const cpi_cpu_state *s, const problem *p)
{
    int64_t groups = p->B * p->Hkv, tiles = bwd_key_tiles(p);
    int t = cpi_cpu_state_threads(s);
    int64_t c = (2 * (int64_t)t + groups - 1) / groups;
    if (c > t)
        c = t;
    if (c > tiles)
        c = tiles;
    bwd_split sp = {t, (int)c, groups * c};
    if (sp.units < t)
        sp.threads = (int)sp.units;
    return sp;
}

/* The keys [*ja, *jb) of the key tile [k0, k0 + nk) in r (which meets it)
 * and the query rows [*qa, *qb) that see any of them; false if none does. */
static bool bwd_cover(const rect *r, int64_t k0, int nk, int64_t *ja, int64_t *jb, int64_t *qa, int64_t *qb)
{
    int64_t x;
    *ja = k0 > r->k0 ? k0 : r->k0;
    *jb = k0 + nk < r->k1 ? k0 + nk : r->k1;
    rect_queries(r, *ja, qa, &x);
    rect_queries(r, *jb - 1, &x, qb);
    return *qa < *qb;
}

/* Work of key tile kt: per rectangle, the query rows that see its keys times
 * the keys (in double: with rectangles the sum may pass int64). */
static double bwd_tile_cost(const bwd_job *job, int64_t kt)
{
    const problem *p = job->p;
    int64_t k0 = kt * BWD_BK, ja, jb, qa, qb;
    int nk = (int)(p->Sk - k0 < BWD_BK ? p->Sk - k0 : BWD_BK);
    double cost = 0;
    for (int64_t e = job->ix.start[kt]; e < job->ix.start[kt + 1]; e++)
        if (bwd_cover(&job->ix.r[job->ix.list[e]], k0, nk, &ja, &jb, &qa, &qb))
            cost += (double)(qb - qa) * (double)(jb - ja);
    return cost;
}

/* bounds[j] = first key tile of run j: about equal shares of the total work,
 * at least one tile each (chunks <= key tiles). */
static void bwd_cut(const bwd_job *job, int chunks, int64_t *bounds)
{
    int64_t tiles = bwd_key_tiles(job->p), kt = 0;
    double total = 0, acc = 0;
    for (int64_t i = 0; i < tiles; i++)
        total += bwd_tile_cost(job, i);
    bounds[0] = 0;
    for (int j = 1; j < chunks; j++) {
        /* run j-1 takes tiles until it has its share, leaving one tile for
         * each later run */
        int64_t last = tiles - (chunks - j);
        do
            acc += bwd_tile_cost(job, kt++);
        while (kt < last && acc * chunks < total * j);
        bounds[j] = kt;
    }
    bounds[chunks] = tiles;
}

static void bwd_carve_tiles(carve *c, const problem *p, bwd_tiles *f)
{
    size_t d16 = (size_t)cpi_pad16(p->D), dv16 = (size_t)cpi_pad16(p->Dv), bk16 = (size_t)cpi_pad16(BWD_BK);
    f->kp = carve_take(c, (size_t)BWD_BK * d16, sizeof(float));
    f->kt = carve_take(c, (size_t)p->D * bk16, sizeof(float));
    f->vt = carve_take(c, (size_t)p->Dv * bk16, sizeof(float));
    f->dk = carve_take(c, (size_t)BWD_BK * d16, sizeof(float));
    f->dv = carve_take(c, (size_t)BWD_BK * dv16, sizeof(float));
    f->qp = carve_take(c, (size_t)BWD_BQ * d16, sizeof(float));
    f->dop = carve_take(c, (size_t)BWD_BQ * dv16, sizeof(float));
    f->s = carve_take(c, (size_t)BWD_BQ * bk16, sizeof(float));
    f->dp = carve_take(c, (size_t)BWD_BQ * bk16, sizeof(float));
    f->dt = p->softcap ? carve_take(c, (size_t)BWD_BQ * bk16, sizeof(float)) : NULL;
    f->lo = carve_take(c, (size_t)BWD_BQ, sizeof(int));
    f->lim = carve_take(c, (size_t)BWD_BQ, sizeof(int));
    f->row = carve_take(c, (size_t)cpi_pad16(p->D > p->Dv ? p->D : p->Dv), sizeof(float));
}

static cp_status bwd_layout(const problem *p, const bwd_split *sp, void *base, bwd_job *job, const char *func,
                            size_t *bytes)
{
    carve c = carve_begin(base);
    size_t rows = rows_of(p), slot_floats = 0, dq_floats = 0;
    if (!cpi_mul(rows, (size_t)cpi_pad16(p->D), &slot_floats) ||
        !cpi_mul(slot_floats, (size_t)sp->chunks, &dq_floats))
        c.overflow = true;
    float *dq = carve_take(&c, dq_floats, sizeof(float));
    float *drow = carve_take(&c, rows, sizeof(float));
    float *lse2 = carve_take(&c, rows, sizeof(float));
    for (int i = 0; i < sp->threads; i++) {
        bwd_tiles scratch;
        bwd_carve_tiles(&c, p, job ? &job->tiles[i] : &scratch);
    }
    if (job) {
        job->dq = dq;
        job->drow = drow;
        job->lse2 = lse2;
    }
    return carve_total(&c, func, bytes);
}

/* An even share [lo, hi) of n items for thread t of nt. */
static void share(int64_t n, int t, int nt, int64_t *lo, int64_t *hi)
{
    *lo = n * t / nt;
    *hi = n * (t + 1) / nt;
}

/* Pass 1: D = rowsum(dO * O), the base-2 LSE, zeroed dQ slots. */
static void bwd_prepare_task(void *arg, int tid, int nt)
{
    bwd_job *job = arg;
    const problem *p = job->p;
    bwd_tiles *f = &job->tiles[tid];
    size_t d16 = (size_t)cpi_pad16(p->D), rows = rows_of(p);
    int64_t lo, hi;
    share((int64_t)rows, tid, nt, &lo, &hi);
    for (int j = 0; j < job->sp.chunks; j++)
        memset(job->dq + ((size_t)j * rows + (size_t)lo) * d16, 0, sizeof(float) * (size_t)(hi - lo) * d16);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i = r % p->Sq, bh = r / p->Sq, b = bh / p->H;
        int h = (int)(bh % p->H);
        float *given = p->drow ? p->drow + (lse_at(p, b, h) - p->lse) + i : NULL;
        if (given && p->drow_ready) {
            job->drow[r] = *given; /* an earlier call over these rows stored it */
        } else {
            /* the dO tile is free here: its first two rows convert dO and O */
            float *x = f->dop, *y = f->dop + cpi_pad16(p->Dv);
            p->t->load(x, row_at(&p->dout, b, i, h), p->dout.t, (size_t)p->Dv, (size_t)p->Dv, 1.0f);
            p->t->load(y, row_at(&p->o, b, i, h), p->o.t, (size_t)p->Dv, (size_t)p->Dv, 1.0f);
            job->drow[r] = p->t->dot(x, y, (size_t)p->Dv);
            if (given)
                *given = job->drow[r];
        }
        float lse = lse_at(p, b, h)[i];
        job->lse2[r] = lse == -INFINITY ? INFINITY : (float)(lse * LOG2E);
    }
}

/* Transpose rows x cols of src (pitch lds) into dst (pitch ldd), zero-padding
 * dst's columns from rows to ldd. */
static void transpose(float *dst, ptrdiff_t ldd, const float *src, ptrdiff_t lds, int rows, int cols)
{
    for (int c = 0; c < cols; c++) {
        float *d = dst + c * ldd;
        for (int r = 0; r < rows; r++)
            d[r] = src[r * lds + c];
        for (ptrdiff_t r = rows; r < ldd; r++)
            d[r] = 0;
    }
}

static void bwd_store_tile(const problem *p, const tview *dst, const float *acc, ptrdiff_t ld, int64_t b,
                           int64_t k0, int nk, int kvh, int width)
{
    for (int j = 0; j < nk; j++)
        p->t->store(row_at(dst, b, k0 + j, kvh), dst->t, acc + j * ld, (size_t)width, 1.0f,
                    p->grad_accumulate);
}

/*
 * The backward's GEMM terms of the non-finite rows zeroed in the tiles, each
 * added only where its pair is visible: dV_j += P_ij dO_i and dK_j += dS_ij Q_i
 * for the keys lo[i] <= j < lim[i] of a bad query row i, dQ_i += dS_ij K_j for
 * the rows i that see a bad key row j.
 */
typedef struct {
    int q[BWD_BQ], dout[BWD_BQ], k[BWD_BK]; /* rows zeroed in qp, dop, kp */
    int nq, ndout, nk;
} bwd_bad;

static void bwd_fix(const problem *p, bwd_tiles *f, const bwd_bad *bad, int64_t b, int h, int kvh, int64_t i0,
                    int64_t k0, int nq, int bk16, float *dq_rows)
{
    const cpi_tile_ops *t = p->t;
    const int D = p->D, Dv = p->Dv, d16 = (int)cpi_pad16(D), dv16 = (int)cpi_pad16(Dv);
    for (int n = 0; n < bad->ndout; n++) {
        int i = bad->dout[n];
        t->load(f->row, row_at(&p->dout, b, i0 + i, h), p->dout.t, (size_t)Dv, (size_t)Dv, 1.0f);
        for (int j = f->lo[i]; j < f->lim[i]; j++)
            add_nonfinite(f->dv + (size_t)j * dv16, f->s[(size_t)i * bk16 + j], f->row, Dv);
    }
    for (int n = 0; n < bad->nq; n++) {
        int i = bad->q[n];
        t->load(f->row, row_at(&p->q, b, i0 + i, h), p->q.t, (size_t)D, (size_t)D, 1.0f);
        for (int j = f->lo[i]; j < f->lim[i]; j++)
            add_nonfinite(f->dk + (size_t)j * d16, f->dp[(size_t)i * bk16 + j], f->row, D);
    }
    for (int n = 0; n < bad->nk; n++) {
        int j = bad->k[n];
        t->load(f->row, row_at(&p->k, b, k0 + j, kvh), p->k.t, (size_t)D, (size_t)D, 1.0f);
        for (int i = 0; i < nq; i++)
            if (j >= f->lo[i] && j < f->lim[i])
                add_nonfinite(dq_rows + (size_t)i * d16, f->dp[(size_t)i * bk16 + j], f->row, D);
    }
}

/* Query rows [i0, i0 + nq) of head h against the loaded key tile [k0, k0 +
 * nk) within rectangle r: dK, dV into the tile's accumulators, dQ into
 * dq_slot. bad->nk lists the tile's non-finite key rows. */
static void bwd_query_tile(const bwd_job *job, bwd_tiles *f, bwd_bad *bad, const rect *r, int64_t b, int h,
                           int kvh, int64_t i0, int nq, int64_t k0, int nk, float *dq_slot)
{
    const problem *p = job->p;
    const cpi_tile_ops *t = p->t;
    const int D = p->D, Dv = p->Dv, d16 = (int)cpi_pad16(D), dv16 = (int)cpi_pad16(Dv), bk16 = (int)cpi_pad16(nk);
    const size_t bh_row = ((size_t)b * p->H + (size_t)h) * (size_t)p->Sq;
    /* keys [first, kv) hold every row's visible ones */
    int first = nk, kv = 0;
    for (int i = 0; i < nq; i++) {
        t->load(f->qp + (size_t)i * d16, row_at(&p->q, b, i0 + i, h), p->q.t, (size_t)D, (size_t)d16, 1.0f);
        t->load(f->dop + (size_t)i * dv16, row_at(&p->dout, b, i0 + i, h), p->dout.t, (size_t)Dv, (size_t)dv16,
                1.0f);
        int64_t lo, hi;
        rect_keys(r, i0 + i, &lo, &hi);
        lo -= k0;
        hi -= k0;
        f->lo[i] = (int)(lo < 0 ? 0 : lo > nk ? nk : lo);
        f->lim[i] = (int)(hi < 0 ? 0 : hi > nk ? nk : hi);
        if (f->lo[i] < f->lim[i]) {
            first = f->lo[i] < first ? f->lo[i] : first;
            kv = f->lim[i] > kv ? f->lim[i] : kv;
        }
    }
    if (kv == 0)
        return;
    /* the steps below start at j0, a whole vector of S before the first key */
    const int j0 = first / CPI_TILE_PAD * CPI_TILE_PAD, kv16 = (int)cpi_pad16(kv);
    for (int i = 0; i < nq; i++)
        if (f->lo[i] >= f->lim[i])
            f->lo[i] = f->lim[i] = j0;
    /* S = Q K^T, dP = dO V^T; P and dS = scale * P * (dP - D) */
    t->gemm(nq, kv16 - j0, D, f->qp, d16, 1, f->kt + j0, bk16, f->s + j0, bk16, 0);
    t->gemm(nq, kv16 - j0, Dv, f->dop, dv16, 1, f->vt + j0, bk16, f->dp + j0, bk16, 0);
    if (p->softcap)
        t->softcap(f->s + j0, nq, kv16 - j0, bk16, p->cap_in, p->cap, f->dt + j0);
    t->softmax_bwd(f->s, f->dp, nq, j0, kv16, bk16, f->lo, f->lim, p->sf, p->scale, job->lse2 + bh_row + i0,
                   job->drow + bh_row + i0, p->softcap ? f->dt : NULL);
    /* Q and dO have served the scores; the products below get their
     * non-finite rows by hand */
    bad->nq = take_nonfinite(t, f->qp, nq, D, d16, bad->q);
    bad->ndout = take_nonfinite(t, f->dop, nq, Dv, dv16, bad->dout);
    /* dV += P^T dO, dK += dS^T Q, dQ += dS K */
    float *dq_rows = dq_slot + (bh_row + (size_t)i0) * d16;
    t->gemm(kv - j0, dv16, nq, f->s + j0, 1, bk16, f->dop, dv16, f->dv + (size_t)j0 * dv16, dv16, 1);
    t->gemm(kv - j0, d16, nq, f->dp + j0, 1, bk16, f->qp, d16, f->dk + (size_t)j0 * d16, d16, 1);
    t->gemm(nq, d16, kv - j0, f->dp + j0, bk16, 1, f->kp + (size_t)j0 * d16, d16, dq_rows, d16, 1);
    if (bad->nq || bad->ndout || bad->nk)
        bwd_fix(p, f, bad, b, h, kvh, i0, k0, nq, bk16, dq_rows);
}

/* dK and dV of key tile kt of (b, kvh), and its share of dQ into dq_slot. */
static void bwd_key_tile(const bwd_job *job, bwd_tiles *f, int64_t b, int kvh, int64_t kt, float *dq_slot)
{
    const problem *p = job->p;
    const cpi_tile_ops *t = p->t;
    const rect_index *ix = &job->ix;
    const int D = p->D, Dv = p->Dv, d16 = (int)cpi_pad16(D), dv16 = (int)cpi_pad16(Dv);
    int64_t k0 = kt * BWD_BK;
    int nk = (int)(p->Sk - k0 < BWD_BK ? p->Sk - k0 : BWD_BK);
    int bk16 = (int)cpi_pad16(nk);

    if (bwd_tile_cost(job, kt) == 0) {
        /* no query sees these keys: zero gradients, or nothing to add */
        if (!p->grad_accumulate) {
            memset(f->dk, 0, sizeof(float) * (size_t)nk * d16);
            memset(f->dv, 0, sizeof(float) * (size_t)nk * dv16);
            bwd_store_tile(p, &p->dk, f->dk, d16, b, k0, nk, kvh, D);
            bwd_store_tile(p, &p->dv, f->dv, dv16, b, k0, nk, kvh, Dv);
        }
        return;
    }

    /* K, K^T and V^T once for all query tiles; V passes through dV's tile.
     * Rows in no rectangle are zeros: no query sees them, and the caller
     * need not have filled them (a NaN there must not reach a product). */
    bool in[BWD_BK] = {false};
    for (int64_t e = ix->start[kt]; e < ix->start[kt + 1]; e++) {
        const rect *r = &ix->r[ix->list[e]];
        for (int64_t j = r->k0 > k0 ? r->k0 : k0; j < r->k1 && j < k0 + nk; j++)
            in[j - k0] = true;
    }
    for (int j = 0; j < nk; j++) {
        if (!in[j]) {
            memset(f->kp + (size_t)j * d16, 0, sizeof(float) * (size_t)d16);
            memset(f->dv + (size_t)j * dv16, 0, sizeof(float) * (size_t)dv16);
            continue;
        }
        t->load(f->kp + (size_t)j * d16, row_at(&p->k, b, k0 + j, kvh), p->k.t, (size_t)D, (size_t)d16, 1.0f);
        t->load(f->dv + (size_t)j * dv16, row_at(&p->v, b, k0 + j, kvh), p->v.t, (size_t)Dv, (size_t)dv16, 1.0f);
    }
    transpose(f->kt, bk16, f->kp, d16, nk, D);
    transpose(f->vt, bk16, f->dv, dv16, nk, Dv);
    /* K^T keeps them for the scores; the dQ product gets them by hand */
    bwd_bad bad;
    bad.nk = take_nonfinite(t, f->kp, nk, D, d16, bad.k);
    memset(f->dk, 0, sizeof(float) * (size_t)nk * d16);
    memset(f->dv, 0, sizeof(float) * (size_t)nk * dv16);

    for (int h = kvh * p->G; h < (kvh + 1) * p->G; h++)
        for (int64_t e = ix->start[kt]; e < ix->start[kt + 1]; e++) {
            const rect *r = &ix->r[ix->list[e]];
            int64_t ja, jb, qa, qb;
            if (!bwd_cover(r, k0, nk, &ja, &jb, &qa, &qb))
                continue;
            for (int64_t i0 = qa; i0 < qb; i0 += BWD_BQ) {
                int nq = (int)(qb - i0 < BWD_BQ ? qb - i0 : BWD_BQ);
                bwd_query_tile(job, f, &bad, r, b, h, kvh, i0, nq, k0, nk, dq_slot);
            }
        }
    bwd_store_tile(p, &p->dk, f->dk, d16, b, k0, nk, kvh, D);
    bwd_store_tile(p, &p->dv, f->dv, dv16, b, k0, nk, kvh, Dv);
}

/* Pass 2: units handed out dynamically. */
static void bwd_main_task(void *arg, int tid, int nt)
{
    (void)nt;
    bwd_job *job = arg;
    const problem *p = job->p;
    size_t slot_floats = rows_of(p) * (size_t)cpi_pad16(p->D);
    for (;;) {
        int64_t u = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (u >= job->sp.units)
            break;
        int j = (int)(u % job->sp.chunks);
        int64_t g = u / job->sp.chunks, b = g / p->Hkv;
        int kvh = (int)(g % p->Hkv);
        for (int64_t kt = job->bounds[j]; kt < job->bounds[j + 1]; kt++)
            bwd_key_tile(job, &job->tiles[tid], b, kvh, kt, job->dq + (size_t)j * slot_floats);
    }
}

/* Pass 3: dq = (dq +) the sum of the dQ slots, in slot order. */
static void bwd_reduce_task(void *arg, int tid, int nt)
{
    bwd_job *job = arg;
    const problem *p = job->p;
    size_t d16 = (size_t)cpi_pad16(p->D), rows = rows_of(p);
    int64_t lo, hi;
    share((int64_t)rows, tid, nt, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i = r % p->Sq, bh = r / p->Sq, b = bh / p->H;
        int h = (int)(bh % p->H);
        float *sum = job->dq + (size_t)r * d16;
        for (int j = 1; j < job->sp.chunks; j++) {
            const float *x = job->dq + ((size_t)j * rows + (size_t)r) * d16;
            for (int d = 0; d < p->D; d++)
                sum[d] += x[d];
        }
        p->t->store(row_at(&p->dq, b, i, h), p->dq.t, sum, (size_t)p->D, 1.0f, p->grad_accumulate);
    }
}

/* ------------------------------------------------------------------------ */
/* Entry points                                                             */
/* ------------------------------------------------------------------------ */

cp_status cpi_cpu_attn_workspace_size(void *state, const cp_kernel_attn_args *a, int backward, size_t *bytes)
{
    cpi_cpu_state *s = state;
    problem p = make_problem(cpi_cpu_state_tiles(s), a, backward);
    const char *func = "cp_kernel_attn_workspace_size";
    if (backward) {
        bwd_split sp = bwd_plan(s, &p);
        return bwd_layout(&p, &sp, NULL, NULL, func, bytes);
    }
    return fwd_layout(&p, fwd_threads(s, &p), NULL, NULL, func, bytes);
}

/* The caller's workspace, or one of our own when it passed none. */
static cp_status get_workspace(const cp_kernel_attn_args *a, size_t need, const char *func, void **base,
                               void **owned)
{
    *owned = NULL;
    if (a->workspace) {
        if (a->workspace_bytes < need)
            return cpi_error(CP_ERROR_INVALID_ARGUMENT,
                             "%s: workspace_bytes = %zu (this call needs %zu; see "
                             "cp_kernel_attn_workspace_size)",
                             func, a->workspace_bytes, need);
        *base = a->workspace;
        return CP_SUCCESS;
    }
    *owned = malloc(need);
    if (!*owned)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of memory allocating a %zu-byte workspace", func,
                         need);
    *base = *owned;
    return CP_SUCCESS;
}

cp_status cpi_cpu_attn_forward(void *state, const cp_kernel_attn_args *a)
{
    const char *func = "cp_kernel_attn_forward";
    cpi_cpu_state *s = state;
    problem p = make_problem(cpi_cpu_state_tiles(s), a, 0);
    int threads = fwd_threads(s, &p);
    size_t need = 0;
    CPI_TRY(fwd_layout(&p, threads, NULL, NULL, func, &need));
    fwd_job job = {.p = &p};
    job.units = fwd_units(&p, &job.q_tiles);
    CPI_TRY(rect_index_build(&p, a, false, FWD_BQ, &job.ix, func));
    job.order = fwd_order(&job);
    job.tiles = cpi_calloc((size_t)threads, sizeof *job.tiles);
    void *base = NULL, *owned = NULL;
    cp_status st = job.order && job.tiles ? get_workspace(a, need, func, &base, &owned) : CP_ERROR_OUT_OF_MEMORY;
    if (st == CP_SUCCESS) {
        fwd_layout(&p, threads, base, job.tiles, func, &need);
        atomic_init(&job.next, 0);
        cpi_cpu_parallel(s, threads, fwd_task, &job);
    }
    free(owned);
    free(job.tiles);
    free(job.order);
    rect_index_free(&job.ix);
    return st;
}

cp_status cpi_cpu_attn_backward(void *state, const cp_kernel_attn_args *a)
{
    const char *func = "cp_kernel_attn_backward";
    cpi_cpu_state *s = state;
    problem p = make_problem(cpi_cpu_state_tiles(s), a, 1);
    bwd_job job = {.p = &p, .sp = bwd_plan(s, &p)};
    size_t need = 0;
    CPI_TRY(bwd_layout(&p, &job.sp, NULL, NULL, func, &need));
    CPI_TRY(rect_index_build(&p, a, true, BWD_BK, &job.ix, func));
    job.tiles = cpi_calloc((size_t)job.sp.threads, sizeof *job.tiles);
    job.bounds = cpi_calloc((size_t)job.sp.chunks + 1, sizeof *job.bounds);
    void *base = NULL, *owned = NULL;
    cp_status st = job.tiles && job.bounds ? get_workspace(a, need, func, &base, &owned) : CP_ERROR_OUT_OF_MEMORY;
    if (st == CP_SUCCESS) {
        bwd_layout(&p, &job.sp, base, &job, func, &need);
        bwd_cut(&job, job.sp.chunks, job.bounds);
        atomic_init(&job.next, 0);
        cpi_cpu_parallel(s, job.sp.threads, bwd_prepare_task, &job);
        cpi_cpu_parallel(s, job.sp.threads, bwd_main_task, &job);
        cpi_cpu_parallel(s, job.sp.threads, bwd_reduce_task, &job);
    }
    free(owned);
    free(job.bounds);
    free(job.tiles);
    rect_index_free(&job.ix);
    return st;
}
