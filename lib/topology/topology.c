/* SPDX-License-Identifier: MIT */
/* cp_topology: rank <-> (tp, cp, dp, pp, cp_a2a, cp_p2p) by mixed-radix
 * arithmetic, and the groups of ranks that differ only along some axes.
 * Pure arithmetic: no communication, no device. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "topology/topology.h"

/* First published cp_topology_config: everything up to order. */
#define TOPOLOGY_CONFIG_V1_SIZE (offsetof(cp_topology_config, order) + sizeof(const char *))

#define ALL_AXES                                                                                   \
    ((unsigned)(CP_AXIS_TP | CP_AXIS_CP | CP_AXIS_DP | CP_AXIS_PP | CP_AXIS_CP_A2A | CP_AXIS_CP_P2P))

static const char *const axis_names[CPI_NUM_AXES] = { "tp", "cp", "dp", "pp" };

const char *cpi_axis_name(cpi_axis a)
{
    return (unsigned)a < CPI_NUM_AXES ? axis_names[a] : "?";
}

cp_status cpi_topology_parse_order(const char *func, const char *what, const char *s,
                                   int order[CPI_NUM_AXES])
{
    /* Long hostile strings are cut in messages, never in parsing. */
    int seen = 0, n = 0;
    const char *p = s;
    for (;;) {
        size_t len = strcspn(p, "-");
        int axis = -1;
        for (int a = 0; a < CPI_NUM_AXES; a++)
            if (len == 2 && !strncmp(p, axis_names[a], 2))
                axis = a;
        if (axis < 0)
            return cpi_error(CP_ERROR_INVALID_ARGUMENT,
                             "%s: %s = \"%.64s\": unknown axis name \"%.*s\" (expected a permutation of "
                             "tp, cp, dp, pp joined by '-', fastest first)",
                             func, what, s, (int)(len < 16 ? len : 16), p);
        if (seen & (1 << axis))
            return cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: %s = \"%.64s\": axis \"%s\" appears twice",
                             func, what, s, axis_names[axis]);
        if (n == CPI_NUM_AXES) /* unreachable: a fifth name repeats one */
            return cpi_error(CP_ERROR_INTERNAL, "%s: order parser overran", func);
        seen |= 1 << axis;
        order[n++] = axis;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    if (n != CPI_NUM_AXES)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT,
                         "%s: %s = \"%.64s\" names %d axes (needs all 4: tp, cp, dp, pp)", func, what, s, n);
    return CP_SUCCESS;
}

/* Checks a size field: >= 1 (or 0 where `zero_ok`) and a divisor of world. */
static cp_status check_size(const char *name, int v, int world, int zero_ok)
{
    if (zero_ok && v == 0)
        return CP_SUCCESS;
    CPI_CHECK(v >= 1, "cp_topology_create: cfg->%s = %d (must be >= 1%s)", name, v,
              zero_ok ? ", or 0 to derive it" : "");
    CPI_CHECK(world % v == 0, "cp_topology_create: cfg->%s = %d does not divide world_size = %d", name, v,
              world);
    return CP_SUCCESS;
}

/* a*b for positive a, b, saturating at INT64_MAX (which no world equals). */
static int64_t sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

CP_EXPORT cp_status cp_topology_create(const cp_topology_config *cfg, cp_topology **out)
{
    CPI_CHECK_PTR(out);
    *out = NULL;
    static const cp_topology_config defaults = CP_TOPOLOGY_CONFIG_INIT;
    cp_topology_config c;
    CPI_TRY(cpi_copy_config(&c, sizeof c, &defaults, cfg, TOPOLOGY_CONFIG_V1_SIZE, __func__, "cfg"));

    CPI_CHECK(c.world_size >= 1, "%s: cfg->world_size = %d (must be >= 1)", __func__, c.world_size);
    CPI_TRY(check_size("tp", c.tp, c.world_size, 0));
    CPI_TRY(check_size("cp", c.cp, c.world_size, 0));
    CPI_TRY(check_size("dp", c.dp, c.world_size, 1));
    CPI_TRY(check_size("pp", c.pp, c.world_size, 0));
    CPI_CHECK(c.cp_a2a >= 1, "%s: cfg->cp_a2a = %d (must be >= 1)", __func__, c.cp_a2a);
    CPI_CHECK(c.cp % c.cp_a2a == 0, "%s: cfg->cp_a2a = %d does not divide cfg->cp = %d", __func__, c.cp_a2a,
              c.cp);

    /* Four ints can overflow even int64: multiply saturating. */
    int64_t all = sat_mul(sat_mul(c.tp, c.cp), c.pp);
    if (c.dp == 0) {
        CPI_CHECK(c.world_size % all == 0,
                  "%s: tp*cp*pp = %d*%d*%d = %lld does not divide world_size = %d (needed to derive dp)",
                  __func__, c.tp, c.cp, c.pp, (long long)all, c.world_size);
        c.dp = (int)(c.world_size / all);
    } else {
        all = sat_mul(all, c.dp);
        CPI_CHECK(all == c.world_size, "%s: tp*cp*dp*pp = %d*%d*%d*%d = %lld != world_size = %d", __func__,
                  c.tp, c.cp, c.dp, c.pp, (long long)all, c.world_size);
    }

    int order[CPI_NUM_AXES];
    CPI_TRY(cpi_topology_parse_order(__func__, "cfg->order", c.order ? c.order : defaults.order, order));

    cp_topology *t = cpi_calloc(1, sizeof *t);
    if (!t)
        return CP_ERROR_OUT_OF_MEMORY;
    t->world_size = c.world_size;
    t->size[CPI_AXIS_TP] = c.tp;
    t->size[CPI_AXIS_CP] = c.cp;
    t->size[CPI_AXIS_DP] = c.dp;
    t->size[CPI_AXIS_PP] = c.pp;
    t->cp_a2a = c.cp_a2a;
    t->cp_p2p = c.cp / c.cp_a2a;
    int stride = 1;
    char *name = t->order_name;
    for (int i = 0; i < CPI_NUM_AXES; i++) {
        t->order[i] = order[i];
        t->stride[order[i]] = stride;
        stride *= t->size[order[i]];
        memcpy(name, axis_names[order[i]], 2);
        name[2] = i + 1 < CPI_NUM_AXES ? '-' : '\0';
        name += 3;
    }
    *out = t;
    return CP_SUCCESS;
}

CP_EXPORT void cp_topology_destroy(cp_topology *t)
{
    free(t);
}

/* One of the five independent directions a rank can move in: CP splits into
 * its a2a part (inner, consecutive cp ranks) and its p2p part. */
typedef struct dim {
    unsigned bits; /* the CP_AXIS_* bits that free this direction */
    int size, stride;
} dim;

#define NUM_DIMS 5

/* The five directions sorted by stride, i.e. fastest varying first. Sizes
 * of 1 are kept: they change nothing and keep the code branch-free. */
static void dims_of(const cp_topology *t, dim d[NUM_DIMS])
{
    int n = 0;
    for (int i = 0; i < CPI_NUM_AXES; i++) {
        int a = t->order[i];
        switch (a) {
        case CPI_AXIS_TP: d[n++] = (dim){ CP_AXIS_TP, t->size[a], t->stride[a] }; break;
        case CPI_AXIS_DP: d[n++] = (dim){ CP_AXIS_DP, t->size[a], t->stride[a] }; break;
        case CPI_AXIS_PP: d[n++] = (dim){ CP_AXIS_PP, t->size[a], t->stride[a] }; break;
        default:
            d[n++] = (dim){ CP_AXIS_CP | CP_AXIS_CP_A2A, t->cp_a2a, t->stride[a] };
            d[n++] = (dim){ CP_AXIS_CP | CP_AXIS_CP_P2P, t->cp_p2p, t->stride[a] * t->cp_a2a };
            break;
        }
    }
}

static cp_status check_rank(const char *func, const cp_topology *t, int rank)
{
    CPI_CHECK(rank >= 0 && rank < t->world_size, "%s: rank = %d (must be in [0, world_size = %d))", func,
              rank, t->world_size);
    return CP_SUCCESS;
}

static cp_status check_axes(const char *func, unsigned axes)
{
    CPI_CHECK((axes & ~ALL_AXES) == 0, "%s: axes = 0x%x has unknown bits 0x%x (valid bits: 0x%x)", func,
              axes, axes & ~ALL_AXES, ALL_AXES);
    return CP_SUCCESS;
}

/* Where `rank` sits among the ranks that differ from it only along `axes`:
 * its index in that group (mixed radix over the free directions, fastest
 * least significant), the group's size, the group's number among all groups
 * (the same over the fixed directions) and the group's smallest rank. */
typedef struct place {
    int index, count, group, base;
} place;

static place locate(const cp_topology *t, int rank, unsigned axes)
{
    dim d[NUM_DIMS];
    dims_of(t, d);
    place p = { 0, 1, 0, rank };
    int fixed_radix = 1;
    for (int i = 0; i < NUM_DIMS; i++) {
        int coord = rank / d[i].stride % d[i].size;
        if (d[i].bits & axes) {
            p.index += coord * p.count;
            p.count *= d[i].size;
            p.base -= coord * d[i].stride;
        } else {
            p.group += coord * fixed_radix;
            fixed_radix *= d[i].size;
        }
    }
    return p;
}

CP_EXPORT cp_status cp_topology_coords(const cp_topology *t, int rank, cp_coords *out)
{
    CPI_CHECK_PTR(t);
    CPI_CHECK_PTR(out);
    CPI_TRY(check_rank(__func__, t, rank));
    int v[CPI_NUM_AXES];
    for (int a = 0; a < CPI_NUM_AXES; a++)
        v[a] = rank / t->stride[a] % t->size[a];
    *out = (cp_coords){ .tp = v[CPI_AXIS_TP], .cp = v[CPI_AXIS_CP], .dp = v[CPI_AXIS_DP],
                        .pp = v[CPI_AXIS_PP], .cp_a2a = v[CPI_AXIS_CP] % t->cp_a2a,
                        .cp_p2p = v[CPI_AXIS_CP] / t->cp_a2a };
    return CP_SUCCESS;
}

static cp_status check_coord(const char *name, int v, int size)
{
    CPI_CHECK(v >= 0 && v < size, "cp_topology_rank: c->%s = %d (must be in [0, %d))", name, v, size);
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_topology_rank(const cp_topology *t, const cp_coords *c, int *rank)
{
    CPI_CHECK_PTR(rank);
    *rank = -1;
    CPI_CHECK_PTR(t);
    CPI_CHECK_PTR(c);
    CPI_TRY(check_coord("tp", c->tp, t->size[CPI_AXIS_TP]));
    CPI_TRY(check_coord("cp", c->cp, t->size[CPI_AXIS_CP]));
    CPI_TRY(check_coord("dp", c->dp, t->size[CPI_AXIS_DP]));
    CPI_TRY(check_coord("pp", c->pp, t->size[CPI_AXIS_PP]));
    CPI_TRY(check_coord("cp_a2a", c->cp_a2a, t->cp_a2a));
    CPI_TRY(check_coord("cp_p2p", c->cp_p2p, t->cp_p2p));
    CPI_CHECK(c->cp == c->cp_a2a + c->cp_p2p * t->cp_a2a,
              "%s: c->cp = %d disagrees with c->cp_a2a + c->cp_p2p * cp_a2a size = %d + %d*%d = %d", __func__,
              c->cp, c->cp_a2a, c->cp_p2p, t->cp_a2a, c->cp_a2a + c->cp_p2p * t->cp_a2a);
    *rank = c->tp * t->stride[CPI_AXIS_TP] + c->cp * t->stride[CPI_AXIS_CP] +
            c->dp * t->stride[CPI_AXIS_DP] + c->pp * t->stride[CPI_AXIS_PP];
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_topology_group(const cp_topology *t, int rank, unsigned axes, int *ranks, int capacity,
                                      int *count, int *index)
{
    CPI_CHECK_PTR(count);
    *count = 0;
    if (index)
        *index = -1;
    CPI_CHECK_PTR(t);
    CPI_TRY(check_rank(__func__, t, rank));
    CPI_TRY(check_axes(__func__, axes));
    CPI_CHECK(capacity >= 0, "%s: capacity = %d (must be >= 0)", __func__, capacity);
    CPI_CHECK(ranks != NULL || capacity == 0, "%s: ranks is NULL but capacity = %d", __func__, capacity);
    place p = locate(t, rank, axes);
    if (ranks) {
        CPI_CHECK(capacity >= p.count, "%s: capacity = %d is smaller than the group of rank %d (%d ranks)",
                  __func__, capacity, rank, p.count);
        /* Count through the free directions like an odometer, fastest
         * digit first: the ranks come out ascending, in coordinate order. */
        dim d[NUM_DIMS], free_[NUM_DIMS];
        int digit[NUM_DIMS] = { 0 }, nfree = 0;
        dims_of(t, d);
        for (int i = 0; i < NUM_DIMS; i++)
            if ((d[i].bits & axes) && d[i].size > 1)
                free_[nfree++] = d[i];
        /* int64: past the last member the odometer may step beyond INT_MAX */
        int64_t r = p.base;
        for (int k = 0; k < p.count; k++) {
            ranks[k] = (int)r;
            for (int i = 0; i < nfree; i++) {
                r += free_[i].stride;
                if (++digit[i] < free_[i].size)
                    break;
                r -= (int64_t)free_[i].size * free_[i].stride;
                digit[i] = 0;
            }
        }
    }
    *count = p.count;
    if (index)
        *index = p.index;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_topology_color(const cp_topology *t, int rank, unsigned axes, int *color, int *key)
{
    CPI_CHECK_PTR(color);
    CPI_CHECK_PTR(key);
    *color = -1;
    *key = -1;
    CPI_CHECK_PTR(t);
    CPI_TRY(check_rank(__func__, t, rank));
    CPI_TRY(check_axes(__func__, axes));
    place p = locate(t, rank, axes);
    *color = p.group;
    *key = p.index;
    return CP_SUCCESS;
}
