/* SPDX-License-Identifier: MIT */
/*
 * cp_pack against models written here from DESIGN.md section 5: every rank
 * holds exactly T/P tokens in increasing row order, the ranks together hold
 * the row once; positions, document positions and ids per token, the work
 * of a rank counted pair by pair, the textbook CONTIGUOUS and DOC_ZIGZAG
 * splits, GREEDY's balance on random mixes (the targets), the
 * errors, and shard + gather on ranks of one process.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "layout/pack.h"
#include "testutil.h"
#include "world.h"

/* ---- documents ------------------------------------------------------------ */

static uint64_t next_u64(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) /* in (0, 1] */
{
    return ((double)(next_u64(s) >> 11) + 1) * 0x1p-53;
}

/* A row of n documents: cu[0 .. n]. */
typedef struct docs {
    int64_t cu[4097];
    int n;
} docs;

static void docs_from_lengths(docs *d, const int64_t *len, int n)
{
    d->n = n;
    d->cu[0] = 0;
    for (int i = 0; i < n; i++)
        d->cu[i + 1] = d->cu[i] + len[i];
}

/* Lengths drawn by draw() until T tokens, the last cut to fit. */
static void docs_random(docs *d, int64_t T, uint64_t *rng, int64_t (*draw)(uint64_t *, double), double mean)
{
    d->n = 0;
    d->cu[0] = 0;
    while (d->cu[d->n] < T && d->n < 4096) {
        int64_t len = draw(rng, mean);
        len = len < 1 ? 1 : len > T - d->cu[d->n] ? T - d->cu[d->n] : len;
        d->cu[d->n + 1] = d->cu[d->n] + len;
        d->n++;
    }
    assert_int_equal(d->cu[d->n], T);
}

static int64_t draw_uniform(uint64_t *s, double mean)
{
    return 1 + (int64_t)(next_u64(s) % (uint64_t)(2 * mean));
}

static int64_t draw_lognormal_1(uint64_t *s, double mean) /* sigma 1 */
{
    const double z = sqrt(-2 * log(uniform01(s))) * cos(2 * M_PI * uniform01(s));
    return (int64_t)llround(exp(log(mean) - 0.5 + z));
}

static int64_t draw_lognormal_2(uint64_t *s, double mean) /* sigma 2: a few very long documents */
{
    const double z = sqrt(-2 * log(uniform01(s))) * cos(2 * M_PI * uniform01(s));
    return (int64_t)llround(exp(log(mean) - 2 + 2 * z));
}

static cp_pack_config config(const docs *d, int P, cp_balance b)
{
    cp_pack_config c = CP_PACK_CONFIG_INIT;
    c.cp_size = P;
    c.cu_seqlens = d->cu;
    c.num_seqs = d->n;
    c.balance = b;
    return c;
}

static cp_pack *create(const cp_pack_config *c)
{
    cp_pack *pk = NULL;
    cp_status s = cp_pack_create(c, &pk);
    if (s != CP_SUCCESS)
        fail_msg("cp_pack_create: %s", cp_last_error());
    return pk;
}

/* ---- the models --------------------------------------------------------- */

static int model_doc(const docs *d, int64_t p)
{
    int i = 0;
    while (d->cu[i + 1] <= p)
        i++;
    return i;
}

/* Visible keys of the query at row position i, counted key by key. */
static int64_t model_keys(const docs *d, cp_mask mask, int64_t W, int64_t i)
{
    const int k = model_doc(d, i);
    int64_t n = 0;
    for (int64_t j = d->cu[k]; j < d->cu[k + 1]; j++) {
        const int64_t gap = i - j;
        if (mask == CP_MASK_CAUSAL)
            n += gap >= 0 && (W == 0 || gap < W);
        else
            n += W == 0 || (gap < W && -gap < W);
    }
    return n;
}

/* Every rank's positions, ids and document positions against the row: each
 * rank T/P tokens, shared pieces first; every token once; the runs coalesced. */
static void check_split(const docs *d, const cp_pack *pk, int P)
{
    const int64_t T = d->cu[d->n], n = T / P;
    int *seen = calloc((size_t)T, sizeof *seen);
    int64_t *pos = malloc((size_t)n * sizeof *pos), *dpos = malloc((size_t)n * sizeof *dpos);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    assert_true(seen && pos && dpos && ids);
    assert_int_equal(pk->cp_size, P);
    assert_int_equal(pk->T, T);
    assert_int_equal(pk->s_loc, n);
    assert_true(pk->balance != CP_BALANCE_AUTO);
    assert_true(pk->balance == CP_BALANCE_GREEDY ? pk->chunk >= 1 && n % pk->chunk == 0 : pk->chunk == 0);
    for (int r = 0; r < P; r++) {
        assert_int_equal(cp_pack_positions(pk, r, pos, dpos, ids), CP_SUCCESS);
        /* local order: the pieces of documents other ranks also hold, then
         * the documents wholly here, each group increasing along the row */
        int64_t *here = calloc((size_t)d->n, sizeof *here);
        assert_non_null(here);
        for (int64_t i = 0; i < n; i++)
            here[model_doc(d, pos[i])]++;
        int in_local = 0;
        for (int64_t i = 0; i < n; i++) {
            const int k = model_doc(d, pos[i]);
            const int whole = here[k] == d->cu[k + 1] - d->cu[k];
            assert_true(whole || !in_local); /* no shared piece after the local group began */
            if (i && whole == in_local)
                assert_true(pos[i] > pos[i - 1]);
            in_local = whole;
        }
        free(here);
        for (int64_t i = 0; i < n; i++) {
            assert_true(pos[i] >= 0 && pos[i] < T);
            seen[pos[i]]++;
            const int k = model_doc(d, pos[i]);
            assert_int_equal(ids[i], k);
            assert_int_equal(dpos[i], pos[i] - d->cu[k]);
        }
        /* the runs: T/P tokens, none empty, coalesced within each group */
        const cpi_span *runs;
        const int nr = cpi_pack_runs(pk, r, &runs);
        int64_t tokens = 0;
        int touching = 0; /* only where the local group begins */
        for (int i = 0; i < nr; i++) {
            assert_true(runs[i].len >= 1);
            touching += i && runs[i].offset == runs[i - 1].offset + runs[i - 1].len;
            tokens += runs[i].len;
        }
        assert_true(touching <= 1);
        assert_int_equal(tokens, n);
        assert_int_equal(runs[0].offset, pos[0]);
    }
    for (int64_t p = 0; p < T; p++)
        assert_int_equal(seen[p], 1);
    free(seen);
    free(pos);
    free(dpos);
    free(ids);
}

/* Each rank's work against the pair-by-pair count, for the pack's mask and
 * window; their sum is every visible pair of the row. */
static void check_work(const docs *d, const cp_pack *pk, int P)
{
    const int64_t n = d->cu[d->n] / P;
    int64_t *pos = malloc((size_t)n * sizeof *pos);
    assert_non_null(pos);
    for (int r = 0; r < P; r++) {
        double got;
        assert_int_equal(cp_pack_work(pk, r, &got), CP_SUCCESS);
        assert_int_equal(cp_pack_positions(pk, r, pos, NULL, NULL), CP_SUCCESS);
        int64_t want = 0;
        for (int64_t i = 0; i < n; i++)
            want += model_keys(d, pk->mask, pk->window, pos[i]);
        if (got != (double)want)
            fail_msg("rank %d of %d, mask %d, window %lld: cp_pack_work = %.0f, pairs counted = %lld", r, P,
                     (int)pk->mask, (long long)pk->window, got, (long long)want);
    }
    free(pos);
}

/* ---- the splits ------------------------------------------------------------ */

/* Rows that test the edges: length-1 documents, one document, documents
 * that end at every chunk boundary or inside every chunk, random ones. All
 * have T = 768 tokens but the last, whose lengths 64, 128, ..., 384 allow
 * DOC_ZIGZAG up to P = 32 (T = 1344). */
static int edge_rows(docs *rows)
{
    int nr = 0;
    int64_t len[1024];
    for (int i = 0; i < 768; i++)
        len[i] = 1;
    docs_from_lengths(&rows[nr++], len, 768); /* every document one token */
    len[0] = 768;
    docs_from_lengths(&rows[nr++], len, 1); /* one document spans it all */
    for (int i = 0; i < 48; i++)
        len[i] = 16;
    docs_from_lengths(&rows[nr++], len, 48); /* every chunk boundary a document boundary */
    for (int i = 0; i < 95; i++)
        len[i] = i % 2 ? 1 : 15;
    len[95] = 1;
    docs_from_lengths(&rows[nr++], len, 96); /* boundaries inside every chunk */
    uint64_t rng = 11;
    docs_random(&rows[nr++], 768, &rng, draw_lognormal_1, 60);
    docs_random(&rows[nr++], 768, &rng, draw_lognormal_2, 200);
    docs_random(&rows[nr++], 768, &rng, draw_uniform, 20);
    for (int i = 0; i < 6; i++)
        len[i] = 16 * (i + 1) * 4;
    docs_from_lengths(&rows[nr++], len, 6); /* every length a multiple of 2P for P <= 8 */
    return nr;
}

static void test_every_policy_partitions_the_row(void **state)
{
    (void)state;
    static docs rows[8];
    const int nr = edge_rows(rows);
    static const cp_balance policies[] = { CP_BALANCE_AUTO, CP_BALANCE_DOC_ZIGZAG, CP_BALANCE_GREEDY,
                                           CP_BALANCE_CONTIGUOUS };
    static const int sizes[] = { 1, 2, 3, 4, 8, 16 };
    for (int i = 0; i < nr; i++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int pi = 0; pi < 4; pi++) {
                const int P = sizes[si];
                const docs *d = &rows[i];
                if (d->cu[d->n] % P)
                    continue;
                bool zz_ok = true;
                for (int k = 0; k < d->n; k++)
                    zz_ok &= (d->cu[k + 1] - d->cu[k]) % (2 * P) == 0;
                if (policies[pi] == CP_BALANCE_DOC_ZIGZAG && !zz_ok)
                    continue;
                cp_pack_config c = config(d, P, policies[pi]);
                for (int64_t chunk = 0; chunk <= 4; chunk += 4) { /* the default, and 4 */
                    c.chunk = chunk;
                    cp_pack *pk = create(&c);
                    check_split(d, pk, P);
                    check_work(d, pk, P);
                    cp_pack_destroy(pk);
                }
            }
}

/* cpi_pack_pairs on arbitrary ranges, every mask and window, against the
 * pair-by-pair count. */
static void test_pairs_closed_form(void **state)
{
    (void)state;
    static docs rows[8];
    const int nr = edge_rows(rows);
    static const int64_t windows[] = { 0, 1, 2, 7, 100, 100000 };
    uint64_t rng = 5;
    for (int i = 0; i < nr; i++) {
        const docs *d = &rows[i];
        const int64_t T = d->cu[d->n];
        for (int m = 0; m < 2; m++)
            for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
                const cp_mask mask = m ? CP_MASK_CAUSAL : CP_MASK_NONE;
                int64_t *keys = malloc((size_t)T * sizeof *keys);
                assert_non_null(keys);
                for (int64_t p = 0; p < T; p++)
                    keys[p] = model_keys(d, mask, windows[wi], p);
                for (int t = 0; t < 40; t++) {
                    int64_t a = (int64_t)(next_u64(&rng) % (uint64_t)T), b = (int64_t)(next_u64(&rng) % (uint64_t)T);
                    if (a > b) {
                        const int64_t x = a;
                        a = b;
                        b = x;
                    }
                    b++;
                    int64_t want = 0;
                    for (int64_t p = a; p < b; p++)
                        want += keys[p];
                    const double got = cpi_pack_pairs(d->cu, d->n, mask, windows[wi], a, b);
                    if (got != (double)want)
                        fail_msg("row %d, mask %d, window %lld, [%lld, %lld): %.0f pairs, counted %lld", i, m,
                                 (long long)windows[wi], (long long)a, (long long)b, got, (long long)want);
                }
                free(keys);
            }
    }
    /* huge documents: exact where the pairs fit a double's 53 bits */
    const int64_t big[2] = { 0, (int64_t)1 << 26 };
    assert_true(cpi_pack_pairs(big, 1, CP_MASK_CAUSAL, 0, 0, big[1]) ==
                (double)(big[1] * (big[1] + 1) / 2));
    assert_true(cpi_pack_pairs(big, 1, CP_MASK_NONE, 0, 0, big[1]) == (double)big[1] * (double)big[1]);
}

/* Work under every mask and window, on every policy's split. */
static void test_work_counts_every_pair(void **state)
{
    (void)state;
    static docs rows[8];
    const int nr = edge_rows(rows);
    static const int64_t windows[] = { 0, 1, 7, 1000000 };
    for (int i = 0; i < nr; i++)
        for (int m = 0; m < 2; m++)
            for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
                cp_pack_config c = config(&rows[i], 4, CP_BALANCE_GREEDY);
                c.mask = m ? CP_MASK_CAUSAL : CP_MASK_NONE;
                c.window = windows[wi];
                cp_pack *pk = create(&c);
                assert_int_equal(pk->mask, c.mask);
                assert_int_equal(pk->window, c.window);
                check_split(&rows[i], pk, 4);
                check_work(&rows[i], pk, 4);
                cp_pack_destroy(pk);
            }
}

static int cmp_i64(const void *x, const void *y)
{
    const int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

static void test_contiguous_and_doc_zigzag_are_the_textbook_splits(void **state)
{
    (void)state;
    static docs rows[8];
    const int nr = edge_rows(rows);
    const docs *d = &rows[nr - 1]; /* lengths 64, 128, ..., 384 */
    const int64_t T = d->cu[d->n];
    for (int P = 1; P <= 8; P *= 2) {
        const int64_t n = T / P;
        int64_t *pos = malloc((size_t)n * sizeof *pos), *want = malloc((size_t)n * sizeof *want);
        assert_true(pos && want);
        cp_pack_config c = config(d, P, CP_BALANCE_CONTIGUOUS);
        cp_pack *pk = create(&c);
        for (int r = 0; r < P; r++) {
            assert_int_equal(cp_pack_positions(pk, r, pos, NULL, NULL), CP_SUCCESS);
            qsort(pos, (size_t)n, sizeof *pos, cmp_i64); /* the tokens; their order is check_split's */
            for (int64_t i = 0; i < n; i++)
                assert_int_equal(pos[i], r * n + i);
        }
        cp_pack_destroy(pk);
        /* each document in 2P chunks, rank r holding chunks r and 2P-1-r */
        c.balance = CP_BALANCE_DOC_ZIGZAG;
        pk = create(&c);
        for (int r = 0; r < P; r++) {
            int64_t w = 0;
            for (int k = 0; k < d->n; k++) {
                const int64_t len = (d->cu[k + 1] - d->cu[k]) / (2 * P);
                for (int64_t j = 0; j < 2 * P; j++)
                    if (j == r || j == 2 * P - 1 - r)
                        for (int64_t t = 0; t < len; t++)
                            want[w++] = d->cu[k] + j * len + t;
            }
            assert_int_equal(w, n);
            assert_int_equal(cp_pack_positions(pk, r, pos, NULL, NULL), CP_SUCCESS);
            assert_memory_equal(pos, want, (size_t)n * sizeof *pos);
        }
        cp_pack_destroy(pk);
        free(pos);
        free(want);
    }
}

static void test_equal_configs_give_equal_packs(void **state)
{
    (void)state;
    uint64_t rng = 99;
    docs *d = malloc(sizeof *d), *e = malloc(sizeof *e);
    assert_true(d && e);
    docs_random(d, 8192, &rng, draw_lognormal_1, 300);
    for (int pi = 0; pi < 4; pi++) {
        const cp_balance b = (cp_balance)pi;
        if (b == CP_BALANCE_DOC_ZIGZAG)
            continue;
        cp_pack_config c = config(d, 8, b);
        cp_pack *p1 = create(&c), *p2 = create(&c);
        assert_true(p1->id != 0 && p2->id != 0 && p1->id != p2->id);
        assert_int_equal(p1->hash, p2->hash);
        assert_int_equal(p1->balance, p2->balance);
        assert_memory_equal(p1->run_first, p2->run_first, 9 * sizeof *p1->run_first);
        assert_memory_equal(p1->runs, p2->runs, (size_t)p1->run_first[8] * sizeof *p1->runs);
        /* another row of the same length, or another group size: another hash */
        *e = *d;
        e->cu[1] += e->cu[1] + 1 < e->cu[2] ? 1 : 0;
        e->cu[1] -= e->cu[1] == d->cu[1] ? 1 : 0;
        cp_pack_config ce = config(e, 8, b);
        cp_pack *q = create(&ce);
        assert_true(q->hash != p1->hash);
        cp_pack_destroy(q);
        c.cp_size = 4;
        q = create(&c);
        assert_true(q->hash != p1->hash);
        cp_pack_destroy(q);
        cp_pack_destroy(p1);
        cp_pack_destroy(p2);
    }
    /* a different split of the same row: GREEDY at another chunk */
    cp_pack_config c = config(d, 8, CP_BALANCE_GREEDY);
    cp_pack *p1 = create(&c);
    c.chunk = 8;
    cp_pack *p2 = create(&c);
    assert_true(p1->hash != p2->hash);
    cp_pack_destroy(p1);
    cp_pack_destroy(p2);
    free(d);
    free(e);
}

static void test_default_chunk_and_auto(void **state)
{
    (void)state;
    static const struct {
        int64_t T;
        int P;
        int64_t chunk;
    } cases[] = {
        { 1 << 17, 8, 128 }, /* 16384 per rank: 128 leaves 128 chunks */
        { 2048 * 8, 8, 128 }, /* 2048 per rank: 16 chunks */
        { 1024 * 8, 8, 64 },  /* 1024: 128 would leave 8 */
        { 96 * 4, 4, 4 },     /* 96 = 2^5 * 3: 4 leaves 24, 8 leaves 12 */
        { 15 * 4, 4, 1 },     /* fewer than 16 tokens per rank */
        { 17 * 3, 3, 1 },     /* odd */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t cu[2] = { 0, cases[i].T };
        cp_pack_config c = CP_PACK_CONFIG_INIT;
        c.cp_size = cases[i].P;
        c.cu_seqlens = cu;
        c.num_seqs = 1;
        c.balance = CP_BALANCE_GREEDY;
        cp_pack *pk = create(&c);
        assert_int_equal(pk->chunk, cases[i].chunk);
        cp_pack_destroy(pk);
    }
    /* AUTO: one document without a mask is even in any split, and
     * CONTIGUOUS splits it least; under the causal mask it is not */
    const int64_t one[2] = { 0, 4096 };
    cp_pack_config c = CP_PACK_CONFIG_INIT;
    c.cp_size = 8;
    c.cu_seqlens = one;
    c.num_seqs = 1;
    c.mask = CP_MASK_NONE;
    cp_pack *pk = create(&c);
    assert_int_equal(pk->balance, CP_BALANCE_CONTIGUOUS);
    cp_pack_destroy(pk);
    c.mask = CP_MASK_CAUSAL;
    pk = create(&c);
    assert_int_equal(pk->balance, CP_BALANCE_GREEDY);
    assert_int_equal(pk->chunk, 32);
    cp_pack_destroy(pk);
    /* many short documents: every rank has the same work in CONTIGUOUS */
    static docs d;
    int64_t len[512];
    for (int i = 0; i < 512; i++)
        len[i] = 8;
    docs_from_lengths(&d, len, 512);
    c = config(&d, 8, CP_BALANCE_AUTO);
    pk = create(&c);
    assert_int_equal(pk->balance, CP_BALANCE_CONTIGUOUS);
    cp_pack_destroy(pk);
}

/* The targets: max / mean work at most 1.05 at P = 8 and 1.10 at
 * P = 32 on every mix whose mean document length is at least T / (8P),
 * causal without a window; windows and no mask held to 1.10 as well. */
static void test_greedy_balance(void **state)
{
    (void)state;
    const int64_t T = 32768;
    static const int sizes[] = { 8, 32 };
    static const double targets[] = { 1.05, 1.10 };
    static const struct {
        cp_mask mask;
        int64_t window;
    } kinds[] = { { CP_MASK_CAUSAL, 0 }, { CP_MASK_CAUSAL, 256 }, { CP_MASK_CAUSAL, 4096 }, { CP_MASK_NONE, 0 },
                  { CP_MASK_NONE, 512 } };
    int64_t (*const draws[])(uint64_t *, double) = { draw_lognormal_1, draw_lognormal_2, draw_uniform };
    docs *d = malloc(sizeof *d);
    assert_non_null(d);
    for (int si = 0; si < 2; si++) {
        const int P = sizes[si];
        double worst[5] = { 0 };
        for (int t = 0; t < 24; t++) {
            uint64_t rng = 1000 + (uint64_t)(t * 31 + P);
            const double mean = (double)T / (8 * P) * (double)(1 << (t % 5)); /* T/(8P) .. 16 T/(8P) */
            docs_random(d, T, &rng, draws[t % 3], mean);
            for (int ki = 0; ki < 5; ki++) {
                cp_pack_config c = config(d, P, CP_BALANCE_GREEDY);
                c.mask = kinds[ki].mask;
                c.window = kinds[ki].window;
                cp_pack *pk = create(&c);
                double top = 0, sum = 0;
                for (int r = 0; r < P; r++) {
                    double w;
                    assert_int_equal(cp_pack_work(pk, r, &w), CP_SUCCESS);
                    top = w > top ? w : top;
                    sum += w;
                }
                const double imbalance = top / (sum / P);
                worst[ki] = imbalance > worst[ki] ? imbalance : worst[ki];
                if (imbalance > targets[si])
                    fail_msg("P = %d, mix %d (%d documents, mean length %.0f), mask %d window %lld: max / mean "
                             "work %.4f (target %.2f)",
                             P, t, d->n, (double)T / d->n, (int)c.mask, (long long)c.window, imbalance,
                             targets[si]);
                cp_pack_destroy(pk);
            }
        }
        print_message("P = %d: worst max / mean work: causal %.4f, window 256 %.4f, window 4096 %.4f, no mask "
                      "%.4f, no mask window 512 %.4f\n",
                      P, worst[0], worst[1], worst[2], worst[3], worst[4]);
    }
    free(d);
}

/* ---- errors ----------------------------------------------------------------- */

static void test_bad_configs(void **state)
{
    (void)state;
    const cp_status E = CP_ERROR_INVALID_ARGUMENT;
    int64_t cu[5] = { 0, 16, 40, 40, 64 };
    cp_pack *pk = (cp_pack *)cu;
    cp_pack_config c = CP_PACK_CONFIG_INIT;
    c.cp_size = 4;
    c.cu_seqlens = cu;
    c.num_seqs = 4;
    EXPECT_ERROR(cp_pack_create(&c, &pk), E,
                 "cp_pack_create: cfg->cu_seqlens[3] = 40 is not greater than cfg->cu_seqlens[2] = 40");
    assert_null(pk);
    c.num_seqs = 2;
    EXPECT_ERROR(cp_pack_create(NULL, &pk), E, "cp_pack_create: cfg is NULL");
    EXPECT_ERROR(cp_pack_create(&c, NULL), E, "cp_pack_create: out is NULL");
    cp_pack_config b = c;
    b.struct_size = 8;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->struct_size = 8");
    b = c, b.cp_size = 0;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->cp_size = 0 (must be >= 1)");
    b = c, b.num_seqs = 0;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->num_seqs = 0 (must be >= 1)");
    b = c, b.cu_seqlens = NULL;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->cu_seqlens is NULL");
    int64_t from1[3] = { 1, 16, 40 };
    b = c, b.cu_seqlens = from1;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->cu_seqlens[0] = 1 (must be 0)");
    int64_t down[3] = { 0, 16, -8 };
    b = c, b.cu_seqlens = down;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->cu_seqlens[2] = -8 is not greater than cfg->cu_seqlens[1] = 16");
    b = c, b.cp_size = 3;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->cu_seqlens[2] = 40 is not divisible by cfg->cp_size = 3");
    b = c, b.mask = (cp_mask)5;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->mask = 5");
    b = c, b.window = -1;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->window = -1 (must be >= 0");
    b = c, b.balance = (cp_balance)4;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->balance = 4");
    b = c, b.chunk = -2;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->chunk = -2 (must be >= 0");
    b = c, b.balance = CP_BALANCE_GREEDY, b.chunk = 3;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->chunk = 3 does not divide T / cp_size = 40 / 4 = 10");
    b.balance = CP_BALANCE_AUTO;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "cfg->chunk = 3 does not divide");
    int64_t odd[4] = { 0, 16, 36, 64 };
    b = c, b.cu_seqlens = odd, b.num_seqs = 3, b.balance = CP_BALANCE_DOC_ZIGZAG;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "2 * cfg->cp_size = 8: document 1 has length 20");
    /* a chunk that divides, but more chunks than the pack indexes */
    int64_t huge[2] = { 0, (int64_t)1 << 40 };
    b = c, b.cu_seqlens = huge, b.num_seqs = 1, b.balance = CP_BALANCE_GREEDY, b.chunk = 1;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "chunks (at most INT_MAX");
    /* more positions per rank than the address space holds */
    int64_t top[2] = { 0, INT64_MAX - 7 };
    b = c, b.cu_seqlens = top, b.num_seqs = 1, b.cp_size = 1, b.balance = CP_BALANCE_CONTIGUOUS;
    EXPECT_ERROR(cp_pack_create(&b, &pk), E, "tokens per rank overflow the address space");
    assert_null(pk);
    cp_pack_destroy(NULL);
}

static void test_bad_calls(void **state)
{
    (void)state;
    const cp_status E = CP_ERROR_INVALID_ARGUMENT;
    const int64_t cu[3] = { 0, 24, 64 };
    cp_pack_config c = CP_PACK_CONFIG_INIT;
    c.cp_size = 4;
    c.cu_seqlens = cu;
    c.num_seqs = 2;
    cp_pack *pk = create(&c);
    int64_t pos[17];
    int32_t ids[17];
    double w;
    EXPECT_ERROR(cp_pack_positions(NULL, 0, pos, NULL, NULL), E, "cp_pack_positions: pk is NULL");
    EXPECT_ERROR(cp_pack_positions(pk, 4, pos, NULL, NULL), E, "cp_pack_positions: cp_rank = 4 (must be in [0, 4))");
    EXPECT_ERROR(cp_pack_positions(pk, -1, pos, NULL, NULL), E, "cp_rank = -1");
    EXPECT_ERROR(cp_pack_positions(pk, 0, NULL, NULL, NULL), E, "positions, doc_positions and doc_ids are all NULL");
    EXPECT_ERROR(cp_pack_positions(pk, 0, (int64_t *)((char *)pos + 4), NULL, NULL), E,
                 "positions = 0x");
    EXPECT_ERROR(cp_pack_positions(pk, 0, NULL, (int64_t *)((char *)pos + 2), NULL), E, "doc_positions = 0x");
    EXPECT_ERROR(cp_pack_positions(pk, 0, NULL, NULL, (int32_t *)((char *)ids + 1)), E, "doc_ids = 0x");
    assert_int_equal(cp_pack_positions(pk, 3, NULL, NULL, ids), CP_SUCCESS);
    EXPECT_ERROR(cp_pack_work(NULL, 0, &w), E, "cp_pack_work: pk is NULL");
    EXPECT_ERROR(cp_pack_work(pk, 9, &w), E, "cp_pack_work: cp_rank = 9");
    EXPECT_ERROR(cp_pack_work(pk, 0, NULL), E, "cp_pack_work: pairs is NULL");

    cp_context *ctx;
    assert_int_equal(cp_context_create(NULL, &ctx), CP_SUCCESS);
    char global[64 * 4], local[16 * 4];
    EXPECT_ERROR(cp_pack_shard(NULL, pk, 0, global, local, 4), E, "cp_pack_shard: ctx is NULL");
    EXPECT_ERROR(cp_pack_shard(ctx, NULL, 0, global, local, 4), E, "cp_pack_shard: pk is NULL");
    EXPECT_ERROR(cp_pack_shard(ctx, pk, 4, global, local, 4), E, "cp_pack_shard: cp_rank = 4");
    EXPECT_ERROR(cp_pack_shard(ctx, pk, 0, NULL, local, 4), E, "cp_pack_shard: global is NULL");
    EXPECT_ERROR(cp_pack_shard(ctx, pk, 0, global, NULL, 4), E, "cp_pack_shard: local is NULL");
    EXPECT_ERROR(cp_pack_shard(ctx, pk, 0, global, local, 0), E, "cp_pack_shard: token_bytes = 0");
    EXPECT_ERROR(cp_pack_shard(ctx, pk, 0, global, global + 8, 4), E, "overlaps global");
    EXPECT_ERROR(cp_pack_shard(ctx, pk, 0, global, local, SIZE_MAX / 8), E, "overflows the address space");
    cp_context_destroy(ctx);
    cp_pack_destroy(pk);
}

/* ---- shard and gather on ranks of one process --------------------------------- */

#define RANKS 4

typedef enum gather_case {
    ROUND_TRIP,     /* every rank shards, gathers, and gets the row back */
    OTHER_PACK,     /* rank 1 passes a pack of another split */
    OTHER_BYTES,    /* rank 2 passes another token_bytes */
    NULL_LOCAL,     /* rank 3 passes local = NULL */
} gather_case;

typedef struct gather_world {
    gather_case what;
    const docs *d;
    cp_balance balance;
    size_t token_bytes;
    cp_status status[RANKS];
    char error[RANKS][300];
} gather_world;

static unsigned char pattern(int64_t p, size_t byte)
{
    uint64_t x = (uint64_t)p * 7919u + byte * 31u + 17u;
    x ^= x >> 13;
    x *= 0x9e3779b97f4a7c15ull;
    return (unsigned char)(x >> 56);
}

static void gather_rank(world_rank *r, void *arg)
{
    gather_world *gw = arg;
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.timeout_ms = 20000;
    const fixture_cfg fc = { .group = &gc };
    if (fixture_open(r, &fc) != CP_SUCCESS)
        return;
    const size_t tb = gw->token_bytes + (gw->what == OTHER_BYTES && r->rank == 2);
    const int64_t T = gw->d->cu[gw->d->n];
    cp_pack_config c = config(gw->d, RANKS, gw->balance);
    if (gw->what == OTHER_PACK && r->rank == 1)
        c.balance = c.balance == CP_BALANCE_CONTIGUOUS ? CP_BALANCE_GREEDY : CP_BALANCE_CONTIGUOUS;
    cp_pack *pk = NULL;
    if (world_fail(r, cp_pack_create(&c, &pk), "cp_pack_create") != CP_SUCCESS)
        return;
    unsigned char *global = malloc((size_t)T * tb), *local = malloc((size_t)T / RANKS * tb);
    unsigned char *back = calloc((size_t)T, tb);
    if (!global || !local || !back) {
        world_fail(r, CP_ERROR_OUT_OF_MEMORY, "malloc");
    } else {
        for (int64_t p = 0; p < T; p++)
            for (size_t b = 0; b < tb; b++)
                global[p * tb + b] = pattern(p, b);
        cp_status s = cp_pack_shard(r->fx.ctx, pk, r->rank, global, local, tb);
        if (world_fail(r, s, "cp_pack_shard") == CP_SUCCESS) {
            s = cp_pack_gather(r->fx.group, pk, gw->what == NULL_LOCAL && r->rank == 3 ? NULL : local, back, tb);
            gw->status[r->rank] = s;
            snprintf(gw->error[r->rank], sizeof gw->error[r->rank], "%s", s ? cp_last_error() : "");
            if (gw->what == ROUND_TRIP && world_fail(r, s, "cp_pack_gather") == CP_SUCCESS &&
                memcmp(back, global, (size_t)T * tb))
                world_fail(r, CP_ERROR_INTERNAL, "cp_pack_gather: the row came back different");
        }
    }
    free(global);
    free(local);
    free(back);
    cp_pack_destroy(pk);
}

static void test_shard_gather_round_trip(void **state)
{
    (void)state;
    static docs rows[8];
    edge_rows(rows);
    static const size_t sizes[] = { 1, 3, 8 };
    static const int which[] = { 0, 4, 7 }; /* one-token documents, random, 2P multiples */
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++)
            for (int t = 0; t < 3; t++) {
                if (b == CP_BALANCE_DOC_ZIGZAG && which[i] != 7)
                    continue;
                gather_world gw = { .what = ROUND_TRIP, .d = &rows[which[i]], .balance = (cp_balance)b,
                                    .token_bytes = sizes[t] };
                world w;
                if (world_run(&w, RANKS, NULL, gather_rank, &gw) != CP_SUCCESS)
                    fail_msg("row %d, balance %d, token_bytes %zu: %s", which[i], b, sizes[t], w.error);
            }
}

/* Ranks that pass different packs or token sizes all fail at once with
 * CP_ERROR_MISMATCH; a rank with a bad argument gets its own error, its
 * peers CP_ERROR_MISMATCH naming it. */
static void test_gather_mismatch(void **state)
{
    (void)state;
    static docs rows[8];
    edge_rows(rows);
    static const struct {
        gather_case what;
        const char *needle;
    } cases[] = { { OTHER_PACK, "packs (pk's hash)" }, { OTHER_BYTES, "token_bytes" }, { NULL_LOCAL, "rank 3" } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gather_world gw = { .what = cases[i].what, .d = &rows[4], .balance = CP_BALANCE_GREEDY, .token_bytes = 4 };
        world w;
        if (world_run(&w, RANKS, NULL, gather_rank, &gw) != CP_SUCCESS)
            fail_msg("%s", w.error);
        for (int r = 0; r < RANKS; r++) {
            if (cases[i].what == NULL_LOCAL && r == 3) {
                assert_int_equal(gw.status[r], CP_ERROR_INVALID_ARGUMENT);
                assert_non_null(strstr(gw.error[r], "cp_pack_gather: local is NULL"));
                continue;
            }
            if (gw.status[r] != CP_ERROR_MISMATCH || !strstr(gw.error[r], cases[i].needle))
                fail_msg("case %zu, rank %d: %s (%s), expected CP_ERROR_MISMATCH naming \"%s\"", i, r,
                         cp_status_string(gw.status[r]), gw.error[r], cases[i].needle);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_policy_partitions_the_row),
        cmocka_unit_test(test_pairs_closed_form),
        cmocka_unit_test(test_work_counts_every_pair),
        cmocka_unit_test(test_contiguous_and_doc_zigzag_are_the_textbook_splits),
        cmocka_unit_test(test_equal_configs_give_equal_packs),
        cmocka_unit_test(test_default_chunk_and_auto),
        cmocka_unit_test(test_greedy_balance),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_shard_gather_round_trip),
        cmocka_unit_test(test_gather_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
