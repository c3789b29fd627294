/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for cp_topology_create: a random config and order
 * string. Input: struct_size (16 bits, 0 = ours), world_size, tp, cp, dp,
 * pp, cp_a2a (32 bits each, little-endian), one byte that says whether the
 * rest is the order string (odd) or the order is NULL (even), then the
 * order's bytes (a NUL in them ends it early).
 *
 * A refused config must get a clean status and message. An accepted one
 * must satisfy, for a sample of ranks (all of them in small worlds):
 * coordinates in range and the cp = cp_a2a + cp_p2p * a2a split; rank
 * (coords) == rank; for every axis mask, a group that is sorted, holds the
 * rank at its index, has the size the axes' sizes multiply to, differs from
 * the rank only along the axes, and agrees with cp_topology_color (key ==
 * index, equal colors within the group, color below world / size).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinicp/infinicp.h>

#include "input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                    \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "fuzz-topology: %s:%d: %s failed; last error: %s\n", __FILE__, __LINE__,   \
                    #cond, cp_last_error());                                                           \
            abort();                                                                                   \
        }                                                                                              \
    } while (0)

#define ALL_AXES 64u   /* masks 0..63 of the six CP_AXIS_* bits */
#define MAX_MEMBERS 256 /* groups are listed up to this size */
#define MAX_SAMPLE 16   /* ranks checked from each end of a larger world */

typedef struct sizes {
    int world, tp, cp, dp, pp, a2a, p2p;
} sizes;

/* How many ranks a group along `axes` has. */
static int64_t group_size(const sizes *z, unsigned axes)
{
    int64_t n = 1;
    if (axes & CP_AXIS_TP)
        n *= z->tp;
    if (axes & CP_AXIS_DP)
        n *= z->dp;
    if (axes & CP_AXIS_PP)
        n *= z->pp;
    if (axes & CP_AXIS_CP)
        n *= z->cp;
    else
        n *= ((axes & CP_AXIS_CP_A2A) ? z->a2a : 1) * ((axes & CP_AXIS_CP_P2P) ? z->p2p : 1);
    return n;
}

/* Do a and b differ only along the axes? */
static bool same_outside(const cp_coords *a, const cp_coords *b, unsigned axes)
{
    bool cp_free = axes & CP_AXIS_CP;
    return ((axes & CP_AXIS_TP) || a->tp == b->tp) && ((axes & CP_AXIS_DP) || a->dp == b->dp) &&
           ((axes & CP_AXIS_PP) || a->pp == b->pp) && (cp_free || (axes & CP_AXIS_CP_A2A) || a->cp_a2a == b->cp_a2a) &&
           (cp_free || (axes & CP_AXIS_CP_P2P) || a->cp_p2p == b->cp_p2p);
}

static void check_rank(const cp_topology *t, const sizes *z, int rank, int *members)
{
    cp_coords c;
    CHECK(cp_topology_coords(t, rank, &c) == CP_SUCCESS);
    CHECK(c.tp >= 0 && c.tp < z->tp && c.cp >= 0 && c.cp < z->cp && c.dp >= 0 && c.dp < z->dp && c.pp >= 0 &&
          c.pp < z->pp);
    CHECK(c.cp_a2a >= 0 && c.cp_a2a < z->a2a && c.cp_p2p >= 0 && c.cp_p2p < z->p2p);
    CHECK(c.cp == c.cp_a2a + c.cp_p2p * z->a2a);
    int back = -1;
    CHECK(cp_topology_rank(t, &c, &back) == CP_SUCCESS && back == rank);

    for (unsigned axes = 0; axes < ALL_AXES; axes++) {
        int count = 0, index = -1, color = -1, key = -1;
        CHECK(cp_topology_group(t, rank, axes, NULL, 0, &count, &index) == CP_SUCCESS);
        CHECK(count == group_size(z, axes) && index >= 0 && index < count);
        CHECK(cp_topology_color(t, rank, axes, &color, &key) == CP_SUCCESS);
        CHECK(key == index && color >= 0 && color < z->world / count);
        if (count > MAX_MEMBERS)
            continue;
        CHECK(cp_topology_group(t, rank, axes, members, count, &count, &index) == CP_SUCCESS);
        CHECK(members[index] == rank);
        for (int i = 0; i < count; i++) {
            CHECK(i == 0 || members[i] > members[i - 1]);
            cp_coords m;
            CHECK(cp_topology_coords(t, members[i], &m) == CP_SUCCESS);
            CHECK(same_outside(&c, &m, axes));
            int mc = -1, mk = -1;
            CHECK(cp_topology_color(t, members[i], axes, &mc, &mk) == CP_SUCCESS);
            CHECK(mc == color && mk == i);
        }
        if (count > 1) { /* a list one short is refused */
            CHECK(cp_topology_group(t, rank, axes, members, count - 1, &count, &index) ==
                  CP_ERROR_INVALID_ARGUMENT);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_input in = { data, size };
    cp_topology_config cfg = CP_TOPOLOGY_CONFIG_INIT;
    cfg.struct_size = fuzz_struct_size(&in, sizeof cfg);
    cfg.world_size = fuzz_i32(&in);
    cfg.tp = fuzz_i32(&in);
    cfg.cp = fuzz_i32(&in);
    cfg.dp = fuzz_i32(&in);
    cfg.pp = fuzz_i32(&in);
    cfg.cp_a2a = fuzz_i32(&in);
    char *order = NULL;
    if (fuzz_u8(&in) & 1) {
        order = malloc(in.n + 1); /* exactly the rest: ASan sees any read past its NUL */
        CHECK(order);
        memcpy(order, in.p, in.n);
        order[in.n] = '\0';
    }
    cfg.order = order;

    cp_topology *t = (cp_topology *)&cfg; /* must be overwritten */
    cp_status s = cp_topology_create(&cfg, &t);
    if (s != CP_SUCCESS) {
        CHECK(t == NULL && s == CP_ERROR_INVALID_ARGUMENT);
        CHECK(!strncmp(cp_last_error(), "cp_topology_create: ", 20) && strlen(cp_last_error()) < 500);
        free(order);
        return 0;
    }
    /* what was accepted: the sizes multiply to the world */
    sizes z = { cfg.world_size, cfg.tp, cfg.cp, cfg.dp, cfg.pp, cfg.cp_a2a, 0 };
    CHECK(z.world >= 1 && z.tp >= 1 && z.cp >= 1 && z.pp >= 1 && z.a2a >= 1 && z.cp % z.a2a == 0);
    if (z.dp == 0)
        z.dp = (int)(z.world / ((int64_t)z.tp * z.cp * z.pp));
    CHECK((int64_t)z.tp * z.cp * z.dp * z.pp == z.world);
    z.p2p = z.cp / z.a2a;

    int *members = malloc(MAX_MEMBERS * sizeof *members);
    CHECK(members);
    for (int64_t r = 0; r < z.world; r++) {
        if (r == MAX_SAMPLE && z.world > 2 * MAX_SAMPLE)
            r = z.world - MAX_SAMPLE; /* the first and last ranks of large worlds */
        check_rank(t, &z, (int)r, members);
    }
    cp_coords c;
    CHECK(cp_topology_coords(t, z.world, &c) == CP_ERROR_INVALID_ARGUMENT);
    CHECK(cp_topology_coords(t, -1, &c) == CP_ERROR_INVALID_ARGUMENT);
    free(members);
    cp_topology_destroy(t);
    free(order);
    return 0;
}
