/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the API 1.1 arguments of the single-device kernels:
 * a window, a softcap and a rectangle list (hostile values included) on a
 * small dense call, through cp_kernel_attn_workspace_size,
 * cp_kernel_attn_forward and cp_kernel_attn_backward on a CPU context.
 *
 * Input, little-endian (input.h; past the end every field reads 0):
 *   u8  flags: bits 0-1 dtype (3 = F32), 2 causal, 3 SBHD, 4 o and
 *       gradients in F32, 5 accumulate, 6 grad_accumulate, 7 a caller of
 *       the 1.0 struct size (the new fields unseen)
 *   u8  batch, heads, kv-head choice, head_dim, head_dim_v (reduced to
 *       small valid values)
 *   u16 seq_q, seq_k (0 is refused)
 *   i64 q_offset, k_offset; f64 softmax_scale
 *   i64 window; f64 softcap
 *   u8  list: 0 an array of n, 1 rects = NULL with num_rects = n,
 *       2 an array with num_rects = -1 - n
 *   u8  n (at most 64), then per rectangle a u8 kind and its six fields
 *       (q_row, q_len, k_row, k_len, q_pos, k_pos): i64 each when kind is
 *       odd, else i16 each (mostly valid ones)
 *
 * The verdict must match the documented rules written out again here: a
 * refused call names its function and leaves the size 0; an accepted small
 * one runs forward and backward on buffers of exactly their size (ASan sees
 * a read or write past them), with finite outputs where the scores cannot
 * overflow (LSE -inf where a row sees no key). Any input must give a status,
 * never a crash, leak or sanitizer report; a broken invariant aborts.
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

#define CHECK(cond)                                                                                       \
    do {                                                                                                  \
        if (!(cond)) {                                                                                    \
            fprintf(stderr, "fuzz-kernel-rects: %s:%d: %s failed; last error: %s\n", __FILE__, __LINE__, \
                    #cond, cp_last_error());                                                              \
            abort();                                                                                      \
        }                                                                                                 \
    } while (0)

#define MAX_RECTS 64
/* Multiply-adds (and tile overheads) per call small enough to run. */
#define MAX_WORK ((double)(1 << 24))
#define POS_MAX (INT64_MAX / 4)

static cp_context *ctx;

/* One context for the process (never freed: LeakSanitizer sees it
 * reachable). Two threads: the backward then cuts its key tiles into runs. */
static void init(void)
{
    if (ctx)
        return;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 2;
    CHECK(cp_context_create(&cc, &ctx) == CP_SUCCESS);
}

static bool starts_with(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

static size_t dtype_bytes(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? 4 : 2;
}

/* n values of type t in [-1, 1], repeating. */
static void *pattern(cp_dtype t, size_t n)
{
    static const uint32_t f32[] = { 0x3f000000, 0xbe800000, 0x3f400000, 0x00000000, 0xbf000000 };
    static const uint16_t f16[] = { 0x3800, 0xb400, 0x3a00, 0x0000, 0xb800 };
    static const uint16_t bf16[] = { 0x3f00, 0xbe80, 0x3f40, 0x0000, 0xbf00 };
    unsigned char *b = malloc((n ? n : 1) * dtype_bytes(t));
    CHECK(b);
    for (size_t i = 0; i < n; i++) {
        if (t == CP_DTYPE_F32)
            memcpy(b + 4 * i, &f32[i % 5], 4);
        else
            memcpy(b + 2 * i, t == CP_DTYPE_F16 ? &f16[i % 5] : &bf16[i % 5], 2);
    }
    return b;
}

/* Whether every element is finite (or -inf, where allowed). */
static bool all_finite(const void *p, cp_dtype t, size_t n, bool minus_inf_ok)
{
    for (size_t i = 0; i < n; i++) {
        float v;
        if (t == CP_DTYPE_F32) {
            memcpy(&v, (const char *)p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const char *)p + 2 * i, 2);
            uint32_t bits = t == CP_DTYPE_BF16 ? (uint32_t)h << 16 : (h & 0x7c00) == 0x7c00 ? 0x7f800001u : 0;
            memcpy(&v, &bits, 4);
        }
        if (!isfinite(v) && !(minus_inf_ok && v == -INFINITY))
            return false;
    }
    return true;
}

/* One side of a rectangle, as cp_kernel_attn_args documents it. */
static bool side_ok(int64_t row, int64_t len, int64_t pos, int64_t seq)
{
    return len >= 0 && row >= 0 && row <= seq - len && pos >= 0 && pos <= POS_MAX - len;
}

/*
 * The rules for these arguments, written out again: whether they are valid.
 * *either is set where both verdicts are right: the default scale
 * 1/sqrt(head_dim) is only known to lie in [1/sqrt(32), 1] here (no libm),
 * which decides a softcap near the bound |scale| / softcap <= SMAX.
 */
static bool valid(const cp_kernel_attn_args *a, bool v11, bool *either)
{
    const double smax = 3.0e38 / 1.4426950408889634;
    const double scale = a->softmax_scale;
    *either = false;
    if (a->seq_q < 1 || a->seq_k < 1 || a->q_offset < 0 || a->q_offset > INT64_MAX - a->seq_q || a->k_offset < 0 ||
        a->k_offset > INT64_MAX - a->seq_k || !isfinite(scale) || fabs(scale) > smax)
        return false;
    if (!v11)
        return true;
    bool ok = a->window >= 0 && a->num_rects >= 0 && (a->rects || !a->num_rects);
    for (int64_t i = 0; ok && i < a->num_rects; i++) {
        const cp_attn_rect *r = &a->rects[i];
        ok = side_ok(r->q_row, r->q_len, r->q_pos, a->seq_q) && side_ok(r->k_row, r->k_len, r->k_pos, a->seq_k);
    }
    const double c = a->softcap;
    if (!ok || c == 0)
        return ok;
    if (!(isfinite(c) && c > 0 && c <= smax))
        return false;
    if (scale != 0)
        return fabs(scale) / c <= smax;
    /* 1/sqrt(32) > 0.176 */
    if (1.0 / c <= smax)
        return true;
    *either = 0.176 / c <= smax;
    return false;
}

static int64_t field(fuzz_input *in, bool wide)
{
    return wide ? fuzz_i64(in) : (int16_t)fuzz_take(in, 2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init();
    fuzz_input in = { data, size };
    const uint8_t flags = fuzz_u8(&in);
    const cp_dtype types[] = { CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16, CP_DTYPE_F32 };
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    const bool v11 = !(flags & 0x80);
    if (!v11)
        a.struct_size = offsetof(cp_kernel_attn_args, window);
    a.dtype = types[flags & 3];
    a.mask = flags & 4 ? CP_MASK_CAUSAL : CP_MASK_NONE;
    a.format = flags & 8 ? CP_FORMAT_SBHD : CP_FORMAT_BSHD;
    a.o_dtype = a.grad_dtype = flags & 16 ? CP_DTYPE_F32 : a.dtype;
    a.accumulate = !!(flags & 32);
    a.grad_accumulate = !!(flags & 64);
    a.batch = 1 + fuzz_u8(&in) % 2;
    a.num_kv_heads = 1 + fuzz_u8(&in) % 2;
    a.num_heads = a.num_kv_heads * (1 + fuzz_u8(&in) % 2);
    a.head_dim = 1 + fuzz_u8(&in) % 32;
    a.head_dim_v = fuzz_u8(&in) % 33;
    a.seq_q = (uint16_t)fuzz_take(&in, 2);
    a.seq_k = (uint16_t)fuzz_take(&in, 2);
    a.q_offset = fuzz_i64(&in);
    a.k_offset = fuzz_i64(&in);
    a.softmax_scale = fuzz_f64(&in);
    a.window = fuzz_i64(&in);
    a.softcap = fuzz_f64(&in);
    const uint8_t list = fuzz_u8(&in) % 3;
    const int n = fuzz_u8(&in) % (MAX_RECTS + 1);
    cp_attn_rect rects[MAX_RECTS];
    for (int i = 0; i < n; i++) {
        bool wide = fuzz_u8(&in) & 1;
        int64_t f[6];
        for (int j = 0; j < 6; j++)
            f[j] = field(&in, wide);
        rects[i] = (cp_attn_rect){ f[0], f[1], f[2], f[3], f[4], f[5] };
    }
    a.rects = list == 1 ? NULL : rects;
    a.num_rects = list == 2 ? -1 - n : n;

    bool either;
    const bool ok = valid(&a, v11, &either);
    size_t bytes = 1;
    cp_status s = cp_kernel_attn_workspace_size(ctx, &a, 1, &bytes);
    if (either && s == CP_SUCCESS)
        return 0;
    if (!ok) {
        CHECK(s == CP_ERROR_INVALID_ARGUMENT && bytes == 0);
        CHECK(starts_with(cp_last_error(), "cp_kernel_attn_workspace_size: "));
        CHECK(cp_kernel_attn_forward(ctx, &a) == CP_ERROR_INVALID_ARGUMENT);
        CHECK(starts_with(cp_last_error(), "cp_kernel_attn_forward: "));
        CHECK(cp_kernel_attn_backward(ctx, &a) == CP_ERROR_INVALID_ARGUMENT);
        CHECK(starts_with(cp_last_error(), "cp_kernel_attn_backward: "));
        return 0;
    }
    CHECK(s == CP_SUCCESS && bytes > 0);

    /* accepted: run it if it is small */
    const int64_t B = a.batch, Sq = a.seq_q, Sk = a.seq_k, H = a.num_heads, Hk = a.num_kv_heads, D = a.head_dim,
                  Dv = a.head_dim_v ? a.head_dim_v : a.head_dim;
    const double tiles = v11 && a.rects ? (double)a.num_rects + 1 : 1;
    if ((double)(B * H * (D + Dv)) * (double)(Sq + 256) * (double)(Sk + 144) * tiles > MAX_WORK)
        return 0;
    const size_t nq = (size_t)(B * Sq * H * D), nk = (size_t)(B * Sk * Hk * D), nv = (size_t)(B * Sk * Hk * Dv),
                 no = (size_t)(B * Sq * H * Dv), nl = (size_t)(B * H * Sq);
    void *q = pattern(a.dtype, nq), *k = pattern(a.dtype, nk), *v = pattern(a.dtype, nv);
    void *o = pattern(a.o_dtype, no), *dout = pattern(a.o_dtype, no);
    void *dq = pattern(a.grad_dtype, nq), *dk = pattern(a.grad_dtype, nk), *dv = pattern(a.grad_dtype, nv);
    float *lse = malloc(nl * sizeof *lse);
    CHECK(lse);
    if (a.accumulate) { /* an empty partial result */
        memset(o, 0, no * dtype_bytes(a.o_dtype));
        for (size_t i = 0; i < nl; i++)
            lse[i] = -INFINITY;
    }
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
    a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
    CHECK(cp_kernel_attn_forward(ctx, &a) == CP_SUCCESS);
    /* scores that cannot overflow fp32 (the default scale gives sqrt(D));
     * a softcap bounds them, but Q is scaled by scale / softcap first */
    const double scale = a.softmax_scale == 0 ? 1 : fabs(a.softmax_scale);
    const bool tame = v11 && a.softcap != 0 ? scale / a.softcap * (double)D <= 1e37 : scale * (double)D <= 64;
    if (tame)
        CHECK(all_finite(o, a.o_dtype, no, false) && all_finite(lse, CP_DTYPE_F32, nl, true));
    CHECK(cp_kernel_attn_backward(ctx, &a) == CP_SUCCESS);
    /* Gradients that fit their dtype come out finite. With P in [0, 1] (the
     * kernels clamp it), |dO|, |V|, |K|, |Q| <= 0.75 and the softcap's
     * derivative at most 1: |dP - D| <= 2 Dv 0.75^2, so |dS| <= scale 1.125 Dv;
     * dQ sums Sk of them times K, dK Sq of them times Q for each query head
     * of its group, dV Sq probabilities times dO a head; plus 0.75 already
     * there. An F16 gradient past 65504 is inf, rightly: the bound decides. */
    const double top = a.grad_dtype == CP_DTYPE_F16 ? 65000.0 : 3.0e38, group = (double)(H / Hk);
    const double ds = scale * 1.125 * (double)Dv;
    if (tame) {
        if ((double)Sk * ds * 0.75 + 0.75 <= top)
            CHECK(all_finite(dq, a.grad_dtype, nq, false));
        if (group * (double)Sq * ds * 0.75 + 0.75 <= top)
            CHECK(all_finite(dk, a.grad_dtype, nk, false));
        if (group * (double)Sq * 0.75 + 0.75 <= top)
            CHECK(all_finite(dv, a.grad_dtype, nv, false));
    }
    void *bufs[] = { q, k, v, o, dout, dq, dk, dv, lse };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    return 0;
}
