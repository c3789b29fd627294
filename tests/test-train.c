/* SPDX-License-Identifier: MIT */
/*
 * Training helpers: cp_loss_reduce and cp_grad_all_reduce on in-process
 * worlds (one thread per rank) and on DPxCP sub-communicators split with
 * cp_topology_color, in host memory and on a pretend device, against serial
 * FP64 sums computed here; cp_seq_local_len and cp_stage_shape against the
 * arithmetic written out here; bad arguments and ranks that disagree.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/context.h"
#include "fakedev.h"
#include "testutil.h"
#include "world.h"

#define MAX_RANKS 8

/* ---- one thread per rank ------------------------------------------------- */

/* A fresh world of n ranks; fn runs on each rank's thread. Threads only
 * record what they see; the main thread asserts. */
static void run_world(int n, world_main fn, void *arg)
{
    world w;
    if (world_run(&w, n, NULL, fn, arg) != CP_SUCCESS)
        fail_msg("%s", w.error);
}

/* What a rank saw: status and message of its call. */
typedef struct seen {
    cp_status s;
    char msg[512];
} seen;

static void see(seen *o, cp_status s)
{
    o->s = s;
    snprintf(o->msg, sizeof o->msg, "%s", s == CP_SUCCESS ? "" : cp_last_error());
}

static uint64_t rng_next(uint64_t *st)
{
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return *st >> 11;
}

static double uniform(uint64_t *st) /* [-1, 1) */
{
    return (double)rng_next(st) * 0x1.0p-52 - 1.0;
}

/* The pretend device: memory only its own backend table can read. */
static cp_context fake_ctx;

/* ---- 16-bit storage, written out independently of the library ------------ */

static double bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t bf16_round(float f) /* nearest even; test data has no NaN */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static double f16_value(uint16_t h)
{
    _Float16 x;
    memcpy(&x, &h, 2);
    return (double)x;
}

static uint16_t f16_round(float f)
{
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

static size_t esize(cp_dtype t)
{
    return t == CP_DTYPE_F64 ? 8 : t == CP_DTYPE_F32 ? 4 : 2;
}

static double get(const void *p, cp_dtype t, size_t i)
{
    switch (t) {
    case CP_DTYPE_F32: return ((const float *)p)[i];
    case CP_DTYPE_F64: return ((const double *)p)[i];
    case CP_DTYPE_BF16: return bf16_value(((const uint16_t *)p)[i]);
    case CP_DTYPE_F16: return f16_value(((const uint16_t *)p)[i]);
    case CP_DTYPE_FP8_E4M3: break; /* no type of gradients */
    }
    return NAN;
}

static void put(void *p, cp_dtype t, size_t i, double v)
{
    switch (t) {
    case CP_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case CP_DTYPE_F64: ((double *)p)[i] = v; break;
    case CP_DTYPE_BF16: ((uint16_t *)p)[i] = bf16_round((float)v); break;
    case CP_DTYPE_F16: ((uint16_t *)p)[i] = f16_round((float)v); break;
    case CP_DTYPE_FP8_E4M3: break; /* no type of gradients */
    }
}

/* Spacing of representable numbers of type t around v (one ulp). */
static double ulp(cp_dtype t, double v)
{
    int mant = t == CP_DTYPE_F64 ? 52 : t == CP_DTYPE_F32 ? 23 : t == CP_DTYPE_BF16 ? 7 : 10;
    int e;
    frexp(v == 0 ? 1e-30 : v, &e);
    return ldexp(1.0, e - 1 - mant);
}

/* ---- cp_loss_reduce ------------------------------------------------------ */

typedef struct loss_case {
    double loss[MAX_RANKS];
    int64_t tokens[MAX_RANKS];
    int use_ctx;        /* pass a CPU context (else NULL = host memory) */
    int use_fake;       /* pass the pretend device's context */
    unsigned axes;      /* 0: the world; else split by cp_topology_color */
    const cp_topology *t;
    double mean[MAX_RANKS];
    int64_t total[MAX_RANKS];
    int group[MAX_RANKS]; /* color of each rank's group */
    seen r[MAX_RANKS];
} loss_case;

static void loss_rank(world_rank *wr, void *arg)
{
    const int rank = wr->rank;
    loss_case *c = arg;
    cp_comm *comm = wr->comm, *split = NULL;
    cp_context *ctx = NULL;
    c->group[rank] = 0;
    if (c->axes) {
        int color, key;
        if (cp_topology_color(c->t, rank, c->axes, &color, &key) != CP_SUCCESS ||
            cp_comm_split(wr->comm, color, key, &split) != CP_SUCCESS) {
            see(&c->r[rank], CP_ERROR_INTERNAL);
            return;
        }
        comm = split;
        c->group[rank] = color;
    }
    if (c->use_ctx)
        cp_context_create(NULL, &ctx);
    see(&c->r[rank], cp_loss_reduce(c->use_fake ? &fake_ctx : ctx, comm, c->loss[rank], c->tokens[rank],
                                    &c->mean[rank], &c->total[rank]));
    cp_context_destroy(ctx);
    cp_comm_destroy(split);
}

static void check_loss(loss_case *c, int n)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(c->r[i].s, CP_SUCCESS);
        /* serial reference over the ranks of i's group */
        double sum = 0;
        int64_t tok = 0;
        for (int j = 0; j < n; j++)
            if (c->group[j] == c->group[i]) {
                sum += c->loss[j];
                tok += c->tokens[j];
            }
        double want = tok ? sum / (double)tok : 0.0;
        assert_int_equal(c->total[i], tok);
        assert_true(fabs(c->mean[i] - want) <= 1e-14 * fabs(want));
    }
}

static void test_loss_reduce_matches_serial(void **state)
{
    (void)state;
    uint64_t st = 7;
    for (int n = 1; n <= 4; n++) {
        for (int mode = 0; mode < 3; mode++) {
            loss_case c = { .use_ctx = mode == 1, .use_fake = mode == 2 };
            for (int i = 0; i < n; i++) {
                c.tokens[i] = (int64_t)(rng_next(&st) % 1000);
                c.loss[i] = (double)c.tokens[i] * (2.0 + uniform(&st)); /* ~2 nats per token */
            }
            c.tokens[n - 1] = 0; /* a rank without tokens weighs nothing */
            c.loss[n - 1] = 0;
            run_world(n, loss_rank, &c);
            check_loss(&c, n);
        }
    }
}

static void test_loss_reduce_over_dpxcp_groups(void **state)
{
    (void)state;
    /* world 8 = tp 2 x cp 2 x dp 2: two DPxCP groups of 4, strided by tp */
    cp_topology_config tc = CP_TOPOLOGY_CONFIG_INIT;
    tc.world_size = 8;
    tc.tp = 2;
    tc.cp = 2;
    cp_topology *t;
    assert_int_equal(cp_topology_create(&tc, &t), CP_SUCCESS);
    loss_case c = { .axes = CP_AXIS_DP | CP_AXIS_CP, .t = t };
    for (int i = 0; i < 8; i++) {
        c.tokens[i] = 100 + 10 * i;
        c.loss[i] = 3.0 * (double)c.tokens[i] + i;
    }
    run_world(8, loss_rank, &c);
    check_loss(&c, 8);
    /* the two groups are {0,2,4,6} and {1,3,5,7}: their means differ */
    assert_int_not_equal(c.group[0], c.group[1]);
    assert_true(c.mean[0] != c.mean[1]);
    cp_topology_destroy(t);
}

static void test_loss_reduce_all_empty_and_nan(void **state)
{
    (void)state;
    loss_case c = { 0 };
    run_world(3, loss_rank, &c);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(c.r[i].s, CP_SUCCESS);
        assert_true(c.mean[i] == 0.0);
        assert_int_equal(c.total[i], 0);
    }
    loss_case d = { .loss = { 1.0, NAN }, .tokens = { 1, 1 } };
    run_world(2, loss_rank, &d);
    assert_int_equal(d.r[0].s, CP_SUCCESS);
    assert_true(isnan(d.mean[0]) && isnan(d.mean[1])); /* divergence is seen everywhere */
}

static void test_loss_reduce_bad_arguments(void **state)
{
    (void)state;
    double mean = 0;
    int64_t total = 5;
    EXPECT_ERROR(cp_loss_reduce(NULL, NULL, 1.0, 1, &mean, &total), CP_ERROR_INVALID_ARGUMENT, "comm");
    assert_true(isnan(mean));
    assert_int_equal(total, 0);

    cp_comm *one;
    assert_int_equal(cp_comm_create_local(1, &one), CP_SUCCESS);
    EXPECT_ERROR(cp_loss_reduce(NULL, one, 1.0, 1, NULL, NULL), CP_ERROR_INVALID_ARGUMENT, "mean");
    EXPECT_ERROR(cp_loss_reduce(NULL, one, 1.0, -3, &mean, NULL), CP_ERROR_INVALID_ARGUMENT, "tokens = -3");
    EXPECT_ERROR(cp_loss_reduce(NULL, one, 1.0, ((int64_t)1 << 53) + 1, &mean, NULL), CP_ERROR_INVALID_ARGUMENT,
                 "tokens = 9007199254740993");
    cp_comm_destroy(one);

    /* one rank's bad count fails its peers at once (no timeout) */
    loss_case c = { .loss = { 1, 1, 1 }, .tokens = { 4, -1, 4 } };
    run_world(3, loss_rank, &c);
    assert_int_equal(c.r[1].s, CP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(c.r[1].msg, "tokens = -1"));
    for (int i = 0; i < 3; i += 2) {
        assert_int_equal(c.r[i].s, CP_ERROR_MISMATCH);
        assert_non_null(strstr(c.r[i].msg, "rejected"));
        assert_true(isnan(c.mean[i]));
    }

    /* totals beyond 2^53 are refused on every rank alike */
    loss_case big = { .tokens = { (int64_t)1 << 53, (int64_t)1 << 53 } };
    run_world(2, loss_rank, &big);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(big.r[i].s, CP_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(big.r[i].msg, "exceeds 2^53"));
    }
}

/* ---- cp_grad_all_reduce -------------------------------------------------- */

#define GUARD 3 /* elements past count that must stay untouched */

typedef struct grad_case {
    cp_dtype dtype;
    cp_grad_reduce op;
    size_t count, bucket;
    int mem;            /* 0: host, NULL ctx; 1: host, CPU ctx; 2: pretend device */
    unsigned axes;
    const cp_topology *t;
    void *in[MAX_RANKS];  /* each rank's input, host memory, count + GUARD */
    void *out[MAX_RANKS]; /* what the call left, host memory */
    int group[MAX_RANKS];
    size_t count_of[MAX_RANKS]; /* per-rank count override (0: count) */
    int op_of[MAX_RANKS];       /* per-rank op override (-1: op) */
    seen r[MAX_RANKS];
} grad_case;

static void grad_rank(world_rank *wr, void *arg)
{
    const int rank = wr->rank;
    grad_case *c = arg;
    cp_comm *comm = wr->comm, *split = NULL;
    cp_context *ctx = NULL;
    c->group[rank] = 0;
    if (c->axes) {
        int color, key;
        if (cp_topology_color(c->t, rank, c->axes, &color, &key) != CP_SUCCESS ||
            cp_comm_split(wr->comm, color, key, &split) != CP_SUCCESS) {
            see(&c->r[rank], CP_ERROR_INTERNAL);
            return;
        }
        comm = split;
        c->group[rank] = color;
    }
    const size_t bytes = (c->count + GUARD) * esize(c->dtype);
    memcpy(c->out[rank], c->in[rank], bytes);
    void *buf = c->out[rank];
    cp_context *use = NULL;
    if (c->mem == 1 && cp_context_create(NULL, &ctx) == CP_SUCCESS)
        use = ctx;
    if (c->mem == 2) {
        use = &fake_ctx;
        fake_ctx.ops->alloc(NULL, bytes, &buf);
        fake_ctx.ops->copy_2d(NULL, buf, bytes, c->out[rank], bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE);
    }
    size_t count = c->count_of[rank] ? c->count_of[rank] : c->count;
    cp_grad_reduce op = c->op_of[rank] >= 0 ? (cp_grad_reduce)c->op_of[rank] : c->op;
    see(&c->r[rank], cp_grad_all_reduce(use, comm, buf, count, c->dtype, op, c->bucket));
    if (c->mem == 2) {
        fake_ctx.ops->copy_2d(NULL, c->out[rank], bytes, buf, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST);
        fake_ctx.ops->free(NULL, buf);
    }
    cp_context_destroy(ctx);
    cp_comm_destroy(split);
}

static void grad_alloc(grad_case *c, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        c->in[i] = malloc((c->count + GUARD) * esize(c->dtype));
        c->out[i] = malloc((c->count + GUARD) * esize(c->dtype));
        assert_non_null(c->in[i]);
        assert_non_null(c->out[i]);
        uint64_t st = seed * 1000 + (uint64_t)i;
        for (size_t k = 0; k < c->count + GUARD; k++)
            put(c->in[i], c->dtype, k, uniform(&st) * (1 + (double)(k % 7)));
        c->count_of[i] = 0;
        c->op_of[i] = -1;
    }
}

static void grad_free(grad_case *c, int n)
{
    for (int i = 0; i < n; i++) {
        free(c->in[i]);
        free(c->out[i]);
    }
}

/* Against the serial FP64 sum over each rank's group: F32/F64 within the
 * summation error of the group; F16/BF16 within one ulp of the exact value
 * (the F32 sum is rounded to 16 bits once). Guard elements unchanged. */
static void check_grad(const grad_case *c, int n)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(c->r[i].s, CP_SUCCESS);
        int members = 0;
        for (int j = 0; j < n; j++)
            members += c->group[j] == c->group[i];
        for (size_t k = 0; k < c->count; k++) {
            double sum = 0, mag = 0;
            for (int j = 0; j < n; j++)
                if (c->group[j] == c->group[i]) {
                    sum += get(c->in[j], c->dtype, k);
                    mag += fabs(get(c->in[j], c->dtype, k));
                }
            double div = c->op == CP_GRAD_AVERAGE ? members : 1;
            double want = sum / div, got = get(c->out[i], c->dtype, k);
            double tol = c->dtype == CP_DTYPE_F32   ? 4 * members * 0x1.0p-24 * mag / div
                         : c->dtype == CP_DTYPE_F64 ? 4 * members * 0x1.0p-53 * mag / div
                                                    : ulp(c->dtype, want) + members * 0x1.0p-24 * mag / div;
            if (!(fabs(got - want) <= tol))
                fail_msg("rank %d element %zu: got %.9g want %.9g (dtype %d op %d bucket %zu mem %d)", i, k, got,
                         want, (int)c->dtype, (int)c->op, c->bucket, c->mem);
        }
        assert_memory_equal((const char *)c->out[i] + c->count * esize(c->dtype),
                            (const char *)c->in[i] + c->count * esize(c->dtype), GUARD * esize(c->dtype));
    }
}

static void test_grad_all_reduce_matches_serial(void **state)
{
    (void)state;
    const cp_dtype dtypes[] = { CP_DTYPE_F32, CP_DTYPE_BF16, CP_DTYPE_F16, CP_DTYPE_F64 };
    uint64_t seed = 1;
    for (int di = 0; di < 4; di++)
        for (int op = 0; op < 2; op++)
            for (int mem = 0; mem < 3; mem++) {
                const int n = 3;
                /* a bucket of one element, one that does not divide count, the default */
                const size_t buckets[] = { esize(dtypes[di]), 7 * esize(dtypes[di]) + 1, 0 };
                for (int b = 0; b < 3; b++) {
                    grad_case c = { .dtype = dtypes[di], .op = (cp_grad_reduce)op, .count = 100,
                                    .bucket = buckets[b], .mem = mem };
                    grad_alloc(&c, n, seed++);
                    run_world(n, grad_rank, &c);
                    check_grad(&c, n);
                    grad_free(&c, n);
                }
            }
}

/* Bucketing changes where the calls cut, never the result. */
static void test_grad_all_reduce_bucket_independent(void **state)
{
    (void)state;
    const cp_dtype dtypes[] = { CP_DTYPE_F32, CP_DTYPE_BF16 };
    for (int di = 0; di < 2; di++) {
        void *first[4] = { 0 };
        const size_t es = esize(dtypes[di]), buckets[] = { 0, 64, es, 1000 * es };
        for (int b = 0; b < 4; b++) {
            grad_case c = { .dtype = dtypes[di], .op = CP_GRAD_AVERAGE, .count = 333, .bucket = buckets[b] };
            grad_alloc(&c, 4, 99);
            run_world(4, grad_rank, &c);
            for (int i = 0; i < 4; i++) {
                assert_int_equal(c.r[i].s, CP_SUCCESS);
                if (b == 0) {
                    first[i] = c.out[i];
                    c.out[i] = NULL;
                } else {
                    assert_memory_equal(c.out[i], first[i], c.count * esize(c.dtype));
                }
            }
            grad_free(&c, 4);
        }
        for (int i = 0; i < 4; i++)
            free(first[i]);
    }
}

/* 16-bit gradients are summed in F32: 1 + three quarter-ulps is a whole ulp
 * above 1, while a 16-bit running sum would stay at 1 after every step. */
static void test_grad_all_reduce_accumulates_in_f32(void **state)
{
    (void)state;
    const cp_dtype dtypes[] = { CP_DTYPE_BF16, CP_DTYPE_F16 };
    const int mant[] = { 7, 10 };
    for (int di = 0; di < 2; di++)
        for (int mem = 0; mem < 3; mem++) {
            grad_case c = { .dtype = dtypes[di], .op = CP_GRAD_SUM, .count = 1, .bucket = 0, .mem = mem };
            grad_alloc(&c, 4, 5);
            const double quarter = ldexp(1.0, -mant[di] - 2);
            for (int i = 0; i < 4; i++)
                put(c.in[i], c.dtype, 0, i == 0 ? 1.0 : quarter);
            run_world(4, grad_rank, &c);
            for (int i = 0; i < 4; i++) {
                assert_int_equal(c.r[i].s, CP_SUCCESS);
                assert_true(get(c.out[i], c.dtype, 0) == 1.0 + ldexp(1.0, -mant[di]));
            }
            grad_free(&c, 4);
        }
}

static void test_grad_all_reduce_over_dpxcp_groups(void **state)
{
    (void)state;
    /* world 8 = tp 2 x cp 2 x dp 2, order "cp-tp-dp-pp": groups {0,1,4,5}, {2,3,6,7} */
    cp_topology_config tc = CP_TOPOLOGY_CONFIG_INIT;
    tc.world_size = 8;
    tc.tp = 2;
    tc.cp = 2;
    tc.order = "cp-tp-dp-pp";
    cp_topology *t;
    assert_int_equal(cp_topology_create(&tc, &t), CP_SUCCESS);
    for (int op = 0; op < 2; op++) {
        grad_case c = { .dtype = CP_DTYPE_BF16, .op = (cp_grad_reduce)op, .count = 50, .bucket = 16,
                        .axes = CP_AXIS_DP | CP_AXIS_CP, .t = t };
        grad_alloc(&c, 8, 42);
        run_world(8, grad_rank, &c);
        check_grad(&c, 8);
        assert_int_equal(c.group[0], c.group[5]);
        assert_int_not_equal(c.group[0], c.group[2]);
        grad_free(&c, 8);
    }
    cp_topology_destroy(t);
}

static void test_grad_all_reduce_bad_arguments(void **state)
{
    (void)state;
    float g[4] = { 1, 2, 3, 4 };
    EXPECT_ERROR(cp_grad_all_reduce(NULL, NULL, g, 4, CP_DTYPE_F32, CP_GRAD_SUM, 0), CP_ERROR_INVALID_ARGUMENT,
                 "comm");
    cp_comm *one;
    assert_int_equal(cp_comm_create_local(1, &one), CP_SUCCESS);
    EXPECT_ERROR(cp_grad_all_reduce(NULL, one, g, 4, (cp_dtype)9, CP_GRAD_SUM, 0), CP_ERROR_INVALID_ARGUMENT,
                 "dtype = 9");
    EXPECT_ERROR(cp_grad_all_reduce(NULL, one, g, 4, CP_DTYPE_F32, (cp_grad_reduce)7, 0),
                 CP_ERROR_INVALID_ARGUMENT, "op = 7");
    EXPECT_ERROR(cp_grad_all_reduce(NULL, one, g, 4, CP_DTYPE_F32, CP_GRAD_SUM, 3), CP_ERROR_INVALID_ARGUMENT,
                 "bucket_bytes = 3");
    EXPECT_ERROR(cp_grad_all_reduce(NULL, one, NULL, 4, CP_DTYPE_F32, CP_GRAD_SUM, 0), CP_ERROR_INVALID_ARGUMENT,
                 "grad is NULL");
    EXPECT_ERROR(cp_grad_all_reduce(NULL, one, g, SIZE_MAX / 2, CP_DTYPE_F32, CP_GRAD_SUM, 0),
                 CP_ERROR_INVALID_ARGUMENT, "count = ");
    /* nothing to do is fine, also with a NULL buffer; one rank leaves values alone */
    assert_int_equal(cp_grad_all_reduce(NULL, one, NULL, 0, CP_DTYPE_F32, CP_GRAD_SUM, 0), CP_SUCCESS);
    assert_int_equal(cp_grad_all_reduce(NULL, one, g, 4, CP_DTYPE_F32, CP_GRAD_AVERAGE, 4), CP_SUCCESS);
    assert_true(g[0] == 1 && g[3] == 4);
    cp_comm_destroy(one);

    /* ranks that would cut the buffer differently fail together, none waits */
    grad_case c = { .dtype = CP_DTYPE_F32, .op = CP_GRAD_SUM, .count = 20, .bucket = 8 };
    grad_alloc(&c, 3, 3);
    c.count_of[2] = 12;
    run_world(3, grad_rank, &c);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(c.r[i].s, CP_ERROR_MISMATCH);
        assert_non_null(strstr(c.r[i].msg, "different count"));
    }
    grad_free(&c, 3);

    /* a rank's own bad argument: it reports that, its peers a mismatch */
    grad_case d = { .dtype = CP_DTYPE_F32, .op = CP_GRAD_SUM, .count = 20, .bucket = 8 };
    grad_alloc(&d, 2, 4);
    d.op_of[0] = 5;
    run_world(2, grad_rank, &d);
    assert_int_equal(d.r[0].s, CP_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(d.r[0].msg, "op = 5"));
    assert_int_equal(d.r[1].s, CP_ERROR_MISMATCH);
    assert_non_null(strstr(d.r[1].msg, "rejected"));
    grad_free(&d, 2);
}

/* ---- cp_seq_local_len, cp_stage_shape ------------------------------------ */

static cp_topology *topo(int world_size, int tp, int cp, int pp)
{
    cp_topology_config tc = CP_TOPOLOGY_CONFIG_INIT;
    tc.world_size = world_size;
    tc.tp = tp;
    tc.cp = cp;
    tc.pp = pp;
    cp_topology *t = NULL;
    assert_int_equal(cp_topology_create(&tc, &t), CP_SUCCESS);
    return t;
}

static void test_stage_shape_arithmetic(void **state)
{
    (void)state;
    const int tps[] = { 1, 2, 4 }, cps[] = { 1, 2, 3, 4, 8 };
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 5; b++)
            for (int layout = 0; layout < 2; layout++)
                for (int fmt = 0; fmt < 2; fmt++)
                    for (unsigned flags = 0; flags < 2; flags++) {
                        const int tp = tps[a], cp = cps[b];
                        cp_topology *t = topo(tp * cp * 2 * 2, tp, cp, 2);
                        cp_attn_desc d = CP_ATTN_DESC_INIT;
                        d.layout = (cp_layout)layout;
                        d.format = (cp_format)fmt;
                        d.dtype = CP_DTYPE_BF16;
                        d.batch = 3;
                        d.seq_len = 2 * 8 * 4 * 3; /* divisible for every case above */
                        int64_t len, shape[3];
                        size_t bytes;
                        assert_int_equal(cp_seq_local_len(t, &d, &len), CP_SUCCESS);
                        assert_int_equal(len, d.seq_len / cp);
                        assert_int_equal(cp_stage_shape(t, &d, 40, flags, shape, &bytes), CP_SUCCESS);
                        int64_t want_len = d.seq_len / cp / (flags ? tp : 1);
                        int64_t want[3] = { fmt ? want_len : 3, fmt ? 3 : want_len, 40 };
                        assert_memory_equal(shape, want, sizeof want);
                        assert_int_equal(bytes, (size_t)(3 * want_len * 40 * 2));
                        cp_topology_destroy(t);
                    }
}

static void test_stage_shape_bad_arguments(void **state)
{
    (void)state;
    cp_topology *t = topo(8, 2, 4, 1);
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = 2;
    d.seq_len = 12;
    int64_t len = 7, shape[3] = { 1, 1, 1 };
    size_t bytes = 9;

    EXPECT_ERROR(cp_seq_local_len(NULL, &d, &len), CP_ERROR_INVALID_ARGUMENT, "t is NULL");
    assert_int_equal(len, 0);
    EXPECT_ERROR(cp_seq_local_len(t, NULL, &len), CP_ERROR_INVALID_ARGUMENT, "d is NULL");
    EXPECT_ERROR(cp_seq_local_len(t, &d, NULL), CP_ERROR_INVALID_ARGUMENT, "local_seq_len");
    d.seq_len = 10;
    EXPECT_ERROR(cp_seq_local_len(t, &d, &len), CP_ERROR_INVALID_ARGUMENT, "seq_len = 10");
    d.seq_len = 12;
    d.layout = CP_LAYOUT_ZIGZAG; /* needs a multiple of 2*4 */
    EXPECT_ERROR(cp_seq_local_len(t, &d, &len), CP_ERROR_INVALID_ARGUMENT, "seq_len = 12");
    d.layout = (cp_layout)4;
    EXPECT_ERROR(cp_seq_local_len(t, &d, &len), CP_ERROR_INVALID_ARGUMENT, "d->layout = 4");
    d.layout = CP_LAYOUT_CONTIGUOUS;
    d.seq_len = 0;
    EXPECT_ERROR(cp_seq_local_len(t, &d, &len), CP_ERROR_INVALID_ARGUMENT, "d->seq_len = 0");
    d.seq_len = 12;
    cp_attn_desc old = d;
    old.struct_size = 8;
    EXPECT_ERROR(cp_seq_local_len(t, &old, &len), CP_ERROR_INVALID_ARGUMENT, "struct_size = 8");

    EXPECT_ERROR(cp_stage_shape(t, &d, 16, 0, NULL, &bytes), CP_ERROR_INVALID_ARGUMENT, "shape");
    EXPECT_ERROR(cp_stage_shape(t, &d, 0, 0, shape, &bytes), CP_ERROR_INVALID_ARGUMENT, "hidden = 0");
    assert_true(shape[0] == 0 && shape[1] == 0 && shape[2] == 0 && bytes == 0);
    EXPECT_ERROR(cp_stage_shape(t, &d, 16, 6, shape, NULL), CP_ERROR_INVALID_ARGUMENT, "flags = 0x6");
    /* 12 / cp 4 = 3 tokens cannot be split over tp = 2 */
    EXPECT_ERROR(cp_stage_shape(t, &d, 16, CP_STAGE_SEQUENCE_PARALLEL, shape, NULL), CP_ERROR_INVALID_ARGUMENT,
                 "tp = 2");
    d.batch = 0;
    EXPECT_ERROR(cp_stage_shape(t, &d, 16, 0, shape, NULL), CP_ERROR_INVALID_ARGUMENT, "d->batch = 0");
    d.batch = 2;
    d.format = (cp_format)3;
    EXPECT_ERROR(cp_stage_shape(t, &d, 16, 0, shape, NULL), CP_ERROR_INVALID_ARGUMENT, "d->format = 3");
    d.format = CP_FORMAT_BSHD;
    d.dtype = (cp_dtype)11;
    EXPECT_ERROR(cp_stage_shape(t, &d, 16, 0, shape, NULL), CP_ERROR_INVALID_ARGUMENT, "d->dtype = 11");
    d.dtype = CP_DTYPE_F32;
    d.batch = INT64_MAX / 2;
    EXPECT_ERROR(cp_stage_shape(t, &d, INT64_MAX / 4, 0, shape, NULL), CP_ERROR_INVALID_ARGUMENT, "overflows");
    cp_topology_destroy(t);
}

int main(void)
{
    fake_ctx.device = CP_DEVICE_CUDA;
    fake_ctx.ops = fakedev_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_reduce_matches_serial),
        cmocka_unit_test(test_loss_reduce_over_dpxcp_groups),
        cmocka_unit_test(test_loss_reduce_all_empty_and_nan),
        cmocka_unit_test(test_loss_reduce_bad_arguments),
        cmocka_unit_test(test_grad_all_reduce_matches_serial),
        cmocka_unit_test(test_grad_all_reduce_bucket_independent),
        cmocka_unit_test(test_grad_all_reduce_accumulates_in_f32),
        cmocka_unit_test(test_grad_all_reduce_over_dpxcp_groups),
        cmocka_unit_test(test_grad_all_reduce_bad_arguments),
        cmocka_unit_test(test_stage_shape_arithmetic),
        cmocka_unit_test(test_stage_shape_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
