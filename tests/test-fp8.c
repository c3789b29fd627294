/* SPDX-License-Identifier: MIT */
/*
 * FP8 E4M3 forward (API 1.2) on the CPU backend.
 *
 *  - The format: an FP8 decoder written here from the format's definition
 *    (storage.c, ref_fp8_e4m3_decode) against the library's table, the
 *    CPU backend's conversion and a kernel call that passes every code
 *    through as a value (one key, so O = V), for all 256 codes and every
 *    instruction set; the encoder's rounding against storage.c's.
 *  - The kernel: cp_kernel_attn_forward with FP8 q, k, v against the FP64
 *    model of attn_model.c on the exactly decoded inputs times their
 *    descales (per tensor and per head; MHA and GQA; causal and none;
 *    windows, softcaps, rectangles; BF16 and F32 outputs), every
 *    instruction set and several thread counts. With descales of 1 the
 *    result is bit for bit the BF16 kernel's on the same values (every FP8
 *    value is a BF16 value), so FP8 adds no error of its own. NaN codes
 *    reach exactly the outputs the model says.
 *  - The plan: every mode and layout (packed too), windows, softcaps and
 *    sinks, at CP=1 and CP=2 / 4 on the same inputs: the error against the
 *    FP64 model at CP=P stays within 1.25x of CP=1's (CP adds no error; the
 *    runs and the comparison are cpattn.c's, shared with test-attn-v11.c);
 *    a ring hop of an FP8 plan carries half the bytes of a BF16 one.
 *  - Bad input: an FP8 plan's backward (a rank that calls it still takes
 *    part in the call), FP8 or F16 outputs of an FP8 kernel call, descales
 *    with other dtypes, a backend whose kernel arguments end before the
 *    descales, and the other functions that take a cp_dtype; each with
 *    its status and a message naming the argument.
 *
 * It prints the errors of FP8 next to BF16's (same values; and the same
 * real-valued data quantised to each) and, outside INFINICP_TEST_QUICK, the
 * time of an FP8 forward next to a BF16 one of the same shape.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "attn_model.h"
#include "core/context.h"
#include "core/fp8.h"
#include "cpattn.h"
#include "cpuctx.h"
#include "faulty.h"
#include "storage.h"
#include "testutil.h"
#include "world.h"

#define FP8 CP_DTYPE_FP8_E4M3

static int quick(void)
{
    const char *q = getenv("INFINICP_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* Same value: both NaN, or equal (with the sign of a zero when `sign`). */
static int same_value(double a, double b, int sign)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return a == b && (!sign || !signbit(a) == !signbit(b));
}

/* ---- contexts: every ISA this machine has, several thread counts -------- */

static cpuctx_set cs;

static int setup(void **state)
{
    (void)state;
    cpuctx_add(&cs, NULL, 1);
    cpuctx_add(&cs, NULL, 3);
    if (!quick()) {
        cpuctx_add(&cs, "avx512", 2);
        cpuctx_add(&cs, "avx2", 2);
        cpuctx_add(&cs, "generic", 2);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cpuctx_close_all(&cs);
    return 0;
}

/* ---- the format -------------------------------------------------------- */

static void test_decode_every_code(void **state)
{
    (void)state;
    uint8_t codes[256];
    for (int c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    /* the definition itself, on codes worked by hand */
    assert_true(ref_fp8_e4m3_decode(0x00) == 0 && !signbit(ref_fp8_e4m3_decode(0x00)));
    assert_true(ref_fp8_e4m3_decode(0x80) == 0 && signbit(ref_fp8_e4m3_decode(0x80)));
    assert_true(ref_fp8_e4m3_decode(0x01) == 0x1p-9);  /* smallest subnormal */
    assert_true(ref_fp8_e4m3_decode(0x07) == 7 * 0x1p-9);
    assert_true(ref_fp8_e4m3_decode(0x08) == 0x1p-6);  /* smallest normal */
    assert_true(ref_fp8_e4m3_decode(0x38) == 1.0);
    assert_true(ref_fp8_e4m3_decode(0x7e) == 448.0);   /* largest */
    assert_true(ref_fp8_e4m3_decode(0xfe) == -448.0);
    assert_true(ref_fp8_e4m3_decode(0x78) == 256.0);   /* S.1111.000: a number, not an infinity */
    assert_true(isnan(ref_fp8_e4m3_decode(0x7f)) && isnan(ref_fp8_e4m3_decode(0xff)));

    /* the library's table */
    for (int c = 0; c < 256; c++)
        if (!same_value(cpi_fp8_e4m3_to_f32((uint8_t)c), ref_fp8_e4m3_decode((uint8_t)c), 1))
            fail_msg("code 0x%02x: the library decodes %.9g, the format says %.9g", c,
                     (double)cpi_fp8_e4m3_to_f32((uint8_t)c), ref_fp8_e4m3_decode((uint8_t)c));

    /* the CPU backend's conversion, to every type that holds them all */
    cp_context *ctx = cs.c[0].ctx;
    float f32[256];
    double f64[256];
    uint16_t bf16[256];
    assert_int_equal(ctx->ops->convert(ctx->state, f32, CP_DTYPE_F32, codes, FP8, 256), CP_SUCCESS);
    assert_int_equal(ctx->ops->convert(ctx->state, f64, CP_DTYPE_F64, codes, FP8, 256), CP_SUCCESS);
    assert_int_equal(ctx->ops->convert(ctx->state, bf16, CP_DTYPE_BF16, codes, FP8, 256), CP_SUCCESS);
    for (int c = 0; c < 256; c++) {
        const double want = ref_fp8_e4m3_decode((uint8_t)c);
        if (!same_value(f32[c], want, 1) || !same_value(f64[c], want, 1) ||
            !same_value(ref_load(bf16, CP_DTYPE_BF16, (size_t)c), want, 1))
            fail_msg("code 0x%02x: converted to F32 %.9g, F64 %.9g, BF16 %.9g; the format says %.9g", c,
                     (double)f32[c], f64[c], ref_load(bf16, CP_DTYPE_BF16, (size_t)c), want);
    }

    /* through the kernels' loads: one query, one key, a value row of every
     * code; P = 1, so O is the value row itself (F32 and BF16 hold every
     * FP8 value), on every ISA (vector and tail lanes) */
    const uint8_t one = 0x38;
    float o32[256], lse;
    uint16_t o16[256];
    for (int i = 0; i < cs.n; i++)
        for (int bf = 0; bf < 2; bf++) {
            cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
            a.dtype = FP8;
            a.batch = a.num_heads = a.num_kv_heads = 1;
            a.head_dim = 1;
            a.head_dim_v = 256;
            a.seq_q = a.seq_k = 1;
            a.q = &one, a.k = &one, a.v = codes;
            a.o = bf ? (void *)o16 : (void *)o32;
            a.o_dtype = bf ? CP_DTYPE_BF16 : CP_DTYPE_F32;
            a.lse = &lse;
            if (cp_kernel_attn_forward(cs.c[i].ctx, &a) != CP_SUCCESS)
                fail_msg("%s: %s", cs.c[i].name, cp_last_error());
            for (int c = 0; c < 256; c++) {
                const double got = bf ? ref_load(o16, CP_DTYPE_BF16, (size_t)c) : o32[c];
                if (!same_value(got, ref_fp8_e4m3_decode((uint8_t)c), 0))
                    fail_msg("%s: code 0x%02x through the kernel (o %s) is %.9g, the format says %.9g",
                             cs.c[i].name, c, bf ? "BF16" : "F32", got, ref_fp8_e4m3_decode((uint8_t)c));
            }
            assert_true(lse == 1.0f); /* one key of score 1 * 1 * scale 1 */
        }
}

/* The CPU backend's conversion into FP8 rounds once, to nearest even, and
 * turns what lies beyond 464 into NaN (the format has no infinity). */
static void test_encode(void **state)
{
    (void)state;
    cp_context *ctx = cs.c[0].ctx;
    enum { N = 4096 };
    static double x[N];
    static uint8_t got[N];
    static float xf[N];
    size_t n = 0;
    /* every value of the format, and the points halfway between neighbours */
    for (int c = 0; c < 256; c++) {
        const double v = ref_fp8_e4m3_decode((uint8_t)c);
        x[n++] = v;
        if (!isnan(v) && c != 0x7e && c != 0xfe)
            x[n++] = (v + ref_fp8_e4m3_decode((uint8_t)(c + 1))) / 2;
    }
    static const double special[] = { 448, 460, 464, 464.0000001, 470, 480, 1e30, INFINITY, -INFINITY,
                                      0x1p-10, 3 * 0x1p-10, 0x1p-11, 0x1.0000001p-10, 15 * 0x1p-10 };
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        x[n++] = special[i];
        x[n++] = -special[i];
    }
    ref_rng r = { 0x5eed };
    while (n < N) {
        const double m = ref_rng_uniform(&r, -1, 1);
        x[n++] = ldexp(m, (int)ref_rng_int(&r, -12, 10));
    }
    assert_int_equal(ctx->ops->convert(ctx->state, got, FP8, x, CP_DTYPE_F64, N), CP_SUCCESS);
    for (size_t i = 0; i < N; i++) {
        const double want = isinf(x[i]) ? NAN : ref_round(x[i], FP8);
        if (!same_value(ref_fp8_e4m3_decode(got[i]), want, 1))
            fail_msg("%.17g converts to code 0x%02x = %.9g, the nearest (ties to even) is %.9g", x[i], got[i],
                     ref_fp8_e4m3_decode(got[i]), want);
    }
    /* from F32 too (exact for these: every midpoint is a float) */
    for (size_t i = 0; i < N; i++)
        xf[i] = (float)x[i];
    assert_int_equal(ctx->ops->convert(ctx->state, got, FP8, xf, CP_DTYPE_F32, N), CP_SUCCESS);
    for (size_t i = 0; i < N; i++) {
        const double want = isinf((double)xf[i]) ? NAN : ref_round(xf[i], FP8);
        if (!same_value(ref_fp8_e4m3_decode(got[i]), want, 1))
            fail_msg("F32 %.9g converts to %.9g, expected %.9g", (double)xf[i], ref_fp8_e4m3_decode(got[i]), want);
    }
    /* but FP8 is no type of reductions */
    uint8_t acc[4] = { 0 };
    EXPECT_ERROR(ctx->ops->reduce(ctx->state, acc, acc, FP8, 4, CP_REDUCE_SUM), CP_ERROR_INVALID_ARGUMENT,
                 "CP_DTYPE_FP8_E4M3");
}

/* ---- the kernel against the FP64 model --------------------------------- */

/* Random values of the format in [-amp, amp] (NaN codes never come up). */
static double *fp8_values(ref_rng *r, size_t n, double amp)
{
    double *v = malloc(sizeof *v * (n ? n : 1));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = ref_round(ref_rng_uniform(r, -amp, amp), FP8);
    return v;
}

/* A dense tensor of values (given [B][S][H][D]) stored in format f. */
static void *store_tensor(cp_dtype t, cp_format f, int64_t B, int64_t S, int H, int D, const double *v)
{
    const size_t n = (size_t)(B * S * H * D);
    void *buf = malloc(n * ref_dtype_size(t) + 1);
    assert_non_null(buf);
    ref_store_tensor(buf, t, f, B, S, H, D, v);
    return buf;
}

static double *load_tensor(cp_dtype t, cp_format f, int64_t B, int64_t S, int H, int D, const void *buf)
{
    double *v = malloc(sizeof *v * (size_t)(B * S * H * D));
    assert_non_null(v);
    ref_load_tensor(buf, t, f, B, S, H, D, v);
    return v;
}

/* x [B][S][H][D] times the descale of each head (per head) or d[0]. */
static double *descaled(const double *x, int64_t B, int64_t S, int H, int D, const float *d, int per_head)
{
    const size_t n = (size_t)(B * S * H * D);
    double *y = malloc(sizeof *y * (n ? n : 1));
    assert_non_null(y);
    for (size_t i = 0; i < n; i++) {
        const int h = (int)(i / (size_t)D % (size_t)H);
        y[i] = x[i] * (d ? (double)d[per_head ? h : 0] : 1.0); /* exact: 4 x 24 significant bits */
    }
    return y;
}

typedef struct kcase {
    const char *name;
    int64_t B, Sq, Sk, q_offset, k_offset;
    int H, Hkv, D, Dv;
    int causal;
    int64_t window;
    double softcap;
    int rects;    /* three rectangles instead of the offsets */
    int descales; /* 0 none, 1 per tensor, 2 per head, 3 v's alone */
    cp_dtype o_dtype;
    cp_format format;
} kcase;

static const cp_attn_rect case_rects[] = {
    { 0, 40, 0, 50, 100, 90 },   /* a document's diagonal */
    { 40, 60, 50, 70, 500, 480 }, /* another one, later */
    { 10, 20, 120, 30, 50, 60 },  /* rows of the first seeing other keys too */
};

static const kcase kcases[] = {
    { "MHA causal, per tensor", 1, 300, 300, 0, 0, 4, 4, 64, 64, 1, 0, 0, 0, 1, CP_DTYPE_BF16, CP_FORMAT_BSHD },
    { "GQA causal offsets, per head, o F32", 2, 100, 300, 200, 0, 8, 2, 32, 16, 1, 0, 0, 0, 2, CP_DTYPE_F32,
      CP_FORMAT_BSHD },
    { "MHA none, per head, SBHD", 2, 97, 130, 0, 0, 4, 4, 40, 24, 0, 0, 0, 0, 2, CP_DTYPE_BF16, CP_FORMAT_SBHD },
    { "GQA causal window", 1, 200, 200, 0, 0, 6, 3, 16, 16, 1, 37, 0, 0, 1, CP_DTYPE_BF16, CP_FORMAT_BSHD },
    { "GQA none window softcap, per head", 1, 150, 180, 10, 0, 4, 2, 16, 32, 0, 20, 5.0, 0, 2, CP_DTYPE_BF16,
      CP_FORMAT_BSHD },
    { "MHA causal softcap", 1, 130, 130, 0, 0, 2, 2, 24, 24, 1, 0, 2.5, 0, 1, CP_DTYPE_F32, CP_FORMAT_SBHD },
    { "GQA rectangles, per head", 1, 100, 150, 0, 0, 4, 2, 16, 16, 1, 0, 0, 1, 2, CP_DTYPE_BF16, CP_FORMAT_BSHD },
    { "MHA no descales", 1, 64, 64, 0, 0, 2, 2, 16, 16, 1, 0, 0, 0, 0, CP_DTYPE_BF16, CP_FORMAT_BSHD },
    { "GQA v descale alone", 1, 64, 96, 32, 0, 4, 1, 16, 8, 1, 0, 0, 0, 3, CP_DTYPE_BF16, CP_FORMAT_BSHD },
};

/* One case's inputs: FP8 values, descales, and the model's results on the
 * values times the descales. */
typedef struct kdata {
    const kcase *c;
    model_shape m;
    model_ext x;
    model_rect mr[3];
    double *q, *k, *v;          /* the stored FP8 values [B][S][H][D] */
    float qd[8], kd[8], vd[8];  /* descales */
    const float *qdp, *kdp, *vdp;
    double *o, *lse;            /* the model's */
    void *tq, *tk, *tv;         /* stored in c->format */
} kdata;

static void kdata_make(kdata *d, const kcase *c, uint64_t seed)
{
    memset(d, 0, sizeof *d);
    d->c = c;
    d->m = (model_shape){ .batch = c->B, .seq_q = c->Sq, .seq_k = c->Sk, .heads = c->H, .kv_heads = c->Hkv,
                          .head_dim = c->D, .head_dim_v = c->Dv, .q_offset = c->q_offset, .k_offset = c->k_offset,
                          .causal = c->causal, .scale = 1.0 / sqrt((double)c->D) };
    d->x = (model_ext){ .window = c->window, .softcap = c->softcap };
    if (c->rects) {
        for (int i = 0; i < 3; i++)
            d->mr[i] = (model_rect){ case_rects[i].q_row, case_rects[i].q_len, case_rects[i].k_row,
                                     case_rects[i].k_len, case_rects[i].q_pos, case_rects[i].k_pos };
        d->x.rects = d->mr;
        d->x.nrects = 3;
    }
    ref_rng r = { seed * 0x9E3779B97F4A7C15ULL + 7 };
    d->q = fp8_values(&r, model_q_elems(&d->m), 6.0);
    d->k = fp8_values(&r, model_k_elems(&d->m), 6.0);
    d->v = fp8_values(&r, model_v_elems(&d->m), 100.0);
    const int per_head = c->descales == 2;
    for (int h = 0; h < 8; h++) {
        d->qd[h] = (float)ref_rng_uniform(&r, 0.05, 0.4);
        d->kd[h] = (float)ref_rng_uniform(&r, 0.1, 0.8);
        d->vd[h] = (float)ref_rng_uniform(&r, 1e-3, 2e-2);
    }
    d->qdp = c->descales == 1 || per_head ? d->qd : NULL;
    d->kdp = c->descales == 1 || per_head ? d->kd : NULL;
    d->vdp = c->descales ? d->vd : NULL;
    double *q = descaled(d->q, c->B, c->Sq, c->H, c->D, d->qdp, per_head);
    double *k = descaled(d->k, c->B, c->Sk, c->Hkv, c->D, d->kdp, per_head);
    double *v = descaled(d->v, c->B, c->Sk, c->Hkv, c->Dv, d->vdp, per_head);
    d->o = malloc(sizeof *d->o * model_o_elems(&d->m));
    d->lse = malloc(sizeof *d->lse * model_lse_elems(&d->m));
    assert_true(d->o && d->lse);
    model_forward_ex(&d->m, &d->x, q, k, v, d->o, d->lse);
    free(q), free(k), free(v);
    d->tq = store_tensor(FP8, c->format, c->B, c->Sq, c->H, c->D, d->q);
    d->tk = store_tensor(FP8, c->format, c->B, c->Sk, c->Hkv, c->D, d->k);
    d->tv = store_tensor(FP8, c->format, c->B, c->Sk, c->Hkv, c->Dv, d->v);
}

static void kdata_free(kdata *d)
{
    free(d->q), free(d->k), free(d->v), free(d->o), free(d->lse);
    free(d->tq), free(d->tk), free(d->tv);
}

static cp_kernel_attn_args kargs(const kdata *d, cp_dtype dtype, const void *q, const void *k, const void *v, void *o,
                                 cp_dtype o_dtype, float *lse)
{
    const kcase *c = d->c;
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = dtype;
    a.format = c->format;
    a.batch = c->B;
    a.num_heads = c->H;
    a.num_kv_heads = c->Hkv;
    a.head_dim = c->D;
    a.head_dim_v = c->Dv;
    a.seq_q = c->Sq;
    a.seq_k = c->Sk;
    a.q_offset = c->q_offset;
    a.k_offset = c->k_offset;
    a.mask = c->causal ? CP_MASK_CAUSAL : CP_MASK_NONE;
    a.window = c->window;
    a.softcap = c->softcap;
    if (c->rects) {
        a.rects = case_rects;
        a.num_rects = 3;
    }
    a.q = q, a.k = k, a.v = v, a.o = o, a.o_dtype = o_dtype, a.lse = lse;
    return a;
}

static void set_descales(cp_kernel_attn_args *a, const kdata *d)
{
    a->q_descale = d->qdp;
    a->k_descale = d->kdp;
    a->v_descale = d->vdp;
    a->descale_per_head = d->c->descales == 2;
}

/* Largest |x - ref| over the largest |ref| (a bound on the tensor's scale)
 * and the relative RMS; NaN where ref is not is a failure. */
static void errors_of(const double *x, const double *ref, size_t n, double *max_rel, double *rms, double *max_abs)
{
    double e = 0, big = 0, num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i]) && x[i] == ref[i])
            continue;
        if (isnan(x[i]) != isnan(ref[i]))
            fail_msg("element %zu: %g, the model says %g", i, x[i], ref[i]);
        if (isnan(ref[i]))
            continue;
        e = fmax(e, fabs(x[i] - ref[i]));
        big = fmax(big, fabs(ref[i]));
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    *max_rel = e / fmax(big, 1e-30);
    *rms = den > 0 ? sqrt(num / den) : sqrt(num);
    if (max_abs)
        *max_abs = e;
}

static void check_lse(const float *lse, const double *ref, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (ref[i] == -INFINITY) {
            if (lse[i] != -INFINITY)
                fail_msg("%s: LSE[%zu] = %g, expected -inf (the row sees no key)", what, i, (double)lse[i]);
            continue;
        }
        if (!(fabs(lse[i] - ref[i]) <= 2e-5 * (1 + fabs(ref[i]))))
            fail_msg("%s: LSE[%zu] = %.9g, the model says %.9g", what, i, (double)lse[i], ref[i]);
    }
}

/* The bound of test-kernel.c: the output's rounding (1.5 units of BF16
 * relative to the tensor's scale) on top of the fp32 error. */
static double o_bound(cp_dtype o_dtype)
{
    return (o_dtype == CP_DTYPE_BF16 ? 1.5 * 0x1p-8 : 0) + 2e-5;
}

static void test_kernel_cases(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < sizeof kcases / sizeof kcases[0]; ci++) {
        const kcase *c = &kcases[ci];
        kdata d;
        kdata_make(&d, c, ci + 1);
        const size_t no = model_o_elems(&d.m), nl = model_lse_elems(&d.m);
        const size_t os = ref_dtype_size(c->o_dtype);
        void *o = malloc(no * os), *first = malloc(no * os);
        float *lse = malloc(nl * sizeof *lse);
        assert_true(o && first && lse);
        for (int i = 0; i < cs.n; i++) {
            memset(o, 0xff, no * os);
            cp_kernel_attn_args a = kargs(&d, FP8, d.tq, d.tk, d.tv, o, c->o_dtype, lse);
            set_descales(&a, &d);
            if (cp_kernel_attn_forward(cs.c[i].ctx, &a) != CP_SUCCESS)
                fail_msg("%s on %s: %s", c->name, cs.c[i].name, cp_last_error());
            double *got = load_tensor(c->o_dtype, c->format, c->B, c->Sq, c->H, c->Dv, o);
            double e, rms;
            errors_of(got, d.o, no, &e, &rms, NULL);
            if (!(e <= o_bound(c->o_dtype)))
                fail_msg("%s on %s: O error %.3g above %.3g", c->name, cs.c[i].name, e, o_bound(c->o_dtype));
            char what[128];
            snprintf(what, sizeof what, "%s on %s", c->name, cs.c[i].name);
            check_lse(lse, d.lse, nl, what);
            if (getenv("TEST_VERBOSE"))
                print_message("%-40s %-12s O error %.3g (RMS %.3g)\n", c->name, cs.c[i].name, e, rms);
            /* one ISA gives the same bits for every thread count */
            if (i == 0)
                memcpy(first, o, no * os);
            else if (i == 1 && memcmp(first, o, no * os))
                fail_msg("%s: O differs between %s and %s", c->name, cs.c[0].name, cs.c[1].name);
            free(got);
        }
        free(o), free(first), free(lse);
        kdata_free(&d);
    }
}

/*
 * FP8 adds no error of its own: with descales of 1 (NULL or pointers to
 * 1.0f) an FP8 forward gives bit for bit what the BF16 forward gives on the
 * same values, stored as BF16. Prints both errors against the FP64 model.
 */
static void test_same_as_bf16(void **state)
{
    (void)state;
    static const kcase c = { "same values", 2, 200, 200, 0, 0, 8, 2, 64, 64, 1, 0, 0, 0, 0, CP_DTYPE_BF16,
                             CP_FORMAT_BSHD };
    kdata d;
    kdata_make(&d, &c, 77);
    const size_t no = model_o_elems(&d.m), nl = model_lse_elems(&d.m);
    void *bq = store_tensor(CP_DTYPE_BF16, c.format, c.B, c.Sq, c.H, c.D, d.q);
    void *bk = store_tensor(CP_DTYPE_BF16, c.format, c.B, c.Sk, c.Hkv, c.D, d.k);
    void *bv = store_tensor(CP_DTYPE_BF16, c.format, c.B, c.Sk, c.Hkv, c.Dv, d.v);
    uint16_t *o8 = malloc(no * 2), *o8one = malloc(no * 2), *o16 = malloc(no * 2);
    float *l8 = malloc(nl * 4), *l8one = malloc(nl * 4), *l16 = malloc(nl * 4);
    assert_true(o8 && o8one && o16 && l8 && l8one && l16);
    static const float ones[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    for (int i = 0; i < cs.n; i++) {
        cp_kernel_attn_args a = kargs(&d, FP8, d.tq, d.tk, d.tv, o8, CP_DTYPE_BF16, l8);
        assert_int_equal(cp_kernel_attn_forward(cs.c[i].ctx, &a), CP_SUCCESS);
        a.o = o8one, a.lse = l8one;
        a.q_descale = a.k_descale = a.v_descale = ones;
        a.descale_per_head = i % 2;
        assert_int_equal(cp_kernel_attn_forward(cs.c[i].ctx, &a), CP_SUCCESS);
        cp_kernel_attn_args b = kargs(&d, CP_DTYPE_BF16, bq, bk, bv, o16, CP_DTYPE_BF16, l16);
        assert_int_equal(cp_kernel_attn_forward(cs.c[i].ctx, &b), CP_SUCCESS);
        if (memcmp(o8, o16, no * 2) || memcmp(l8, l16, nl * 4))
            fail_msg("%s: FP8 and BF16 forwards of the same values differ", cs.c[i].name);
        if (memcmp(o8, o8one, no * 2) || memcmp(l8, l8one, nl * 4))
            fail_msg("%s: descales of 1.0 change the result", cs.c[i].name);
    }
    double *g8 = load_tensor(CP_DTYPE_BF16, c.format, c.B, c.Sq, c.H, c.Dv, o8);
    double e, rms, abs_e;
    errors_of(g8, d.o, no, &e, &rms, &abs_e);
    print_message("same FP8 values, B=%lld S=%lld H=%d/%d D=%d causal: FP8 and BF16 forwards agree bit for bit; "
                  "error vs FP64 (both): max abs %.3g, max rel %.3g, rel RMS %.3g\n",
                  (long long)c.B, (long long)c.Sq, c.H, c.Hkv, c.D, abs_e, e, rms);
    free(g8);
    free(bq), free(bk), free(bv), free(o8), free(o8one), free(o16), free(l8), free(l8one), free(l16);
    kdata_free(&d);
}

/*
 * The same real-valued data quantised to BF16, and to FP8 with per-head
 * amax scaling (descale = amax / 448, the recipe of FP8 training), against
 * the FP64 model of the unquantised data: what FP8 costs in accuracy.
 * Printed, and bounded loosely (FP8 has 4 significant bits: its inputs
 * carry up to 2^-4 relative error).
 */
static void test_quantised_vs_bf16(void **state)
{
    (void)state;
    const int64_t B = 1, S = 256;
    const int H = 8, Hkv = 2, D = 64;
    const model_shape m = { .batch = B, .seq_q = S, .seq_k = S, .heads = H, .kv_heads = Hkv, .head_dim = D,
                            .head_dim_v = D, .causal = 1, .scale = 1.0 / sqrt((double)D) };
    ref_rng r = { 4242 };
    const size_t nq = model_q_elems(&m), nk = model_k_elems(&m), no = model_o_elems(&m), nl = model_lse_elems(&m);
    double *x[3];
    const size_t n[3] = { nq, nk, nk };
    const int heads[3] = { H, Hkv, Hkv };
    for (int t = 0; t < 3; t++) {
        x[t] = malloc(sizeof(double) * n[t]);
        assert_non_null(x[t]);
        for (size_t i = 0; i < n[t]; i++) /* heads of somewhat different ranges */
            x[t][i] = ref_rng_uniform(&r, -1, 1) * (1.0 + 0.25 * (double)(i / (size_t)D % (size_t)heads[t]));
    }
    double *o = malloc(sizeof(double) * no), *lse = malloc(sizeof(double) * nl);
    assert_true(o && lse);
    model_forward(&m, x[0], x[1], x[2], o, lse);
    /* BF16: each value rounded */
    void *b[3], *f[3];
    float ds[3][8];
    for (int t = 0; t < 3; t++) {
        double *rb = malloc(sizeof(double) * n[t]), *rf = malloc(sizeof(double) * n[t]);
        assert_true(rb && rf);
        for (int h = 0; h < heads[t]; h++) {
            double amax = 0;
            for (size_t i = 0; i < n[t]; i++)
                if ((int)(i / (size_t)D % (size_t)heads[t]) == h)
                    amax = fmax(amax, fabs(x[t][i]));
            ds[t][h] = (float)(amax / 448);
        }
        for (size_t i = 0; i < n[t]; i++) {
            rb[i] = ref_round(x[t][i], CP_DTYPE_BF16);
            rf[i] = ref_round(x[t][i] / ds[t][i / (size_t)D % (size_t)heads[t]], FP8);
        }
        b[t] = store_tensor(CP_DTYPE_BF16, CP_FORMAT_BSHD, B, S, heads[t], D, rb);
        f[t] = store_tensor(FP8, CP_FORMAT_BSHD, B, S, heads[t], D, rf);
        free(rb), free(rf);
    }
    uint16_t *ob = malloc(no * 2), *of = malloc(no * 2);
    float *lb = malloc(nl * 4), *lf = malloc(nl * 4);
    assert_true(ob && of && lb && lf);
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = CP_DTYPE_BF16;
    a.batch = B, a.num_heads = H, a.num_kv_heads = Hkv, a.head_dim = D, a.seq_q = a.seq_k = S;
    a.mask = CP_MASK_CAUSAL;
    a.q = b[0], a.k = b[1], a.v = b[2], a.o = ob, a.o_dtype = CP_DTYPE_BF16, a.lse = lb;
    assert_int_equal(cp_kernel_attn_forward(cs.c[0].ctx, &a), CP_SUCCESS);
    a.dtype = FP8;
    a.q = f[0], a.k = f[1], a.v = f[2], a.o = of, a.lse = lf;
    a.q_descale = ds[0], a.k_descale = ds[1], a.v_descale = ds[2], a.descale_per_head = 1;
    assert_int_equal(cp_kernel_attn_forward(cs.c[0].ctx, &a), CP_SUCCESS);
    double *gb = load_tensor(CP_DTYPE_BF16, CP_FORMAT_BSHD, B, S, H, D, ob);
    double *gf = load_tensor(CP_DTYPE_BF16, CP_FORMAT_BSHD, B, S, H, D, of);
    double eb, rb, ab, ef, rf, af, lerr_b = 0, lerr_f = 0;
    errors_of(gb, o, no, &eb, &rb, &ab);
    errors_of(gf, o, no, &ef, &rf, &af);
    for (size_t i = 0; i < nl; i++) {
        lerr_b = fmax(lerr_b, fabs(lb[i] - lse[i]));
        lerr_f = fmax(lerr_f, fabs(lf[i] - lse[i]));
    }
    print_message("real data quantised, B=%lld S=%lld H=%d/%d D=%d causal, vs FP64 of the unquantised data:\n"
                  "  BF16:                      O max abs %.3g, max rel %.3g, rel RMS %.3g; LSE max abs %.3g\n"
                  "  FP8 per-head amax descale: O max abs %.3g, max rel %.3g, rel RMS %.3g; LSE max abs %.3g\n",
                  (long long)B, (long long)S, H, Hkv, D, ab, eb, rb, lerr_b, af, ef, rf, lerr_f);
    /* 3 significant bits after the first: each input within 2^-4 relative */
    if (!(rf < 0.08 && rb < 0.01))
        fail_msg("quantised errors out of range: FP8 rel RMS %.3g, BF16 %.3g", rf, rb);
    for (int t = 0; t < 3; t++)
        free(x[t]), free(b[t]), free(f[t]);
    free(o), free(lse), free(ob), free(of), free(lb), free(lf), free(gb), free(gf);
}

/* NaN codes reach exactly the outputs the model says (docs/RELIABILITY.md,
 * "Non-finite inputs"): in q, its row; in k, the rows that see the key; in
 * v, that element of the rows that see the key. */
static void test_nan_codes(void **state)
{
    (void)state;
    static const kcase c = { "NaN codes", 1, 300, 300, 0, 0, 4, 2, 16, 16, 1, 0, 0, 0, 2, CP_DTYPE_F32,
                             CP_FORMAT_BSHD };
    for (int tensor = 0; tensor < 3; tensor++)
        for (int pos = 0; pos < 3; pos++) {
            kdata d;
            kdata_make(&d, &c, 500 + (uint64_t)tensor);
            static const int64_t tokens[] = { 0, 143, 299 };
            const int64_t t = tokens[pos];
            const int H = tensor == 0 ? c.H : c.Hkv, Dim = tensor == 2 ? c.Dv : c.D, h = (int)(t % H);
            const size_t at = (size_t)((t * H + h) * Dim + (int)(t % Dim));
            double *vals[3] = { d.q, d.k, d.v };
            vals[tensor][at] = NAN;
            free(d.tq), free(d.tk), free(d.tv);
            d.tq = store_tensor(FP8, c.format, c.B, c.Sq, c.H, c.D, d.q);
            d.tk = store_tensor(FP8, c.format, c.B, c.Sk, c.Hkv, c.D, d.k);
            d.tv = store_tensor(FP8, c.format, c.B, c.Sk, c.Hkv, c.Dv, d.v);
            assert_int_equal(((uint8_t *)(tensor == 0 ? d.tq : tensor == 1 ? d.tk : d.tv))[at] & 0x7f, 0x7f);
            /* the model on the planted values */
            double *q = descaled(d.q, c.B, c.Sq, c.H, c.D, d.qdp, 1), *k = descaled(d.k, c.B, c.Sk, c.Hkv, c.D, d.kdp, 1),
                   *v = descaled(d.v, c.B, c.Sk, c.Hkv, c.Dv, d.vdp, 1);
            model_forward_ex(&d.m, &d.x, q, k, v, d.o, d.lse);
            free(q), free(k), free(v);
            const size_t no = model_o_elems(&d.m), nl = model_lse_elems(&d.m);
            float *o = malloc(no * 4), *lse = malloc(nl * 4);
            assert_true(o && lse);
            for (int i = 0; i < cs.n; i++) {
                cp_kernel_attn_args a = kargs(&d, FP8, d.tq, d.tk, d.tv, o, CP_DTYPE_F32, lse);
                set_descales(&a, &d);
                assert_int_equal(cp_kernel_attn_forward(cs.c[i].ctx, &a), CP_SUCCESS);
                size_t nans = 0;
                for (size_t e = 0; e < no; e++) {
                    if (isnan(o[e]) != isnan(d.o[e]))
                        fail_msg("%s: NaN in %s at token %lld: out[%zu] = %g, the model says %g", cs.c[i].name,
                                 tensor == 0 ? "q" : tensor == 1 ? "k" : "v", (long long)t, e, (double)o[e], d.o[e]);
                    nans += isnan(d.o[e]) != 0;
                }
                for (size_t e = 0; e < nl; e++)
                    if (isnan(lse[e]) != isnan(d.lse[e]))
                        fail_msg("%s: NaN planted in tensor %d: lse[%zu] = %g, the model says %g", cs.c[i].name,
                                 tensor, e, (double)lse[e], d.lse[e]);
                if (!nans)
                    fail_msg("the NaN in tensor %d at token %lld reached no output", tensor, (long long)t);
            }
            free(o), free(lse);
            kdata_free(&d);
        }
}

/* Time of an FP8 forward next to a BF16 one of the same shape (printed). */
static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_time_vs_bf16(void **state)
{
    (void)state;
    if (quick()) {
        print_message("INFINICP_TEST_QUICK: no timing\n");
        skip();
    }
    const int64_t S = 2048;
    const int H = 8, D = 128;
    const size_t n = (size_t)S * (size_t)H * (size_t)D;
    uint8_t *q8 = malloc(n), *k8 = malloc(n), *v8 = malloc(n);
    uint16_t *q16 = malloc(2 * n), *k16 = malloc(2 * n), *v16 = malloc(2 * n), *o = malloc(2 * n);
    float *lse = malloc(sizeof(float) * (size_t)(S * H));
    assert_true(q8 && k8 && v8 && q16 && k16 && v16 && o && lse);
    ref_rng r = { 99 };
    for (size_t i = 0; i < n; i++) {
        uint8_t *p8[3] = { q8, k8, v8 };
        uint16_t *p16[3] = { q16, k16, v16 };
        for (int t = 0; t < 3; t++) {
            const double x = ref_round(ref_rng_uniform(&r, -2, 2), FP8);
            ref_store(p8[t], FP8, i, x);
            ref_store(p16[t], CP_DTYPE_BF16, i, x);
        }
    }
    static const float ds = 0.5f;
    for (int causal = 1; causal >= 0; causal--) {
        double best[2] = { INFINITY, INFINITY };
        for (int rep = 0; rep < 4; rep++)
            for (int fp8 = 0; fp8 < 2; fp8++) {
                cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
                a.dtype = fp8 ? FP8 : CP_DTYPE_BF16;
                a.batch = 1, a.num_heads = a.num_kv_heads = H, a.head_dim = D, a.seq_q = a.seq_k = S;
                a.mask = causal ? CP_MASK_CAUSAL : CP_MASK_NONE;
                a.q = fp8 ? (void *)q8 : (void *)q16, a.k = fp8 ? (void *)k8 : (void *)k16;
                a.v = fp8 ? (void *)v8 : (void *)v16;
                a.o = o, a.o_dtype = CP_DTYPE_BF16, a.lse = lse;
                if (fp8)
                    a.q_descale = a.k_descale = a.v_descale = &ds;
                const double t0 = seconds();
                assert_int_equal(cp_kernel_attn_forward(cs.c[0].ctx, &a), CP_SUCCESS);
                const double t = seconds() - t0;
                if (rep > 0 && t < best[fp8])
                    best[fp8] = t;
            }
        print_message("forward S=%lld H=%d D=%d %s, %s: BF16 %.1f ms, FP8 %.1f ms (x%.3f)\n", (long long)S, H, D,
                      causal ? "causal" : "nomask", cs.c[0].name, best[0] * 1e3, best[1] * 1e3, best[1] / best[0]);
    }
    free(q8), free(k8), free(v8), free(q16), free(k16), free(v16), free(o), free(lse);
}

/* ---- argument checks ----------------------------------------------------- */

static cp_kernel_attn_args tiny_fp8_args(const uint8_t *q, const uint8_t *k, const uint8_t *v, void *o, float *lse)
{
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = FP8;
    a.batch = 1, a.num_heads = 2, a.num_kv_heads = 1, a.head_dim = 4, a.seq_q = a.seq_k = 4;
    a.mask = CP_MASK_CAUSAL;
    a.q = q, a.k = k, a.v = v, a.o = o, a.o_dtype = CP_DTYPE_BF16, a.lse = lse;
    return a;
}

static void test_kernel_bad_arguments(void **state)
{
    (void)state;
    cp_context *ctx = cs.c[0].ctx;
    _Alignas(16) uint8_t q[64], k[64], v[64];
    _Alignas(16) float o[64], lse[16], dq[64], dk[64], dv[64], dout[64], desc[4] = { 1, 1, 1, 1 };
    for (int i = 0; i < 64; i++)
        q[i] = k[i] = v[i] = (uint8_t)(0x30 + i % 16);
    cp_kernel_attn_args a = tiny_fp8_args(q, k, v, o, lse);
    assert_int_equal(cp_kernel_attn_forward(ctx, &a), CP_SUCCESS);
    a.o_dtype = CP_DTYPE_F32;
    assert_int_equal(cp_kernel_attn_forward(ctx, &a), CP_SUCCESS);
    /* FP8 is no type of results */
    a.o_dtype = FP8;
    EXPECT_ERROR(cp_kernel_attn_forward(ctx, &a), CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 4 (FP8_E4M3");
    a.o_dtype = CP_DTYPE_F16;
    EXPECT_ERROR(cp_kernel_attn_forward(ctx, &a), CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 1");
    assert_non_null(strstr(cp_last_error(), "CP_DTYPE_BF16 or CP_DTYPE_F32"));
    size_t bytes = 7;
    EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, &a, 0, &bytes), CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 1");
    assert_int_equal(bytes, 0);
    /* forward only */
    a = tiny_fp8_args(q, k, v, o, lse);
    a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv, a.grad_dtype = CP_DTYPE_F32;
    EXPECT_ERROR(cp_kernel_attn_backward(ctx, &a), CP_ERROR_UNSUPPORTED, "a->dtype = CP_DTYPE_FP8_E4M3");
    assert_non_null(strstr(cp_last_error(), "cp_kernel_attn_backward"));
    EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, &a, 1, &bytes), CP_ERROR_UNSUPPORTED, "forward only");
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 0, &bytes), CP_SUCCESS);
    assert_true(bytes > 0);
    /* descales: FP8 only, aligned, a flag of 0 or 1 */
    a = tiny_fp8_args(q, k, v, o, lse);
    a.descale_per_head = 2;
    EXPECT_ERROR(cp_kernel_attn_forward(ctx, &a), CP_ERROR_INVALID_ARGUMENT, "a->descale_per_head = 2");
    a.descale_per_head = 0;
    a.k_descale = (const float *)((const char *)desc + 2);
    EXPECT_ERROR(cp_kernel_attn_forward(ctx, &a), CP_ERROR_INVALID_ARGUMENT, "a->k_descale = ");
    cp_kernel_attn_args f = f32_kernel_attn_args(1, 2, 1, 4, 4, 4, o, o, o, dq, lse, NULL, NULL, NULL, NULL);
    const char *names[] = { "a->q_descale is set but a->dtype = 0 (F32)", "a->k_descale is set",
                            "a->v_descale is set" };
    for (int i = 0; i < 3; i++) {
        cp_kernel_attn_args b = f;
        *(i == 0 ? &b.q_descale : i == 1 ? &b.k_descale : &b.v_descale) = desc;
        EXPECT_ERROR(cp_kernel_attn_forward(ctx, &b), CP_ERROR_INVALID_ARGUMENT, names[i]);
        b.dtype = CP_DTYPE_BF16, b.o_dtype = CP_DTYPE_F32;
        EXPECT_ERROR(cp_kernel_attn_forward(ctx, &b), CP_ERROR_INVALID_ARGUMENT, "(BF16): descales scale FP8");
    }
    /* the merge takes no FP8 */
    cp_kernel_merge_args m = CP_KERNEL_MERGE_ARGS_INIT;
    m.batch = 1, m.seq = 4, m.num_heads = 2, m.head_dim_v = 4;
    m.o = o, m.o_dtype = FP8, m.lse = lse, m.o_part = dq, m.o_part_dtype = CP_DTYPE_F32, m.lse_part = lse;
    EXPECT_ERROR(cp_kernel_merge(ctx, &m), CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 4 (CP_DTYPE_FP8_E4M3 is an input");
    m.o_dtype = CP_DTYPE_F32, m.o_part_dtype = FP8;
    EXPECT_ERROR(cp_kernel_merge(ctx, &m), CP_ERROR_INVALID_ARGUMENT, "a->o_part_dtype = 4");
}

/*
 * struct_size versioning: a caller of the 1.1 cp_kernel_attn_args (ending at
 * num_rects) gets descales of 1 whatever lies past its struct; a backend
 * whose kernel arguments end before the descales refuses FP8 and descales
 * naming the field and the backend (and plans of FP8 on it).
 */
static void test_versions_and_backends(void **state)
{
    (void)state;
    cp_context *ctx = cs.c[0].ctx;
    _Alignas(16) uint8_t q[64], k[64], v[64];
    _Alignas(16) uint16_t o[64], o11[64];
    _Alignas(16) float lse[16], lse11[16];
    static const float junk[4] = { NAN, NAN, NAN, NAN };
    for (int i = 0; i < 64; i++)
        q[i] = k[i] = v[i] = (uint8_t)(0x28 + i % 24);
    memset(o, 0, sizeof o), memset(o11, 0, sizeof o11), memset(lse, 0, sizeof lse), memset(lse11, 0, sizeof lse11);
    const size_t v11 = offsetof(cp_kernel_attn_args, q_descale);
    cp_kernel_attn_args a = tiny_fp8_args(q, k, v, o, lse);
    assert_int_equal(cp_kernel_attn_forward(ctx, &a), CP_SUCCESS);
    cp_kernel_attn_args old = tiny_fp8_args(q, k, v, o11, lse11);
    old.struct_size = v11;
    old.q_descale = old.k_descale = old.v_descale = junk; /* past a 1.1 caller's struct: not read */
    old.descale_per_head = 7;
    assert_int_equal(cp_kernel_attn_forward(ctx, &old), CP_SUCCESS);
    assert_memory_equal(o, o11, sizeof o);
    assert_memory_equal(lse, lse11, sizeof lse);

    cp_context fake = *ctx;
    cp_backend_ops ops = *fake.ops;
    fake.ops = &ops;
    const struct {
        size_t struct_size, args_size;
    } tables[] = {
        { sizeof ops, v11 },                                               /* a 1.1 module */
        { sizeof ops, 0 },                                                 /* one that says nothing */
        { offsetof(cp_backend_ops, kernel_args_size), sizeof(cp_kernel_attn_args) }, /* older than the field */
    };
    cp_comm *comm = NULL;
    assert_int_equal(cp_comm_create_local(1, &comm), CP_SUCCESS);
    for (size_t ti = 0; ti < sizeof tables / sizeof tables[0]; ti++) {
        ops.struct_size = tables[ti].struct_size;
        ops.kernel_args_size = tables[ti].args_size;
        a = tiny_fp8_args(q, k, v, o, lse);
        EXPECT_ERROR(cp_kernel_attn_forward(&fake, &a), CP_ERROR_UNSUPPORTED, "dtype = CP_DTYPE_FP8_E4M3 is set");
        assert_non_null(strstr(cp_last_error(), "cpu backend"));
        assert_non_null(strstr(cp_last_error(), "API 1.2"));
        size_t bytes;
        EXPECT_ERROR(cp_kernel_attn_workspace_size(&fake, &a, 0, &bytes), CP_ERROR_UNSUPPORTED, "FP8");
        a.v_descale = junk;
        EXPECT_ERROR(cp_kernel_attn_forward(&fake, &a), CP_ERROR_UNSUPPORTED, "v_descale is set");
        /* a plan of FP8 on such a backend */
        cp_group *g = NULL;
        assert_int_equal(cp_group_create(&fake, comm, NULL, &g), CP_SUCCESS);
        cp_attn_desc d = CP_ATTN_DESC_INIT;
        d.dtype = FP8, d.batch = 1, d.seq_len = 16, d.num_heads = d.num_kv_heads = 2, d.head_dim = 8;
        cp_attn_plan *p = (cp_attn_plan *)&d;
        EXPECT_ERROR(cp_attn_plan_create(g, &d, &p), CP_ERROR_UNSUPPORTED,
                     "desc->dtype = CP_DTYPE_FP8_E4M3 needs kernels with FP8 inputs");
        assert_null(p);
        d.dtype = CP_DTYPE_BF16; /* the others still plan there */
        assert_int_equal(cp_attn_plan_create(g, &d, &p), CP_SUCCESS);
        cp_attn_plan_destroy(p);
        cp_group_destroy(g);
    }
    cp_comm_destroy(comm);
}

/* One rank: an FP8 plan and the calls that take or refuse it. */
static void test_plan_bad_arguments(void **state)
{
    (void)state;
    cp_context *ctx = cs.c[0].ctx;
    cp_comm *comm = NULL;
    cp_group *g = NULL;
    assert_int_equal(cp_comm_create_local(1, &comm), CP_SUCCESS);
    assert_int_equal(cp_group_create(ctx, comm, NULL, &g), CP_SUCCESS);
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.dtype = FP8, d.batch = 1, d.seq_len = 16, d.num_heads = 2, d.num_kv_heads = 1, d.head_dim = 8;
    cp_attn_plan *p = NULL, *pb = NULL;
    assert_int_equal(cp_attn_plan_create(g, &d, &p), CP_SUCCESS);
    size_t wf = 1, wb = 1;
    assert_int_equal(cp_attn_workspace_size(p, &wf, &wb), CP_SUCCESS);
    assert_true(wf > 0);
    assert_int_equal(wb, 0); /* forward only */
    _Alignas(64) uint8_t q[256], k[128], v[128];
    _Alignas(64) uint16_t out[256], bq[256], bk[128], bv[128], bo[256];
    _Alignas(64) float lse[32], desc[4] = { 0.5f, 0.25f, 2.0f, 1.0f }, g32[256];
    for (int i = 0; i < 256; i++)
        q[i] = (uint8_t)(0x30 + i % 13), bq[i] = 0x3f80;
    for (int i = 0; i < 128; i++)
        k[i] = v[i] = (uint8_t)(0x31 + i % 11), bk[i] = bv[i] = 0x3f80;
    assert_int_equal(cp_attn_forward(p, q, k, v, out, lse, NULL, 0), CP_SUCCESS); /* descales 1 */
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    x.q_descale = desc, x.k_descale = desc + 1, x.v_descale = desc + 2;
    assert_int_equal(cp_attn_forward_ex(p, q, k, v, out, lse, &x), CP_SUCCESS);
    x.descale_per_head = 1; /* q: 2 heads, k and v: 1 */
    assert_int_equal(cp_attn_forward_ex(p, q, k, v, out, lse, &x), CP_SUCCESS);
    x.descale_per_head = 2;
    EXPECT_ERROR(cp_attn_forward_ex(p, q, k, v, out, lse, &x), CP_ERROR_INVALID_ARGUMENT, "x->descale_per_head = 2");
    x.descale_per_head = 0;
    x.v_descale = (const float *)((const char *)desc + 1);
    EXPECT_ERROR(cp_attn_forward_ex(p, q, k, v, out, lse, &x), CP_ERROR_INVALID_ARGUMENT, "x->v_descale = ");
    /* out is BF16: aligned to 2 bytes */
    EXPECT_ERROR(cp_attn_forward(p, q, k, v, (char *)out + 1, lse, NULL, 0), CP_ERROR_INVALID_ARGUMENT,
                 "out = ");
    /* a 1.1 caller's cp_attn_args: descales 1 whatever follows it */
    cp_attn_args old = CP_ATTN_ARGS_INIT;
    old.struct_size = offsetof(cp_attn_args, q_descale);
    old.q_descale = (const float *)(uintptr_t)1; /* junk past its struct */
    old.descale_per_head = 9;
    assert_int_equal(cp_attn_forward_ex(p, q, k, v, out, lse, &old), CP_SUCCESS);
    old.struct_size = offsetof(cp_attn_args, q_descale) - 1;
    EXPECT_ERROR(cp_attn_forward_ex(p, q, k, v, out, lse, &old), CP_ERROR_INVALID_ARGUMENT, "x->struct_size");
    /* forward only */
    EXPECT_ERROR(cp_attn_backward(p, q, k, v, out, lse, out, q, k, v, NULL, 0), CP_ERROR_UNSUPPORTED,
                 "cp_attn_backward: the plan's desc->dtype = CP_DTYPE_FP8_E4M3");
    x = (cp_attn_args)CP_ATTN_ARGS_INIT;
    EXPECT_ERROR(cp_attn_backward_ex(p, q, k, v, out, lse, out, q, k, v, &x), CP_ERROR_UNSUPPORTED,
                 "cp_attn_backward_ex: the plan's desc->dtype = CP_DTYPE_FP8_E4M3");
    EXPECT_ERROR(cp_attn_backward_ex(p, q, k, v, out, lse, out, q, k, v, NULL), CP_ERROR_UNSUPPORTED, "forward only");

    /* descales with another dtype */
    d.dtype = CP_DTYPE_BF16;
    assert_int_equal(cp_attn_plan_create(g, &d, &pb), CP_SUCCESS);
    static const char *needles[] = { "x->q_descale is set but the plan's desc->dtype = 2 (BF16)",
                                     "x->k_descale is set", "x->v_descale is set" };
    for (int i = 0; i < 3; i++) {
        x = (cp_attn_args)CP_ATTN_ARGS_INIT;
        *(i == 0 ? &x.q_descale : i == 1 ? &x.k_descale : &x.v_descale) = desc;
        EXPECT_ERROR(cp_attn_forward_ex(pb, bq, bk, bv, bo, lse, &x), CP_ERROR_INVALID_ARGUMENT, needles[i]);
        EXPECT_ERROR(cp_attn_backward_ex(pb, bq, bk, bv, bo, lse, bo, bq, bk, bv, &x), CP_ERROR_INVALID_ARGUMENT,
                     needles[i]);
    }
    cp_attn_plan_destroy(pb);

    /* the other functions that take a cp_dtype */
    EXPECT_ERROR(cp_grad_all_reduce(ctx, comm, g32, 16, FP8, CP_GRAD_SUM, 0), CP_ERROR_INVALID_ARGUMENT,
                 "dtype = CP_DTYPE_FP8_E4M3");
    cp_topology_config tc = CP_TOPOLOGY_CONFIG_INIT;
    tc.world_size = 2, tc.cp = 2;
    cp_topology *t = NULL;
    assert_int_equal(cp_topology_create(&tc, &t), CP_SUCCESS);
    d.dtype = FP8;
    cp_ckpt_meta *meta = NULL;
    assert_int_equal(cp_ckpt_meta_create(t, &d, &meta), CP_SUCCESS);
    int64_t dt = -1;
    assert_int_equal(cp_ckpt_meta_get(meta, "dtype", &dt), CP_SUCCESS);
    assert_int_equal(dt, FP8);
    char json[4096];
    size_t len = 0;
    assert_int_equal(cp_ckpt_meta_to_json(meta, json, sizeof json, &len), CP_SUCCESS);
    assert_non_null(strstr(json, "\"fp8_e4m3\""));
    cp_ckpt_meta *back = NULL;
    assert_int_equal(cp_ckpt_meta_from_json(json, len, &back), CP_SUCCESS);
    cp_ckpt_verdict verdict;
    assert_int_equal(cp_ckpt_meta_check(meta, back, &verdict, NULL, 0), CP_SUCCESS);
    assert_int_equal(verdict, CP_CKPT_IDENTICAL);
    cp_ckpt_meta_destroy(back);
    cp_ckpt_meta_destroy(meta);
    /* the activations around an FP8 attention are BF16 */
    int64_t shape[3];
    size_t sbytes = 0, bf16_bytes = 0;
    assert_int_equal(cp_stage_shape(t, &d, 64, 0, shape, &sbytes), CP_SUCCESS);
    d.dtype = CP_DTYPE_BF16;
    assert_int_equal(cp_stage_shape(t, &d, 64, 0, shape, &bf16_bytes), CP_SUCCESS);
    assert_int_equal(sbytes, bf16_bytes);
    cp_topology_destroy(t);
    /* data movement of FP8 tokens: shard by token bytes */
    uint8_t global[16 * 6], local[8 * 6];
    for (int i = 0; i < 16 * 6; i++)
        global[i] = (uint8_t)i;
    assert_int_equal(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 1, global, local, 1, 16, 6), CP_SUCCESS);
    assert_memory_equal(local, global + 4 * 6, 4 * 6);      /* chunk 1 */
    assert_memory_equal(local + 4 * 6, global + 8 * 6, 4 * 6); /* chunk 2 */

    cp_attn_plan_destroy(p);
    cp_group_destroy(g);
    cp_comm_destroy(comm);
}

/* ---- plans on worlds of ranks ----------------------------------------------- */

/* A rank's refused backward takes part in the call: in a world of 2, rank 0
 * calls the backward of an FP8 plan and rank 1 its forward; rank 0 gets
 * CP_ERROR_UNSUPPORTED, rank 1 CP_ERROR_MISMATCH naming rank 0 at once
 * (not after the timeout), and the next forward pairs up. */
typedef struct refuse_job {
    cp_status first[2], second[2];
    char error[2][512];
} refuse_job;

static void refuse_rank(world_rank *r, void *arg)
{
    refuse_job *j = arg;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.timeout_ms = 60000;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.dtype = FP8, d.batch = 1, d.seq_len = 32, d.num_heads = 2, d.num_kv_heads = 2, d.head_dim = 8;
    const fixture_cfg fc = { .context = &cc, .group = &gc, .desc = &d };
    if (fixture_open(r, &fc) != CP_SUCCESS)
        return;
    uint8_t q[16 * 2 * 8], k[16 * 2 * 8], v[16 * 2 * 8];
    _Alignas(16) uint16_t out[16 * 2 * 8];
    float lse[2 * 16];
    memset(q, 0x30, sizeof q), memset(k, 0x31, sizeof k), memset(v, 0x32, sizeof v);
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    if (r->rank == 0)
        j->first[0] = cp_attn_backward_ex(r->fx.plan, q, k, v, out, lse, out, q, k, v, &x);
    else
        j->first[1] = cp_attn_forward_ex(r->fx.plan, q, k, v, out, lse, &x);
    snprintf(j->error[r->rank], sizeof j->error[r->rank], "%s", cp_last_error());
    j->second[r->rank] = cp_attn_forward_ex(r->fx.plan, q, k, v, out, lse, &x);
}

static void test_refused_backward_takes_part(void **state)
{
    (void)state;
    refuse_job j;
    memset(&j, 0, sizeof j);
    world w;
    const double t0 = seconds();
    if (world_run(&w, 2, NULL, refuse_rank, &j) != CP_SUCCESS)
        fail_msg("%s", w.error);
    const double t = seconds() - t0;
    if (j.first[0] != CP_ERROR_UNSUPPORTED || !strstr(j.error[0], "CP_DTYPE_FP8_E4M3"))
        fail_msg("rank 0's backward: status %d (%s)", (int)j.first[0], j.error[0]);
    if (j.first[1] != CP_ERROR_MISMATCH || !strstr(j.error[1], "rank 0"))
        fail_msg("rank 1's forward: status %d (%s)", (int)j.first[1], j.error[1]);
    assert_int_equal(j.second[0], CP_SUCCESS);
    assert_int_equal(j.second[1], CP_SUCCESS);
    if (t > 30)
        fail_msg("the ranks took %.1f s: rank 1 waited for a timeout", t);
}

/* A CP configuration's FP8 inputs: values of the format (q, k in [-8, 8], v
 * in [-200, 200]), descales and sinks per head (a configuration without
 * per-head descales takes the first of each), and the model's forward on
 * the values times their descales. */
static void cp_data_make(const cpattn_cfg *c, uint64_t seed, cpattn_data *d)
{
    memset(d, 0, sizeof *d);
    ref_rng r = { seed * 0x9E3779B97F4A7C15ULL + 3 };
    d->q = fp8_values(&r, cpattn_nq(c), 8.0);
    d->k = fp8_values(&r, cpattn_nk(c), 8.0);
    d->v = fp8_values(&r, cpattn_nv(c), 200.0);
    d->sinks = calloc((size_t)c->H, sizeof *d->sinks);
    assert_non_null(d->sinks);
    for (int h = 0; h < c->H; h++) {
        d->qd[h] = (float)ref_rng_uniform(&r, 0.03, 0.3);
        d->kd[h] = (float)ref_rng_uniform(&r, 0.05, 0.5);
        d->vd[h] = (float)ref_rng_uniform(&r, 1e-3, 1e-2);
        d->sinks[h] = (float)ref_rng_uniform(&r, -1.5, 1.5);
    }
    cpattn_results_alloc(c, d);
    double *q = descaled(d->q, c->B, c->S, c->H, c->D, d->qd, c->per_head);
    double *k = descaled(d->k, c->B, c->S, c->Hkv, c->D, d->kd, c->per_head);
    double *v = descaled(d->v, c->B, c->S, c->Hkv, c->Dv, d->vd, c->per_head);
    const model_shape m = { .batch = c->B, .seq_q = c->S, .seq_k = c->S, .heads = c->H, .kv_heads = c->Hkv,
                            .head_dim = c->D, .head_dim_v = c->Dv, .causal = c->mask == CP_MASK_CAUSAL,
                            .scale = 1.0 / sqrt((double)c->D) };
    const model_ext x = { .window = c->window, .softcap = c->softcap,
                          .cu = c->layout == CP_LAYOUT_PACKED ? c->cu : NULL, .ndocs = c->ndocs,
                          .sinks = c->sinks ? d->sinks : NULL };
    model_forward_ex(&m, &x, q, k, v, d->out, d->lse);
    free(q), free(k), free(v);
}

/* Every mode and layout at CP=1 and CP=P on the same inputs (cpattn.c):
 * CP adds no error. */
static void test_cp_modes_and_layouts(void **state)
{
    (void)state;
    static const int sizes[] = { 2, 4 };
    ref_rng r = { 0xF8F8 };
    int runs = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int layout = 0; layout < 3; layout++)
            for (int si = 0; si < 2; si++) {
                if (quick() && si == 0)
                    continue;
                cpattn_cfg c = { .mode = (cp_mode)mode, .layout = (cp_layout)layout, .dtype = FP8, .P = sizes[si],
                                 .S = 64, .H = 8, .D = 16, .ndocs = 1 };
                c.B = layout == CP_LAYOUT_PACKED ? 1 : 2;
                c.A = mode == CP_MODE_A2A_P2P ? 2 : 1;
                c.format = layout != CP_LAYOUT_PACKED && ref_rng_int(&r, 0, 1) ? CP_FORMAT_SBHD : CP_FORMAT_BSHD;
                c.mask = ref_rng_int(&r, 0, 3) ? CP_MASK_CAUSAL : CP_MASK_NONE;
                c.Hkv = (mode + layout + si) % 2 ? 2 : 8; /* GQA; with a2a on 4 ranks, replicated kv heads */
                c.Dv = ref_rng_int(&r, 0, 1) ? 8 : 16;
                c.per_head = (mode + layout) % 2;
                c.window = ref_rng_int(&r, 0, 2) == 0 ? ref_rng_int(&r, 1, 40) : 0;
                c.softcap = ref_rng_int(&r, 0, 2) == 0 ? 2.5 : 0;
                c.sinks = (int)ref_rng_int(&r, 0, 1);
                if (layout == CP_LAYOUT_PACKED) {
                    static const int64_t docs[][5] = { { 0, 10, 11, 40, 64 }, { 0, 1, 33, 64, 64 } };
                    const int which = (int)ref_rng_int(&r, 0, 1);
                    c.ndocs = which ? 3 : 4;
                    memcpy(c.cu, docs[which], sizeof docs[which]);
                }
                cpattn_data d;
                cp_data_make(&c, (uint64_t)ref_rng_next(&r), &d);
                cpattn_check(&c, &d);
                cpattn_data_free(&d);
                runs++;
            }
    print_message("%d FP8 configurations at CP=1 and CP=P; worst CP=P / CP=1 error ratio: out %.3f, lse %.3f\n", runs,
                  cpattn_worst_ratio[CPATTN_OUT], cpattn_worst_ratio[CPATTN_LSE]);
}

/* What a ring hop of an FP8 plan carries: q, k, v travel in one byte per
 * element, half of BF16's bytes on the same shape. */
typedef struct traffic_job {
    cp_dtype dtype;
    faulty_plan *plan;
} traffic_job;

static void traffic_rank(world_rank *r, void *arg)
{
    const traffic_job *j = arg;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.dtype = j->dtype, d.batch = 1, d.seq_len = 64, d.num_heads = 4, d.num_kv_heads = 2, d.head_dim = 16;
    d.layout = CP_LAYOUT_ZIGZAG;
    const fixture_cfg fc = { .context = &cc, .desc = &d };
    if (fixture_open(r, &fc) != CP_SUCCESS)
        return;
    _Alignas(16) uint16_t q[16 * 4 * 16], k[16 * 2 * 16], v[16 * 2 * 16], o[16 * 4 * 16];
    float lse[4 * 16];
    memset(q, 0x3c, sizeof q), memset(k, 0x3c, sizeof k), memset(v, 0x3c, sizeof v);
    world_fail(r, cp_attn_forward(r->fx.plan, q, k, v, o, lse, NULL, 0), "cp_attn_forward");
}

static long long ring_bytes(cp_dtype t)
{
    faulty_plan plan = { .rank = -1 };
    cp_comm *comms[4];
    assert_int_equal(cp_comm_create_local(4, comms), CP_SUCCESS);
    for (int i = 0; i < 4; i++)
        assert_int_equal(faulty_wrap(&comms[i], &plan), CP_SUCCESS);
    traffic_job j = { t, &plan };
    world w;
    if (world_run(&w, 4, comms, traffic_rank, &j) != CP_SUCCESS)
        fail_msg("%s", w.error);
    return atomic_load(&plan.sendrecv_bytes);
}

static void test_ring_carries_fp8_bytes(void **state)
{
    (void)state;
    const long long b16 = ring_bytes(CP_DTYPE_BF16), b8 = ring_bytes(FP8);
    print_message("p2p ring, P=4 zigzag causal: the forward's hops carry %lld bytes in BF16, %lld in FP8\n", b16, b8);
    assert_true(b16 > 0);
    assert_int_equal(2 * b8, b16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_every_code),
        cmocka_unit_test(test_encode),
        cmocka_unit_test(test_kernel_cases),
        cmocka_unit_test(test_same_as_bf16),
        cmocka_unit_test(test_quantised_vs_bf16),
        cmocka_unit_test(test_nan_codes),
        cmocka_unit_test(test_kernel_bad_arguments),
        cmocka_unit_test(test_versions_and_backends),
        cmocka_unit_test(test_plan_bad_arguments),
        cmocka_unit_test(test_refused_backward_takes_part),
        cmocka_unit_test(test_cp_modes_and_layouts),
        cmocka_unit_test(test_ring_carries_fp8_bytes),
        cmocka_unit_test(test_time_vs_bf16),
    };
    return cmocka_run_group_tests_name("fp8", tests, setup, teardown);
}
