/* SPDX-License-Identifier: MIT */
/* cp_attn_plan: validation, the cross-rank agreement check, workspace
 * sizing, and dispatch to the modes. */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn/kernel.h"
#include "attn/plan.h"
#include "attn/ring.h"
#include "comm/agree.h"
#include "core/context.h"
#include "layout/pack.h"

/* First published cp_attn_desc: everything up to `mode`. */
#define DESC_V1_SIZE (offsetof(cp_attn_desc, mode) + sizeof(cp_mode))

/*
 * Which code runs which mode (docs/ARCHITECTURE.md, CP modes). Three modes
 * are one path, a2a_p2p.c, on differently shaped groups (check_mode sets
 * a2a_size): a2a exchange inside sub-groups of a2a_size ranks (a2a.c), the
 * ring across them (ring.c), a2a back. Every mode attends through
 * span_pairs.c.
 *
 *   mode         a2a_size                runs
 *   all_gather   1                       all_gather.c
 *   p2p          1                       a2a_p2p.c: the ring (ring.c), no exchange
 *   a2a          cp_size                 a2a_p2p.c: the exchange (a2a.c), a ring of one
 *   a2a_p2p      the group's a2a_size    a2a_p2p.c: the exchange, the ring
 */
typedef struct mode_entry {
    const char *name;
    cp_status (*forward)(cp_attn_plan *p, const cpi_fwd_args *a, cpi_arena *ws);
    cp_status (*backward)(cp_attn_plan *p, const cpi_bwd_args *a, cpi_arena *ws);
} mode_entry;

static const mode_entry modes[] = {
    [CP_MODE_ALL_GATHER] = { "all_gather", cpi_all_gather_forward, cpi_all_gather_backward },
    [CP_MODE_P2P] = { "p2p", cpi_a2a_p2p_forward, cpi_a2a_p2p_backward },
    [CP_MODE_A2A] = { "a2a", cpi_a2a_p2p_forward, cpi_a2a_p2p_backward },
    [CP_MODE_A2A_P2P] = { "a2a_p2p", cpi_a2a_p2p_forward, cpi_a2a_p2p_backward },
};

static const char *mode_name(cp_mode m)
{
    return (unsigned)m < sizeof modes / sizeof modes[0] ? modes[m].name : "unknown";
}

/* Everything about the descriptor that does not depend on the group. */
static cp_status check_desc(const cp_attn_desc *d)
{
    static const char *f = "cp_attn_plan_create";
    CPI_CHECK(cpi_dtype_valid(d->dtype), "%s: desc->dtype = %d (must be a cp_dtype)", f, (int)d->dtype);
    if (d->dtype == CP_DTYPE_F64)
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: desc->dtype = CP_DTYPE_F64 (attention runs in F32, F16 or BF16, or forward in "
                         "CP_DTYPE_FP8_E4M3)",
                         f);
    CPI_CHECK(d->format == CP_FORMAT_BSHD || d->format == CP_FORMAT_SBHD,
              "%s: desc->format = %d (must be CP_FORMAT_BSHD (0) or CP_FORMAT_SBHD (1))", f, (int)d->format);
    CPI_CHECK(d->batch >= 1, "%s: desc->batch = %lld (must be >= 1)", f, (long long)d->batch);
    CPI_CHECK(d->seq_len >= 1, "%s: desc->seq_len = %lld (must be >= 1)", f, (long long)d->seq_len);
    CPI_CHECK(d->num_heads >= 1, "%s: desc->num_heads = %d (must be >= 1)", f, d->num_heads);
    CPI_CHECK(d->num_kv_heads >= 1, "%s: desc->num_kv_heads = %d (must be >= 1)", f, d->num_kv_heads);
    CPI_CHECK(d->num_heads % d->num_kv_heads == 0,
              "%s: desc->num_kv_heads = %d does not divide desc->num_heads = %d", f, d->num_kv_heads,
              d->num_heads);
    CPI_CHECK(d->head_dim >= 1, "%s: desc->head_dim = %d (must be >= 1)", f, d->head_dim);
    CPI_CHECK(d->head_dim_v >= 0, "%s: desc->head_dim_v = %d (must be >= 0; 0 = head_dim)", f, d->head_dim_v);
    CPI_CHECK(d->mask == CP_MASK_NONE || d->mask == CP_MASK_CAUSAL,
              "%s: desc->mask = %d (must be CP_MASK_NONE (0) or CP_MASK_CAUSAL (1))", f, (int)d->mask);
    CPI_CHECK(cpi_softmax_scale_ok(d->softmax_scale),
              "%s: desc->softmax_scale = %g (must be finite, |scale| <= %.17g; 0 = 1/sqrt(head_dim))", f,
              d->softmax_scale, CPI_SOFTMAX_SCALE_MAX);
    CPI_CHECK(d->mode >= CP_MODE_ALL_GATHER && d->mode <= CP_MODE_A2A_P2P,
              "%s: desc->mode = %d (must be a cp_mode, 0..3)", f, (int)d->mode);
    CPI_CHECK(d->layout == CP_LAYOUT_CONTIGUOUS || d->layout == CP_LAYOUT_ZIGZAG || d->layout == CP_LAYOUT_PACKED,
              "%s: desc->layout = %d (must be a cp_layout, 0..2)", f, (int)d->layout);
    CPI_CHECK(d->layout != CP_LAYOUT_PACKED || d->batch == 1,
              "%s: desc->batch = %lld with CP_LAYOUT_PACKED (a packed row is one sample: batch must be 1)", f,
              (long long)d->batch);
    CPI_CHECK(d->window >= 0, "%s: desc->window = %lld (must be >= 0; 0 = none)", f, (long long)d->window);
    CPI_CHECK(isfinite(d->softcap) && d->softcap >= 0, "%s: desc->softcap = %g (must be finite and >= 0; 0 = none)",
              f, d->softcap);
    CPI_CHECK(d->sinks == 0 || d->sinks == 1, "%s: desc->sinks = %d (must be 0 or 1)", f, d->sinks);
    /* the largest tensor any mode touches: batch x seq x heads x dim x 8 bytes */
    size_t n = 8;
    int32_t h = d->num_heads > d->num_kv_heads ? d->num_heads : d->num_kv_heads;
    int32_t dim = d->head_dim > d->head_dim_v ? d->head_dim : d->head_dim_v;
    CPI_CHECK(cpi_mul(n, (size_t)d->batch, &n) && cpi_mul(n, (size_t)d->seq_len, &n) &&
                  cpi_mul(n, (size_t)h, &n) && cpi_mul(n, (size_t)dim, &n) && n <= (size_t)INT64_MAX,
              "%s: batch %lld x seq_len %lld x heads %d x head_dim %d overflows the address space", f,
              (long long)d->batch, (long long)d->seq_len, h, dim);
    return CP_SUCCESS;
}

/* What API 1.1 and 1.2 ask of the context's backend: kernels that
 * understand windows, softcaps and rectangles, and FP8 inputs with their
 * descales (cp_backend_ops.kernel_args_size), and, for sinks on a device,
 * the rowsums of row_dot (sinks.c; sink_grad, which sums them on the
 * device, is optional). */
static cp_status check_backend(const cp_attn_plan *p)
{
    static const char *f = "cp_attn_plan_create";
    const cp_attn_desc *d = &p->desc;
    const char *device = p->ctx->device == CP_DEVICE_CPU ? "CPU" : "CUDA";
    const char *what = d->layout == CP_LAYOUT_PACKED ? "desc->layout = CP_LAYOUT_PACKED"
                       : d->window                   ? "desc->window"
                       : d->softcap != 0             ? "desc->softcap"
                                                     : NULL;
    /* every block of such a plan is a rectangle list, with the window and softcap */
    static const cp_attn_rect some = { 0, 0, 0, 0, 0, 0 };
    cp_kernel_attn_args blocks = CP_KERNEL_ATTN_ARGS_INIT;
    blocks.window = d->window;
    blocks.softcap = d->softcap;
    blocks.rects = &some;
    if (what && cpi_kernel_args_supported(p->ctx, f, &blocks) != CP_SUCCESS)
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: %s needs kernels with windows, softcaps and rectangles, which the %s backend "
                         "does not have yet",
                         f, what, device);
    cp_kernel_attn_args fp8 = CP_KERNEL_ATTN_ARGS_INIT;
    fp8.dtype = d->dtype;
    if (cpi_kernel_args_supported(p->ctx, f, &fp8) != CP_SUCCESS)
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: desc->dtype = CP_DTYPE_FP8_E4M3 needs kernels with FP8 inputs and their descales, "
                         "which the %s backend does not have yet",
                         f, device);
    if (d->dtype == CP_DTYPE_FP8_E4M3) {
        /* A backend that knows the fields may still refuse FP8 (or this
         * shape of it): ask it now, not in the first forward. */
        fp8.o_dtype = CP_DTYPE_F32;
        fp8.batch = 1;
        fp8.num_heads = d->num_heads;
        fp8.num_kv_heads = d->num_kv_heads;
        fp8.head_dim = d->head_dim;
        fp8.head_dim_v = d->head_dim_v;
        fp8.seq_q = fp8.seq_k = 1;
        fp8.mask = d->mask;
        fp8.softmax_scale = d->softmax_scale;
        fp8.window = d->window;
        fp8.softcap = d->softcap;
        fp8.rects = what ? &some : NULL;
        fp8.num_rects = 0;
        size_t bytes;
        if (p->ctx->ops->attn_workspace_size(p->ctx->state, &fp8, 0, &bytes) == CP_ERROR_UNSUPPORTED)
            return CP_ERROR_UNSUPPORTED; /* the backend's message names what */
    }
    if (d->sinks && p->ctx->device != CP_DEVICE_CPU && !CP_BACKEND_HAS(p->ctx->ops, row_dot))
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: desc->sinks = 1 needs the %s backend's row_dot (its gradient's rowsums), which this "
                         "backend does not have",
                         f, p->ctx->ops->name ? p->ctx->ops->name : device);
    return CP_SUCCESS;
}

/* Sub-group sizes and head slices of the mode on a group of P ranks. */
static cp_status check_mode(cp_attn_plan *p)
{
    static const char *f = "cp_attn_plan_create";
    const cp_attn_desc *d = &p->desc;
    switch (d->mode) {
    case CP_MODE_ALL_GATHER:
    case CP_MODE_P2P: p->a2a_size = 1; break;
    case CP_MODE_A2A: p->a2a_size = p->cp_size; break;
    case CP_MODE_A2A_P2P: p->a2a_size = p->group->cfg.a2a_size; break;
    }
    p->ring_size = p->cp_size / p->a2a_size;
    if (p->a2a_size > 1) {
        if (d->num_heads % p->a2a_size)
            return cpi_error(CP_ERROR_UNSUPPORTED,
                             "%s: mode %s needs num_heads = %d divisible by the a2a size %d", f,
                             mode_name(d->mode), d->num_heads, p->a2a_size);
        if (d->num_kv_heads % p->a2a_size && p->a2a_size % d->num_kv_heads)
            return cpi_error(CP_ERROR_UNSUPPORTED,
                             "%s: mode %s: num_kv_heads = %d neither divisible by the a2a size %d nor "
                             "dividing it (kv heads cannot be split or replicated)",
                             f, mode_name(d->mode), d->num_kv_heads, p->a2a_size);
    }
    p->heads.hq = d->num_heads / p->a2a_size;
    p->heads.hkv = d->num_kv_heads >= p->a2a_size ? d->num_kv_heads / p->a2a_size : 1;
    if (d->layout == CP_LAYOUT_PACKED) {
        CPI_CHECK(d->seq_len % p->cp_size == 0,
                  "%s: desc->seq_len = %lld with CP_LAYOUT_PACKED must be a multiple of the CP size %d", f,
                  (long long)d->seq_len, p->cp_size);
    } else {
        CPI_TRY(cpi_layout_check(f, d->layout, p->cp_size, p->rank, d->seq_len));
    }
    return check_backend(p);
}

/* Collective: every rank learns whether all ranks passed the same
 * descriptor (as filled in: head_dim_v 0 and head_dim agree), and whether
 * any rank rejected its own. The group's size and a2a size were agreed on
 * when it was made. */
static cp_status agree(cp_group *g, const cp_attn_plan *p, cp_status local)
{
    static const cp_attn_desc none;
    const cp_attn_desc *d = local == CP_SUCCESS ? &p->desc : &none;
    uint64_t scale, softcap;
    memcpy(&scale, &d->softmax_scale, sizeof scale);
    memcpy(&softcap, &d->softcap, sizeof softcap);
    const cpi_agree_field fields[] = {
        { "desc->dtype", (uint64_t)d->dtype, false },
        { "desc->format", (uint64_t)d->format, false },
        { "desc->batch", (uint64_t)d->batch, false },
        { "desc->seq_len", (uint64_t)d->seq_len, false },
        { "desc->num_heads", (uint64_t)d->num_heads, false },
        { "desc->num_kv_heads", (uint64_t)d->num_kv_heads, false },
        { "desc->head_dim", (uint64_t)d->head_dim, false },
        { "desc->head_dim_v", (uint64_t)d->head_dim_v, false },
        { "desc->mask", (uint64_t)d->mask, false },
        { "desc->softmax_scale", scale, true },
        { "desc->layout", (uint64_t)d->layout, false },
        { "desc->mode", (uint64_t)d->mode, false },
        { "desc->window", (uint64_t)d->window, false },
        { "desc->softcap", softcap, true },
        { "desc->sinks", (uint64_t)d->sinks, false },
    };
    const cpi_agree_call call = { .func = "cp_attn_plan_create",
                                  .ctx = g->ctx,
                                  .comm = g->comm,
                                  .timeout_ms = g->cfg.timeout_ms,
                                  .fields = fields,
                                  .nfields = (int)(sizeof fields / sizeof fields[0]),
                                  .what = "descriptors" };
    cpi_agreement ag;
    return cpi_agree_open(&ag, &call, local);
}

/* The spans of cp rank r in its local order: the pack's runs, or the
 * layout's spans in buf (a packed plan without a pack sizes its workspace
 * with contiguous spans: every pack holds as many tokens per rank). */
static int rank_spans(const cp_attn_plan *p, const cp_pack *pk, int r, cpi_span buf[CPI_MAX_SPANS],
                      const cpi_span **out)
{
    if (pk)
        return cpi_pack_runs(pk, r, out);
    const cp_layout l = p->desc.layout == CP_LAYOUT_PACKED ? CP_LAYOUT_CONTIGUOUS : p->desc.layout;
    *out = buf;
    return cpi_layout_spans(l, p->cp_size, r, p->desc.seq_len, buf);
}

static void free_token_sets(cp_attn_plan *p)
{
    for (int m = 0; p->sub && m < p->ring_size; m++)
        cpi_tokset_free(&p->sub[m]);
    for (int j = 0; p->members && j < p->a2a_size; j++)
        cpi_tokset_free(&p->members[j]);
    free(p->sub);
    free(p->members);
    free(p->drow_ready);
    cpi_tokset_free(&p->mine);
    cpi_tokset_free(&p->gathered);
    p->sub = NULL;
    p->members = NULL;
    p->drow_ready = NULL;
}

static cp_status build_token_sets(cp_attn_plan *p, const cp_pack *pk)
{
    free_token_sets(p);
    p->sub = cpi_calloc((size_t)p->ring_size, sizeof *p->sub);
    p->members = cpi_calloc((size_t)p->a2a_size, sizeof *p->members);
    if (!p->sub || !p->members)
        return CP_ERROR_OUT_OF_MEMORY;
    cpi_span buf[CPI_MAX_SPANS];
    const cpi_span *sp;
    int most = 0; /* spans of the largest sub-group */
    for (int m = 0; m < p->ring_size; m++) {
        int n = 0;
        for (int r = m * p->a2a_size; r < (m + 1) * p->a2a_size; r++)
            n += rank_spans(p, pk, r, buf, &sp);
        most = n > most ? n : most;
    }
    cpi_span *all = cpi_calloc((size_t)(most > 0 ? most : 1), sizeof *all);
    if (!all)
        return CP_ERROR_OUT_OF_MEMORY;
    cp_status s = CP_SUCCESS;
    for (int m = 0; m < p->ring_size && s == CP_SUCCESS; m++) {
        if (pk && p->a2a_size == 1) {
            /* a ring member's (or gathered) block is the rank's own buffer, in
             * the pack's local order, which need not follow the row */
            const int k = rank_spans(p, pk, m, buf, &sp);
            s = cpi_tokset_local(sp, k, &p->sub[m]);
            continue;
        }
        int n = 0;
        for (int r = m * p->a2a_size; r < (m + 1) * p->a2a_size; r++) {
            const int k = rank_spans(p, pk, r, buf, &sp);
            memcpy(all + n, sp, (size_t)k * sizeof *sp);
            n += k;
        }
        s = cpi_tokset_sorted(all, n, &p->sub[m]);
    }
    free(all);
    CPI_TRY(s);
    for (int j = 0; j < p->a2a_size; j++) {
        const int n = rank_spans(p, pk, p->ring_rank * p->a2a_size + j, buf, &sp);
        CPI_TRY(cpi_tokset_local(sp, n, &p->members[j]));
    }
    /* my own tokens in local order (what the caller's tensors hold) */
    const int n = rank_spans(p, pk, p->rank, buf, &sp);
    CPI_TRY(cpi_tokset_local(sp, n, &p->mine));
    if (p->desc.mode == CP_MODE_ALL_GATHER) {
        int total = 0;
        for (int r = 0; r < p->cp_size; r++)
            total += p->sub[r].nspans;
        CPI_TRY(cpi_tokset_alloc(&p->gathered, total));
        for (int r = 0; r < p->cp_size; r++)
            for (int i = 0; i < p->sub[r].nspans; i++) {
                p->gathered.span[p->gathered.nspans] = p->sub[r].span[i];
                p->gathered.row[p->gathered.nspans++] = (int64_t)r * p->s_loc + p->sub[r].row[i];
            }
        p->gathered.ntok = (int64_t)p->cp_size * p->s_loc;
    }
    /* cpi_attend may put a whole token set in one kernel call */
    p->max_rows = p->mine.ntok;
    int spans = p->mine.nspans;
    for (int m = 0; m < p->ring_size; m++) {
        if (p->sub[m].ntok > p->max_rows)
            p->max_rows = p->sub[m].ntok;
        if (p->sub[m].nspans > spans)
            spans = p->sub[m].nspans;
    }
    /* Kept with the plan, not allocated per call: nothing of a call may
     * stay on the heap while it waits in the transport, where a rank can
     * be lost for good. */
    p->drow_ready = cpi_calloc((size_t)spans, 1);
    if (!p->drow_ready)
        return CP_ERROR_OUT_OF_MEMORY;
    p->vis.cu = pk ? pk->cu : p->one_doc;
    p->vis.ndocs = pk ? pk->num_seqs : 1;
    p->bound = pk ? pk->id : 0;
    p->ring_fwd_dir = 1;
    p->ring_fwd_dir = cpi_ring_plan_fwd_dir(p);
    return CP_SUCCESS;
}

cp_status cpi_plan_bind(cp_attn_plan *p, const cp_pack *pk)
{
    if ((pk ? pk->id : 0) == p->bound && p->sub)
        return CP_SUCCESS;
    cp_status s = build_token_sets(p, pk);
    if (s != CP_SUCCESS) {
        free_token_sets(p); /* the next call builds them again */
        p->bound = UINT64_MAX;
    }
    return s;
}

/* One call of a mode: a forward's arguments or a backward's (the other
 * NULL). */
typedef struct mode_call {
    const cpi_fwd_args *fwd;
    const cpi_bwd_args *bwd;
} mode_call;

static cp_status run_mode(cp_attn_plan *p, const mode_call *c, cpi_arena *ws)
{
    const mode_entry *m = &modes[p->desc.mode];
    return c->bwd ? m->backward(p, c->bwd, ws) : m->forward(p, c->fwd, ws);
}

static cp_status measure(cp_attn_plan *p, int backward, size_t *bytes)
{
    cpi_arena a = { NULL, 0, 0, 1, 0 };
    const cpi_fwd_args fa = { 0 };
    const cpi_bwd_args ba = { 0 };
    const mode_call c = backward ? (mode_call){ .bwd = &ba } : (mode_call){ .fwd = &fa };
    cp_status s = run_mode(p, &c, &a);
    if (s != CP_SUCCESS) { /* the backend's scratch query names itself: say what it was part of */
        char why[400];
        snprintf(why, sizeof why, "%s", cp_last_error());
        return cpi_error(s, "cp_attn_plan_create: sizing the %s workspace: %s", backward ? "backward" : "forward",
                         why);
    }
    /* Each buffer fits (check_desc), but their sum may not. */
    CPI_CHECK(!a.overflow,
              "cp_attn_plan_create: the %s workspace of batch %lld x seq_len %lld x heads %d x head_dim %d/%d "
              "(mode %s) overflows size_t",
              backward ? "backward" : "forward", (long long)p->desc.batch, (long long)p->desc.seq_len,
              p->desc.num_heads, p->desc.head_dim, p->desc.head_dim_v, mode_name(p->desc.mode));
    *bytes = a.used;
    /* a device backward with sinks reuses the workspace for their rowsums */
    if (backward && cpi_sinks_grad_bytes(p) > *bytes)
        *bytes = cpi_sinks_grad_bytes(p);
    return CP_SUCCESS;
}

static void plan_free(cp_attn_plan *p)
{
    if (!p)
        return;
    free_token_sets(p);
    if (p->own_ws)
        p->ctx->ops->free(p->ctx->state, p->own_ws);
    if (p->neg_inf)
        p->ctx->ops->free(p->ctx->state, p->neg_inf);
    free(p);
}

CP_EXPORT cp_status cp_attn_plan_create(cp_group *g, const cp_attn_desc *desc, cp_attn_plan **out)
{
    if (out)
        *out = NULL;
    CPI_CHECK_PTR(g);
    cp_attn_plan *p = cpi_calloc(1, sizeof *p);
    cp_status s = CP_SUCCESS;
    if (!out)
        s = cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: out is NULL", __func__);
    else if (!desc)
        s = cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: desc is NULL", __func__);
    else if (!p)
        s = CP_ERROR_OUT_OF_MEMORY;
    if (s == CP_SUCCESS) {
        p->group = g;
        p->ctx = g->ctx;
        p->cp_size = g->size;
        p->rank = g->rank;
        static const cp_attn_desc defaults = CP_ATTN_DESC_INIT;
        s = cpi_copy_config(&p->desc, sizeof p->desc, &defaults, desc, DESC_V1_SIZE, __func__, "desc");
    }
    if (s == CP_SUCCESS)
        s = check_desc(&p->desc);
    if (s == CP_SUCCESS) {
        if (p->desc.head_dim_v == 0)
            p->desc.head_dim_v = p->desc.head_dim;
        if (p->desc.softmax_scale == 0.0)
            p->desc.softmax_scale = 1.0 / sqrt((double)p->desc.head_dim);
        /* the kernels' bounds: a plan must not accept what its blocks refuse */
        if (!cpi_softcap_ok(p->desc.softmax_scale, p->desc.softcap))
            s = cpi_error(CP_ERROR_INVALID_ARGUMENT,
                          "cp_attn_plan_create: desc->softcap = %g (with softmax_scale %g: must be 0, or > 0 "
                          "with softcap and |scale| / softcap at most %.17g)",
                          p->desc.softcap, p->desc.softmax_scale, CPI_SOFTMAX_SCALE_MAX);
        else if (p->desc.window > CPI_RECT_POS_MAX)
            s = cpi_error(CP_ERROR_INVALID_ARGUMENT, "cp_attn_plan_create: desc->window = %lld (at most %lld)",
                          (long long)p->desc.window, (long long)CPI_RECT_POS_MAX);
        else
            s = check_mode(p);
    }
    /* Every rank takes part in the agreement, also one whose arguments are
     * bad, so that the others fail fast instead of waiting for it. */
    s = agree(g, p, s);
    if (s == CP_SUCCESS) {
        p->s_loc = p->desc.seq_len / p->cp_size;
        p->ring_rank = p->rank / p->a2a_size;
        p->a2a_comm = p->a2a_size == 1 ? NULL : p->a2a_size == p->cp_size ? g->comm : g->a2a;
        p->ring_comm = p->ring_size == 1 ? NULL : p->ring_size == p->cp_size ? g->comm : g->p2p;
        p->rects = p->desc.window || p->desc.softcap != 0 || p->desc.layout == CP_LAYOUT_PACKED;
        p->one_doc[1] = p->desc.seq_len;
        p->vis = (cpi_vis){ .causal = p->desc.mask == CP_MASK_CAUSAL, .window = p->desc.window };
        s = build_token_sets(p, NULL);
    }
    if (s == CP_SUCCESS)
        s = measure(p, 0, &p->ws_fwd);
    /* an FP8 plan is forward only: its backward needs no workspace */
    if (s == CP_SUCCESS && p->desc.dtype != CP_DTYPE_FP8_E4M3)
        s = measure(p, 1, &p->ws_bwd);
    if (s == CP_SUCCESS)
        s = cpi_plan_neg_inf_row(p);
    if (s != CP_SUCCESS) {
        plan_free(p);
        return s;
    }
    *out = p;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_attn_workspace_size(const cp_attn_plan *p, size_t *forward, size_t *backward)
{
    CPI_CHECK_PTR(p);
    CPI_CHECK(forward || backward, "%s: forward and backward are both NULL", __func__);
    if (forward)
        *forward = p->ws_fwd;
    if (backward)
        *backward = p->ws_bwd;
    return CP_SUCCESS;
}

/* A tensor the caller hands forward or backward: it is read or written as
 * an array of the plan's dtype (the LSE of floats), so it must be aligned
 * to its elements. */
typedef struct tensor_arg {
    const char *name;
    const void *ptr;
    size_t align;
} tensor_arg;

static cp_status check_tensors(const char *func, const tensor_arg *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        CPI_CHECK(t[i].ptr != NULL, "%s: %s is NULL", func, t[i].name);
        CPI_CHECK((uintptr_t)t[i].ptr % t[i].align == 0, "%s: %s = %p is not aligned to its %zu-byte elements",
                  func, t[i].name, t[i].ptr, t[i].align);
    }
    return CP_SUCCESS;
}

/* The workspace is carved into tensors at 256-byte offsets from its start;
 * 16 bytes is what malloc and cudaMalloc give at least, and enough for the
 * vector loads of every backend. */
#define WORKSPACE_ALIGN 16

static cp_status workspace(cp_attn_plan *p, void *ws, size_t bytes, size_t need, const char *func,
                           cpi_arena *a)
{
    CPI_CHECK((uintptr_t)ws % WORKSPACE_ALIGN == 0, "%s: workspace = %p is not aligned to %d bytes", func, ws,
              WORKSPACE_ALIGN);
    if (!ws) {
        /* As much as this call needs: a plan used only forward (inference,
         * activation recomputation) never holds the backward's larger
         * workspace (2.5x at S = 32k). The first backward grows it; free
         * waits for the work queued on it. */
        if (p->own_ws_bytes < need) {
            if (p->own_ws)
                p->ctx->ops->free(p->ctx->state, p->own_ws);
            p->own_ws = NULL;
            p->own_ws_bytes = 0;
            CPI_TRY(p->ctx->ops->alloc(p->ctx->state, need, &p->own_ws));
            p->own_ws_bytes = need;
        }
        ws = p->own_ws;
        bytes = p->own_ws_bytes;
    }
    CPI_CHECK(bytes >= need, "%s: workspace_bytes = %zu (the plan needs %zu; see cp_attn_workspace_size)", func,
              bytes, need);
    *a = (cpi_arena){ ws, 0, bytes, 0, 0 };
    return CP_SUCCESS;
}

/* The communicators a call of p exchanges on, in the order of their first
 * use: the hybrid's a2a comes before its ring. */
static int first_exchanges(const cp_attn_plan *p, cp_comm **first)
{
    int n = 0;
    if (p->desc.mode == CP_MODE_ALL_GATHER) {
        first[n++] = p->group->comm;
        return n;
    }
    if (p->a2a_comm)
        first[n++] = p->a2a_comm;
    if (p->ring_comm)
        first[n++] = p->ring_comm;
    return n;
}

/* A forward or backward with this rank's verdict on its arguments: every
 * rank takes part in the agreement, so that a bad argument on one rank
 * fails them all at once, and the same exchanges happen everywhere. With a
 * pack the ranks also compare their packs, which takes a vote. */
static cp_status run_call(cp_attn_plan *p, const char *func, cp_status local, const mode_call *mc,
                          cpi_arena *ws, const cp_pack *pk)
{
    cpi_agree_call call = { .func = func, .ctx = p->ctx, .comm = p->group->comm, .timeout_ms = p->group->cfg.timeout_ms,
                            .stream_only = true };
    cpi_agreement ag;
    if (local == CP_SUCCESS)
        local = cpi_plan_bind(p, pk);
    if (p->desc.layout == CP_LAYOUT_PACKED) {
        const cpi_agree_field fields[] = { { "x->pack", local == CP_SUCCESS ? pk->hash : 0, false } };
        call.fields = fields;
        call.nfields = 1;
        call.what = "packs";
        CPI_TRY(cpi_agree_open(&ag, &call, local));
        return run_mode(p, mc, ws);
    }
    call.nfirst = first_exchanges(p, call.first);
    CPI_TRY(cpi_agree_open(&ag, &call, local));
    return cpi_agree_close(&ag, run_mode(p, mc, ws));
}

/* The first published cp_attn_args (API 1.1): everything up to workspace_bytes. */
#define ARGS_V11_SIZE (offsetof(cp_attn_args, workspace_bytes) + sizeof(size_t))

/* The API 1.1 and 1.2 arguments against the plan; x receives them filled in. */
static cp_status check_args(const cp_attn_plan *p, const char *func, const cp_attn_args *user, int backward,
                            cp_attn_args *x)
{
    static const cp_attn_args defaults = CP_ATTN_ARGS_INIT;
    *x = defaults;
    if (user)
        CPI_TRY(cpi_copy_config(x, sizeof *x, &defaults, user, ARGS_V11_SIZE, func, "x"));
    const cp_attn_desc *d = &p->desc;
    if (backward && d->dtype == CP_DTYPE_FP8_E4M3)
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: the plan's desc->dtype = CP_DTYPE_FP8_E4M3: FP8 plans are forward only (API 1.2); "
                         "a backward needs a plan of CP_DTYPE_F32, CP_DTYPE_F16 or CP_DTYPE_BF16",
                         func);
    CPI_TRY(cpi_check_descales(func, "x", "the plan's desc->dtype", d->dtype, x->q_descale, x->k_descale,
                               x->v_descale, x->descale_per_head));
    const cp_pack *pk = x->pack;
    /* the 1.0 calls take neither a pack nor sinks */
    const bool v10 = !strcmp(func, "cp_attn_forward") || !strcmp(func, "cp_attn_backward");
    CPI_CHECK(!v10 || (d->layout != CP_LAYOUT_PACKED && !d->sinks),
              "%s: the plan has %s: call %s_ex with cp_attn_args", func,
              d->layout == CP_LAYOUT_PACKED ? "layout CP_LAYOUT_PACKED (it needs a pack)" : "desc->sinks = 1",
              func);
    if (d->layout == CP_LAYOUT_PACKED) {
        CPI_CHECK(pk, "%s: x->pack is NULL (the plan's layout is CP_LAYOUT_PACKED)", func);
        CPI_CHECK(pk->cp_size == p->cp_size, "%s: x->pack was made for cp_size %d, the plan's group has %d ranks",
                  func, pk->cp_size, p->cp_size);
        CPI_CHECK(pk->T == d->seq_len, "%s: x->pack holds %lld tokens, the plan's seq_len is %lld", func,
                  (long long)pk->T, (long long)d->seq_len);
    } else {
        CPI_CHECK(!pk, "%s: x->pack is set but the plan's layout is %d, not CP_LAYOUT_PACKED", func, (int)d->layout);
    }
    if (d->sinks) {
        CPI_CHECK(x->sinks, "%s: x->sinks is NULL (the plan has desc->sinks = 1)", func);
        CPI_CHECK((uintptr_t)x->sinks % sizeof(float) == 0, "%s: x->sinks = %p is not aligned to 4 bytes", func,
                  (const void *)x->sinks);
        CPI_CHECK(!backward || x->dsinks, "%s: x->dsinks is NULL (the plan has desc->sinks = 1)", func);
        CPI_CHECK(!backward || (uintptr_t)x->dsinks % sizeof(float) == 0,
                  "%s: x->dsinks = %p is not aligned to 4 bytes", func, (void *)x->dsinks);
    } else {
        CPI_CHECK(!x->sinks, "%s: x->sinks is set but the plan has desc->sinks = 0", func);
        CPI_CHECK(!x->dsinks, "%s: x->dsinks is set but the plan has desc->sinks = 0", func);
    }
    return CP_SUCCESS;
}

static cp_status forward(cp_attn_plan *p, const char *func, const void *q, const void *k, const void *v, void *out,
                         float *lse, const cp_attn_args *user)
{
    const size_t es = cpi_dtype_size(p->desc.dtype), os = cpi_dtype_size(cpi_plan_out_dtype(p));
    const tensor_arg t[] = { { "q", q, es }, { "k", k, es }, { "v", v, es }, { "out", out, os },
                             { "lse", lse, sizeof(float) } };
    cpi_arena a;
    cp_attn_args x;
    cp_status local = check_args(p, func, user, 0, &x);
    if (local == CP_SUCCESS)
        local = check_tensors(func, t, sizeof t / sizeof t[0]);
    if (local == CP_SUCCESS)
        local = workspace(p, x.workspace, x.workspace_bytes, p->ws_fwd, func, &a);
    const cpi_fwd_args args = { q, k, v, out, lse, x.sinks,
                                { x.q_descale, x.k_descale, x.v_descale, x.descale_per_head } };
    return run_call(p, func, local, &(mode_call){ .fwd = &args }, &a, local == CP_SUCCESS ? x.pack : NULL);
}

static cp_status backward(cp_attn_plan *p, const char *func, const void *q, const void *k, const void *v,
                          const void *out, const float *lse, const void *dout, void *dq, void *dk, void *dv,
                          const cp_attn_args *user)
{
    const size_t es = cpi_dtype_size(p->desc.dtype);
    const tensor_arg t[] = { { "q", q, es },     { "k", k, es },   { "v", v, es },
                             { "out", out, es }, { "lse", lse, sizeof(float) }, { "dout", dout, es },
                             { "dq", dq, es },   { "dk", dk, es }, { "dv", dv, es } };
    cpi_arena a;
    cp_attn_args x;
    cp_status local = check_args(p, func, user, 1, &x);
    if (local == CP_SUCCESS)
        local = check_tensors(func, t, sizeof t / sizeof t[0]);
    if (local == CP_SUCCESS)
        local = workspace(p, x.workspace, x.workspace_bytes, p->ws_bwd, func, &a);
    const cpi_bwd_args args = { q, k, v, out, dout, lse, dq, dk, dv };
    CPI_TRY(run_call(p, func, local, &(mode_call){ .bwd = &args }, &a, local == CP_SUCCESS ? x.pack : NULL));
    /* the sinks' gradient needs only this rank's rows (on a device, the
     * workspace is free again for their rowsums: the mode's work is queued) */
    return p->desc.sinks ? cpi_sinks_grad(p, out, dout, lse, x.sinks, x.dsinks, a.base, a.cap) : CP_SUCCESS;
}

CP_EXPORT cp_status cp_attn_forward(cp_attn_plan *p, const void *q, const void *k, const void *v, void *out,
                                    float *lse, void *workspace_ptr, size_t workspace_bytes)
{
    CPI_CHECK_PTR(p);
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    x.workspace = workspace_ptr;
    x.workspace_bytes = workspace_bytes;
    return forward(p, __func__, q, k, v, out, lse, &x);
}

CP_EXPORT cp_status cp_attn_backward(cp_attn_plan *p, const void *q, const void *k, const void *v,
                                     const void *out, const float *lse, const void *dout, void *dq, void *dk,
                                     void *dv, void *workspace_ptr, size_t workspace_bytes)
{
    CPI_CHECK_PTR(p);
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    x.workspace = workspace_ptr;
    x.workspace_bytes = workspace_bytes;
    return backward(p, __func__, q, k, v, out, lse, dout, dq, dk, dv, &x);
}

CP_EXPORT cp_status cp_attn_forward_ex(cp_attn_plan *p, const void *q, const void *k, const void *v, void *out,
                                       float *lse, const cp_attn_args *x)
{
    CPI_CHECK_PTR(p);
    return forward(p, __func__, q, k, v, out, lse, x);
}

CP_EXPORT cp_status cp_attn_backward_ex(cp_attn_plan *p, const void *q, const void *k, const void *v,
                                        const void *out, const float *lse, const void *dout, void *dq, void *dk,
                                        void *dv, const cp_attn_args *x)
{
    CPI_CHECK_PTR(p);
    return backward(p, __func__, q, k, v, out, lse, dout, dq, dk, dv, x);
}

CP_EXPORT void cp_attn_plan_destroy(cp_attn_plan *p)
{
    plan_free(p);
}

