/* SPDX-License-Identifier: MIT */
/* The agreement of a collective call: see agree.h. */
#include <stdio.h>
#include <string.h>

#include "comm/agree.h"
#include "comm/group.h"

/* Statuses that mean "the rank refused what it was given", as opposed to
 * failing to do it: its peers report a mismatch of arguments. */
static bool rejected_arguments(cp_status s)
{
    return s == CP_ERROR_INVALID_ARGUMENT || s == CP_ERROR_UNSUPPORTED || s == CP_ERROR_MISMATCH;
}

/* The message of a rank whose peer `origin` failed first. */
static cp_status peer_failed(const cpi_agree_call *k, int origin, cp_status s)
{
    if (rejected_arguments(s))
        return cpi_error(CP_ERROR_MISMATCH,
                         "%s: rank %d of %d rejected its arguments (%s; its cp_last_error() says which), so this "
                         "rank (%d) did not go on",
                         k->func, origin, k->comm->size, cp_status_string(s), k->comm->rank);
    return cpi_error(CP_ERROR_COMM, "%s: rank %d of %d failed before the call's exchanges (%s), so this rank (%d) "
                     "did not go on",
                     k->func, origin, k->comm->size, cp_status_string(s), k->comm->rank);
}

/* Can the verdict ride the descriptors of the call's first exchanges? Only
 * where each of their transports can stand a rejection in for a call
 * (cpi_transport_caps: the local one); fields need a real comparison. The
 * answer is the same on every rank. */
static bool folds(const cpi_agree_call *k)
{
    if (k->nfields > 0)
        return false;
    for (int i = 0; i < k->nfirst; i++) {
        const cpi_transport_caps *caps = k->first[i]->caps;
        if (!caps || !caps->reject || !caps->rejected)
            return false;
    }
    return true;
}

/* Stand in for the peers' next exchange on c: they all fail before any
 * byte moves. What this rank's own wait ends with does not matter. */
static void reject(const cpi_agree_call *k, cp_comm *c, cp_status s, int origin)
{
    (void)c->caps->reject(c->impl, k->timeout_ms, s, origin, k->comm->size);
}

/* Integers travel as exact doubles: 32-bit halves, each with its negation,
 * so that one MAX all-reduce yields every field's maximum and minimum. The
 * verdict goes first: (size - rank) * STATUS_SPAN + status of a failed
 * rank, 0 of a good one, so the maximum names the first failed rank. */
enum { HALVES = 2, STATUS_SPAN = 64 };

static void print_field(const cpi_agree_field *f, uint64_t v, char *buf, size_t cap)
{
    if (f->real) {
        double d;
        memcpy(&d, &v, sizeof d);
        snprintf(buf, cap, "%.17g", d);
    } else {
        snprintf(buf, cap, "%lld", (long long)v);
    }
}

static uint64_t join(double hi, double lo)
{
    return (uint64_t)hi << 32 | (uint64_t)lo;
}

static cp_status vote(cpi_agreement *a, cp_status local)
{
    const cpi_agree_call *k = &a->call;
    if (k->nfields < 0 || k->nfields > CPI_AGREE_MAX_FIELDS)
        return cpi_error(CP_ERROR_INTERNAL, "%s: %d fields to compare (at most %d)", k->func, k->nfields,
                         CPI_AGREE_MAX_FIELDS);
    const bool ok = local == CP_SUCCESS;
    const int m = HALVES * k->nfields;
    double v[1 + 2 * HALVES * CPI_AGREE_MAX_FIELDS];
    v[0] = ok ? 0.0 : (double)(k->comm->size - k->comm->rank) * STATUS_SPAN + (double)local;
    for (int i = 0; i < k->nfields; i++) {
        const uint64_t f = ok ? k->fields[i].value : 0;
        v[1 + HALVES * i] = (double)(f >> 32);
        v[2 + HALVES * i] = (double)(f & 0xffffffffu);
    }
    for (int i = 0; i < m; i++)
        v[1 + m + i] = -v[1 + i];
    cp_status s = cpi_all_reduce_host(k->ctx, k->comm, k->timeout_ms, v, (size_t)(1 + 2 * m), CP_REDUCE_MAX);
    if (!ok || s != CP_SUCCESS)
        return ok ? s : local;
    if (v[0] != 0.0) {
        const int q = (int)(v[0] / STATUS_SPAN);
        a->origin = k->comm->size - q;
        a->origin_status = (cp_status)(v[0] - (double)q * STATUS_SPAN);
        return peer_failed(k, a->origin, a->origin_status);
    }
    for (int i = 0; i < k->nfields; i++) {
        const double *hi = &v[1 + HALVES * i], *neg = &v[1 + m + HALVES * i];
        if (hi[0] == -neg[0] && hi[1] == -neg[1])
            continue;
        char mine[32], lo[32], top[32];
        print_field(&k->fields[i], k->fields[i].value, mine, sizeof mine);
        print_field(&k->fields[i], join(-neg[0], -neg[1]), lo, sizeof lo);
        print_field(&k->fields[i], join(hi[0], hi[1]), top, sizeof top);
        if (k->what)
            return cpi_error(CP_ERROR_MISMATCH, "%s: ranks pass different %s: %s from %s to %s (rank %d of %d: %s)",
                             k->func, k->what, k->fields[i].name, lo, top, k->comm->rank, k->comm->size, mine);
        return cpi_error(CP_ERROR_MISMATCH, "%s: ranks pass different %s (from %s to %s; rank %d of %d: %s)",
                         k->func, k->fields[i].name, lo, top, k->comm->rank, k->comm->size, mine);
    }
    return CP_SUCCESS;
}

cp_status cpi_agree_open(cpi_agreement *a, const cpi_agree_call *call, cp_status local)
{
    *a = (cpi_agreement){ .call = *call, .origin = -1 };
    cpi_agree_call *k = &a->call;
    if (k->nfirst == 0) {
        k->first[0] = k->comm;
        k->nfirst = 1;
    }
    if (k->comm->size == 1)
        return local; /* nobody waits */
    if (k->stream_only && k->ctx && k->ctx->device != CP_DEVICE_CPU && !folds(k))
        return local; /* no vote: it would wait for the stream (agree.h) */
    char why[512] = "";
    if (local != CP_SUCCESS)
        snprintf(why, sizeof why, "%s", cp_last_error());
    cp_status s;
    if (!folds(k)) {
        s = vote(a, local);
    } else if (local != CP_SUCCESS) {
        /* in the order the peers make those exchanges, so none waits on
         * another that waits for this rank */
        for (int i = 0; i < k->nfirst; i++)
            reject(k, k->first[i], local, k->comm->rank);
        s = local;
    } else {
        for (int i = 0; i < k->nfirst; i++) {
            k->first[i]->agreement = a;
            a->pending[i] = true;
        }
        s = CP_SUCCESS;
    }
    /* this rank's own reason comes first, whatever its waits said */
    return local != CP_SUCCESS ? cpi_error(local, "%s", why) : s;
}

void cpi_agree_exchanged(cp_comm *c, cp_status s)
{
    cpi_agreement *a = c->agreement;
    c->agreement = NULL; /* later exchanges of the call pay nothing */
    for (int i = 0; i < a->call.nfirst; i++)
        if (a->call.first[i] == c)
            a->pending[i] = false;
    int origin;
    cp_status os;
    /* c->agreement was set only where the call folds, so c has caps */
    if (s != CP_SUCCESS && a->origin < 0 && c->caps->rejected(c->impl, &origin, &os)) {
        a->origin = origin;
        a->origin_status = os;
    }
}

cp_status cpi_agree_close(cpi_agreement *a, cp_status s)
{
    const cpi_agree_call *k = &a->call;
    for (int i = 0; i < k->nfirst; i++)
        if (k->first[i]->agreement == a)
            k->first[i]->agreement = NULL;
    if (s == CP_SUCCESS)
        return s;
    char why[512];
    snprintf(why, sizeof why, "%s", cp_last_error());
    /* Peers still to make their first exchange on a communicator this rank
     * did not use would wait for it: they learn of the failure there, as
     * from the rank that failed first where this rank knows it. */
    const bool known = a->origin >= 0;
    for (int i = 0; i < k->nfirst; i++)
        if (a->pending[i]) {
            a->pending[i] = false;
            reject(k, k->first[i], known ? a->origin_status : s, known ? a->origin : k->comm->rank);
        }
    if (known)
        return peer_failed(k, a->origin, a->origin_status);
    return cpi_error(s, "%s", why);
}

cp_status cpi_agree_sum(const cpi_agree_call *k, cp_status local, double *v, size_t n)
{
    if (n > CPI_AGREE_MAX_SUM)
        return cpi_error(CP_ERROR_INTERNAL, "%s: %zu numbers to sum (at most %d)", k->func, n, CPI_AGREE_MAX_SUM);
    const bool ok = local == CP_SUCCESS;
    char why[512] = "";
    if (!ok)
        snprintf(why, sizeof why, "%s", cp_last_error());
    /* after the numbers: how many ranks failed, the sum of their ranks and
     * of their statuses (which name the rank when one failed) */
    double w[CPI_AGREE_MAX_SUM + 3];
    for (size_t i = 0; i < n; i++)
        w[i] = ok ? v[i] : 0.0;
    w[n] = ok ? 0.0 : 1.0;
    w[n + 1] = ok ? 0.0 : (double)k->comm->rank;
    w[n + 2] = ok ? 0.0 : (double)local;
    cp_status s = cpi_all_reduce_host(k->ctx, k->comm, k->timeout_ms, w, n + 3, CP_REDUCE_SUM);
    if (!ok)
        return cpi_error(local, "%s", why);
    if (s != CP_SUCCESS)
        return s;
    if (w[n] == 1.0)
        return peer_failed(k, (int)w[n + 1], (cp_status)w[n + 2]);
    if (w[n] != 0.0)
        return cpi_error(CP_ERROR_MISMATCH, "%s: %g ranks of %d failed before the call's exchanges (their "
                         "cp_last_error() says why), so this rank (%d) did not go on",
                         k->func, w[n], k->comm->size, k->comm->rank);
    for (size_t i = 0; i < n; i++)
        v[i] = w[i];
    return CP_SUCCESS;
}
