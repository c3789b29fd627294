/* SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "train/exchange.h"

cp_status cpi_train_all_reduce_host(cp_context *ctx, cp_comm *comm, double *v, size_t n, cp_reduce_op op)
{
    return cpi_all_reduce_host(ctx, comm, CPI_TRAIN_TIMEOUT_MS, v, n, op);
}

/* Fields travel as exact doubles: 32-bit halves, each with its negation, so
 * one MAX all-reduce yields every field's maximum and minimum. */
enum { MAX_FIELDS = 8, HALVES = 2 };

cp_status cpi_train_agree(const char *func, cp_context *ctx, cp_comm *comm, const uint64_t *fields,
                          const char *const *names, int n, cp_status local)
{
    if (n < 0 || n > MAX_FIELDS)
        return cpi_error(CP_ERROR_INTERNAL, "%s: %d fields to compare (at most %d)", func, n, MAX_FIELDS);
    double v[2 * HALVES * MAX_FIELDS + 1];
    const int m = HALVES * n;
    for (int i = 0; i < n; i++) {
        const uint64_t f = local == CP_SUCCESS ? fields[i] : 0;
        v[HALVES * i] = (double)(f >> 32);
        v[HALVES * i + 1] = (double)(f & 0xffffffffu);
    }
    for (int i = 0; i < m; i++)
        v[m + i] = -v[i];
    v[2 * m] = local == CP_SUCCESS ? 0.0 : 1.0;

    char saved[512];
    snprintf(saved, sizeof saved, "%s", cp_last_error());
    cp_status s = cpi_train_all_reduce_host(ctx, comm, v, (size_t)(2 * m + 1), CP_REDUCE_MAX);
    if (local != CP_SUCCESS)
        return cpi_error(local, "%s", saved); /* this rank's own reason comes first */
    if (s != CP_SUCCESS)
        return s;
    if (v[2 * m] != 0.0)
        return cpi_error(CP_ERROR_MISMATCH,
                         "%s: rank %d of %d: another rank of the communicator rejected its arguments", func,
                         comm->rank, comm->size);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < HALVES; h++)
            if (v[HALVES * i + h] != -v[m + HALVES * i + h])
                return cpi_error(CP_ERROR_MISMATCH,
                                 "%s: ranks of the communicator pass different %s (rank %d of %d: %llu)", func,
                                 names[i], comm->rank, comm->size, (unsigned long long)fields[i]);
    return CP_SUCCESS;
}
