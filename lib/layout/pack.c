/* SPDX-License-Identifier: MIT */
/* cp_pack: placeholder until the planner lands (every call UNSUPPORTED). */
#include <stdlib.h>

#include "core/context.h"
#include "layout/pack.h"

double cpi_pack_pairs(const int64_t *cu, int n, cp_mask mask, int64_t window, int64_t a, int64_t b)
{
    (void)cu; (void)n; (void)mask; (void)window; (void)a; (void)b;
    return 0;
}

int cpi_pack_doc_of(const int64_t *cu, int n, int64_t pos)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

CP_EXPORT cp_status cp_pack_create(const cp_pack_config *cfg, cp_pack **out)
{
    (void)cfg;
    if (out)
        *out = NULL;
    return cpi_error(CP_ERROR_UNSUPPORTED, "%s: not yet", __func__);
}

CP_EXPORT cp_status cp_pack_positions(const cp_pack *pk, int cp_rank, int64_t *positions, int64_t *doc_positions,
                                      int32_t *doc_ids)
{
    (void)pk; (void)cp_rank; (void)positions; (void)doc_positions; (void)doc_ids;
    return cpi_error(CP_ERROR_UNSUPPORTED, "%s: not yet", __func__);
}

CP_EXPORT cp_status cp_pack_work(const cp_pack *pk, int cp_rank, double *pairs)
{
    (void)pk; (void)cp_rank; (void)pairs;
    return cpi_error(CP_ERROR_UNSUPPORTED, "%s: not yet", __func__);
}

CP_EXPORT cp_status cp_pack_shard(cp_context *ctx, const cp_pack *pk, int cp_rank, const void *global, void *local,
                                  size_t token_bytes)
{
    (void)ctx; (void)pk; (void)cp_rank; (void)global; (void)local; (void)token_bytes;
    return cpi_error(CP_ERROR_UNSUPPORTED, "%s: not yet", __func__);
}

CP_EXPORT cp_status cp_pack_gather(cp_group *g, const cp_pack *pk, const void *local, void *global,
                                   size_t token_bytes)
{
    (void)g; (void)pk; (void)local; (void)global; (void)token_bytes;
    return cpi_error(CP_ERROR_UNSUPPORTED, "%s: not yet", __func__);
}

CP_EXPORT void cp_pack_destroy(cp_pack *pk)
{
    (void)pk;
}
