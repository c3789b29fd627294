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
 * Forward: one work unit per (batch, head, tile of FWD_BQ query rows); each
 * streams the visible key tiles of FWD_BK rows through an online softmax.
 * Units are handed out dynamically (an atomic counter), most expensive first;
 * each row is computed by one thread in a fixed order, so the result does
 * not depend on the thread count.
 *
 * Backward: the work of one (batch, kv head, tile of BWD_BK key rows) owns
 * dK and dV of its keys (all query heads of the GQA group add into them) and
 * walks over the visible query tiles, recomputing P from Q, K and LSE. dQ
 * gets contributions from every key tile: the key tiles of each (batch, kv
 * head) are cut into a few runs of equal work, each run adds into its own
 * fp32 dQ slot, and a last pass sums the slots in a fixed order (see
 * bwd_split). Runs are handed out dynamically; for a given thread count the
 * result is deterministic.
 *
 * Workspace (exact, see carve_*): forward: per thread one set of tiles;
 * backward: per thread one set of tiles, `chunks` fp32 dQ slots of
 * batch * num_heads * seq_q * pad16(head_dim) floats (one slot unless there
 * are fewer than 2 * threads (batch, kv head) pairs), and two floats per
 * query row (D = rowsum(dO * O) and the base-2 LSE). Nothing grows with
 * seq_q * seq_k.
 */
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
    int64_t delta; /* q_offset - k_offset: key j is visible to query i iff j <= i + delta */
    int H, Hkv, G, D, Dv;
    int causal;
    float scale; /* softmax scale */
    float c;     /* scale * log2(e) */
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
    p.delta = a->q_offset - a->k_offset;
    p.H = a->num_heads;
    p.Hkv = a->num_kv_heads;
    p.G = a->num_heads / a->num_kv_heads;
    p.D = a->head_dim;
    p.Dv = a->head_dim_v;
    p.causal = a->mask == CP_MASK_CAUSAL;
    p.scale = (float)a->softmax_scale;
    p.c = (float)(a->softmax_scale * LOG2E);
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

/* Keys [0, n) of the block visible to query row i (all of them unmasked). */
static inline int64_t visible_keys(const problem *p, int64_t i)
{
    if (!p->causal)
        return p->Sk;
    int64_t n = i + p->delta + 1;
    return n < 0 ? 0 : n > p->Sk ? p->Sk : n;
}

/* First query row that sees key j (Sq if none). */
static inline int64_t first_query(const problem *p, int64_t j)
{
    if (!p->causal)
        return 0;
    int64_t i = j - p->delta;
    return i < 0 ? 0 : i > p->Sq ? p->Sq : i;
}

static inline float *lse_at(const problem *p, int64_t b, int64_t h)
{
    return p->lse + b * p->lse_sb + h * p->lse_sh;
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
    int64_t units, q_tiles;
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

/* Mask the scores of keys j (rows, pitch lds) hidden from queries i (ncols
 * columns) in a tile whose first key is k0 and first query i0: query i sees
 * key j iff j <= i + delta, so row j hides the columns i < j - delta - i0. */
static void fwd_mask(const problem *p, float *st, int nk, ptrdiff_t lds, int ncols, int64_t k0, int64_t i0)
{
    for (int j = 0; j < nk; j++) {
        int64_t hide = k0 + j - p->delta - i0;
        if (hide <= 0)
            continue;
        if (hide > ncols)
            hide = ncols;
        for (int64_t i = 0; i < hide; i++)
            st[j * lds + i] = -INFINITY;
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
 * adds p * v_j to the query columns [c0, nq) that see key k0 + j. */
static void fwd_fix_values(const problem *p, fwd_tiles *f, int64_t b, int kvh, int64_t i0, int64_t k0,
                           int c0, int nq, const int *bad, int nbad)
{
    const int dv16 = (int)cpi_pad16(p->Dv), bq16 = (int)cpi_pad16(FWD_BQ);
    for (int n = 0; n < nbad; n++) {
        int j = bad[n];
        p->t->load(f->row, row_at(&p->v, b, k0 + j, kvh), p->v.t, (size_t)p->Dv, (size_t)p->Dv, 1.0f);
        for (int i = c0; i < nq; i++)
            if (k0 + j < visible_keys(p, i0 + i))
                add_nonfinite(f->o + (size_t)i * dv16, f->st[(size_t)j * bq16 + i], f->row, p->Dv);
    }
}

static void fwd_unit(const problem *p, fwd_tiles *f, int64_t b, int h, int64_t i0)
{
    const cpi_tile_ops *t = p->t;
    const int D = p->D, Dv = p->Dv, dv16 = (int)cpi_pad16(Dv), bq16 = (int)cpi_pad16(FWD_BQ);
    const int kvh = h / p->G;
    int nq = (int)(p->Sq - i0 < FWD_BQ ? p->Sq - i0 : FWD_BQ);
    /* Columns of the tile in use: a short unit (the last query tile, or a
     * CP block of few tokens) touches only the vectors its queries fill. */
    const int w = (int)cpi_pad16(nq);

    /* Q^T, scaled into base 2; padding columns up to w are 0 */
    for (int i = 0; i < nq; i++) {
        t->load(f->row, row_at(&p->q, b, i0 + i, h), p->q.t, (size_t)D, (size_t)D, p->c);
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

    int64_t kend = visible_keys(p, i0 + nq - 1);
    for (int64_t k0 = 0; k0 < kend; k0 += FWD_BK) {
        int nk = (int)(kend - k0 < FWD_BK ? kend - k0 : FWD_BK);
        for (int j = 0; j < nk; j++) {
            t->load(f->kp + (size_t)j * D, row_at(&p->k, b, k0 + j, kvh), p->k.t, (size_t)D, (size_t)D, 1.0f);
            t->load(f->vp + (size_t)j * dv16, row_at(&p->v, b, k0 + j, kvh), p->v.t, (size_t)Dv,
                    (size_t)dv16, 1.0f);
        }
        int bad[FWD_BK];
        int nbad = take_nonfinite(t, f->vp, nk, Dv, dv16, bad);
        /* Under the causal mask the query columns before c0 see none of
         * these keys: leave them out of every step (a whole number of
         * vectors, so the tile stays aligned). */
        int c0 = 0;
        if (p->causal && k0 - p->delta - i0 > 0) {
            int64_t hidden = (k0 - p->delta - i0) / CPI_TILE_PAD * CPI_TILE_PAD;
            c0 = (int)(hidden < nq ? hidden : nq); /* < nq: the last query sees key k0 */
        }
        float *st = f->st + c0;
        t->gemm(nk, w - c0, D, f->kp, D, 1, f->qt + c0, bq16, st, bq16, 0);
        if (p->causal && k0 + nk - 1 > i0 + c0 + p->delta)
            fwd_mask(p, st, nk, bq16, w - c0, k0, i0 + c0);
        t->softmax_fwd(st, nk, w - c0, bq16, f->m + c0, f->l + c0, f->alpha + c0);
        t->scale_rows(f->o + (size_t)c0 * dv16, nq - c0, dv16, dv16, f->alpha + c0);
        t->gemm(nq - c0, dv16, nk, st, 1, bq16, f->vp, dv16, f->o + (size_t)c0 * dv16, dv16, 1);
        if (nbad)
            fwd_fix_values(p, f, b, kvh, i0, k0, c0, nq, bad, nbad);
    }

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
        float inv = saw ? 1.0f / l : 0.0f;
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
        /* last query tiles first: under a causal mask they see the most keys */
        int64_t qt = job->q_tiles - 1 - u / per_tile;
        int64_t bh = u % per_tile;
        fwd_unit(p, f, bh / p->H, (int)(bh % p->H), qt * FWD_BQ);
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
    int *lim;   /* [BQ] visible keys per query row */
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

/* Work of key tile kt: the query rows that see its first key, times its keys. */
static int64_t bwd_tile_cost(const problem *p, int64_t kt)
{
    int64_t k0 = kt * BWD_BK, nk = p->Sk - k0 < BWD_BK ? p->Sk - k0 : BWD_BK;
    return (p->Sq - first_query(p, k0)) * nk;
}

/* bounds[j] = first key tile of run j: about equal shares of the total work,
 * at least one tile each (chunks <= key tiles). */
static void bwd_cut(const problem *p, int chunks, int64_t *bounds)
{
    int64_t tiles = bwd_key_tiles(p), total = 0, acc = 0, kt = 0;
    for (int64_t i = 0; i < tiles; i++)
        total += bwd_tile_cost(p, i);
    bounds[0] = 0;
    for (int j = 1; j < chunks; j++) {
        /* run j-1 takes tiles until it has its share, leaving one tile for
         * each later run */
        int64_t last = tiles - (chunks - j);
        do
            acc += bwd_tile_cost(p, kt++);
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
 * for keys j < lim[i] of a bad query row i, dQ_i += dS_ij K_j for the rows i
 * that see a bad key row j.
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
        for (int j = 0; j < f->lim[i]; j++)
            add_nonfinite(f->dv + (size_t)j * dv16, f->s[(size_t)i * bk16 + j], f->row, Dv);
    }
    for (int n = 0; n < bad->nq; n++) {
        int i = bad->q[n];
        t->load(f->row, row_at(&p->q, b, i0 + i, h), p->q.t, (size_t)D, (size_t)D, 1.0f);
        for (int j = 0; j < f->lim[i]; j++)
            add_nonfinite(f->dk + (size_t)j * d16, f->dp[(size_t)i * bk16 + j], f->row, D);
    }
    for (int n = 0; n < bad->nk; n++) {
        int j = bad->k[n];
        t->load(f->row, row_at(&p->k, b, k0 + j, kvh), p->k.t, (size_t)D, (size_t)D, 1.0f);
        for (int i = 0; i < nq; i++)
            if (j < f->lim[i])
                add_nonfinite(dq_rows + (size_t)i * d16, f->dp[(size_t)i * bk16 + j], f->row, D);
    }
}

/* dK and dV of key tile kt of (b, kvh), and its share of dQ into dq_slot. */
static void bwd_key_tile(const bwd_job *job, bwd_tiles *f, int64_t b, int kvh, int64_t kt, float *dq_slot)
{
    const problem *p = job->p;
    const cpi_tile_ops *t = p->t;
    const int D = p->D, Dv = p->Dv, d16 = (int)cpi_pad16(D), dv16 = (int)cpi_pad16(Dv);
    int64_t k0 = kt * BWD_BK;
    int nk = (int)(p->Sk - k0 < BWD_BK ? p->Sk - k0 : BWD_BK);
    int bk16 = (int)cpi_pad16(nk);

    int64_t i_first = first_query(p, k0);
    if (i_first >= p->Sq) {
        /* no query sees these keys: zero gradients, or nothing to add */
        if (!p->grad_accumulate) {
            memset(f->dk, 0, sizeof(float) * (size_t)nk * d16);
            memset(f->dv, 0, sizeof(float) * (size_t)nk * dv16);
            bwd_store_tile(p, &p->dk, f->dk, d16, b, k0, nk, kvh, D);
            bwd_store_tile(p, &p->dv, f->dv, dv16, b, k0, nk, kvh, Dv);
        }
        return;
    }

    /* K, K^T and V^T once for all query tiles; V passes through dV's tile */
    for (int j = 0; j < nk; j++) {
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

    for (int h = kvh * p->G; h < (kvh + 1) * p->G; h++) {
        size_t bh_row = ((size_t)b * p->H + (size_t)h) * (size_t)p->Sq;
        for (int64_t i0 = i_first; i0 < p->Sq; i0 += BWD_BQ) {
            int nq = (int)(p->Sq - i0 < BWD_BQ ? p->Sq - i0 : BWD_BQ);
            int kv = 0; /* keys [kv, nk) are hidden from every row of this tile */
            for (int i = 0; i < nq; i++) {
                t->load(f->qp + (size_t)i * d16, row_at(&p->q, b, i0 + i, h), p->q.t, (size_t)D, (size_t)d16, 1.0f);
                t->load(f->dop + (size_t)i * dv16, row_at(&p->dout, b, i0 + i, h), p->dout.t, (size_t)Dv,
                        (size_t)dv16, 1.0f);
                int64_t vis = visible_keys(p, i0 + i) - k0;
                f->lim[i] = (int)(vis < 0 ? 0 : vis > nk ? nk : vis);
                kv = f->lim[i] > kv ? f->lim[i] : kv;
            }
            int kv16 = (int)cpi_pad16(kv);
            /* S = Q K^T, dP = dO V^T; P and dS = scale * P * (dP - D) */
            t->gemm(nq, kv16, D, f->qp, d16, 1, f->kt, bk16, f->s, bk16, 0);
            t->gemm(nq, kv16, Dv, f->dop, dv16, 1, f->vt, bk16, f->dp, bk16, 0);
            t->softmax_bwd(f->s, f->dp, nq, kv16, bk16, f->lim, p->c, p->scale, job->lse2 + bh_row + i0,
                           job->drow + bh_row + i0);
            /* Q and dO have served the scores; the products below get their
             * non-finite rows by hand */
            bad.nq = take_nonfinite(t, f->qp, nq, D, d16, bad.q);
            bad.ndout = take_nonfinite(t, f->dop, nq, Dv, dv16, bad.dout);
            /* dV += P^T dO, dK += dS^T Q, dQ += dS K */
            float *dq_rows = dq_slot + (bh_row + (size_t)i0) * d16;
            t->gemm(kv, dv16, nq, f->s, 1, bk16, f->dop, dv16, f->dv, dv16, 1);
            t->gemm(kv, d16, nq, f->dp, 1, bk16, f->qp, d16, f->dk, d16, 1);
            t->gemm(nq, d16, kv, f->dp, bk16, 1, f->kp, d16, dq_rows, d16, 1);
            if (bad.nq || bad.ndout || bad.nk)
                bwd_fix(p, f, &bad, b, h, kvh, i0, k0, nq, bk16, dq_rows);
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
    cpi_cpu_state *s = state;
    problem p = make_problem(cpi_cpu_state_tiles(s), a, 0);
    int threads = fwd_threads(s, &p);
    size_t need = 0;
    CPI_TRY(fwd_layout(&p, threads, NULL, NULL, "cp_kernel_attn_forward", &need));
    fwd_tiles *tiles = cpi_calloc((size_t)threads, sizeof *tiles);
    if (!tiles)
        return CP_ERROR_OUT_OF_MEMORY;
    void *base = NULL, *owned = NULL;
    cp_status st = get_workspace(a, need, "cp_kernel_attn_forward", &base, &owned);
    if (st == CP_SUCCESS) {
        fwd_layout(&p, threads, base, tiles, "cp_kernel_attn_forward", &need);
        fwd_job job = {.p = &p, .tiles = tiles};
        job.units = fwd_units(&p, &job.q_tiles);
        atomic_init(&job.next, 0);
        cpi_cpu_parallel(s, threads, fwd_task, &job);
    }
    free(owned);
    free(tiles);
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
    job.tiles = cpi_calloc((size_t)job.sp.threads, sizeof *job.tiles);
    job.bounds = cpi_calloc((size_t)job.sp.chunks + 1, sizeof *job.bounds);
    void *base = NULL, *owned = NULL;
    cp_status st = job.tiles && job.bounds ? get_workspace(a, need, func, &base, &owned) : CP_ERROR_OUT_OF_MEMORY;
    if (st == CP_SUCCESS) {
        bwd_layout(&p, &job.sp, base, &job, func, &need);
        bwd_cut(&p, job.sp.chunks, job.bounds);
        atomic_init(&job.next, 0);
        cpi_cpu_parallel(s, job.sp.threads, bwd_prepare_task, &job);
        cpi_cpu_parallel(s, job.sp.threads, bwd_main_task, &job);
        cpi_cpu_parallel(s, job.sp.threads, bwd_reduce_task, &job);
    }
    free(owned);
    free(job.bounds);
    free(job.tiles);
    return st;
}
