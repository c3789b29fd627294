/* SPDX-License-Identifier: MIT */
/*
 * The p2p ring (ring.c): its steps, and its geometry - which key / value
 * block a member holds at a step, and which rows of a block a hop carries.
 * The geometry is arithmetic on token sets only, so that a test can ask
 * the library what a hop of its ring carries.
 */
#ifndef INFINICP_ATTN_RING_H
#define INFINICP_ATTN_RING_H

#include "attn/tensor.h"
#include "attn/tokset.h"
#include "attn/vis.h"

/* The ring as its geometry sees it: members 0 .. size - 1, member i holding
 * the queries of token set sub[i], and the key / value block of the same
 * tokens to start with. */
typedef struct cpi_ring {
    int size;              /* members: R */
    int member;            /* this member: m */
    const cpi_tokset *sub; /* size token sets */
    bool causal;           /* the causal mask hides keys */
    const cpi_vis *vis;    /* API 1.1 (windows, documents): what hides keys instead; NULL: causal alone */
    bool rows_contiguous;  /* a row range of a block is one byte range of its buffers (batch 1, or SBHD) */
    /* The forward's direction: 0 (or 1): at step s member m holds block
     * m + s and passes blocks to m - 1; -1: block m - s, passed to m + 1
     * (cpi_ring_pick_fwd_dir). */
    int fwd_dir;
} cpi_ring;

/* Rows [lo, hi) of a block's buffers; empty when lo >= hi. */
typedef struct cpi_rows {
    int64_t lo, hi;
} cpi_rows;

static inline bool cpi_rows_empty(cpi_rows r)
{
    return r.lo >= r.hi;
}

/* Member i counted around the ring (i may be negative or past the end). */
static inline int cpi_ring_member(const cpi_ring *r, int i)
{
    return ((i % r->size) + r->size) % r->size;
}

/* The rows of block `block` that `count` members see, members first,
 * first + dir, first + 2 dir, ... around the ring: the cover of the key spans
 * the mask does not hide from all of a member's queries. The whole block
 * when that cover is not empty but a part would not be one byte range. */
cpi_rows cpi_ring_rows_seen_by(const cpi_ring *r, int block, int first, int count, int dir);

/*
 * Forward: at step s member m holds block m + s (with d = fwd_dir: m + d s),
 * and the hop before step s passes blocks to m - 1 (m - d). A hop carries
 * the rows of a block that the members yet to hold it see: for the block
 * arriving, m, m - d, ... (R - s of them); for the block leaving, m - d,
 * m - 2d, ... (as many).
 */
static inline int cpi_ring_fwd_sign(const cpi_ring *r)
{
    return r->fwd_dir < 0 ? -1 : 1;
}

static inline int cpi_ring_fwd_block(const cpi_ring *r, int step)
{
    return cpi_ring_member(r, r->member + cpi_ring_fwd_sign(r) * step);
}

static inline cpi_rows cpi_ring_fwd_kv_in(const cpi_ring *r, int step)
{
    const int d = cpi_ring_fwd_sign(r);
    return cpi_ring_rows_seen_by(r, cpi_ring_fwd_block(r, step), r->member, r->size - step, -d);
}

static inline cpi_rows cpi_ring_fwd_kv_out(const cpi_ring *r, int step)
{
    const int d = cpi_ring_fwd_sign(r);
    return cpi_ring_rows_seen_by(r, cpi_ring_fwd_block(r, step - 1), r->member - d, r->size - step, -d);
}

/* The forward direction under which the blocks' hops carry fewer rows in
 * all (+1 on a tie): under windows the blocks a member needs sit on one
 * side of it, and the ring should bring them from that side first. */
int cpi_ring_pick_fwd_dir(const cpi_ring *r);
/* That choice for plan p's ring (+1 where the plan attends without
 * rectangles: the direction the causal zigzag ring was laid out for). */
int cpi_ring_plan_fwd_dir(const cp_attn_plan *p);

/*
 * Backward: at step s member m holds block m - 1 - s, so that its own block
 * comes last, and the hop before step s passes blocks to m + 1. Keys and
 * values carry the rows that the members from the receiver until the
 * block's owner see: R - 1 - s of them. The fp32 dK / dV accumulator of a
 * block travels with it: what arrives for step s holds sums in the rows
 * (`have`) that the s members it visited (its owner + 1, ..., m - 1) saw,
 * the rest being zero; what leaves after step s must hold them in the rows
 * (`want`) that those and m see, and at home (the last step) in all rows.
 */
static inline int cpi_ring_bwd_block(const cpi_ring *r, int step)
{
    return cpi_ring_member(r, r->member - 1 - step);
}

static inline cpi_rows cpi_ring_bwd_kv_in(const cpi_ring *r, int step)
{
    return cpi_ring_rows_seen_by(r, cpi_ring_bwd_block(r, step), r->member, r->size - 1 - step, 1);
}

static inline cpi_rows cpi_ring_bwd_kv_out(const cpi_ring *r, int step)
{
    return cpi_ring_rows_seen_by(r, cpi_ring_bwd_block(r, step - 1), r->member + 1, r->size - 1 - step, 1);
}

static inline cpi_rows cpi_ring_bwd_acc_have(const cpi_ring *r, int step)
{
    const int block = cpi_ring_bwd_block(r, step);
    return cpi_ring_rows_seen_by(r, block, block + 1, step, 1);
}

static inline cpi_rows cpi_ring_bwd_acc_want(const cpi_ring *r, int step)
{
    const int block = cpi_ring_bwd_block(r, step);
    if (step == r->size - 1)
        return (cpi_rows){ 0, r->sub[block].ntok };
    return cpi_ring_rows_seen_by(r, block, block + 1, step + 1, 1);
}

/* Whether no member sends or receives anything in the forward hop before
 * step `step`, or the backward's key / value hop before it (kv = 1) or
 * accumulator hop after it (kv = 0): then every member skips it. */
bool cpi_ring_fwd_idle(const cpi_ring *r, int step);
bool cpi_ring_bwd_idle(const cpi_ring *r, int step, int kv);

/* The ring's steps over p->ring_comm, this rank being member
 * p->ring_rank of p->ring_size: the queries are the rows of the member's
 * token set, the keys and values its block, which then circulates.
 * Direct (a ring of one member whose block is one kernel call: see
 * cpi_ring_direct): the forward stores the final output in o_final instead of
 * merging into o32 (which the caller then neither clears nor converts),
 * the backward the final gradients in fin[0..2] instead of adding into
 * dq32, dk32, dv32 (which it neither clears nor reads then: the caller
 * need not take them). NULL: not direct. */
cp_status cpi_ring_forward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                           const cpi_tensor *o32, const cpi_lse *lse, const cpi_descale *descale,
                           const cpi_tensor *o_final, cpi_arena *ws);
cp_status cpi_ring_backward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                            const cpi_tensor *o, const cpi_lse *lse, const cpi_tensor *dout,
                            const cpi_tensor *dq32, const cpi_tensor *dk32, const cpi_tensor *dv32,
                            const cpi_tensor *const *fin, cpi_arena *ws);
/* *direct = whether this rank's ring can run direct: one member, its block
 * (its token set against itself) one kernel call, and the call's scratch
 * no more than the workspace holds for the regular call: its scratch plus
 * `spare`, the bytes of the fp32 partials the caller then does not take
 * (the CUDA backward with 16-bit gradients sums dQ in fp32 scratch of its
 * own, as big as the partial dQ). */
cp_status cpi_ring_direct(const cp_attn_plan *p, int backward, size_t spare, int *direct);

#endif
