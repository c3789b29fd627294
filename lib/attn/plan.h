/* SPDX-License-Identifier: MIT */
/* CP attention internals: the plan, and the steps the four modes are
 * built from (attention of span pairs, the a2a exchange, the modes' entry
 * points). Tensor views are in tensor.h, token sets in tokset.h, the ring
 * in ring.h. */
#ifndef INFINICP_ATTN_PLAN_H
#define INFINICP_ATTN_PLAN_H

#include "attn/tensor.h"
#include "attn/tokset.h"
#include "attn/vis.h"
#include "comm/group.h"

/* Head slices of an a2a exchange: member j of the a2a sub-group owns query
 * heads [j*hq, (j+1)*hq) and kv heads [kv_first(j), +hkv). */
typedef struct cpi_heads {
    int32_t hq;  /* query heads per member */
    int32_t hkv; /* kv heads per member (1 when kv heads are replicated) */
} cpi_heads;

/*
 * The CP group of cp_size ranks is a2a_size x ring_size: a2a sub-groups of
 * a2a_size consecutive cp ranks, and a ring across the sub-groups. Every
 * mode is one shape of it: all_gather and p2p have sub-groups of one rank
 * (so sub[r] holds rank r's tokens), a2a one sub-group of all ranks (a ring
 * of one member).
 */
struct cp_attn_plan {
    cp_group *group;
    cp_context *ctx;
    cp_attn_desc desc;   /* validated; head_dim_v and softmax_scale filled */
    int cp_size;         /* ranks in the CP group */
    int rank;            /* in the CP group */
    int a2a_size;        /* a2a sub-group size (1 for all_gather / p2p, cp_size for a2a) */
    int ring_size;       /* ring members = cp_size / a2a_size (1 for a2a) */
    cp_comm *a2a_comm;   /* size a2a_size; NULL when a2a_size == 1 */
    cp_comm *ring_comm;  /* size ring_size; NULL when ring_size == 1 */
    int ring_rank;       /* my index in the ring (= rank / a2a_size) */
    int64_t s_loc;       /* tokens per rank */
    cpi_tokset mine;     /* my tokens (spans in local order) */
    cpi_tokset *sub;     /* token set of every ring member's a2a sub-group, sorted, coalesced */
    cpi_heads heads;     /* after the a2a exchange */
    int64_t max_rows;    /* rows of the largest token set (kernel scratch) */
    unsigned char *drow_ready; /* backward: cpi_attend_io.drow_ready, one flag per span of the largest token set */
    /* API 1.1. With a window, a softcap or a packed layout every attention
     * goes through rectangles (vis.h) in one kernel call per token-set
     * pair; the token sets of a packed layout come from the pack of the
     * call (cpi_plan_bind), those of the others from the layout. */
    bool rects;          /* attend through rectangles */
    cpi_vis vis;         /* the mask, window and documents */
    int64_t one_doc[2];  /* {0, seq_len}: a non-packed sequence is one document */
    cpi_tokset *members; /* a2a_size: the tokens of my sub-group's members, each in its local order */
    cpi_tokset gathered; /* all_gather: every rank's tokens, rank after rank, as the gathered buffer holds them */
    uint64_t bound;      /* id of the pack the token sets were built for; 0: the layout's */
    int ring_fwd_dir;    /* cpi_ring.fwd_dir of the forward ring, chosen for these token sets */
    size_t ws_fwd, ws_bwd;
    void *own_ws;        /* allocated on demand when the caller passes none */
    size_t own_ws_bytes;
    float *neg_inf;      /* device contexts: a row of -inf for LSE resets (cpi_plan_neg_inf_row) */
};

/* The type of a plan's out (and of its a2a exchange of it): the storage
 * type, or BF16 after FP8 inputs (API 1.2). */
static inline cp_dtype cpi_plan_out_dtype(const cp_attn_plan *p)
{
    return p->desc.dtype == CP_DTYPE_FP8_E4M3 ? CP_DTYPE_BF16 : p->desc.dtype;
}

/* Attention of the query rows of tokset tq (tensor q, rows as in tq) against
 * the key rows of tokset tk (tensors k, v): every span pair that causality
 * does not hide (span_pairs.c). Forward merges into (o32, lse); backward
 * accumulates into dq32 and dk32 / dv32 (F32). */
typedef struct cpi_attend_io {
    const cpi_tensor *q, *k, *v;
    const cpi_tokset *tq, *tk;
    /* forward */
    const cpi_tensor *o32;
    const cpi_lse *lse;
    cpi_descale descale; /* FP8: of q's and k's first heads */
    /* backward */
    const cpi_tensor *o, *dout, *dq32, *dk32, *dv32;
    /* Direct (only where cpi_attend_single says the block is one call):
     * the forward stores the final output in out (its dtype) and the LSE
     * instead of merging into o32 (NULL then); the backward stores the
     * final gradients in dq_out, dk_out, dv_out (their dtype) instead of
     * adding into the fp32 sums. Saves clearing, merging into and
     * converting the fp32 buffers when nothing else adds to them. */
    const cpi_tensor *out, *dq_out, *dk_out, *dv_out;
    /* backward, optional: rowsum(dO * O) of tq's rows, laid out like lse,
     * and one flag per span of tq, set once a call has stored its rows
     * there (later calls over those rows read them instead). Shared by the
     * calls of one backward, whose query set does not change. */
    float *drow;
    unsigned char *drow_ready;
    void *scratch;
    size_t scratch_bytes;
} cpi_attend_io;
cp_status cpi_attend(const cp_attn_plan *p, const cpi_attend_io *io, int backward);
/* *one = whether cpi_attend over tq x tk makes exactly one kernel call
 * (a block with no visible pair makes none). */
cp_status cpi_attend_single(const cp_attn_plan *p, const cpi_tokset *tq, const cpi_tokset *tk, int *one);
/* Largest kernel scratch any cpi_attend call of this plan needs; direct:
 * of a direct call (cpi_attend_io.out, dq_out...), which the workspace is
 * not sized for: such a call runs only where this is no more. */
cp_status cpi_attend_scratch(const cp_attn_plan *p, int64_t max_q, int64_t max_k, int32_t hq, int32_t hkv,
                             int backward, int direct, size_t *bytes);

/* Build the token sets of a call with pack pk (NULL: the layout's); a no-op
 * when they are those already. */
cp_status cpi_plan_bind(cp_attn_plan *p, const cp_pack *pk);

/* Sinks (sinks.c). Forward: merge the sink of heads [h0, h0 + o32->heads)
 * into the final (o32, lse) of a mode, as a block of no value and LSE
 * sink[h]; on a device through the backend's merge, with the scratch that
 * cpi_sinks_take took from the mode's arena (none on the CPU). Backward:
 * dsinks[h] = -sum over my rows of exp(sink[h] - lse) rowsum(dout * out);
 * on a device the rowsums come from the backend's row_dot into `ws`
 * (cpi_sinks_grad_bytes of it, free once the mode's work is queued), and
 * the sum is taken on the host after one wait. */
typedef struct cpi_sinks_scratch {
    float *lse_part; /* [batch][heads][ntok]: sink[h0 + h] in every row */
    float *zero;     /* one row of heads x head_dim_v zeros: the sink's output */
} cpi_sinks_scratch;
cpi_sinks_scratch cpi_sinks_take(const cp_attn_plan *p, cpi_arena *ws, int64_t ntok, int32_t heads);
cp_status cpi_sinks_merge(const cp_attn_plan *p, const cpi_tensor *o32, const cpi_lse *lse, int32_t h0,
                          const float *sinks, const cpi_sinks_scratch *sc);
size_t cpi_sinks_grad_bytes(const cp_attn_plan *p);
cp_status cpi_sinks_grad(const cp_attn_plan *p, const void *out, const void *dout, const float *lse,
                         const float *sinks, float *dsinks, void *ws, size_t ws_bytes);

/* The modes' entry points, the caller's tensors as they came. `ws` is the
 * caller's workspace (size checked); while ws->measuring they only count
 * the workspace, and the tensors may be NULL. */
typedef struct cpi_fwd_args {
    const void *q, *k, *v;
    void *out;
    float *lse;
    const float *sinks; /* desc.sinks: [num_heads] */
    cpi_descale descale; /* FP8 plans: of all heads (GLOBAL head indices) */
} cpi_fwd_args;
typedef struct cpi_bwd_args {
    const void *q, *k, *v, *out, *dout;
    const float *lse;
    void *dq, *dk, *dv;
} cpi_bwd_args;

cp_status cpi_all_gather_forward(cp_attn_plan *p, const cpi_fwd_args *a, cpi_arena *ws);
cp_status cpi_all_gather_backward(cp_attn_plan *p, const cpi_bwd_args *a, cpi_arena *ws);
/* p2p, a2a and a2a_p2p share one path (a2a_p2p.c): a2a exchange inside the
 * sub-groups, the ring across them, a2a back. */
cp_status cpi_a2a_p2p_forward(cp_attn_plan *p, const cpi_fwd_args *a, cpi_arena *ws);
cp_status cpi_a2a_p2p_backward(cp_attn_plan *p, const cpi_bwd_args *a, cpi_arena *ws);

/* One a2a exchange (a2a.c): the local side is [s_loc tokens, all heads]
 * (tensor or lse), the head side [T tokens of my sub-group, my head slice]
 * (tensor_h or lse_h). send / recv hold a2a_size blocks of the head side's
 * slice. */
typedef struct cpi_a2a_item {
    const cpi_tensor *tensor;
    const cpi_lse *lse;
    const cpi_tensor *tensor_h;
    const cpi_lse *lse_h;
    int kv; /* slices of kv heads (else query heads) */
} cpi_a2a_item;
size_t cpi_a2a_item_bytes(const cp_attn_plan *p, const cpi_a2a_item *it); /* one block */
/* The first query head (kv = 0) or kv head (kv = 1) of member m's slice. */
int32_t cpi_a2a_head_first(const cp_attn_plan *p, int kv, int member);
/* Whether the item's exchanges use send / recv: not where the transport
 * moves its head slices in place and the blocks are head-side rows. */
int cpi_a2a_item_buffered(const cp_attn_plan *p, const cpi_a2a_item *it);
cp_status cpi_a2a_to_heads(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv);
/* The way back; with sum_replicas, F32 blocks of members sharing a kv head
 * (num_kv_heads < a2a_size) are summed before they are placed. */
cp_status cpi_a2a_to_tokens(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv,
                            int sum_replicas);

#endif
