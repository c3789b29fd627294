/* SPDX-License-Identifier: MIT */
/* cp_layout_gather: every rank's share back into the whole sequence. */
#include <stdint.h>

#include "comm/agree.h"
#include "comm/group.h"
#include "layout/spans.h"

/* Place rank j's shard (batch rows of its spans, in its local order) at the
 * spans' global positions. */
static cp_status place(cp_context *ctx, cp_layout l, int size, int j, const char *shard, char *global,
                       size_t batch, int64_t seq_len, size_t token_bytes)
{
    cpi_span spans[CPI_MAX_SPANS];
    int n = cpi_layout_spans(l, size, j, seq_len, spans);
    size_t local_pitch = (size_t)(seq_len / size) * token_bytes, global_pitch = (size_t)seq_len * token_bytes;
    size_t at = 0; /* bytes into a local row */
    for (int i = 0; i < n; i++) {
        size_t width = (size_t)spans[i].len * token_bytes;
        CPI_TRY(ctx->ops->copy_2d(ctx->state, global + (size_t)spans[i].offset * token_bytes, global_pitch,
                                  shard + at, local_pitch, width, batch, cpi_local_copy_kind(ctx)));
        at += width;
    }
    return CP_SUCCESS;
}

/* What this rank can check alone; *shard and *total: bytes of a rank's
 * share and of the whole tensor. */
static cp_status check_args(const cp_group *g, cp_layout l, const void *local, const void *global, int64_t batch,
                            int64_t seq_len, size_t token_bytes, size_t *shard, size_t *total)
{
    static const char f[] = "cp_layout_gather";
    CPI_CHECK(local != NULL, "%s: local is NULL", f);
    CPI_CHECK(global != NULL, "%s: global is NULL", f);
    CPI_TRY(cpi_layout_check(f, l, g->size, g->rank, seq_len));
    CPI_CHECK(batch >= 1, "%s: batch = %lld (must be >= 1)", f, (long long)batch);
    CPI_CHECK(token_bytes >= 1, "%s: token_bytes = %zu (must be >= 1)", f, token_bytes);
    size_t rows;
    CPI_CHECK((uint64_t)batch <= SIZE_MAX && cpi_mul((size_t)batch, (size_t)seq_len, &rows) &&
                  cpi_mul(rows, token_bytes, total) && *total <= PTRDIFF_MAX,
              "%s: batch = %lld x seq_len = %lld x token_bytes = %zu overflows the address space", f,
              (long long)batch, (long long)seq_len, token_bytes);
    *shard = *total / (size_t)g->size;
    CPI_CHECK(!cpi_overlap(local, *shard, global, *total), "%s: local %p overlaps global %p", f, local, global);
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_layout_gather(cp_group *g, cp_layout l, const void *local, void *global, int64_t batch,
                                     int64_t seq_len, size_t token_bytes)
{
    CPI_CHECK_PTR(g);
    cp_context *ctx = g->ctx;
    size_t shard = 0, total = 0;
    /* Contiguous shards of one sequence are already in global order; others
     * land in a staging buffer, taken before the agreement so that running
     * out of memory fails every rank at once too. */
    const bool direct = l == CP_LAYOUT_CONTIGUOUS && batch == 1;
    void *stage = NULL;
    cp_status s = check_args(g, l, local, global, batch, seq_len, token_bytes, &shard, &total);
    if (s == CP_SUCCESS && !direct)
        s = ctx->ops->alloc(ctx->state, total, &stage);
    /* A rank with bad arguments still takes part, so that its peers fail at once. */
    const cpi_agree_call call = { .func = __func__, .ctx = ctx, .comm = g->comm, .timeout_ms = g->cfg.timeout_ms };
    cpi_agreement ag;
    if ((s = cpi_agree_open(&ag, &call, s)) != CP_SUCCESS) {
        if (stage)
            ctx->ops->free(ctx->state, stage); /* nothing was queued on it */
        return s;
    }

    cp_xfer x = cpi_group_xfer(g);
    if (direct)
        return cpi_agree_close(&ag, cpi_all_gather(g->comm, &x, local, global, shard));
    s = cpi_all_gather(g->comm, &x, local, stage, shard);
    for (int j = 0; j < g->size && s == CP_SUCCESS; j++)
        s = place(ctx, l, g->size, j, (const char *)stage + (size_t)j * shard, global, (size_t)batch, seq_len,
                  token_bytes);
    s = cpi_agree_close(&ag, s);
    cp_status w = cpi_comm_wait(g->comm, &x);
    if (w != CP_SUCCESS)
        return s != CP_SUCCESS ? s : w; /* stage stays: freeing it would wait for a stuck stream */
    cp_status sync = ctx->ops->synchronize(ctx->state); /* before stage goes */
    ctx->ops->free(ctx->state, stage);
    return s != CP_SUCCESS ? s : sync;
}
