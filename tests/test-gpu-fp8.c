/* SPDX-License-Identifier: MIT */
/*
 * The CUDA FP8 (E4M3) forward, cp_kernel_attn_forward with dtype
 * CP_DTYPE_FP8_E4M3, on a real GPU against an FP64 model written here.
 *
 * The model works on the FP8 codes the device gets, decoded exactly by
 * storage.c's decoder (written from the format's definition, apart from the
 * library's), times their descales: for query row i of batch b and head h
 * (kv head hk = h / (H / Hkv)) over the keys j it sees,
 *     s_ij = scale * qd_h * kd_hk * sum_d q[b,i,h,d] k[b,j,hk,d]
 *     P_ij = exp(s_ij - max_j s_ij)
 *     O[b,i,h,:] = vd_hk * sum_j P_ij v[b,j,hk,:] / sum_j P_ij
 *     LSE = max_j s_ij + log(sum_j P_ij)          (natural log)
 * Key j is visible to row i under the causal mask iff its global position
 * is at most the row's: k_offset + j <= q_offset + i (the library's
 * convention, infinicp.h; a block with Sk > Sq aligned bottom-right is
 * q_offset = Sk - Sq). A row that sees no key has O = 0 exactly and
 * LSE = -inf.
 *
 * The bounds are per element, from the model, and hold for both CUDA paths:
 * the SIMT kernels (fp32 throughout) and Hopper's FP8 tensor-core kernel,
 * which rounds the probabilities (each in (0, 1] relative to the running
 * row maximum) to E4M3 before the P V product (fp32 accumulation) and sums
 * the row's l from the unrounded fp32 values. With P_ij relative to the
 * final maximum (a running maximum is never larger, so its P are never
 * smaller: the rounding error in final units is no larger than this):
 *     |O - O_ref|[i,d] <= ( sum_j max(2^-4 P_ij, 2^-10) |v_jd| vd
 *                           + 2^-9 sum_j P_ij |v_jd| vd ) / sum_j P_ij
 *                         + (o BF16 ? 2^-8 |O_ref[i,d]| : 0) + 1e-6
 *   2^-4   E4M3 keeps 4 significant bits: rounding P to nearest is within
 *          2^-4 relative (the error of the numerator; l is exact);
 *   2^-10  half the E4M3 subnormal spacing 2^-9: P below 2^-6 are rounded
 *          absolutely, not relatively (and tiny P may become 0);
 *   2^-9   fp32 / tensor-core accumulation of the products and of l, the
 *          fp32 scores and exponentials, the rescaling by running maxima
 *          and the merge of two calls, relative to sum P |v|;
 *   2^-8   rounding the result to BF16 (half a unit of 8 significant
 *          bits);
 *   1e-6   room for results that are exactly 0.
 * The LSE: |lse - ref| <= 2^-10 max_j (|scale qd kd| sum_d |q_d k_d|)
 * + 2e-5 (1 + |ref|) (scores in fp32, the float result). Wrong
 * probabilities, a wrong V permutation or wrong descales give errors of
 * the order of |O| itself, above these bounds (max err / bound is printed
 * for every run). Over many keys of nearly equal weight the bounds, which
 * add worst cases, approach |O| too; so each run's relative RMS error must
 * also stay below 0.1 (E4M3 probabilities give 0.01 to 0.03, fp32 1e-6).
 *
 * What runs: a table of cases (head dims 64, 96, 128; MHA and GQA; 1 to
 * 4096 rows; causal, none, bottom-right with Sk > Sq, rows that see no key;
 * per-tensor and per-head descales; o BF16 and F32; default BSHD strides,
 * SBHD and padded rows; codes up to 448), each on every path (automatic,
 * and INFINICP_CUDA_ATTN=simt), in one call and as two calls over the key
 * halves merged through `accumulate` (o F32; the first call writing, or
 * both merging into the empty o = 0, lse = -inf), against the one-call
 * model of all keys. NaN codes planted in q, k and v reach exactly the
 * outputs IEEE arithmetic over the visible pairs gives, every other output
 * staying within its bound. And the GPU FP8 path's refusals (backward,
 * outputs other than BF16 / F32), from the core and from the CUDA backend.
 *
 * Skips (exit 77, with the reason printed) where there is no CUDA module,
 * driver or GPU. INFINICP_TEST_QUICK=1 leaves out the 4096-row cases;
 * INFINICP_GPU_TEST_CASES=substring runs only the matching cases.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "core/context.h"
#include "storage.h"
#include "testutil.h"

#define FP8 CP_DTYPE_FP8_E4M3
#define NAN_CODE 0x7f

/* The contexts: the automatic path (Hopper's FP8 tensor cores where they
 * fit) and the SIMT kernels. */
enum { PATH_AUTO, PATH_SIMT, NPATHS };
static const char *path_name[NPATHS] = {"auto", "simt"};
static const char *path_env[NPATHS] = {NULL, "simt"};
static cp_context *ctxs[NPATHS];

static int quick(void)
{
    const char *q = getenv("INFINICP_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* ------------------------------------------------------------------------ */
/* Device memory through the context's backend                              */
/* ------------------------------------------------------------------------ */

static void *dev_alloc(cp_context *ctx, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(ctx->ops->alloc(ctx->state, bytes ? bytes : 1, &p), CP_SUCCESS);
    return p;
}

static void *dev_copy(cp_context *ctx, const void *src, size_t bytes)
{
    void *p = dev_alloc(ctx, bytes);
    assert_int_equal(ctx->ops->copy_2d(ctx->state, p, bytes, src, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE), CP_SUCCESS);
    return p;
}

static void download(cp_context *ctx, void *dst, const void *src, size_t bytes)
{
    assert_int_equal(ctx->ops->copy_2d(ctx->state, dst, bytes, src, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST),
                     CP_SUCCESS);
    assert_int_equal(cp_context_synchronize(ctx), CP_SUCCESS);
}

static void dev_free(cp_context *ctx, void *p)
{
    ctx->ops->free(ctx->state, p);
}

/* ------------------------------------------------------------------------ */
/* Cases and their data                                                     */
/* ------------------------------------------------------------------------ */

typedef struct fcase {
    const char *name;
    int B, H, Hkv, D; /* D = Dv */
    int64_t Sq, Sk, qoff, koff;
    int causal, per_head;
    cp_dtype odt;
    cp_format fmt;
    int pad;       /* elements after each head row (strides not dense); 0: the default strides */
    double spread; /* |q|, |k| times their descales up to this: scores of standard deviation spread^2 / 3 */
    int big;       /* descales ~1/100 of the others', so codes run up to 448; v's too */
    int acc;       /* also as two calls over the key halves through `accumulate` */
    uint64_t seed;
} fcase;

#define BF CP_DTYPE_BF16
#define F32 CP_DTYPE_F32
#define BSHD CP_FORMAT_BSHD
#define SBHD CP_FORMAT_SBHD

static const fcase cases[] = {
    /* name                      B  H Hkv   D    Sq    Sk qoff koff cau ph  odt  fmt pad sprd big acc seed */
    {"d128-gqa-s1-causal", 2, 8, 2, 128, 1, 1, 0, 0, 1, 0, BF, BSHD, 0, 3, 0, 0, 101},
    {"d64-mha-s1-none", 2, 4, 4, 64, 1, 1, 0, 0, 0, 1, F32, BSHD, 0, 3, 0, 0, 102},
    {"d96-gqa-s77-none", 2, 8, 2, 96, 77, 77, 0, 0, 0, 1, F32, BSHD, 0, 3, 0, 1, 103},
    {"d128-mha-s77-causal", 2, 4, 4, 128, 77, 77, 0, 0, 1, 0, BF, BSHD, 0, 2.5, 0, 0, 104},
    {"d64-gqa-s128-causal", 2, 8, 2, 64, 128, 128, 0, 0, 1, 1, BF, BSHD, 0, 3, 0, 0, 105},
    {"d96-mha-s128-none", 2, 4, 4, 96, 128, 128, 0, 0, 0, 0, F32, BSHD, 0, 3, 0, 0, 106},
    {"d128-gqa-s300-causal", 2, 8, 2, 128, 300, 300, 0, 0, 1, 1, BF, BSHD, 0, 3, 0, 1, 107},
    {"d64-mha-s300-none", 2, 4, 4, 64, 300, 300, 0, 0, 0, 0, BF, BSHD, 0, 3.5, 0, 1, 108},
    {"d96-gqa-s1030-causal", 2, 8, 2, 96, 1030, 1030, 0, 0, 1, 0, BF, BSHD, 0, 3, 0, 0, 109},
    {"d128-mha-s1030-none", 1, 4, 4, 128, 1030, 1030, 0, 0, 0, 1, F32, BSHD, 0, 3, 0, 1, 110},
    {"d64-gqa-s1030-causal", 2, 4, 2, 64, 1030, 1030, 0, 0, 1, 1, BF, BSHD, 0, 3, 0, 0, 111},
    {"d128-s4096-causal", 1, 2, 1, 128, 4096, 4096, 0, 0, 1, 1, BF, BSHD, 0, 3, 0, 1, 112},
    {"d64-s4096-none", 1, 2, 1, 64, 4096, 4096, 0, 0, 0, 0, F32, BSHD, 0, 3, 0, 0, 113},
    {"d96-s4096-causal", 1, 2, 1, 96, 4096, 4096, 0, 0, 1, 0, F32, BSHD, 0, 3, 0, 0, 114},
    /* Sk > Sq, causal aligned bottom-right: the last query row sees every key */
    {"d96-gqa-bottom-right", 2, 8, 2, 96, 200, 700, 500, 0, 1, 1, BF, BSHD, 0, 3, 0, 1, 115},
    {"d128-mha-bottom-right", 1, 4, 4, 128, 200, 700, 500, 0, 1, 0, F32, BSHD, 0, 3, 0, 0, 116},
    /* the keys start 100 positions after the rows: rows 0..99 see no key */
    {"d64-gqa-hidden-rows", 2, 4, 2, 64, 300, 300, 0, 100, 1, 0, F32, BSHD, 0, 3, 0, 1, 117},
    /* codes up to 448 (q, k, v) */
    {"d128-mha-big-codes", 1, 4, 4, 128, 256, 256, 0, 0, 1, 0, BF, BSHD, 0, 3, 1, 0, 118},
    {"d64-gqa-big-codes", 2, 8, 2, 64, 300, 300, 0, 0, 0, 1, F32, BSHD, 0, 3, 1, 1, 119},
    /* a peaked softmax: many probabilities below E4M3's normal range */
    {"d64-gqa-peaked", 1, 4, 2, 64, 500, 500, 0, 0, 1, 1, BF, BSHD, 0, 5, 0, 1, 120},
    {"d128-mha-flat", 1, 4, 4, 128, 500, 500, 0, 0, 0, 0, BF, BSHD, 0, 1, 0, 0, 121},
    /* other layouts: SBHD with rows padded by 16 bytes (aligned), BSHD by 8 */
    {"d64-gqa-sbhd-pad16", 2, 8, 2, 64, 300, 300, 0, 0, 1, 1, BF, SBHD, 16, 3, 0, 1, 122},
    {"d128-gqa-bshd-pad8", 2, 4, 2, 128, 129, 257, 128, 0, 1, 0, F32, BSHD, 8, 3, 0, 1, 123},
};

typedef test_lay lay; /* testutil.h */

static lay make_lay(const fcase *c, int64_t S, int heads, int dim)
{
    return test_lay_of(c->fmt, c->B, c->pad, S, heads, dim);
}

/* Element (b, s, h, 0) of a dense [B, S, heads, dim] array. */
static size_t dense_at(int64_t S, int heads, int dim, int64_t b, int64_t s, int h)
{
    return (((size_t)b * (size_t)S + (size_t)s) * (size_t)heads + (size_t)h) * (size_t)dim;
}

typedef struct fdata {
    const fcase *c;
    double scale;
    lay lq, lk, lv, lo;
    uint8_t *hq, *hk, *hv;     /* the codes, laid out (padding: NaN codes) */
    double *q, *k, *v;         /* the codes decoded, dense [B, S, heads, D] */
    float qd[8], kd[8], vd[8]; /* descales: [0], or one per head */
} fdata;

static double desc(const float *d, int per_head, int h)
{
    return (double)d[per_head ? h : 0];
}

/* Random codes: for head h values uniform in [-amp(h), amp(h)] rounded to
 * E4M3 (to nearest even). */
static void fill_codes(const fcase *c, ref_rng *r, uint8_t *buf, const lay *l, int64_t S, int heads, int dim,
                       const double *amp)
{
    memset(buf, NAN_CODE, l->elems ? l->elems : 1);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int h = 0; h < heads; h++)
                for (int e = 0; e < dim; e++)
                    ref_store(buf, FP8, test_lay_at(l, b, s, h) + (size_t)e,
                              ref_round(ref_rng_uniform(r, -amp[h], amp[h]), FP8));
}

/* The dense values of laid-out codes. */
static void decode_codes(const fcase *c, const uint8_t *buf, const lay *l, double *x, int64_t S, int heads, int dim)
{
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int h = 0; h < heads; h++)
                for (int e = 0; e < dim; e++)
                    x[dense_at(S, heads, dim, b, s, h) + (size_t)e] =
                        ref_fp8_e4m3_decode(buf[test_lay_at(l, b, s, h) + (size_t)e]);
}

static void fdata_decode(fdata *d)
{
    const fcase *c = d->c;
    decode_codes(c, d->hq, &d->lq, d->q, c->Sq, c->H, c->D);
    decode_codes(c, d->hk, &d->lk, d->k, c->Sk, c->Hkv, c->D);
    decode_codes(c, d->hv, &d->lv, d->v, c->Sk, c->Hkv, c->D);
}

static void fdata_make(fdata *d, const fcase *c)
{
    assert_true(c->H <= 8 && c->Hkv <= 8 && c->H % c->Hkv == 0);
    memset(d, 0, sizeof *d);
    d->c = c;
    d->scale = 1.0 / sqrt((double)c->D);
    d->lq = make_lay(c, c->Sq, c->H, c->D);
    d->lk = make_lay(c, c->Sk, c->Hkv, c->D);
    d->lv = make_lay(c, c->Sk, c->Hkv, c->D);
    d->lo = make_lay(c, c->Sq, c->H, c->D);
    ref_rng r = {c->seed * 0x9E3779B97F4A7C15ULL + 1};
    const double lo = c->big ? 0.004 : 0.05, hi = c->big ? 0.008 : 0.5;
    for (int h = 0; h < 8; h++) {
        d->qd[h] = (float)ref_rng_uniform(&r, lo, hi);
        d->kd[h] = (float)ref_rng_uniform(&r, lo, hi);
        d->vd[h] = (float)ref_rng_uniform(&r, 0.05, 0.5);
    }
    /* codes whose descaled values reach +-spread (at most 448) */
    double aq[8], ak[8], av[8];
    for (int h = 0; h < 8; h++) {
        aq[h] = fmin(448, c->spread / desc(d->qd, c->per_head, h));
        ak[h] = fmin(448, c->spread / desc(d->kd, c->per_head, h));
        av[h] = c->big ? 448 : 16;
    }
    d->hq = malloc(d->lq.elems + 1), d->hk = malloc(d->lk.elems + 1), d->hv = malloc(d->lv.elems + 1);
    d->q = malloc(sizeof(double) * ((size_t)c->B * c->Sq * c->H * c->D + 1));
    d->k = malloc(sizeof(double) * ((size_t)c->B * c->Sk * c->Hkv * c->D + 1));
    d->v = malloc(sizeof(double) * ((size_t)c->B * c->Sk * c->Hkv * c->D + 1));
    assert_true(d->hq && d->hk && d->hv && d->q && d->k && d->v);
    fill_codes(c, &r, d->hq, &d->lq, c->Sq, c->H, c->D, aq);
    fill_codes(c, &r, d->hk, &d->lk, c->Sk, c->Hkv, c->D, ak);
    fill_codes(c, &r, d->hv, &d->lv, c->Sk, c->Hkv, c->D, av);
    fdata_decode(d);
}

static void fdata_free(fdata *d)
{
    free(d->hq), free(d->hk), free(d->hv), free(d->q), free(d->k), free(d->v);
}

/* ------------------------------------------------------------------------ */
/* The FP64 model and its bounds                                            */
/* ------------------------------------------------------------------------ */

typedef struct model {
    double *o, *bound;       /* dense [B, Sq, H, D]; the bound without the BF16 term */
    double *lse, *lse_bound; /* [B, H, Sq] */
} model;

/* Keys [0, n) are visible to row i. */
static int64_t visible_keys(const fcase *c, int64_t i)
{
    if (!c->causal)
        return c->Sk;
    const int64_t last = c->qoff + i - c->koff; /* k_offset + j <= q_offset + i */
    return last < 0 ? 0 : last >= c->Sk ? c->Sk : last + 1;
}

/* One row; s (Sk) and acc (3 D) are scratch. IEEE throughout: a NaN score
 * makes the maximum, and so the row, NaN; a NaN value its column. */
static void model_row(const fdata *d, model *m, int64_t b, int h, int64_t i, double *s, double *acc)
{
    const fcase *c = d->c;
    const int D = c->D, hk = h / (c->H / c->Hkv);
    const double sc = d->scale * desc(d->qd, c->per_head, h) * desc(d->kd, c->per_head, hk);
    const double vd = desc(d->vd, c->per_head, hk);
    const int64_t n = visible_keys(c, i);
    const double *q = d->q + dense_at(c->Sq, c->H, D, b, i, h);
    double *o = m->o + dense_at(c->Sq, c->H, D, b, i, h), *bd = m->bound + dense_at(c->Sq, c->H, D, b, i, h);
    const size_t li = ((size_t)b * (size_t)c->H + (size_t)h) * (size_t)c->Sq + (size_t)i;
    double mx = -INFINITY, big = 0;
    for (int64_t j = 0; j < n; j++) {
        const double *k = d->k + dense_at(c->Sk, c->Hkv, D, b, j, hk);
        double dot = 0, adot = 0;
        for (int e = 0; e < D; e++) {
            dot += q[e] * k[e];
            adot += fabs(q[e] * k[e]);
        }
        s[j] = sc * dot;
        if (isnan(s[j]) || s[j] > mx)
            mx = s[j];
        big = fmax(big, fabs(sc) * adot);
    }
    if (n == 0) {
        for (int e = 0; e < D; e++)
            o[e] = bd[e] = 0;
        m->lse[li] = -INFINITY;
        m->lse_bound[li] = 0;
        return;
    }
    double *num = acc, *abs_sum = acc + D, *rnd = acc + 2 * D, l = 0;
    for (int e = 0; e < 3 * D; e++)
        acc[e] = 0;
    for (int64_t j = 0; j < n; j++) {
        const double p = exp(s[j] - mx), pr = fmax(0x1p-4 * p, 0x1p-10);
        const double *v = d->v + dense_at(c->Sk, c->Hkv, D, b, j, hk);
        l += p;
        for (int e = 0; e < D; e++) {
            num[e] += p * v[e];
            abs_sum[e] += p * fabs(v[e]);
            rnd[e] += pr * fabs(v[e]);
        }
    }
    for (int e = 0; e < D; e++) {
        o[e] = vd * num[e] / l;
        bd[e] = vd * (rnd[e] + 0x1p-9 * abs_sum[e]) / l + 1e-6;
    }
    m->lse[li] = mx + log(l);
    m->lse_bound[li] = 0x1p-10 * big + 2e-5 * (1 + fabs(m->lse[li]));
}

/* Rows in blocks of 16 per (batch, head), on all processors. */
typedef struct mjob {
    const fdata *d;
    model *m;
    atomic_llong next;
    long long units;
} mjob;

enum { MODEL_ROWS = 16 };

static void *model_worker(void *arg)
{
    mjob *j = arg;
    const fcase *c = j->d->c;
    double *s = malloc(sizeof(double) * (size_t)(c->Sk + 1)), *acc = malloc(sizeof(double) * 3 * (size_t)c->D);
    if (!s || !acc) {
        free(s), free(acc);
        return (void *)1;
    }
    const long long blocks = (c->Sq + MODEL_ROWS - 1) / MODEL_ROWS;
    for (long long u; (u = atomic_fetch_add(&j->next, 1)) < j->units;) {
        const int64_t b = u / blocks / c->H, i0 = u % blocks * MODEL_ROWS;
        const int h = (int)(u / blocks % c->H);
        for (int64_t i = i0; i < i0 + MODEL_ROWS && i < c->Sq; i++)
            model_row(j->d, j->m, b, h, i, s, acc);
    }
    free(s), free(acc);
    return NULL;
}

static void model_run(const fdata *d, model *m)
{
    const fcase *c = d->c;
    const size_t no = (size_t)c->B * c->Sq * c->H * c->D, nl = (size_t)c->B * c->H * c->Sq;
    m->o = malloc(sizeof(double) * no), m->bound = malloc(sizeof(double) * no);
    m->lse = malloc(sizeof(double) * nl), m->lse_bound = malloc(sizeof(double) * nl);
    assert_true(m->o && m->bound && m->lse && m->lse_bound);
    mjob j = {.d = d, .m = m, .units = (long long)c->B * c->H * ((c->Sq + MODEL_ROWS - 1) / MODEL_ROWS)};
    atomic_init(&j.next, 0);
    long np = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = np < 1 ? 1 : np > 64 ? 64 : (int)np;
    if (nt > j.units)
        nt = (int)j.units;
    pthread_t t[64];
    int started = 0;
    while (started < nt - 1 && pthread_create(&t[started], NULL, model_worker, &j) == 0)
        started++;
    void *bad = model_worker(&j);
    for (int i = 0; i < started; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad = bad ? bad : r;
    }
    assert_null(bad);
}

static void model_free(model *m)
{
    free(m->o), free(m->bound), free(m->lse), free(m->lse_bound);
}

/* ------------------------------------------------------------------------ */
/* Running the kernel                                                       */
/* ------------------------------------------------------------------------ */

typedef struct dbufs {
    void *q, *k, *v;
    float *qd, *kd, *vd; /* descales in device memory */
} dbufs;

static dbufs upload_data(cp_context *ctx, const fdata *d)
{
    dbufs b;
    b.q = dev_copy(ctx, d->hq, d->lq.elems);
    b.k = dev_copy(ctx, d->hk, d->lk.elems);
    b.v = dev_copy(ctx, d->hv, d->lv.elems);
    b.qd = dev_copy(ctx, d->qd, sizeof d->qd);
    b.kd = dev_copy(ctx, d->kd, sizeof d->kd);
    b.vd = dev_copy(ctx, d->vd, sizeof d->vd);
    return b;
}

static void free_bufs(cp_context *ctx, dbufs *b)
{
    dev_free(ctx, b->q), dev_free(ctx, b->k), dev_free(ctx, b->v);
    dev_free(ctx, b->qd), dev_free(ctx, b->kd), dev_free(ctx, b->vd);
}

/* One call, o in the case's type (poisoned first, NaN); or two over the key
 * halves into an F32 o: the first writing (o poisoned first), or both
 * merging into the empty result o = 0, lse = -inf. */
enum { RUN_ONE, RUN_HALVES, RUN_HALVES_ACC, NRUNS };
static const char *run_name[NRUNS] = {"one call", "halves write+merge", "halves merge+merge"};

typedef struct got {
    double *o; /* dense [B, Sq, H, D] */
    float *lse;
    size_t ws; /* workspace bytes the one call asked for */
} got;

static void set_strides(const lay *l, int dense, int64_t *sb, int64_t *ss, int64_t *sh)
{
    *sb = dense ? 0 : l->sb, *ss = dense ? 0 : l->ss, *sh = dense ? 0 : l->sh;
}

/* The arguments for keys [k0, k1); dense: leave every stride 0 (the
 * format's dense strides, which only the whole key range has). */
static cp_kernel_attn_args args_for(const fdata *d, const dbufs *db, int64_t k0, int64_t k1, int dense)
{
    const fcase *c = d->c;
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = FP8;
    a.format = c->fmt;
    a.batch = c->B;
    a.num_heads = c->H;
    a.num_kv_heads = c->Hkv;
    a.head_dim = c->D;
    a.head_dim_v = c->D;
    a.seq_q = c->Sq;
    a.seq_k = k1 - k0;
    a.q_offset = c->qoff;
    a.k_offset = c->koff + k0;
    a.mask = c->causal ? CP_MASK_CAUSAL : CP_MASK_NONE;
    a.softmax_scale = d->scale;
    a.q = db->q;
    set_strides(&d->lq, dense, &a.q_stride_b, &a.q_stride_s, &a.q_stride_h);
    a.k = (const uint8_t *)db->k + k0 * d->lk.ss;
    set_strides(&d->lk, dense, &a.k_stride_b, &a.k_stride_s, &a.k_stride_h);
    a.v = (const uint8_t *)db->v + k0 * d->lv.ss;
    set_strides(&d->lv, dense, &a.v_stride_b, &a.v_stride_s, &a.v_stride_h);
    a.q_descale = db->qd;
    a.k_descale = db->kd;
    a.v_descale = db->vd;
    a.descale_per_head = c->per_head;
    return a;
}

static got run_forward(cp_context *ctx, const char *what, const fdata *d, const dbufs *db, int mode)
{
    const fcase *c = d->c;
    const cp_dtype odt = mode == RUN_ONE ? c->odt : CP_DTYPE_F32;
    const size_t oes = ref_dtype_size(odt), ob = d->lo.elems * oes, nl = (size_t)c->B * c->H * c->Sq;
    unsigned char *host = malloc(ob + 1);
    float *lh = malloc(nl * sizeof(float));
    assert_true(host && lh);
    memset(host, mode == RUN_HALVES_ACC ? 0 : 0xff, ob); /* 0xff: NaN in every type */
    for (size_t i = 0; i < nl; i++)
        lh[i] = mode == RUN_HALVES_ACC ? -INFINITY : NAN;
    void *o = dev_copy(ctx, host, ob);
    float *lse = dev_copy(ctx, lh, nl * sizeof(float));
    const int64_t cut = mode == RUN_ONE ? c->Sk : c->Sk / 2;
    const int64_t from[2] = {0, cut}, to[2] = {cut, c->Sk};
    got g = {NULL, NULL, 0};
    for (int part = 0; part < (mode == RUN_ONE ? 1 : 2); part++) {
        if (to[part] <= from[part])
            continue;
        const int dense = mode == RUN_ONE && c->pad == 0;
        cp_kernel_attn_args a = args_for(d, db, from[part], to[part], dense);
        a.o = o;
        set_strides(&d->lo, dense, &a.o_stride_b, &a.o_stride_s, &a.o_stride_h);
        a.o_dtype = odt;
        a.lse = lse;
        a.accumulate = mode == RUN_HALVES_ACC || part == 1;
        void *w = NULL;
        if (mode == RUN_ONE) { /* the halves let the kernel take its own */
            if (cp_kernel_attn_workspace_size(ctx, &a, 0, &g.ws) != CP_SUCCESS)
                fail_msg("%s: cp_kernel_attn_workspace_size: %s", what, cp_last_error());
            w = g.ws ? dev_alloc(ctx, g.ws) : NULL;
            a.workspace = w;
            a.workspace_bytes = g.ws;
        }
        if (cp_kernel_attn_forward(ctx, &a) != CP_SUCCESS)
            fail_msg("%s: cp_kernel_attn_forward (keys %lld..%lld): %s", what, (long long)from[part],
                     (long long)to[part], cp_last_error());
        assert_int_equal(cp_context_synchronize(ctx), CP_SUCCESS);
        dev_free(ctx, w);
    }
    download(ctx, host, o, ob);
    g.lse = malloc(nl * sizeof(float));
    g.o = malloc(sizeof(double) * ((size_t)c->B * c->Sq * c->H * c->D + 1));
    assert_true(g.lse && g.o);
    download(ctx, g.lse, lse, nl * sizeof(float));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < c->Sq; s++)
            for (int h = 0; h < c->H; h++)
                for (int e = 0; e < c->D; e++)
                    g.o[dense_at(c->Sq, c->H, c->D, b, s, h) + (size_t)e] =
                        ref_load(host, odt, test_lay_at(&d->lo, b, s, h) + (size_t)e);
    dev_free(ctx, o), dev_free(ctx, lse);
    free(host), free(lh);
    return g;
}

/* ------------------------------------------------------------------------ */
/* Checking a result against the model                                      */
/* ------------------------------------------------------------------------ */

typedef struct stats {
    double max_abs, num, den, worst; /* worst: largest error / bound */
    double lse_abs;
    long bad; /* elements out of bounds (the first few printed) */
} stats;

static void violation(stats *st, const char *fmt, ...)
{
    if (st->bad++ < 4) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        print_error("%s\n", msg);
    }
}

/* Every element: NaN exactly where the model's is; else within its bound.
 * A row that sees no key: O = 0 and LSE = -inf exactly. */
static void check_result(const char *what, const fdata *d, const model *m, const got *g, cp_dtype odt, stats *st)
{
    const fcase *c = d->c;
    memset(st, 0, sizeof *st);
    for (int64_t b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int64_t i = 0; i < c->Sq; i++) {
                const size_t li = ((size_t)b * (size_t)c->H + (size_t)h) * (size_t)c->Sq + (size_t)i;
                const size_t oi = dense_at(c->Sq, c->H, c->D, b, i, h);
                const double lr = m->lse[li], lg = g->lse[li];
                if (lr == -INFINITY) {
                    if (lg != -INFINITY)
                        violation(st, "%s: b %lld head %d row %lld sees no key: LSE %.9g, expected -inf", what,
                                  (long long)b, h, (long long)i, lg);
                    for (int e = 0; e < c->D; e++)
                        if (g->o[oi + (size_t)e] != 0.0)
                            violation(st, "%s: b %lld head %d row %lld sees no key: O[%d] = %.9g, expected 0", what,
                                      (long long)b, h, (long long)i, e, g->o[oi + (size_t)e]);
                    continue;
                }
                if (isnan(lr) ? !isnan(lg) : !(fabs(lg - lr) <= m->lse_bound[li]))
                    violation(st, "%s: b %lld head %d row %lld: LSE %.9g, expected %.9g (bound %.3g)", what,
                              (long long)b, h, (long long)i, lg, lr, m->lse_bound[li]);
                else if (!isnan(lr))
                    st->lse_abs = fmax(st->lse_abs, fabs(lg - lr));
                for (int e = 0; e < c->D; e++) {
                    const double ref = m->o[oi + (size_t)e], x = g->o[oi + (size_t)e];
                    if (isnan(ref)) {
                        if (!isnan(x))
                            violation(st, "%s: b %lld head %d row %lld column %d: O %.9g, expected NaN", what,
                                      (long long)b, h, (long long)i, e, x);
                        continue;
                    }
                    const double bound = m->bound[oi + (size_t)e] + (odt == CP_DTYPE_BF16 ? 0x1p-8 * fabs(ref) : 0);
                    const double err = fabs(x - ref);
                    if (!(err <= bound))
                        violation(st,
                                  "%s: b %lld head %d row %lld column %d: O %.9g, expected %.9g, error %.3g "
                                  "above its bound %.3g",
                                  what, (long long)b, h, (long long)i, e, x, ref, err, bound);
                    if (isnan(err) || err > st->max_abs) /* NaN stays */
                        st->max_abs = err;
                    st->worst = fmax(st->worst, err / bound);
                    st->num += err * err;
                    st->den += ref * ref;
                }
            }
}

/* The relative RMS error the FP8 path may have over a whole run. Rounding
 * the probabilities to E4M3 errs by up to 2^-4 relative to each, random in
 * sign, which gives O a relative RMS error of 0.01 to 0.03 whatever the
 * softmax's shape and the number of keys (0.03 where it is flat: values
 * just below 1 keep only 2^-5); the SIMT kernels give about 1e-6. The
 * per-element bounds add the worst cases up, so over many keys of nearly
 * equal weight they approach |O| itself; this catches a wrong result
 * (relative error ~1) there too. */
#define REL_RMS_MAX 0.1

/* One line per run; returns 1 (and says so) if it failed. */
static int report(const char *what, const stats *st, size_t ws)
{
    const double rms = st->den > 0 ? sqrt(st->num / st->den) : sqrt(st->num);
    const int bad = st->bad || !(rms <= REL_RMS_MAX);
    print_message("%-50s O max abs %.3g, rel RMS %.3g, worst err/bound %.3f; LSE max abs %.3g; workspace %zu%s\n", what,
                  st->max_abs, rms, st->worst, st->lse_abs, ws, bad ? "  <-- FAIL" : "");
    if (st->bad)
        print_message("%-50s %ld elements out of bounds\n", what, st->bad);
    if (!(rms <= REL_RMS_MAX))
        print_message("%-50s relative RMS error %.3g above %.3g\n", what, rms, REL_RMS_MAX);
    return bad;
}

/* ------------------------------------------------------------------------ */
/* The tests                                                                */
/* ------------------------------------------------------------------------ */

/* The case on every path, in one call and (where it says so) over the key
 * halves; returns the runs that failed. */
static int check_case(const fcase *c)
{
    fdata d;
    fdata_make(&d, c);
    model m;
    model_run(&d, &m);
    int failed = 0;
    for (int p = 0; p < NPATHS; p++) {
        dbufs db = upload_data(ctxs[p], &d);
        for (int mode = 0; mode < NRUNS; mode++) {
            if (mode != RUN_ONE && (!c->acc || c->Sk < 2))
                continue;
            char what[160];
            snprintf(what, sizeof what, "%s %s %s", c->name, path_name[p], run_name[mode]);
            got g = run_forward(ctxs[p], what, &d, &db, mode);
            stats st;
            check_result(what, &d, &m, &g, mode == RUN_ONE ? c->odt : CP_DTYPE_F32, &st);
            failed += report(what, &st, g.ws);
            free(g.o), free(g.lse);
        }
        free_bufs(ctxs[p], &db);
    }
    model_free(&m);
    fdata_free(&d);
    return failed;
}

static void test_cases(void **unused)
{
    (void)unused;
    const char *only = getenv("INFINICP_GPU_TEST_CASES");
    int failed = 0, ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const fcase *c = &cases[i];
        if (only && !strstr(c->name, only))
            continue;
        if (quick() && c->Sq * c->Sk > 2000000) {
            print_message("%s: left out (INFINICP_TEST_QUICK)\n", c->name);
            continue;
        }
        failed += check_case(c);
        ran++;
    }
    if (failed)
        fail_msg("%d runs failed (marked FAIL above, with the first elements out of bounds)", failed);
    if (!ran && !only)
        fail_msg("no case ran");
}

/*
 * A NaN code in one element of q, k or v, in the middle of a causal case
 * (docs/RELIABILITY.md, "Non-finite inputs"); IEEE over the visible pairs:
 *  - v[b, j, hk, d]: O[b, i, h, d] is NaN exactly for the rows i that see
 *    key j and the heads h of kv head hk; the LSE does not change;
 *  - k[b, j, hk, :]: those rows' O and LSE are NaN, for every column;
 *  - q[b, i, h, :]: that row's O and LSE are NaN.
 * Every other output is finite and within its bound. The model gives that
 * by itself; the pattern is asserted on it first, then on the device's.
 */
static void test_nan_codes(void **unused)
{
    (void)unused;
    static const fcase c = {"nan", 2, 4, 2, 64, 300, 300, 0, 0, 1, 1, BF, BSHD, 0, 3, 0, 0, 201};
    static const struct {
        const char *tensor;
        int64_t b, s;
        int h, e;
    } plants[] = {{"v", 1, 150, 1, 17}, {"k", 0, 200, 0, 5}, {"q", 1, 123, 2, 40}};
    const int G = c.H / c.Hkv;
    int failed = 0;
    for (size_t pi = 0; pi < sizeof plants / sizeof plants[0]; pi++) {
        const char t = plants[pi].tensor[0];
        const int64_t pb = plants[pi].b, ps = plants[pi].s;
        const int ph = plants[pi].h, pe = plants[pi].e;
        fdata d;
        fdata_make(&d, &c);
        uint8_t *buf = t == 'q' ? d.hq : t == 'k' ? d.hk : d.hv;
        const lay *l = t == 'q' ? &d.lq : t == 'k' ? &d.lk : &d.lv;
        buf[test_lay_at(l, pb, ps, ph) + (size_t)pe] = NAN_CODE;
        fdata_decode(&d);
        model m;
        model_run(&d, &m);
        /* the model against the statement above */
        for (int64_t b = 0; b < c.B; b++)
            for (int h = 0; h < c.H; h++)
                for (int64_t i = 0; i < c.Sq; i++) {
                    const int sees = b == pb && (t == 'q' ? h == ph && i == ps && visible_keys(&c, i) > 0
                                                          : h / G == ph && visible_keys(&c, i) > ps);
                    const size_t li = ((size_t)b * (size_t)c.H + (size_t)h) * (size_t)c.Sq + (size_t)i;
                    assert_true(!!isnan(m.lse[li]) == (sees && t != 'v'));
                    for (int e = 0; e < c.D; e++)
                        assert_true(!!isnan(m.o[dense_at(c.Sq, c.H, c.D, b, i, h) + (size_t)e]) ==
                                    (sees && (t != 'v' || e == pe)));
                }
        for (int p = 0; p < NPATHS; p++) {
            dbufs db = upload_data(ctxs[p], &d);
            for (int mode = 0; mode < NRUNS; mode += 2) { /* one call; both halves merging */
                char what[160];
                snprintf(what, sizeof what, "NaN in %s[%lld, %lld, %d, %d] %s %s", plants[pi].tensor, (long long)pb,
                         (long long)ps, ph, pe, path_name[p], run_name[mode]);
                got g = run_forward(ctxs[p], what, &d, &db, mode);
                stats st;
                check_result(what, &d, &m, &g, mode == RUN_ONE ? c.odt : CP_DTYPE_F32, &st);
                failed += report(what, &st, g.ws);
                free(g.o), free(g.lse);
            }
            free_bufs(ctxs[p], &db);
        }
        model_free(&m);
        fdata_free(&d);
    }
    if (failed)
        fail_msg("%d runs with NaN codes failed (marked FAIL above: other NaNs than the model's, or errors)", failed);
}

/* The GPU FP8 path's refusals: FP8 is forward only, its output BF16 or F32;
 * from the core and from the CUDA backend's own checks behind it. */
static void test_bad_arguments(void **unused)
{
    (void)unused;
    for (int p = 0; p < NPATHS; p++) {
        cp_context *ctx = ctxs[p];
        const size_t n = 1 * 4 * 2 * 64;
        uint8_t codes[1 * 4 * 2 * 64];
        for (size_t i = 0; i < n; i++)
            codes[i] = (uint8_t)(0x30 + i % 16);
        const float one = 1.0f;
        void *q = dev_copy(ctx, codes, n), *o = dev_alloc(ctx, n * 4), *g = dev_alloc(ctx, n * 4 * 3);
        float *lse = dev_alloc(ctx, 8 * sizeof(float)), *ds = dev_copy(ctx, &one, sizeof one);
        cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
        a.dtype = FP8;
        a.batch = 1, a.num_heads = 2, a.num_kv_heads = 1, a.head_dim = 64, a.seq_q = a.seq_k = 4;
        a.mask = CP_MASK_CAUSAL;
        a.q = a.k = a.v = q;
        a.o = o, a.o_dtype = CP_DTYPE_BF16, a.lse = lse;
        a.q_descale = a.k_descale = a.v_descale = ds;
        if (cp_kernel_attn_forward(ctx, &a) != CP_SUCCESS)
            fail_msg("%s: a valid FP8 forward: %s", path_name[p], cp_last_error());
        assert_int_equal(cp_context_synchronize(ctx), CP_SUCCESS);

        /* forward only */
        cp_kernel_attn_args b = a;
        b.dout = o, b.dq = g, b.dk = (char *)g + n * 4, b.dv = (char *)g + n * 8, b.grad_dtype = CP_DTYPE_F32;
        b.o_dtype = CP_DTYPE_F32;
        size_t bytes = 7;
        EXPECT_ERROR(cp_kernel_attn_backward(ctx, &b), CP_ERROR_UNSUPPORTED, "a->dtype = CP_DTYPE_FP8_E4M3");
        assert_non_null(strstr(cp_last_error(), "forward only"));
        EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, &b, 1, &bytes), CP_ERROR_UNSUPPORTED, "CP_DTYPE_FP8_E4M3");
        assert_non_null(strstr(cp_last_error(), "forward only"));
        /* the backend's own check (a caller that reaches it past the core) */
        b.struct_size = sizeof b, b.head_dim_v = b.head_dim, b.softmax_scale = 0.125;
        EXPECT_ERROR(ctx->ops->attn_backward(ctx->state, &b), CP_ERROR_UNSUPPORTED, "a->dtype = CP_DTYPE_FP8_E4M3");
        assert_non_null(strstr(cp_last_error(), "forward only"));
        EXPECT_ERROR(ctx->ops->attn_workspace_size(ctx->state, &b, 1, &bytes), CP_ERROR_UNSUPPORTED,
                     "CP_DTYPE_FP8_E4M3");

        /* outputs in BF16 or F32 only */
        b = a;
        b.o_dtype = CP_DTYPE_F16;
        EXPECT_ERROR(cp_kernel_attn_forward(ctx, &b), CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 1");
        b.struct_size = sizeof b, b.head_dim_v = b.head_dim, b.softmax_scale = 0.125;
        EXPECT_ERROR(ctx->ops->attn_forward(ctx->state, &b), CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 1");
        b.o_dtype = FP8;
        EXPECT_ERROR(ctx->ops->attn_forward(ctx->state, &b), CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 4");
        dev_free(ctx, q), dev_free(ctx, o), dev_free(ctx, g), dev_free(ctx, lse), dev_free(ctx, ds);
    }
}

/* The context of a path, or NULL having said why there is none. */
static cp_context *open_ctx(const char *path)
{
    if (path)
        setenv("INFINICP_CUDA_ATTN", path, 1);
    else
        unsetenv("INFINICP_CUDA_ATTN");
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.device = CP_DEVICE_CUDA;
    cp_context *ctx = NULL;
    cp_status s = cp_context_create(&cc, &ctx);
    unsetenv("INFINICP_CUDA_ATTN");
    if (s != CP_SUCCESS) {
        printf("SKIP: no CUDA module, driver or device: %s (%s)\n", cp_last_error(), cp_status_string(s));
        return NULL;
    }
    return ctx;
}

int main(void)
{
    for (int p = 0; p < NPATHS; p++) {
        ctxs[p] = open_ctx(path_env[p]);
        if (!ctxs[p]) {
            for (int i = 0; i < p; i++)
                cp_context_destroy(ctxs[i]);
            return 77;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_nan_codes),
        cmocka_unit_test(test_bad_arguments),
    };
    int r = cmocka_run_group_tests_name("gpu-fp8", tests, NULL, NULL);
    for (int p = 0; p < NPATHS; p++)
        cp_context_destroy(ctxs[p]);
    return r;
}
