/* SPDX-License-Identifier: MIT */
/* cp_loss_reduce: the global mean loss from every rank's (loss sum, token
 * count). A mean of the ranks' means would weigh ranks, not tokens. */
#include <math.h>
#include <stdio.h>

#include "comm/agree.h"
#include "train/exchange.h"

/* Token counts travel as doubles; beyond 2^53 they would not be exact. */
#define MAX_TOKENS ((int64_t)1 << 53)

CP_EXPORT cp_status cp_loss_reduce(cp_context *ctx, cp_comm *comm, double loss_sum, int64_t tokens,
                                   double *mean, int64_t *total_tokens)
{
    if (mean)
        *mean = NAN;
    if (total_tokens)
        *total_tokens = 0;
    CPI_CHECK_PTR(comm);

    cp_status local = CP_SUCCESS;
    if (!mean)
        local = cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: mean is NULL", __func__);
    else if (tokens < 0 || tokens > MAX_TOKENS)
        local = cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: tokens = %lld (must be in [0, 2^53])", __func__,
                          (long long)tokens);

    /* One sum of (loss, tokens) that carries every rank's verdict too: a
     * rank with bad arguments still takes part, and its peers learn of it. */
    double v[2] = { loss_sum, (double)tokens };
    const cpi_agree_call call = { .func = __func__, .ctx = ctx, .comm = comm, .timeout_ms = CPI_TRAIN_TIMEOUT_MS };
    CPI_TRY(cpi_agree_sum(&call, local, v, 2));
    /* Every rank sees the same total, so all fail here alike. */
    CPI_CHECK(v[1] <= (double)MAX_TOKENS, "%s: the total of tokens over %d ranks = %.17g exceeds 2^53", __func__,
              comm->size, v[1]);
    *mean = v[1] > 0 ? v[0] / v[1] : 0.0;
    if (total_tokens)
        *total_tokens = (int64_t)v[1];
    return CP_SUCCESS;
}
