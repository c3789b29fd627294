/* SPDX-License-Identifier: MIT */
/* CP attention internals: the plan, tensor views in the plan's format,
 * token sets, and the steps the four modes are built from. */
#ifndef INFINICP_ATTN_PLAN_H
#define INFINICP_ATTN_PLAN_H

#include "comm/group.h"
#include "layout/spans.h"

/* A dense tensor [batch, ntok, heads, dim] (BSHD) or [ntok, batch, heads, dim]
 * (SBHD) on the plan's device. The batch size and format are the plan's. */
typedef struct cpi_tensor {
    void *p;
    int64_t ntok;
    int32_t heads, dim;
    cp_dtype dtype;
} cpi_tensor;

/* LSE buffer: float [batch, heads, ntok]. A partial result being merged
 * also has `lo`, the rounding residual of each value (same layout), so that
 * a chain of merges rounds once (see cp_kernel_attn_args.lse_lo). */
typedef struct cpi_lse {
    float *p;
    int64_t ntok;
    int32_t heads;
    float *lo;
} cpi_lse;

/* A set of global token positions stored as rows of a buffer: span i holds
 * tokens [span[i].offset, +len) at rows [row[i], +len). */
typedef struct cpi_tokset {
    int n;
    cpi_span *span;
    int64_t *row;
    int64_t ntok; /* rows in all */
} cpi_tokset;

/* Head slices of an a2a exchange: member j of the a2a sub-group owns query
 * heads [j*hq, (j+1)*hq) and kv heads [kv_first(j), +hkv). */
typedef struct cpi_heads {
    int32_t hq;  /* query heads per member */
    int32_t hkv; /* kv heads per member (1 when kv heads are replicated) */
} cpi_heads;

/* Bytes of workspace a step needs, laid out by a bump allocator. */
typedef struct cpi_arena {
    char *base;
    size_t used, cap;
    int measuring; /* count only: base is NULL */
    int overflow;  /* measuring: the total no longer fits in size_t */
} cpi_arena;

struct cp_attn_plan {
    cp_group *g;
    cp_context *ctx;
    cp_attn_desc d;      /* validated; head_dim_v and softmax_scale filled */
    int P;               /* CP group size */
    int rank;            /* in the CP group */
    int A;               /* a2a sub-group size (1 for all_gather / p2p, P for a2a) */
    int R;               /* ring size = P / A (1 for a2a) */
    cp_comm *a2a_comm;   /* size A; NULL when A == 1 */
    cp_comm *ring_comm;  /* size R; NULL when R == 1 */
    int ring_rank;       /* my index in the ring (= rank / A) */
    int64_t s_loc;       /* tokens per rank */
    cpi_tokset mine;     /* my tokens (spans in local order) */
    cpi_tokset *sub;     /* token set of every ring member's a2a sub-group, sorted, coalesced */
    cpi_heads heads;     /* after the a2a exchange */
    int64_t max_rows;    /* rows of the largest token set (kernel scratch) */
    unsigned char *drow_ready; /* backward: cpi_block_io.drow_ready, one flag per span of the largest token set */
    size_t ws_fwd, ws_bwd;
    void *own_ws;        /* allocated on demand when the caller passes none */
    size_t own_ws_bytes;
};

/* Workspace arena. A total past SIZE_MAX sets `overflow` (only measuring
 * can get there: a real run fits in what was measured). */
void *cpi_arena_take(cpi_arena *a, size_t bytes);

/* Element offset and bytes of tensors and LSE buffers. */
size_t cpi_tensor_bytes(const cp_attn_plan *p, const cpi_tensor *t);
void cpi_tensor_strides(const cp_attn_plan *p, const cpi_tensor *t, int64_t *sb, int64_t *ss, int64_t *sh);
cpi_tensor cpi_tensor_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads, int32_t dim,
                           cp_dtype dtype);
cpi_lse cpi_lse_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads);
/* A caller's tensor: this rank's s_loc tokens, dense. */
cpi_tensor cpi_user_tensor(const cp_attn_plan *p, const void *ptr, int32_t heads, int32_t dim, cp_dtype dtype);
/* Block i of a buffer of consecutive dense [s_loc, like->heads, like->dim]
 * blocks of like->dtype starting at base (gathered or exchanged data). */
cpi_tensor cpi_tensor_block(const cp_attn_plan *p, const cpi_tensor *like, void *base, int i);
/* Give l a residual buffer from the arena (for partial results). */
void cpi_lse_take_lo(const cp_attn_plan *p, cpi_arena *a, cpi_lse *l);

/* Copy rows [src_row, +nrows) x heads [src_head, +nheads) of src into dst at
 * (dst_row, dst_head). Same dtype and dim. */
cp_status cpi_copy_tokens(const cp_attn_plan *p, const cpi_tensor *dst, int64_t dst_row, int32_t dst_head,
                          const cpi_tensor *src, int64_t src_row, int32_t src_head, int64_t nrows,
                          int32_t nheads);
cp_status cpi_copy_lse(const cp_attn_plan *p, const cpi_lse *dst, int64_t dst_row, int32_t dst_head,
                       const cpi_lse *src, int64_t src_row, int32_t src_head, int64_t nrows,
                       int32_t nheads);
/* dst = src converted (whole tensors of equal shape). */
cp_status cpi_convert_tensor(const cp_attn_plan *p, const cpi_tensor *dst, const cpi_tensor *src);
/* O = 0 (F32), LSE = -inf, its residual 0. */
cp_status cpi_init_partial(const cp_attn_plan *p, const cpi_tensor *o32, const cpi_lse *lse);
cp_status cpi_zero(const cp_attn_plan *p, const cpi_tensor *t);

/* Token sets. */
cp_status cpi_tokset_alloc(cpi_tokset *t, int nspans);
void cpi_tokset_free(cpi_tokset *t);
/* The tokens of cp ranks [first, first + count), sorted by position and
 * with adjacent spans merged. */
cp_status cpi_tokset_of_ranks(const cp_attn_plan *p, int first, int count, cpi_tokset *out);
/* Row in t where global position pos lives (pos must be in t). */
int64_t cpi_tokset_row(const cpi_tokset *t, int64_t pos);

/* Attention of the query rows of tokset tq (tensor q, rows as in tq) against
 * the key rows of tokset tk (tensors k, v): every span pair that causality
 * does not hide. Forward merges into (o32, lse); backward accumulates into
 * dq32 and dk32 / dv32 (F32). */
typedef struct cpi_block_io {
    const cpi_tensor *q, *k, *v;
    const cpi_tokset *tq, *tk;
    /* forward */
    const cpi_tensor *o32;
    const cpi_lse *lse;
    /* backward */
    const cpi_tensor *o, *dout, *dq32, *dk32, *dv32;
    /* backward, optional: rowsum(dO * O) of tq's rows, laid out like lse,
     * and one flag per span of tq, set once a call has stored its rows
     * there (later calls over those rows read them instead). Shared by the
     * calls of one backward, whose query set does not change. */
    float *drow;
    unsigned char *drow_ready;
    void *scratch;
    size_t scratch_bytes;
} cpi_block_io;
cp_status cpi_attend(const cp_attn_plan *p, const cpi_block_io *io, int backward);
/* The rowsum buffer of a backward over ntok query rows (see cpi_block_io). */
float *cpi_drow_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads);
/* Largest kernel scratch any cpi_attend call of this plan needs. */
cp_status cpi_attend_scratch(const cp_attn_plan *p, int64_t max_q, int64_t max_k, int32_t hq, int32_t hkv,
                             int backward, size_t *bytes);

/* The modes. `ws` is the caller's workspace (size checked). measure != 0:
 * only count the workspace into *bytes (all pointers may be NULL). */
typedef struct cpi_fwd_args {
    const void *q, *k, *v;
    void *out;
    float *lse;
} cpi_fwd_args;
typedef struct cpi_bwd_args {
    const void *q, *k, *v, *out, *dout;
    const float *lse;
    void *dq, *dk, *dv;
} cpi_bwd_args;

cp_status cpi_all_gather_forward(cp_attn_plan *p, const cpi_fwd_args *a, cpi_arena *ws);
cp_status cpi_all_gather_backward(cp_attn_plan *p, const cpi_bwd_args *a, cpi_arena *ws);
/* a2a, p2p and hybrid share one path: a2a exchange inside sub-groups of A,
 * ring across the R sub-groups, a2a back. */
cp_status cpi_a2a_p2p_forward(cp_attn_plan *p, const cpi_fwd_args *a, cpi_arena *ws);
cp_status cpi_a2a_p2p_backward(cp_attn_plan *p, const cpi_bwd_args *a, cpi_arena *ws);

/* One a2a exchange (a2a.c): the local side is [s_loc tokens, all heads]
 * (tensor or lse), the head side [T tokens of my sub-group, my head slice]
 * (tensor_h or lse_h). send / recv hold A blocks of the head side's slice. */
typedef struct cpi_a2a_item {
    const cpi_tensor *tensor;
    const cpi_lse *lse;
    const cpi_tensor *tensor_h;
    const cpi_lse *lse_h;
    int kv; /* slices of kv heads (else query heads) */
} cpi_a2a_item;
size_t cpi_a2a_item_bytes(const cp_attn_plan *p, const cpi_a2a_item *it); /* one block */
/* Whether the item's exchanges use send / recv: not where the transport
 * moves its head slices in place and the blocks are head-side rows. */
int cpi_a2a_item_buffered(const cp_attn_plan *p, const cpi_a2a_item *it);
cp_status cpi_a2a_to_heads(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv);
/* The way back; with sum_replicas, F32 blocks of members sharing a kv head
 * (Hkv < A) are summed before they are placed. */
cp_status cpi_a2a_to_tokens(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv,
                            int sum_replicas);

/* Ring steps over p->ring_comm (ring.c). q side: rows of tokset `mine_sub`;
 * kv side: circulates. */
cp_status cpi_ring_forward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                           const cpi_tensor *o32, const cpi_lse *lse, cpi_arena *ws);
cp_status cpi_ring_backward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                            const cpi_tensor *o, const cpi_lse *lse, const cpi_tensor *dout,
                            const cpi_tensor *dq32, const cpi_tensor *dk32, const cpi_tensor *dv32,
                            cpi_arena *ws);

#endif
