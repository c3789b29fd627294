/* SPDX-License-Identifier: MIT */
/* Visibility under API 1.1 (see vis.h). */
#include <stdlib.h>

#include "attn/vis.h"
#include "layout/pack.h"

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/*
 * Queries [*qa, *qb) and keys [*ka, *kb) of one document (both non-empty):
 * trim the keys to those some query sees, then the queries to those that
 * see one of them. No visible pair is lost: a key outside is seen by no
 * query, a query outside sees no kept key. False when nothing is visible.
 */
static bool trim(const cpi_vis *v, int64_t *qa, int64_t *qb, int64_t *ka, int64_t *kb)
{
    const int64_t W = v->window;
    int64_t k0 = *ka, k1 = *kb, q0, q1;
    if (v->causal) {
        /* key j is seen iff j <= i and (no window or j > i - W) for some i */
        k1 = min64(k1, *qb);
        if (W)
            k0 = max64(k0, *qa - W + 1);
        if (k0 >= k1)
            return false;
        q0 = max64(*qa, k0);
        q1 = W ? min64(*qb, k1 - 1 + W) : *qb;
    } else {
        if (W) {
            k0 = max64(k0, *qa - W + 1);
            k1 = min64(k1, *qb + W - 1);
        }
        if (k0 >= k1)
            return false;
        q0 = W ? max64(*qa, k0 - W + 1) : *qa;
        q1 = W ? min64(*qb, k1 + W - 1) : *qb;
    }
    if (q0 >= q1)
        return false;
    *qa = q0;
    *qb = q1;
    *ka = k0;
    *kb = k1;
    return true;
}

/* Calls fn(arg, document piece) for every document that spans q and k
 * share, with the pieces trimmed; stops at the first failure. */
typedef cp_status (*piece_fn)(void *arg, int64_t qa, int64_t qb, int64_t ka, int64_t kb);

static cp_status for_pieces(const cpi_vis *v, cpi_span q, cpi_span k, piece_fn fn, void *arg)
{
    const int64_t q_end = q.offset + q.len, k_end = k.offset + k.len;
    if (q.len <= 0 || k.len <= 0)
        return CP_SUCCESS;
    if (v->causal && k.offset >= q_end)
        return CP_SUCCESS; /* every key after every query */
    if (!v->cu || v->ndocs <= 1) {
        int64_t qa = q.offset, qb = q_end, ka = k.offset, kb = k_end;
        return trim(v, &qa, &qb, &ka, &kb) ? fn(arg, qa, qb, ka, kb) : CP_SUCCESS;
    }
    /* the documents both spans meet */
    const int d0 = (int)max64(cpi_pack_doc_of(v->cu, v->ndocs, q.offset), cpi_pack_doc_of(v->cu, v->ndocs, k.offset));
    const int d1 = (int)min64(cpi_pack_doc_of(v->cu, v->ndocs, q_end - 1), cpi_pack_doc_of(v->cu, v->ndocs, k_end - 1));
    for (int d = d0; d <= d1; d++) {
        int64_t qa = max64(q.offset, v->cu[d]), qb = min64(q_end, v->cu[d + 1]);
        int64_t ka = max64(k.offset, v->cu[d]), kb = min64(k_end, v->cu[d + 1]);
        if (qa >= qb || ka >= kb || !trim(v, &qa, &qb, &ka, &kb))
            continue;
        CPI_TRY(fn(arg, qa, qb, ka, kb));
    }
    return CP_SUCCESS;
}

typedef struct rect_list {
    cp_attn_rect *r;
    int64_t n, cap;
    int64_t q_row0, q_off, k_row0, k_off; /* the current spans: row of position p is row0 + p - off */
} rect_list;

static cp_status add_rect(void *arg, int64_t qa, int64_t qb, int64_t ka, int64_t kb)
{
    rect_list *l = arg;
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 16;
        cp_attn_rect *r = realloc(l->r, (size_t)cap * sizeof *r);
        if (!r)
            return cpi_error(CP_ERROR_OUT_OF_MEMORY, "out of memory listing %lld attention rectangles",
                             (long long)cap);
        l->r = r;
        l->cap = cap;
    }
    l->r[l->n++] = (cp_attn_rect){ .q_row = l->q_row0 + (qa - l->q_off),
                                   .q_len = qb - qa,
                                   .k_row = l->k_row0 + (ka - l->k_off),
                                   .k_len = kb - ka,
                                   .q_pos = qa,
                                   .k_pos = ka };
    return CP_SUCCESS;
}

cp_status cpi_vis_rects(const cpi_vis *v, const cpi_tokset *tq, const cpi_tokset *tk, cp_attn_rect **rects,
                        int64_t *n)
{
    rect_list l = { 0 };
    cp_status s = CP_SUCCESS;
    for (int i = 0; i < tq->nspans && s == CP_SUCCESS; i++)
        for (int j = 0; j < tk->nspans && s == CP_SUCCESS; j++) {
            l.q_row0 = tq->row[i];
            l.q_off = tq->span[i].offset;
            l.k_row0 = tk->row[j];
            l.k_off = tk->span[j].offset;
            s = for_pieces(v, tq->span[i], tk->span[j], add_rect, &l);
        }
    if (s != CP_SUCCESS) {
        free(l.r);
        l.r = NULL;
        l.n = 0;
    }
    *rects = l.r;
    *n = l.n;
    return s;
}

typedef struct cover {
    int64_t lo, hi;
} cover;

static cp_status add_cover(void *arg, int64_t qa, int64_t qb, int64_t ka, int64_t kb)
{
    (void)qa;
    (void)qb;
    cover *c = arg;
    if (c->lo >= c->hi) {
        c->lo = ka;
        c->hi = kb;
    } else {
        c->lo = min64(c->lo, ka);
        c->hi = max64(c->hi, kb);
    }
    return CP_SUCCESS;
}

void cpi_vis_seen(const cpi_vis *v, const cpi_tokset *tq, cpi_span k, int64_t *lo, int64_t *hi)
{
    cover c = { 0, 0 };
    for (int i = 0; i < tq->nspans; i++)
        for_pieces(v, tq->span[i], k, add_cover, &c);
    *lo = c.lo;
    *hi = c.hi;
}
