/* SPDX-License-Identifier: MIT */
/*
 * infinicp-bench --pack: how the cp_pack policies split packed rows of
 * documents. For a few document mixes (fixed seeds, so the output is the
 * same on every run) and CP sizes 2 to 64, each policy's
 *
 *  - work imbalance: max / mean over the ranks of cp_pack_work, the
 *    visible (query, key) pairs of a rank's queries;
 *  - padding: the tokens it needs added. DOC_ZIGZAG (TransformerEngine's
 *    THD split) needs every document length to be a multiple of 2P; where a
 *    mix has others it runs on the mix with each document padded up to one
 *    (marked *), which is what TE's users do;
 *  - ring traffic: the K / V bytes the p2p ring moves per layer in the
 *    forward. Rank o's block goes hop by hop to o-1, o-2, ...; the hop into
 *    o-h carries, as one row range in o's local order (the cover, which is
 *    what the library's ring sends), the rows that o-h, o-h-1, ..., o+1 -
 *    the ranks still ahead - see. A key at position j of document d is seen
 *    by rank r iff r has a query of d at a position i with j <= i (causal)
 *    and i - j < W (window W), or |i - j| < W (no mask). Beside it, the
 *    bytes of exactly the rows seen ahead (what a ring sending several row
 *    ranges per hop would move);
 *  - ranks/doc: on how many ranks the average document is (its pieces).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinicp/infinicp.h>

#include "pack_bench.h"

#define MAX_CP 64 /* the ring's visibility sets are 64-bit masks */

typedef struct options {
    int64_t tokens, window, chunk;
    int kv_heads, dim, only_cp;
    cp_mask mask;
    const char *only_mix;
} options;

/* A row of documents: n lengths, and their offsets cu[0..n]. */
typedef struct docs {
    int64_t *len, *cu;
    int n, cap;
} docs;

/* ---- document mixes ------------------------------------------------------ */

static uint64_t next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) /* in (0, 1] */
{
    return ((double)(next(s) >> 11) + 1) * 0x1p-53;
}

static int64_t uniform(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(next(s) % (uint64_t)(hi - lo + 1));
}

static int64_t lognormal(uint64_t *s, double mean, double sigma)
{
    const double u1 = uniform01(s), u2 = uniform01(s); /* in this order (bench/packed.py draws the same) */
    const double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
    return (int64_t)llround(exp(log(mean) - sigma * sigma / 2 + sigma * z));
}

static int push(docs *d, int64_t len)
{
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 256;
        int64_t *l = realloc(d->len, (size_t)d->cap * sizeof *l);
        if (!l)
            return -1;
        d->len = l;
    }
    d->len[d->n++] = len;
    return 0;
}

static int64_t used(const docs *d)
{
    int64_t sum = 0;
    for (int i = 0; i < d->n; i++)
        sum += d->len[i];
    return sum;
}

typedef enum mix_kind { LOGNORMAL_2K, LOGNORMAL_512, UNIFORM, ONE_LONG, WEB_BOOKS, NMIX } mix_kind;

static const struct {
    const char *name, *what;
} mixes[NMIX] = {
    [LOGNORMAL_2K] = { "lognormal-2k", "lognormal lengths, mean 2048, sigma 1" },
    [LOGNORMAL_512] = { "lognormal-512", "lognormal lengths, mean 512, sigma 1" },
    [UNIFORM] = { "uniform", "lengths uniform in [1, 4096]" },
    [ONE_LONG] = { "one-long", "one document of T/2, the rest uniform in [16, 512]" },
    [WEB_BOOKS] = { "web+books", "web pages (lognormal, mean 600, sigma 0.8) and 3/8 of T in 7 books and code files" },
};

/* The lengths of mix k, T tokens in all (the last document cut to fit), in
 * a shuffled order; then the offsets. */
static int make_mix(mix_kind k, int64_t T, docs *d)
{
    uint64_t s = 0x5eed0000u + (uint64_t)k;
    *d = (docs){ 0 };
    if (k == ONE_LONG && push(d, T / 2))
        return -1;
    if (k == WEB_BOOKS) {
        const int64_t books[] = { T / 8, T / 16, T / 16, T / 32, T / 32, T / 32, T / 32 };
        for (size_t i = 0; i < sizeof books / sizeof books[0]; i++)
            if (books[i] > 0 && push(d, books[i]))
                return -1;
    }
    for (int64_t sum = used(d); sum < T;) {
        int64_t len = k == LOGNORMAL_2K    ? lognormal(&s, 2048, 1)
                      : k == LOGNORMAL_512 ? lognormal(&s, 512, 1)
                      : k == UNIFORM       ? uniform(&s, 1, 4096)
                      : k == ONE_LONG      ? uniform(&s, 16, 512)
                                           : lognormal(&s, 600, 0.8);
        len = len < 1 ? 1 : len > T - sum ? T - sum : len;
        if (push(d, len))
            return -1;
        sum += len;
    }
    for (int i = d->n - 1; i > 0; i--) { /* Fisher-Yates */
        const int j = (int)(next(&s) % (uint64_t)(i + 1));
        const int64_t t = d->len[i];
        d->len[i] = d->len[j];
        d->len[j] = t;
    }
    if (!(d->cu = malloc(((size_t)d->n + 1) * sizeof *d->cu)))
        return -1;
    d->cu[0] = 0;
    for (int i = 0; i < d->n; i++)
        d->cu[i + 1] = d->cu[i] + d->len[i];
    return 0;
}

int pack_bench_docs(const char *name, int64_t T, int64_t **cu, int *n)
{
    for (int k = 0; k < NMIX; k++) {
        if (strcmp(name, mixes[k].name))
            continue;
        docs d;
        if (make_mix((mix_kind)k, T, &d)) {
            free(d.len);
            free(d.cu);
            return -2;
        }
        free(d.len);
        *cu = d.cu;
        *n = d.n;
        return 0;
    }
    return -1;
}

/* Every length rounded up to a multiple of m; returns the tokens added. */
static int64_t pad_docs(const docs *in, int64_t m, docs *out)
{
    *out = (docs){ .n = in->n };
    out->cu = malloc(((size_t)in->n + 1) * sizeof *out->cu);
    if (!out->cu)
        return -1;
    out->cu[0] = 0;
    for (int i = 0; i < in->n; i++)
        out->cu[i + 1] = out->cu[i] + (in->len[i] + m - 1) / m * m;
    return out->cu[in->n] - in->cu[in->n];
}

static void free_docs(docs *d)
{
    free(d->len);
    free(d->cu);
}

/* ---- what a pack costs ----------------------------------------------------- */

typedef struct scratch {
    int64_t cap;          /* tokens the arrays below hold */
    int64_t *pos;         /* a rank's positions */
    int32_t *ids;         /* their documents */
    int8_t *owner;        /* the rank holding each token */
    int64_t *row;         /* its row in that rank's local order */
    int64_t lo[MAX_CP * MAX_CP], hi[MAX_CP * MAX_CP]; /* rows of rank o whose farthest viewer is t hops on */
} scratch;

/* Room for a row of T tokens (a padded mix is longer than the mix). */
static int scratch_fit(scratch *s, int64_t T)
{
    if (T <= s->cap)
        return 0;
    free(s->pos);
    free(s->ids);
    free(s->owner);
    free(s->row);
    s->pos = malloc((size_t)T * sizeof *s->pos);
    s->ids = malloc((size_t)T * sizeof *s->ids);
    s->owner = malloc((size_t)T * sizeof *s->owner);
    s->row = malloc((size_t)T * sizeof *s->row);
    s->cap = s->pos && s->ids && s->owner && s->row ? T : 0;
    return s->cap ? 0 : -1;
}

typedef struct cost {
    double imbalance, ranks_per_doc;
    double ring_bytes;  /* with a cover per hop, as the ring sends */
    double exact_bytes; /* with exactly the rows seen ahead */
} cost;

/* Rank r with t = 1 .. P-1 hops still to go from o that sees a key, the
 * farthest one (largest t) in `seen`; 0: none beyond o itself. Going down
 * from o, the farthest rank is the lowest above o, else the lowest below. */
static int farthest(uint64_t seen, int o, int P)
{
    const uint64_t above = o == 63 ? 0 : seen >> (o + 1) << (o + 1);
    if (above)
        return o - __builtin_ctzll(above) + P;
    const uint64_t below = seen & ((1ull << o) - 1);
    return below ? o - __builtin_ctzll(below) : 0;
}

/* The ring's K / V bytes of one forward (see the top of this file): as
 * covers, and (*exact) as the rows seen alone. */
static double ring_bytes(const docs *d, int P, cp_mask mask, int64_t W, double row_bytes, scratch *s,
                         double *exact)
{
    double seen_rows = 0;
    for (int i = 0; i < P * P; i++) {
        s->lo[i] = INT64_MAX;
        s->hi[i] = -1;
    }
    const bool causal = mask == CP_MASK_CAUSAL;
    for (int k = 0; k < d->n; k++) {
        const int64_t b = d->cu[k], e = d->cu[k + 1];
        /* the queries that see key g lie in [lo(g), hi(g)], both rising
         * with g: a window of counts per rank slides along the document */
        int cnt[MAX_CP] = { 0 };
        uint64_t seen = 0;
        int64_t bot = b, top = b - 1;
        for (int64_t g = b; g < e; g++) {
            const int64_t lo = causal ? g : W && g - W + 1 > b ? g - W + 1 : b;
            const int64_t hi = W && g + W - 1 < e - 1 ? g + W - 1 : e - 1;
            while (top < hi) {
                const int r = s->owner[++top];
                if (!cnt[r]++)
                    seen |= 1ull << r;
            }
            for (; bot < lo; bot++) {
                const int r = s->owner[bot];
                if (!--cnt[r])
                    seen &= ~(1ull << r);
            }
            const int o = s->owner[g], t = farthest(seen, o, P);
            seen_rows += t; /* carried by hops 1 .. t */
            if (t) {
                int64_t *lo_row = &s->lo[o * P + t], *hi_row = &s->hi[o * P + t];
                *lo_row = s->row[g] < *lo_row ? s->row[g] : *lo_row;
                *hi_row = s->row[g] > *hi_row ? s->row[g] : *hi_row;
            }
        }
    }
    double rows = 0;
    for (int o = 0; o < P; o++) {
        int64_t lo = INT64_MAX, hi = -1;
        for (int h = P - 1; h >= 1; h--) { /* the hop into o-h: the rows of viewers h or more hops on */
            lo = s->lo[o * P + h] < lo ? s->lo[o * P + h] : lo;
            hi = s->hi[o * P + h] > hi ? s->hi[o * P + h] : hi;
            if (hi >= lo)
                rows += (double)(hi - lo + 1);
        }
    }
    *exact = seen_rows * row_bytes;
    return rows * row_bytes;
}

static int measure(const cp_pack *pk, const docs *d, int P, const options *o, scratch *s, cost *c)
{
    const int64_t T = d->cu[d->n], n = T / P;
    if (scratch_fit(s, T))
        return -1;
    double top = 0, sum = 0, pieces = 0;
    for (int r = 0; r < P; r++) {
        double w;
        if (cp_pack_work(pk, r, &w) != CP_SUCCESS || cp_pack_positions(pk, r, s->pos, NULL, s->ids) != CP_SUCCESS)
            return -1;
        top = w > top ? w : top;
        sum += w;
        for (int64_t i = 0; i < n; i++) {
            s->owner[s->pos[i]] = (int8_t)r;
            s->row[s->pos[i]] = i;
            pieces += i == 0 || s->ids[i] != s->ids[i - 1]; /* documents rise along a rank's rows */
        }
    }
    c->imbalance = top / (sum / P);
    c->ranks_per_doc = pieces / d->n;
    c->ring_bytes = ring_bytes(d, P, o->mask, o->window, 2.0 * o->kv_heads * o->dim * 2, s, &c->exact_bytes);
    return 0;
}

/* ---- the table ---------------------------------------------------------------- */

static const char *const policy_names[] = { "auto", "doc_zigzag", "greedy", "contiguous" };

static cp_status make_pack(const docs *d, int P, cp_balance b, const options *o, cp_pack **pk)
{
    cp_pack_config cfg = CP_PACK_CONFIG_INIT;
    cfg.cp_size = P;
    cfg.cu_seqlens = d->cu;
    cfg.num_seqs = d->n;
    cfg.mask = o->mask;
    cfg.window = o->window;
    cfg.balance = b;
    cfg.chunk = b == CP_BALANCE_GREEDY || b == CP_BALANCE_AUTO ? o->chunk : 0;
    return cp_pack_create(&cfg, pk);
}

/* Does pk split d as CONTIGUOUS does? (What AUTO chose.) */
static bool is_contiguous(const cp_pack *pk, int P, int64_t T, scratch *s)
{
    for (int r = 0; r < P; r++) {
        if (cp_pack_positions(pk, r, s->pos, NULL, NULL) != CP_SUCCESS)
            return false;
        for (int64_t i = 0; i < T / P; i++)
            if (s->pos[i] != r * (T / P) + i)
                return false;
    }
    return true;
}

/* The rows of CP size P; *padding: what DOC_ZIGZAG needs. */
static int run_cp(const docs *d, int P, const options *o, scratch *s, int64_t *padding)
{
    static const cp_balance order[] = { CP_BALANCE_CONTIGUOUS, CP_BALANCE_DOC_ZIGZAG, CP_BALANCE_GREEDY,
                                        CP_BALANCE_AUTO };
    const int64_t T = d->cu[d->n];
    docs padded;
    if ((*padding = pad_docs(d, 2 * (int64_t)P, &padded)) < 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < sizeof order / sizeof order[0] && !rc; i++) {
        const cp_balance b = order[i];
        const docs *use = b == CP_BALANCE_DOC_ZIGZAG && *padding ? &padded : d;
        cp_pack *pk = NULL;
        cost c;
        if (make_pack(use, P, b, o, &pk) != CP_SUCCESS || measure(pk, use, P, o, s, &c)) {
            fprintf(stderr, "infinicp-bench: --pack: P = %d, %s: %s\n", P, policy_names[b], cp_last_error());
            rc = -1;
        } else {
            char name[32], pad[32] = "0";
            if (b == CP_BALANCE_AUTO)
                snprintf(name, sizeof name, "auto=%s", is_contiguous(pk, P, T, s) ? "contig" : "greedy");
            else
                snprintf(name, sizeof name, "%s%s", policy_names[b], use == d ? "" : "*");
            if (b == CP_BALANCE_DOC_ZIGZAG)
                snprintf(pad, sizeof pad, "%lld (%.1f%%)", (long long)*padding,
                         100.0 * (double)*padding / (double)T);
            printf("  %3d  %-12s %9.3f %10.1f %10.1f %9.2f  %s\n", P, name, c.imbalance, c.ring_bytes / (1 << 20),
                   c.exact_bytes / (1 << 20), c.ranks_per_doc, pad);
        }
        cp_pack_destroy(pk);
    }
    free_docs(&padded);
    return rc;
}

static int parse_int(const char *opt, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > hi) {
        fprintf(stderr, "infinicp-bench: %s needs an integer in [%lld, %lld], got '%s'\n", opt, lo, hi,
                v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

static int parse(int argc, char **argv, options *o)
{
    *o = (options){ .tokens = 131072, .kv_heads = 8, .dim = 128, .mask = CP_MASK_CAUSAL };
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(opt, "--mask")) {
            if (!v || (strcmp(v, "causal") && strcmp(v, "none"))) {
                fprintf(stderr, "infinicp-bench: --mask must be causal or none\n");
                return -1;
            }
            o->mask = !strcmp(v, "none") ? CP_MASK_NONE : CP_MASK_CAUSAL;
        } else if (!strcmp(opt, "--mix")) {
            int k = 0;
            while (k < NMIX && v && strcmp(v, mixes[k].name))
                k++;
            if (k == NMIX) {
                fprintf(stderr, "infinicp-bench: --mix must be one of");
                for (k = 0; k < NMIX; k++)
                    fprintf(stderr, " %s", mixes[k].name);
                fprintf(stderr, "\n");
                return -1;
            }
            o->only_mix = v;
        } else if (!strcmp(opt, "--tokens")) {
            if (parse_int(opt, v, 128, 1 << 26, &x))
                return -1;
            o->tokens = x;
        } else if (!strcmp(opt, "--window")) {
            if (parse_int(opt, v, 0, 1ll << 40, &x))
                return -1;
            o->window = x;
        } else if (!strcmp(opt, "--chunk")) {
            if (parse_int(opt, v, 0, 1 << 20, &x))
                return -1;
            o->chunk = x;
        } else if (!strcmp(opt, "--cp")) {
            if (parse_int(opt, v, 1, MAX_CP, &x))
                return -1;
            o->only_cp = (int)x;
        } else if (!strcmp(opt, "--kv-heads")) {
            if (parse_int(opt, v, 1, 1 << 16, &x))
                return -1;
            o->kv_heads = (int)x;
        } else if (!strcmp(opt, "--dim")) {
            if (parse_int(opt, v, 1, 4096, &x))
                return -1;
            o->dim = (int)x;
        } else {
            fprintf(stderr, "infinicp-bench: unknown option '%s'\n", opt);
            return -1;
        }
        i++;
    }
    return 0;
}

int pack_bench_main(int argc, char **argv, void (*usage)(FILE *))
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    options o;
    if (parse(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }
    const int64_t T = o.tokens;
    scratch *s = calloc(1, sizeof *s);
    int rc = s && !scratch_fit(s, T) ? 0 : 1;
    /* 2, 4, ..., 64, or --cp alone; P must divide T */
    int64_t pad[NMIX][7] = { { 0 } };
    int ncp = 0, cps[7];
    for (int P = 2; P <= MAX_CP && !o.only_cp; P *= 2)
        if (T % P == 0)
            cps[ncp++] = P;
    if (o.only_cp && T % o.only_cp == 0)
        cps[ncp++] = o.only_cp;
    printf("infinicp-bench --pack: T = %lld tokens, mask %s, window %lld, K/V row %d bytes (2 x %d kv heads x "
           "%d x bf16)\n",
           (long long)T, o.mask == CP_MASK_CAUSAL ? "causal" : "none", (long long)o.window,
           2 * o.kv_heads * o.dim * 2, o.kv_heads, o.dim);
    printf("imbalance: max / mean of cp_pack_work; ring: K/V MiB the p2p ring moves per layer (forward);\n"
           "ranks/doc: ranks holding a piece of the average document; * = run on the mix padded for DOC_ZIGZAG\n");
    for (int k = 0; k < NMIX && !rc; k++) {
        if (o.only_mix && strcmp(o.only_mix, mixes[k].name))
            continue;
        docs d;
        if (make_mix((mix_kind)k, T, &d)) {
            free_docs(&d);
            rc = 1;
            break;
        }
        int64_t longest = 0;
        for (int i = 0; i < d.n; i++)
            longest = d.len[i] > longest ? d.len[i] : longest;
        printf("\n%s: %s\n  %d documents, mean %.0f, longest %lld\n", mixes[k].name, mixes[k].what, d.n,
               (double)T / d.n, (long long)longest);
        printf("    P  policy       imbalance   ring MiB  exact MiB ranks/doc  padding\n");
        for (int i = 0; i < ncp && !rc; i++)
            rc = run_cp(&d, cps[i], &o, s, &pad[k][i]) ? 1 : 0;
        free_docs(&d);
    }
    if (!rc) {
        printf("\nTransformerEngine's DOC_ZIGZAG: padding tokens it needs, %% of T\n  %-14s", "mix");
        for (int i = 0; i < ncp; i++)
            printf(" %8s%-3d", "P = ", cps[i]);
        for (int k = 0; k < NMIX; k++) {
            if (o.only_mix && strcmp(o.only_mix, mixes[k].name))
                continue;
            printf("\n  %-14s", mixes[k].name);
            for (int i = 0; i < ncp; i++)
                printf(" %10.2f%%", 100.0 * (double)pad[k][i] / (double)T);
        }
        printf("\n");
    }
    if (s) {
        free(s->pos);
        free(s->ids);
        free(s->owner);
        free(s->row);
    }
    free(s);
    return rc;
}
