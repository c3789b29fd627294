/* SPDX-License-Identifier: MIT */
/*
 * Every public function against hostile input: NULL for each pointer; zero,
 * negative and overflowing sizes; out-of-range enumerations; struct_size 0,
 * smaller than the first published version, or larger than ours with junk
 * after it; misaligned tensors. Each bad call must return its specific
 * status with a fresh cp_last_error() message naming the argument, and
 * leave its outputs unwritten (handles: *out = NULL). Crashes, leaks and
 * overflows show up because the suite also runs under ASan+UBSan and
 * valgrind.
 *
 * The table at the bottom has one row per exported function. The first
 * test reads the version script (argv[1]) and fails for an exported name
 * without a row, and for a row whose name is not exported. A new public
 * function needs a row: a function that runs its hostile cases, plus one
 * line in `rows`.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "testutil.h"

#define E CP_ERROR_INVALID_ARGUMENT

static const char *map_path;

/* ---- checking one hostile call ------------------------------------------- */

/* A message no hostile case produces: set before each case, so a call that
 * fails without writing its own message is caught. */
#define MARK "layout = -12345"

static void mark_error(void)
{
    int64_t pos;
    cp_layout_positions((cp_layout)-12345, 1, 0, 1, &pos);
    assert_non_null(strstr(cp_last_error(), MARK));
}

static void expect_fresh(const char *what)
{
    if (strstr(cp_last_error(), MARK))
        fail_msg("%s failed without a message of its own (still \"%s\")", what, cp_last_error());
}

/* `call` fails with `status`, and its own message names `needle`. */
#define HOSTILE(call, status, needle)                                                                  \
    do {                                                                                               \
        mark_error();                                                                                  \
        EXPECT_ERROR(call, status, needle);                                                            \
        expect_fresh(#call);                                                                           \
    } while (0)

/* An address no output may be left holding. */
#define POISON ((void *)(uintptr_t)0x5a5a5a5a5a5a5a50u)

/* ... and HOSTILE with a handle output, which must come back NULL. */
#define HOSTILE_OUT(out, call, status, needle)                                                         \
    do {                                                                                               \
        (out) = POISON;                                                                                \
        HOSTILE(call, status, needle);                                                                 \
        assert_null(out);                                                                              \
    } while (0)

/* Buffers an output must not touch are filled with this byte first. */
enum { FILL = 0xa5 };

static void fill(void *p, size_t n)
{
    memset(p, FILL, n);
}

#define untouched(p, n) untouched_((p), (n), #p)
static void untouched_(const void *p, size_t n, const char *what)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != FILL)
            fail_msg("%s: byte %zu was written by a failing call", what, i);
}

/* ---- hostile values for fields of versioned structs ---------------------- */

/*
 * A struct-taking function is tested through an adapter that calls it with
 * the struct and checks its outputs (NULL handles, untouched buffers) when
 * it fails. A case changes one field of a valid struct.
 */
typedef cp_status (*struct_call)(const void *s);

typedef enum { F_INT, F_REAL, F_NULL, F_SHIFT } field_kind;

typedef struct field_case {
    field_kind kind;
    size_t offset, size;
    int64_t value; /* F_INT: the value; F_SHIFT: bytes added to the pointer */
    double real;   /* F_REAL */
    cp_status status;
    const char *needle;
} field_case;

#define FIELD_SIZE(T, f) sizeof(((T *)0)->f)
#define INT_CASE(T, f, v, st, needle) { F_INT, offsetof(T, f), FIELD_SIZE(T, f), (int64_t)(v), 0.0, st, needle }
#define REAL_CASE(T, f, v, needle) { F_REAL, offsetof(T, f), FIELD_SIZE(T, f), 0, v, E, needle }
#define NULL_CASE(T, f, needle) { F_NULL, offsetof(T, f), FIELD_SIZE(T, f), 0, 0.0, E, needle }
#define SHIFT_CASE(T, f, by, needle) { F_SHIFT, offsetof(T, f), FIELD_SIZE(T, f), by, 0.0, E, needle }

/* Room for the largest struct plus the junk of a "newer" caller. */
#define STRUCT_ROOM 1024
#define JUNK 64

static void apply(unsigned char *s, const field_case *c)
{
    if (c->kind == F_INT && c->size == 4) {
        int32_t v = (int32_t)c->value;
        memcpy(s + c->offset, &v, 4);
    } else if (c->kind == F_INT) {
        assert_int_equal(c->size, 8);
        memcpy(s + c->offset, &c->value, 8);
    } else if (c->kind == F_REAL) {
        memcpy(s + c->offset, &c->real, sizeof c->real);
    } else {
        char *p;
        memcpy(&p, s + c->offset, sizeof p);
        p = c->kind == F_NULL ? NULL : p + c->value;
        memcpy(s + c->offset, &p, sizeof p);
    }
}

static void run_field_cases(const void *valid, size_t size, const field_case *cases, size_t n, struct_call call)
{
    _Alignas(max_align_t) unsigned char s[STRUCT_ROOM];
    assert_true(size <= sizeof s);
    memcpy(s, valid, size);
    assert_int_equal(call(s), CP_SUCCESS); /* the base case is valid */
    for (size_t i = 0; i < n; i++) {
        memcpy(s, valid, size);
        apply(s, &cases[i]);
        mark_error();
        cp_status st = call(s);
        if (st != cases[i].status)
            fail_msg("case %zu (\"%s\"): status %d (%s), expected %d; last error: %s", i, cases[i].needle,
                     (int)st, cp_status_string(st), (int)cases[i].status, cp_last_error());
        expect_fresh(cases[i].needle);
        if (!strstr(cp_last_error(), cases[i].needle))
            fail_msg("case %zu: message \"%s\" does not name \"%s\"", i, cp_last_error(), cases[i].needle);
    }
}

/*
 * struct_size: 0, only the size field, one byte short of the first version
 * are refused; the first version with junk after it and a larger struct
 * with junk after ours are read as far as they go (junk read by mistake
 * would be invalid in every field).
 */
static void run_struct_sizes(const char *what, const void *valid, size_t size, size_t first, struct_call call)
{
    _Alignas(max_align_t) unsigned char s[STRUCT_ROOM];
    assert_true(size + JUNK <= sizeof s && first <= size);
    const size_t bad[] = { 0, sizeof(size_t), first - 1 };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(s, valid, size);
        memcpy(s, &bad[i], sizeof bad[i]);
        char needle[64];
        snprintf(needle, sizeof needle, "%s->struct_size = %zu", what, bad[i]);
        HOSTILE(call(s), E, needle);
    }
    const size_t good[] = { first, size + JUNK };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        fill(s, sizeof s);
        memcpy(s, valid, good[i] < size ? good[i] : size);
        memcpy(s, &good[i], sizeof good[i]);
        if (call(s) != CP_SUCCESS)
            fail_msg("%s->struct_size = %zu with junk after it: %s", what, good[i], cp_last_error());
    }
}

/* ---- shared objects ------------------------------------------------------- */

/* The plan's shape: one rank, so every tensor holds the whole sequence. */
enum { SEQ = 16, HEADS = 2, KV_HEADS = 1, DIM = 4 };
/* The kernels' block shape. */
enum { KB = 1, KSQ = 4, KSK = 4, KH = 2, KHKV = 1, KD = 4 };

static struct {
    cp_context *ctx;
    cp_comm *comm;
    cp_group *group;
    cp_attn_plan *plan;
    cp_attn_desc desc;
    size_t ws_fwd, ws_bwd;
    unsigned char *ws;
    cp_topology *topo; /* world 8: tp 2, cp 2, dp 2 */
    cp_topology_config topo_cfg;
    cp_ckpt_meta *meta;
    /* packs of the row pack_cu (T = 16) on 1 and 2 ranks, and of a row of 32 on 1 */
    cp_pack *pack1, *pack2, *pack32;
} fx;

/* Tensors for the plan and the kernels (both fit in these). */
static struct {
    _Alignas(64) float q[256], k[256], v[256], o[256], lse[64], dout[256], dq[256], dk[256], dv[256];
    _Alignas(64) float part[256], lse_part[64];
    _Alignas(64) float sinks[16], dsinks[16];
} buf;

static cp_attn_desc valid_desc(void)
{
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = 1;
    d.seq_len = SEQ;
    d.num_heads = HEADS;
    d.num_kv_heads = KV_HEADS;
    d.head_dim = DIM;
    return d;
}

/* Two documents, of 6 and 10 tokens: T = 16. */
static const int64_t pack_cu[] = { 0, 6, 16 };

static cp_pack_config valid_pack_config(int cp_size)
{
    cp_pack_config c = CP_PACK_CONFIG_INIT;
    c.cp_size = cp_size;
    c.cu_seqlens = pack_cu;
    c.num_seqs = 2;
    return c;
}

static int setup(void **state)
{
    (void)state;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    assert_int_equal(cp_context_create(&cc, &fx.ctx), CP_SUCCESS);
    assert_int_equal(cp_comm_create_local(1, &fx.comm), CP_SUCCESS);
    assert_int_equal(cp_group_create(fx.ctx, fx.comm, NULL, &fx.group), CP_SUCCESS);
    fx.desc = valid_desc();
    assert_int_equal(cp_attn_plan_create(fx.group, &fx.desc, &fx.plan), CP_SUCCESS);
    assert_int_equal(cp_attn_workspace_size(fx.plan, &fx.ws_fwd, &fx.ws_bwd), CP_SUCCESS);
    fx.ws = aligned_alloc(64, ((fx.ws_fwd > fx.ws_bwd ? fx.ws_fwd : fx.ws_bwd) + 64 + 63) / 64 * 64);
    assert_non_null(fx.ws);
    fx.topo_cfg = (cp_topology_config)CP_TOPOLOGY_CONFIG_INIT;
    fx.topo_cfg.world_size = 8;
    fx.topo_cfg.tp = 2;
    fx.topo_cfg.cp = 2;
    assert_int_equal(cp_topology_create(&fx.topo_cfg, &fx.topo), CP_SUCCESS);
    assert_int_equal(cp_ckpt_meta_create(fx.topo, &fx.desc, &fx.meta), CP_SUCCESS);
    cp_pack_config pc = valid_pack_config(1);
    assert_int_equal(cp_pack_create(&pc, &fx.pack1), CP_SUCCESS);
    pc.cp_size = 2;
    assert_int_equal(cp_pack_create(&pc, &fx.pack2), CP_SUCCESS);
    static const int64_t cu32[] = { 0, 32 };
    pc = valid_pack_config(1);
    pc.cu_seqlens = cu32;
    pc.num_seqs = 1;
    assert_int_equal(cp_pack_create(&pc, &fx.pack32), CP_SUCCESS);
    float *all = (float *)&buf;
    for (size_t i = 0; i < sizeof buf / sizeof(float); i++)
        all[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cp_pack_destroy(fx.pack32);
    cp_pack_destroy(fx.pack2);
    cp_pack_destroy(fx.pack1);
    cp_ckpt_meta_destroy(fx.meta);
    cp_topology_destroy(fx.topo);
    free(fx.ws);
    cp_attn_plan_destroy(fx.plan);
    cp_group_destroy(fx.group);
    cp_comm_destroy(fx.comm);
    cp_context_destroy(fx.ctx);
    return 0;
}

/* ---- status, version, context -------------------------------------------- */

static void row_status_string(void **state)
{
    (void)state;
    const int bad[] = { -1, 12, 1000, INT_MIN, INT_MAX };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_string_equal(cp_status_string((cp_status)bad[i]), "unknown status");
    for (int s = CP_SUCCESS; s <= CP_ERROR_INTERNAL; s++)
        assert_string_not_equal(cp_status_string((cp_status)s), "unknown status");
}

static void row_last_error(void **state)
{
    (void)state;
    mark_error();
    assert_non_null(strstr(cp_last_error(), MARK));
    /* a success leaves it as it was */
    int r = -1;
    assert_int_equal(cp_comm_rank(fx.comm, &r), CP_SUCCESS);
    assert_non_null(strstr(cp_last_error(), MARK));
}

static void row_version(void **state)
{
    (void)state;
    assert_int_equal(cp_version(), CP_VERSION);
}

static cp_status call_context_create(const void *cfg)
{
    cp_context *c = POISON;
    cp_status s = cp_context_create(cfg, &c);
    if (s == CP_SUCCESS)
        cp_context_destroy(c);
    else
        assert_null(c);
    return s;
}

static void row_context_create(void **state)
{
    (void)state;
    HOSTILE(cp_context_create(NULL, NULL), E, "out is NULL");
    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.num_threads = 1;
    typedef cp_context_config T;
    static const field_case cases[] = {
        INT_CASE(T, device, 2, E, "cfg->device = 2"),
        INT_CASE(T, device, -1, E, "cfg->device = -1"),
        INT_CASE(T, device_index, -1, E, "cfg->device_index = -1"),
        INT_CASE(T, device_index, 1, E, "cfg->device_index = 1"),
        SHIFT_CASE(T, stream, 64, "cfg->stream = 0x40"),
        INT_CASE(T, num_threads, -1, E, "cfg->num_threads = -1"),
        INT_CASE(T, num_threads, 4097, E, "cfg->num_threads = 4097"),
        INT_CASE(T, num_threads, INT_MAX, E, "cfg->num_threads = 2147483647"),
        INT_CASE(T, num_threads, INT_MIN, E, "cfg->num_threads = -2147483648"),
        INT_CASE(T, deterministic, 2, E, "cfg->deterministic = 2"),
        INT_CASE(T, deterministic, -1, E, "cfg->deterministic = -1"),
        INT_CASE(T, deterministic, INT_MAX, E, "cfg->deterministic = 2147483647"),
    };
    run_field_cases(&cfg, sizeof cfg, cases, sizeof cases / sizeof cases[0], call_context_create);
    run_struct_sizes("cfg", &cfg, sizeof cfg, offsetof(T, num_threads) + sizeof(int), call_context_create);
}

static void row_context_destroy(void **state)
{
    (void)state;
    cp_context_destroy(NULL);
}

static void row_context_set_stream(void **state)
{
    (void)state;
    HOSTILE(cp_context_set_stream(NULL, NULL), E, "ctx is NULL");
    HOSTILE(cp_context_set_stream(fx.ctx, (void *)(uintptr_t)64), E, "stream = 0x40");
    assert_int_equal(cp_context_set_stream(fx.ctx, NULL), CP_SUCCESS);
}

static void row_context_synchronize(void **state)
{
    (void)state;
    HOSTILE(cp_context_synchronize(NULL), E, "ctx is NULL");
}

/* ---- topology ------------------------------------------------------------- */

static cp_status call_topology_create(const void *cfg)
{
    cp_topology *t = POISON;
    cp_status s = cp_topology_create(cfg, &t);
    if (s == CP_SUCCESS)
        cp_topology_destroy(t);
    else
        assert_null(t);
    return s;
}

static void row_topology_create(void **state)
{
    (void)state;
    HOSTILE(cp_topology_create(NULL, NULL), E, "out is NULL");
    typedef cp_topology_config T;
    static const field_case cases[] = {
        INT_CASE(T, world_size, 0, E, "cfg->world_size = 0"),
        INT_CASE(T, world_size, -8, E, "cfg->world_size = -8"),
        INT_CASE(T, world_size, INT_MIN, E, "cfg->world_size = -2147483648"),
        INT_CASE(T, world_size, INT_MAX, E, "cfg->tp = 2 does not divide world_size = 2147483647"),
        INT_CASE(T, tp, 0, E, "cfg->tp = 0"),
        INT_CASE(T, tp, -1, E, "cfg->tp = -1"),
        INT_CASE(T, tp, 3, E, "cfg->tp = 3 does not divide world_size = 8"),
        INT_CASE(T, cp, 0, E, "cfg->cp = 0"),
        INT_CASE(T, cp, INT_MIN, E, "cfg->cp = -2147483648"),
        INT_CASE(T, dp, -1, E, "cfg->dp = -1"),
        INT_CASE(T, dp, 4, E, "tp*cp*dp*pp = 2*2*4*1 = 16 != world_size = 8"),
        INT_CASE(T, pp, 0, E, "cfg->pp = 0"),
        INT_CASE(T, pp, 16, E, "cfg->pp = 16 does not divide world_size = 8"),
        INT_CASE(T, cp_a2a, 0, E, "cfg->cp_a2a = 0"),
        INT_CASE(T, cp_a2a, -2, E, "cfg->cp_a2a = -2"),
        INT_CASE(T, cp_a2a, 4, E, "cfg->cp_a2a = 4 does not divide cfg->cp = 2"),
    };
    run_field_cases(&fx.topo_cfg, sizeof fx.topo_cfg, cases, sizeof cases / sizeof cases[0],
                    call_topology_create);
    run_struct_sizes("cfg", &fx.topo_cfg, sizeof fx.topo_cfg, offsetof(T, order) + sizeof(char *), call_topology_create);

    /* products that overflow int and int64 */
    cp_topology_config c = CP_TOPOLOGY_CONFIG_INIT;
    c.world_size = c.tp = c.cp = c.pp = INT_MAX;
    c.dp = 0;
    HOSTILE(call_topology_create(&c), E, "does not divide world_size = 2147483647");
    c.dp = INT_MAX;
    HOSTILE(call_topology_create(&c), E, "!= world_size = 2147483647");

    /* order strings that are not a permutation of the four axes */
    static char longest[4096];
    memset(longest, 't', sizeof longest - 1);
    const char *orders[] = { "", "-", "tp", "tp-cp-dp", "tp-cp-dp-pp-tp", "tp-tp-dp-pp", "xx-cp-dp-pp",
                             "tp-cp-dp-pp-", "-tp-cp-dp-pp", "tp--cp-dp-pp", "TP-CP-DP-PP", "tpcpdppp",
                             "tp-cp-dp-pp\n", longest };
    for (size_t i = 0; i < sizeof orders / sizeof orders[0]; i++) {
        c = fx.topo_cfg;
        c.order = orders[i];
        HOSTILE(call_topology_create(&c), E, "cfg->order = \"");
        assert_true(strlen(cp_last_error()) < 400); /* a long order is cut in the message */
    }
}

static void row_topology_destroy(void **state)
{
    (void)state;
    cp_topology_destroy(NULL);
}

static const int bad_ranks[] = { -1, 8, INT_MAX, INT_MIN };
#define N_BAD_RANKS (sizeof bad_ranks / sizeof bad_ranks[0])

static void row_topology_coords(void **state)
{
    (void)state;
    cp_coords c;
    HOSTILE(cp_topology_coords(NULL, 0, &c), E, "t is NULL");
    HOSTILE(cp_topology_coords(fx.topo, 0, NULL), E, "out is NULL");
    for (size_t i = 0; i < N_BAD_RANKS; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "rank = %d", bad_ranks[i]);
        fill(&c, sizeof c);
        HOSTILE(cp_topology_coords(fx.topo, bad_ranks[i], &c), E, needle);
        untouched(&c, sizeof c);
    }
}

static void row_topology_rank(void **state)
{
    (void)state;
    cp_coords ok = { 0 };
    int r = 0;
    HOSTILE(cp_topology_rank(fx.topo, &ok, NULL), E, "rank is NULL");
    r = 0;
    HOSTILE(cp_topology_rank(NULL, &ok, &r), E, "t is NULL");
    assert_int_equal(r, -1);
    r = 0;
    HOSTILE(cp_topology_rank(fx.topo, NULL, &r), E, "c is NULL");
    assert_int_equal(r, -1);
    /* each coordinate out of its range, and cp inconsistent with its parts */
    const struct {
        cp_coords c;
        const char *needle;
    } bad[] = {
        { { .tp = -1 }, "c->tp = -1" },         { { .tp = 2 }, "c->tp = 2" },
        { { .cp = INT_MIN }, "c->cp = -2147483648" },
        { { .cp = 2 }, "c->cp = 2" },           { { .dp = 2 }, "c->dp = 2" },
        { { .pp = 1 }, "c->pp = 1" },           { { .pp = INT_MAX }, "c->pp = 2147483647" },
        { { .cp_a2a = 1 }, "c->cp_a2a = 1" },   { { .cp_p2p = -1 }, "c->cp_p2p = -1" },
        { { .cp = 1 }, "c->cp = 1 disagrees" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = 0;
        HOSTILE(cp_topology_rank(fx.topo, &bad[i].c, &r), E, bad[i].needle);
        assert_int_equal(r, -1);
    }
}

static void row_topology_group(void **state)
{
    (void)state;
    int ranks[8], count = 0, index = 0;
    const unsigned axes = CP_AXIS_CP;
    HOSTILE(cp_topology_group(fx.topo, 0, axes, ranks, 8, NULL, &index), E, "count is NULL");
    count = 5;
    index = 5;
    HOSTILE(cp_topology_group(NULL, 0, axes, ranks, 8, &count, &index), E, "t is NULL");
    assert_int_equal(count, 0);
    assert_int_equal(index, -1);
    for (size_t i = 0; i < N_BAD_RANKS; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "rank = %d", bad_ranks[i]);
        HOSTILE(cp_topology_group(fx.topo, bad_ranks[i], axes, ranks, 8, &count, NULL), E, needle);
    }
    const struct {
        unsigned axes;
        int *ranks;
        int capacity;
        const char *needle;
    } bad[] = {
        { 1u << 6, ranks, 8, "axes = 0x40 has unknown bits 0x40" },
        { UINT_MAX, ranks, 8, "axes = 0xffffffff" },
        { axes, ranks, -1, "capacity = -1" },
        { axes, ranks, INT_MIN, "capacity = -2147483648" },
        { axes, NULL, 8, "ranks is NULL but capacity = 8" },
        { CP_AXIS_TP | CP_AXIS_CP | CP_AXIS_DP, ranks, 7, "capacity = 7 is smaller than the group" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fill(ranks, sizeof ranks);
        count = 5;
        index = 5;
        HOSTILE(cp_topology_group(fx.topo, 0, bad[i].axes, bad[i].ranks, bad[i].capacity, &count, &index), E,
                bad[i].needle);
        untouched(ranks, sizeof ranks);
        assert_int_equal(count, 0);
        assert_int_equal(index, -1);
    }
}

static void row_topology_color(void **state)
{
    (void)state;
    int color = 0, key = 0;
    HOSTILE(cp_topology_color(fx.topo, 0, CP_AXIS_CP, NULL, &key), E, "color is NULL");
    HOSTILE(cp_topology_color(fx.topo, 0, CP_AXIS_CP, &color, NULL), E, "key is NULL");
    color = key = 5;
    HOSTILE(cp_topology_color(NULL, 0, CP_AXIS_CP, &color, &key), E, "t is NULL");
    assert_true(color == -1 && key == -1);
    for (size_t i = 0; i < N_BAD_RANKS; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "rank = %d", bad_ranks[i]);
        color = key = 5;
        HOSTILE(cp_topology_color(fx.topo, bad_ranks[i], CP_AXIS_CP, &color, &key), E, needle);
        assert_true(color == -1 && key == -1);
    }
    color = key = 5;
    HOSTILE(cp_topology_color(fx.topo, 0, 0x80000000u, &color, &key), E, "axes = 0x80000000");
    assert_true(color == -1 && key == -1);
}

/* ---- layouts -------------------------------------------------------------- */

/* (layout, cp_size, cp_rank, seq_len) that no layout function accepts. */
static const struct layout_case {
    int layout, size, rank;
    int64_t seq;
    const char *needle;
} bad_layouts[] = {
    { 2, 2, 0, 8, "layout = 2" },
    { -1, 2, 0, 8, "layout = -1" },
    { INT_MAX, 2, 0, 8, "layout = 2147483647" },
    { 0, 0, 0, 8, "cp_size = 0" },
    { 0, -4, 0, 8, "cp_size = -4" },
    { 0, INT_MIN, 0, 8, "cp_size = -2147483648" },
    { 0, 2, -1, 8, "cp_rank = -1" },
    { 0, 2, 2, 8, "cp_rank = 2" },
    { 1, 2, INT_MAX, 8, "cp_rank = 2147483647" },
    { 0, 2, 0, 0, "seq_len = 0" },
    { 0, 2, 0, -8, "seq_len = -8" },
    { 0, 2, 0, INT64_MIN, "seq_len = -9223372036854775808" },
    { 0, 3, 0, 8, "seq_len = 8 is not divisible by cp_size = 3" },
    { 1, 2, 0, 6, "seq_len = 6 is not divisible by 2 * cp_size = 4" },
    { 1, INT_MAX, 0, INT64_MAX, "is not divisible by 2 * cp_size = 4294967294" },
};
#define N_BAD_LAYOUTS (sizeof bad_layouts / sizeof bad_layouts[0])

static void row_layout_positions(void **state)
{
    (void)state;
    int64_t pos[8];
    HOSTILE(cp_layout_positions(CP_LAYOUT_ZIGZAG, 2, 0, 8, NULL), E, "positions is NULL");
    for (size_t i = 0; i < N_BAD_LAYOUTS; i++) {
        const struct layout_case *c = &bad_layouts[i];
        fill(pos, sizeof pos);
        HOSTILE(cp_layout_positions((cp_layout)c->layout, c->size, c->rank, c->seq, pos), E, c->needle);
        untouched(pos, sizeof pos);
    }
    fill(pos, sizeof pos);
    HOSTILE(cp_layout_positions(CP_LAYOUT_CONTIGUOUS, 2, 0, 8, (int64_t *)(void *)((char *)pos + 4)), E,
            "positions = ");
    /* more positions than the address space has bytes */
    HOSTILE(cp_layout_positions(CP_LAYOUT_CONTIGUOUS, 1, 0, INT64_MAX, pos), E,
            "9223372036854775807 positions overflow");
    HOSTILE(cp_layout_positions(CP_LAYOUT_ZIGZAG, 1, 0, INT64_MAX - 1, pos), E, "positions overflow");
    untouched(pos, sizeof pos);
}

static void row_layout_shard(void **state)
{
    (void)state;
    char global[64], local[64];
    memset(global, 1, sizeof global);
    const cp_layout l = CP_LAYOUT_ZIGZAG;
    fill(local, sizeof local);
    HOSTILE(cp_layout_shard(NULL, l, 2, 0, global, local, 2, 8, 4), E, "ctx is NULL");
    HOSTILE(cp_layout_shard(fx.ctx, l, 2, 0, NULL, local, 2, 8, 4), E, "global is NULL");
    HOSTILE(cp_layout_shard(fx.ctx, l, 2, 0, global, NULL, 2, 8, 4), E, "local is NULL");
    for (size_t i = 0; i < N_BAD_LAYOUTS; i++) {
        const struct layout_case *c = &bad_layouts[i];
        HOSTILE(cp_layout_shard(fx.ctx, (cp_layout)c->layout, c->size, c->rank, global, local, 1, c->seq, 1), E,
                c->needle);
    }
    const struct {
        int64_t batch, seq;
        size_t token;
        const char *needle;
    } bad[] = {
        { 0, 8, 4, "batch = 0" },
        { -1, 8, 4, "batch = -1" },
        { INT64_MIN, 8, 4, "batch = -9223372036854775808" },
        { 1, 8, 0, "token_bytes = 0" },
        { INT64_MAX, 8, 4, "overflows the address space" },
        { 1, 8, SIZE_MAX, "overflows the address space" },
        { 2, (int64_t)1 << 61, 2, "overflows the address space" },
        { 1, (int64_t)1 << 62, 2, "overflows the address space" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        HOSTILE(cp_layout_shard(fx.ctx, l, 2, 0, global, local, bad[i].batch, bad[i].seq, bad[i].token), E,
                bad[i].needle);
    untouched(local, sizeof local);
}

static void row_layout_gather(void **state)
{
    (void)state;
    char local[64], global[64];
    memset(local, 1, sizeof local);
    fill(global, sizeof global);
    cp_group *g = fx.group;
    HOSTILE(cp_layout_gather(NULL, CP_LAYOUT_CONTIGUOUS, local, global, 1, 8, 4), E, "g is NULL");
    HOSTILE(cp_layout_gather(g, CP_LAYOUT_CONTIGUOUS, NULL, global, 1, 8, 4), E, "local is NULL");
    HOSTILE(cp_layout_gather(g, CP_LAYOUT_CONTIGUOUS, local, NULL, 1, 8, 4), E, "global is NULL");
    const struct {
        int layout;
        int64_t batch, seq;
        size_t token;
        const char *needle;
    } bad[] = {
        { 2, 1, 8, 4, "layout = 2" },
        { -7, 1, 8, 4, "layout = -7" },
        { 0, 1, 0, 4, "seq_len = 0" },
        { 0, 1, -16, 4, "seq_len = -16" },
        { 1, 1, 7, 4, "seq_len = 7 is not divisible by 2 * cp_size = 2" },
        { 0, 0, 8, 4, "batch = 0" },
        { 0, -2, 8, 4, "batch = -2" },
        { 0, 1, 8, 0, "token_bytes = 0" },
        { 0, INT64_MAX, 8, 4, "overflows the address space" },
        { 0, 2, INT64_MAX, 4, "overflows the address space" },
        { 0, 1, 8, SIZE_MAX / 4, "overflows the address space" },
        { 0, 1, (int64_t)1 << 62, 4, "overflows the address space" },
        { 0, 1, (int64_t)1 << 61, 4, "overflows the address space" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        HOSTILE(cp_layout_gather(g, (cp_layout)bad[i].layout, local, global, bad[i].batch, bad[i].seq,
                                 bad[i].token),
                E, bad[i].needle);
    untouched(global, sizeof global);
    /* the result may not overlap the share it is built from */
    HOSTILE(cp_layout_gather(g, CP_LAYOUT_CONTIGUOUS, global + 8, global, 1, 8, 4), E, "overlaps");
    untouched(global, sizeof global);
}

/* ---- packs (API 1.1) -------------------------------------------------------- */

static cp_status call_pack_create(const void *cfg)
{
    cp_pack *pk = POISON;
    cp_status s = cp_pack_create(cfg, &pk);
    if (s == CP_SUCCESS)
        cp_pack_destroy(pk);
    else
        assert_null(pk);
    return s;
}

static void row_pack_create(void **state)
{
    (void)state;
    cp_pack *pk = NULL;
    const cp_pack_config cfg = valid_pack_config(2); /* documents of 6 and 10 tokens, AUTO */
    HOSTILE(cp_pack_create(&cfg, NULL), E, "out is NULL");
    HOSTILE_OUT(pk, cp_pack_create(NULL, &pk), E, "cfg is NULL");
    typedef cp_pack_config T;
    static const field_case cases[] = {
        INT_CASE(T, cp_size, 0, E, "cfg->cp_size = 0"),
        INT_CASE(T, cp_size, -2, E, "cfg->cp_size = -2"),
        INT_CASE(T, cp_size, INT_MIN, E, "cfg->cp_size = -2147483648"),
        INT_CASE(T, cp_size, 3, E, "cfg->cu_seqlens[2] = 16 is not divisible by cfg->cp_size = 3"),
        INT_CASE(T, cp_size, INT_MAX, E, "is not divisible by cfg->cp_size = 2147483647"),
        NULL_CASE(T, cu_seqlens, "cfg->cu_seqlens is NULL"),
        INT_CASE(T, num_seqs, 0, E, "cfg->num_seqs = 0"),
        INT_CASE(T, num_seqs, -1, E, "cfg->num_seqs = -1"),
        INT_CASE(T, num_seqs, INT_MIN, E, "cfg->num_seqs = -2147483648"),
        INT_CASE(T, mask, 2, E, "cfg->mask = 2"),
        INT_CASE(T, mask, -1, E, "cfg->mask = -1"),
        INT_CASE(T, window, -1, E, "cfg->window = -1"),
        INT_CASE(T, window, INT64_MIN, E, "cfg->window = -9223372036854775808"),
        INT_CASE(T, balance, 4, E, "cfg->balance = 4"),
        INT_CASE(T, balance, -1, E, "cfg->balance = -1"),
        INT_CASE(T, balance, INT_MAX, E, "cfg->balance = 2147483647"),
        INT_CASE(T, chunk, -1, E, "cfg->chunk = -1"),
        INT_CASE(T, chunk, INT64_MIN, E, "cfg->chunk = -9223372036854775808"),
        /* AUTO may take GREEDY, so its chunk must divide T / P too */
        INT_CASE(T, chunk, 3, E, "cfg->chunk = 3 does not divide T / cp_size = 16 / 2 = 8"),
        INT_CASE(T, chunk, 16, E, "cfg->chunk = 16 does not divide"),
        INT_CASE(T, chunk, INT64_MAX, E, "cfg->chunk = 9223372036854775807 does not divide"),
        /* TransformerEngine's split needs every length % 2P == 0: 6 % 4 != 0 */
        INT_CASE(T, balance, CP_BALANCE_DOC_ZIGZAG, E, "document 0 has length 6"),
    };
    run_field_cases(&cfg, sizeof cfg, cases, sizeof cases / sizeof cases[0], call_pack_create);
    run_struct_sizes("cfg", &cfg, sizeof cfg, sizeof cfg, call_pack_create);

    /* document boundaries that do not start at 0, do not increase, or do not split evenly */
    const struct {
        int64_t cu[3];
        const char *needle;
    } bad[] = {
        { { 1, 6, 16 }, "cfg->cu_seqlens[0] = 1" },
        { { -4, 6, 16 }, "cfg->cu_seqlens[0] = -4" },
        { { 0, 0, 16 }, "cfg->cu_seqlens[1] = 0 is not greater than cfg->cu_seqlens[0] = 0" },
        { { 0, -6, 16 }, "cfg->cu_seqlens[1] = -6 is not greater" },
        { { 0, 6, 6 }, "cfg->cu_seqlens[2] = 6 is not greater than cfg->cu_seqlens[1] = 6" },
        { { 0, 10, 6 }, "cfg->cu_seqlens[2] = 6 is not greater than cfg->cu_seqlens[1] = 10" },
        { { 0, 6, INT64_MIN }, "cfg->cu_seqlens[2] = -9223372036854775808" },
        { { 0, 6, 15 }, "cfg->cu_seqlens[2] = 15 is not divisible by cfg->cp_size = 2" },
        { { 0, 6, INT64_MAX - 1 }, "tokens per rank overflow the address space" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cp_pack_config c = cfg;
        c.cu_seqlens = bad[i].cu;
        HOSTILE(call_pack_create(&c), E, bad[i].needle);
    }
    /* more chunks than an int counts */
    static const int64_t huge[] = { 0, (int64_t)1 << 34 };
    cp_pack_config c = cfg;
    c.cp_size = 1;
    c.cu_seqlens = huge;
    c.num_seqs = 1;
    c.balance = CP_BALANCE_GREEDY;
    c.chunk = 1;
    HOSTILE(call_pack_create(&c), E, "T / cfg->chunk = 17179869184 / 1 = 17179869184 chunks");
    /* DOC_ZIGZAG: 2P chunks of each of 2048 documents, 2^32 in all */
    static int64_t many[2049];
    for (int d = 0; d <= 2048; d++)
        many[d] = (int64_t)d << 21;
    c = cfg;
    c.cp_size = 1 << 20;
    c.cu_seqlens = many;
    c.num_seqs = 2048;
    c.balance = CP_BALANCE_DOC_ZIGZAG;
    HOSTILE(call_pack_create(&c), E, "2 * cfg->cp_size x cfg->num_seqs = 2097152 x 2048 chunks");
}

static void row_pack_destroy(void **state)
{
    (void)state;
    cp_pack_destroy(NULL);
}

static void row_pack_positions(void **state)
{
    (void)state;
    int64_t pos[9], dpos[9]; /* T / P = 8, and room for a misaligned one */
    int32_t ids[9];
    fill(pos, sizeof pos);
    fill(dpos, sizeof dpos);
    fill(ids, sizeof ids);
    HOSTILE(cp_pack_positions(NULL, 0, pos, dpos, ids), E, "pk is NULL");
    for (size_t i = 0; i < N_BAD_RANKS; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "cp_rank = %d", bad_ranks[i]);
        HOSTILE(cp_pack_positions(fx.pack2, bad_ranks[i], pos, dpos, ids), E, needle);
    }
    HOSTILE(cp_pack_positions(fx.pack2, 0, NULL, NULL, NULL), E,
            "positions, doc_positions and doc_ids are all NULL");
    HOSTILE(cp_pack_positions(fx.pack2, 0, (int64_t *)(void *)((char *)pos + 4), NULL, NULL), E, "positions = ");
    assert_non_null(strstr(cp_last_error(), "not aligned"));
    HOSTILE(cp_pack_positions(fx.pack2, 1, pos, (int64_t *)(void *)((char *)dpos + 2), ids), E,
            "doc_positions = ");
    HOSTILE(cp_pack_positions(fx.pack2, 1, pos, dpos, (int32_t *)(void *)((char *)ids + 1)), E, "doc_ids = ");
    untouched(pos, sizeof pos);
    untouched(dpos, sizeof dpos);
    untouched(ids, sizeof ids);
}

static void row_pack_work(void **state)
{
    (void)state;
    double pairs = -1;
    HOSTILE(cp_pack_work(NULL, 0, &pairs), E, "pk is NULL");
    HOSTILE(cp_pack_work(fx.pack2, 0, NULL), E, "pairs is NULL");
    for (size_t i = 0; i < N_BAD_RANKS; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "cp_rank = %d", bad_ranks[i]);
        HOSTILE(cp_pack_work(fx.pack2, bad_ranks[i], &pairs), E, needle);
    }
    assert_true(pairs == -1);
}

static void row_pack_shard(void **state)
{
    (void)state;
    char global[64], local[64]; /* T = 16 tokens of 4 bytes; a rank holds 8 of pack2's */
    const cp_pack *pk = fx.pack2;
    memset(global, 1, sizeof global);
    fill(local, sizeof local);
    HOSTILE(cp_pack_shard(NULL, pk, 0, global, local, 4), E, "ctx is NULL");
    HOSTILE(cp_pack_shard(fx.ctx, NULL, 0, global, local, 4), E, "pk is NULL");
    HOSTILE(cp_pack_shard(fx.ctx, pk, 0, NULL, local, 4), E, "global is NULL");
    HOSTILE(cp_pack_shard(fx.ctx, pk, 0, global, NULL, 4), E, "local is NULL");
    for (size_t i = 0; i < N_BAD_RANKS; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "cp_rank = %d", bad_ranks[i]);
        HOSTILE(cp_pack_shard(fx.ctx, pk, bad_ranks[i], global, local, 4), E, needle);
    }
    HOSTILE(cp_pack_shard(fx.ctx, pk, 0, global, local, 0), E, "token_bytes = 0");
    const size_t huge[] = { SIZE_MAX, SIZE_MAX / 8, (size_t)1 << 60, (size_t)PTRDIFF_MAX / 16 + 1 };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++)
        HOSTILE(cp_pack_shard(fx.ctx, pk, 1, global, local, huge[i]), E, "overflows the address space");
    untouched(local, sizeof local);
    /* a share that overlaps the row it is cut from */
    fill(global, sizeof global);
    HOSTILE(cp_pack_shard(fx.ctx, pk, 0, global, global + 16, 2), E, "overlaps");
    HOSTILE(cp_pack_shard(fx.ctx, pk, 1, global + 16, global + 8, 2), E, "overlaps");
    untouched(global, sizeof global);
}

static void row_pack_gather(void **state)
{
    (void)state;
    char local[64], global[64];
    cp_group *g = fx.group; /* one rank */
    const cp_pack *pk = fx.pack1;
    memset(local, 1, sizeof local);
    assert_int_equal(cp_pack_gather(g, pk, local, global, 4), CP_SUCCESS);
    fill(global, sizeof global);
    HOSTILE(cp_pack_gather(NULL, pk, local, global, 4), E, "g is NULL");
    HOSTILE(cp_pack_gather(g, NULL, local, global, 4), E, "pk is NULL");
    HOSTILE(cp_pack_gather(g, pk, NULL, global, 4), E, "local is NULL");
    HOSTILE(cp_pack_gather(g, pk, local, NULL, 4), E, "global is NULL");
    HOSTILE(cp_pack_gather(g, fx.pack2, local, global, 4), E,
            "pk splits the row across cp_size = 2 ranks, the group has 1");
    HOSTILE(cp_pack_gather(g, pk, local, global, 0), E, "token_bytes = 0");
    HOSTILE(cp_pack_gather(g, pk, local, global, SIZE_MAX), E, "overflows the address space");
    HOSTILE(cp_pack_gather(g, pk, local, global, (size_t)1 << 60), E, "overflows the address space");
    untouched(global, sizeof global);
    /* the row may not overlap the share it is built from */
    HOSTILE(cp_pack_gather(g, pk, global + 8, global, 2), E, "overlaps");
    untouched(global, sizeof global);
}

/* ---- communicators and groups --------------------------------------------- */

static void row_comm_create_local(void **state)
{
    (void)state;
    cp_comm *comms[4];
    HOSTILE(cp_comm_create_local(1, NULL), E, "comms is NULL");
    const int bad[] = { 0, -1, 4097, INT_MAX, INT_MIN };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "nranks = %d", bad[i]);
        fill(comms, sizeof comms);
        HOSTILE(cp_comm_create_local(bad[i], comms), E, needle);
        untouched(comms, sizeof comms); /* not even comms[0]: nranks does not say how many there are */
    }
}

static void row_comm_create_mpi(void **state)
{
    (void)state;
    cp_comm *c = NULL;
    HOSTILE(cp_comm_create_mpi(&c, NULL), E, "out is NULL");
    HOSTILE_OUT(c, cp_comm_create_mpi(NULL, &c), E, "mpi_comm is NULL");
}

static void row_comm_destroy(void **state)
{
    (void)state;
    cp_comm_destroy(NULL);
}

static void row_comm_rank(void **state)
{
    (void)state;
    int r = 5;
    HOSTILE(cp_comm_rank(fx.comm, NULL), E, "rank is NULL");
    HOSTILE(cp_comm_rank(NULL, &r), E, "c is NULL");
    assert_int_equal(r, -1);
}

static void row_comm_size(void **state)
{
    (void)state;
    int n = 5;
    HOSTILE(cp_comm_size(fx.comm, NULL), E, "size is NULL");
    HOSTILE(cp_comm_size(NULL, &n), E, "c is NULL");
    assert_int_equal(n, 0);
}

static void row_comm_split(void **state)
{
    (void)state;
    cp_comm *c = NULL;
    HOSTILE(cp_comm_split(fx.comm, 0, 0, NULL), E, "out is NULL");
    HOSTILE_OUT(c, cp_comm_split(NULL, 0, 0, &c), E, "c is NULL");
    /* extreme colors and keys are valid: a negative color joins no group */
    c = POISON;
    assert_int_equal(cp_comm_split(fx.comm, INT_MIN, INT_MIN, &c), CP_SUCCESS);
    assert_null(c);
    assert_int_equal(cp_comm_split(fx.comm, INT_MAX, INT_MAX, &c), CP_SUCCESS);
    assert_non_null(c);
    cp_comm_destroy(c);
}

static cp_status call_group_create(const void *cfg)
{
    cp_group *g = POISON;
    cp_status s = cp_group_create(fx.ctx, fx.comm, cfg, &g);
    if (s == CP_SUCCESS)
        cp_group_destroy(g);
    else
        assert_null(g);
    return s;
}

static void row_group_create(void **state)
{
    (void)state;
    cp_group *g = NULL;
    HOSTILE(cp_group_create(fx.ctx, fx.comm, NULL, NULL), E, "out is NULL");
    HOSTILE_OUT(g, cp_group_create(NULL, fx.comm, NULL, &g), E, "ctx is NULL");
    HOSTILE_OUT(g, cp_group_create(fx.ctx, NULL, NULL, &g), E, "comm is NULL");
    typedef cp_group_config T;
    static const field_case cases[] = {
        INT_CASE(T, a2a_size, 0, E, "cfg->a2a_size = 0"),
        INT_CASE(T, a2a_size, -1, E, "cfg->a2a_size = -1"),
        INT_CASE(T, a2a_size, 2, E, "cfg->a2a_size = 2 does not divide the communicator size 1"),
        INT_CASE(T, a2a_size, INT_MIN, E, "cfg->a2a_size = -2147483648"),
        INT_CASE(T, timeout_ms, 0, E, "cfg->timeout_ms = 0"),
        INT_CASE(T, timeout_ms, INT_MIN, E, "cfg->timeout_ms = -2147483648"),
        INT_CASE(T, num_streams, 0, E, "cfg->num_streams = 0"),
        INT_CASE(T, num_streams, 65, E, "cfg->num_streams = 65"),
        INT_CASE(T, num_streams, -1, E, "cfg->num_streams = -1"),
    };
    const cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    run_field_cases(&cfg, sizeof cfg, cases, sizeof cases / sizeof cases[0], call_group_create);
    run_struct_sizes("cfg", &cfg, sizeof cfg, offsetof(T, num_streams) + sizeof(int), call_group_create);
}

static void row_group_destroy(void **state)
{
    (void)state;
    cp_group_destroy(NULL);
}

static void row_group_rank(void **state)
{
    (void)state;
    int r = 5;
    HOSTILE(cp_group_rank(fx.group, NULL), E, "rank is NULL");
    HOSTILE(cp_group_rank(NULL, &r), E, "g is NULL");
    assert_int_equal(r, -1);
}

static void row_group_size(void **state)
{
    (void)state;
    int n = 5;
    HOSTILE(cp_group_size(fx.group, NULL), E, "size is NULL");
    HOSTILE(cp_group_size(NULL, &n), E, "g is NULL");
    assert_int_equal(n, 0);
}

/* ---- CP attention --------------------------------------------------------- */

/* The first published cp_attn_desc ends at mode. */
#define DESC_V1 (offsetof(cp_attn_desc, mode) + sizeof(cp_mode))

static cp_status call_plan_create(const void *desc)
{
    cp_attn_plan *p = POISON;
    cp_status s = cp_attn_plan_create(fx.group, desc, &p);
    if (s == CP_SUCCESS)
        cp_attn_plan_destroy(p);
    else
        assert_null(p);
    return s;
}

static void row_attn_plan_create(void **state)
{
    (void)state;
    cp_attn_plan *p = NULL;
    HOSTILE(cp_attn_plan_create(fx.group, &fx.desc, NULL), E, "out is NULL");
    HOSTILE_OUT(p, cp_attn_plan_create(NULL, &fx.desc, &p), E, "g is NULL");
    HOSTILE_OUT(p, cp_attn_plan_create(fx.group, NULL, &p), E, "desc is NULL");
    typedef cp_attn_desc T;
    static const field_case cases[] = {
        INT_CASE(T, dtype, 5, E, "desc->dtype = 5"),
        INT_CASE(T, dtype, -1, E, "desc->dtype = -1"),
        INT_CASE(T, dtype, CP_DTYPE_F64, CP_ERROR_UNSUPPORTED, "CP_DTYPE_F64"),
        INT_CASE(T, format, 2, E, "desc->format = 2"),
        INT_CASE(T, format, INT_MIN, E, "desc->format = -2147483648"),
        INT_CASE(T, batch, 0, E, "desc->batch = 0"),
        INT_CASE(T, batch, -1, E, "desc->batch = -1"),
        INT_CASE(T, batch, INT64_MIN, E, "desc->batch = -9223372036854775808"),
        INT_CASE(T, seq_len, 0, E, "desc->seq_len = 0"),
        INT_CASE(T, seq_len, -16, E, "desc->seq_len = -16"),
        INT_CASE(T, num_heads, 0, E, "desc->num_heads = 0"),
        INT_CASE(T, num_heads, INT32_MIN, E, "desc->num_heads = -2147483648"),
        INT_CASE(T, num_kv_heads, 0, E, "desc->num_kv_heads = 0"),
        INT_CASE(T, num_kv_heads, -1, E, "desc->num_kv_heads = -1"),
        INT_CASE(T, num_kv_heads, 3, E, "desc->num_kv_heads = 3 does not divide desc->num_heads = 2"),
        INT_CASE(T, head_dim, 0, E, "desc->head_dim = 0"),
        INT_CASE(T, head_dim, -4, E, "desc->head_dim = -4"),
        INT_CASE(T, head_dim_v, -1, E, "desc->head_dim_v = -1"),
        INT_CASE(T, mask, 2, E, "desc->mask = 2"),
        INT_CASE(T, mask, -1, E, "desc->mask = -1"),
        REAL_CASE(T, softmax_scale, NAN, "desc->softmax_scale = nan"),
        REAL_CASE(T, softmax_scale, -INFINITY, "desc->softmax_scale = -inf"),
        REAL_CASE(T, softmax_scale, 1e300, "desc->softmax_scale = 1e+300"),
        INT_CASE(T, layout, 3, E, "layout = 3"),
        INT_CASE(T, layout, -1, E, "layout = -1"),
        INT_CASE(T, mode, 4, E, "desc->mode = 4"),
        INT_CASE(T, mode, -1, E, "desc->mode = -1"),
        /* API 1.1 */
        INT_CASE(T, window, -1, E, "desc->window = -1"),
        INT_CASE(T, window, INT64_MIN, E, "desc->window = -9223372036854775808"),
        REAL_CASE(T, softcap, NAN, "desc->softcap = nan"),
        REAL_CASE(T, softcap, -1.0, "desc->softcap = -1"),
        REAL_CASE(T, softcap, INFINITY, "desc->softcap = inf"),
        REAL_CASE(T, softcap, -INFINITY, "desc->softcap = -inf"),
        /* finite, but past what the kernels take (c log2(e) and scale / c must be finite floats) */
        REAL_CASE(T, softcap, 1e300, "desc->softcap = 1e+300"),
        REAL_CASE(T, softcap, 1e-300, "desc->softcap = 1e-300"),
        INT_CASE(T, sinks, 2, E, "desc->sinks = 2"),
        INT_CASE(T, sinks, -1, E, "desc->sinks = -1"),
        INT_CASE(T, sinks, INT_MAX, E, "desc->sinks = 2147483647"),
        /* sizes whose bytes overflow size_t and int64 */
        INT_CASE(T, batch, INT64_MAX, E, "overflows the address space"),
        INT_CASE(T, seq_len, INT64_MAX, E, "overflows the address space"),
        INT_CASE(T, seq_len, (int64_t)1 << 58, E, "overflows the address space"),
    };
    run_field_cases(&fx.desc, sizeof fx.desc, cases, sizeof cases / sizeof cases[0], call_plan_create);
    run_struct_sizes("desc", &fx.desc, sizeof fx.desc, DESC_V1, call_plan_create);

    /* a product of all four that overflows, though each factor is small */
    cp_attn_desc d = fx.desc;
    d.batch = (int64_t)1 << 20;
    d.seq_len = (int64_t)1 << 20;
    d.num_heads = d.num_kv_heads = 1 << 12;
    d.head_dim = 1 << 12;
    HOSTILE(call_plan_create(&d), E, "overflows the address space");
    /* every buffer fits, but the workspace they make together does not */
    d = fx.desc;
    d.seq_len = (int64_t)3 << 56;
    d.num_heads = d.num_kv_heads = 1;
    d.head_dim = 1;
    d.mode = CP_MODE_ALL_GATHER;
    HOSTILE(call_plan_create(&d), E, "cp_attn_plan_create: the backward workspace of batch 1 x seq_len");
    assert_non_null(strstr(cp_last_error(), "overflows size_t"));
    d.mode = CP_MODE_P2P;
    d.layout = CP_LAYOUT_ZIGZAG;
    d.seq_len = 15;
    HOSTILE(call_plan_create(&d), E, "seq_len = 15 is not divisible by 2 * cp_size = 2");
    /* a packed row is one sample */
    d = fx.desc;
    d.layout = CP_LAYOUT_PACKED;
    d.batch = 2;
    HOSTILE(call_plan_create(&d), E, "desc->batch = 2 with CP_LAYOUT_PACKED");
}

static void row_attn_plan_destroy(void **state)
{
    (void)state;
    cp_attn_plan_destroy(NULL);
}

static void row_attn_workspace_size(void **state)
{
    (void)state;
    size_t f = 7, b = 7;
    HOSTILE(cp_attn_workspace_size(NULL, &f, &b), E, "p is NULL");
    HOSTILE(cp_attn_workspace_size(fx.plan, NULL, NULL), E, "forward and backward are both NULL");
    assert_true(f == 7 && b == 7);
}

/* The arguments of cp_attn_forward / cp_attn_backward, to vary one at a time. */
typedef struct attn_call {
    cp_attn_plan *p;
    const void *q, *k, *v, *out;
    const float *lse;
    const void *dout;
    void *dq, *dk, *dv, *ws;
    size_t ws_bytes;
} attn_call;

static attn_call valid_attn_call(size_t ws_bytes)
{
    attn_call c = { fx.plan, buf.q, buf.k, buf.v, buf.o, buf.lse, buf.dout, buf.dq, buf.dk, buf.dv, fx.ws, ws_bytes };
    return c;
}

static cp_status attn_forward(const attn_call *c)
{
    fill(buf.o, sizeof buf.o);
    fill(buf.lse, sizeof buf.lse);
    cp_status s = cp_attn_forward(c->p, c->q, c->k, c->v, (void *)c->out, (float *)c->lse, c->ws, c->ws_bytes);
    if (s != CP_SUCCESS) {
        untouched(buf.o, sizeof buf.o);
        untouched(buf.lse, sizeof buf.lse);
    }
    return s;
}

static cp_status attn_backward(const attn_call *c)
{
    fill(buf.dq, sizeof buf.dq);
    fill(buf.dk, sizeof buf.dk);
    fill(buf.dv, sizeof buf.dv);
    cp_status s = cp_attn_backward(c->p, c->q, c->k, c->v, c->out, c->lse, c->dout, c->dq, c->dk, c->dv, c->ws,
                                   c->ws_bytes);
    if (s != CP_SUCCESS) {
        untouched(buf.dq, sizeof buf.dq);
        untouched(buf.dk, sizeof buf.dk);
        untouched(buf.dv, sizeof buf.dv);
    }
    return s;
}

/* The pointer arguments and whether they are tensors (alignment matters). */
static const struct {
    const char *name;
    size_t offset;
    int tensor, backward_only;
} attn_ptrs[] = {
    { "p", offsetof(attn_call, p), 0, 0 },      { "q", offsetof(attn_call, q), 1, 0 },
    { "k", offsetof(attn_call, k), 1, 0 },      { "v", offsetof(attn_call, v), 1, 0 },
    { "out", offsetof(attn_call, out), 1, 0 },  { "lse", offsetof(attn_call, lse), 1, 0 },
    { "dout", offsetof(attn_call, dout), 1, 1 }, { "dq", offsetof(attn_call, dq), 1, 1 },
    { "dk", offsetof(attn_call, dk), 1, 1 },    { "dv", offsetof(attn_call, dv), 1, 1 },
};

static void hostile_attn(const char *func, cp_status (*call)(const attn_call *), size_t ws_need, int backward)
{
    attn_call c = valid_attn_call(ws_need);
    assert_int_equal(call(&c), CP_SUCCESS);
    char needle[64];
    for (size_t i = 0; i < sizeof attn_ptrs / sizeof attn_ptrs[0]; i++) {
        if (attn_ptrs[i].backward_only && !backward)
            continue;
        /* NULL, then two bytes off its 4-byte elements */
        c = valid_attn_call(ws_need);
        char *p = NULL;
        memcpy((char *)&c + attn_ptrs[i].offset, &p, sizeof p);
        snprintf(needle, sizeof needle, "%s: %s is NULL", func, attn_ptrs[i].name);
        HOSTILE(call(&c), E, needle);
        if (!attn_ptrs[i].tensor)
            continue;
        c = valid_attn_call(ws_need);
        memcpy(&p, (char *)&c + attn_ptrs[i].offset, sizeof p);
        p += 2;
        memcpy((char *)&c + attn_ptrs[i].offset, &p, sizeof p);
        snprintf(needle, sizeof needle, "%s: %s = ", func, attn_ptrs[i].name);
        HOSTILE(call(&c), E, needle);
        assert_non_null(strstr(cp_last_error(), "not aligned"));
    }
    /* a workspace one byte short, or off the alignment the plan carves it at */
    c = valid_attn_call(ws_need - 1);
    snprintf(needle, sizeof needle, "workspace_bytes = %zu", ws_need - 1);
    HOSTILE(call(&c), E, needle);
    c = valid_attn_call(ws_need);
    c.ws = fx.ws + 8;
    HOSTILE(call(&c), E, "workspace = ");
    c.ws_bytes = 0;
    HOSTILE(call(&c), E, "workspace = ");
    c = valid_attn_call(0);
    HOSTILE(call(&c), E, "workspace_bytes = 0");
}

static void row_attn_forward(void **state)
{
    (void)state;
    hostile_attn("cp_attn_forward", attn_forward, fx.ws_fwd, 0);
}

static void row_attn_backward(void **state)
{
    (void)state;
    attn_call c = valid_attn_call(fx.ws_fwd);
    assert_int_equal(attn_forward(&c), CP_SUCCESS); /* lse and out for the backward */
    hostile_attn("cp_attn_backward", attn_backward, fx.ws_bwd, 1);
}

/* cp_attn_forward_ex / cp_attn_backward_ex with only a workspace in x: the
 * cases of cp_attn_forward / cp_attn_backward. */
static cp_status attn_forward_ex(const attn_call *c)
{
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    x.workspace = c->ws;
    x.workspace_bytes = c->ws_bytes;
    fill(buf.o, sizeof buf.o);
    fill(buf.lse, sizeof buf.lse);
    cp_status s = cp_attn_forward_ex(c->p, c->q, c->k, c->v, (void *)c->out, (float *)c->lse, &x);
    if (s != CP_SUCCESS) {
        untouched(buf.o, sizeof buf.o);
        untouched(buf.lse, sizeof buf.lse);
    }
    return s;
}

static cp_status attn_backward_ex(const attn_call *c)
{
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    x.workspace = c->ws;
    x.workspace_bytes = c->ws_bytes;
    fill(buf.dq, sizeof buf.dq);
    fill(buf.dk, sizeof buf.dk);
    fill(buf.dv, sizeof buf.dv);
    cp_status s = cp_attn_backward_ex(c->p, c->q, c->k, c->v, c->out, c->lse, c->dout, c->dq, c->dk, c->dv, &x);
    if (s != CP_SUCCESS) {
        untouched(buf.dq, sizeof buf.dq);
        untouched(buf.dk, sizeof buf.dk);
        untouched(buf.dv, sizeof buf.dv);
    }
    return s;
}

/* The plan that call_attn_ex runs, and which direction. */
static struct {
    cp_attn_plan *p;
    int backward;
} ex;

/* cp_attn_forward_ex or cp_attn_backward_ex of ex.p with arguments x on the
 * shared tensors; a failure writes none of its outputs. */
static cp_status call_attn_ex(const void *x)
{
    cp_status s;
    fill(buf.dsinks, sizeof buf.dsinks);
    if (!ex.backward) {
        fill(buf.o, sizeof buf.o);
        fill(buf.lse, sizeof buf.lse);
        s = cp_attn_forward_ex(ex.p, buf.q, buf.k, buf.v, buf.o, buf.lse, x);
        if (s != CP_SUCCESS) {
            untouched(buf.o, sizeof buf.o);
            untouched(buf.lse, sizeof buf.lse);
        }
    } else {
        fill(buf.dq, sizeof buf.dq);
        fill(buf.dk, sizeof buf.dk);
        fill(buf.dv, sizeof buf.dv);
        s = cp_attn_backward_ex(ex.p, buf.q, buf.k, buf.v, buf.o, buf.lse, buf.dout, buf.dq, buf.dk, buf.dv, x);
        if (s != CP_SUCCESS) {
            untouched(buf.dq, sizeof buf.dq);
            untouched(buf.dk, sizeof buf.dk);
            untouched(buf.dv, sizeof buf.dv);
        }
    }
    if (s != CP_SUCCESS)
        untouched(buf.dsinks, sizeof buf.dsinks);
    return s;
}

/* Make ex.p a plan of fx.desc with layout and sinks changed; for the
 * backward, run its forward first (out and lse). */
static void ex_plan(cp_layout layout, int sinks, int backward, const cp_attn_args *x)
{
    cp_attn_desc d = fx.desc;
    d.layout = layout;
    d.sinks = sinks;
    ex.p = NULL;
    if (cp_attn_plan_create(fx.group, &d, &ex.p) != CP_SUCCESS)
        fail_msg("a plan with layout %d, sinks %d: %s", (int)layout, sinks, cp_last_error());
    ex.backward = 0;
    if (backward && call_attn_ex(x) != CP_SUCCESS)
        fail_msg("the forward before the backward: %s", cp_last_error());
    ex.backward = backward;
}

/* The first published cp_attn_args (API 1.1) ends at workspace_bytes. */
#define ARGS_V11 (offsetof(cp_attn_args, workspace_bytes) + sizeof(size_t))

/* What API 1.1's and 1.2's x carries, against plans that do and do not take it. */
static void hostile_attn_args(const char *func, int backward)
{
    const cp_attn_args init = CP_ATTN_ARGS_INIT;
    cp_attn_args x = init;
    char needle[128];
    typedef cp_attn_args T;

    /* a plain plan: x = NULL is the defaults; a pack or sinks it does not take */
    ex.p = fx.plan;
    ex.backward = backward;
    assert_int_equal(call_attn_ex(NULL), CP_SUCCESS);
    run_struct_sizes("x", &x, sizeof x, ARGS_V11, call_attn_ex);
    x.pack = fx.pack1;
    snprintf(needle, sizeof needle, "%s: x->pack is set but the plan's layout is 0", func);
    HOSTILE(call_attn_ex(&x), E, needle);
    x = init;
    x.sinks = buf.sinks;
    HOSTILE(call_attn_ex(&x), E, "x->sinks is set but the plan has desc->sinks = 0");
    x = init;
    x.dsinks = buf.dsinks;
    HOSTILE(call_attn_ex(&x), E, "x->dsinks is set but the plan has desc->sinks = 0");
    /* API 1.2: descales are an FP8 plan's */
    x = init;
    static const field_case descale_cases[] = {
        SHIFT_CASE(T, q_descale, 4, "x->q_descale is set but the plan's desc->dtype = 0 (F32)"),
        SHIFT_CASE(T, k_descale, 4, "x->k_descale is set but the plan's desc->dtype = 0 (F32)"),
        SHIFT_CASE(T, v_descale, 4, "x->v_descale is set but the plan's desc->dtype = 0 (F32)"),
        INT_CASE(T, descale_per_head, 2, E, "x->descale_per_head = 2"),
        INT_CASE(T, descale_per_head, INT_MIN, E, "x->descale_per_head = -2147483648"),
    };
    run_field_cases(&x, sizeof x, descale_cases, sizeof descale_cases / sizeof descale_cases[0], call_attn_ex);

    /* a plan with sinks: they, and in the backward their gradient, are required */
    x = init;
    x.sinks = buf.sinks;
    x.dsinks = buf.dsinks;
    ex_plan(CP_LAYOUT_CONTIGUOUS, 1, backward, &x);
    static const field_case sink_cases[] = {
        NULL_CASE(T, sinks, "x->sinks is NULL (the plan has desc->sinks = 1)"),
        SHIFT_CASE(T, sinks, 2, "x->sinks = "),
        /* the backward's only */
        NULL_CASE(T, dsinks, "x->dsinks is NULL (the plan has desc->sinks = 1)"),
        SHIFT_CASE(T, dsinks, 1, "x->dsinks = "),
    };
    run_field_cases(&x, sizeof x, sink_cases, backward ? 4 : 2, call_attn_ex);
    HOSTILE(call_attn_ex(NULL), E, "x->sinks is NULL");
    if (backward)
        HOSTILE(cp_attn_backward(ex.p, buf.q, buf.k, buf.v, buf.o, buf.lse, buf.dout, buf.dq, buf.dk, buf.dv, NULL, 0),
                E, "desc->sinks = 1");
    else
        HOSTILE(cp_attn_forward(ex.p, buf.q, buf.k, buf.v, buf.o, buf.lse, NULL, 0), E, "desc->sinks = 1");
    cp_attn_plan_destroy(ex.p);

    /* a packed plan: a pack of its CP size and length is required */
    x = init;
    x.pack = fx.pack1;
    ex_plan(CP_LAYOUT_PACKED, 0, backward, &x);
    static const field_case pack_cases[] = {
        NULL_CASE(T, pack, "x->pack is NULL (the plan's layout is CP_LAYOUT_PACKED)"),
    };
    run_field_cases(&x, sizeof x, pack_cases, 1, call_attn_ex);
    HOSTILE(call_attn_ex(NULL), E, "x->pack is NULL");
    x.pack = fx.pack2;
    HOSTILE(call_attn_ex(&x), E, "x->pack was made for cp_size 2, the plan's group has 1 ranks");
    x.pack = fx.pack32;
    HOSTILE(call_attn_ex(&x), E, "x->pack holds 32 tokens, the plan's seq_len is 16");
    x.pack = fx.pack1;
    x.sinks = buf.sinks;
    HOSTILE(call_attn_ex(&x), E, "x->sinks is set but the plan has desc->sinks = 0");
    if (backward)
        HOSTILE(cp_attn_backward(ex.p, buf.q, buf.k, buf.v, buf.o, buf.lse, buf.dout, buf.dq, buf.dk, buf.dv, NULL, 0),
                E, "CP_LAYOUT_PACKED");
    else
        HOSTILE(cp_attn_forward(ex.p, buf.q, buf.k, buf.v, buf.o, buf.lse, NULL, 0), E, "CP_LAYOUT_PACKED");
    cp_attn_plan_destroy(ex.p);

    /* an FP8 plan (API 1.2): aligned descales; no backward, refused naming
     * the dtype after the call's agreement */
    cp_attn_desc d8 = fx.desc;
    d8.dtype = CP_DTYPE_FP8_E4M3;
    ex.p = NULL;
    if (cp_attn_plan_create(fx.group, &d8, &ex.p) != CP_SUCCESS)
        fail_msg("an FP8 plan: %s", cp_last_error());
    ex.backward = backward;
    x = init;
    x.q_descale = buf.sinks;
    if (backward) {
        HOSTILE(call_attn_ex(&x), CP_ERROR_UNSUPPORTED, "the plan's desc->dtype = CP_DTYPE_FP8_E4M3");
        HOSTILE(call_attn_ex(NULL), CP_ERROR_UNSUPPORTED, "FP8 plans are forward only");
        HOSTILE(cp_attn_backward(ex.p, buf.q, buf.k, buf.v, buf.o, buf.lse, buf.dout, buf.dq, buf.dk, buf.dv, NULL, 0),
                CP_ERROR_UNSUPPORTED, "cp_attn_backward: the plan's desc->dtype = CP_DTYPE_FP8_E4M3");
    } else {
        static const field_case fp8_cases[] = {
            SHIFT_CASE(T, q_descale, 2, "x->q_descale = "),
            SHIFT_CASE(T, k_descale, 1, "x->k_descale = "),
            INT_CASE(T, descale_per_head, 3, E, "x->descale_per_head = 3"),
        };
        run_field_cases(&x, sizeof x, fp8_cases, sizeof fp8_cases / sizeof fp8_cases[0], call_attn_ex);
        assert_int_equal(cp_attn_forward(ex.p, buf.q, buf.k, buf.v, buf.o, buf.lse, NULL, 0), CP_SUCCESS);
    }
    cp_attn_plan_destroy(ex.p);
    ex.p = NULL;
}

static void row_attn_forward_ex(void **state)
{
    (void)state;
    hostile_attn("cp_attn_forward_ex", attn_forward_ex, fx.ws_fwd, 0);
    hostile_attn_args("cp_attn_forward_ex", 0);
}

static void row_attn_backward_ex(void **state)
{
    (void)state;
    attn_call c = valid_attn_call(fx.ws_fwd);
    assert_int_equal(attn_forward(&c), CP_SUCCESS); /* lse and out for the backward */
    hostile_attn("cp_attn_backward_ex", attn_backward_ex, fx.ws_bwd, 1);
    hostile_attn_args("cp_attn_backward_ex", 1);
}

/* ---- single-device kernels ------------------------------------------------ */

static cp_kernel_attn_args valid_kernel_args(void)
{
    return f32_kernel_attn_args(KB, KH, KHKV, KD, KSQ, KSK, buf.q, buf.k, buf.v, buf.o, buf.lse, buf.dout, buf.dq,
                                buf.dk, buf.dv);
}

/* The first published cp_kernel_attn_args ends at workspace_bytes. */
#define KERNEL_ARGS_V1 (offsetof(cp_kernel_attn_args, workspace_bytes) + sizeof(size_t))

typedef cp_kernel_attn_args KA;

/* Cases every kernel entry point rejects (shapes, types, strides). */
#define KERNEL_SHAPE_CASES                                                                             \
    INT_CASE(KA, dtype, 5, E, "a->dtype = 5"), INT_CASE(KA, dtype, -1, E, "a->dtype = -1"),            \
        INT_CASE(KA, dtype, CP_DTYPE_F64, CP_ERROR_UNSUPPORTED, "a->dtype = CP_DTYPE_F64"),            \
        INT_CASE(KA, format, 2, E, "a->format = 2"), INT_CASE(KA, batch, 0, E, "a->batch = 0"),        \
        INT_CASE(KA, batch, -1, E, "a->batch = -1"), INT_CASE(KA, num_heads, 0, E, "a->num_heads = 0"), \
        INT_CASE(KA, num_kv_heads, -1, E, "a->num_kv_heads = -1"),                                     \
        INT_CASE(KA, num_kv_heads, 3, E, "a->num_kv_heads = 3 does not divide"),                       \
        INT_CASE(KA, head_dim, 0, E, "a->head_dim = 0"), INT_CASE(KA, head_dim_v, -1, E, "a->head_dim_v = -1"), \
        INT_CASE(KA, seq_q, 0, E, "a->seq_q = 0"), INT_CASE(KA, seq_k, -1, E, "a->seq_k = -1"),        \
        INT_CASE(KA, q_offset, -1, E, "a->q_offset = -1"),                                             \
        INT_CASE(KA, k_offset, INT64_MAX, E, "a->k_offset = 9223372036854775807"),                     \
        INT_CASE(KA, mask, 2, E, "a->mask = 2"), REAL_CASE(KA, softmax_scale, NAN, "a->softmax_scale = nan"), \
        REAL_CASE(KA, softmax_scale, 1e300, "a->softmax_scale = 1e+300"),                              \
        INT_CASE(KA, o_dtype, 7, E, "a->o_dtype = 7"), INT_CASE(KA, q_stride_s, -8, E, "a->q_stride_s = -8"), \
        INT_CASE(KA, lse_stride_h, -1, E, "a->lse_stride_h = -1"),                                     \
        INT_CASE(KA, batch, INT64_MAX, E, "elements overflows"),                                       \
        INT_CASE(KA, batch, (int64_t)1 << 58, E, "a->q spans more than the address space"),            \
        INT_CASE(KA, v_stride_s, INT64_MAX / 2, E, "a->v spans more than the address space"),          \
        SHIFT_CASE(KA, q, 2, "a->q = "), SHIFT_CASE(KA, k, 1, "a->k = "), SHIFT_CASE(KA, v, 3, "a->v = "), \
        SHIFT_CASE(KA, o, 2, "a->o = "), SHIFT_CASE(KA, lse, 2, "a->lse = "),                          \
        /* API 1.1 */                                                                                  \
        INT_CASE(KA, window, -1, E, "a->window = -1"),                                                 \
        INT_CASE(KA, window, INT64_MIN, E, "a->window = -9223372036854775808"),                        \
        REAL_CASE(KA, softcap, NAN, "a->softcap = nan"), REAL_CASE(KA, softcap, -1.0, "a->softcap = -1"), \
        REAL_CASE(KA, softcap, INFINITY, "a->softcap = inf"),                                          \
        REAL_CASE(KA, softcap, 1e300, "a->softcap = 1e+300"),                                          \
        REAL_CASE(KA, softcap, 1e-300, "a->softcap = 1e-300"),                                         \
        INT_CASE(KA, num_rects, -1, E, "a->num_rects = -1"),                                           \
        INT_CASE(KA, num_rects, INT64_MIN, E, "a->num_rects = -9223372036854775808"),                  \
        INT_CASE(KA, num_rects, 2, E, "a->rects is NULL with a->num_rects = 2"),                       \
        /* API 1.2: descales are for FP8 inputs (these calls are F32) */                               \
        INT_CASE(KA, o_dtype, CP_DTYPE_FP8_E4M3, E, "a->o_dtype = 4"),                                 \
        SHIFT_CASE(KA, q_descale, 4, "a->q_descale is set but a->dtype = 0 (F32)"),                    \
        SHIFT_CASE(KA, k_descale, 8, "a->k_descale is set but a->dtype = 0 (F32)"),                    \
        SHIFT_CASE(KA, v_descale, 4, "a->v_descale is set but a->dtype = 0 (F32)"),                    \
        INT_CASE(KA, descale_per_head, 2, E, "a->descale_per_head = 2"),                               \
        INT_CASE(KA, descale_per_head, -1, E, "a->descale_per_head = -1")

static cp_status call_kernel_forward(const void *a)
{
    fill(buf.o, sizeof buf.o);
    fill(buf.lse, sizeof buf.lse);
    cp_status s = cp_kernel_attn_forward(fx.ctx, a);
    if (s != CP_SUCCESS) {
        untouched(buf.o, sizeof buf.o);
        untouched(buf.lse, sizeof buf.lse);
    }
    return s;
}

static cp_status call_kernel_backward(const void *a)
{
    fill(buf.dq, sizeof buf.dq);
    fill(buf.dk, sizeof buf.dk);
    fill(buf.dv, sizeof buf.dv);
    cp_status s = cp_kernel_attn_backward(fx.ctx, a);
    if (s != CP_SUCCESS) {
        untouched(buf.dq, sizeof buf.dq);
        untouched(buf.dk, sizeof buf.dk);
        untouched(buf.dv, sizeof buf.dv);
    }
    return s;
}

static int size_backward; /* which size call_kernel_size asks for */

static cp_status call_kernel_size(const void *a)
{
    size_t bytes = 7;
    cp_status s = cp_kernel_attn_workspace_size(fx.ctx, a, size_backward, &bytes);
    if (s != CP_SUCCESS)
        assert_int_equal(bytes, 0);
    return s;
}

/* A valid set with a workspace, for the workspace_bytes case. */
static cp_kernel_attn_args kernel_args_with_workspace(void)
{
    cp_kernel_attn_args a = valid_kernel_args();
    a.workspace = buf.part;
    a.workspace_bytes = sizeof buf.part;
    size_t need = 0;
    assert_int_equal(cp_kernel_attn_workspace_size(fx.ctx, &a, 1, &need), CP_SUCCESS);
    if (need > sizeof buf.part)
        a.workspace = NULL, a.workspace_bytes = 0; /* too small to lend: let the kernel allocate */
    return a;
}

/* Rectangles (API 1.1) out of the block's rows, or with positions that
 * overflow: each is the second of two, after one over the whole block. */
static void hostile_rects(struct_call call)
{
    cp_kernel_attn_args a = valid_kernel_args();
    cp_attn_rect r[2] = { { 0, KSQ, 0, KSK, 0, 0 }, { 0, 0, 0, 0, 0, 0 } };
    a.rects = r;
    a.num_rects = 1;
    assert_int_equal(call(&a), CP_SUCCESS);
    const int64_t far = INT64_MAX / 4; /* the largest position + length the kernels take */
    const struct {
        cp_attn_rect r;
        const char *needle;
    } bad[] = {
        { { 0, -1, 0, KSK, 0, 0 }, "a->rects[1].q_len = -1" },
        { { 0, KSQ, 0, INT64_MIN, 0, 0 }, "a->rects[1].k_len = -9223372036854775808" },
        { { -1, 1, 0, KSK, 0, 0 }, "a->rects[1].q_row = -1" },
        { { 2, 3, 0, KSK, 0, 0 }, "a->rects[1].q_row = 2 with q_len = 3" },
        { { 0, KSQ + 1, 0, KSK, 0, 0 }, "a->rects[1].q_row = 0 with q_len = 5" },
        { { INT64_MAX, 1, 0, KSK, 0, 0 }, "a->rects[1].q_row = 9223372036854775807" },
        { { 0, INT64_MAX, 0, KSK, 0, 0 }, "a->rects[1].q_row = 0 with q_len = 9223372036854775807" },
        { { 0, KSQ, 1, KSK, 0, 0 }, "a->rects[1].k_row = 1 with k_len = 4" },
        { { 0, KSQ, -2, 1, 0, 0 }, "a->rects[1].k_row = -2" },
        { { 0, KSQ, 0, KSK, -1, 0 }, "a->rects[1].q_pos = -1" },
        { { 0, KSQ, 0, KSK, 0, -1 }, "a->rects[1].k_pos = -1" },
        { { 0, KSQ, 0, KSK, INT64_MAX, 0 }, "a->rects[1].q_pos = 9223372036854775807" },
        { { 0, KSQ, 0, KSK, 0, far - KSK + 1 }, "a->rects[1].k_pos = 2305843009213693948 with k_len = 4" },
    };
    a.num_rects = 2;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r[1] = bad[i].r;
        HOSTILE(call(&a), E, bad[i].needle);
    }
}

static void row_kernel_attn_forward(void **state)
{
    (void)state;
    cp_kernel_attn_args a = valid_kernel_args();
    HOSTILE(cp_kernel_attn_forward(NULL, &a), E, "ctx is NULL");
    HOSTILE(cp_kernel_attn_forward(fx.ctx, NULL), E, "a is NULL");
    static const field_case cases[] = {
        KERNEL_SHAPE_CASES,
        NULL_CASE(KA, q, "a->q is NULL"),
        NULL_CASE(KA, k, "a->k is NULL"),
        NULL_CASE(KA, v, "a->v is NULL"),
        NULL_CASE(KA, o, "a->o is NULL"),
        NULL_CASE(KA, lse, "a->lse is NULL"),
        INT_CASE(KA, accumulate, 2, E, "a->accumulate = 2"),
        INT_CASE(KA, accumulate, -1, E, "a->accumulate = -1"),
    };
    run_field_cases(&a, sizeof a, cases, sizeof cases / sizeof cases[0], call_kernel_forward);
    run_struct_sizes("a", &a, sizeof a, KERNEL_ARGS_V1, call_kernel_forward);
    hostile_rects(call_kernel_forward);
    a = kernel_args_with_workspace();
    if (a.workspace) {
        a.workspace_bytes = 1;
        HOSTILE(call_kernel_forward(&a), E, "workspace_bytes = 1");
    }
}

static void row_kernel_attn_backward(void **state)
{
    (void)state;
    cp_kernel_attn_args a = valid_kernel_args();
    HOSTILE(cp_kernel_attn_backward(NULL, &a), E, "ctx is NULL");
    HOSTILE(cp_kernel_attn_backward(fx.ctx, NULL), E, "a is NULL");
    static const field_case cases[] = {
        KERNEL_SHAPE_CASES,
        NULL_CASE(KA, q, "a->q is NULL"),
        NULL_CASE(KA, o, "a->o is NULL"),
        NULL_CASE(KA, lse, "a->lse is NULL"),
        NULL_CASE(KA, dout, "a->dout is NULL"),
        NULL_CASE(KA, dq, "a->dq is NULL"),
        NULL_CASE(KA, dk, "a->dk is NULL"),
        NULL_CASE(KA, dv, "a->dv is NULL"),
        SHIFT_CASE(KA, dout, 2, "a->dout = "),
        SHIFT_CASE(KA, dq, 1, "a->dq = "),
        SHIFT_CASE(KA, dv, 2, "a->dv = "),
        INT_CASE(KA, grad_dtype, 9, E, "a->grad_dtype = 9"),
        INT_CASE(KA, grad_accumulate, 2, E, "a->grad_accumulate = 2"),
        INT_CASE(KA, dk_stride_h, -1, E, "a->dk_stride_h = -1"),
        INT_CASE(KA, drow_ready, 2, E, "a->drow_ready = 2"),
        INT_CASE(KA, drow_ready, -1, E, "a->drow_ready = -1"),
        INT_CASE(KA, drow_ready, 1, E, "a->drow is NULL but a->drow_ready = 1"),
        /* FP8 is forward only (API 1.2) */
        INT_CASE(KA, dtype, CP_DTYPE_FP8_E4M3, CP_ERROR_UNSUPPORTED, "a->dtype = CP_DTYPE_FP8_E4M3"),
    };
    run_field_cases(&a, sizeof a, cases, sizeof cases / sizeof cases[0], call_kernel_backward);
    run_struct_sizes("a", &a, sizeof a, KERNEL_ARGS_V1, call_kernel_backward);
    hostile_rects(call_kernel_backward);
    /* the optional rowsum buffer, misaligned */
    a.drow = (float *)((char *)buf.part + 2);
    HOSTILE(call_kernel_backward(&a), E, "a->drow = ");
    a.drow = NULL;
    a = kernel_args_with_workspace();
    if (a.workspace) {
        a.workspace_bytes = 1;
        HOSTILE(call_kernel_backward(&a), E, "workspace_bytes = 1");
    }
}

static void row_kernel_attn_workspace_size(void **state)
{
    (void)state;
    cp_kernel_attn_args a = valid_kernel_args();
    size_t bytes = 7;
    HOSTILE(cp_kernel_attn_workspace_size(fx.ctx, &a, 0, NULL), E, "bytes is NULL");
    HOSTILE(cp_kernel_attn_workspace_size(NULL, &a, 0, &bytes), E, "ctx is NULL");
    assert_int_equal(bytes, 0);
    HOSTILE(cp_kernel_attn_workspace_size(fx.ctx, NULL, 0, &bytes), E, "a is NULL");
    const int bad[] = { 2, -1, INT_MAX };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "backward = %d", bad[i]);
        bytes = 7;
        HOSTILE(cp_kernel_attn_workspace_size(fx.ctx, &a, bad[i], &bytes), E, needle);
        assert_int_equal(bytes, 0);
    }
    /* data pointers may be NULL here, so only shape cases apply */
    static const field_case cases[] = {
        KERNEL_SHAPE_CASES,
        INT_CASE(KA, grad_dtype, 9, E, "a->grad_dtype = 9"),
    };
    for (size_backward = 0; size_backward <= 1; size_backward++) {
        /* the gradient fields matter to the backward's size only */
        size_t n = sizeof cases / sizeof cases[0] - (size_backward ? 0 : 1);
        run_field_cases(&a, sizeof a, cases, n, call_kernel_size);
        run_struct_sizes("a", &a, sizeof a, KERNEL_ARGS_V1, call_kernel_size);
    }
}

static cp_kernel_merge_args valid_merge_args(void)
{
    cp_kernel_merge_args m = CP_KERNEL_MERGE_ARGS_INIT;
    m.batch = KB, m.seq = KSQ, m.num_heads = KH, m.head_dim_v = KD;
    m.o = buf.o, m.o_dtype = CP_DTYPE_F32, m.lse = buf.lse;
    m.o_part = buf.part, m.o_part_dtype = CP_DTYPE_F32, m.lse_part = buf.lse_part;
    return m;
}

static cp_status call_merge(const void *a)
{
    fill(buf.o, sizeof buf.o);
    fill(buf.lse, sizeof buf.lse);
    cp_status s = cp_kernel_merge(fx.ctx, a);
    if (s != CP_SUCCESS) {
        untouched(buf.o, sizeof buf.o);
        untouched(buf.lse, sizeof buf.lse);
    }
    return s;
}

static void row_kernel_merge(void **state)
{
    (void)state;
    cp_kernel_merge_args m = valid_merge_args();
    HOSTILE(cp_kernel_merge(NULL, &m), E, "ctx is NULL");
    HOSTILE(cp_kernel_merge(fx.ctx, NULL), E, "a is NULL");
    typedef cp_kernel_merge_args T;
    static const field_case cases[] = {
        INT_CASE(T, format, 2, E, "a->format = 2"),
        INT_CASE(T, batch, 0, E, "a->batch = 0"),
        INT_CASE(T, batch, INT64_MIN, E, "a->batch = -9223372036854775808"),
        INT_CASE(T, seq, -1, E, "a->seq = -1"),
        INT_CASE(T, num_heads, 0, E, "a->num_heads = 0"),
        INT_CASE(T, head_dim_v, 0, E, "a->head_dim_v = 0"),
        INT_CASE(T, o_dtype, 5, E, "a->o_dtype = 5"),
        INT_CASE(T, o_dtype, CP_DTYPE_FP8_E4M3, E, "a->o_dtype = 4 (CP_DTYPE_FP8_E4M3 is an input type"),
        INT_CASE(T, o_part_dtype, CP_DTYPE_FP8_E4M3, E, "a->o_part_dtype = 4"),
        INT_CASE(T, o_dtype, CP_DTYPE_F64, CP_ERROR_UNSUPPORTED, "a->o_dtype = CP_DTYPE_F64"),
        INT_CASE(T, o_part_dtype, -1, E, "a->o_part_dtype = -1"),
        NULL_CASE(T, o, "a->o is NULL"),
        NULL_CASE(T, lse, "a->lse is NULL"),
        NULL_CASE(T, o_part, "a->o_part is NULL"),
        NULL_CASE(T, lse_part, "a->lse_part is NULL"),
        SHIFT_CASE(T, o, 2, "a->o = "),
        SHIFT_CASE(T, lse, 1, "a->lse = "),
        SHIFT_CASE(T, o_part, 2, "a->o_part = "),
        SHIFT_CASE(T, lse_part, 2, "a->lse_part = "),
        INT_CASE(T, o_stride_s, -1, E, "a->o_stride_s = -1"),
        INT_CASE(T, lse_part_stride_b, -4, E, "a->lse_part_stride_b = -4"),
        INT_CASE(T, seq, INT64_MAX, E, "overflows"),
    };
    run_field_cases(&m, sizeof m, cases, sizeof cases / sizeof cases[0], call_merge);
    run_struct_sizes("a", &m, sizeof m, sizeof m, call_merge);
    /* rows that overlap (strides of 1) fit in memory, but their count does not fit in int64 */
    cp_kernel_merge_args big = valid_merge_args();
    big.batch = big.seq = (int64_t)1 << 40;
    big.o_stride_b = big.o_stride_s = big.o_stride_h = 1;
    big.o_part_stride_b = big.o_part_stride_s = big.o_part_stride_h = 1;
    big.lse_stride_b = big.lse_stride_h = big.lse_part_stride_b = big.lse_part_stride_h = 1;
    HOSTILE(call_merge(&big), E, "a->o of 1099511627776 x 1099511627776 x 2 x 4 elements overflows");
}

/* ---- checkpoint metadata ------------------------------------------------- */

static cp_status call_meta_create(const void *d)
{
    cp_ckpt_meta *m = POISON;
    cp_status s = cp_ckpt_meta_create(fx.topo, d, &m);
    if (s == CP_SUCCESS)
        cp_ckpt_meta_destroy(m);
    else
        assert_null(m);
    return s;
}

static void row_ckpt_meta_create(void **state)
{
    (void)state;
    cp_ckpt_meta *m = NULL;
    HOSTILE(cp_ckpt_meta_create(fx.topo, &fx.desc, NULL), E, "out is NULL");
    HOSTILE_OUT(m, cp_ckpt_meta_create(NULL, &fx.desc, &m), E, "t is NULL");
    HOSTILE_OUT(m, cp_ckpt_meta_create(fx.topo, NULL, &m), E, "d is NULL");
    typedef cp_attn_desc T;
    static const field_case cases[] = {
        INT_CASE(T, dtype, 5, E, "d->dtype = 5"),
        INT_CASE(T, dtype, -1, E, "d->dtype = -1"),
        INT_CASE(T, format, 2, E, "d->format = 2"),
        INT_CASE(T, seq_len, 0, E, "d->seq_len = 0"),
        INT_CASE(T, seq_len, 15, E, "d->seq_len = 15 is not divisible by 2"),
        INT_CASE(T, seq_len, INT64_MIN, E, "d->seq_len = -9223372036854775808"),
        INT_CASE(T, num_heads, 0, E, "d->num_heads = 0"),
        INT_CASE(T, num_kv_heads, 3, E, "d->num_kv_heads = 3 does not divide d->num_heads = 2"),
        INT_CASE(T, head_dim, -1, E, "d->head_dim = -1"),
        INT_CASE(T, head_dim_v, -1, E, "d->head_dim_v = -1"),
        INT_CASE(T, mask, 2, E, "d->mask = 2"),
        INT_CASE(T, layout, 3, E, "d->layout = 3"),
        INT_CASE(T, mode, 4, E, "d->mode = 4"),
        INT_CASE(T, mode, INT_MIN, E, "d->mode = -2147483648"),
    };
    run_field_cases(&fx.desc, sizeof fx.desc, cases, sizeof cases / sizeof cases[0], call_meta_create);
    run_struct_sizes("d", &fx.desc, sizeof fx.desc, DESC_V1, call_meta_create);
}

static void row_ckpt_meta_destroy(void **state)
{
    (void)state;
    cp_ckpt_meta_destroy(NULL);
}

static void row_ckpt_meta_get(void **state)
{
    (void)state;
    int64_t v = 7;
    HOSTILE(cp_ckpt_meta_get(NULL, "cp", &v), E, "m is NULL");
    HOSTILE(cp_ckpt_meta_get(fx.meta, NULL, &v), E, "key is NULL");
    HOSTILE(cp_ckpt_meta_get(fx.meta, "cp", NULL), E, "value is NULL");
    HOSTILE(cp_ckpt_meta_get(fx.meta, "order", &v), E, "key = \"order\" is a string");
    HOSTILE(cp_ckpt_meta_get(fx.meta, "", &v), CP_ERROR_NOT_FOUND, "key = \"\"");
    HOSTILE(cp_ckpt_meta_get(fx.meta, "no such key", &v), CP_ERROR_NOT_FOUND, "key = \"no such key\"");
    assert_int_equal(v, 7);
}

static void row_ckpt_meta_to_json(void **state)
{
    (void)state;
    char text[64];
    size_t len = 7;
    HOSTILE(cp_ckpt_meta_to_json(fx.meta, text, sizeof text, NULL), E, "len is NULL");
    HOSTILE(cp_ckpt_meta_to_json(NULL, text, sizeof text, &len), E, "m is NULL");
    assert_int_equal(len, 0);
    HOSTILE(cp_ckpt_meta_to_json(fx.meta, NULL, 16, &len), E, "buf is NULL but cap = 16");
    fill(text, sizeof text);
    HOSTILE(cp_ckpt_meta_to_json(fx.meta, text, sizeof text, &len), E, "cap = 64 is too small");
    untouched(text, sizeof text);
    assert_true(len > sizeof text); /* still tells the length */
}

static void row_ckpt_meta_from_json(void **state)
{
    (void)state;
    cp_ckpt_meta *m = NULL;
    static const char doc[] = "{}";
    HOSTILE(cp_ckpt_meta_from_json(doc, 2, NULL), E, "out is NULL");
    HOSTILE_OUT(m, cp_ckpt_meta_from_json(NULL, 2, &m), E, "json is NULL");
    HOSTILE_OUT(m, cp_ckpt_meta_from_json(doc, 0, &m), CP_ERROR_FORMAT, "not valid JSON");
    HOSTILE_OUT(m, cp_ckpt_meta_from_json(doc, CP_CKPT_META_MAX_BYTES + 1, &m), CP_ERROR_FORMAT, "len = 1048577");
    HOSTILE_OUT(m, cp_ckpt_meta_from_json(doc, SIZE_MAX, &m), CP_ERROR_FORMAT, "over the 1048576-byte limit");
    HOSTILE_OUT(m, cp_ckpt_meta_from_json("[1]", 3, &m), CP_ERROR_FORMAT, "not an object");
    HOSTILE_OUT(m, cp_ckpt_meta_from_json(doc, 2, &m), CP_ERROR_FORMAT, "missing required key");
}

static void row_ckpt_meta_save(void **state)
{
    (void)state;
    HOSTILE(cp_ckpt_meta_save(NULL, "meta.json"), E, "m is NULL");
    HOSTILE(cp_ckpt_meta_save(fx.meta, NULL), E, "path is NULL");
    HOSTILE(cp_ckpt_meta_save(fx.meta, ""), E, "path = \"\"");
    HOSTILE(cp_ckpt_meta_save(fx.meta, "/nonexistent-infinicp-dir/meta.json"), CP_ERROR_NOT_FOUND,
            "/nonexistent-infinicp-dir/meta.json");
    /* the system's limit, with the system's words */
    static char longest[PATH_MAX + 16];
    memset(longest, 'x', sizeof longest - 1);
    HOSTILE(cp_ckpt_meta_save(fx.meta, longest), CP_ERROR_IO, strerror(ENAMETOOLONG));
}

static void row_ckpt_meta_load(void **state)
{
    (void)state;
    cp_ckpt_meta *m = NULL;
    HOSTILE(cp_ckpt_meta_load("meta.json", NULL), E, "out is NULL");
    HOSTILE_OUT(m, cp_ckpt_meta_load(NULL, &m), E, "path is NULL");
    HOSTILE_OUT(m, cp_ckpt_meta_load("", &m), E, "path = \"\"");
    HOSTILE_OUT(m, cp_ckpt_meta_load("/nonexistent-infinicp-dir/meta.json", &m), CP_ERROR_NOT_FOUND,
                "/nonexistent-infinicp-dir/meta.json");
    HOSTILE_OUT(m, cp_ckpt_meta_load("/", &m), CP_ERROR_IO, "cannot read \"/\"");
    static char longest[PATH_MAX + 16];
    memset(longest, 'x', sizeof longest - 1);
    HOSTILE_OUT(m, cp_ckpt_meta_load(longest, &m), CP_ERROR_IO, "cannot open");
}

static void row_ckpt_meta_check(void **state)
{
    (void)state;
    cp_ckpt_verdict v = (cp_ckpt_verdict)99;
    char reason[16];
    HOSTILE(cp_ckpt_meta_check(NULL, fx.meta, &v, NULL, 0), E, "saved is NULL");
    HOSTILE(cp_ckpt_meta_check(fx.meta, NULL, &v, NULL, 0), E, "current is NULL");
    HOSTILE(cp_ckpt_meta_check(fx.meta, fx.meta, NULL, NULL, 0), E, "verdict is NULL");
    HOSTILE(cp_ckpt_meta_check(fx.meta, fx.meta, &v, NULL, 16), E, "reason is NULL but reason_cap = 16");
    HOSTILE(cp_ckpt_meta_check(fx.meta, fx.meta, &v, NULL, SIZE_MAX), E, "reason_cap = 18446744073709551615");
    assert_int_equal(v, 99);
    /* a reason that does not fit is cut, NUL-terminated, within its capacity */
    fill(reason, sizeof reason);
    assert_int_equal(cp_ckpt_meta_check(fx.meta, fx.meta, &v, reason, 5), CP_SUCCESS);
    assert_int_equal(strlen(reason), 4);
    untouched(reason + 5, sizeof reason - 5);
}

static void row_ckpt_is_writer(void **state)
{
    (void)state;
    int w = 7;
    HOSTILE(cp_ckpt_is_writer(fx.topo, 0, CP_CKPT_REPLICATED, NULL), E, "is_writer is NULL");
    HOSTILE(cp_ckpt_is_writer(NULL, 0, CP_CKPT_REPLICATED, &w), E, "t is NULL");
    assert_int_equal(w, 0);
    for (size_t i = 0; i < N_BAD_RANKS; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "rank = %d", bad_ranks[i]);
        w = 7;
        HOSTILE(cp_ckpt_is_writer(fx.topo, bad_ranks[i], CP_CKPT_SHARDED, &w), E, needle);
        assert_int_equal(w, 0);
    }
    const int roles[] = { 2, -1, INT_MAX };
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "role = %d", roles[i]);
        w = 7;
        HOSTILE(cp_ckpt_is_writer(fx.topo, 0, (cp_ckpt_role)roles[i], &w), E, needle);
        assert_int_equal(w, 0);
    }
}

/* ---- the table ------------------------------------------------------------ */

/* ---- training helpers and NCCL ---- */

static void row_loss_reduce(void **state)
{
    (void)state;
    double mean = -1.0;
    int64_t total = -1;
    HOSTILE(cp_loss_reduce(fx.ctx, NULL, 1.0, 4, &mean, &total), E, "comm is NULL");
    HOSTILE(cp_loss_reduce(fx.ctx, fx.comm, 1.0, 4, NULL, &total), E, "mean is NULL");
    HOSTILE(cp_loss_reduce(fx.ctx, fx.comm, 1.0, -4, &mean, &total), E, "tokens = -4");
    HOSTILE(cp_loss_reduce(fx.ctx, fx.comm, 1.0, INT64_MAX, &mean, &total), E, "tokens = 9223372036854775807");
    /* on failure the mean is NaN (never a plausible loss) and the count 0 */
    assert_true(isnan(mean) && total == 0);
}

static void row_grad_all_reduce(void **state)
{
    (void)state;
    float g[8];
    fill(g, sizeof g);
    HOSTILE(cp_grad_all_reduce(fx.ctx, NULL, g, 8, CP_DTYPE_F32, CP_GRAD_SUM, 0), E, "comm is NULL");
    HOSTILE(cp_grad_all_reduce(fx.ctx, fx.comm, NULL, 8, CP_DTYPE_F32, CP_GRAD_SUM, 0), E, "grad is NULL");
    HOSTILE(cp_grad_all_reduce(fx.ctx, fx.comm, g, 8, (cp_dtype)9, CP_GRAD_SUM, 0), E, "dtype = 9");
    HOSTILE(cp_grad_all_reduce(fx.ctx, fx.comm, g, 8, CP_DTYPE_FP8_E4M3, CP_GRAD_SUM, 0), E,
            "dtype = CP_DTYPE_FP8_E4M3");
    HOSTILE(cp_grad_all_reduce(fx.ctx, fx.comm, g, 8, CP_DTYPE_F32, (cp_grad_reduce)7, 0), E, "op = 7");
    HOSTILE(cp_grad_all_reduce(fx.ctx, fx.comm, g, SIZE_MAX, CP_DTYPE_F32, CP_GRAD_SUM, 0), E, "overflows");
    HOSTILE(cp_grad_all_reduce(fx.ctx, fx.comm, g, 8, CP_DTYPE_F32, CP_GRAD_SUM, 3), E, "bucket_bytes = 3");
    untouched(g, sizeof g);
}

static void row_seq_local_len(void **state)
{
    (void)state;
    int64_t len = -7;
    cp_attn_desc d = fx.desc;
    HOSTILE(cp_seq_local_len(NULL, &d, &len), E, "t is NULL");
    HOSTILE(cp_seq_local_len(fx.topo, NULL, &len), E, "d is NULL");
    HOSTILE(cp_seq_local_len(fx.topo, &d, NULL), E, "local_seq_len is NULL");
    d.seq_len += 1;
    HOSTILE(cp_seq_local_len(fx.topo, &d, &len), E, "is not divisible by cp_size");
    assert_int_equal(len, 0); /* cleared on failure */
}

static void row_stage_shape(void **state)
{
    (void)state;
    int64_t shape[3] = { -1, -1, -1 };
    size_t bytes = 7;
    HOSTILE(cp_stage_shape(NULL, &fx.desc, 16, 0, shape, &bytes), E, "t is NULL");
    HOSTILE(cp_stage_shape(fx.topo, &fx.desc, 0, 0, shape, &bytes), E, "hidden = 0");
    HOSTILE(cp_stage_shape(fx.topo, &fx.desc, 16, 8, shape, &bytes), E, "flags = 0x8");
    HOSTILE(cp_stage_shape(fx.topo, &fx.desc, 16, 0, NULL, &bytes), E, "shape is NULL");
    HOSTILE(cp_stage_shape(fx.topo, &fx.desc, INT64_MAX, 0, shape, &bytes), E, "overflows");
    /* cleared on failure */
    assert_true(shape[0] == 0 && shape[1] == 0 && shape[2] == 0 && bytes == 0);
}

static void row_comm_create_nccl(void **state)
{
    (void)state;
    cp_comm *c = NULL;
    HOSTILE(cp_comm_create_nccl((void *)&c, NULL), E, "out is NULL");
    HOSTILE_OUT(c, cp_comm_create_nccl(NULL, &c), E, "nccl_comm is NULL");
}

/* Every hostile argument is refused before the CUDA module is looked for. */
static void row_nccl_unique_id(void **state)
{
    (void)state;
    unsigned char id[CP_NCCL_UNIQUE_ID_BYTES + 8];
    HOSTILE(cp_nccl_unique_id(NULL, CP_NCCL_UNIQUE_ID_BYTES), E, "id is NULL");
    const size_t bad[] = { 0, 1, 64, CP_NCCL_UNIQUE_ID_BYTES - 1, CP_NCCL_UNIQUE_ID_BYTES + 1, 256, SIZE_MAX };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "id_bytes = %zu", bad[i]);
        fill(id, sizeof id);
        HOSTILE(cp_nccl_unique_id(id, bad[i]), E, needle);
        untouched(id, sizeof id);
    }
}

static void row_comm_create_nccl_id(void **state)
{
    (void)state;
    enum { B = CP_NCCL_UNIQUE_ID_BYTES };
    unsigned char id[B];
    fill(id, sizeof id);
    cp_comm *c = NULL;
    HOSTILE(cp_comm_create_nccl_id(fx.ctx, id, B, 1, 0, NULL), E, "out is NULL");
    HOSTILE_OUT(c, cp_comm_create_nccl_id(NULL, id, B, 1, 0, &c), E, "ctx is NULL");
    HOSTILE_OUT(c, cp_comm_create_nccl_id(fx.ctx, NULL, B, 1, 0, &c), E, "id is NULL");
    const size_t bad_bytes[] = { 0, 1, B - 1, B + 1, SIZE_MAX };
    for (size_t i = 0; i < sizeof bad_bytes / sizeof bad_bytes[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "id_bytes = %zu", bad_bytes[i]);
        HOSTILE_OUT(c, cp_comm_create_nccl_id(fx.ctx, id, bad_bytes[i], 1, 0, &c), E, needle);
    }
    const int bad_nranks[] = { 0, -1, INT_MIN };
    for (size_t i = 0; i < sizeof bad_nranks / sizeof bad_nranks[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "nranks = %d", bad_nranks[i]);
        HOSTILE_OUT(c, cp_comm_create_nccl_id(fx.ctx, id, B, bad_nranks[i], 0, &c), E, needle);
    }
    const struct {
        int nranks, rank;
    } bad_rank[] = { { 1, -1 }, { 1, 1 }, { 4, 4 }, { 4, -1 }, { 4, INT_MIN }, { 4, INT_MAX }, { INT_MAX, INT_MAX } };
    for (size_t i = 0; i < sizeof bad_rank / sizeof bad_rank[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "rank = %d", bad_rank[i].rank);
        HOSTILE_OUT(c, cp_comm_create_nccl_id(fx.ctx, id, B, bad_rank[i].nranks, bad_rank[i].rank, &c), E, needle);
    }
    /* valid arguments on a CPU context: NCCL needs a CUDA one */
    HOSTILE_OUT(c, cp_comm_create_nccl_id(fx.ctx, id, B, 1, 0, &c), CP_ERROR_UNSUPPORTED, "ctx is a CPU context");
    HOSTILE_OUT(c, cp_comm_create_nccl_id(fx.ctx, id, B, 2, 1, &c), CP_ERROR_UNSUPPORTED, "CP_DEVICE_CUDA");
    untouched(id, sizeof id);
}

static const struct row {
    const char *name;
    CMUnitTestFunction run;
} rows[] = {
    { "cp_attn_backward", row_attn_backward },
    { "cp_attn_backward_ex", row_attn_backward_ex },
    { "cp_attn_forward", row_attn_forward },
    { "cp_attn_forward_ex", row_attn_forward_ex },
    { "cp_attn_plan_create", row_attn_plan_create },
    { "cp_attn_plan_destroy", row_attn_plan_destroy },
    { "cp_attn_workspace_size", row_attn_workspace_size },
    { "cp_ckpt_is_writer", row_ckpt_is_writer },
    { "cp_ckpt_meta_check", row_ckpt_meta_check },
    { "cp_ckpt_meta_create", row_ckpt_meta_create },
    { "cp_ckpt_meta_destroy", row_ckpt_meta_destroy },
    { "cp_ckpt_meta_from_json", row_ckpt_meta_from_json },
    { "cp_ckpt_meta_get", row_ckpt_meta_get },
    { "cp_ckpt_meta_load", row_ckpt_meta_load },
    { "cp_ckpt_meta_save", row_ckpt_meta_save },
    { "cp_ckpt_meta_to_json", row_ckpt_meta_to_json },
    { "cp_comm_create_local", row_comm_create_local },
    { "cp_comm_create_nccl", row_comm_create_nccl },
    { "cp_comm_create_nccl_id", row_comm_create_nccl_id },
    { "cp_comm_create_mpi", row_comm_create_mpi },
    { "cp_comm_destroy", row_comm_destroy },
    { "cp_comm_rank", row_comm_rank },
    { "cp_comm_size", row_comm_size },
    { "cp_comm_split", row_comm_split },
    { "cp_context_create", row_context_create },
    { "cp_context_destroy", row_context_destroy },
    { "cp_context_set_stream", row_context_set_stream },
    { "cp_context_synchronize", row_context_synchronize },
    { "cp_group_create", row_group_create },
    { "cp_group_destroy", row_group_destroy },
    { "cp_group_rank", row_group_rank },
    { "cp_grad_all_reduce", row_grad_all_reduce },
    { "cp_group_size", row_group_size },
    { "cp_kernel_attn_backward", row_kernel_attn_backward },
    { "cp_kernel_attn_forward", row_kernel_attn_forward },
    { "cp_kernel_attn_workspace_size", row_kernel_attn_workspace_size },
    { "cp_kernel_merge", row_kernel_merge },
    { "cp_last_error", row_last_error },
    { "cp_layout_gather", row_layout_gather },
    { "cp_layout_positions", row_layout_positions },
    { "cp_layout_shard", row_layout_shard },
    { "cp_loss_reduce", row_loss_reduce },
    { "cp_nccl_unique_id", row_nccl_unique_id },
    { "cp_pack_create", row_pack_create },
    { "cp_pack_destroy", row_pack_destroy },
    { "cp_pack_gather", row_pack_gather },
    { "cp_pack_positions", row_pack_positions },
    { "cp_pack_shard", row_pack_shard },
    { "cp_pack_work", row_pack_work },
    { "cp_seq_local_len", row_seq_local_len },
    { "cp_stage_shape", row_stage_shape },
    { "cp_status_string", row_status_string },
    { "cp_topology_color", row_topology_color },
    { "cp_topology_coords", row_topology_coords },
    { "cp_topology_create", row_topology_create },
    { "cp_topology_destroy", row_topology_destroy },
    { "cp_topology_group", row_topology_group },
    { "cp_topology_rank", row_topology_rank },
    { "cp_version", row_version },
};
#define N_ROWS (sizeof rows / sizeof rows[0])

/* Every name in the version script has a row, and every row is exported. */
static void test_every_function_has_a_row(void **state)
{
    (void)state;
    FILE *f = fopen(map_path, "r");
    if (!f)
        fail_msg("cannot open the version script %s", map_path);
    char line[512];
    int global = 0, missing = 0, exported = 0;
    int seen[N_ROWS] = { 0 };
    while (fgets(line, sizeof line, f)) {
        char name[256], end = 0;
        if (strstr(line, "global:")) {
            global = 1;
            continue;
        }
        if (strstr(line, "local:")) {
            global = 0;
            continue;
        }
        if (!global || sscanf(line, " %255[A-Za-z0-9_]%c", name, &end) != 2 || end != ';')
            continue;
        exported++;
        size_t i = 0;
        while (i < N_ROWS && strcmp(rows[i].name, name))
            i++;
        if (i == N_ROWS) {
            print_error("%s is exported but has no row in test-hostile.c\n", name);
            missing++;
        } else {
            seen[i] = 1;
        }
    }
    fclose(f);
    for (size_t i = 0; i < N_ROWS; i++)
        if (!seen[i]) {
            print_error("row %s names no exported function\n", rows[i].name);
            missing++;
        }
    assert_true(exported > 0);
    assert_int_equal(missing, 0);
}

static struct CMUnitTest tests[N_ROWS + 1];

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <version script>\n", argv[0]);
        return 2;
    }
    map_path = argv[1];
    tests[0] = (struct CMUnitTest){ .name = "every function has a row", .test_func = test_every_function_has_a_row };
    for (size_t i = 0; i < N_ROWS; i++)
        tests[i + 1] = (struct CMUnitTest){ .name = rows[i].name, .test_func = rows[i].run };
    return cmocka_run_group_tests_name("hostile", tests, setup, teardown);
}
