/* SPDX-License-Identifier: MIT */
/*
 * API 1.1 end to end: packed documents, sliding windows, softcaps and sinks
 * under every CP mode, forward and backward, against the FP64 model of
 * attn_model.h (document masks, windows, softcap, sinks and their
 * gradient), written apart from the library. Each configuration runs at
 * CP=1 and CP=P on the same inputs: the error at CP=P must stay within 1.25x
 * of CP=1's (CP adds no error), and CP=1's within a bound per dtype. The
 * runs and that comparison are cpattn.c's (shared with test-fp8.c); the
 * inputs, the model's results and the configurations are this suite's.
 *
 * Documents are random (length-1 documents, one spanning every rank,
 * boundaries on chunk edges), windows random (1, inside a chunk, larger
 * than a rank's share, larger than T); every mode, the hybrid's
 * factorisations, tp = 2 strided groups, both formats for dense layouts,
 * every dtype, MHA and GQA, every balance. Ranks that pass different packs
 * get CP_ERROR_MISMATCH.
 *
 * The GPU build (-DCPRUN_CUDA, suite gpu: gpu-attn-v11) runs the same
 * matrix with every rank a thread with its own CUDA context on the one GPU
 * (as gpu-attn), the tensors in device memory of the rank's context; it
 * skips (exit 77, saying why) without the CUDA module, a driver or a GPU.
 * There the CP=1 bounds of the gradients are test-gpu-kernels.c's (relative
 * RMS 2e-5 / 6e-3 / 4e-2 for F32 / F16 / BF16: the tensor-core backward
 * rounds dS to the storage type for its products) where they are wider
 * than the CPU's; CP=P within 1.25x of CP=1 as on the CPU. Sinks run on a
 * device whose backend has row_dot (the CUDA module since 1.2); the GPU
 * build asks once, and where a plan with sinks is refused
 * (CP_ERROR_UNSUPPORTED naming the sinks) it says so and runs each
 * configuration with sinks without them. test_sinks_on_a_device runs them
 * on the asynchronous pretend device of fakeasync.c in the CPU build.
 *
 * INFINICP_TEST_DTYPES=bf16,f16 (any of f32, f16, bf16) runs only the
 * configurations of those types and says which it skipped: for kernels
 * that do not have every type yet. Unset: every type.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "attn/ring.h"
#include "attn_model.h"
#include "core/context.h"
#include "cpattn.h"
#include "cpref.h"
#include "cprun.h"
#include "fakeasync.h"
#include "world.h"

/* ---- one configuration's data --------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uni(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53 * 2 - 1;
}

static double *alloc_d(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

/* Inputs rounded to the storage type, and the model's results. */
static void make_data(const cpattn_cfg *c, uint64_t seed, cpattn_data *d)
{
    memset(d, 0, sizeof *d);
    d->q = alloc_d(cpattn_nq(c));
    d->k = alloc_d(cpattn_nk(c));
    d->v = alloc_d(cpattn_nv(c));
    d->dout = alloc_d(cpattn_no(c));
    d->sinks = alloc_d((size_t)c->H);
    uint64_t s = seed;
    for (size_t i = 0; i < cpattn_nq(c); i++)
        d->q[i] = cpref_round(2 * uni(&s), c->dtype);
    for (size_t i = 0; i < cpattn_nk(c); i++)
        d->k[i] = cpref_round(2 * uni(&s), c->dtype);
    for (size_t i = 0; i < cpattn_nv(c); i++)
        d->v[i] = cpref_round(uni(&s), c->dtype);
    for (size_t i = 0; i < cpattn_no(c); i++)
        d->dout[i] = cpref_round(uni(&s), c->dtype);
    for (int h = 0; h < c->H; h++)
        d->sinks[h] = (float)(1.5 * uni(&s));
    cpattn_results_alloc(c, d);
    const model_shape m = { .batch = c->B, .seq_q = c->S, .seq_k = c->S, .heads = c->H, .kv_heads = c->Hkv,
                            .head_dim = c->D, .head_dim_v = c->Dv, .causal = c->mask == CP_MASK_CAUSAL,
                            .scale = 1.0 / sqrt((double)c->D) };
    const model_ext x = { .window = c->window, .softcap = c->softcap,
                          .cu = c->layout == CP_LAYOUT_PACKED ? c->cu : NULL, .ndocs = c->ndocs,
                          .sinks = c->sinks ? d->sinks : NULL };
    model_forward_ex(&m, &x, d->q, d->k, d->v, d->out, d->lse);
    /* the backward from the forward's results as the library stores them */
    double *o16 = alloc_d(cpattn_no(c)), *l32 = alloc_d(cpattn_nl(c));
    for (size_t i = 0; i < cpattn_no(c); i++)
        o16[i] = cpref_round(d->out[i], c->dtype);
    for (size_t i = 0; i < cpattn_nl(c); i++)
        l32[i] = (float)d->lse[i];
    model_backward_ex(&m, &x, d->q, d->k, d->v, o16, l32, d->dout, d->dq, d->dk, d->dv, c->sinks ? d->dsinks : NULL);
    double ss = 0;
    for (int h = 0; h < c->H; h++) {
        double a = 0;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t i = 0; i < c->S; i++) {
                double D = 0;
                for (int e = 0; e < c->Dv; e++) {
                    const size_t at = ((((size_t)b * (size_t)c->S + (size_t)i) * (size_t)c->H + (size_t)h) *
                                       (size_t)c->Dv) + (size_t)e;
                    D += d->dout[at] * o16[at];
                }
                const size_t row = ((size_t)b * (size_t)c->H + (size_t)h) * (size_t)c->S + (size_t)i;
                a += fabs(exp(d->sinks[h] - l32[row]) * D);
            }
        ss += a * a;
    }
    d->dsinks_scale = sqrt(ss);
    free(o16);
    free(l32);
}

/* ---- checks ----------------------------------------------------------- */

/* Configurations with sinks that ran without them (CUDA contexts). */
static int sinks_dropped;

static void report_ratios(const char *what)
{
    const double *r = cpattn_worst_ratio;
    print_message("%s: worst CP=P / CP=1 error ratio: out %.3f lse %.3f dq %.3f dk %.3f dv %.3f dsinks %.3f\n", what,
                  r[0], r[1], r[2], r[3], r[4], r[5]);
    memset(cpattn_worst_ratio, 0, sizeof cpattn_worst_ratio);
    if (sinks_dropped)
        print_message("%s: %d configurations with sinks ran without them (sinks: CPU contexts only)\n", what,
                      sinks_dropped);
    sinks_dropped = 0;
}

/*
 * Whether plans with sinks run on cprun_device: on the CPU they do; on the
 * GPU the library is asked once, with a one-rank plan, and must refuse them
 * with CP_ERROR_UNSUPPORTED naming the sinks (sinks.c is host code), or
 * accept them.
 */
static int sinks_run_here(void)
{
    static int known = -1;
    if (cprun_device == CP_DEVICE_CPU)
        return 1;
    if (known >= 0)
        return known;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.device = cprun_device;
    cp_context *ctx = NULL;
    cp_comm *comm = NULL;
    cp_group *g = NULL;
    cp_attn_plan *p = NULL;
    if (cp_context_create(&cc, &ctx) != CP_SUCCESS || cp_comm_create_local(1, &comm) != CP_SUCCESS ||
        cp_group_create(ctx, comm, NULL, &g) != CP_SUCCESS)
        fail_msg("a one-rank group on the GPU: %s", cp_last_error());
    cp_attn_desc desc = CP_ATTN_DESC_INIT;
    desc.dtype = CP_DTYPE_BF16;
    desc.batch = 1;
    desc.seq_len = 64;
    desc.num_heads = desc.num_kv_heads = 4;
    desc.head_dim = 64;
    desc.mask = CP_MASK_CAUSAL;
    desc.mode = CP_MODE_P2P;
    desc.sinks = 1;
    cp_status s = cp_attn_plan_create(g, &desc, &p);
    if (s == CP_SUCCESS) {
        known = 1;
        print_message("sinks: CUDA contexts accept plans with sinks; those configurations run with them\n");
    } else if (s == CP_ERROR_UNSUPPORTED && strstr(cp_last_error(), "sinks")) {
        known = 0;
        print_message("sinks: CPU contexts only; a CUDA context's plan is refused (%s); configurations with sinks "
                      "run without them here\n",
                      cp_last_error());
    } else {
        fail_msg("a plan with sinks on a CUDA context: status %d (%s), expected CP_SUCCESS or CP_ERROR_UNSUPPORTED "
                 "naming the sinks: %s",
                 (int)s, cp_status_string(s), cp_last_error());
    }
    cp_attn_plan_destroy(p);
    cp_group_destroy(g);
    cp_comm_destroy(comm);
    cp_context_destroy(ctx);
    return known;
}

/* CP=1 (one rank, no pack split) and CP=P on the same inputs. */
static void check_cfg(const cpattn_cfg *c, uint64_t seed)
{
    cpattn_data d;
    make_data(c, seed, &d);
    cpattn_check(c, &d);
    cpattn_data_free(&d);
}

/* Whether INFINICP_TEST_DTYPES (see the top of the file) lets
 * configurations of type t run; says once per type when it does not. */
static int dtype_wanted(cp_dtype t)
{
    static int said[4];
    const char *env = getenv("INFINICP_TEST_DTYPES");
    const char *name = t == CP_DTYPE_F32 ? "f32" : t == CP_DTYPE_F16 ? "f16" : t == CP_DTYPE_BF16 ? "bf16" : "f64";
    if (!env || !*env)
        return 1;
    for (const char *p = env; *p;) {
        const size_t n = strcspn(p, ",");
        if (n == strlen(name) && !strncmp(p, name, n))
            return 1;
        p += n + (p[n] == ',');
    }
    if (!said[t & 3]) {
        said[t & 3] = 1;
        print_message("INFINICP_TEST_DTYPES=%s: the %s configurations are skipped\n", env, name);
    }
    return 0;
}

/* check_cfg, on a device that does not run sinks without them; returns
 * whether it ran (INFINICP_TEST_DTYPES). */
static int check(const cpattn_cfg *c, uint64_t seed)
{
    if (!dtype_wanted(c->dtype))
        return 0;
    if (c->sinks && !sinks_run_here()) {
        cpattn_cfg without = *c;
        without.sinks = 0;
        sinks_dropped++;
        check_cfg(&without, seed);
        return 1;
    }
    check_cfg(c, seed);
    return 1;
}

/* ---- configurations ------------------------------------------------- */

static int quick(void)
{
    const char *q = getenv("INFINICP_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* Random documents summing to T: length-1 ones, long ones, boundaries on
 * the chunk grid (multiples of `grid`) now and then. */
static int random_docs(uint64_t *s, int64_t T, int64_t grid, int64_t *cu, int max_docs)
{
    int n = 0;
    cu[0] = 0;
    while (cu[n] < T && n + 1 < max_docs) {
        const uint64_t kind = rng_next(s) % 8;
        int64_t len;
        if (kind == 0)
            len = 1;
        else if (kind == 1)
            len = T; /* the rest: one document spanning many ranks */
        else if (kind == 2 && grid > 1)
            len = grid - cu[n] % grid; /* up to the next chunk boundary */
        else
            len = 1 + (int64_t)(rng_next(s) % (uint64_t)(T / 4));
        if (len > T - cu[n])
            len = T - cu[n];
        cu[n + 1] = cu[n] + len;
        n++;
    }
    if (cu[n] < T) {
        cu[n] = T;
    }
    return n;
}

static int64_t random_window(uint64_t *s, int64_t T, int P)
{
    switch (rng_next(s) % 6) {
    case 0: return 0;
    case 1: return 1;
    case 2: return 1 + (int64_t)(rng_next(s) % 5);   /* inside a chunk */
    case 3: return T / P + 3;                           /* larger than a rank's share */
    case 4: return T + 5;                               /* larger than everything */
    default: return 1 + (int64_t)(rng_next(s) % (uint64_t)T);
    }
}

/* The hybrid's factorisations, a2a's head split, and what the heads allow. */
static int mode_ok(const cpattn_cfg *c)
{
    const int split = c->mode == CP_MODE_A2A ? c->P : c->mode == CP_MODE_A2A_P2P ? c->A : 1;
    return c->H % split == 0 && (c->Hkv % split == 0 || split % c->Hkv == 0);
}

static void test_packed(void **state)
{
    (void)state;
    static const cp_dtype dtypes[] = { CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16 };
    static const int sizes[] = { 2, 3, 4, 8 };
    uint64_t s = 0x1111;
    int runs = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int si = 0; si < 4; si++)
            for (int rep = 0; rep < (quick() ? 1 : 12); rep++) {
                cpattn_cfg c = { .mode = (cp_mode)mode, .layout = CP_LAYOUT_PACKED, .P = sizes[si], .B = 1,
                                 .S = 96, .H = 8, .D = 16 };
                c.dtype = dtypes[(mode + si + rep) % 3];
                c.mask = rep % 3 == 2 ? CP_MASK_NONE : CP_MASK_CAUSAL;
                c.Hkv = rng_next(&s) % 2 ? 2 : 8;
                c.Dv = rng_next(&s) % 2 ? 8 : 16;
                c.format = (cp_format)(rng_next(&s) % 2);
                c.A = 1;
                if (c.mode == CP_MODE_A2A_P2P) {
                    static const int fa[] = { 1, 2, 4, 8 };
                    do
                        c.A = fa[rng_next(&s) % 4];
                    while (c.P % c.A);
                }
                c.strided = c.P <= 4 && rng_next(&s) % 4 == 0;
                c.window = random_window(&s, c.S, c.P);
                c.softcap = rng_next(&s) % 3 == 0 ? 2.5 : 0;
                c.sinks = rng_next(&s) % 2;
                static const cp_balance bal[] = { CP_BALANCE_AUTO, CP_BALANCE_GREEDY, CP_BALANCE_CONTIGUOUS };
                c.balance = bal[rng_next(&s) % 3];
                c.chunk = c.balance == CP_BALANCE_GREEDY && rng_next(&s) % 2 ? 4 : 0;
                if (c.chunk && (c.S / c.P) % c.chunk)
                    c.chunk = 0;
                c.ndocs = random_docs(&s, c.S, 4, c.cu, 12);
                if (!mode_ok(&c))
                    continue;
                runs += check(&c, rng_next(&s));
            }
    print_message("packed: %d configurations at CP=1 and CP=P\n", runs);
    report_ratios("packed");
}

/* TE's split for comparison: every document a multiple of 2P. */
static void test_doc_zigzag(void **state)
{
    (void)state;
    uint64_t s = 0x2222;
    for (int mode = 0; mode < 4; mode++) {
        cpattn_cfg c = { .mode = (cp_mode)mode, .layout = CP_LAYOUT_PACKED, .dtype = CP_DTYPE_F32,
                         .mask = CP_MASK_CAUSAL, .P = 4, .A = mode == CP_MODE_A2A_P2P ? 2 : 1, .B = 1, .S = 96,
                         .H = 4, .Hkv = 2, .D = 16, .Dv = 16, .balance = CP_BALANCE_DOC_ZIGZAG, .ndocs = 3,
                         .cu = { 0, 16, 64, 96 } };
        c.window = mode == 1 ? 5 : 0;
        check(&c, rng_next(&s));
    }
}

/* Windows, softcaps and sinks on the dense layouts, every mode. */
static void test_dense(void **state)
{
    (void)state;
    static const cp_dtype dtypes[] = { CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16 };
    uint64_t s = 0x3333;
    int runs = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int layout = 0; layout < 2; layout++)
            for (int rep = 0; rep < (quick() ? 1 : 6); rep++) {
                cpattn_cfg c = { .mode = (cp_mode)mode, .layout = (cp_layout)layout, .B = 2, .S = 48, .H = 4,
                                 .D = 16, .ndocs = 1 };
                c.P = rep % 3 == 0 ? 2 : rep % 3 == 1 ? 4 : 3;
                c.A = c.mode == CP_MODE_A2A_P2P && c.P % 2 == 0 ? 2 : 1;
                c.dtype = dtypes[(mode + layout + rep) % 3];
                c.format = (cp_format)(rng_next(&s) % 2);
                c.mask = rng_next(&s) % 3 ? CP_MASK_CAUSAL : CP_MASK_NONE;
                c.Hkv = rng_next(&s) % 2 ? 2 : 4;
                c.Dv = 16;
                c.window = random_window(&s, c.S, c.P);
                c.softcap = rng_next(&s) % 2 ? 1.5 : 0;
                c.sinks = rng_next(&s) % 2;
                if (!mode_ok(&c))
                    continue;
                runs += check(&c, rng_next(&s));
            }
    print_message("dense: %d configurations at CP=1 and CP=P\n", runs);
    report_ratios("dense");
}

/* More ranks than the matrix: a 16-rank ring over packed documents. */
static void test_large_p(void **state)
{
    (void)state;
    if (quick())
        skip();
    uint64_t s = 0x4444;
    cpattn_cfg c = { .mode = CP_MODE_P2P, .layout = CP_LAYOUT_PACKED, .dtype = CP_DTYPE_F32, .mask = CP_MASK_CAUSAL,
                     .P = 16, .A = 1, .B = 1, .S = 128, .H = 2, .Hkv = 1, .D = 8, .Dv = 8, .window = 20 };
    c.ndocs = random_docs(&s, c.S, 8, c.cu, 20);
    check(&c, rng_next(&s));
    c.mode = CP_MODE_A2A_P2P;
    c.A = 2;
    c.window = 0;
    c.sinks = 1;
    check(&c, rng_next(&s));
}

/* A rank's context on the asynchronous pretend device of fakeasync.c
 * (streams run later on threads of their own, after random delays). */
static cp_status open_pretend(const world_rank *r, const cp_context_config *cc, void *arg, cp_context **out)
{
    (void)cc;
    (void)arg;
    return fakeasync_context(77u + (unsigned)r->rank, 100, r->rank, out);
}

static void close_pretend(cp_context *ctx, void *arg)
{
    (void)arg;
    fakeasync_context_destroy(ctx);
}

/*
 * Sinks on a device context: the forward's merge of the sinks through the
 * backend's merge (their rows filled on the device), the gradient's rowsums
 * through its row_dot and their sum through its sink_grad. The pretend
 * device runs the CPU kernels on streams of its own, so a copy that the
 * code forgot, or ordered wrongly, shows as wrong results; every mode,
 * dense and packed, against the FP64 model with the CPU's bounds. And the
 * backward never makes the host wait for the device (no synchronize, no
 * copy to or from host memory; the plan's own workspace may be allocated
 * by the first call): before the sum moved to the device it waited once
 * per backward, for the whole of it. On the GPU build the whole matrix
 * runs sinks on the GPU already.
 */
#define SINK_RANKS 8
typedef struct bwd_waits {
    fakeasync_waits before[SINK_RANKS];
    unsigned long sync[SINK_RANKS], copies[SINK_RANKS];
} bwd_waits;

static void count_bwd_waits(cp_context *ctx, int after, void *arg)
{
    bwd_waits *w = arg;
    const int r = ctx->device_index;
    if (r < 0 || r >= SINK_RANKS)
        return;
    const fakeasync_waits now = fakeasync_host_waits(ctx->state);
    if (!after) {
        w->before[r] = now;
        return;
    }
    w->sync[r] += now.synchronize - w->before[r].synchronize;
    w->copies[r] += now.host_copy - w->before[r].host_copy;
}

static void test_sinks_on_a_device(void **state)
{
    (void)state;
    if (cprun_device != CP_DEVICE_CPU)
        skip();
    static const fixture_device fake = { open_pretend, close_pretend, NULL };
    bwd_waits waits;
    uint64_t s = 0x5555;
    int runs = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int layout = 0; layout < 3; layout++) {
            cpattn_cfg c = { .mode = (cp_mode)mode, .layout = (cp_layout)layout,
                             .dtype = layout == 1 ? CP_DTYPE_BF16 : CP_DTYPE_F32, .format = CP_FORMAT_BSHD,
                             .mask = CP_MASK_CAUSAL, .P = 4, .B = 1, .S = 64, .H = 4,
                             .Hkv = mode == CP_MODE_A2A ? 4 : 2, .D = 16, .Dv = 16, .sinks = 1, .ndocs = 1,
                             .device = &fake, .bwd_hook = count_bwd_waits, .bwd_hook_arg = &waits };
            c.A = c.mode == CP_MODE_A2A_P2P ? 2 : 1;
            if (c.layout == CP_LAYOUT_PACKED)
                c.ndocs = random_docs(&s, c.S, 4, c.cu, 8);
            c.window = layout == 2 ? 9 : 0;
            if (!mode_ok(&c))
                continue;
            memset(&waits, 0, sizeof waits);
            check_cfg(&c, rng_next(&s));
            for (int r = 0; r < c.P && r < SINK_RANKS; r++)
                if (waits.sync[r] || waits.copies[r])
                    fail_msg("%s, layout %d, sinks: rank %d's backward made the host wait for the device: %lu "
                             "synchronize, %lu copies with host memory",
                             cpattn_mode_name(c.mode), layout, r, waits.sync[r], waits.copies[r]);
            runs++;
        }
    print_message("sinks on the pretend device: %d configurations at CP=1 and CP=P\n", runs);
}

/* Ranks passing different packs: every rank gets CP_ERROR_MISMATCH. Only
 * on CPU contexts: on a device context the forward and backward compare
 * nothing (a vote would make the host wait for the stream in every call;
 * cp_attn_forward_ex(3)). */
static void test_pack_mismatch(void **state)
{
    (void)state;
    if (cprun_device != CP_DEVICE_CPU) {
        print_message("device contexts do not compare packs (cp_attn_forward_ex(3), NOTES)\n");
        skip();
    }
    for (int mode = 0; mode < 4; mode++) {
        cpattn_cfg c = { .mode = (cp_mode)mode, .layout = CP_LAYOUT_PACKED, .dtype = CP_DTYPE_F32,
                         .mask = CP_MASK_CAUSAL, .P = 4, .A = mode == CP_MODE_A2A_P2P ? 2 : 1, .B = 1, .S = 32,
                         .H = 4, .Hkv = 4, .D = 8, .Dv = 8, .ndocs = 3, .cu = { 0, 10, 20, 32 },
                         .balance = CP_BALANCE_CONTIGUOUS };
        cpattn_data d;
        make_data(&c, 7, &d);
        cpattn_data r;
        char err[WORLD_ERROR_MAX];
        cp_status s = cpattn_run(&c, &d, 2, &r, err, sizeof err);
        if (s != CP_SUCCESS)
            fail_msg("%s with different packs: %s", cpattn_mode_name(c.mode), err);
        cpattn_results_free(&r);
        cpattn_data_free(&d);
    }
}

/* Ring geometry under API 1.1 (ring.h with vis.h): what the hops carry. */
static int64_t fwd_rows(cpi_ring *r, int *busy_hops)
{
    int64_t rows = 0;
    *busy_hops = 0;
    for (int step = 1; step < r->size; step++) {
        *busy_hops += !cpi_ring_fwd_idle(r, step);
        for (int m = 0; m < r->size; m++) {
            cpi_ring o = *r;
            o.member = m;
            const cpi_rows in = cpi_ring_fwd_kv_in(&o, step);
            rows += cpi_rows_empty(in) ? 0 : in.hi - in.lo;
        }
    }
    return rows;
}

static void test_ring_geometry(void **state)
{
    (void)state;
    enum { R = 4, SL = 16 };
    cpi_tokset sub[R];
    for (int m = 0; m < R; m++) {
        cpi_span sp = { m * SL, SL };
        assert_int_equal(cpi_tokset_local(&sp, 1, &sub[m]), CP_SUCCESS);
    }
    /* documents on the rank boundaries: nothing ever travels */
    const int64_t cu_local[] = { 0, 5, 16, 32, 40, 48, 64 };
    cpi_vis v = { .causal = true, .cu = cu_local, .ndocs = 6 };
    cpi_ring r = { .size = R, .sub = sub, .causal = true, .vis = &v, .rows_contiguous = true };
    int busy;
    assert_int_equal(fwd_rows(&r, &busy), 0);
    assert_int_equal(busy, 0);
    for (int step = 0; step < R; step++)
        for (int m = 0; m < R; m++) {
            cpi_ring o = r;
            o.member = m;
            assert_true(cpi_ring_bwd_idle(&o, step, 1));
            if (step < R - 1)
                assert_true(cpi_ring_bwd_idle(&o, step, 0));
        }
    /* one document across the ranks, window 3 <= a rank's share: a block is
     * seen by the next rank only, its last 2 rows; in the direction the
     * plan picks that is one busy hop, R - 1 blocks of 2 rows */
    const int64_t cu_one[] = { 0, R * SL };
    v = (cpi_vis){ .causal = true, .window = 3, .cu = cu_one, .ndocs = 1 };
    r.fwd_dir = cpi_ring_pick_fwd_dir(&r);
    assert_int_equal(r.fwd_dir, -1);
    assert_int_equal(fwd_rows(&r, &busy), (R - 1) * 2);
    assert_int_equal(busy, 1);
    r.fwd_dir = 1; /* the other way every hop carries them */
    assert_int_equal(fwd_rows(&r, &busy), (R - 1) * (R - 1) * 2);
    /* without a window the causal contiguous ring needs everything earlier */
    v.window = 0;
    r.fwd_dir = cpi_ring_pick_fwd_dir(&r);
    assert_true(fwd_rows(&r, &busy) > 0);
    for (int m = 0; m < R; m++)
        cpi_tokset_free(&sub[m]);
}

int main(void)
{
    if (cprun_device_missing("the API 1.1 CP suite"))
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed),      cmocka_unit_test(test_doc_zigzag), cmocka_unit_test(test_dense),
        cmocka_unit_test(test_large_p),     cmocka_unit_test(test_pack_mismatch),
        cmocka_unit_test(test_ring_geometry), cmocka_unit_test(test_sinks_on_a_device),
    };
    return cmocka_run_group_tests_name("attn-v11", tests, NULL, NULL);
}
