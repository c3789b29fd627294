/* SPDX-License-Identifier: MIT */
/*
 * The a2a (Ulysses) exchange inside a sub-group of A = p->a2a_size
 * consecutive cp ranks (docs/ARCHITECTURE.md, CP modes): "to heads" turns
 * every member's [its tokens, all heads] into [the sub-group's tokens, its
 * own head slice]; "to tokens" is the way back. Member j owns query heads
 * [j*hq, +hq) and kv heads [j*Hkv/A, +hkv); when Hkv < A, A/Hkv members
 * share (replicate) a kv head and the way back sums their gradients.
 */
#include "attn/plan.h"

int32_t cpi_a2a_head_first(const cp_attn_plan *p, int kv, int member)
{
    if (kv)
        return (int32_t)((int64_t)member * p->desc.num_kv_heads / p->a2a_size);
    return member * p->heads.hq;
}

static cpi_lse block_l(const cp_attn_plan *p, const cpi_a2a_item *it, void *base, int member)
{
    cpi_lse b = { NULL, p->s_loc, it->lse_h->heads, NULL };
    b.data = (float *)base + (size_t)member * (size_t)p->desc.batch * (size_t)b.heads * (size_t)p->s_loc;
    return b;
}

size_t cpi_a2a_item_bytes(const cp_attn_plan *p, const cpi_a2a_item *it)
{
    if (it->lse_h)
        return (size_t)p->desc.batch * (size_t)it->lse_h->heads * (size_t)p->s_loc * sizeof(float);
    const cpi_tensor *h = it->tensor_h;
    return (size_t)p->desc.batch * (size_t)p->s_loc * (size_t)h->heads * (size_t)h->dim * cpi_dtype_size(h->dtype);
}

/* The head-side row (sorted token-set order) where span i of member m's
 * tokens (p->members[m], its local order) starts. */
static int64_t head_row(const cp_attn_plan *p, int m, int i)
{
    return cpi_tokset_row(&p->sub[p->ring_rank], p->members[m].span[i].offset);
}

/* Copy the rows of member m's tokens between its block (local order) and the
 * [T, slice] side (sorted token-set order). to_block: direction. */
static cp_status member_rows(const cp_attn_plan *p, const cpi_a2a_item *it, void *base, int m, int to_block)
{
    const cpi_tokset *t = &p->members[m];
    for (int i = 0; i < t->nspans; i++) {
        const int64_t row = head_row(p, m, i), local = t->row[i], len = t->span[i].len;
        if (it->lse_h) {
            cpi_lse b = block_l(p, it, base, m);
            CPI_TRY(to_block ? cpi_copy_lse(p, &b, local, 0, it->lse_h, row, 0, len, b.heads)
                             : cpi_copy_lse(p, it->lse_h, row, 0, &b, local, 0, len, b.heads));
        } else {
            cpi_tensor b = cpi_tensor_block(p, it->tensor_h, base, m);
            CPI_TRY(to_block ? cpi_copy_tokens(p, &b, local, 0, it->tensor_h, row, 0, len, b.heads)
                             : cpi_copy_tokens(p, it->tensor_h, row, 0, &b, local, 0, len, b.heads));
        }
    }
    return CP_SUCCESS;
}

/* Copy my local tokens' head slice of member m between the local side and
 * m's block. to_block: direction. */
static cp_status member_heads(const cp_attn_plan *p, const cpi_a2a_item *it, void *base, int m, int to_block)
{
    const int32_t first = cpi_a2a_head_first(p, it->kv, m);
    if (it->lse_h) {
        cpi_lse b = block_l(p, it, base, m);
        return to_block ? cpi_copy_lse(p, &b, 0, 0, it->lse, 0, first, p->s_loc, b.heads)
                        : cpi_copy_lse(p, it->lse, 0, first, &b, 0, 0, p->s_loc, b.heads);
    }
    cpi_tensor b = cpi_tensor_block(p, it->tensor_h, base, m);
    return to_block ? cpi_copy_tokens(p, &b, 0, 0, it->tensor, 0, first, p->s_loc, b.heads)
                    : cpi_copy_tokens(p, it->tensor, 0, first, &b, 0, 0, p->s_loc, b.heads);
}

/* Whether the exchange's block m is laid out exactly like rows
 * [m * s_loc, +s_loc) of the head side: member m's tokens sit there in their
 * local order (one span a member, in member order: the contiguous layout),
 * and consecutive rows are one dense piece of the head-side tensor (batch 1,
 * or SBHD). The exchange can then land in (or leave from) the head-side
 * tensor itself, and the copy between it and an exchange buffer is saved.
 * LSE items ([batch, heads, tokens]) never are. */
static int blocks_are_rows(const cp_attn_plan *p, const cpi_a2a_item *it)
{
    if (it->lse_h || (p->desc.batch != 1 && p->desc.format != CP_FORMAT_SBHD) ||
        it->tensor_h->ntok != (int64_t)p->a2a_size * p->s_loc)
        return 0;
    for (int m = 0; m < p->a2a_size; m++)
        for (int i = 0; i < p->members[m].nspans; i++)
            if (head_row(p, m, i) != (int64_t)m * p->s_loc + p->members[m].row[i])
                return 0;
    return 1;
}

static cp_status exchange(const cp_attn_plan *p, void *send, void *recv, size_t block)
{
    cp_xfer x = cpi_group_xfer(p->group);
    return cpi_all_to_all(p->a2a_comm, &x, send, recv, block);
}

/*
 * Exchanges without the exchange buffers. Where the transport reads strided
 * blocks in place (cpi_all_to_all_2d), every member's head slice of the
 * local tokens is a strided block of the token-side tensor (the same rows,
 * slices an even number of heads apart: no replicated kv heads; batch 1 or
 * SBHD, so that rows are evenly spaced), and the members' spans land on
 * the head side at rows in arithmetic progression over the members (span k
 * of member m at first[k] + m * step[k]: contiguous layouts, one span a
 * member, at m * s_loc; zigzag, early chunks in member order and late
 * chunks in reverse), the exchange moves the rows straight between the
 * token-side slices and the head side, one exchange per span: no copy into
 * or out of an exchange buffer.
 */
typedef struct direct {
    int n;               /* spans per member: exchanges */
    size_t width, pitch; /* bytes: a row of a slice; between token-side rows */
    int64_t local[CPI_MAX_SPANS], len[CPI_MAX_SPANS], first[CPI_MAX_SPANS], step[CPI_MAX_SPANS];
} direct;

static int direct_plan(const cp_attn_plan *p, const cpi_a2a_item *it, direct *dp)
{
    /* Not for packed layouts: their spans come with each call's pack, but
     * the workspace (exchange buffers or none) is measured once, so the
     * answer must not depend on the pack. */
    if (it->lse_h || p->a2a_size < 2 || p->desc.layout == CP_LAYOUT_PACKED || (p->desc.batch != 1 && p->desc.format != CP_FORMAT_SBHD) ||
        (it->kv && p->desc.num_kv_heads % p->a2a_size) || !cpi_comm_has_all_to_all_2d(p->a2a_comm))
        return 0;
    const cpi_tensor *t = it->tensor, *h = it->tensor_h;
    if (t->dtype != h->dtype || t->dim != h->dim || (int64_t)h->heads * p->a2a_size != t->heads)
        return 0;
    const size_t es = cpi_dtype_size(t->dtype);
    dp->width = (size_t)h->heads * (size_t)h->dim * es;
    dp->pitch = (size_t)t->heads * (size_t)t->dim * es;
    /* one exchange per span: only for members of a few spans each, alike */
    const cpi_tokset *t0 = &p->members[0];
    dp->n = t0->nspans;
    if (dp->n > CPI_MAX_SPANS || p->members[1].nspans != dp->n)
        return 0;
    for (int k = 0; k < dp->n; k++) {
        dp->local[k] = t0->row[k];
        dp->len[k] = t0->span[k].len;
        dp->first[k] = head_row(p, 0, k);
        dp->step[k] = head_row(p, 1, k) - dp->first[k];
    }
    for (int m = 1; m < p->a2a_size; m++) {
        if (p->members[m].nspans != dp->n)
            return 0;
        for (int k = 0; k < dp->n; k++)
            if (p->members[m].span[k].len != dp->len[k] || p->members[m].row[k] != dp->local[k] ||
                head_row(p, m, k) != dp->first[k] + (int64_t)m * dp->step[k])
                return 0;
    }
    return 1;
}

/* The direct exchanges of one item; to_heads: direction. */
static cp_status exchange_direct(const cp_attn_plan *p, const cpi_a2a_item *it, const direct *dp, int to_heads)
{
    const int64_t B = p->desc.batch;
    const size_t tok_t = (size_t)B * dp->pitch, tok_h = (size_t)B * dp->width; /* bytes of a token */
    cp_xfer x = cpi_group_xfer(p->group);
    for (int k = 0; k < dp->n; k++) {
        char *tp = (char *)it->tensor->data + (size_t)dp->local[k] * tok_t;
        char *hp = (char *)it->tensor_h->data + (size_t)dp->first[k] * tok_h;
        const ptrdiff_t hstep = (ptrdiff_t)dp->step[k] * (ptrdiff_t)tok_h;
        const size_t rows = (size_t)(dp->len[k] * B);
        CPI_TRY(to_heads ? cpi_all_to_all_2d(p->a2a_comm, &x, tp, (ptrdiff_t)dp->width, dp->pitch, hp, hstep,
                                             dp->width, dp->width, rows)
                         : cpi_all_to_all_2d(p->a2a_comm, &x, hp, hstep, dp->width, tp, (ptrdiff_t)dp->width,
                                             dp->pitch, dp->width, rows));
    }
    return CP_SUCCESS;
}

int cpi_a2a_item_buffered(const cp_attn_plan *p, const cpi_a2a_item *it)
{
    direct dp;
    return !direct_plan(p, it, &dp);
}

cp_status cpi_a2a_to_heads(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv)
{
    direct dp;
    if (direct_plan(p, it, &dp))
        return exchange_direct(p, it, &dp, 1);
    for (int m = 0; m < p->a2a_size; m++)
        CPI_TRY(member_heads(p, it, send, m, 1));
    if (blocks_are_rows(p, it))
        return exchange(p, send, it->tensor_h->data, cpi_a2a_item_bytes(p, it));
    CPI_TRY(exchange(p, send, recv, cpi_a2a_item_bytes(p, it)));
    for (int m = 0; m < p->a2a_size; m++)
        CPI_TRY(member_rows(p, it, recv, m, 0));
    return CP_SUCCESS;
}

cp_status cpi_a2a_to_tokens(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv, int sum_replicas)
{
    direct dp;
    if (direct_plan(p, it, &dp)) /* no replicated kv heads, so none to sum */
        return exchange_direct(p, it, &dp, 0);
    if (blocks_are_rows(p, it))
        send = it->tensor_h->data;
    else
        for (int m = 0; m < p->a2a_size; m++)
            CPI_TRY(member_rows(p, it, send, m, 1));
    const size_t block = cpi_a2a_item_bytes(p, it);
    CPI_TRY(exchange(p, send, recv, block));
    const int rep = it->kv && p->desc.num_kv_heads < p->a2a_size ? p->a2a_size / p->desc.num_kv_heads : 1;
    for (int m = 0; m < p->a2a_size; m += rep) {
        if (sum_replicas && rep > 1) {
            const cpi_tensor *h = it->tensor_h;
            size_t count = block / cpi_dtype_size(h->dtype);
            for (int r = 1; r < rep; r++)
                CPI_TRY(p->ctx->ops->reduce(p->ctx->state, (char *)recv + (size_t)m * block,
                                            (char *)recv + (size_t)(m + r) * block, h->dtype, count,
                                            CP_REDUCE_SUM));
        }
        CPI_TRY(member_heads(p, it, recv, m, 0));
    }
    return CP_SUCCESS;
}
