/* SPDX-License-Identifier: MIT */
/* Argument checking of the single-device kernels, shared by the public
 * cp_kernel_* functions and the CP modes that call the backend directly. */
#ifndef INFINICP_ATTN_KERNEL_H
#define INFINICP_ATTN_KERNEL_H

#include <math.h>

#include "core/internal.h"

/* What cpi_kernel_attn_args_check() requires. */
typedef enum {
    CPI_KERNEL_SIZE_ONLY = 0, /* shapes, types and strides; data pointers may be NULL */
    CPI_KERNEL_FORWARD = 1,   /* + the forward's pointers */
    CPI_KERNEL_BACKWARD = 2   /* + the backward's pointers and gradient fields */
} cpi_kernel_use;

/*
 * Validate *a for `use` (naming `func` in messages) and store in *out the
 * normalised copy every backend receives: struct_size = sizeof, head_dim_v
 * and softmax_scale filled in, and every tensor's (and the LSE's) zero
 * strides replaced by the dense strides of `format`. `backward_fields` says
 * whether the gradient tensors' shapes are checked when sizing.
 */
cp_status cpi_kernel_attn_args_check(const char *func, const cp_kernel_attn_args *a, cpi_kernel_use use,
                                     int backward_fields, cp_kernel_attn_args *out);

/* Scores are scaled into base 2 in fp32: scale * log2(e) must be a finite
 * float, which |scale| <= 3e38 / log2(e) keeps with room to spare. The CP
 * modes call the backends directly, so plans check it too; messages print
 * this bound. */
#define CPI_SOFTMAX_SCALE_MAX (3.0e38 / 1.4426950408889634)

static inline bool cpi_softmax_scale_ok(double scale)
{
    return isfinite(scale) && fabs(scale) <= CPI_SOFTMAX_SCALE_MAX;
}

/*
 * A softcap c (API 1.1): 0 for none, else finite and > 0, with c * log2(e)
 * and |scale| / c finite floats (the CPU forward scales Q by scale / c and
 * maps scores through c log2(e) tanh); both bounds are
 * CPI_SOFTMAX_SCALE_MAX, which messages print.
 */
static inline bool cpi_softcap_ok(double scale, double softcap)
{
    return softcap == 0 || (isfinite(softcap) && softcap > 0 && softcap <= CPI_SOFTMAX_SCALE_MAX &&
                            fabs(scale) / softcap <= CPI_SOFTMAX_SCALE_MAX);
}

/* Rectangle positions (q_pos, k_pos) and their ends pos + len are at most
 * this: the kernels add windows and row offsets to them in int64. */
#define CPI_RECT_POS_MAX (INT64_MAX / 4)

/*
 * Whether ctx's backend understands the kernel arguments of `a` newer than
 * API 1.0 that are set (1.1: window != 0, softcap != 0, rects; 1.2: the
 * descales, and dtype FP8, which comes with them): #CP_ERROR_UNSUPPORTED
 * naming the first one it does not, and the backend, else CP_SUCCESS. A
 * backend declares the size of cp_kernel_attn_args its kernels read in
 * cp_backend_ops.kernel_args_size; 0, or a table too old to have that
 * field, means the 1.0 arguments. `func` starts the message. The CP plans
 * ask it too, with the fields their blocks will use.
 */
cp_status cpi_kernel_args_supported(const cp_context *ctx, const char *func, const cp_kernel_attn_args *a);

/*
 * The descales of a call (API 1.2; cp_kernel_attn_args or cp_attn_args,
 * named `arg`->q_descale ...): set only with FP8 inputs (`dtype`, which
 * `whose` names in the message), each aligned to its floats, per_head 0 or
 * 1. `func` starts the message.
 */
cp_status cpi_check_descales(const char *func, const char *arg, const char *whose, cp_dtype dtype, const float *q,
                             const float *k, const float *v, int per_head);

/* The same for cp_kernel_merge(). */
cp_status cpi_kernel_merge_args_check(const char *func, const cp_kernel_merge_args *a,
                                      cp_kernel_merge_args *out);

#endif
