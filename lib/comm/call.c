/* SPDX-License-Identifier: MIT */
#include <stdio.h>

#include "comm/call.h"

cpi_call cpi_call_make(cpi_call_kind kind, uint64_t size, int dtype, int op)
{
    cpi_call c = { (int32_t)kind, 0, dtype, op, -1, -1, size, 0 };
    return c;
}

const char *cpi_call_name(int32_t kind)
{
    switch (kind) {
    case CPI_CALL_ALL_GATHER: return "all_gather";
    case CPI_CALL_REDUCE_SCATTER: return "reduce_scatter";
    case CPI_CALL_ALL_TO_ALL: return "all_to_all";
    case CPI_CALL_SENDRECV: return "sendrecv";
    case CPI_CALL_ALL_REDUCE: return "all_reduce";
    case CPI_CALL_BARRIER: return "barrier";
    case CPI_CALL_SPLIT: return "split";
    case CPI_CALL_ALL_TO_ALL_2D: return "all_to_all_2d";
    case CPI_CALL_REJECT: return "agreement";
    }
    return "unknown collective";
}

/* Element type names as the public enum spells them, without the prefix. */
static const char *dtype_name(int32_t t)
{
    static const char *const names[] = { "F32", "F16", "BF16", "F64" };
    return t >= 0 && t < 4 ? names[t] : "none";
}

static const char *op_name(int32_t op)
{
    return op == CP_REDUCE_SUM ? "sum" : op == CP_REDUCE_MAX ? "max" : "none";
}

/* sendrecv pairs: rank i receives from s = src(i), so s must send to i the
 * bytes i expects. That makes src injective, hence every send is received. */
static bool pairs_agree(const cpi_call *all, int n, char *why, size_t cap)
{
    for (int i = 0; i < n; i++) {
        int s = all[i].b, d = all[i].a;
        if (s < 0 || s >= n || d < 0 || d >= n) {
            snprintf(why, cap, "sendrecv: rank %d has dst = %d, src = %d (size %d)", i, d, s, n);
            return false;
        }
        if (all[s].a != i) {
            snprintf(why, cap, "sendrecv: rank %d receives from rank %d, which sends to rank %d", i, s,
                     all[s].a);
            return false;
        }
        if (all[s].size != all[i].recv) {
            snprintf(why, cap, "sendrecv: rank %d sends %llu bytes to rank %d, which expects %llu", s,
                     (unsigned long long)all[s].size, i, (unsigned long long)all[i].recv);
            return false;
        }
    }
    return true;
}

bool cpi_call_agree(const cpi_call *all, int n, char *why, size_t cap)
{
    const cpi_call *r = &all[0];
    for (int i = 1; i < n; i++) {
        const cpi_call *c = &all[i];
        if (c->kind != r->kind) {
            snprintf(why, cap, "rank 0 called %s, rank %d called %s", cpi_call_name(r->kind), i,
                     cpi_call_name(c->kind));
            return false;
        }
        if (r->kind == CPI_CALL_SENDRECV || r->kind == CPI_CALL_SPLIT || r->kind == CPI_CALL_BARRIER)
            continue; /* sizes and peers are per rank; pairs are checked below */
        if (c->dtype != r->dtype) {
            snprintf(why, cap, "%s: rank 0 passed dtype %s, rank %d dtype %s", cpi_call_name(r->kind),
                     dtype_name(r->dtype), i, dtype_name(c->dtype));
            return false;
        }
        if (c->op != r->op) {
            snprintf(why, cap, "%s: rank 0 passed op %s, rank %d op %s", cpi_call_name(r->kind),
                     op_name(r->op), i, op_name(c->op));
            return false;
        }
        if (c->size != r->size) {
            const char *what = r->dtype >= 0 ? "count" : r->kind == CPI_CALL_ALL_TO_ALL_2D ? "width" : "bytes";
            snprintf(why, cap, "%s: rank 0 passed %s = %llu, rank %d passed %llu", cpi_call_name(r->kind), what,
                     (unsigned long long)r->size, i, (unsigned long long)c->size);
            return false;
        }
        if (r->kind == CPI_CALL_ALL_TO_ALL_2D && c->recv != r->recv) {
            snprintf(why, cap, "%s: rank 0 passed rows = %llu, rank %d passed %llu", cpi_call_name(r->kind),
                     (unsigned long long)r->recv, i, (unsigned long long)c->recv);
            return false;
        }
    }
    if (r->kind == CPI_CALL_SENDRECV)
        return pairs_agree(all, n, why, cap);
    return true;
}

int cpi_call_failed_rank(const cpi_call *all, int n)
{
    for (int i = 0; i < n; i++)
        if (all[i].status != 0)
            return i;
    return -1;
}

int cpi_call_rejecting_rank(const cpi_call *all, int n)
{
    for (int i = 0; i < n; i++)
        if (all[i].kind == CPI_CALL_REJECT)
            return i;
    return -1;
}
