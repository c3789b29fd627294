/* SPDX-License-Identifier: MIT */
/*
 * Merge of partial attention results over disjoint key sets
 * (docs/ARCHITECTURE.md, Merge):
 *   lse = max + log(exp(lse1 - max) + exp(lse2 - max))
 *   o   = exp(lse1 - lse) o1 + exp(lse2 - lse) o2
 * The two weights are formed per row in double (cheap, and exact enough that
 * merging in any order agrees to fp32 rounding); the row itself is combined in
 * fp32 and rounded once to o's type.
 */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

void cpi_cpu_merge_row(const cpi_tile_ops *t, void *o, cp_dtype ot, float *lse, float *lse_lo, const float *x,
                       double lse_x, int n, float *tmp)
{
    if (lse_x == -INFINITY)
        return;
    double l1 = *lse;
    if (l1 == -INFINITY) {
        t->store(o, ot, x, (size_t)n, 1.0f, 0);
    } else {
        if (lse_lo)
            l1 += *lse_lo;
        double mx = l1 > lse_x ? l1 : lse_x;
        double merged = mx + log(exp(l1 - mx) + exp(lse_x - mx));
        float w1 = (float)exp(l1 - merged), w2 = (float)exp(lse_x - merged);
        t->load(tmp, o, ot, (size_t)n, (size_t)n, w1);
        for (int e = 0; e < n; e++)
            tmp[e] += w2 * x[e];
        t->store(o, ot, tmp, (size_t)n, 1.0f, 0);
        lse_x = merged;
    }
    /* round once; the residual carries what the float cannot hold */
    *lse = (float)lse_x;
    if (lse_lo)
        *lse_lo = (float)(lse_x - (double)*lse);
}

typedef struct {
    const cp_kernel_merge_args *a;
    const cpi_tile_ops *t;
    float *scratch; /* 2 * pad16(head_dim_v) floats per thread */
} merge_job;

static char *at(const void *base, cp_dtype t, int64_t off)
{
    return (char *)base + (size_t)off * cpi_dtype_size(t);
}

static void merge_task(void *arg, int tid, int nt)
{
    merge_job *job = arg;
    const cp_kernel_merge_args *a = job->a;
    size_t w = (size_t)cpi_pad16(a->head_dim_v);
    float *x = job->scratch + (size_t)tid * 2 * w, *tmp = x + w;
    int64_t rows = a->batch * a->seq, lo = rows * tid / nt, hi = rows * (tid + 1) / nt;
    for (int64_t r = lo; r < hi; r++) {
        int64_t b = r / a->seq, s = r % a->seq;
        for (int h = 0; h < a->num_heads; h++) {
            void *o = at(a->o, a->o_dtype, b * a->o_stride_b + s * a->o_stride_s + h * a->o_stride_h);
            const void *op = at(a->o_part, a->o_part_dtype,
                                b * a->o_part_stride_b + s * a->o_part_stride_s + h * a->o_part_stride_h);
            float *lse = a->lse + b * a->lse_stride_b + h * a->lse_stride_h + s;
            float lse_part = a->lse_part[b * a->lse_part_stride_b + h * a->lse_part_stride_h + s];
            if (lse_part == -INFINITY)
                continue;
            job->t->load(x, op, a->o_part_dtype, (size_t)a->head_dim_v, (size_t)a->head_dim_v, 1.0f);
            cpi_cpu_merge_row(job->t, o, a->o_dtype, lse, NULL, x, lse_part, a->head_dim_v, tmp);
        }
    }
}

cp_status cpi_cpu_merge(void *state, const cp_kernel_merge_args *a)
{
    cpi_cpu_state *s = state;
    int64_t rows = a->batch * a->seq;
    int threads = cpi_cpu_state_threads(s);
    /* a thread is worth waking for a few thousand values at least */
    int64_t useful = rows * a->num_heads * a->head_dim_v / 4096 + 1;
    if (threads > useful)
        threads = (int)useful;
    if (threads > rows)
        threads = (int)rows;
    size_t floats = (size_t)threads * 2 * (size_t)cpi_pad16(a->head_dim_v);
    merge_job job = {a, cpi_cpu_state_tiles(s), malloc(floats * sizeof(float))};
    if (!job.scratch)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "cp_kernel_merge: out of memory (%zu bytes of scratch)",
                         floats * sizeof(float));
    cpi_cpu_parallel(s, threads, merge_task, &job);
    free(job.scratch);
    return CP_SUCCESS;
}
