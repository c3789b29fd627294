/* SPDX-License-Identifier: MIT */
/*
 * cp_pack: the split of one packed row of documents across a CP group
 * (DESIGN.md section 5; docs/notes/2026-12-05-pack.md has the measurements).
 *
 * Every policy describes the split as a sequence of segments along the row,
 * each owned by one rank; consecutive segments of one rank merge, and a
 * stable counting sort by rank turns them into each rank's runs, in row
 * order and coalesced; order_runs then puts the pieces of documents that
 * other ranks share first (the local order). So the three policies share
 * everything but the choice of owners:
 *
 *  - CONTIGUOUS: P segments of T/P tokens.
 *  - DOC_ZIGZAG (TransformerEngine's THD split): every document in 2P equal
 *    chunks, chunk j to rank min(j, 2P-1-j).
 *  - GREEDY: the row in chunks of `chunk` tokens (a chunk may hold the end
 *    of one document and the start of the next); every rank gets exactly
 *    k = T/(P chunk) of them. The work of a chunk is the number of (query,
 *    key) pairs its queries see inside their documents (cpi_pack_pairs,
 *    exact). A chunk's home is the document of its first token. Items:
 *    the home chunks of a document go whole where that is at most half a
 *    rank's mean work and a quarter of its chunks - a document on one rank
 *    costs the ring nothing, and a cut between two items costs less than a
 *    chunk of the next document. Larger documents pair their chunks
 *    zigzag-style, first with last, second with second to last, ..., runs
 *    of such pairs making items below both caps: under a causal mask their
 *    items carry equal work (the cheap start of a document pays for its
 *    dear end). Items go in descending order of work (LPT) to the
 *    least-loaded rank with room, from a heap of ranks; but a rank that
 *    keeps a document together (it took the document's last item, or holds
 *    the row's chunk just before or after the item) gets it instead where
 *    its load exceeds the least by at most mean/16. An item larger than
 *    the room of its rank is cut there, which fills the rank. LPT under the
 *    "exactly k chunks" constraint and that tolerance leave some imbalance;
 *    trades of single chunks between the busiest rank and the few least
 *    busy even it out (refine): measured, max / mean work is at most 1.001
 *    on the causal mixes of the bench, 1.06 in the worst case of the tests
 *    (a window of 256 at P = 32).
 *
 * Why that default chunk: the largest of 128, 64, ..., 1 that divides T/P
 * and leaves at least 16 chunks per rank. GPU attention kernels tile queries
 * and keys in blocks of 64 or 128 rows, so runs that are multiples of 128
 * keep the tiles full; and a rank's work can be evened out only to about
 * one chunk's, so it needs a few of them.
 *
 * AUTO: CONTIGUOUS where it is as balanced as GREEDY (its largest rank's
 * work within 1 % of GREEDY's), since it splits the fewest documents; else
 * GREEDY with cfg->chunk (the default when 0).
 *
 * Cost, with n = T/chunk: GREEDY O(n log n + num_seqs) (the sorts of the
 * items and of each rank's chunks; the heaps are O(n log P), the trades
 * O(n)); CONTIGUOUS O(P + num_seqs); DOC_ZIGZAG O(P num_seqs). Nothing is
 * per token.
 */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "comm/agree.h"
#include "comm/group.h"
#include "core/context.h"
#include "layout/pack.h"

__extension__ typedef unsigned __int128 u128;

/* The first published cp_pack_config is the whole of today's. */
#define PACK_CONFIG_V1_SIZE (offsetof(cp_pack_config, chunk) + sizeof(int64_t))

/* Ids start at 1: 0 stands for "no pack" in the plans that remember one. */
static atomic_uint_fast64_t next_id = 1;

/* ---- visible pairs, in closed form ------------------------------------- */

/* p summed over [a, b), 0 <= a <= b. (b - a)(a + b - 1) is even: one of the
 * two factors is. */
static u128 series(int64_t a, int64_t b)
{
    if (b <= a)
        return 0;
    return (u128)(b - a) * ((u128)a + (u128)b - 1) / 2;
}

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* Visible keys of the queries at positions [u, v) of a document of length L
 * (0 <= u < v <= L), W the window (0: none). */
static u128 piece_pairs(int64_t L, cp_mask mask, int64_t W, int64_t u, int64_t v)
{
    if (mask == CP_MASK_CAUSAL) {
        /* min(p + 1, W): p + 1 below p = W, W from there on */
        const int64_t m = W == 0 ? v : clamp64(W, u, v);
        return series(u, m) + (u128)(m - u) + (u128)W * (u128)(v - m);
    }
    if (W == 0 || W >= L)
        return (u128)L * (u128)(v - u);
    /* min(L-1, p+W-1) - max(0, p-W+1) + 1: the upper end follows p up to
     * p = L - W, the lower from p = W - 1 */
    const int64_t h = clamp64(L - W + 1, u, v), l = clamp64(W - 1, u, v);
    const u128 hi = series(u, h) + (u128)(W - 1) * (u128)(h - u) + (u128)(L - 1) * (u128)(v - h);
    const u128 lo = series(l, v) - (u128)(W - 1) * (u128)(v - l);
    return hi - lo + (u128)(v - u);
}

/* Visible pairs of the queries at row positions [a, b), a < b, the first
 * of them in document d. */
static u128 range_pairs(const int64_t *cu, int n, int d, cp_mask mask, int64_t W, int64_t a, int64_t b)
{
    u128 sum = 0;
    for (; d < n && cu[d] < b; d++) {
        const int64_t s = a > cu[d] ? a : cu[d], e = b < cu[d + 1] ? b : cu[d + 1];
        sum += piece_pairs(cu[d + 1] - cu[d], mask, W, s - cu[d], e - cu[d]);
    }
    return sum;
}

double cpi_pack_pairs(const int64_t *cu, int n, cp_mask mask, int64_t window, int64_t a, int64_t b)
{
    if (b <= a)
        return 0;
    return (double)range_pairs(cu, n, cpi_pack_doc_of(cu, n, a), mask, window, a, b);
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

/* The work of rank r's queries. */
static u128 rank_pairs(const cp_pack *pk, int r)
{
    const cpi_span *runs;
    const int nr = cpi_pack_runs(pk, r, &runs);
    u128 sum = 0;
    for (int i = 0; i < nr; i++)
        sum += range_pairs(pk->cu, pk->num_seqs, cpi_pack_doc_of(pk->cu, pk->num_seqs, runs[i].offset), pk->mask,
                           pk->window, runs[i].offset, runs[i].offset + runs[i].len);
    return sum;
}

/* The most work of a rank. */
static u128 max_pairs(const cp_pack *pk)
{
    u128 top = 0;
    for (int r = 0; r < pk->cp_size; r++) {
        const u128 w = rank_pairs(pk, r);
        top = w > top ? w : top;
    }
    return top;
}

/* ---- segments along the row, and the runs they make --------------------- */

typedef struct row_split {
    cpi_span *seg; /* in row order */
    int *rank;     /* seg[i]'s owner */
    int n, cap;
} row_split;

static cp_status split_init(row_split *s, int64_t cap)
{
    *s = (row_split){ .cap = (int)cap };
    s->seg = cpi_calloc((size_t)cap, sizeof *s->seg);
    s->rank = cpi_calloc((size_t)cap, sizeof *s->rank);
    return s->seg && s->rank ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
}

static void split_free(row_split *s)
{
    free(s->seg);
    free(s->rank);
}

/* The next len tokens of the row go to rank r. */
static void split_add(row_split *s, int64_t offset, int64_t len, int r)
{
    if (s->n && s->rank[s->n - 1] == r) {
        s->seg[s->n - 1].len += len;
        return;
    }
    s->seg[s->n] = (cpi_span){ offset, len };
    s->rank[s->n++] = r;
}

/* Each rank's runs into pk: a stable counting sort of the segments by owner. */
static cp_status split_to_runs(const row_split *s, cp_pack *pk)
{
    const int P = pk->cp_size;
    pk->run_first = cpi_calloc((size_t)P + 1, sizeof *pk->run_first);
    pk->runs = cpi_calloc((size_t)s->n, sizeof *pk->runs);
    if (!pk->run_first || !pk->runs)
        return CP_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < s->n; i++)
        pk->run_first[s->rank[i] + 1]++;
    for (int r = 0; r < P; r++)
        pk->run_first[r + 1] += pk->run_first[r];
    int *at = cpi_calloc((size_t)P, sizeof *at);
    if (!at)
        return CP_ERROR_OUT_OF_MEMORY;
    memcpy(at, pk->run_first, (size_t)P * sizeof *at);
    for (int i = 0; i < s->n; i++)
        pk->runs[at[s->rank[i]]++] = s->seg[i];
    free(at);
    return CP_SUCCESS;
}

/*
 * Each rank's local order: first the pieces of documents that other ranks
 * hold parts of, then the documents wholly on this rank, each group along
 * the row. A ring hop carries one row range of a block (the cover of the
 * rows later holders see): with the documents no one else sees at the end
 * of the block, they never travel, and the cover spans only the shared
 * pieces. Only the first and the last document of a run can be shared
 * (the run's neighbours along the row are on other ranks).
 */
static cp_status order_runs(cp_pack *pk)
{
    const int P = pk->cp_size, n = pk->run_first[P];
    cpi_span *out = cpi_calloc((size_t)(3 * n > 0 ? 3 * n : 1), sizeof *out);
    int *first = cpi_calloc((size_t)P + 1, sizeof *first);
    cpi_span *local = cpi_calloc((size_t)(3 * n > 0 ? 3 * n : 1), sizeof *local);
    if (!out || !first || !local) {
        free(out);
        free(first);
        free(local);
        return CP_ERROR_OUT_OF_MEMORY;
    }
    int m = 0;
    for (int r = 0; r < P; r++) {
        first[r] = m;
        int nl = 0;
        for (int i = pk->run_first[r]; i < pk->run_first[r + 1]; i++) {
            const int64_t a = pk->runs[i].offset, b = a + pk->runs[i].len;
            const int d0 = cpi_pack_doc_of(pk->cu, pk->num_seqs, a), d1 = cpi_pack_doc_of(pk->cu, pk->num_seqs, b - 1);
            /* [a, lo) and [hi, b) are shared, [lo, hi) wholly here */
            int64_t lo = pk->cu[d0] < a ? (pk->cu[d0 + 1] < b ? pk->cu[d0 + 1] : b) : a;
            int64_t hi = pk->cu[d1 + 1] > b ? (pk->cu[d1] > lo ? pk->cu[d1] : lo) : b;
            cpi_span pieces[2] = { { a, lo - a }, { hi, b - hi } };
            for (int k = 0; k < 2; k++) {
                if (pieces[k].len <= 0)
                    continue;
                if (m > first[r] && out[m - 1].offset + out[m - 1].len == pieces[k].offset)
                    out[m - 1].len += pieces[k].len;
                else
                    out[m++] = pieces[k];
            }
            if (hi > lo) {
                if (nl && local[nl - 1].offset + local[nl - 1].len == lo)
                    local[nl - 1].len += hi - lo;
                else
                    local[nl++] = (cpi_span){ lo, hi - lo };
            }
        }
        memcpy(out + m, local, (size_t)nl * sizeof *local);
        m += nl;
    }
    first[P] = m;
    free(local);
    free(pk->runs);
    free(pk->run_first);
    pk->runs = out;
    pk->run_first = first;
    return CP_SUCCESS;
}

/* ---- CONTIGUOUS and DOC_ZIGZAG ------------------------------------------- */

static void split_contiguous(const cp_pack *pk, row_split *s)
{
    for (int r = 0; r < pk->cp_size; r++)
        split_add(s, r * pk->s_loc, pk->s_loc, r);
}

static void split_doc_zigzag(const cp_pack *pk, row_split *s)
{
    const int64_t P2 = 2 * (int64_t)pk->cp_size;
    for (int d = 0; d < pk->num_seqs; d++) {
        const int64_t c = (pk->cu[d + 1] - pk->cu[d]) / P2;
        for (int64_t j = 0; j < P2; j++)
            split_add(s, pk->cu[d] + j * c, c, (int)(j < pk->cp_size ? j : P2 - 1 - j));
    }
}

/* ---- GREEDY -------------------------------------------------------------- */

/* Chunks that go to one rank together: one or two ranges of chunks. */
typedef struct item {
    int first[2], count[2]; /* count[1] = 0: one range */
    int doc;                /* its home document */
    u128 w;                 /* their work */
} item;

/* Ranks in a binary heap on their loads, least first (or most, with
 * `most`); ties go to the lower rank, so that the split is deterministic. */
typedef struct rank_heap {
    const u128 *load;
    int *at;   /* the heap */
    int *slot; /* a rank's index in it; -1: not in it */
    int n;
    bool most;
} rank_heap;

static bool before(const rank_heap *h, int x, int y)
{
    if (h->load[x] != h->load[y])
        return h->most ? h->load[x] > h->load[y] : h->load[x] < h->load[y];
    return x < y;
}

static void heap_set(rank_heap *h, int i, int r)
{
    h->at[i] = r;
    h->slot[r] = i;
}

/* Restore the heap after rank r's load changed. */
static void heap_fix(rank_heap *h, int r)
{
    int i = h->slot[r];
    while (i > 0 && before(h, r, h->at[(i - 1) / 2])) {
        heap_set(h, i, h->at[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && before(h, h->at[c + 1], h->at[c]))
            c++;
        if (!before(h, h->at[c], r))
            break;
        heap_set(h, i, h->at[c]);
        i = c;
    }
    heap_set(h, i, r);
}

static void heap_remove(rank_heap *h, int r)
{
    const int i = h->slot[r], last = h->at[--h->n];
    h->slot[r] = -1;
    if (last != r) {
        heap_set(h, i, last);
        heap_fix(h, last);
    }
}

/* All P ranks; equal loads make any order by rank a heap. */
static void heap_all(rank_heap *h, int P)
{
    for (h->n = 0; h->n < P; h->n++)
        heap_set(h, h->n, h->n);
}

typedef struct greedy {
    const u128 *cw; /* chunk work */
    int n;          /* chunks */
    int *owner;     /* chunk -> rank (-1: not yet placed) */
    u128 *load;
    int *room;      /* chunks a rank still takes */
    rank_heap open; /* the ranks with room, least loaded first */
    int *last;      /* per document: the rank that took its last item (-1: none) */
    u128 tol;       /* how far above the least load a rank that keeps a document together may be */
} greedy;

/* Rank r takes count chunks from `first` on. */
static void give(greedy *g, int r, int first, int count)
{
    for (int i = 0; i < count; i++) {
        g->owner[first + i] = r;
        g->load[r] += g->cw[first + i];
    }
    g->room[r] -= count;
    if (g->room[r] > 0)
        heap_fix(&g->open, r);
    else
        heap_remove(&g->open, r);
}

/* The rank for an item of `count` chunks: the least-loaded, unless a rank
 * that keeps a document together (the one that took the item's document
 * last, or the one holding the row's chunk just before or after the item's
 * first range) has room for it all and a load within the tolerance of the
 * least. */
static int choose(const greedy *g, const item *it, int count)
{
    const int least = g->open.at[0], f = it->first[0], e = f + it->count[0];
    const int near[3] = { g->last[it->doc], f > 0 ? g->owner[f - 1] : -1, e < g->n ? g->owner[e] : -1 };
    for (int i = 0; i < 3; i++) {
        const int r = near[i];
        if (r >= 0 && r != least && g->room[r] >= count && g->load[r] - g->load[least] <= g->tol)
            return r;
    }
    return least;
}

/* Place an item; where the chosen rank has less room than the item has
 * chunks, it takes what fits (the rank fills, so this happens at most once
 * per rank) and the rest is placed again. The rooms add up to the chunks
 * left, so a rank with room always remains. */
static void place(greedy *g, const item *it)
{
    item rest = *it;
    for (;;) {
        const int count = rest.count[0] + rest.count[1];
        if (count == 0)
            return;
        const int r = choose(g, &rest, count);
        int take = g->room[r] < count ? g->room[r] : count;
        for (int k = 0; k < 2 && take > 0; k++) {
            const int t = rest.count[k] < take ? rest.count[k] : take;
            give(g, r, rest.first[k], t);
            rest.first[k] += t;
            rest.count[k] -= t;
            take -= t;
        }
        if (rest.count[0] == 0) { /* the second range, if any, is what remains */
            rest.first[0] = rest.first[1];
            rest.count[0] = rest.count[1];
            rest.count[1] = 0;
        }
        g->last[it->doc] = r;
    }
}

static int by_work(const void *x, const void *y)
{
    const item *a = x, *b = y;
    if (a->w != b->w)
        return a->w > b->w ? -1 : 1;
    return (a->first[0] > b->first[0]) - (a->first[0] < b->first[0]);
}

/* The work of each chunk of c tokens, and its home document (the one
 * holding its first token), in one sweep along the row. */
static void chunk_work(const cp_pack *pk, int64_t c, int n, u128 *cw, int *home)
{
    int d = 0;
    for (int i = 0; i < n; i++) {
        const int64_t a = (int64_t)i * c;
        while (pk->cu[d + 1] <= a)
            d++;
        cw[i] = range_pairs(pk->cu, pk->num_seqs, d, pk->mask, pk->window, a, a + c);
        home[i] = d;
    }
}

/* The items of one document's home chunks [f, f + m), of work w: all of
 * them where w is at most cap.work and m at most cap.chunks. Else the
 * chunks pair up first with last, second with second to last, ..., and
 * runs of s consecutive pairs make an item (two ranges of s chunks,
 * mirrored about the middle; under a causal mask without a window such
 * items carry equal work), s as large as both caps allow. */
typedef struct item_cap {
    u128 work;
    int chunks;
} item_cap;

static int doc_items(const u128 *cw, int f, int m, int doc, u128 w, item_cap cap, item *it)
{
    if ((w <= cap.work && m <= cap.chunks) || m == 1) {
        it[0] = (item){ { f, 0 }, { m, 0 }, doc, w };
        return 1;
    }
    const int pairs = m / 2;
    const u128 need = (w + cap.work - 1) / cap.work;
    int s = need >= (u128)pairs ? 1 : (int)((u128)pairs / need);
    s = 2 * s > cap.chunks ? (cap.chunks > 1 ? cap.chunks / 2 : 1) : s;
    int count = 0;
    for (int j = 0; j < pairs; j += s) {
        const int len = pairs - j < s ? pairs - j : s;
        it[count] = (item){ { f + j, f + m - j - len }, { len, len }, doc, 0 };
        for (int c = 0; c < len; c++)
            it[count].w += cw[f + j + c] + cw[f + m - j - len + c];
        count++;
    }
    if (m % 2)
        it[count++] = (item){ { f + pairs, 0 }, { 1, 0 }, doc, cw[f + pairs] };
    return count;
}

/* A chunk and its work, to keep a rank's chunks sorted by work. */
typedef struct weighed {
    u128 w;
    int chunk;
} weighed;

static int by_weight(const void *x, const void *y)
{
    const weighed *a = x, *b = y;
    if (a->w != b->w)
        return a->w < b->w ? -1 : 1;
    return (a->chunk > b->chunk) - (a->chunk < b->chunk);
}

/* A trade: chunk list[x][i] for list[y][j]. */
typedef struct trade {
    int y, i, j;
    u128 top; /* the larger of the two new loads */
} trade;

/* The best trade between x and y (sorted lists X and Y of k chunks): the
 * difference d = w(a) - w(b) nearest half their gap, with 0 < d < gap so
 * that both end below x's load. As w(a) rises so does the w(b) it wants,
 * so one pass of two indices finds it. */
static void best_trade(const u128 *load, int x, int y, const weighed *X, const weighed *Y, int k, trade *t)
{
    const u128 gap = load[x] - load[y];
    for (int i = 0, j = 0; i < k; i++) {
        const u128 want = X[i].w > gap / 2 ? X[i].w - gap / 2 : 0;
        while (j < k && Y[j].w < want)
            j++;
        for (int c = j - 1; c <= j; c++) {
            if (c < 0 || c >= k || Y[c].w >= X[i].w || X[i].w - Y[c].w >= gap)
                continue;
            const u128 d = X[i].w - Y[c].w, top = load[x] - d > load[y] + d ? load[x] - d : load[y] + d;
            if (top < t->top)
                *t = (trade){ y, i, c, top };
        }
    }
}

/* Move chunk c in the sorted list L of k from index `from` to its place. */
static void resort(weighed *L, int k, int from, weighed c)
{
    int i = from;
    for (; i > 0 && by_weight(&c, &L[i - 1]) < 0; i--)
        L[i] = L[i - 1];
    for (; i + 1 < k && by_weight(&L[i + 1], &c) < 0; i++)
        L[i] = L[i + 1];
    L[i] = c;
}

/* How many of the least-loaded ranks a round tries as partners. */
#define TRADE_PARTNERS 4

/* Even out what LPT left (the tolerance, and the exact chunk counts, leave
 * some): in each round the busiest rank x makes the best trade of one of
 * its chunks for a lighter one of the few least busy ranks, where both end
 * below x's load. Every trade lowers the sum of squared loads, so none
 * repeats; at most 16P rounds of O(k) each. list[r * k ..] holds rank r's
 * k chunks sorted by work. */
static void refine(greedy *g, int P, int k, weighed *list, rank_heap *most, rank_heap *least)
{
    heap_all(most, P);
    heap_all(least, P);
    for (int r = 0; r < P; r++) {
        heap_fix(most, r);
        heap_fix(least, r);
    }
    for (int64_t round = 0; round < 16 * (int64_t)P; round++) {
        const int x = most->at[0];
        if (g->load[x] - g->load[least->at[0]] <= g->load[x] / 1024)
            return; /* even within 0.1 % */
        trade t = { -1, 0, 0, g->load[x] };
        int tried[TRADE_PARTNERS], ntried = 0;
        while (ntried < TRADE_PARTNERS && least->n > 0 && least->at[0] != x) {
            const int y = least->at[0];
            heap_remove(least, y);
            tried[ntried++] = y;
            best_trade(g->load, x, y, list + (size_t)x * k, list + (size_t)y * k, k, &t);
        }
        for (int i = 0; i < ntried; i++) {
            heap_set(least, least->n++, tried[i]);
            heap_fix(least, tried[i]);
        }
        if (t.y < 0)
            return;
        weighed *X = list + (size_t)x * k, *Y = list + (size_t)t.y * k;
        const weighed a = X[t.i], b = Y[t.j];
        g->load[x] -= a.w - b.w;
        g->load[t.y] += a.w - b.w;
        g->owner[a.chunk] = t.y;
        g->owner[b.chunk] = x;
        resort(X, k, t.i, b);
        resort(Y, k, t.j, a);
        heap_fix(most, x);
        heap_fix(most, t.y);
        heap_fix(least, x);
        heap_fix(least, t.y);
    }
}

static cp_status split_greedy(const cp_pack *pk, row_split *s)
{
    const int P = pk->cp_size, n = (int)(pk->T / pk->chunk), k = (int)(pk->s_loc / pk->chunk);
    greedy g = { .n = n };
    u128 *cw = cpi_calloc((size_t)n, sizeof *cw);
    int *home = cpi_calloc((size_t)n, sizeof *home);
    item *it = cpi_calloc((size_t)n, sizeof *it);
    weighed *list = cpi_calloc((size_t)n, sizeof *list);
    int *heaps = cpi_calloc(4 * (size_t)P, sizeof *heaps);
    g.owner = cpi_calloc((size_t)n, sizeof *g.owner);
    g.load = cpi_calloc((size_t)P, sizeof *g.load);
    g.room = cpi_calloc((size_t)P, sizeof *g.room);
    g.last = cpi_calloc((size_t)pk->num_seqs, sizeof *g.last);
    cp_status st = CP_ERROR_OUT_OF_MEMORY;
    if (!cw || !home || !it || !list || !heaps || !g.owner || !g.load || !g.room || !g.last)
        goto out;

    chunk_work(pk, pk->chunk, n, cw, home);
    u128 total = 0;
    for (int i = 0; i < n; i++)
        total += cw[i];
    const u128 mean = total / (u128)P;
    /* whole documents up to half a rank's work and a quarter of its chunks
     * (docs/notes/2026-12-05-pack.md has the trade-off measured) */
    const item_cap cap = { mean / 2 + 1, k / 4 };
    int nitems = 0;
    for (int f = 0, m; f < n; f += m) {
        u128 w = 0;
        for (m = 0; f + m < n && home[f + m] == home[f]; m++)
            w += cw[f + m];
        nitems += doc_items(cw, f, m, home[f], w, cap, it + nitems);
    }
    qsort(it, (size_t)nitems, sizeof *it, by_work);

    g.cw = cw;
    g.tol = mean / 16;
    g.open = (rank_heap){ g.load, heaps, heaps + P, 0, false };
    heap_all(&g.open, P);
    for (int i = 0; i < n; i++)
        g.owner[i] = -1;
    for (int d = 0; d < pk->num_seqs; d++)
        g.last[d] = -1;
    for (int r = 0; r < P; r++)
        g.room[r] = k;
    for (int i = 0; i < nitems; i++)
        place(&g, &it[i]);

    /* each rank's k chunks by work, for the trades; the open heap is empty now */
    int *at = g.room;
    for (int r = 0; r < P; r++)
        at[r] = r * k;
    for (int i = 0; i < n; i++)
        list[at[g.owner[i]]++] = (weighed){ cw[i], i };
    for (int r = 0; r < P; r++)
        qsort(list + (size_t)r * k, (size_t)k, sizeof *list, by_weight);
    rank_heap most = { g.load, heaps, heaps + P, 0, true }, least = { g.load, heaps + 2 * P, heaps + 3 * P, 0, false };
    refine(&g, P, k, list, &most, &least);

    for (int i = 0; i < n; i++)
        split_add(s, (int64_t)i * pk->chunk, pk->chunk, g.owner[i]);
    st = CP_SUCCESS;
out:
    free(cw);
    free(home);
    free(it);
    free(list);
    free(heaps);
    free(g.owner);
    free(g.load);
    free(g.room);
    free(g.last);
    return st;
}

/* ---- cp_pack_create ------------------------------------------------------ */

/* The default GREEDY chunk (see the top of this file). */
static int64_t default_chunk(int64_t s_loc)
{
    for (int64_t c = 128; c > 1; c /= 2)
        if (s_loc % c == 0 && s_loc / c >= 16)
            return c;
    return 1;
}

static cp_status check_config(const cp_pack_config *c)
{
    static const char f[] = "cp_pack_create";
    CPI_CHECK(c->cp_size >= 1, "%s: cfg->cp_size = %d (must be >= 1)", f, c->cp_size);
    CPI_CHECK(c->mask == CP_MASK_NONE || c->mask == CP_MASK_CAUSAL,
              "%s: cfg->mask = %d (must be CP_MASK_NONE (0) or CP_MASK_CAUSAL (1))", f, (int)c->mask);
    CPI_CHECK(c->window >= 0, "%s: cfg->window = %lld (must be >= 0; 0 = none)", f, (long long)c->window);
    CPI_CHECK(c->balance >= CP_BALANCE_AUTO && c->balance <= CP_BALANCE_CONTIGUOUS,
              "%s: cfg->balance = %d (must be CP_BALANCE_AUTO (0), _DOC_ZIGZAG (1), _GREEDY (2) or _CONTIGUOUS (3))",
              f, (int)c->balance);
    CPI_CHECK(c->chunk >= 0, "%s: cfg->chunk = %lld (must be >= 0; 0 = the library's choice)", f,
              (long long)c->chunk);
    CPI_CHECK(c->num_seqs >= 1, "%s: cfg->num_seqs = %d (must be >= 1)", f, c->num_seqs);
    CPI_CHECK(c->cu_seqlens != NULL, "%s: cfg->cu_seqlens is NULL", f);
    const int64_t *cu = c->cu_seqlens;
    CPI_CHECK(cu[0] == 0, "%s: cfg->cu_seqlens[0] = %lld (must be 0)", f, (long long)cu[0]);
    for (int d = 1; d <= c->num_seqs; d++)
        CPI_CHECK(cu[d] > cu[d - 1], "%s: cfg->cu_seqlens[%d] = %lld is not greater than cfg->cu_seqlens[%d] = %lld",
                  f, d, (long long)cu[d], d - 1, (long long)cu[d - 1]);
    const int64_t T = cu[c->num_seqs], P = c->cp_size, s_loc = T / P;
    CPI_CHECK(T % P == 0, "%s: the packed length cfg->cu_seqlens[%d] = %lld is not divisible by cfg->cp_size = %d",
              f, c->num_seqs, (long long)T, c->cp_size);
    /* what cp_pack_positions writes must be addressable */
    CPI_CHECK((uint64_t)s_loc <= PTRDIFF_MAX / sizeof(int64_t),
              "%s: T / cp_size = %lld tokens per rank overflow the address space", f, (long long)s_loc);
    if (c->balance == CP_BALANCE_GREEDY || c->balance == CP_BALANCE_AUTO) {
        const int64_t chunk = c->chunk ? c->chunk : default_chunk(s_loc);
        CPI_CHECK(s_loc % chunk == 0, "%s: cfg->chunk = %lld does not divide T / cp_size = %lld / %d = %lld", f,
                  (long long)chunk, (long long)T, c->cp_size, (long long)s_loc);
        CPI_CHECK(T / chunk <= INT_MAX,
                  "%s: T / cfg->chunk = %lld / %lld = %lld chunks (at most INT_MAX; take a larger chunk)", f,
                  (long long)T, (long long)chunk, (long long)(T / chunk));
    }
    if (c->balance == CP_BALANCE_DOC_ZIGZAG) {
        for (int d = 0; d < c->num_seqs; d++)
            CPI_CHECK((cu[d + 1] - cu[d]) % (2 * P) == 0,
                      "%s: cfg->balance = CP_BALANCE_DOC_ZIGZAG needs every document length divisible by 2 * "
                      "cfg->cp_size = %lld: document %d has length %lld",
                      f, (long long)(2 * P), d, (long long)(cu[d + 1] - cu[d]));
        CPI_CHECK(2 * P <= INT_MAX / c->num_seqs,
                  "%s: DOC_ZIGZAG's 2 * cfg->cp_size x cfg->num_seqs = %lld x %d chunks (at most INT_MAX)", f,
                  (long long)(2 * P), c->num_seqs);
    }
    return CP_SUCCESS;
}

/* FNV-1a over 64-bit values, byte by byte from the low end: the same on
 * every rank, whatever its endianness. */
static uint64_t fnv(uint64_t h, int64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (uint64_t)v >> (8 * i) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t pack_hash(const cp_pack *pk)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv(h, pk->cp_size);
    h = fnv(h, pk->T);
    h = fnv(h, pk->num_seqs);
    for (int d = 0; d <= pk->num_seqs; d++)
        h = fnv(h, pk->cu[d]);
    for (int r = 0; r < pk->cp_size; r++) {
        const cpi_span *runs;
        const int nr = cpi_pack_runs(pk, r, &runs);
        h = fnv(h, nr);
        for (int i = 0; i < nr; i++) {
            h = fnv(h, runs[i].offset);
            h = fnv(h, runs[i].len);
        }
    }
    return h;
}

static void drop_runs(cp_pack *pk)
{
    free(pk->run_first);
    free(pk->runs);
    pk->run_first = NULL;
    pk->runs = NULL;
}

/* Split pk by its policy (balance and chunk set, no runs yet); on failure
 * it has none again. */
static cp_status build(cp_pack *pk)
{
    int64_t cap = pk->cp_size;
    if (pk->balance == CP_BALANCE_DOC_ZIGZAG)
        cap = 2 * (int64_t)pk->cp_size * pk->num_seqs;
    else if (pk->balance == CP_BALANCE_GREEDY)
        cap = pk->T / pk->chunk;
    row_split s;
    cp_status st = split_init(&s, cap);
    if (st == CP_SUCCESS) {
        if (pk->balance == CP_BALANCE_CONTIGUOUS)
            split_contiguous(pk, &s);
        else if (pk->balance == CP_BALANCE_DOC_ZIGZAG)
            split_doc_zigzag(pk, &s);
        else
            st = split_greedy(pk, &s);
    }
    if (st == CP_SUCCESS)
        st = split_to_runs(&s, pk);
    if (st == CP_SUCCESS)
        st = order_runs(pk);
    split_free(&s);
    if (st != CP_SUCCESS)
        drop_runs(pk);
    return st;
}

/* AUTO: CONTIGUOUS unless GREEDY's busiest rank has more than 1 % less work. */
static cp_status build_auto(cp_pack *pk, int64_t chunk)
{
    pk->balance = CP_BALANCE_CONTIGUOUS;
    CPI_TRY(build(pk));
    const u128 top_contiguous = max_pairs(pk);
    /* the busiest rank of any split has at least the mean: within 1 % of it
     * is within 1 % of GREEDY */
    const u128 total = range_pairs(pk->cu, pk->num_seqs, 0, pk->mask, pk->window, 0, pk->T);
    if ((top_contiguous - total / (u128)pk->cp_size) <= top_contiguous / 100)
        return CP_SUCCESS;
    cp_pack alt = *pk;
    alt.balance = CP_BALANCE_GREEDY;
    alt.chunk = chunk;
    alt.run_first = NULL;
    alt.runs = NULL;
    CPI_TRY(build(&alt));
    const u128 top_greedy = max_pairs(&alt);
    if (top_contiguous <= top_greedy || top_contiguous - top_greedy <= top_greedy / 100) {
        drop_runs(&alt);
        return CP_SUCCESS;
    }
    drop_runs(pk);
    *pk = alt;
    return CP_SUCCESS;
}

CP_EXPORT void cp_pack_destroy(cp_pack *pk)
{
    if (!pk)
        return;
    free(pk->cu);
    drop_runs(pk);
    free(pk);
}

CP_EXPORT cp_status cp_pack_create(const cp_pack_config *cfg, cp_pack **out)
{
    if (out)
        *out = NULL;
    CPI_CHECK_PTR(out);
    CPI_CHECK_PTR(cfg);
    static const cp_pack_config defaults = CP_PACK_CONFIG_INIT;
    cp_pack_config c;
    CPI_TRY(cpi_copy_config(&c, sizeof c, &defaults, cfg, PACK_CONFIG_V1_SIZE, __func__, "cfg"));
    CPI_TRY(check_config(&c));

    cp_pack *pk = cpi_calloc(1, sizeof *pk);
    if (!pk)
        return CP_ERROR_OUT_OF_MEMORY;
    pk->cp_size = c.cp_size;
    pk->num_seqs = c.num_seqs;
    pk->T = c.cu_seqlens[c.num_seqs];
    pk->s_loc = pk->T / c.cp_size;
    pk->mask = c.mask;
    pk->window = c.window;
    pk->balance = c.balance;
    pk->cu = cpi_calloc((size_t)c.num_seqs + 1, sizeof *pk->cu);
    if (!pk->cu) {
        cp_pack_destroy(pk);
        return CP_ERROR_OUT_OF_MEMORY;
    }
    memcpy(pk->cu, c.cu_seqlens, ((size_t)c.num_seqs + 1) * sizeof *pk->cu);
    const int64_t chunk = c.chunk ? c.chunk : default_chunk(pk->s_loc);
    if (c.balance == CP_BALANCE_GREEDY)
        pk->chunk = chunk;
    cp_status s = c.balance == CP_BALANCE_AUTO ? build_auto(pk, chunk) : build(pk);
    if (s != CP_SUCCESS) {
        cp_pack_destroy(pk);
        return s;
    }
    pk->hash = pack_hash(pk);
    pk->id = atomic_fetch_add(&next_id, 1);
    *out = pk;
    return CP_SUCCESS;
}

/* ---- what a rank holds --------------------------------------------------- */

static cp_status check_rank(const char *f, const cp_pack *pk, int cp_rank)
{
    CPI_CHECK(pk != NULL, "%s: pk is NULL", f);
    CPI_CHECK(cp_rank >= 0 && cp_rank < pk->cp_size, "%s: cp_rank = %d (must be in [0, %d))", f, cp_rank,
              pk->cp_size);
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_pack_positions(const cp_pack *pk, int cp_rank, int64_t *positions, int64_t *doc_positions,
                                      int32_t *doc_ids)
{
    CPI_TRY(check_rank(__func__, pk, cp_rank));
    CPI_CHECK(positions || doc_positions || doc_ids, "%s: positions, doc_positions and doc_ids are all NULL",
              __func__);
    CPI_CHECK((uintptr_t)positions % sizeof *positions == 0,
              "%s: positions = %p is not aligned to its 8-byte elements", __func__, (void *)positions);
    CPI_CHECK((uintptr_t)doc_positions % sizeof *doc_positions == 0,
              "%s: doc_positions = %p is not aligned to its 8-byte elements", __func__, (void *)doc_positions);
    CPI_CHECK((uintptr_t)doc_ids % sizeof *doc_ids == 0, "%s: doc_ids = %p is not aligned to its 4-byte elements",
              __func__, (void *)doc_ids);
    const cpi_span *runs;
    const int nr = cpi_pack_runs(pk, cp_rank, &runs);
    int64_t at = 0;
    for (int i = 0; i < nr; i++) {
        int d = cpi_pack_doc_of(pk->cu, pk->num_seqs, runs[i].offset);
        for (int64_t p = runs[i].offset; p < runs[i].offset + runs[i].len; p++, at++) {
            while (pk->cu[d + 1] <= p)
                d++;
            if (positions)
                positions[at] = p;
            if (doc_positions)
                doc_positions[at] = p - pk->cu[d];
            if (doc_ids)
                doc_ids[at] = d;
        }
    }
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_pack_work(const cp_pack *pk, int cp_rank, double *pairs)
{
    CPI_TRY(check_rank(__func__, pk, cp_rank));
    CPI_CHECK_PTR(pairs);
    *pairs = (double)rank_pairs(pk, cp_rank);
    return CP_SUCCESS;
}

/* token_bytes and the bytes of the whole row, which must be addressable. */
static cp_status check_row(const char *f, const cp_pack *pk, size_t token_bytes, size_t *row)
{
    CPI_CHECK(token_bytes >= 1, "%s: token_bytes = %zu (must be >= 1)", f, token_bytes);
    CPI_CHECK(cpi_mul((size_t)pk->T, token_bytes, row) && *row <= PTRDIFF_MAX,
              "%s: T * token_bytes = %lld * %zu bytes overflows the address space", f, (long long)pk->T,
              token_bytes);
    return CP_SUCCESS;
}

/* Copy rank r's runs between its share (local order) and the row: out of
 * the row (to_row false) or into it. */
static cp_status copy_runs(cp_context *ctx, const cp_pack *pk, int r, char *row, char *share, size_t token_bytes,
                           bool to_row)
{
    const cpi_span *runs;
    const int nr = cpi_pack_runs(pk, r, &runs);
    const cp_copy_kind kind = cpi_local_copy_kind(ctx);
    size_t at = 0; /* bytes into the share */
    for (int i = 0; i < nr; i++) {
        const size_t width = (size_t)runs[i].len * token_bytes;
        char *in_row = row + (size_t)runs[i].offset * token_bytes;
        CPI_TRY(ctx->ops->copy_2d(ctx->state, to_row ? in_row : share + at, width, to_row ? share + at : in_row,
                                  width, width, 1, kind));
        at += width;
    }
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_pack_shard(cp_context *ctx, const cp_pack *pk, int cp_rank, const void *global, void *local,
                                  size_t token_bytes)
{
    CPI_CHECK_PTR(ctx);
    CPI_TRY(check_rank(__func__, pk, cp_rank));
    CPI_CHECK_PTR(global);
    CPI_CHECK_PTR(local);
    size_t row;
    CPI_TRY(check_row(__func__, pk, token_bytes, &row));
    const size_t share = row / (size_t)pk->cp_size;
    /* A copy between overlapping buffers would read tokens it has already
     * overwritten (and memcpy-like device copies do not allow it at all). */
    CPI_CHECK(!cpi_overlap(global, row, local, share), "%s: local %p (%zu bytes) overlaps global %p (%zu bytes)",
              __func__, local, share, global, row);
    return copy_runs(ctx, pk, cp_rank, (char *)global, local, token_bytes, false);
}

/* What this rank of g can check alone; *share and *row: bytes of a rank's
 * share and of the whole row. */
static cp_status check_gather(const cp_group *g, const cp_pack *pk, const void *local, const void *global,
                              size_t token_bytes, size_t *share, size_t *row)
{
    static const char f[] = "cp_pack_gather";
    CPI_CHECK(pk != NULL, "%s: pk is NULL", f);
    CPI_CHECK(local != NULL, "%s: local is NULL", f);
    CPI_CHECK(global != NULL, "%s: global is NULL", f);
    CPI_CHECK(pk->cp_size == g->size, "%s: pk splits the row across cp_size = %d ranks, the group has %d", f,
              pk->cp_size, g->size);
    CPI_TRY(check_row(f, pk, token_bytes, row));
    *share = *row / (size_t)g->size;
    CPI_CHECK(!cpi_overlap(local, *share, global, *row), "%s: local %p overlaps global %p", f, local, global);
    return CP_SUCCESS;
}

/* Whether rank r's share is the row's tokens [r T/P, (r+1) T/P) in order. */
static bool in_row_order(const cp_pack *pk)
{
    for (int r = 0; r < pk->cp_size; r++) {
        const cpi_span *runs;
        if (cpi_pack_runs(pk, r, &runs) != 1 || runs[0].offset != r * pk->s_loc)
            return false;
    }
    return true;
}

CP_EXPORT cp_status cp_pack_gather(cp_group *g, const cp_pack *pk, const void *local, void *global,
                                   size_t token_bytes)
{
    CPI_CHECK_PTR(g);
    cp_context *ctx = g->ctx;
    size_t share = 0, row = 0;
    /* Shares that are the row's pieces in rank order land in place; others
     * in a staging buffer, taken before the agreement so that running out
     * of memory fails every rank at once too. */
    const bool direct = pk && in_row_order(pk);
    void *stage = NULL;
    cp_status s = check_gather(g, pk, local, global, token_bytes, &share, &row);
    if (s == CP_SUCCESS && !direct)
        s = ctx->ops->alloc(ctx->state, row, &stage);
    /* A rank with bad arguments still takes part, so that its peers fail at
     * once; ranks with different packs would place the shares differently,
     * so the packs' hashes are compared. */
    const bool ok = s == CP_SUCCESS;
    const cpi_agree_field fields[] = { { "packs (pk's hash)", ok ? pk->hash : 0, false },
                                       { "token_bytes", ok ? token_bytes : 0, false } };
    const cpi_agree_call call = { .func = __func__,
                                  .ctx = ctx,
                                  .comm = g->comm,
                                  .timeout_ms = g->cfg.timeout_ms,
                                  .fields = fields,
                                  .nfields = 2 };
    cpi_agreement ag;
    if ((s = cpi_agree_open(&ag, &call, s)) != CP_SUCCESS) {
        if (stage)
            ctx->ops->free(ctx->state, stage); /* nothing was queued on it */
        return s;
    }

    cp_xfer x = cpi_group_xfer(g);
    if (direct)
        return cpi_all_gather(g->comm, &x, local, global, share);
    s = cpi_all_gather(g->comm, &x, local, stage, share);
    for (int r = 0; r < g->size && s == CP_SUCCESS; r++)
        s = copy_runs(ctx, pk, r, global, (char *)stage + (size_t)r * share, token_bytes, true);
    cp_status w = cpi_comm_wait(g->comm, &x);
    if (w != CP_SUCCESS)
        return s != CP_SUCCESS ? s : w; /* stage stays: freeing it would wait for a stuck stream */
    cp_status sync = ctx->ops->synchronize(ctx->state); /* before stage goes */
    ctx->ops->free(ctx->state, stage);
    return s != CP_SUCCESS ? s : sync;
}
