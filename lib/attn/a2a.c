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

/* How the exchange's blocks map onto the head side, where consecutive rows
 * are one dense piece of the head-side tensor (batch 1, or SBHD; never for
 * the LSE items, laid out [batch, heads, tokens]):
 * - ROWS_WHOLE: member m's tokens sit at rows [m * s_loc, +s_loc) in their
 *   local order (one span a member, in member order: the contiguous
 *   layout). The exchange lands in (or leaves from) the head-side tensor
 *   itself.
 * - ROWS_HALVES: member m holds two spans of s_loc / 2 tokens, the first at
 *   rows [m * s_loc / 2, +s_loc / 2) (zigzag: chunk m of the sub-group's
 *   first chunks), the second anywhere (its late chunk, in reverse member
 *   order). The first halves are one exchange into / out of the head-side
 *   rows; the second halves go pairwise, each straight to / from its rows.
 * Either saves the copy between the head side and an exchange buffer. */
enum { ROWS_NONE, ROWS_WHOLE, ROWS_HALVES };

static int row_map(const cp_attn_plan *p, const cpi_a2a_item *it)
{
    if (it->lse_h || (p->d.batch != 1 && p->d.format != CP_FORMAT_SBHD) ||
        it->tensor_h->ntok != (int64_t)p->A * p->s_loc)
        return ROWS_NONE;
    int whole = 1, halves = p->s_loc % 2 == 0;
    const int64_t h = p->s_loc / 2;
    for (int m = 0; m < p->A; m++) {
        cpi_span spans[CPI_MAX_SPANS];
        int64_t rows[CPI_MAX_SPANS];
        const int n = member_spans(p, m, spans, rows);
        int64_t local = 0;
        for (int i = 0; i < n; i++) {
            whole &= rows[i] == (int64_t)m * p->s_loc + local;
            local += spans[i].len;
        }
        halves &= n == 2 && spans[0].len == h && spans[1].len == h && rows[0] == (int64_t)m * h;
    }
    return whole ? ROWS_WHOLE : halves ? ROWS_HALVES : ROWS_NONE;
}

/* Rows [row, row + n) of the head side as a tensor of their own (dense:
 * row_map). */
static cpi_tensor head_rows(const cp_attn_plan *p, const cpi_tensor *t, int64_t row, int64_t n)
{
    int64_t sb, ss, sh;
    cpi_tensor_strides(p, t, &sb, &ss, &sh);
    cpi_tensor r = { (char *)t->p + (size_t)row * (size_t)ss * cpi_dtype_size(t->dtype), n, t->heads, t->dim,
                     t->dtype };
    return r;
}

/* Block i of n rows of an exchange buffer laid out like t. */
static cpi_tensor half_block(const cp_attn_plan *p, const cpi_tensor *t, void *base, int i, int64_t n)
{
    cpi_tensor b = { NULL, n, t->heads, t->dim, t->dtype };
    b.p = (char *)base + (size_t)i * cpi_tensor_bytes(p, &b);
    return b;
}

/* Bytes of half a member's block of t (ROWS_HALVES). */
static size_t half_bytes(const cp_attn_plan *p, const cpi_tensor *t)
{
    const cpi_tensor b = { NULL, p->s_loc / 2, t->heads, t->dim, t->dtype };
    return cpi_tensor_bytes(p, &b);
}

/* The second span's head-side row of member m (ROWS_HALVES). */
static int64_t late_row(const cp_attn_plan *p, int m)
{
    cpi_span spans[CPI_MAX_SPANS];
    int64_t rows[CPI_MAX_SPANS];
    member_spans(p, m, spans, rows);
    return rows[1];
}

static cp_status exchange(const cp_attn_plan *p, void *send, void *recv, size_t block)
{
    cp_xfer x = cpi_group_xfer(p->g);
    return cpi_all_to_all(p->a2a_comm, &x, send, recv, block);
}

static int sub_member(const cp_attn_plan *p)
{
    return p->rank % p->A;
}

/* ROWS_HALVES, to heads: my two halves' head slices for every member; the
 * first halves in one exchange straight into head-side rows [0, A * h), the
 * second halves pairwise (member m + k gets mine, m - k sends me its own)
 * into each sender's rows, and mine by a local copy. */
static cp_status halves_to_heads(const cp_attn_plan *p, const cpi_a2a_item *it, void *send)
{
    const int A = p->A, me = sub_member(p);
    const int64_t h = p->s_loc / 2;
    const cpi_tensor *th = it->tensor_h;
    const size_t block = half_bytes(p, th);
    char *late = (char *)send + (size_t)A * block;
    for (int m = 0; m < A; m++) {
        const int32_t first = slice_first(p, it->kv, m);
        cpi_tensor b0 = half_block(p, th, send, m, h), b1 = half_block(p, th, late, m, h);
        CPI_TRY(cpi_copy_tokens(p, &b0, 0, 0, it->tensor, 0, first, h, b0.heads));
        if (m != me)
            CPI_TRY(cpi_copy_tokens(p, &b1, 0, 0, it->tensor, h, first, h, b1.heads));
    }
    CPI_TRY(exchange(p, send, head_rows(p, th, 0, (int64_t)A * h).p, block));
    cpi_tensor mine = head_rows(p, th, late_row(p, me), h);
    CPI_TRY(cpi_copy_tokens(p, &mine, 0, 0, it->tensor, h, slice_first(p, it->kv, me), h, mine.heads));
    cp_xfer x = cpi_group_xfer(p->g);
    for (int k = 1; k < A; k++) {
        const int dst = (me + k) % A, src = (me + A - k) % A;
        const cpi_tensor b1 = half_block(p, th, late, dst, h), into = head_rows(p, th, late_row(p, src), h);
        CPI_TRY(cpi_sendrecv(p->a2a_comm, &x, b1.p, block, dst, into.p, block, src));
    }
    return CP_SUCCESS;
}

/* ROWS_HALVES, to tokens: the first halves in one exchange straight out of
 * head-side rows [0, A * h), the second halves pairwise out of their rows;
 * every member's pieces land in the first and second half of the receive
 * buffer (blocks in member order), mine by a local copy. */
static cp_status halves_to_tokens(const cp_attn_plan *p, const cpi_a2a_item *it, void *recv)
{
    const int A = p->A, me = sub_member(p);
    const int64_t h = p->s_loc / 2;
    const cpi_tensor *th = it->tensor_h;
    const size_t block = half_bytes(p, th);
    char *late = (char *)recv + (size_t)A * block;
    CPI_TRY(exchange(p, head_rows(p, th, 0, (int64_t)A * h).p, recv, block));
    cpi_tensor mine = half_block(p, th, late, me, h), from = head_rows(p, th, late_row(p, me), h);
    CPI_TRY(cpi_copy_tokens(p, &mine, 0, 0, &from, 0, 0, h, mine.heads));
    cp_xfer x = cpi_group_xfer(p->g);
    for (int k = 1; k < A; k++) {
        const int dst = (me + k) % A, src = (me + A - k) % A;
        const cpi_tensor out = head_rows(p, th, late_row(p, dst), h), into = half_block(p, th, late, src, h);
        CPI_TRY(cpi_sendrecv(p->a2a_comm, &x, out.p, block, dst, into.p, block, src));
    }
    return CP_SUCCESS;
}

/* Copy member m's block of the receive buffer (halves: its two pieces) into
 * my tokens' head slice of m. */
static cp_status member_heads_from_halves(const cp_attn_plan *p, const cpi_a2a_item *it, void *recv, int m)
{
    const int64_t h = p->s_loc / 2;
    const cpi_tensor *th = it->tensor_h;
    const int32_t first = slice_first(p, it->kv, m);
    cpi_tensor b0 = half_block(p, th, recv, m, h),
               b1 = half_block(p, th, (char *)recv + (size_t)p->A * half_bytes(p, th), m, h);
    CPI_TRY(cpi_copy_tokens(p, it->tensor, 0, first, &b0, 0, 0, h, b0.heads));
    return cpi_copy_tokens(p, it->tensor, h, first, &b1, 0, 0, h, b1.heads);
}

cp_status cpi_a2a_to_heads(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv)
{
    const int map = row_map(p, it);
    if (map == ROWS_HALVES)
        return halves_to_heads(p, it, send);
    for (int m = 0; m < p->A; m++)
        CPI_TRY(member_heads(p, it, send, m, 1));
    if (map == ROWS_WHOLE)
        return exchange(p, send, it->tensor_h->p, cpi_a2a_item_bytes(p, it));
    CPI_TRY(exchange(p, send, recv, cpi_a2a_item_bytes(p, it)));
    for (int m = 0; m < p->A; m++)
        CPI_TRY(member_rows(p, it, recv, m, 0));
    return CP_SUCCESS;
}

cp_status cpi_a2a_to_tokens(const cp_attn_plan *p, const cpi_a2a_item *it, void *send, void *recv, int sum_replicas)
{
    const int map = row_map(p, it);
    if (map == ROWS_HALVES)
        CPI_TRY(halves_to_tokens(p, it, recv));
    else {
        if (map == ROWS_WHOLE)
            send = it->tensor_h->p;
        else
            for (int m = 0; m < p->A; m++)
                CPI_TRY(member_rows(p, it, send, m, 1));
        CPI_TRY(exchange(p, send, recv, cpi_a2a_item_bytes(p, it)));
    }
    /* (halves: both halves of the buffer hold blocks in member order, so the
     * replicas' blocks are neighbours in each, and summing whole blocks of
     * the full size would cross between them: sum each half) */
    const size_t block = cpi_a2a_item_bytes(p, it);
    const int rep = it->kv && p->d.num_kv_heads < p->A ? p->A / p->d.num_kv_heads : 1;
    const int parts = map == ROWS_HALVES ? 2 : 1;
    const size_t part = block / (size_t)parts;
    for (int m = 0; m < p->A; m += rep) {
        if (sum_replicas && rep > 1) {
            const cpi_tensor *h = it->tensor_h;
            const size_t count = part / cpi_dtype_size(h->dtype);
            for (int q = 0; q < parts; q++) {
                char *base = (char *)recv + (size_t)q * (size_t)p->A * part;
                for (int r = 1; r < rep; r++)
                    CPI_TRY(p->ctx->ops->reduce(p->ctx->state, base + (size_t)m * part,
                                                base + (size_t)(m + r) * part, h->dtype, count, CP_REDUCE_SUM));
            }
        }
        CPI_TRY(map == ROWS_HALVES ? member_heads_from_halves(p, it, recv, m) : member_heads(p, it, recv, m, 0));
    }
    return CP_SUCCESS;
}
