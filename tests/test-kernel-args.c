/* SPDX-License-Identifier: MIT */
/*
 * The single-device kernels at their boundary: every bad argument gives the
 * right status and a message naming the argument and its value; workspaces
 * are sized exactly and checked; the workspace never grows with seq_q * seq_k.
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

#include <infinicp/infinicp.h>

#include "testutil.h"

enum { B = 2, SQ = 5, SK = 7, H = 4, HKV = 2, D = 8, DV = 6 };

/* Buffers for one valid call (F32, dense BSHD). */
static struct {
    float q[B * SQ * H * D], k[B * SK * HKV * D], v[B * SK * HKV * DV];
    float o[B * SQ * H * DV], dout[B * SQ * H * DV], lse[B * H * SQ];
    float dq[B * SQ * H * D], dk[B * SK * HKV * D], dv[B * SK * HKV * DV];
    float part[B * SQ * H * DV], lse_part[B * H * SQ];
} buf;

static cp_context *ctx;

static int setup(void **state)
{
    (void)state;
    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.num_threads = 2;
    assert_int_equal(cp_context_create(&cfg, &ctx), CP_SUCCESS);
    float *all = (float *)&buf;
    for (size_t i = 0; i < sizeof buf / sizeof(float); i++)
        all[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cp_context_destroy(ctx);
    return 0;
}

static cp_kernel_attn_args valid_args(void)
{
    cp_kernel_attn_args a = f32_kernel_attn_args(B, H, HKV, D, SQ, SK, buf.q, buf.k, buf.v, buf.o, buf.lse, buf.dout,
                                                 buf.dq, buf.dk, buf.dv);
    a.head_dim_v = DV; /* this suite gives v, o and dv a head dim of their own (DV, see buf) */
    return a;
}

static cp_kernel_merge_args valid_merge(void)
{
    cp_kernel_merge_args m = CP_KERNEL_MERGE_ARGS_INIT;
    m.format = CP_FORMAT_BSHD;
    m.batch = B, m.seq = SQ, m.num_heads = H, m.head_dim_v = DV;
    m.o = buf.o, m.o_dtype = CP_DTYPE_F32, m.lse = buf.lse;
    m.o_part = buf.part, m.o_part_dtype = CP_DTYPE_F32, m.lse_part = buf.lse_part;
    return m;
}

static void test_valid_calls(void **state)
{
    (void)state;
    cp_kernel_attn_args a = valid_args();
    assert_int_equal(cp_kernel_attn_forward(ctx, &a), CP_SUCCESS);
    assert_int_equal(cp_kernel_attn_backward(ctx, &a), CP_SUCCESS);
    cp_kernel_merge_args m = valid_merge();
    assert_int_equal(cp_kernel_merge(ctx, &m), CP_SUCCESS);
    size_t bytes = 0;
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 0, &bytes), CP_SUCCESS);
    assert_true(bytes > 0);
}

/* Each mutation of a valid argument set, the status it must give and the
 * text the message must contain, for both kernels. */
/* An argument only the backward reads: the forward accepts it, the backward
 * refuses it naming it (ctx is the suite's context). */
#define BAD_BWD(mutation, needle)                                                                 \
    do {                                                                                          \
        cp_kernel_attn_args b = valid_args();                                                     \
        mutation;                                                                                 \
        assert_int_equal(cp_kernel_attn_forward(ctx, &b), CP_SUCCESS);                            \
        EXPECT_ERROR(cp_kernel_attn_backward(ctx, &b), CP_ERROR_INVALID_ARGUMENT, needle);        \
    } while (0)

static void test_bad_attn_args(void **state)
{
    (void)state;
    static float misaligned_store[8];
    const void *misaligned = (const char *)misaligned_store + 2;
#define BAD(mutation, status, needle)                                                             \
    do {                                                                                          \
        cp_kernel_attn_args a = valid_args();                                                     \
        mutation;                                                                                 \
        EXPECT_ERROR(cp_kernel_attn_forward(ctx, &a), status, needle);                            \
        EXPECT_ERROR(cp_kernel_attn_backward(ctx, &a), status, needle);                           \
    } while (0)
    BAD(a.struct_size = 8, CP_ERROR_INVALID_ARGUMENT, "a->struct_size = 8");
    BAD(a.dtype = (cp_dtype)9, CP_ERROR_INVALID_ARGUMENT, "a->dtype = 9");
    BAD(a.dtype = CP_DTYPE_F64, CP_ERROR_UNSUPPORTED, "a->dtype = CP_DTYPE_F64");
    BAD(a.format = (cp_format)2, CP_ERROR_INVALID_ARGUMENT, "a->format = 2");
    BAD(a.batch = 0, CP_ERROR_INVALID_ARGUMENT, "a->batch = 0");
    BAD(a.batch = -3, CP_ERROR_INVALID_ARGUMENT, "a->batch = -3");
    BAD(a.num_heads = 0, CP_ERROR_INVALID_ARGUMENT, "a->num_heads = 0");
    BAD(a.num_kv_heads = -1, CP_ERROR_INVALID_ARGUMENT, "a->num_kv_heads = -1");
    BAD(a.num_kv_heads = 3, CP_ERROR_INVALID_ARGUMENT, "a->num_kv_heads = 3 does not divide a->num_heads = 4");
    BAD(a.head_dim = 0, CP_ERROR_INVALID_ARGUMENT, "a->head_dim = 0");
    BAD(a.head_dim_v = -2, CP_ERROR_INVALID_ARGUMENT, "a->head_dim_v = -2");
    BAD(a.seq_q = 0, CP_ERROR_INVALID_ARGUMENT, "a->seq_q = 0");
    BAD(a.seq_k = -1, CP_ERROR_INVALID_ARGUMENT, "a->seq_k = -1");
    BAD(a.q_offset = -1, CP_ERROR_INVALID_ARGUMENT, "a->q_offset = -1");
    BAD(a.k_offset = INT64_MAX, CP_ERROR_INVALID_ARGUMENT, "a->k_offset = 9223372036854775807");
    BAD(a.mask = (cp_mask)5, CP_ERROR_INVALID_ARGUMENT, "a->mask = 5");
    BAD(a.softmax_scale = NAN, CP_ERROR_INVALID_ARGUMENT, "a->softmax_scale = nan");
    BAD(a.softmax_scale = INFINITY, CP_ERROR_INVALID_ARGUMENT, "a->softmax_scale = inf");
    BAD(a.softmax_scale = 1e300, CP_ERROR_INVALID_ARGUMENT, "a->softmax_scale = 1e+300");
    BAD(a.o_dtype = CP_DTYPE_BF16, CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 2");
    BAD(a.q = NULL, CP_ERROR_INVALID_ARGUMENT, "a->q is NULL");
    BAD(a.k = NULL, CP_ERROR_INVALID_ARGUMENT, "a->k is NULL");
    BAD(a.v = NULL, CP_ERROR_INVALID_ARGUMENT, "a->v is NULL");
    BAD(a.o = NULL, CP_ERROR_INVALID_ARGUMENT, "a->o is NULL");
    BAD(a.lse = NULL, CP_ERROR_INVALID_ARGUMENT, "a->lse is NULL");
    BAD(a.q = misaligned, CP_ERROR_INVALID_ARGUMENT, "a->q = ");
    BAD(a.k_stride_s = -8, CP_ERROR_INVALID_ARGUMENT, "a->k_stride_s = -8");
    BAD(a.lse_stride_h = -1, CP_ERROR_INVALID_ARGUMENT, "a->lse_stride_h = -1");
    BAD(a.v_stride_b = INT64_MAX / 2, CP_ERROR_INVALID_ARGUMENT, "a->v spans more than the address space");
    BAD(a.batch = INT64_MAX / 4, CP_ERROR_INVALID_ARGUMENT, "a->q of 2305843009213693951 x 5 x 4 x 8 elements overflows");
    BAD((a.seq_q = INT64_MAX / 2, a.q_stride_b = 1, a.q_stride_s = 1, a.q_stride_h = 1),
        CP_ERROR_INVALID_ARGUMENT, "a->q spans more than the address space");
    BAD((a.workspace = buf.part, a.workspace_bytes = 16), CP_ERROR_INVALID_ARGUMENT, "workspace_bytes = 16");
#undef BAD

    /* forward only */
    cp_kernel_attn_args a = valid_args();
    a.accumulate = 2;
    EXPECT_ERROR(cp_kernel_attn_forward(ctx, &a), CP_ERROR_INVALID_ARGUMENT, "a->accumulate = 2");
    assert_int_equal(cp_kernel_attn_backward(ctx, &a), CP_SUCCESS); /* the backward ignores it */

    /* backward only: the forward does not read these */
    BAD_BWD(b.dout = NULL, "a->dout is NULL");
    BAD_BWD(b.dq = NULL, "a->dq is NULL");
    BAD_BWD(b.dk = NULL, "a->dk is NULL");
    BAD_BWD(b.dv = NULL, "a->dv is NULL");
    BAD_BWD(b.grad_dtype = CP_DTYPE_F16, "a->grad_dtype = 1");
    BAD_BWD(b.grad_accumulate = -1, "a->grad_accumulate = -1");
    BAD_BWD(b.dv_stride_h = -6, "a->dv_stride_h = -6");

    /* NULL context and arguments */
    a = valid_args();
    EXPECT_ERROR(cp_kernel_attn_forward(NULL, &a), CP_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    EXPECT_ERROR(cp_kernel_attn_backward(NULL, &a), CP_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    EXPECT_ERROR(cp_kernel_attn_forward(ctx, NULL), CP_ERROR_INVALID_ARGUMENT, "a is NULL");
    EXPECT_ERROR(cp_kernel_attn_backward(ctx, NULL), CP_ERROR_INVALID_ARGUMENT, "a is NULL");
}

static void test_bad_merge_args(void **state)
{
    (void)state;
#define BAD(mutation, status, needle)                                                             \
    do {                                                                                          \
        cp_kernel_merge_args m = valid_merge();                                                   \
        mutation;                                                                                 \
        EXPECT_ERROR(cp_kernel_merge(ctx, &m), status, needle);                                   \
    } while (0)
    BAD(m.struct_size = 0, CP_ERROR_INVALID_ARGUMENT, "a->struct_size = 0");
    BAD(m.format = (cp_format)-1, CP_ERROR_INVALID_ARGUMENT, "a->format = -1");
    BAD(m.batch = 0, CP_ERROR_INVALID_ARGUMENT, "a->batch = 0");
    BAD(m.seq = -5, CP_ERROR_INVALID_ARGUMENT, "a->seq = -5");
    BAD(m.num_heads = 0, CP_ERROR_INVALID_ARGUMENT, "a->num_heads = 0");
    BAD(m.head_dim_v = 0, CP_ERROR_INVALID_ARGUMENT, "a->head_dim_v = 0");
    BAD(m.o_dtype = (cp_dtype)7, CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 7");
    BAD(m.o_part_dtype = CP_DTYPE_F64, CP_ERROR_UNSUPPORTED, "a->o_part_dtype = CP_DTYPE_F64");
    BAD(m.o = NULL, CP_ERROR_INVALID_ARGUMENT, "a->o is NULL");
    BAD(m.o_part = NULL, CP_ERROR_INVALID_ARGUMENT, "a->o_part is NULL");
    BAD(m.lse = NULL, CP_ERROR_INVALID_ARGUMENT, "a->lse is NULL");
    BAD(m.lse_part = NULL, CP_ERROR_INVALID_ARGUMENT, "a->lse_part is NULL");
    BAD(m.o_part_stride_s = -1, CP_ERROR_INVALID_ARGUMENT, "a->o_part_stride_s = -1");
    BAD(m.lse_part_stride_b = -2, CP_ERROR_INVALID_ARGUMENT, "a->lse_part_stride_b = -2");
    BAD(m.seq = INT64_MAX / 3, CP_ERROR_INVALID_ARGUMENT, "overflows");
#undef BAD
    cp_kernel_merge_args m = valid_merge();
    EXPECT_ERROR(cp_kernel_merge(NULL, &m), CP_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    EXPECT_ERROR(cp_kernel_merge(ctx, NULL), CP_ERROR_INVALID_ARGUMENT, "a is NULL");
}

/* An output written through a zero stride along a dimension of more than
 * one element would overlap itself: refused, naming the argument and the
 * stride. The same stride of an input, or along a dimension of one, is
 * fine. */
static void test_outputs_overlapping_themselves(void **state)
{
    (void)state;
    const int64_t ob = SQ * H * DV, os = H * DV, oh = DV;
#define O_STRIDES(b, s, h) (a.o_stride_b = (b), a.o_stride_s = (s), a.o_stride_h = (h))
#define FWD_BAD(mutation, needle)                                                                 \
    do {                                                                                          \
        cp_kernel_attn_args a = valid_args();                                                     \
        mutation;                                                                                 \
        EXPECT_ERROR(cp_kernel_attn_forward(ctx, &a), CP_ERROR_INVALID_ARGUMENT, needle);         \
        assert_int_equal(cp_kernel_attn_backward(ctx, &a), CP_SUCCESS); /* o, lse: inputs */     \
    } while (0)
    FWD_BAD(O_STRIDES(0, os, oh), "a->o_stride_b = 0 with 2 elements along it");
    FWD_BAD(O_STRIDES(ob, 0, oh), "a->o_stride_s = 0 with 5 elements along it");
    FWD_BAD(O_STRIDES(ob, os, 0), "a->o_stride_h = 0 with 4 elements along it");
    FWD_BAD((a.lse_stride_b = H * SQ, a.lse_stride_h = 0), "a->lse_stride_h = 0 with 4 elements along it");
    FWD_BAD((a.lse_stride_b = 0, a.lse_stride_h = SQ), "a->lse_stride_b = 0 with 2 elements along it");
#undef FWD_BAD
    /* one query row: no row to overlap */
    cp_kernel_attn_args a = valid_args();
    a.seq_q = 1;
    O_STRIDES(ob, 0, oh);
    assert_int_equal(cp_kernel_attn_forward(ctx, &a), CP_SUCCESS);
#undef O_STRIDES

    BAD_BWD((b.dq_stride_b = SQ * H * D, b.dq_stride_s = H * D, b.dq_stride_h = 0),
            "a->dq_stride_h = 0 with 4 elements along it");
    BAD_BWD((b.dk_stride_b = SK * HKV * D, b.dk_stride_s = 0, b.dk_stride_h = D),
            "a->dk_stride_s = 0 with 7 elements along it");
    BAD_BWD((b.dv_stride_b = 0, b.dv_stride_s = HKV * DV, b.dv_stride_h = DV),
            "a->dv_stride_b = 0 with 2 elements along it");

    cp_kernel_merge_args m = valid_merge();
    m.o_stride_b = ob, m.o_stride_s = 0, m.o_stride_h = oh;
    EXPECT_ERROR(cp_kernel_merge(ctx, &m), CP_ERROR_INVALID_ARGUMENT, "a->o_stride_s = 0 with 5 elements along it");
    m = valid_merge();
    m.o_part_stride_b = ob, m.o_part_stride_s = 0, m.o_part_stride_h = oh; /* an input */
    assert_int_equal(cp_kernel_merge(ctx, &m), CP_SUCCESS);
}

/* The largest |softmax_scale| is 3e38 / log2(e): scores are scaled into
 * base 2 in fp32. The messages print that bound exactly (%.17g), so the
 * printed number is accepted and the next double is not. */
static void test_softmax_scale_limit(void **state)
{
    (void)state;
    const double bound = 2.0794415416798361e+38;
    const char *says = "|scale| <= 2.0794415416798361e+38";
    cp_kernel_attn_args a = valid_args();
    size_t bytes;
    a.softmax_scale = 1e300;
    EXPECT_ERROR(cp_kernel_attn_forward(ctx, &a), CP_ERROR_INVALID_ARGUMENT, says);
    a.softmax_scale = nextafter(bound, INFINITY);
    EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, &a, 0, &bytes), CP_ERROR_INVALID_ARGUMENT, says);
    a.softmax_scale = -nextafter(bound, INFINITY);
    EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, &a, 0, &bytes), CP_ERROR_INVALID_ARGUMENT, says);
    a.softmax_scale = bound;
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 0, &bytes), CP_SUCCESS);
    a.softmax_scale = -bound;
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 0, &bytes), CP_SUCCESS);

    /* plans check the same bound (the CP modes call the backend directly) */
    cp_comm *comm;
    cp_group *g;
    cp_attn_plan *p = NULL;
    assert_int_equal(cp_comm_create_local(1, &comm), CP_SUCCESS);
    assert_int_equal(cp_group_create(ctx, comm, NULL, &g), CP_SUCCESS);
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = 1, d.seq_len = 8, d.num_heads = H, d.num_kv_heads = HKV, d.head_dim = D;
    d.softmax_scale = nextafter(bound, INFINITY);
    EXPECT_ERROR(cp_attn_plan_create(g, &d, &p), CP_ERROR_INVALID_ARGUMENT, says);
    d.softmax_scale = bound;
    assert_int_equal(cp_attn_plan_create(g, &d, &p), CP_SUCCESS);
    cp_attn_plan_destroy(p);
    cp_group_destroy(g);
    cp_comm_destroy(comm);
}

static void test_workspace_size_args(void **state)
{
    (void)state;
    cp_kernel_attn_args a = valid_args();
    size_t bytes = 123;
    EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, &a, 2, &bytes), CP_ERROR_INVALID_ARGUMENT, "backward = 2");
    assert_int_equal(bytes, 0);
    EXPECT_ERROR(cp_kernel_attn_workspace_size(NULL, &a, 0, &bytes), CP_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, NULL, 0, &bytes), CP_ERROR_INVALID_ARGUMENT, "a is NULL");
    EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, &a, 0, NULL), CP_ERROR_INVALID_ARGUMENT, "bytes is NULL");
    a.num_kv_heads = 3;
    bytes = 5;
    EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, &a, 1, &bytes), CP_ERROR_INVALID_ARGUMENT, "a->num_kv_heads = 3");
    assert_int_equal(bytes, 0);
    /* only shapes matter: no data pointers needed */
    a = valid_args();
    a.q = a.k = a.v = a.dout = NULL;
    a.o = a.dq = a.dk = a.dv = NULL;
    a.lse = NULL;
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 0, &bytes), CP_SUCCESS);
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 1, &bytes), CP_SUCCESS);
    /* a size that overflows size_t is an error, not a wrap-around */
    a.batch = 1;
    a.num_heads = a.num_kv_heads = 1 << 24;
    a.seq_q = a.seq_k = INT64_C(1) << 34;
    a.head_dim = a.head_dim_v = 1;
    EXPECT_ERROR(cp_kernel_attn_workspace_size(ctx, &a, 1, &bytes), CP_ERROR_INVALID_ARGUMENT, "overflows");
}

/* The reported size is exactly enough: a workspace of that size (exactly
 * allocated, so that a sanitizer sees any overrun) at any alignment works
 * and gives the same bits as a library-allocated one; one byte less fails. */
static void test_workspace_exact(void **state)
{
    (void)state;
    for (int backward = 0; backward < 2; backward++) {
        cp_kernel_attn_args a = valid_args();
        size_t bytes;
        assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, backward, &bytes), CP_SUCCESS);
        cp_status (*run)(cp_context *, const cp_kernel_attn_args *) =
            backward ? cp_kernel_attn_backward : cp_kernel_attn_forward;
        assert_int_equal(run(ctx, &a), CP_SUCCESS);
        float want_o[sizeof buf.o / sizeof(float)], want_dq[sizeof buf.dq / sizeof(float)];
        memcpy(want_o, buf.o, sizeof want_o);
        memcpy(want_dq, buf.dq, sizeof want_dq);
        for (size_t shift = 0; shift < 3; shift++) {
            char *mem = malloc(bytes + shift);
            assert_non_null(mem);
            a.workspace = mem + shift;
            a.workspace_bytes = bytes;
            assert_int_equal(run(ctx, &a), CP_SUCCESS);
            assert_memory_equal(buf.o, want_o, sizeof want_o);
            assert_memory_equal(buf.dq, want_dq, sizeof want_dq);
            a.workspace_bytes = bytes - 1;
            char needle[64];
            snprintf(needle, sizeof needle, "workspace_bytes = %zu", bytes - 1);
            EXPECT_ERROR(run(ctx, &a), CP_ERROR_INVALID_ARGUMENT, needle);
            free(mem);
        }
    }
}

/* Flash-style memory: the forward's workspace does not depend on the
 * sequence lengths at all; the backward's grows linearly in seq_q (the fp32
 * dQ partial sums) and not with seq_k. */
static void test_workspace_not_quadratic(void **state)
{
    (void)state;
    cp_kernel_attn_args a = valid_args();
    a.num_heads = a.num_kv_heads = 8;
    a.head_dim = a.head_dim_v = 128;
    size_t f1, f2, f3, b1, b2, b3;
    a.seq_q = a.seq_k = 1000;
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 0, &f1), CP_SUCCESS);
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 1, &b1), CP_SUCCESS);
    a.seq_q = a.seq_k = 64000;
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 0, &f2), CP_SUCCESS);
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 1, &b2), CP_SUCCESS);
    a.seq_k = 1000;
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 0, &f3), CP_SUCCESS);
    assert_int_equal(cp_kernel_attn_workspace_size(ctx, &a, 1, &b3), CP_SUCCESS);
    assert_int_equal(f1, f2);
    assert_int_equal(f1, f3);
    assert_int_equal(b2, b3);       /* independent of seq_k */
    assert_true(b2 <= 64 * b1 + 1); /* at most linear in seq_q */
    assert_true(b2 > b1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_calls),
        cmocka_unit_test(test_bad_attn_args),
        cmocka_unit_test(test_bad_merge_args),
        cmocka_unit_test(test_outputs_overlapping_themselves),
        cmocka_unit_test(test_softmax_scale_limit),
        cmocka_unit_test(test_workspace_size_args),
        cmocka_unit_test(test_workspace_exact),
        cmocka_unit_test(test_workspace_not_quadratic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
