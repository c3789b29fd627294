/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for cp_pack_create and what a pack answers. The input
 * decodes (input.h, little-endian, in this order) into a cp_pack_config:
 *
 *   u16 struct_size (0: ours), i32 cp_size, i32 num_seqs, u8 how the
 *   documents follow, u8 fix-ups, i32 mask, i64 window, i32 balance,
 *   i64 chunk, then the documents:
 *     how 0: num_seqs + 1 raw offsets (i64), hostile ones included;
 *     how 1: num_seqs lengths (i64), summed with wrap-around from 0;
 *     how 2: num_seqs lengths 1 + (u16 % 4096), a valid row.
 *   fix-ups (lengths only): bit 0 rounds each length up to a multiple of
 *   2 cp_size (what DOC_ZIGZAG needs), bit 1 lengthens the last document
 *   so that cp_size divides the row.
 *
 * The verdict must match the rules of cp_pack_create(3) written out again
 * here: a refused config gets CP_ERROR_INVALID_ARGUMENT and a message
 * naming the function. An accepted one (small enough to check: up to
 * 2^14 tokens; larger ones are not created, so that no input asks for
 * more memory than the fuzzer allows) must split the row as promised:
 * every rank T/P tokens in two increasing groups (shared pieces, then
 * documents wholly on the rank), every token on exactly one
 * rank, document ids and positions right, the ranks' work summing to every
 * visible pair of the row, and the same config giving the same split
 * again. A broken invariant aborts.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinicp/infinicp.h>

#include "input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                            \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            fprintf(stderr, "fuzz-pack: %s:%d: %s failed; last error: %s\n", __FILE__, __LINE__, #cond,      \
                    cp_last_error());                                                                          \
            abort();                                                                                           \
        }                                                                                                      \
    } while (0)

#define MAX_DOCS 4096
#define MAX_TOKENS ((int64_t)1 << 14)

/* The documents of the input: cu[0 .. num_seqs], as the library reads them. */
static int read_docs(fuzz_input *in, int num_seqs, int how, int fix, int P, int64_t *cu)
{
    if (num_seqs < 1)
        return 0;
    if (how == 0) {
        for (int i = 0; i <= num_seqs; i++)
            cu[i] = fuzz_i64(in);
        return 1;
    }
    const uint64_t zz = P >= 1 ? 2 * (uint64_t)P : 1;
    uint64_t at = 0;
    cu[0] = 0;
    for (int i = 0; i < num_seqs; i++) {
        uint64_t len = how == 1 ? (uint64_t)fuzz_i64(in) : 1 + (uint64_t)(uint16_t)fuzz_take(in, 2) % 4096;
        if (fix & 1)
            len = (len + zz - 1) / zz * zz;
        at += len; /* wraps: hostile rows go down */
        cu[i + 1] = (int64_t)at;
    }
    if ((fix & 2) && P >= 1 && cu[num_seqs] > 0 && cu[num_seqs] % P)
        cu[num_seqs] = (int64_t)(at + (uint64_t)(P - cu[num_seqs] % P));
    return 1;
}

static int64_t default_chunk(int64_t s_loc)
{
    for (int64_t c = 128; c > 1; c /= 2)
        if (s_loc % c == 0 && s_loc / c >= 16)
            return c;
    return 1;
}

/* The rules of cp_pack_create(3): does it accept c? */
static bool accepted(const cp_pack_config *c)
{
    if (c->struct_size < sizeof *c || c->cp_size < 1 || (c->mask != CP_MASK_NONE && c->mask != CP_MASK_CAUSAL) ||
        c->window < 0 || c->balance < CP_BALANCE_AUTO || c->balance > CP_BALANCE_CONTIGUOUS || c->chunk < 0 ||
        c->num_seqs < 1 || c->cu_seqlens[0] != 0)
        return false;
    for (int i = 1; i <= c->num_seqs; i++)
        if (c->cu_seqlens[i] <= c->cu_seqlens[i - 1])
            return false;
    const int64_t T = c->cu_seqlens[c->num_seqs], P = c->cp_size;
    if (T % P || (uint64_t)(T / P) > PTRDIFF_MAX / 8)
        return false;
    if (c->balance == CP_BALANCE_GREEDY || c->balance == CP_BALANCE_AUTO) {
        const int64_t chunk = c->chunk ? c->chunk : default_chunk(T / P);
        if ((T / P) % chunk || T / chunk > INT32_MAX)
            return false;
    }
    if (c->balance == CP_BALANCE_DOC_ZIGZAG) {
        for (int i = 0; i < c->num_seqs; i++)
            if ((c->cu_seqlens[i + 1] - c->cu_seqlens[i]) % (2 * P))
                return false;
        if (2 * P * c->num_seqs > INT32_MAX)
            return false;
    }
    return true;
}

/* Visible keys of the query at position p of a document of length L. */
static int64_t keys(cp_mask mask, int64_t W, int64_t L, int64_t p)
{
    if (mask == CP_MASK_CAUSAL)
        return W && W < p + 1 ? W : p + 1;
    if (!W || W >= L)
        return L;
    const int64_t hi = p + W - 1 < L - 1 ? p + W - 1 : L - 1, lo = p - W + 1 > 0 ? p - W + 1 : 0;
    return hi - lo + 1;
}

/* The split against the promises (see the top of this file). */
static void check_pack(const cp_pack_config *c, const cp_pack *pk, const cp_pack *again)
{
    const int P = c->cp_size;
    const int64_t *cu = c->cu_seqlens, T = cu[c->num_seqs], n = T / P;
    unsigned char *seen = calloc((size_t)T, 1);
    int64_t *pos = malloc((size_t)n * sizeof *pos), *pos2 = malloc((size_t)n * sizeof *pos2);
    int64_t *dpos = malloc((size_t)n * sizeof *dpos);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    CHECK(seen && pos && pos2 && dpos && ids);
    double work = 0;
    for (int r = 0; r < P; r++) {
        CHECK(cp_pack_positions(pk, r, pos, dpos, ids) == CP_SUCCESS);
        int descents = 0; /* shared pieces, then local documents: two increasing groups */
        for (int64_t i = 0; i < n; i++) {
            CHECK(pos[i] >= 0 && pos[i] < T && !seen[pos[i]]);
            descents += i > 0 && pos[i] < pos[i - 1];
            CHECK(descents <= 1);
            seen[pos[i]] = 1;
            CHECK(ids[i] >= 0 && ids[i] < c->num_seqs && cu[ids[i]] <= pos[i] && pos[i] < cu[ids[i] + 1]);
            CHECK(dpos[i] == pos[i] - cu[ids[i]]);
        }
        double w;
        CHECK(cp_pack_work(pk, r, &w) == CP_SUCCESS && w >= (double)n);
        work += w;
        CHECK(cp_pack_positions(again, r, pos2, NULL, NULL) == CP_SUCCESS);
        CHECK(!memcmp(pos, pos2, (size_t)n * sizeof *pos));
    }
    double pairs = 0;
    for (int d = 0; d < c->num_seqs; d++)
        for (int64_t p = 0; p < cu[d + 1] - cu[d]; p++)
            pairs += (double)keys(c->mask, c->window, cu[d + 1] - cu[d], p);
    CHECK(work == pairs); /* below 2^29: exact */
    CHECK(cp_pack_positions(pk, P, pos, NULL, NULL) == CP_ERROR_INVALID_ARGUMENT);
    free(seen);
    free(pos);
    free(pos2);
    free(dpos);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_input in = { data, size };
    cp_pack_config c = CP_PACK_CONFIG_INIT;
    c.struct_size = fuzz_struct_size(&in, sizeof c);
    c.cp_size = fuzz_i32(&in);
    int num = fuzz_i32(&in);
    if (num > MAX_DOCS)
        num %= MAX_DOCS + 1;
    c.num_seqs = num;
    const int how = fuzz_u8(&in) % 3, fix = fuzz_u8(&in);
    c.mask = (cp_mask)fuzz_i32(&in);
    c.window = fuzz_i64(&in);
    c.balance = (cp_balance)fuzz_i32(&in);
    c.chunk = fuzz_i64(&in);
    static int64_t cu[MAX_DOCS + 1];
    cu[0] = 0;
    read_docs(&in, num, how, fix, c.cp_size, cu);
    c.cu_seqlens = cu;

    const bool ok = accepted(&c);
    if (ok && (cu[c.num_seqs] > MAX_TOKENS))
        return 0; /* valid, but too large to create here */
    cp_pack *pk = (cp_pack *)&c; /* must be overwritten */
    cp_status s = cp_pack_create(&c, &pk);
    if (!ok) {
        CHECK(s == CP_ERROR_INVALID_ARGUMENT && pk == NULL);
        CHECK(!strncmp(cp_last_error(), "cp_pack_create: ", 16));
        return 0;
    }
    CHECK(s == CP_SUCCESS && pk != NULL);
    cp_pack *again = NULL;
    CHECK(cp_pack_create(&c, &again) == CP_SUCCESS);
    check_pack(&c, pk, again);
    cp_pack_destroy(pk);
    cp_pack_destroy(again);
    return 0;
}
