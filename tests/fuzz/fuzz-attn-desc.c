/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the validation of attention descriptors and kernel
 * arguments. The first byte picks what the rest describes:
 *
 *  0: a cp_attn_desc for cp_attn_plan_create on a group of one rank. The
 *     verdict must match an independent check of the documented rules; an
 *     accepted descriptor must also be accepted by the single-device kernel
 *     it runs on, and a small one must run forward and backward with finite
 *     results.
 *  1, 2: a cp_kernel_attn_args for cp_kernel_attn_workspace_size (forward,
 *     backward). Accepted arguments must describe tensors that fit the
 *     address space; small ones run on buffers of exactly their extent
 *     (ASan catches a read or write past it), with finite dense outputs.
 *     A backward with drow_ready = 1 reads the rowsum buffer (as large as
 *     lse's extent) that a first call stored.
 *  3: a cp_kernel_merge_args, run on buffers of exactly its extent.
 *
 * Fields follow in declaration order as little-endian integers (input.h).
 * Any input must give a clean status, never a crash, leak or sanitizer
 * report; a broken invariant aborts.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinicp/infinicp.h>

#include "input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                    \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "fuzz-attn-desc: %s:%d: %s failed; last error: %s\n", __FILE__, __LINE__, \
                    #cond, cp_last_error());                                                           \
            abort();                                                                                   \
        }                                                                                              \
    } while (0)

/* Small enough to run: elements per tensor and multiply-adds per call. */
#define MAX_ELEMS ((int64_t)1 << 14)
#define MAX_WORK ((int64_t)1 << 22)

static cp_context *ctx;
static cp_comm *comm;
static cp_group *group;

/* One context and group for the process (never freed: LeakSanitizer sees
 * them reachable). One thread keeps runs with overlapping outputs
 * deterministic. */
static void init(void)
{
    if (group)
        return;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    CHECK(cp_context_create(&cc, &ctx) == CP_SUCCESS);
    CHECK(cp_comm_create_local(1, &comm) == CP_SUCCESS);
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.timeout_ms = 1000;
    CHECK(cp_group_create(ctx, comm, &gc, &group) == CP_SUCCESS);
}

static bool starts_with(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

static size_t dtype_bytes(cp_dtype t)
{
    return t == CP_DTYPE_F32                           ? 4
           : t == CP_DTYPE_F16 || t == CP_DTYPE_BF16   ? 2
           : t == CP_DTYPE_F64                         ? 8
           : t == CP_DTYPE_FP8_E4M3                    ? 1
                                                       : 0;
}

/* a * b * ..., or -1 past INT64_MAX (all factors >= 0). */
static int64_t product(const int64_t *f, int n)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        if (__builtin_mul_overflow(p, f[i], &p))
            return -1;
    return p;
}

/* A buffer of values of type t: a few in [-1, 1], repeating. */
static void *pattern(cp_dtype t, int64_t n)
{
    static const uint32_t f32[] = { 0x3f000000, 0xbe800000, 0x3f400000, 0x00000000, 0xbf000000 };
    static const uint16_t f16[] = { 0x3800, 0xb400, 0x3a00, 0x0000, 0xb800 };
    static const uint16_t bf16[] = { 0x3f00, 0xbe80, 0x3f40, 0x0000, 0xbf00 };
    static const uint8_t fp8[] = { 0x30, 0xa8, 0x34, 0x00, 0xb0 }; /* E4M3: 0.5, -0.25, 0.75, 0, -0.5 */
    size_t es = dtype_bytes(t);
    unsigned char *b = malloc((size_t)(n ? n : 1) * es);
    CHECK(b);
    for (int64_t i = 0; i < n; i++) {
        if (t == CP_DTYPE_F32)
            memcpy(b + 4 * i, &f32[i % 5], 4);
        else if (t == CP_DTYPE_FP8_E4M3)
            b[i] = fp8[i % 5];
        else
            memcpy(b + 2 * i, t == CP_DTYPE_F16 ? &f16[i % 5] : &bf16[i % 5], 2);
    }
    return b;
}

static bool all_finite(const void *p, cp_dtype t, int64_t n, bool minus_inf_ok)
{
    for (int64_t i = 0; i < n; i++) {
        float v;
        if (t == CP_DTYPE_F32) {
            memcpy(&v, (const char *)p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const char *)p + 2 * i, 2);
            uint32_t bits;
            if (t == CP_DTYPE_BF16) {
                bits = (uint32_t)h << 16;
            } else { /* only the exponent matters: all ones is inf or nan */
                bits = (h & 0x7c00) == 0x7c00 ? 0x7f800001u : 0;
            }
            memcpy(&v, &bits, 4);
        }
        if (!isfinite(v) && !(minus_inf_ok && v == -INFINITY))
            return false;
    }
    return true;
}

/* ---- 0: descriptors ------------------------------------------------------ */

static cp_attn_desc read_desc(fuzz_input *in)
{
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.struct_size = fuzz_struct_size(in, sizeof d);
    d.dtype = (cp_dtype)fuzz_i32(in);
    d.format = (cp_format)fuzz_i32(in);
    d.batch = fuzz_i64(in);
    d.seq_len = fuzz_i64(in);
    d.num_heads = fuzz_i32(in);
    d.num_kv_heads = fuzz_i32(in);
    d.head_dim = fuzz_i32(in);
    d.head_dim_v = fuzz_i32(in);
    d.mask = (cp_mask)fuzz_i32(in);
    d.softmax_scale = fuzz_f64(in);
    d.layout = (cp_layout)fuzz_i32(in);
    d.mode = (cp_mode)fuzz_i32(in);
    /* API 1.1: read last, so inputs of 1.0 seeds decode as before */
    d.window = fuzz_i64(in);
    d.softcap = fuzz_f64(in);
    d.sinks = fuzz_i32(in);
    return d;
}

/* What the library reads of d: struct_size bytes over the defaults. */
static cp_attn_desc effective(const cp_attn_desc *d)
{
    cp_attn_desc e = CP_ATTN_DESC_INIT;
    memcpy(&e, d, d->struct_size < sizeof e ? d->struct_size : sizeof e);
    return e;
}

/* The rules of cp_attn_plan_create(3) for a group of one rank, written out
 * again: the status they call for, and in *also another one they allow
 * (where the order of two checks or the workspace total decides). */
static cp_status desc_rules(const cp_attn_desc *given, cp_status *also)
{
    const size_t v1 = offsetof(cp_attn_desc, mode) + sizeof(cp_mode);
    *also = CP_ERROR_INVALID_ARGUMENT;
    if (given->struct_size < v1)
        return CP_ERROR_INVALID_ARGUMENT;
    const cp_attn_desc e = effective(given), *d = &e;
    if (d->dtype != CP_DTYPE_F32 && d->dtype != CP_DTYPE_F16 && d->dtype != CP_DTYPE_BF16 &&
        d->dtype != CP_DTYPE_F64 && d->dtype != CP_DTYPE_FP8_E4M3)
        return CP_ERROR_INVALID_ARGUMENT;
    bool bad = (d->format != CP_FORMAT_BSHD && d->format != CP_FORMAT_SBHD) || d->batch < 1 || d->seq_len < 1 ||
               d->num_heads < 1 || d->num_kv_heads < 1 || d->num_heads % d->num_kv_heads || d->head_dim < 1 ||
               d->head_dim_v < 0 || (d->mask != CP_MASK_NONE && d->mask != CP_MASK_CAUSAL) ||
               !(fabs(d->softmax_scale * 1.4426950408889634) <= 3.0e38) || (d->mode < CP_MODE_ALL_GATHER || d->mode > CP_MODE_A2A_P2P) ||
               (d->layout != CP_LAYOUT_CONTIGUOUS && d->layout != CP_LAYOUT_ZIGZAG &&
                d->layout != CP_LAYOUT_PACKED) ||
               (d->layout == CP_LAYOUT_ZIGZAG && d->seq_len % 2) ||
               (d->layout == CP_LAYOUT_PACKED && d->batch != 1) || d->window < 0 || !isfinite(d->softcap) ||
               d->softcap < 0 || (d->sinks != 0 && d->sinks != 1);
    if (d->dtype == CP_DTYPE_F64) {
        *also = CP_ERROR_UNSUPPORTED;
        return bad ? CP_ERROR_INVALID_ARGUMENT : CP_ERROR_UNSUPPORTED;
    }
    if (bad)
        return CP_ERROR_INVALID_ARGUMENT;
    /* the kernels' bounds on the softcap (with the scale as filled in) and the window */
    const double max = 3.0e38 / 1.4426950408889634;
    const double scale = d->softmax_scale != 0 ? d->softmax_scale : 1.0 / sqrt((double)d->head_dim);
    if ((d->softcap > 0 && (d->softcap > max || fabs(scale) / d->softcap > max)) || d->window > INT64_MAX / 4)
        return CP_ERROR_INVALID_ARGUMENT;
    /* the largest tensor in bytes: far from the limit both verdicts are certain */
    int64_t dim = d->head_dim > d->head_dim_v ? d->head_dim : d->head_dim_v;
    const int64_t f[] = { d->batch, d->seq_len, d->num_heads, dim, 8 };
    int64_t bytes = product(f, 5);
    if (bytes >= 0 && bytes <= (int64_t)1 << 40)
        *also = CP_SUCCESS;
    return bytes < 0 ? CP_ERROR_INVALID_ARGUMENT : CP_SUCCESS;
}

/* The kernel call the plan's blocks make must be valid too. */
static void check_kernel_accepts(const cp_attn_desc *d)
{
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = d->dtype;
    a.format = d->format;
    a.batch = d->batch;
    a.num_heads = d->num_heads;
    a.num_kv_heads = d->num_kv_heads;
    a.head_dim = d->head_dim;
    a.head_dim_v = d->head_dim_v;
    a.seq_q = a.seq_k = d->seq_len;
    a.mask = d->mask;
    a.softmax_scale = d->softmax_scale;
    a.window = d->window;
    a.softcap = d->softcap;
    a.o_dtype = CP_DTYPE_F32;
    a.grad_dtype = CP_DTYPE_F32;
    size_t bytes = 0;
    CHECK(cp_kernel_attn_workspace_size(ctx, &a, 0, &bytes) == CP_SUCCESS);
}

static void run_plan(cp_attn_plan *p, const cp_attn_desc *d)
{
    if (d->layout == CP_LAYOUT_PACKED || d->sinks)
        return; /* cp_attn_forward_ex's (a pack, sinks): fuzz-pack and the suites run those */
    const int64_t dv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    const int64_t nq[] = { d->batch, d->seq_len, d->num_heads, d->head_dim };
    const int64_t nk[] = { d->batch, d->seq_len, d->num_kv_heads, d->head_dim };
    const int64_t nv[] = { d->batch, d->seq_len, d->num_kv_heads, dv };
    const int64_t no[] = { d->batch, d->seq_len, d->num_heads, dv };
    const int64_t work[] = { d->batch, d->seq_len, d->seq_len, d->num_heads, d->head_dim + dv };
    int64_t q = product(nq, 4), k = product(nk, 4), v = product(nv, 4), o = product(no, 4), w = product(work, 5);
    /* an FP8 plan (API 1.2) is forward only: no backward workspace, out in BF16 */
    const bool fp8 = d->dtype == CP_DTYPE_FP8_E4M3;
    size_t wf = 0, wb = 0;
    CHECK(cp_attn_workspace_size(p, &wf, &wb) == CP_SUCCESS && wf > 0 && (wb > 0) == !fp8);
    if (q > MAX_ELEMS || k > MAX_ELEMS || v > MAX_ELEMS || o > MAX_ELEMS || w < 0 || w > MAX_WORK ||
        wf > (size_t)64 << 20 || wb > (size_t)64 << 20 || fabs(d->softmax_scale) * d->head_dim > 64)
        return;
    const cp_dtype t = d->dtype, ot = fp8 ? CP_DTYPE_BF16 : t;
    const int64_t rows = d->batch * d->num_heads * d->seq_len;
    void *bq = pattern(t, q), *bk = pattern(t, k), *bv = pattern(t, v), *bo = pattern(ot, o);
    void *bdo = pattern(ot, o), *bdq = pattern(ot, q), *bdk = pattern(ot, k), *bdv = pattern(ot, v);
    float *lse = malloc((size_t)rows * sizeof *lse);
    void *ws = aligned_alloc(64, (wf > wb ? wf : wb) / 64 * 64 + 64);
    CHECK(lse && ws);
    CHECK(cp_attn_forward(p, bq, bk, bv, bo, lse, ws, wf) == CP_SUCCESS);
    CHECK(all_finite(bo, ot, o, false) && all_finite(lse, CP_DTYPE_F32, rows, false));
    if (fp8) {
        CHECK(cp_attn_backward(p, bq, bk, bv, bo, lse, bdo, bdq, bdk, bdv, ws, wf) == CP_ERROR_UNSUPPORTED);
    } else {
        CHECK(cp_attn_backward(p, bq, bk, bv, bo, lse, bdo, bdq, bdk, bdv, ws, wb) == CP_SUCCESS);
        CHECK(all_finite(bdq, t, q, false) && all_finite(bdk, t, k, false) && all_finite(bdv, t, v, false));
    }
    void *bufs[] = { bq, bk, bv, bo, bdo, bdq, bdk, bdv, lse, ws };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

static void fuzz_desc(fuzz_input *in)
{
    cp_attn_desc d = read_desc(in);
    cp_status also;
    cp_status want = desc_rules(&d, &also);
    cp_attn_plan *p = (cp_attn_plan *)&d; /* must be overwritten */
    cp_status s = cp_attn_plan_create(group, &d, &p);
    CHECK(s == want || s == also);
    if (s != CP_SUCCESS) {
        CHECK(p == NULL);
        CHECK(starts_with(cp_last_error(), "cp_attn_plan_create: "));
        return;
    }
    CHECK(p != NULL);
    /* what the plan read: struct_size may cut the descriptor short */
    const cp_attn_desc e = effective(&d);
    check_kernel_accepts(&e);
    run_plan(p, &e);
    cp_attn_plan_destroy(p);
}

/* ---- 1, 2: kernel arguments ---------------------------------------------- */

/* One tensor of an argument set: where its strides are, and its shape. */
typedef struct tensor {
    int64_t *s;      /* b, s, h strides (3) or the LSE's b, h (2) */
    int nstrides;
    int64_t B, S, H, D;
    cp_dtype t;
    bool output;
} tensor;

/* Dense strides where all are zero, as the kernels document. */
static void derive(tensor *x, cp_format f)
{
    for (int i = 0; i < x->nstrides; i++)
        if (x->s[i])
            return;
    if (x->nstrides == 2) { /* LSE: [B, H, S] */
        x->s[1] = x->S;
        x->s[0] = x->H * x->S;
    } else if (f == CP_FORMAT_BSHD) {
        x->s[2] = x->D;
        x->s[1] = x->H * x->D;
        x->s[0] = x->S * x->H * x->D;
    } else {
        x->s[2] = x->D;
        x->s[0] = x->H * x->D;
        x->s[1] = x->B * x->H * x->D;
    }
}

/* Elements from the first to one past the last, or -1 if that overflows. */
static int64_t extent(const tensor *x)
{
    __int128 last = 0;
    if (x->nstrides == 2)
        last = (__int128)(x->B - 1) * x->s[0] + (__int128)(x->H - 1) * x->s[1] + x->S;
    else
        last = (__int128)(x->B - 1) * x->s[0] + (__int128)(x->S - 1) * x->s[1] + (__int128)(x->H - 1) * x->s[2] + x->D;
    return last > INT64_MAX ? -1 : (int64_t)last;
}

/* A zero stride along a dimension of more than one element: the tensor
 * overlaps itself, which the kernels refuse for an output. */
static bool overlaps_itself(const tensor *x)
{
    const int64_t dims3[3] = { x->B, x->S, x->H }, dims2[2] = { x->B, x->H };
    const int64_t *dims = x->nstrides == 2 ? dims2 : dims3;
    for (int i = 0; i < x->nstrides; i++)
        if (x->s[i] == 0 && dims[i] > 1)
            return true;
    return false;
}

static bool dense(const tensor *x, const int64_t *given)
{
    for (int i = 0; i < x->nstrides; i++)
        if (given[i])
            return false;
    return true;
}

static void read_strides(fuzz_input *in, int64_t *s, int n)
{
    for (int i = 0; i < n; i++)
        s[i] = fuzz_i64(in);
}

static cp_kernel_attn_args read_args(fuzz_input *in)
{
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.struct_size = fuzz_struct_size(in, sizeof a);
    a.dtype = (cp_dtype)fuzz_i32(in);
    a.format = (cp_format)fuzz_i32(in);
    a.batch = fuzz_i64(in);
    a.num_heads = fuzz_i32(in);
    a.num_kv_heads = fuzz_i32(in);
    a.head_dim = fuzz_i32(in);
    a.head_dim_v = fuzz_i32(in);
    a.seq_q = fuzz_i64(in);
    a.seq_k = fuzz_i64(in);
    a.q_offset = fuzz_i64(in);
    a.k_offset = fuzz_i64(in);
    a.mask = (cp_mask)fuzz_i32(in);
    a.softmax_scale = fuzz_f64(in);
    read_strides(in, &a.q_stride_b, 3);
    read_strides(in, &a.k_stride_b, 3);
    read_strides(in, &a.v_stride_b, 3);
    read_strides(in, &a.o_stride_b, 3);
    a.o_dtype = (cp_dtype)fuzz_i32(in);
    read_strides(in, &a.lse_stride_b, 2);
    a.accumulate = fuzz_i32(in);
    read_strides(in, &a.dout_stride_b, 3);
    read_strides(in, &a.dq_stride_b, 3);
    read_strides(in, &a.dk_stride_b, 3);
    read_strides(in, &a.dv_stride_b, 3);
    a.grad_dtype = (cp_dtype)fuzz_i32(in);
    a.grad_accumulate = fuzz_i32(in);
    a.drow_ready = fuzz_i32(in); /* with a buffer given below when the call runs */
    return a;
}

static void fuzz_kernel(fuzz_input *in, int backward)
{
    cp_kernel_attn_args a = read_args(in);
    size_t bytes = 1;
    cp_status s = cp_kernel_attn_workspace_size(ctx, &a, backward, &bytes);
    if (s != CP_SUCCESS) {
        CHECK(bytes == 0);
        CHECK(s == CP_ERROR_INVALID_ARGUMENT || s == CP_ERROR_UNSUPPORTED);
        CHECK(starts_with(cp_last_error(), "cp_kernel_attn_workspace_size: "));
        return;
    }
    /* accepted: every tensor fits the address space */
    const int64_t B = a.batch, Sq = a.seq_q, Sk = a.seq_k, H = a.num_heads, Hk = a.num_kv_heads, D = a.head_dim,
                  Dv = a.head_dim_v ? a.head_dim_v : a.head_dim;
    CHECK(a.struct_size >= offsetof(cp_kernel_attn_args, workspace_bytes) + sizeof(size_t));
    CHECK(B > 0 && Sq > 0 && Sk > 0 && H > 0 && Hk > 0 && H % Hk == 0 && D > 0 && Dv > 0);
    /* drow_ready as the library read it: a struct_size that ends before it
     * leaves it at its default, 0 */
    const int ready = a.struct_size >= offsetof(cp_kernel_attn_args, drow_ready) + sizeof(int) ? a.drow_ready : 0;
    CHECK(!backward || ready == 0 || ready == 1);
    const int64_t given[9][3] = {
        { a.q_stride_b, a.q_stride_s, a.q_stride_h },       { a.k_stride_b, a.k_stride_s, a.k_stride_h },
        { a.v_stride_b, a.v_stride_s, a.v_stride_h },       { a.o_stride_b, a.o_stride_s, a.o_stride_h },
        { a.lse_stride_b, a.lse_stride_h, 0 },              { a.dout_stride_b, a.dout_stride_s, a.dout_stride_h },
        { a.dq_stride_b, a.dq_stride_s, a.dq_stride_h },    { a.dk_stride_b, a.dk_stride_s, a.dk_stride_h },
        { a.dv_stride_b, a.dv_stride_s, a.dv_stride_h },
    };
    tensor x[9] = {
        { &a.q_stride_b, 3, B, Sq, H, D, a.dtype, false },
        { &a.k_stride_b, 3, B, Sk, Hk, D, a.dtype, false },
        { &a.v_stride_b, 3, B, Sk, Hk, Dv, a.dtype, false },
        { &a.o_stride_b, 3, B, Sq, H, Dv, a.o_dtype, !backward },
        { &a.lse_stride_b, 2, B, Sq, H, 1, CP_DTYPE_F32, !backward },
        { &a.dout_stride_b, 3, B, Sq, H, Dv, a.o_dtype, false },
        { &a.dq_stride_b, 3, B, Sq, H, D, a.grad_dtype, true },
        { &a.dk_stride_b, 3, B, Sk, Hk, D, a.grad_dtype, true },
        { &a.dv_stride_b, 3, B, Sk, Hk, Dv, a.grad_dtype, true },
    };
    const int n = backward ? 9 : 5;
    int64_t ext[9];
    bool dense_out = true;
    for (int i = 0; i < n; i++) {
        derive(&x[i], a.format);
        for (int j = 0; j < x[i].nstrides; j++)
            CHECK(x[i].s[j] >= 0);
        ext[i] = extent(&x[i]);
        CHECK(ext[i] > 0 && (uint64_t)ext[i] <= PTRDIFF_MAX / dtype_bytes(x[i].t));
        if (x[i].output && !dense(&x[i], given[i]))
            dense_out = false;
        /* accepted outputs never overlap themselves */
        CHECK(!x[i].output || !overlaps_itself(&x[i]));
    }
    /* small enough to run: each tensor gets a buffer of exactly its extent */
    const int64_t work[] = { B, H, Sq, Sk, D + Dv };
    int64_t w = product(work, 5);
    for (int i = 0; i < n; i++)
        if (ext[i] > MAX_ELEMS)
            return;
    if (w < 0 || w > MAX_WORK)
        return;
    void *bufs[9] = { NULL };
    for (int i = 0; i < n; i++)
        bufs[i] = pattern(x[i].t, ext[i]);
    a.q = bufs[0], a.k = bufs[1], a.v = bufs[2], a.o = bufs[3], a.lse = bufs[4];
    a.dout = bufs[5], a.dq = bufs[6], a.dk = bufs[7], a.dv = bufs[8];
    if (backward || a.accumulate) { /* o, lse: an empty partial result, or a forward's */
        memset(bufs[3], 0, (size_t)ext[3] * dtype_bytes(x[3].t));
        for (int64_t i = 0; i < ext[4]; i++)
            ((float *)bufs[4])[i] = -INFINITY;
    }
    bool tame = fabs(a.softmax_scale) * (double)D <= 64; /* scores that cannot overflow fp32 */
    if (backward && (overlaps_itself(&x[3]) || overlaps_itself(&x[4]))) {
        /* legal inputs of the backward, but no forward can write them: the
         * forward that would make them must refuse, and nothing else runs */
        cp_kernel_attn_args f = a;
        f.accumulate = 0;
        CHECK(cp_kernel_attn_forward(ctx, &f) == CP_ERROR_INVALID_ARGUMENT);
        for (int i = 0; i < n; i++)
            free(bufs[i]);
        return;
    }
    if (backward) {
        /* the forward's own result first, then its gradients */
        cp_kernel_attn_args f = a;
        f.accumulate = 0;
        s = cp_kernel_attn_forward(ctx, &f);
        CHECK(s == CP_SUCCESS);
        float *drow = NULL;
        if (ready) {
            /* a first call stores rowsum(dO * O) (laid out like lse), which
             * the fuzzed call then reads */
            drow = pattern(CP_DTYPE_F32, ext[4]);
            cp_kernel_attn_args st = a;
            st.drow = drow;
            st.drow_ready = 0;
            CHECK(cp_kernel_attn_backward(ctx, &st) == CP_SUCCESS);
            a.drow = drow;
        }
        s = cp_kernel_attn_backward(ctx, &a);
        CHECK(s == CP_SUCCESS);
        free(drow);
        if (dense_out && tame && dense(&x[3], given[3]) && dense(&x[4], given[4]))
            for (int i = 6; i < 9; i++)
                CHECK(all_finite(bufs[i], x[i].t, ext[i], false));
    } else {
        s = cp_kernel_attn_forward(ctx, &a);
        CHECK(s == CP_SUCCESS);
        if (dense_out && tame)
            CHECK(all_finite(bufs[3], x[3].t, ext[3], false) && all_finite(bufs[4], CP_DTYPE_F32, ext[4], true));
    }
    for (int i = 0; i < n; i++)
        free(bufs[i]);
}

/* ---- 3: merge ------------------------------------------------------------ */

static void fuzz_merge(fuzz_input *in)
{
    cp_kernel_merge_args m = CP_KERNEL_MERGE_ARGS_INIT;
    m.struct_size = fuzz_struct_size(in, sizeof m);
    m.format = (cp_format)fuzz_i32(in);
    m.batch = fuzz_i64(in);
    m.seq = fuzz_i64(in);
    m.num_heads = fuzz_i32(in);
    m.head_dim_v = fuzz_i32(in);
    read_strides(in, &m.o_stride_b, 3);
    m.o_dtype = (cp_dtype)fuzz_i32(in);
    read_strides(in, &m.lse_stride_b, 2);
    read_strides(in, &m.o_part_stride_b, 3);
    m.o_part_dtype = (cp_dtype)fuzz_i32(in);
    read_strides(in, &m.lse_part_stride_b, 2);
    const int64_t given[4][3] = {
        { m.o_stride_b, m.o_stride_s, m.o_stride_h }, { m.lse_stride_b, m.lse_stride_h, 0 },
        { m.o_part_stride_b, m.o_part_stride_s, m.o_part_stride_h }, { m.lse_part_stride_b, m.lse_part_stride_h, 0 },
    };
    int64_t strides[4][3];
    memcpy(strides, given, sizeof strides);
    const int64_t B = m.batch, S = m.seq, H = m.num_heads, Dv = m.head_dim_v;
    bool plausible = B > 0 && S > 0 && H > 0 && Dv > 0 && dtype_bytes(m.o_dtype) && dtype_bytes(m.o_part_dtype);
    tensor x[4] = {
        { strides[0], 3, B, S, H, Dv, m.o_dtype, true },
        { strides[1], 2, B, S, H, 1, CP_DTYPE_F32, true },
        { strides[2], 3, B, S, H, Dv, m.o_part_dtype, false },
        { strides[3], 2, B, S, H, 1, CP_DTYPE_F32, false },
    };
    /* Without data the call must fail; with it, only a small one runs. */
    const int64_t work[] = { B, S, H, Dv };
    int64_t w = plausible ? product(work, 4) : -1;
    int64_t ext[4] = { 0 };
    bool fits = w >= 0 && w <= MAX_WORK; /* bounds every dense stride below */
    for (int i = 0; i < 4 && fits; i++) {
        derive(&x[i], m.format);
        for (int j = 0; j < x[i].nstrides; j++)
            fits = fits && x[i].s[j] >= 0;
        ext[i] = extent(&x[i]);
        fits = fits && ext[i] > 0 && ext[i] <= MAX_ELEMS;
    }
    /* F64 results are unsupported, FP8 is no type of results (API 1.2) */
    if (!fits || m.o_dtype == CP_DTYPE_F64 || m.o_part_dtype == CP_DTYPE_F64 || m.o_dtype == CP_DTYPE_FP8_E4M3 ||
        m.o_part_dtype == CP_DTYPE_FP8_E4M3) {
        cp_status s = cp_kernel_merge(ctx, &m); /* NULL pointers: never accepted */
        CHECK(s == CP_ERROR_INVALID_ARGUMENT || s == CP_ERROR_UNSUPPORTED);
        CHECK(starts_with(cp_last_error(), "cp_kernel_merge: "));
        return;
    }
    void *bufs[4];
    for (int i = 0; i < 4; i++)
        bufs[i] = pattern(x[i].t, ext[i]);
    m.o = bufs[0];
    m.lse = bufs[1];
    m.o_part = bufs[2];
    m.lse_part = bufs[3];
    cp_status s = cp_kernel_merge(ctx, &m);
    if (s == CP_SUCCESS) {
        if (dense(&x[0], given[0]) && dense(&x[1], given[1]))
            CHECK(all_finite(bufs[0], x[0].t, ext[0], false) && all_finite(bufs[1], CP_DTYPE_F32, ext[1], false));
    } else {
        /* only struct_size, an enum or an output that overlaps itself can
         * be wrong here */
        CHECK(s == CP_ERROR_INVALID_ARGUMENT && starts_with(cp_last_error(), "cp_kernel_merge: "));
    }
    CHECK(s != CP_SUCCESS || !(overlaps_itself(&x[0]) || overlaps_itself(&x[1])));
    for (int i = 0; i < 4; i++)
        free(bufs[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init();
    fuzz_input in = { data, size };
    switch (fuzz_u8(&in) % 4) {
    case 0: fuzz_desc(&in); break;
    case 1: fuzz_kernel(&in, 0); break;
    case 2: fuzz_kernel(&in, 1); break;
    default: fuzz_merge(&in); break;
    }
    return 0;
}
