/* SPDX-License-Identifier: MIT */
/*
 * cp_topology against a brute-force model written here from the definition:
 * list every coordinate tuple, sort the list so that the first-named axis
 * of the order varies fastest, and call a tuple's place in that list its
 * rank. Groups are "every rank whose coordinates agree outside the axes",
 * found by sorting on the agreeing coordinates. Checked for every
 * factorization world = tp*cp*dp*pp of worlds 1..64, every cp_a2a dividing
 * cp, every one of the 64 axis masks (default order) and every one of the
 * 24 orders (with the masks that matter for order).
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

#define MAX_WORLD 64
#define NUM_MASKS 64 /* every union of the six CP_AXIS_* bits */

/* ---- the model ---------------------------------------------------------- */

/* Coordinates of one rank in the model: the four named axes by name, plus
 * the split of cp. Index order of `named`: tp, cp, dp, pp. */
typedef struct tuple {
    int named[4];
    int a2a, p2p;
} tuple;

static const char *const names[4] = { "tp", "cp", "dp", "pp" };

/* The order being modelled, fastest first, as indices into names. */
static int model_order[4];

static int cmp_by_order(const void *pa, const void *pb)
{
    const tuple *a = pa, *b = pb;
    for (int i = 3; i >= 0; i--) { /* slowest axis is the most significant */
        int ax = model_order[i];
        if (a->named[ax] != b->named[ax])
            return a->named[ax] < b->named[ax] ? -1 : 1;
    }
    return 0;
}

typedef struct model {
    int world, sizes[4], a2a;
    tuple at[MAX_WORLD]; /* at[rank] */
} model;

static void model_build(model *m, const int sizes[4], int a2a, const int order[4])
{
    memcpy(m->sizes, sizes, sizeof m->sizes);
    memcpy(model_order, order, sizeof model_order);
    m->a2a = a2a;
    int n = 0;
    for (int tp = 0; tp < sizes[0]; tp++)
        for (int cp = 0; cp < sizes[1]; cp++)
            for (int dp = 0; dp < sizes[2]; dp++)
                for (int pp = 0; pp < sizes[3]; pp++)
                    m->at[n++] = (tuple){ { tp, cp, dp, pp }, cp % a2a, cp / a2a };
    m->world = n;
    qsort(m->at, (size_t)n, sizeof m->at[0], cmp_by_order);
}

/* Whether each of the five independent directions (tp, cp_a2a, cp_p2p, dp,
 * pp) is free under an axis mask. */
static void free_dims(unsigned mask, int free_[5])
{
    free_[0] = !!(mask & CP_AXIS_TP);
    free_[1] = !!(mask & (CP_AXIS_CP | CP_AXIS_CP_A2A));
    free_[2] = !!(mask & (CP_AXIS_CP | CP_AXIS_CP_P2P));
    free_[3] = !!(mask & CP_AXIS_DP);
    free_[4] = !!(mask & CP_AXIS_PP);
}

static void dims_of(const tuple *t, int v[5])
{
    v[0] = t->named[0];
    v[1] = t->a2a;
    v[2] = t->p2p;
    v[3] = t->named[2];
    v[4] = t->named[3];
}

/* Identity of a rank's group: its coordinates along the fixed directions,
 * numbered densely so that they can index buckets. */
static int fixed_key(const model *m, const tuple *t, unsigned mask)
{
    int f[5], v[5];
    int dsize[5] = { m->sizes[0], m->a2a, m->sizes[1] / m->a2a, m->sizes[2], m->sizes[3] };
    free_dims(mask, f);
    dims_of(t, v);
    int key = 0;
    for (int i = 0; i < 5; i++)
        if (!f[i])
            key = key * dsize[i] + v[i];
    return key;
}

/* Groups as lists: members[start[r] .. start[r]+len[r]) is the group of r,
 * ranks ascending. Built by bucketing ranks on a key in [0, world). */
typedef struct grouping {
    int members[MAX_WORLD];
    int start[MAX_WORLD], len[MAX_WORLD];
} grouping;

/* Bucket ranks by key[r]; inside a bucket, ranks sorted by sub[r] (a
 * permutation of 0..len-1 inside each bucket) or ascending if sub is NULL.
 * Fails the test if sub is not such a permutation. */
static void bucket(grouping *g, int world, const int *key, const int *sub)
{
    int count[MAX_WORLD + 1] = { 0 }, fill[MAX_WORLD] = { 0 };
    for (int r = 0; r < world; r++) {
        if (key[r] < 0 || key[r] >= world)
            fail_msg("group key %d of rank %d out of [0, %d)", key[r], r, world);
        count[key[r] + 1]++;
    }
    for (int k = 0; k < world; k++)
        count[k + 1] += count[k];
    for (int r = 0; r < world; r++) {
        int b = key[r], len = count[b + 1] - count[b];
        int slot = sub ? sub[r] : fill[b]++;
        if (slot < 0 || slot >= len)
            fail_msg("rank %d: key %d out of [0, %d)", r, slot, len);
        g->members[count[b] + slot] = r;
        g->start[r] = count[b];
        g->len[r] = len;
    }
    for (int r = 0; r < world; r++)
        if (sub && g->members[g->start[r] + sub[r]] != r)
            fail_msg("two ranks of one group share key %d", sub[r]);
}

static void model_groups(const model *m, unsigned mask, grouping *g)
{
    int key[MAX_WORLD];
    for (int r = 0; r < m->world; r++)
        key[r] = fixed_key(m, &m->at[r], mask);
    bucket(g, m->world, key, NULL);
}

/* Fail with a message unless cond; cheaper than cmocka's asserts, which
 * matters in a loop of millions of checks. */
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg("%s:%d: %s (world %d, sizes %d/%d/%d/%d, a2a %d, mask 0x%x)", __FILE__, __LINE__, \
                     #cond, m->world, m->sizes[0], m->sizes[1], m->sizes[2], m->sizes[3], m->a2a, mask); \
    } while (0)

/* ---- checking the library against it ------------------------------------ */

static cp_topology *make(const model *m, const char *order)
{
    cp_topology_config cfg = CP_TOPOLOGY_CONFIG_INIT;
    cfg.world_size = m->world;
    cfg.tp = m->sizes[0];
    cfg.cp = m->sizes[1];
    cfg.dp = m->sizes[2];
    cfg.pp = m->sizes[3];
    cfg.cp_a2a = m->a2a;
    cfg.order = order;
    cp_topology *t = NULL;
    cp_status s = cp_topology_create(&cfg, &t);
    if (s != CP_SUCCESS)
        fail_msg("cp_topology_create(world %d, %d/%d/%d/%d, a2a %d, %s): %s", m->world, cfg.tp, cfg.cp,
                 cfg.dp, cfg.pp, cfg.cp_a2a, order, cp_last_error());
    return t;
}

static void check_coords(const cp_topology *t, const model *m)
{
    for (int r = 0; r < m->world; r++) {
        const tuple *w = &m->at[r];
        cp_coords c;
        assert_int_equal(cp_topology_coords(t, r, &c), CP_SUCCESS);
        assert_int_equal(c.tp, w->named[0]);
        assert_int_equal(c.cp, w->named[1]);
        assert_int_equal(c.dp, w->named[2]);
        assert_int_equal(c.pp, w->named[3]);
        assert_int_equal(c.cp_a2a, w->a2a);
        assert_int_equal(c.cp_p2p, w->p2p);
        int back = -1;
        assert_int_equal(cp_topology_rank(t, &c, &back), CP_SUCCESS);
        assert_int_equal(back, r);
    }
}

/* The coordinate a one-axis group is indexed by, or -1 for other masks. */
static int axis_coord(const tuple *w, unsigned mask)
{
    switch (mask) {
    case CP_AXIS_TP: return w->named[0];
    case CP_AXIS_CP:
    case CP_AXIS_CP_A2A | CP_AXIS_CP_P2P: return w->named[1];
    case CP_AXIS_DP: return w->named[2];
    case CP_AXIS_PP: return w->named[3];
    case CP_AXIS_CP_A2A: return w->a2a;
    case CP_AXIS_CP_P2P: return w->p2p;
    }
    return -1;
}

static void check_groups(const cp_topology *t, const model *m, unsigned mask)
{
    grouping g;
    model_groups(m, mask, &g);
    int expect_size = 1; /* the product of the free sizes */
    int f[5];
    free_dims(mask, f);
    int dsize[5] = { m->sizes[0], m->a2a, m->sizes[1] / m->a2a, m->sizes[2], m->sizes[3] };
    for (int i = 0; i < 5; i++)
        expect_size *= f[i] ? dsize[i] : 1;

    static int lib[MAX_WORLD][MAX_WORLD]; /* lib[r]: the library's group of r */
    int size[MAX_WORLD], pos[MAX_WORLD];
    for (int r = 0; r < m->world; r++) {
        int *ranks = lib[r], count = -1, index = -1;
        CHECK(cp_topology_group(t, r, mask, ranks, MAX_WORLD, &count, &index) == CP_SUCCESS);
        CHECK(count == g.len[r]);
        CHECK(count == expect_size);
        CHECK(!memcmp(ranks, &g.members[g.start[r]], (size_t)count * sizeof(int)));
        CHECK(index >= 0 && index < count && ranks[index] == r);
        int ax = axis_coord(&m->at[r], mask);
        CHECK(ax < 0 || index == ax);
        size[r] = count;
        pos[r] = index;
    }
    /* Partition: every member of r's group has a group of the same size and
     * smallest rank, with the member at its own index; together with the
     * model comparison above, each rank lies in exactly one group. */
    for (int r = 0; r < m->world; r++)
        for (int k = 0; k < size[r]; k++) {
            int other = lib[r][k];
            CHECK(size[other] == size[r] && pos[other] == k && lib[other][0] == lib[r][0]);
        }

    /* Simulate a split by (color, key): ranks of equal color form a group,
     * ordered by key; it must be the model's group in the model's order. */
    int color[MAX_WORLD], key[MAX_WORLD];
    for (int r = 0; r < m->world; r++) {
        CHECK(cp_topology_color(t, r, mask, &color[r], &key[r]) == CP_SUCCESS);
        CHECK(color[r] >= 0 && color[r] < m->world / expect_size);
    }
    grouping split;
    bucket(&split, m->world, color, key);
    for (int r = 0; r < m->world; r++) {
        CHECK(split.len[r] == g.len[r]);
        CHECK(!memcmp(&split.members[split.start[r]], &g.members[g.start[r]], (size_t)g.len[r] * sizeof(int)));
    }
}

static int next_permutation(int *a, int n)
{
    int i = n - 2;
    while (i >= 0 && a[i] >= a[i + 1])
        i--;
    if (i < 0)
        return 0;
    int j = n - 1;
    while (a[j] <= a[i])
        j--;
    int tmp = a[i];
    a[i] = a[j];
    a[j] = tmp;
    for (int l = i + 1, r = n - 1; l < r; l++, r--) {
        tmp = a[l];
        a[l] = a[r];
        a[r] = tmp;
    }
    return 1;
}

/* Checks every (sizes, cp_a2a) of worlds 1..64 in one order against the
 * model, with the given masks; returns how many topologies it checked. */
static long for_each_factorization(const int order[4], const unsigned *masks, int num_masks)
{
    char spelled[16];
    snprintf(spelled, sizeof spelled, "%s-%s-%s-%s", names[order[0]], names[order[1]], names[order[2]],
             names[order[3]]);
    long topologies = 0;
    for (int world = 1; world <= MAX_WORLD; world++)
        for (int tp = 1; tp <= world; tp++)
            for (int cp = 1; cp <= world; cp++)
                for (int dp = 1; dp <= world; dp++) {
                    if (world % (tp * cp * dp))
                        continue;
                    int sizes[4] = { tp, cp, dp, world / (tp * cp * dp) };
                    for (int a2a = 1; a2a <= cp; a2a++) {
                        if (cp % a2a)
                            continue;
                        model m;
                        model_build(&m, sizes, a2a, order);
                        assert_int_equal(m.world, world);
                        cp_topology *t = make(&m, spelled);
                        check_coords(t, &m);
                        for (int i = 0; i < num_masks; i++)
                            check_groups(t, &m, masks[i]);
                        cp_topology_destroy(t);
                        topologies++;
                    }
                }
    return topologies;
}

/* 3652 (sizes, cp_a2a) combinations exist for worlds 1..64. */
#define COMBINATIONS 3652

static void test_every_mask_default_order(void **state)
{
    (void)state;
    unsigned masks[NUM_MASKS];
    for (unsigned i = 0; i < NUM_MASKS; i++)
        masks[i] = i;
    const int order[4] = { 0, 1, 2, 3 };
    assert_int_equal(for_each_factorization(order, masks, NUM_MASKS), COMBINATIONS);
}

/* Order only moves strides around, so every order is checked with the
 * masks that touch each axis alone, the DPxCP group, none and all. */
static void test_every_order(void **state)
{
    (void)state;
    static const unsigned masks[] = {
        0, CP_AXIS_TP, CP_AXIS_CP, CP_AXIS_DP, CP_AXIS_PP, CP_AXIS_CP_A2A, CP_AXIS_CP_P2P,
        CP_AXIS_DP | CP_AXIS_CP, CP_AXIS_TP | CP_AXIS_CP_P2P | CP_AXIS_PP, NUM_MASKS - 1,
    };
    int order[4] = { 0, 1, 2, 3 };
    int orders = 0;
    do {
        assert_int_equal(for_each_factorization(order, masks, (int)(sizeof masks / sizeof masks[0])),
                         COMBINATIONS);
        orders++;
    } while (next_permutation(order, 4));
    assert_int_equal(orders, 24);
}

/* The Megatron formula the issue states, for the default order (NULL and
 * the spelled-out default must agree with it). */
static void test_default_order_is_megatron(void **state)
{
    (void)state;
    const char *orders[] = { NULL, "tp-cp-dp-pp" };
    for (int o = 0; o < 2; o++) {
        cp_topology_config cfg = CP_TOPOLOGY_CONFIG_INIT;
        cfg.world_size = 48;
        cfg.tp = 2;
        cfg.cp = 4;
        cfg.dp = 0; /* derived: 3 */
        cfg.pp = 2;
        cfg.cp_a2a = 2;
        cfg.order = orders[o];
        cp_topology *t;
        assert_int_equal(cp_topology_create(&cfg, &t), CP_SUCCESS);
        for (int r = 0; r < 48; r++) {
            cp_coords c;
            assert_int_equal(cp_topology_coords(t, r, &c), CP_SUCCESS);
            assert_int_equal(c.tp + c.cp * 2 + c.dp * 8 + c.pp * 24, r);
            assert_in_range(c.dp, 0, 2);
            assert_int_equal(c.cp, c.cp_a2a + 2 * c.cp_p2p);
        }
        /* tp > 1: the CP group of rank 1 is strided: 1, 3, 5, 7 */
        int ranks[8], n, idx;
        assert_int_equal(cp_topology_group(t, 5, CP_AXIS_CP, ranks, 8, &n, &idx), CP_SUCCESS);
        assert_int_equal(n, 4);
        assert_int_equal(idx, 2);
        for (int k = 0; k < 4; k++)
            assert_int_equal(ranks[k], 1 + 2 * k);
        cp_topology_destroy(t);
    }
}

static void test_config_defaults_and_versions(void **state)
{
    (void)state;
    cp_topology *t = NULL;
    assert_int_equal(cp_topology_create(NULL, &t), CP_SUCCESS); /* world of one */
    cp_coords c;
    assert_int_equal(cp_topology_coords(t, 0, &c), CP_SUCCESS);
    assert_int_equal(c.tp + c.cp + c.dp + c.pp + c.cp_a2a + c.cp_p2p, 0);
    cp_topology_destroy(t);
    cp_topology_destroy(NULL);

    /* an older caller that knows fewer fields is refused only below v1 */
    cp_topology_config cfg = CP_TOPOLOGY_CONFIG_INIT;
    cfg.struct_size = sizeof(size_t) + sizeof(int);
    t = (cp_topology *)&cfg;
    EXPECT_ERROR(cp_topology_create(&cfg, &t), CP_ERROR_INVALID_ARGUMENT, "cfg->struct_size");
    assert_null(t);
    /* a newer caller's larger struct is fine */
    struct {
        cp_topology_config c;
        int future;
    } bigger = { CP_TOPOLOGY_CONFIG_INIT, 7 };
    bigger.c.struct_size = sizeof bigger;
    bigger.c.world_size = 4;
    bigger.c.cp = 4;
    assert_int_equal(cp_topology_create(&bigger.c, &t), CP_SUCCESS);
    int n;
    assert_int_equal(cp_topology_group(t, 0, CP_AXIS_DP, NULL, 0, &n, NULL), CP_SUCCESS);
    assert_int_equal(n, 1); /* dp derived as 1 */
    cp_topology_destroy(t);
}

static cp_status create_with(int world, int tp, int cp, int dp, int pp, int a2a, const char *order)
{
    cp_topology_config cfg = CP_TOPOLOGY_CONFIG_INIT;
    cfg.world_size = world;
    cfg.tp = tp;
    cfg.cp = cp;
    cfg.dp = dp;
    cfg.pp = pp;
    cfg.cp_a2a = a2a;
    cfg.order = order;
    cp_topology *t = (cp_topology *)&cfg; /* must come back NULL */
    cp_status s = cp_topology_create(&cfg, &t);
    if (s != CP_SUCCESS)
        assert_null(t);
    cp_topology_destroy(t);
    return s;
}

static void test_bad_configs(void **state)
{
    (void)state;
    const cp_status E = CP_ERROR_INVALID_ARGUMENT;
    EXPECT_ERROR(cp_topology_create(NULL, NULL), E, "out");
    EXPECT_ERROR(create_with(0, 1, 1, 0, 1, 1, NULL), E, "world_size = 0");
    EXPECT_ERROR(create_with(8, 3, 1, 0, 1, 1, NULL), E, "cfg->tp = 3 does not divide world_size = 8");
    EXPECT_ERROR(create_with(8, 0, 1, 0, 1, 1, NULL), E, "cfg->tp = 0");
    EXPECT_ERROR(create_with(8, 1, -2, 0, 1, 1, NULL), E, "cfg->cp = -2");
    EXPECT_ERROR(create_with(8, 1, 1, -1, 1, 1, NULL), E, "cfg->dp = -1");
    EXPECT_ERROR(create_with(8, 1, 1, 0, 16, 1, NULL), E, "cfg->pp = 16 does not divide world_size = 8");
    /* product != world */
    EXPECT_ERROR(create_with(8, 2, 2, 1, 1, 1, NULL), E, "tp*cp*dp*pp = 2*2*1*1 = 4 != world_size = 8");
    EXPECT_ERROR(create_with(16, 4, 4, 4, 4, 1, NULL), E, "tp*cp*dp*pp = 4*4*4*4 = 256 != world_size = 16");
    EXPECT_ERROR(create_with(12, 4, 6, 0, 1, 1, NULL), E, "tp*cp*pp = 4*6*1 = 24 does not divide world_size = 12");
    /* huge sizes must not overflow the product */
    EXPECT_ERROR(create_with(1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 1, NULL), E, "!= world_size = 1073741824");
    /* cp_a2a */
    EXPECT_ERROR(create_with(8, 1, 4, 0, 1, 3, NULL), E, "cfg->cp_a2a = 3 does not divide cfg->cp = 4");
    EXPECT_ERROR(create_with(8, 1, 4, 0, 1, 0, NULL), E, "cfg->cp_a2a = 0");
    /* order strings */
    EXPECT_ERROR(create_with(8, 2, 2, 2, 1, 1, "tp-cp-xx-pp"), E, "unknown axis name \"xx\"");
    EXPECT_ERROR(create_with(8, 2, 2, 2, 1, 1, "tp-cp-cp-pp"), E, "axis \"cp\" appears twice");
    EXPECT_ERROR(create_with(8, 2, 2, 2, 1, 1, "tp-cp-dp-pp-tp"), E, "axis \"tp\" appears twice");
    EXPECT_ERROR(create_with(8, 2, 2, 2, 1, 1, "tp-cp-dp"), E, "names 3 axes");
    EXPECT_ERROR(create_with(8, 2, 2, 2, 1, 1, ""), E, "unknown axis name \"\"");
    EXPECT_ERROR(create_with(8, 2, 2, 2, 1, 1, "tp-cp-dp-pp-"), E, "unknown axis name \"\"");
    EXPECT_ERROR(create_with(8, 2, 2, 2, 1, 1, "TP-CP-DP-PP"), E, "\"TP\"");
    EXPECT_ERROR(create_with(8, 2, 2, 2, 1, 1, "tp_cp_dp_pp"), E, "cfg->order = \"tp_cp_dp_pp\"");
}

static void test_bad_queries(void **state)
{
    (void)state;
    const cp_status E = CP_ERROR_INVALID_ARGUMENT;
    cp_topology_config cfg = CP_TOPOLOGY_CONFIG_INIT;
    cfg.world_size = 16;
    cfg.tp = 2;
    cfg.cp = 4;
    cfg.cp_a2a = 2;
    cp_topology *t;
    assert_int_equal(cp_topology_create(&cfg, &t), CP_SUCCESS);
    cp_coords c;
    int r, ranks[16], n, idx, color, key;

    EXPECT_ERROR(cp_topology_coords(t, 16, &c), E, "rank = 16 (must be in [0, world_size = 16))");
    EXPECT_ERROR(cp_topology_coords(t, -1, &c), E, "rank = -1");
    EXPECT_ERROR(cp_topology_coords(NULL, 0, &c), E, "t is NULL");
    EXPECT_ERROR(cp_topology_coords(t, 0, NULL), E, "out is NULL");

    assert_int_equal(cp_topology_coords(t, 11, &c), CP_SUCCESS);
    cp_coords bad = c;
    bad.tp = 2;
    EXPECT_ERROR(cp_topology_rank(t, &bad, &r), E, "c->tp = 2 (must be in [0, 2))");
    assert_int_equal(r, -1);
    bad = c;
    bad.dp = -1;
    EXPECT_ERROR(cp_topology_rank(t, &bad, &r), E, "c->dp = -1");
    bad = c;
    bad.cp_p2p = 2;
    EXPECT_ERROR(cp_topology_rank(t, &bad, &r), E, "c->cp_p2p = 2 (must be in [0, 2))");
    bad = c;
    bad.cp = (c.cp + 1) % 4; /* in range, but disagrees with its split */
    EXPECT_ERROR(cp_topology_rank(t, &bad, &r), E, "disagrees");
    EXPECT_ERROR(cp_topology_rank(t, NULL, &r), E, "c is NULL");
    EXPECT_ERROR(cp_topology_rank(t, &c, NULL), E, "rank is NULL");

    EXPECT_ERROR(cp_topology_group(t, 0, CP_AXIS_CP, ranks, 3, &n, &idx), E,
                 "capacity = 3 is smaller than the group of rank 0 (4 ranks)");
    EXPECT_ERROR(cp_topology_group(t, 0, CP_AXIS_CP, NULL, 4, &n, &idx), E, "ranks is NULL but capacity = 4");
    EXPECT_ERROR(cp_topology_group(t, 0, CP_AXIS_CP, ranks, -1, &n, &idx), E, "capacity = -1");
    EXPECT_ERROR(cp_topology_group(t, 0, 0x40, ranks, 16, &n, &idx), E, "axes = 0x40");
    EXPECT_ERROR(cp_topology_group(t, 99, CP_AXIS_CP, ranks, 16, &n, &idx), E, "rank = 99");
    EXPECT_ERROR(cp_topology_group(t, 0, CP_AXIS_CP, ranks, 16, NULL, &idx), E, "count is NULL");
    /* a size query, and index is optional */
    assert_int_equal(cp_topology_group(t, 3, CP_AXIS_CP | CP_AXIS_DP, NULL, 0, &n, &idx), CP_SUCCESS);
    assert_int_equal(n, 8);
    assert_int_equal(cp_topology_group(t, 3, CP_AXIS_CP | CP_AXIS_DP, ranks, 8, &n, NULL), CP_SUCCESS);

    EXPECT_ERROR(cp_topology_color(t, 16, CP_AXIS_CP, &color, &key), E, "rank = 16");
    assert_int_equal(color, -1);
    EXPECT_ERROR(cp_topology_color(t, 0, 0x80 | CP_AXIS_TP, &color, &key), E, "unknown bits 0x80");
    EXPECT_ERROR(cp_topology_color(t, 0, CP_AXIS_CP, NULL, &key), E, "color is NULL");
    EXPECT_ERROR(cp_topology_color(t, 0, CP_AXIS_CP, &color, NULL), E, "key is NULL");
    cp_topology_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_order_is_megatron),
        cmocka_unit_test(test_config_defaults_and_versions),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_bad_queries),
        cmocka_unit_test(test_every_mask_default_order),
        cmocka_unit_test(test_every_order),
    };
    return cmocka_run_group_tests_name("topology", tests, NULL, NULL);
}
