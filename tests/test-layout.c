/* SPDX-License-Identifier: MIT */
/*
 * Sequence layouts against a model written here from the words of
 * docs/ARCHITECTURE.md, Sequence layouts: "contiguous: rank r holds
 * [r*S/P, (r+1)*S/P)"; "zigzag: cut S into 2P chunks; rank r holds chunk r
 * and chunk 2P-1-r". The model answers "who
 * owns global position p"; the library answers "which positions does rank
 * r hold" - the two must be inverse to each other.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "testutil.h"

/* Owner of global position p. */
static int model_owner(cp_layout l, int P, int64_t S, int64_t p)
{
    if (l == CP_LAYOUT_CONTIGUOUS)
        return (int)(p / (S / P));
    int64_t chunk = p / (S / (2 * P));
    return (int)(chunk < P ? chunk : 2 * P - 1 - chunk);
}

/* The rank's positions in local order. Both layouts store them ascending:
 * zigzag's chunk r comes before chunk 2P-1-r and r < 2P-1-r. */
static int64_t *model_positions(cp_layout l, int P, int r, int64_t S)
{
    int64_t *v = malloc((size_t)(S / P) * sizeof *v), n = 0;
    assert_non_null(v);
    for (int64_t p = 0; p < S; p++)
        if (model_owner(l, P, S, p) == r)
            v[n++] = p;
    assert_int_equal(n, S / P);
    return v;
}

static const cp_layout layouts[] = { CP_LAYOUT_CONTIGUOUS, CP_LAYOUT_ZIGZAG };

static void test_positions_match_model(void **state)
{
    (void)state;
    for (int li = 0; li < 2; li++) {
        cp_layout l = layouts[li];
        for (int P = 1; P <= 16; P++) {
            int64_t unit = l == CP_LAYOUT_ZIGZAG ? 2 * P : P;
            for (int64_t mult = 1; mult <= 5; mult++) {
                int64_t S = unit * mult;
                int *seen = calloc((size_t)S, sizeof *seen);
                assert_non_null(seen);
                for (int r = 0; r < P; r++) {
                    int64_t *got = malloc((size_t)(S / P) * sizeof *got);
                    assert_non_null(got);
                    assert_int_equal(cp_layout_positions(l, P, r, S, got), CP_SUCCESS);
                    int64_t *want = model_positions(l, P, r, S);
                    assert_memory_equal(got, want, (size_t)(S / P) * sizeof *got);
                    for (int64_t i = 0; i < S / P; i++)
                        seen[got[i]]++;
                    free(want);
                    free(got);
                }
                /* partition: every global position is held exactly once */
                for (int64_t p = 0; p < S; p++)
                    assert_int_equal(seen[p], 1);
                free(seen);
            }
        }
    }
}

/* Causal (query, key) pairs between the positions of two ranks. */
static int64_t causal_pairs(const int64_t *q, const int64_t *k, int64_t n)
{
    int64_t pairs = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++)
            pairs += k[j] <= q[i];
    return pairs;
}

/* Zigzag's point: every rank has the same causal work, in total and at each
 * step of the ring (rank r against the keys of rank (r - s) mod P). The
 * contiguous layout serves as the control that the check can fail. */
static void test_zigzag_balances_causal_work(void **state)
{
    (void)state;
    for (int P = 2; P <= 12; P++) {
        for (int64_t mult = 1; mult <= 3; mult++) {
            for (int li = 0; li < 2; li++) {
                cp_layout l = layouts[li];
                int64_t S = 2 * P * mult, n = S / P;
                int64_t *pos = malloc((size_t)S * sizeof *pos);
                assert_non_null(pos);
                for (int r = 0; r < P; r++)
                    assert_int_equal(cp_layout_positions(l, P, r, S, pos + r * n), CP_SUCCESS);
                int balanced = 1;
                int64_t total0 = 0;
                for (int r = 0; r < P; r++) {
                    int64_t total = 0;
                    for (int src = 0; src < P; src++)
                        total += causal_pairs(pos + r * n, pos + src * n, n);
                    if (r == 0)
                        total0 = total;
                    balanced &= total == total0;
                    assert_true(total > 0);
                }
                int steps_balanced = 1;
                for (int s = 0; s < P; s++) {
                    int64_t w0 = causal_pairs(pos, pos + (size_t)((P - s) % P) * n, n);
                    for (int r = 1; r < P; r++)
                        steps_balanced &= causal_pairs(pos + r * n, pos + ((r - s + P) % P) * n, n) == w0;
                }
                if (l == CP_LAYOUT_ZIGZAG) {
                    assert_true(balanced);
                    assert_true(steps_balanced);
                } else {
                    assert_false(balanced);
                }
                free(pos);
            }
        }
    }
}

/* A byte that depends on where it sits in the global tensor. */
static unsigned char pattern(int64_t b, int64_t p, size_t byte)
{
    uint64_t x = (uint64_t)b * 1000003u + (uint64_t)p * 7919u + byte * 31u + 17u;
    x ^= x >> 13;
    x *= 0x9e3779b97f4a7c15ull;
    return (unsigned char)(x >> 56);
}

static void test_shard_copies_the_share(void **state)
{
    (void)state;
    cp_context *ctx;
    assert_int_equal(cp_context_create(NULL, &ctx), CP_SUCCESS);
    static const size_t token_sizes[] = { 1, 3, 8, 24 };
    for (int li = 0; li < 2; li++) {
        cp_layout l = layouts[li];
        for (int P = 1; P <= 8; P++)
            for (int64_t batch = 1; batch <= 3; batch++)
                for (int ti = 0; ti < 4; ti++) {
                    size_t tb = token_sizes[ti];
                    int64_t S = 2 * P * 3, n = S / P;
                    unsigned char *global = malloc((size_t)(batch * S) * tb);
                    unsigned char *local = malloc((size_t)(batch * n) * tb + 1);
                    assert_non_null(global);
                    assert_non_null(local);
                    for (int64_t b = 0; b < batch; b++)
                        for (int64_t p = 0; p < S; p++)
                            for (size_t j = 0; j < tb; j++)
                                global[((size_t)(b * S + p)) * tb + j] = pattern(b, p, j);
                    for (int r = 0; r < P; r++) {
                        int64_t *want = model_positions(l, P, r, S);
                        local[(size_t)(batch * n) * tb] = 0xA5; /* guard byte */
                        assert_int_equal(cp_layout_shard(ctx, l, P, r, global, local, batch, S, tb), CP_SUCCESS);
                        for (int64_t b = 0; b < batch; b++)
                            for (int64_t i = 0; i < n; i++)
                                for (size_t j = 0; j < tb; j++)
                                    assert_int_equal(local[((size_t)(b * n + i)) * tb + j], pattern(b, want[i], j));
                        assert_int_equal(local[(size_t)(batch * n) * tb], 0xA5);
                        free(want);
                    }
                    free(global);
                    free(local);
                }
    }
    cp_context_destroy(ctx);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    const cp_status E = CP_ERROR_INVALID_ARGUMENT;
    int64_t pos[64];
    EXPECT_ERROR(cp_layout_positions(CP_LAYOUT_CONTIGUOUS, 4, 0, 10, pos), E,
                 "seq_len = 10 is not divisible by cp_size = 4");
    EXPECT_ERROR(cp_layout_positions(CP_LAYOUT_ZIGZAG, 4, 0, 12, pos), E,
                 "seq_len = 12 is not divisible by 2 * cp_size = 8");
    EXPECT_ERROR(cp_layout_positions(CP_LAYOUT_ZIGZAG, 4, 4, 16, pos), E, "cp_rank = 4 (must be in [0, 4))");
    EXPECT_ERROR(cp_layout_positions(CP_LAYOUT_ZIGZAG, 4, -1, 16, pos), E, "cp_rank = -1");
    EXPECT_ERROR(cp_layout_positions(CP_LAYOUT_ZIGZAG, 0, 0, 16, pos), E, "cp_size = 0");
    EXPECT_ERROR(cp_layout_positions(CP_LAYOUT_ZIGZAG, 2, 0, 0, pos), E, "seq_len = 0");
    EXPECT_ERROR(cp_layout_positions(CP_LAYOUT_ZIGZAG, 2, 0, -4, pos), E, "seq_len = -4");
    EXPECT_ERROR(cp_layout_positions((cp_layout)7, 2, 0, 8, pos), E, "layout = 7");
    EXPECT_ERROR(cp_layout_positions(CP_LAYOUT_ZIGZAG, 2, 0, 8, NULL), E, "positions is NULL");
    EXPECT_ERROR(cp_layout_positions(CP_LAYOUT_ZIGZAG, 2000000000, 0, INT64_MAX - 1, pos), E,
                 "is not divisible by 2 * cp_size = 4000000000");

    cp_context *ctx;
    assert_int_equal(cp_context_create(NULL, &ctx), CP_SUCCESS);
    char g[64] = { 0 }, l[64];
    EXPECT_ERROR(cp_layout_shard(NULL, CP_LAYOUT_ZIGZAG, 2, 0, g, l, 1, 8, 1), E, "ctx is NULL");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 0, NULL, l, 1, 8, 1), E, "global is NULL");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 0, g, NULL, 1, 8, 1), E, "local is NULL");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 0, g, l, 0, 8, 1), E, "batch = 0");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 0, g, l, 1, 8, 0), E, "token_bytes = 0");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 3, 0, g, l, 1, 8, 1), E,
                 "seq_len = 8 is not divisible by 2 * cp_size = 6");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_CONTIGUOUS, 2, 2, g, l, 1, 8, 1), E, "cp_rank = 2");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_CONTIGUOUS, 2, 0, g, l, 1, (int64_t)1 << 40, (size_t)1 << 40),
                 E, "overflows");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_CONTIGUOUS, 2, 0, g, l, (int64_t)1 << 40, 1 << 20, 1 << 20),
                 E, "overflows");
    /* 2^63 bytes fit a size_t but no address space */
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_CONTIGUOUS, 2, 0, g, l, (int64_t)1 << 23, 1 << 20, 1 << 20),
                 E, "overflows");
    /* the share may not be written over the tensor it is copied from: 16
     * bytes of global, 8 of local */
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 1, g, g, 1, 8, 2), E, "overlaps global");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 1, g, g + 15, 1, 8, 2), E, "overlaps global");
    EXPECT_ERROR(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 1, g + 8, g + 1, 1, 8, 2), E, "overlaps global");
    /* touching is not overlapping */
    assert_int_equal(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 1, g, g + 16, 1, 8, 2), CP_SUCCESS);
    assert_int_equal(cp_layout_shard(ctx, CP_LAYOUT_ZIGZAG, 2, 1, g + 8, g, 1, 8, 2), CP_SUCCESS);
    cp_context_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_positions_match_model),
        cmocka_unit_test(test_zigzag_balances_causal_work),
        cmocka_unit_test(test_shard_copies_the_share),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests_name("layout", tests, NULL, NULL);
}
