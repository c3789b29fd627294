/* SPDX-License-Identifier: MIT */
/*
 * The a2a (Ulysses) exchange inside a sub-group of A consecutive cp ranks
 * (DESIGN.md section 3): "to heads" turns every member's [its tokens, all
 * heads] into [the sub-group's tokens, its own head slice]; "to tokens" is
 * the way back. Member j owns query heads [j*hq, +hq) and kv heads
 * [j*Hkv/A, +hkv); when Hkv < A, A/Hkv members share (replicate) a kv head
 * and the way back sums their gradients.
 */
#include "attn/plan.h"

static int32_t slice_first(const cp_attn_plan *p, int kv, int member)
{
    if (kv)
        return (int32_t)((int64_t)member * p->d.num_kv_heads / p->A);
    return member * p->heads.hq;
}

static int sub_rank(const cp_attn_plan *p, int member)
{
    return p->ring_rank * p->A + member;
}

static cpi_lse block_l(const cp_attn_plan *p, const cpi_a2a_item *it, void *base, int member)
{
    cpi_lse b = { NULL, p->s_loc, it->lse_h->heads, NULL };
    b.p = (float *)base + (size_t)member * (size_t)p->d.batch * (size_t)b.heads * (size_t)p->s_loc;
    return b;
}

size_t cpi_a2a_item_bytes(const cp_attn_plan *p, const cpi_a2a_item *it)
{
    if (it->lse_h)
        return (size_t)p->d.batch * (size_t)it->lse_h->heads * (size_t)p->s_loc * sizeof(float);
    const cpi_tensor *h = it->tensor_h;
    return (size_t)p->d.batch * (size_t)p->s_loc * (size_t)h->heads * (size_t)h->dim * cpi_dtype_size(h->dtype);
}

/* Member m's spans in its local order and the head-side row where each
 * starts (sorted token-set order); returns how many. */
static int member_spans(const cp_attn_plan *p, int m, cpi_span spans[CPI_MAX_SPANS], int64_t rows[CPI_MAX_SPANS])
{
    const int n = cpi_layout_spans(p->d.layout, p->P, sub_rank(p, m), p->d.seq_len, spans);
    for (int i = 0; i < n; i++)
        rows[i] = cpi_tokset_row(&p->sub[p->ring_rank], spans[i].offset);
    return n;
}

/* Copy the rows of member m's tokens between its block (local order) and the
 * [T, slice] side (sorted token-set order). to_block: direction. */
static cp_status member_rows(const cp_attn_plan *p, const cpi_a2a_item *it, void *base, int m, int to_block)
{
    cpi_span spans[CPI_MAX_SPANS];
    int64_t rows[CPI_MAX_SPANS];
    const int n = member_spans(p, m, spans, rows);
    int64_t local = 0;
    for (int i = 0; i < n; i++) {
        const int64_t row = rows[i];
        if (it->lse_h) {
            cpi_lse b = block_l(p, it, base, m);
            CPI_TRY(to_block ? cpi_copy_lse(p, &b, local, 0, it->lse_h, row, 0, spans[i].len, b.heads)
                             : cpi_copy_lse(p, it->lse_h, row, 0, &b, local, 0, spans[i].len, b.heads));
        } else {
            cpi_tensor b = cpi_tensor_block(p, it->tensor_h, base, m);
            CPI_TRY(to_block ? cpi_copy_tokens(p, &b, local, 0, it->tensor_h, row, 0, spans[i].len, b.heads)
                             : cpi_copy_tokens(p, it->tensor_h, row, 0, &b, local, 0, spans[i].len, b.heads));
        }
        local += spans[i].len;
    }
    return CP_SUCCESS;
}

/* Copy my local tokens' head slice of member m between the local side and
 * m's block. to_block: direction. */
static cp_status member_heads(const cp_attn_plan *p, const cpi_a2a_item *it, void *base, int m, int to_block)
{
    const int32_t first = slice_first(p, it->kv, m);
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
    if (it->lse_h || (p->d.batch != 1 && p->d.format != CP_FORMAT_SBHD) ||
        it->tensor_h->ntok != (int64_t)p->A * p->s_loc)
        return 0;
    for (int m = 0; m < p->A; m++) {
        cpi_span spans[CPI_MAX_SPANS];
        int64_t rows[CPI_MAX_SPANS];
        const int n = member_spans(p, m, spans, rows);
        int64_t local = 0;
        for (int i = 0; i < n; i++) {
            if (rows[i] != (int64_t)m * p->s_loc + local)
                return 0;
            local += spans[i].len;
        }
    }
    return 1;
}

static cp_status exchange(const cp_attn_plan *p, void *send, void *recv, size_t block)
{
    cp_xfer x = cpi_group_xfer(p->g);
    return cpi_all_to_all(p->a2a_comm, &x, send, recv, block);
}

/* The token side's head slices as strided blocks: where the transport can
 * read them in place and every member's slice of the local tokens is the
 * same rows at an even step of heads (no replicated kv heads; batch 1 or
 * SBHD, so that rows are evenly spaced), the exchange takes the slices
 * straight from (or puts them straight into) the token-side tensor, and the
 * copy between it and the exchange buffer is saved. */
typedef struct slices {
    size_t step, pitch, width, rows;
} slices;

static int slices_strided(const cp_attn_plan *p, const cpi_a2a_item *it, slices *sl)
{
    if (it->lse_h || (p->d.batch != 1 && p->d.format != CP_FORMAT_SBHD) ||
        (it->kv && p->d.num_kv_heads % p->A) || !cpi_comm_has_all_to_all_2d(p->a2a_comm))
        return 0;
    const cpi_tensor *t = it->tensor, *h = it->tensor_h;
    if (t->dtype != h->dtype || t->dim != h->dim || (int64_t)h->heads * p->A != t->heads)
        return 0;
    const size_t es = cpi_dtype_size(t->dtype);
    sl->width = (size_t)h->heads * (size_t)h->dim * es;
    sl->step = sl->width; /* slice m starts at head m * h->heads */
    sl->pitch = (size_t)t->heads * (size_t)t->dim * es;
    sl->rows = (size_t)p->s_loc * (size_t)p->d.batch;
    return 1;
}

int cpi_a2a_item_buffered(const cp_attn_plan *p, const cpi_a2a_item *it)
{
    slices sl;
    return !slices_strided(p, it, &sl) || !blocks_are_rows(p, it);
}

cp_status cpi_a2a_to_heads(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv)
{
    slices sl;
    if (slices_strided(p, it, &sl)) {
        const int rows = blocks_are_rows(p, it);
        cp_xfer x = cpi_group_xfer(p->g);
        CPI_TRY(cpi_all_to_all_2d(p->a2a_comm, &x, it->tensor->p, sl.step, sl.pitch,
                                  rows ? it->tensor_h->p : recv, sl.width * sl.rows, sl.width, sl.width, sl.rows));
        for (int m = 0; m < p->A && !rows; m++)
            CPI_TRY(member_rows(p, it, recv, m, 0));
        return CP_SUCCESS;
    }
    for (int m = 0; m < p->A; m++)
        CPI_TRY(member_heads(p, it, send, m, 1));
    if (blocks_are_rows(p, it))
        return exchange(p, send, it->tensor_h->p, cpi_a2a_item_bytes(p, it));
    CPI_TRY(exchange(p, send, recv, cpi_a2a_item_bytes(p, it)));
    for (int m = 0; m < p->A; m++)
        CPI_TRY(member_rows(p, it, recv, m, 0));
    return CP_SUCCESS;
}

cp_status cpi_a2a_to_tokens(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv, int sum_replicas)
{
    if (blocks_are_rows(p, it))
        send = it->tensor_h->p;
    else
        for (int m = 0; m < p->A; m++)
            CPI_TRY(member_rows(p, it, send, m, 1));
    const size_t block = cpi_a2a_item_bytes(p, it);
    slices sl;
    if (slices_strided(p, it, &sl)) { /* no replicas to sum: see slices_strided */
        cp_xfer x = cpi_group_xfer(p->g);
        return cpi_all_to_all_2d(p->a2a_comm, &x, send, block, sl.width, it->tensor->p, sl.step, sl.pitch,
                                 sl.width, sl.rows);
    }
    CPI_TRY(exchange(p, send, recv, block));
    const int rep = it->kv && p->d.num_kv_heads < p->A ? p->A / p->d.num_kv_heads : 1;
    for (int m = 0; m < p->A; m += rep) {
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
