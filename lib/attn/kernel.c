/* SPDX-License-Identifier: MIT */
/*
 * The public single-device kernels: cp_kernel_attn_forward,
 * cp_kernel_attn_backward, cp_kernel_attn_workspace_size, cp_kernel_merge.
 * Every argument is checked here, once, for every backend; backends receive
 * the normalised arguments (dense strides derived, defaults filled in).
 */
#include <inttypes.h>
#include <math.h>

#include "attn/kernel.h"
#include "core/context.h"

/* The dense strides of a [B, S, H, D] tensor in format f, overflow-checked. */
static cp_status dense_strides(const char *func, const char *name, cp_format f, int64_t B, int64_t S,
                               int64_t H, int64_t D, int64_t *sb, int64_t *ss, int64_t *sh)
{
    int64_t hd, shd, bhd;
    bool ok = !__builtin_mul_overflow(H, D, &hd) && !__builtin_mul_overflow(S, hd, &shd) &&
              !__builtin_mul_overflow(B, hd, &bhd);
    if (!ok)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT,
                         "%s: a->%s of %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64
                         " elements overflows",
                         func, name, B, S, H, D);
    *sh = D;
    if (f == CP_FORMAT_BSHD) {
        *ss = hd;
        *sb = shd;
    } else {
        *sb = hd;
        *ss = bhd;
    }
    return CP_SUCCESS;
}

/* An output written through a zero stride along a dimension of more than
 * one element would write the same elements for every index of it: the
 * results would race on a device and overwrite each other anywhere. */
static cp_status check_no_self_overlap(const char *func, const char *name, const char *const *dims,
                                       const int64_t *extent, const int64_t *stride, int n)
{
    for (int i = 0; i < n; i++)
        CPI_CHECK(stride[i] != 0 || extent[i] <= 1,
                  "%s: a->%s_stride_%s = 0 with %" PRId64 " elements along it (an output must not overlap itself)",
                  func, name, dims[i], extent[i]);
    return CP_SUCCESS;
}

/*
 * One [B, S, H, D] tensor of type t at p with strides (*sb, *ss, *sh): derive
 * all-zero strides, reject negative ones (and zero ones of an output), and
 * make sure the byte offset of its last element fits.
 */
static cp_status check_tensor(const char *func, const char *name, const void *p, bool need_ptr, bool output,
                              cp_dtype t, cp_format f, int64_t B, int64_t S, int64_t H, int64_t D, int64_t *sb,
                              int64_t *ss, int64_t *sh)
{
    size_t es = cpi_dtype_size(t);
    CPI_CHECK(!need_ptr || p, "%s: a->%s is NULL", func, name);
    CPI_CHECK((uintptr_t)p % es == 0, "%s: a->%s = %p is not aligned to its %zu-byte elements", func, name,
              p, es);
    if (*sb == 0 && *ss == 0 && *sh == 0)
        CPI_TRY(dense_strides(func, name, f, B, S, H, D, sb, ss, sh));
    CPI_CHECK(*sb >= 0 && *ss >= 0 && *sh >= 0,
              "%s: a->%s_stride_b = %" PRId64 ", a->%s_stride_s = %" PRId64 ", a->%s_stride_h = %" PRId64
              " (strides must be >= 0)",
              func, name, *sb, name, *ss, name, *sh);
    static const char *const dims[] = { "b", "s", "h" };
    if (output)
        CPI_TRY(check_no_self_overlap(func, name, dims, (const int64_t[]){ B, S, H },
                                      (const int64_t[]){ *sb, *ss, *sh }, 3));
    int64_t last = D - 1, x;
    bool ok = !__builtin_mul_overflow(B - 1, *sb, &x) && !__builtin_add_overflow(last, x, &last) &&
              !__builtin_mul_overflow(S - 1, *ss, &x) && !__builtin_add_overflow(last, x, &last) &&
              !__builtin_mul_overflow(H - 1, *sh, &x) && !__builtin_add_overflow(last, x, &last) &&
              !__builtin_add_overflow(last, 1, &x) && !__builtin_mul_overflow(x, (int64_t)es, &x) &&
              (uint64_t)x <= PTRDIFF_MAX;
    CPI_CHECK(ok,
              "%s: a->%s spans more than the address space (strides %" PRId64 ", %" PRId64 ", %" PRId64
              " over %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64 " elements)",
              func, name, *sb, *ss, *sh, B, S, H, D);
    /* Strides may overlap rows, so a tensor that fits can still count more
     * elements than int64 holds; the kernels count them. */
    CPI_CHECK(!__builtin_mul_overflow(B, S, &x) && !__builtin_mul_overflow(x, H, &x) &&
                  !__builtin_mul_overflow(x, D, &x),
              "%s: a->%s of %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64 " elements overflows", func, name,
              B, S, H, D);
    return CP_SUCCESS;
}

/* The LSE: float element (b, h, s) at p + b*(*sb) + h*(*sh) + s; all-zero
 * strides mean dense [B, H, S]. */
static cp_status check_lse(const char *func, const char *name, const float *p, bool need_ptr, bool output,
                           int64_t B, int64_t H, int64_t S, int64_t *sb, int64_t *sh)
{
    CPI_CHECK(!need_ptr || p, "%s: a->%s is NULL", func, name);
    CPI_CHECK((uintptr_t)p % sizeof(float) == 0, "%s: a->%s = %p is not aligned to its 4-byte elements", func,
              name, (const void *)p);
    if (*sb == 0 && *sh == 0) {
        *sh = S;
        CPI_CHECK(!__builtin_mul_overflow(H, S, sb), "%s: a->%s of %" PRId64 " x %" PRId64 " x %" PRId64
                  " elements overflows", func, name, B, H, S);
    }
    CPI_CHECK(*sb >= 0 && *sh >= 0,
              "%s: a->%s_stride_b = %" PRId64 ", a->%s_stride_h = %" PRId64 " (strides must be >= 0)", func,
              name, *sb, name, *sh);
    static const char *const dims[] = { "b", "h" };
    if (output)
        CPI_TRY(check_no_self_overlap(func, name, dims, (const int64_t[]){ B, H }, (const int64_t[]){ *sb, *sh },
                                      2));
    int64_t last = S - 1, x;
    bool ok = !__builtin_mul_overflow(B - 1, *sb, &x) && !__builtin_add_overflow(last, x, &last) &&
              !__builtin_mul_overflow(H - 1, *sh, &x) && !__builtin_add_overflow(last, x, &last) &&
              !__builtin_add_overflow(last, 1, &x) && !__builtin_mul_overflow(x, (int64_t)sizeof(float), &x) &&
              (uint64_t)x <= PTRDIFF_MAX;
    CPI_CHECK(ok, "%s: a->%s spans more than the address space (strides %" PRId64 ", %" PRId64 ")", func,
              name, *sb, *sh);
    return CP_SUCCESS;
}

/* A storage type: of q, k, v (inputs: FP8 too, since API 1.2) or of a
 * result (o, o_part). */
static cp_status check_storage_dtype(const char *func, const char *name, cp_dtype t, bool input)
{
    if (t == CP_DTYPE_F64)
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: a->%s = CP_DTYPE_F64 (the kernels store F32, F16 or BF16)", func, name);
    CPI_CHECK(input || t != CP_DTYPE_FP8_E4M3,
              "%s: a->%s = %d (CP_DTYPE_FP8_E4M3 is an input type, never a result's: must be CP_DTYPE_F32, "
              "CP_DTYPE_F16 or CP_DTYPE_BF16)",
              func, name, (int)t);
    CPI_CHECK(t == CP_DTYPE_F32 || t == CP_DTYPE_F16 || t == CP_DTYPE_BF16 || t == CP_DTYPE_FP8_E4M3,
              "%s: a->%s = %d (must be CP_DTYPE_F32, CP_DTYPE_F16 or CP_DTYPE_BF16%s)", func, name, (int)t,
              input ? ", or CP_DTYPE_FP8_E4M3 for a forward" : "");
    return CP_SUCCESS;
}

/* o_dtype / grad_dtype: the storage type or F32; after FP8 inputs, BF16 or
 * F32 (FP8 is no type of results). */
static cp_status check_result_dtype(const char *func, const char *name, cp_dtype t, cp_dtype storage)
{
    if (storage == CP_DTYPE_FP8_E4M3)
        CPI_CHECK(t == CP_DTYPE_BF16 || t == CP_DTYPE_F32,
                  "%s: a->%s = %d (%s; with a->dtype = CP_DTYPE_FP8_E4M3 it must be CP_DTYPE_BF16 or CP_DTYPE_F32)",
                  func, name, (int)t, cpi_dtype_name(t));
    else
        CPI_CHECK(t == storage || t == CP_DTYPE_F32, "%s: a->%s = %d (must be a->dtype = %d or CP_DTYPE_F32)", func,
                  name, (int)t, (int)storage);
    return CP_SUCCESS;
}

static cp_status check_flag(const char *func, const char *name, int v)
{
    CPI_CHECK(v == 0 || v == 1, "%s: a->%s = %d (must be 0 or 1)", func, name, v);
    return CP_SUCCESS;
}

/* One side ("q" or "k") of rectangle i against the block's seq rows. */
static cp_status check_rect_side(const char *func, int64_t i, const char *x, int64_t row, int64_t len, int64_t pos,
                                 int64_t seq)
{
    CPI_CHECK(len >= 0, "%s: a->rects[%" PRId64 "].%s_len = %" PRId64 " (must be >= 0)", func, i, x, len);
    CPI_CHECK(row >= 0 && row <= seq - len,
              "%s: a->rects[%" PRId64 "].%s_row = %" PRId64 " with %s_len = %" PRId64
              " (rows [%s_row, %s_row + %s_len) must lie in [0, a->seq_%s = %" PRId64 "))",
              func, i, x, row, x, len, x, x, x, x, seq);
    CPI_CHECK(pos >= 0 && pos <= CPI_RECT_POS_MAX - len,
              "%s: a->rects[%" PRId64 "].%s_pos = %" PRId64 " with %s_len = %" PRId64
              " (must be >= 0, and %s_pos + %s_len at most %" PRId64 ")",
              func, i, x, pos, x, len, x, x, (int64_t)CPI_RECT_POS_MAX);
    return CP_SUCCESS;
}

/* The API 1.1 fields: window, softcap, rectangles. */
static cp_status check_v11(const char *func, const cp_kernel_attn_args *a)
{
    CPI_CHECK(a->window >= 0, "%s: a->window = %" PRId64 " (must be >= 0; 0 = none)", func, a->window);
    CPI_CHECK(cpi_softcap_ok(a->softmax_scale, a->softcap),
              "%s: a->softcap = %g (must be 0 for none, or finite and > 0, at most %.17g and at least "
              "|softmax_scale| / %.17g; softmax_scale = %g)",
              func, a->softcap, CPI_SOFTMAX_SCALE_MAX, CPI_SOFTMAX_SCALE_MAX, a->softmax_scale);
    CPI_CHECK(a->num_rects >= 0, "%s: a->num_rects = %" PRId64 " (must be >= 0)", func, a->num_rects);
    CPI_CHECK(a->rects || a->num_rects == 0,
              "%s: a->rects is NULL with a->num_rects = %" PRId64 " (0 without rectangles)", func, a->num_rects);
    for (int64_t i = 0; i < a->num_rects; i++) {
        const cp_attn_rect *r = &a->rects[i];
        CPI_TRY(check_rect_side(func, i, "q", r->q_row, r->q_len, r->q_pos, a->seq_q));
        CPI_TRY(check_rect_side(func, i, "k", r->k_row, r->k_len, r->k_pos, a->seq_k));
    }
    return CP_SUCCESS;
}

cp_status cpi_check_descales(const char *func, const char *arg, const char *whose, cp_dtype dtype, const float *q,
                             const float *k, const float *v, int per_head)
{
    CPI_CHECK(per_head == 0 || per_head == 1, "%s: %s->descale_per_head = %d (must be 0 or 1)", func, arg, per_head);
    const struct {
        const char *name;
        const float *p;
    } d[] = { { "q_descale", q }, { "k_descale", k }, { "v_descale", v } };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        if (!d[i].p)
            continue;
        CPI_CHECK(dtype == CP_DTYPE_FP8_E4M3,
                  "%s: %s->%s is set but %s = %d (%s): descales scale FP8 inputs (CP_DTYPE_FP8_E4M3)", func, arg,
                  d[i].name, whose, (int)dtype, cpi_dtype_name(dtype));
        CPI_CHECK((uintptr_t)d[i].p % sizeof(float) == 0, "%s: %s->%s = %p is not aligned to its 4-byte elements",
                  func, arg, d[i].name, (const void *)d[i].p);
    }
    return CP_SUCCESS;
}

cp_status cpi_kernel_args_supported(const cp_context *ctx, const char *func, const cp_kernel_attn_args *a)
{
    const cp_backend_ops *o = ctx->ops;
    size_t have = o->struct_size >= offsetof(cp_backend_ops, kernel_args_size) + sizeof o->kernel_args_size
                      ? o->kernel_args_size
                      : 0;
    if (have == 0)
        have = offsetof(cp_kernel_attn_args, window);
    const size_t v12 = offsetof(cp_kernel_attn_args, descale_per_head) + sizeof(int);
    const struct {
        bool set;
        const char *name, *api;
        size_t end;
    } fields[] = {
        { a->window != 0, "window", "1.1", offsetof(cp_kernel_attn_args, window) + sizeof(int64_t) },
        { a->softcap != 0, "softcap", "1.1", offsetof(cp_kernel_attn_args, softcap) + sizeof(double) },
        { a->rects != NULL, "rects", "1.1", offsetof(cp_kernel_attn_args, num_rects) + sizeof(int64_t) },
        { a->q_descale != NULL, "q_descale", "1.2", v12 },
        { a->k_descale != NULL, "k_descale", "1.2", v12 },
        { a->v_descale != NULL, "v_descale", "1.2", v12 },
        /* FP8 inputs come with descales: a backend that cannot read them has no FP8 kernels */
        { a->dtype == CP_DTYPE_FP8_E4M3, "dtype = CP_DTYPE_FP8_E4M3", "1.2", v12 },
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].set && have < fields[i].end)
            return cpi_error(CP_ERROR_UNSUPPORTED,
                             "%s: %s is set, but the kernels of the %s backend do not support it (they read "
                             "cp_kernel_attn_args up to byte %zu, %s needs %zu: API %s)",
                             func, fields[i].name, o->name ? o->name : "(unnamed)", have, fields[i].name,
                             fields[i].end, fields[i].api);
    return CP_SUCCESS;
}

cp_status cpi_kernel_attn_args_check(const char *func, const cp_kernel_attn_args *user, cpi_kernel_use use,
                                     int backward_fields, cp_kernel_attn_args *out)
{
    CPI_CHECK(user != NULL, "%s: a is NULL", func);
    static const cp_kernel_attn_args defaults = CP_KERNEL_ATTN_ARGS_INIT;
    /* the first published args end at workspace_bytes; lse_lo, drow and
     * drow_ready came later */
    const size_t v1 = offsetof(cp_kernel_attn_args, workspace_bytes) + sizeof(size_t);
    CPI_TRY(cpi_copy_config(out, sizeof *out, &defaults, user, v1, func, "a"));
    cp_kernel_attn_args *a = out;
    bool bwd = use == CPI_KERNEL_BACKWARD, ptrs = use != CPI_KERNEL_SIZE_ONLY;
    backward_fields = backward_fields || bwd;

    CPI_TRY(check_storage_dtype(func, "dtype", a->dtype, true));
    if (a->dtype == CP_DTYPE_FP8_E4M3 && backward_fields)
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: a->dtype = CP_DTYPE_FP8_E4M3 (FP8 attention is forward only: the backward takes "
                         "CP_DTYPE_F32, CP_DTYPE_F16 or CP_DTYPE_BF16)",
                         func);
    CPI_CHECK(a->format == CP_FORMAT_BSHD || a->format == CP_FORMAT_SBHD,
              "%s: a->format = %d (must be CP_FORMAT_BSHD or CP_FORMAT_SBHD)", func, (int)a->format);
    CPI_CHECK(a->batch > 0, "%s: a->batch = %" PRId64 " (must be > 0)", func, a->batch);
    CPI_CHECK(a->num_heads > 0, "%s: a->num_heads = %d (must be > 0)", func, a->num_heads);
    CPI_CHECK(a->num_kv_heads > 0, "%s: a->num_kv_heads = %d (must be > 0)", func, a->num_kv_heads);
    CPI_CHECK(a->num_heads % a->num_kv_heads == 0,
              "%s: a->num_kv_heads = %d does not divide a->num_heads = %d", func, a->num_kv_heads,
              a->num_heads);
    CPI_CHECK(a->head_dim > 0, "%s: a->head_dim = %d (must be > 0)", func, a->head_dim);
    CPI_CHECK(a->head_dim_v >= 0, "%s: a->head_dim_v = %d (must be > 0, or 0 for head_dim)", func,
              a->head_dim_v);
    if (a->head_dim_v == 0)
        a->head_dim_v = a->head_dim;
    CPI_CHECK(a->seq_q > 0, "%s: a->seq_q = %" PRId64 " (must be > 0)", func, a->seq_q);
    CPI_CHECK(a->seq_k > 0, "%s: a->seq_k = %" PRId64 " (must be > 0)", func, a->seq_k);
    CPI_CHECK(a->q_offset >= 0 && a->q_offset <= INT64_MAX - a->seq_q,
              "%s: a->q_offset = %" PRId64 " (must be >= 0, and q_offset + seq_q must fit in int64)", func,
              a->q_offset);
    CPI_CHECK(a->k_offset >= 0 && a->k_offset <= INT64_MAX - a->seq_k,
              "%s: a->k_offset = %" PRId64 " (must be >= 0, and k_offset + seq_k must fit in int64)", func,
              a->k_offset);
    CPI_CHECK(a->mask == CP_MASK_NONE || a->mask == CP_MASK_CAUSAL,
              "%s: a->mask = %d (must be CP_MASK_NONE or CP_MASK_CAUSAL)", func, (int)a->mask);
    if (a->softmax_scale == 0.0)
        a->softmax_scale = 1.0 / sqrt((double)a->head_dim);
    CPI_CHECK(cpi_softmax_scale_ok(a->softmax_scale),
              "%s: a->softmax_scale = %g (must be finite, |scale| <= %.17g; 0 for 1/sqrt(head_dim))", func,
              a->softmax_scale, CPI_SOFTMAX_SCALE_MAX);
    CPI_TRY(check_v11(func, a));
    CPI_TRY(cpi_check_descales(func, "a", "a->dtype", a->dtype, a->q_descale, a->k_descale, a->v_descale,
                               a->descale_per_head));
    CPI_TRY(check_result_dtype(func, "o_dtype", a->o_dtype, a->dtype));
    if (!bwd)
        CPI_TRY(check_flag(func, "accumulate", a->accumulate));

    const int64_t B = a->batch, Sq = a->seq_q, Sk = a->seq_k, H = a->num_heads, Hk = a->num_kv_heads,
                  D = a->head_dim, Dv = a->head_dim_v;
    const cp_format f = a->format;
    CPI_TRY(check_tensor(func, "q", a->q, ptrs, false, a->dtype, f, B, Sq, H, D, &a->q_stride_b, &a->q_stride_s,
                         &a->q_stride_h));
    CPI_TRY(check_tensor(func, "k", a->k, ptrs, false, a->dtype, f, B, Sk, Hk, D, &a->k_stride_b, &a->k_stride_s,
                         &a->k_stride_h));
    CPI_TRY(check_tensor(func, "v", a->v, ptrs, false, a->dtype, f, B, Sk, Hk, Dv, &a->v_stride_b, &a->v_stride_s,
                         &a->v_stride_h));
    /* o and lse are the forward's outputs, the backward's inputs */
    CPI_TRY(check_tensor(func, "o", a->o, ptrs, !backward_fields, a->o_dtype, f, B, Sq, H, Dv, &a->o_stride_b,
                         &a->o_stride_s, &a->o_stride_h));
    CPI_TRY(check_lse(func, "lse", a->lse, ptrs, !backward_fields, B, H, Sq, &a->lse_stride_b, &a->lse_stride_h));
    if (!backward_fields)
        return CP_SUCCESS;

    CPI_TRY(check_result_dtype(func, "grad_dtype", a->grad_dtype, a->dtype));
    CPI_TRY(check_flag(func, "grad_accumulate", a->grad_accumulate));
    CPI_TRY(check_tensor(func, "dout", a->dout, ptrs, false, a->o_dtype, f, B, Sq, H, Dv, &a->dout_stride_b,
                         &a->dout_stride_s, &a->dout_stride_h));
    CPI_TRY(check_tensor(func, "dq", a->dq, ptrs, true, a->grad_dtype, f, B, Sq, H, D, &a->dq_stride_b,
                         &a->dq_stride_s, &a->dq_stride_h));
    CPI_TRY(check_tensor(func, "dk", a->dk, ptrs, true, a->grad_dtype, f, B, Sk, Hk, D, &a->dk_stride_b,
                         &a->dk_stride_s, &a->dk_stride_h));
    CPI_TRY(check_tensor(func, "dv", a->dv, ptrs, true, a->grad_dtype, f, B, Sk, Hk, Dv, &a->dv_stride_b,
                         &a->dv_stride_s, &a->dv_stride_h));
    /* the rowsum buffer: optional, laid out like lse (strides checked there) */
    CPI_TRY(check_flag(func, "drow_ready", a->drow_ready));
    CPI_CHECK(!ptrs || a->drow || !a->drow_ready, "%s: a->drow is NULL but a->drow_ready = 1 (nothing to read)",
              func);
    CPI_CHECK((uintptr_t)a->drow % sizeof(float) == 0, "%s: a->drow = %p is not aligned to its 4-byte elements",
              func, (const void *)a->drow);
    return CP_SUCCESS;
}

cp_status cpi_kernel_merge_args_check(const char *func, const cp_kernel_merge_args *user,
                                      cp_kernel_merge_args *out)
{
    CPI_CHECK(user != NULL, "%s: a is NULL", func);
    static const cp_kernel_merge_args defaults = CP_KERNEL_MERGE_ARGS_INIT;
    CPI_TRY(cpi_copy_config(out, sizeof *out, &defaults, user, sizeof *out, func, "a"));
    cp_kernel_merge_args *a = out;
    CPI_CHECK(a->format == CP_FORMAT_BSHD || a->format == CP_FORMAT_SBHD,
              "%s: a->format = %d (must be CP_FORMAT_BSHD or CP_FORMAT_SBHD)", func, (int)a->format);
    CPI_CHECK(a->batch > 0, "%s: a->batch = %" PRId64 " (must be > 0)", func, a->batch);
    CPI_CHECK(a->seq > 0, "%s: a->seq = %" PRId64 " (must be > 0)", func, a->seq);
    CPI_CHECK(a->num_heads > 0, "%s: a->num_heads = %d (must be > 0)", func, a->num_heads);
    CPI_CHECK(a->head_dim_v > 0, "%s: a->head_dim_v = %d (must be > 0)", func, a->head_dim_v);
    CPI_TRY(check_storage_dtype(func, "o_dtype", a->o_dtype, false));
    CPI_TRY(check_storage_dtype(func, "o_part_dtype", a->o_part_dtype, false));
    const int64_t B = a->batch, S = a->seq, H = a->num_heads, Dv = a->head_dim_v;
    CPI_TRY(check_tensor(func, "o", a->o, true, true, a->o_dtype, a->format, B, S, H, Dv, &a->o_stride_b,
                         &a->o_stride_s, &a->o_stride_h));
    CPI_TRY(check_tensor(func, "o_part", a->o_part, true, false, a->o_part_dtype, a->format, B, S, H, Dv,
                         &a->o_part_stride_b, &a->o_part_stride_s, &a->o_part_stride_h));
    CPI_TRY(check_lse(func, "lse", a->lse, true, true, B, H, S, &a->lse_stride_b, &a->lse_stride_h));
    CPI_TRY(check_lse(func, "lse_part", a->lse_part, true, false, B, H, S, &a->lse_part_stride_b,
                      &a->lse_part_stride_h));
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_kernel_attn_workspace_size(cp_context *ctx, const cp_kernel_attn_args *a, int backward,
                                                  size_t *bytes)
{
    CPI_CHECK_PTR(bytes);
    *bytes = 0;
    CPI_CHECK_PTR(ctx);
    CPI_CHECK(backward == 0 || backward == 1, "%s: backward = %d (must be 0 or 1)", __func__, backward);
    cp_kernel_attn_args n;
    CPI_TRY(cpi_kernel_attn_args_check(__func__, a, CPI_KERNEL_SIZE_ONLY, backward, &n));
    CPI_TRY(cpi_kernel_args_supported(ctx, __func__, &n));
    return ctx->ops->attn_workspace_size(ctx->state, &n, backward, bytes);
}

CP_EXPORT cp_status cp_kernel_attn_forward(cp_context *ctx, const cp_kernel_attn_args *a)
{
    CPI_CHECK_PTR(ctx);
    cp_kernel_attn_args n;
    CPI_TRY(cpi_kernel_attn_args_check(__func__, a, CPI_KERNEL_FORWARD, 0, &n));
    CPI_TRY(cpi_kernel_args_supported(ctx, __func__, &n));
    return ctx->ops->attn_forward(ctx->state, &n);
}

CP_EXPORT cp_status cp_kernel_attn_backward(cp_context *ctx, const cp_kernel_attn_args *a)
{
    CPI_CHECK_PTR(ctx);
    cp_kernel_attn_args n;
    CPI_TRY(cpi_kernel_attn_args_check(__func__, a, CPI_KERNEL_BACKWARD, 1, &n));
    CPI_TRY(cpi_kernel_args_supported(ctx, __func__, &n));
    return ctx->ops->attn_backward(ctx->state, &n);
}

CP_EXPORT cp_status cp_kernel_merge(cp_context *ctx, const cp_kernel_merge_args *a)
{
    CPI_CHECK_PTR(ctx);
    cp_kernel_merge_args n;
    CPI_TRY(cpi_kernel_merge_args_check(__func__, a, &n));
    return ctx->ops->merge(ctx->state, &n);
}
