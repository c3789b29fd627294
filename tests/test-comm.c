/* SPDX-License-Identifier: MIT */
/* Communicators on the in-process transport: every collective for worlds of
 * 1..8 ranks and split sub-communicators, on host memory and on a pretend
 * device; timeouts, disagreement, peers that leave; CP groups; layout
 * gather; bad arguments; how the core takes a transport table (required and
 * optional slots) and loads the MPI module. Each rank runs on its own
 * thread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/group.h"
#include "commsuite.h"
#include "fakedev.h"
#include "testutil.h"
#include "world.h"

#define MAX_RANKS 8
#define SHORT_TIMEOUT_MS 200
#define LONG_TIMEOUT_MS 60000

/* ---- running one function per rank on its own thread -------------------- */

/* The suite's ranks take (rank, size, communicator); the tests' world
 * harness (world.h) runs them. */
typedef void (*rank_fn)(int rank, int size, cp_comm *c, void *arg);

typedef struct rank_call {
    rank_fn fn;
    void *arg;
} rank_call;

static void call_rank(world_rank *r, void *p)
{
    const rank_call *k = p;
    k->fn(r->rank, r->size, r->comm, k->arg);
}

/* Run fn on the n ranks of comms (the world takes them over and destroys
 * them when every rank is done), or of a fresh local world where comms is
 * NULL. */
static void run_on(int n, cp_comm **comms, rank_fn fn, void *arg)
{
    world w;
    rank_call k = { fn, arg };
    if (world_run(&w, n, comms, call_rank, &k) != CP_SUCCESS)
        fail_msg("%s", w.error);
}

static void run_world(int n, rank_fn fn, void *arg)
{
    run_on(n, NULL, fn, arg);
}

/* ---- the collective suite ------------------------------------------------ */

typedef struct suite_arg {
    const suite_mem *mem;
    atomic_int failures;
} suite_arg;

static void suite_rank(int rank, int size, cp_comm *c, void *p)
{
    suite_arg *a = p;
    atomic_fetch_add(&a->failures, suite_collectives(c, a->mem, LONG_TIMEOUT_MS));
}

static void mismatch_rank(int rank, int size, cp_comm *c, void *p)
{
    suite_arg *a = p;
    atomic_fetch_add(&a->failures, suite_mismatch(c, a->mem, LONG_TIMEOUT_MS));
}

static void run_suite(rank_fn fn, const suite_mem *mem, int first, int last)
{
    for (int n = first; n <= last; n++) {
        suite_arg a = { mem, 0 };
        run_world(n, fn, &a);
        if (atomic_load(&a.failures))
            fail_msg("world of %d ranks on %s: %d failed checks (see above)", n,
                     mem->ops ? mem->ops->name : "host memory", atomic_load(&a.failures));
    }
}

static const suite_mem host_mem = { NULL, NULL };
static suite_mem device_mem;

static void test_collectives_host(void **state)
{
    run_suite(suite_rank, &host_mem, 1, MAX_RANKS);
}

static void test_collectives_device(void **state)
{
    run_suite(suite_rank, &device_mem, 1, MAX_RANKS);
}

static void test_mismatch(void **state)
{
    run_suite(mismatch_rank, &host_mem, 2, 5);
    run_suite(mismatch_rank, &device_mem, 7, 8);
}

/* ---- all_to_all of strided blocks ------------------------------------------ */

/* Every rank sends with a block step and row pitch of its own (the reader
 * must use the sender's), and receives with its own; recv's gaps between
 * rows and blocks must stay as they were. Byte (rank s, block d, row r,
 * column k) of what s sends d is a function of all four. */
#define A2A2D_WIDTH 5
#define A2A2D_ROWS 3

static unsigned char a2a2d_byte(int s, int d, int r, int k)
{
    return (unsigned char)(1 + s * 37 + d * 11 + r * 5 + k);
}

typedef struct a2a2d_arg {
    atomic_int wrong;
    int mismatch_rows; /* > 0: the last rank passes this many rows */
} a2a2d_arg;

static void a2a2d_rank(int rank, int size, cp_comm *c, void *p)
{
    a2a2d_arg *a = p;
    /* odd ranks send their blocks in reverse order (a negative step), every
     * third rank receives them so */
    const size_t spitch = A2A2D_WIDTH + (size_t)rank, sgap = A2A2D_ROWS * spitch + 2 * (size_t)rank + 1;
    const size_t rpitch = A2A2D_WIDTH + 2 + (size_t)rank % 2, rgap = A2A2D_ROWS * rpitch + 3;
    const int sback = rank % 2, rback = rank % 3 == 2;
    const ptrdiff_t sstep = sback ? -(ptrdiff_t)sgap : (ptrdiff_t)sgap;
    const ptrdiff_t rstep = rback ? -(ptrdiff_t)rgap : (ptrdiff_t)rgap;
    unsigned char send[MAX_RANKS * 64], recv[MAX_RANKS * 64];
    unsigned char *s0 = send + (sback ? (size_t)(size - 1) * sgap : 0);
    unsigned char *r0 = recv + (rback ? (size_t)(size - 1) * rgap : 0);
    memset(send, 0xAB, sizeof send);
    memset(recv, 0xEE, sizeof recv);
    for (int d = 0; d < size; d++)
        for (int r = 0; r < A2A2D_ROWS; r++)
            for (int k = 0; k < A2A2D_WIDTH; k++)
                s0[(ptrdiff_t)d * sstep + (ptrdiff_t)((size_t)r * spitch + (size_t)k)] = a2a2d_byte(rank, d, r, k);
    const size_t rows = a->mismatch_rows && rank == size - 1 ? (size_t)a->mismatch_rows : A2A2D_ROWS;
    cp_xfer x = { NULL, NULL, LONG_TIMEOUT_MS };
    cp_status st = cpi_all_to_all_2d(c, &x, s0, sstep, spitch, r0, rstep, rpitch, A2A2D_WIDTH, rows);
    if (a->mismatch_rows) {
        if (st != CP_SUCCESS && st != CP_ERROR_MISMATCH)
            fprintf(stderr, "rank %d: status %d, expected CP_ERROR_MISMATCH\n", rank, (int)st);
        if (st != CP_ERROR_MISMATCH || !strstr(cp_last_error(), "rows"))
            atomic_fetch_add(&a->wrong, 1);
        for (size_t i = 0; i < sizeof recv; i++) /* nothing moved */
            if (recv[i] != 0xEE) {
                atomic_fetch_add(&a->wrong, 1);
                break;
            }
        return;
    }
    if (st != CP_SUCCESS) {
        fprintf(stderr, "rank %d: %s\n", rank, cp_last_error());
        atomic_fetch_add(&a->wrong, 1);
        return;
    }
    for (size_t i = 0; i < sizeof recv; i++) {
        /* block b from the start of recv holds what rank s sent */
        const size_t b = i / rgap, r = i % rgap / rpitch, k = i % rgap % rpitch;
        const size_t s = rback ? (size_t)(size - 1) - b : b;
        const int inside = b < (size_t)size && r < A2A2D_ROWS && k < A2A2D_WIDTH;
        const unsigned char want = inside ? a2a2d_byte((int)s, rank, (int)r, (int)k) : 0xEE;
        if (recv[i] != want) {
            fprintf(stderr, "rank %d: recv byte %zu (block %zu, row %zu, column %zu) is %u, expected %u\n", rank,
                    i, b, r, k, recv[i], want);
            atomic_fetch_add(&a->wrong, 1);
            return;
        }
    }
}

static void test_all_to_all_2d(void **state)
{
    for (int n = 1; n <= 5; n++) {
        a2a2d_arg a = { 0, 0 };
        run_world(n, a2a2d_rank, &a);
        if (atomic_load(&a.wrong))
            fail_msg("all_to_all_2d on %d ranks: wrong results (see above)", n);
    }
    for (int n = 2; n <= 3; n++) {
        a2a2d_arg a = { 0, 1 };
        run_world(n, a2a2d_rank, &a);
        if (atomic_load(&a.wrong))
            fail_msg("all_to_all_2d on %d ranks with rows disagreeing: not CP_ERROR_MISMATCH everywhere", n);
    }

    /* Arguments one rank can check alone; no rank enters the exchange. */
    cp_comm *comms[2];
    assert_int_equal(cp_comm_create_local(2, comms), CP_SUCCESS);
    assert_true(cpi_comm_has_all_to_all_2d(comms[0]));
    assert_false(cpi_comm_has_all_to_all_2d(NULL));
    cp_xfer x = { NULL, NULL, LONG_TIMEOUT_MS };
    unsigned char buf[256];
    EXPECT_ERROR(cpi_all_to_all_2d(NULL, &x, buf, 8, 8, buf + 128, 8, 8, 4, 2), CP_ERROR_INVALID_ARGUMENT,
                 "comm is NULL");
    EXPECT_ERROR(cpi_all_to_all_2d(comms[0], &x, buf, 16, 3, buf + 128, 16, 8, 4, 2), CP_ERROR_INVALID_ARGUMENT,
                 "send_pitch = 3");
    EXPECT_ERROR(cpi_all_to_all_2d(comms[0], &x, buf, 16, 8, buf + 128, 16, 2, 4, 2), CP_ERROR_INVALID_ARGUMENT,
                 "recv_pitch = 2");
    EXPECT_ERROR(cpi_all_to_all_2d(comms[0], &x, NULL, 16, 8, buf + 128, 16, 8, 4, 2), CP_ERROR_INVALID_ARGUMENT,
                 "send is NULL");
    /* blocks 0 and 1 of send reach 16 + 8 + 4 = 28 bytes: recv at 20 overlaps */
    EXPECT_ERROR(cpi_all_to_all_2d(comms[0], &x, buf, 16, 8, buf + 20, 16, 8, 4, 2), CP_ERROR_INVALID_ARGUMENT,
                 "overlap");
    EXPECT_ERROR(cpi_all_to_all_2d(comms[0], &x, buf, PTRDIFF_MIN, 8, buf + 128, 16, 8, 4, 2),
                 CP_ERROR_INVALID_ARGUMENT, "overflow");
    /* backwards: block 1 of recv starts 16 bytes below recv, at buf + 112,
     * and reaches into send's block 0 at buf + 100 .. 112 + 12 */
    EXPECT_ERROR(cpi_all_to_all_2d(comms[0], &x, buf + 100, 16, 8, buf + 128, -16, 8, 4, 2),
                 CP_ERROR_INVALID_ARGUMENT, "overlap");
    for (int i = 0; i < 2; i++)
        cp_comm_destroy(comms[i]);
}

/* ---- the optional all_to_all_2d slot and required slots ------------------- */

/*
 * A transport of the module ABI's kind (no capabilities beyond its table)
 * that relays every call to a local communicator and counts the exchanges.
 * Its table is one of three: the current one, which has all_to_all_2d; one
 * of the size modules had before that slot (ending with wait), allocated
 * to exactly that size, so that a read of the slot is a read past the
 * table; and the first published one (ending with destroy).
 */
typedef struct relay_count {
    atomic_int all_to_all, all_to_all_2d;
} relay_count;

typedef struct relay {
    cp_comm *inner; /* owned */
    relay_count *count;
} relay;

static cp_status relay_all_gather(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    const relay *r = impl;
    return r->inner->ops->all_gather(r->inner->impl, x, send, recv, bytes);
}

static cp_status relay_reduce_scatter(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                                      cp_dtype dtype, cp_reduce_op op)
{
    const relay *r = impl;
    return r->inner->ops->reduce_scatter(r->inner->impl, x, send, recv, count, dtype, op);
}

static cp_status relay_all_to_all(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    const relay *r = impl;
    atomic_fetch_add(&r->count->all_to_all, 1);
    return r->inner->ops->all_to_all(r->inner->impl, x, send, recv, bytes);
}

static cp_status relay_sendrecv(void *impl, const cp_xfer *x, const void *send, size_t send_bytes, int dst,
                                void *recv, size_t recv_bytes, int src)
{
    const relay *r = impl;
    return r->inner->ops->sendrecv(r->inner->impl, x, send, send_bytes, dst, recv, recv_bytes, src);
}

static cp_status relay_all_reduce(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                                  cp_dtype dtype, cp_reduce_op op)
{
    const relay *r = impl;
    return r->inner->ops->all_reduce(r->inner->impl, x, send, recv, count, dtype, op);
}

static cp_status relay_barrier(void *impl, const cp_xfer *x)
{
    const relay *r = impl;
    return r->inner->ops->barrier(r->inner->impl, x);
}

static cp_status relay_split(void *impl, int color, int key, int timeout_ms, void **out_impl, int *out_rank,
                             int *out_size)
{
    const relay *r = impl;
    cp_comm *child = NULL;
    CPI_TRY(cpi_comm_split(r->inner, color, key, timeout_ms, &child));
    if (!child)
        return CP_SUCCESS;
    relay *k = calloc(1, sizeof *k);
    if (!k) {
        cp_comm_destroy(child);
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "relay: out of memory");
    }
    k->inner = child;
    k->count = r->count;
    *out_impl = k;
    *out_rank = child->rank;
    *out_size = child->size;
    return CP_SUCCESS;
}

static void relay_destroy(void *impl)
{
    relay *r = impl;
    cp_comm_destroy(r->inner);
    free(r);
}

static cp_status relay_all_to_all_2d(void *impl, const cp_xfer *x, const void *send, ptrdiff_t send_step,
                                     size_t send_pitch, void *recv, ptrdiff_t recv_step, size_t recv_pitch,
                                     size_t width, size_t rows)
{
    const relay *r = impl;
    atomic_fetch_add(&r->count->all_to_all_2d, 1);
    return r->inner->ops->all_to_all_2d(r->inner->impl, x, send, send_step, send_pitch, recv, recv_step,
                                        recv_pitch, width, rows);
}

static const cp_transport_ops relay_ops = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_transport_ops),
    .name = "relay",
    .all_gather = relay_all_gather,
    .reduce_scatter = relay_reduce_scatter,
    .all_to_all = relay_all_to_all,
    .sendrecv = relay_sendrecv,
    .all_reduce = relay_all_reduce,
    .barrier = relay_barrier,
    .split = relay_split,
    .destroy = relay_destroy,
    .all_to_all_2d = relay_all_to_all_2d,
};

/* Sizes of older tables: before all_to_all_2d, and the first one. */
#define RELAY_BEFORE_2D offsetof(cp_transport_ops, all_to_all_2d)
#define RELAY_V1 (offsetof(cp_transport_ops, destroy) + sizeof relay_ops.destroy)

/* relay_ops as a module of `size` bytes filled it, in exactly that much
 * memory (every slot the size covers set, all_to_all_2d included). */
static cp_transport_ops *relay_table(size_t size)
{
    unsigned char *t = malloc(size);
    assert_non_null(t);
    memcpy(t, &relay_ops, size);
    memcpy(t + offsetof(cp_transport_ops, struct_size), &size, sizeof size);
    return (cp_transport_ops *)t;
}

/* Replace each of the n comms of a local world by a relay over it, through
 * the module host, as a module would wrap its instances. */
static void relay_wrap(int n, cp_comm **comms, const cp_transport_ops *table, relay_count *count)
{
    for (int i = 0; i < n; i++) {
        relay *r = calloc(1, sizeof *r);
        assert_non_null(r);
        r->inner = comms[i];
        r->count = count;
        assert_int_equal(cpi_module_host.comm_wrap(table, r, i, n, &comms[i]), CP_SUCCESS);
    }
}

static void test_all_to_all_2d_slot(void **state)
{
    /* the current table: the strided exchange goes through the slot */
    for (int n = 1; n <= 4; n += 3) {
        relay_count count = { 0, 0 };
        cp_comm *comms[MAX_RANKS];
        assert_int_equal(cp_comm_create_local(n, comms), CP_SUCCESS);
        relay_wrap(n, comms, &relay_ops, &count);
        assert_true(cpi_comm_has_all_to_all_2d(comms[0]));
        a2a2d_arg a = { 0, 0 };
        run_on(n, comms, a2a2d_rank, &a);
        if (atomic_load(&a.wrong))
            fail_msg("all_to_all_2d through a relay of %d ranks: wrong results (see above)", n);
        assert_int_equal(atomic_load(&count.all_to_all_2d), n);
    }

    /* older tables are accepted, and have no slot even where memory past
     * them would hold a pointer: callers pack for all_to_all instead */
    const size_t sizes[] = { RELAY_BEFORE_2D, RELAY_V1 };
    for (int i = 0; i < 2; i++) {
        cp_transport_ops *old = relay_table(sizes[i]);
        relay_count count = { 0, 0 };
        cp_comm *comms[1];
        assert_int_equal(cp_comm_create_local(1, comms), CP_SUCCESS);
        relay_wrap(1, comms, old, &count);
        assert_false(cpi_comm_has_all_to_all_2d(comms[0]));
        cp_xfer x = { NULL, NULL, LONG_TIMEOUT_MS };
        unsigned char buf[64];
        EXPECT_ERROR(cpi_all_to_all_2d(comms[0], &x, buf, 8, 8, buf + 32, 8, 8, 4, 1), CP_ERROR_UNSUPPORTED,
                     "transport relay does not read strided blocks in place");
        assert_int_equal(cpi_all_to_all(comms[0], &x, buf, buf + 32, 4), CP_SUCCESS);
        assert_int_equal(cpi_comm_wait(comms[0], &x), CP_SUCCESS); /* no wait slot: nothing to wait for */
        assert_int_equal(atomic_load(&count.all_to_all_2d), 0);
        assert_int_equal(atomic_load(&count.all_to_all), 1);
        cp_comm_destroy(comms[0]);
        free(old);
    }
}

/* Ulysses attention, forward and backward, on 2 ranks of a world whose
 * comms are wrapped by `table` (NULL: the local transport itself). Results
 * land in res[rank], the exchanges in count. */
#define UA_P 2
#define UA_S 16
#define UA_H 4
#define UA_HKV 2
#define UA_D 8
#define UA_TOK (UA_S / UA_P)

typedef struct ulysses_rank_result {
    float q[UA_TOK * UA_H * UA_D], k[UA_TOK * UA_HKV * UA_D], v[UA_TOK * UA_HKV * UA_D];
    float dout[UA_TOK * UA_H * UA_D];
    float out[UA_TOK * UA_H * UA_D], lse[UA_H * UA_TOK];
    float dq[UA_TOK * UA_H * UA_D], dk[UA_TOK * UA_HKV * UA_D], dv[UA_TOK * UA_HKV * UA_D];
    cp_status status;
    char message[256];
} ulysses_rank_result;

static void ulysses_fill(float *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
}

static void ulysses_rank(int rank, int size, cp_comm *c, void *p)
{
    ulysses_rank_result *r = &((ulysses_rank_result *)p)[rank];
    ulysses_fill(r->q, sizeof r->q / sizeof *r->q, 11u + (unsigned)rank);
    ulysses_fill(r->k, sizeof r->k / sizeof *r->k, 23u + (unsigned)rank);
    ulysses_fill(r->v, sizeof r->v / sizeof *r->v, 37u + (unsigned)rank);
    ulysses_fill(r->dout, sizeof r->dout / sizeof *r->dout, 41u + (unsigned)rank);
    cp_context *ctx = NULL;
    cp_group *g = NULL;
    cp_attn_plan *plan = NULL;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = 1;
    d.seq_len = UA_S;
    d.num_heads = UA_H;
    d.num_kv_heads = UA_HKV;
    d.head_dim = UA_D;
    d.mode = CP_MODE_A2A;
    cp_status s = cp_context_create(NULL, &ctx);
    if (s == CP_SUCCESS)
        s = cp_group_create(ctx, c, NULL, &g);
    if (s == CP_SUCCESS)
        s = cp_attn_plan_create(g, &d, &plan);
    if (s == CP_SUCCESS)
        s = cp_attn_forward(plan, r->q, r->k, r->v, r->out, r->lse, NULL, 0);
    if (s == CP_SUCCESS)
        s = cp_attn_backward(plan, r->q, r->k, r->v, r->out, r->lse, r->dout, r->dq, r->dk, r->dv, NULL, 0);
    r->status = s;
    snprintf(r->message, sizeof r->message, "%s", s == CP_SUCCESS ? "" : cp_last_error());
    cp_attn_plan_destroy(plan);
    cp_group_destroy(g);
    cp_context_destroy(ctx);
}

static void run_ulysses(const cp_transport_ops *table, relay_count *count, ulysses_rank_result *res)
{
    cp_comm *comms[UA_P];
    assert_int_equal(cp_comm_create_local(UA_P, comms), CP_SUCCESS);
    if (table)
        relay_wrap(UA_P, comms, table, count);
    memset(res, 0, UA_P * sizeof *res);
    run_on(UA_P, comms, ulysses_rank, res);
    for (int i = 0; i < UA_P; i++)
        if (res[i].status != CP_SUCCESS)
            fail_msg("rank %d on %s: %s", i, table ? table->name : "local", res[i].message);
}

/* The a2a mode exchanges strided blocks in place where the comm's transport
 * has the slot, and packs them where it does not, with the same results. */
static void test_a2a_mode_direct_or_packed(void **state)
{
    static ulysses_rank_result local[UA_P], direct[UA_P], packed[UA_P];
    relay_count with = { 0, 0 }, without = { 0, 0 };
    cp_transport_ops *old = relay_table(RELAY_BEFORE_2D);
    run_ulysses(NULL, NULL, local);
    run_ulysses(&relay_ops, &with, direct);
    run_ulysses(old, &without, packed);
    free(old);
    assert_true(atomic_load(&with.all_to_all_2d) > 0);
    assert_int_equal(atomic_load(&without.all_to_all_2d), 0);
    assert_true(atomic_load(&without.all_to_all) > atomic_load(&with.all_to_all));
    for (int i = 0; i < UA_P; i++) {
        assert_memory_equal(direct[i].out, local[i].out, sizeof local[i].out);
        assert_memory_equal(packed[i].out, local[i].out, sizeof local[i].out);
        assert_memory_equal(direct[i].lse, local[i].lse, sizeof local[i].lse);
        assert_memory_equal(packed[i].lse, local[i].lse, sizeof local[i].lse);
        assert_memory_equal(direct[i].dq, local[i].dq, sizeof local[i].dq);
        assert_memory_equal(packed[i].dq, local[i].dq, sizeof local[i].dq);
        assert_memory_equal(direct[i].dk, local[i].dk, sizeof local[i].dk);
        assert_memory_equal(packed[i].dk, local[i].dk, sizeof local[i].dk);
        assert_memory_equal(direct[i].dv, local[i].dv, sizeof local[i].dv);
        assert_memory_equal(packed[i].dv, local[i].dv, sizeof local[i].dv);
    }
}

/* A table with a required slot NULL is refused at wrap, naming the slot;
 * before, it was accepted and crashed the first call of that slot. */
static void test_required_slots(void **state)
{
    static const char *const required[] = { "all_gather", "all_reduce", "all_to_all", "barrier",
                                             "destroy",    "reduce_scatter", "sendrecv",  "split" };
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        cp_transport_ops t = relay_ops;
#define NULL_SLOT(slot)                                                                                    \
    if (!strcmp(required[i], #slot))                                                                       \
        t.slot = NULL;
        NULL_SLOT(all_gather) NULL_SLOT(all_reduce) NULL_SLOT(all_to_all) NULL_SLOT(barrier)
        NULL_SLOT(destroy) NULL_SLOT(reduce_scatter) NULL_SLOT(sendrecv) NULL_SLOT(split)
#undef NULL_SLOT
        char needle[64];
        snprintf(needle, sizeof needle, "NULL: %s (", required[i]);
        int impl = 0;
        cp_comm *out = (cp_comm *)&impl;
        EXPECT_ERROR(cpi_module_host.comm_wrap(&t, &impl, 0, 1, &out), CP_ERROR_UNSUPPORTED, needle);
        assert_non_null(strstr(cp_last_error(), "\"relay\""));
        assert_null(out);
    }
    /* several at once are named together; optional slots may be NULL */
    cp_transport_ops t = relay_ops;
    t.sendrecv = NULL;
    t.split = NULL;
    int impl = 0;
    cp_comm *out;
    EXPECT_ERROR(cpi_module_host.comm_wrap(&t, &impl, 0, 1, &out), CP_ERROR_UNSUPPORTED, "NULL: sendrecv, split (");
    t = relay_ops;
    t.wait = NULL;
    t.all_to_all_2d = NULL;
    assert_int_equal(cpi_module_host.comm_wrap(&t, &impl, 0, 1, &out), CP_SUCCESS);
    free(out); /* impl is not a relay: do not destroy it through the table */
}

/* A failed load of the MPI transport module is not remembered: after
 * INFINICP_MODULE_PATH changes, cp_comm_create_mpi searches again and
 * reports the path it has now. */
static void test_mpi_module_load_is_tried_again(void **state)
{
    const char *folders[] = { "/nonexistent-infinicp-modules-a", "/nonexistent-infinicp-modules-b" };
    int fake_mpi_comm = 0;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(setenv("INFINICP_MODULE_PATH", folders[i], 1), 0);
        cp_comm *out = (cp_comm *)&fake_mpi_comm;
        cp_status s = cp_comm_create_mpi(&fake_mpi_comm, &out);
        assert_null(out);
        if (i == 0 && s != CP_ERROR_NOT_FOUND) {
            /* an installed module answered (and refused the fake handle) */
            assert_int_equal(unsetenv("INFINICP_MODULE_PATH"), 0);
            skip();
        }
        assert_int_equal(s, CP_ERROR_NOT_FOUND);
        assert_non_null(strstr(cp_last_error(), folders[i]));
        assert_non_null(strstr(cp_last_error(), "transport-mpi.so"));
    }
    assert_int_equal(unsetenv("INFINICP_MODULE_PATH"), 0);
}

/* ---- barrier ------------------------------------------------------------- */

typedef struct barrier_arg {
    atomic_int arrived;
    atomic_int wrong;
} barrier_arg;

/* No rank may leave round k's barrier before every rank has counted itself
 * in round k; the second barrier keeps the next round's counting out. */
static void barrier_rank(int rank, int size, cp_comm *c, void *p)
{
    barrier_arg *a = p;
    cp_xfer x = { NULL, NULL, LONG_TIMEOUT_MS };
    for (int round = 1; round <= 20; round++) {
        if (rank == round % size)
            sleep_ms(1); /* a late rank */
        atomic_fetch_add(&a->arrived, 1);
        if (cpi_barrier(c, &x) != CP_SUCCESS || atomic_load(&a->arrived) != round * size)
            atomic_fetch_add(&a->wrong, 1);
        if (cpi_barrier(c, &x) != CP_SUCCESS)
            atomic_fetch_add(&a->wrong, 1);
    }
}

static void test_barrier_waits_for_all(void **state)
{
    for (int n = 2; n <= 5; n += 3) {
        barrier_arg a = { 0, 0 };
        run_world(n, barrier_rank, &a);
        assert_int_equal(atomic_load(&a.wrong), 0);
        assert_int_equal(atomic_load(&a.arrived), 20 * n);
    }
}

/* ---- a rank that never comes --------------------------------------------- */

typedef struct timeout_arg {
    int absent;
    atomic_int done; /* ranks that returned */
    cp_status status[MAX_RANKS], again[MAX_RANKS];
    double waited_ms[MAX_RANKS];
    char message[MAX_RANKS][256];
} timeout_arg;

static void timeout_rank(int rank, int size, cp_comm *c, void *p)
{
    timeout_arg *a = p;
    if (rank == a->absent) {
        /* never calls; leaves only after the others gave up */
        while (atomic_load(&a->done) < size - 1)
            sleep_ms(5);
        return;
    }
    cp_xfer x = { NULL, NULL, SHORT_TIMEOUT_MS };
    int send = rank, recv[MAX_RANKS];
    double t0 = now_ms();
    a->status[rank] = cpi_all_gather(c, &x, &send, recv, sizeof send);
    a->waited_ms[rank] = now_ms() - t0;
    snprintf(a->message[rank], sizeof a->message[rank], "%s", cp_last_error());
    /* the world is broken now: the next call fails at once */
    x.timeout_ms = LONG_TIMEOUT_MS;
    a->again[rank] = cpi_barrier(c, &x);
    atomic_fetch_add(&a->done, 1);
}

static void simple_gather_rank(int rank, int size, cp_comm *c, void *p)
{
    atomic_int *wrong = p;
    cp_xfer x = { NULL, NULL, LONG_TIMEOUT_MS };
    int send = rank * 10, recv[MAX_RANKS];
    if (cpi_all_gather(c, &x, &send, recv, sizeof send) != CP_SUCCESS)
        atomic_fetch_add(wrong, 1);
    for (int j = 0; j < size; j++)
        if (recv[j] != j * 10)
            atomic_fetch_add(wrong, 1);
}

static void test_timeout(void **state)
{
    timeout_arg a;
    memset(&a, 0, sizeof a);
    a.absent = 3;
    double t0 = now_ms();
    run_world(4, timeout_rank, &a);
    double total = now_ms() - t0;
    /* the first rank to time out wakes the others, so only the longest
     * wait is bounded below by the timeout (ranks start at different times) */
    double longest = 0;
    for (int r = 0; r < 4; r++) {
        if (r == a.absent)
            continue;
        assert_int_equal(a.status[r], CP_ERROR_TIMEOUT);
        if (a.waited_ms[r] > longest)
            longest = a.waited_ms[r];
        /* the message names the rank that never came (last in the list) */
        assert_non_null(strstr(a.message[r], "timed out after 200 ms"));
        size_t len = strlen(a.message[r]);
        assert_true(strstr(a.message[r], "rank(s) ") && a.message[r][len - 1] == '3');
        assert_int_equal(a.again[r], CP_ERROR_TIMEOUT);
    }
    assert_true(longest >= SHORT_TIMEOUT_MS * 0.9);
    assert_true(total < 10000); /* nothing waited for the long timeout */

    /* the broken world is gone; a new one works */
    atomic_int wrong = 0;
    run_world(4, simple_gather_rank, &wrong);
    assert_int_equal(atomic_load(&wrong), 0);
}

/* A group's timeout applies to what runs on it: group creation itself. */
typedef struct group_timeout_arg {
    cp_status status[MAX_RANKS];
    atomic_int done;
} group_timeout_arg;

static void group_timeout_rank(int rank, int size, cp_comm *c, void *p)
{
    group_timeout_arg *a = p;
    if (rank == size - 1) {
        while (atomic_load(&a->done) < size - 1)
            sleep_ms(5);
        return;
    }
    cp_context *ctx = NULL;
    cp_group *g = NULL;
    cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    cfg.timeout_ms = SHORT_TIMEOUT_MS;
    if (cp_context_create(NULL, &ctx) == CP_SUCCESS)
        a->status[rank] = cp_group_create(ctx, c, &cfg, &g);
    if (g)
        a->status[rank] = CP_ERROR_INTERNAL; /* must not exist */
    cp_group_destroy(g);
    cp_context_destroy(ctx);
    atomic_fetch_add(&a->done, 1);
}

static void test_group_timeout(void **state)
{
    group_timeout_arg a;
    memset(&a, 0, sizeof a);
    run_world(3, group_timeout_rank, &a);
    assert_int_equal(a.status[0], CP_ERROR_TIMEOUT);
    assert_int_equal(a.status[1], CP_ERROR_TIMEOUT);
}

/* A rank that destroys its communicator wakes the peers waiting for it. */
typedef struct leave_arg {
    cp_status status;
    double waited_ms;
} leave_arg;

/* Each rank destroys its communicator itself (and tells the world, which
 * would destroy it again otherwise). */
static void leave_rank(world_rank *r, void *p)
{
    leave_arg *a = p;
    cp_comm *c = r->comm;
    r->comm = NULL;
    if (r->rank == 1) {
        sleep_ms(50);
        cp_comm_destroy(c);
        return;
    }
    cp_xfer x = { NULL, NULL, LONG_TIMEOUT_MS };
    double t0 = now_ms();
    a->status = cpi_barrier(c, &x);
    a->waited_ms = now_ms() - t0;
    cp_comm_destroy(c);
}

static void test_peer_destroyed(void **state)
{
    leave_arg a = { CP_SUCCESS, 0 };
    world w;
    assert_int_equal(world_run(&w, 2, NULL, leave_rank, &a), CP_SUCCESS);
    assert_int_equal(a.status, CP_ERROR_COMM);
    assert_true(a.waited_ms < LONG_TIMEOUT_MS / 2);
}

/* ---- CP groups ------------------------------------------------------------ */

typedef struct group_arg {
    int a2a;
    atomic_int wrong;
} group_arg;

static void group_rank(int rank, int size, cp_comm *c, void *p)
{
    group_arg *a = p;
    atomic_fetch_add(&a->wrong, suite_group(c, a->a2a, LONG_TIMEOUT_MS));
}

static void test_group_subgroups(void **state)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (int A = 1; A <= n; A++) {
            if (n % A)
                continue;
            group_arg a = { A, 0 };
            run_world(n, group_rank, &a);
            if (atomic_load(&a.wrong))
                fail_msg("group of %d ranks, a2a_size %d: %d wrong", n, A, atomic_load(&a.wrong));
        }
}

typedef struct disagree_arg {
    cp_status status[MAX_RANKS];
    char message[MAX_RANKS][256];
} disagree_arg;

static void group_disagree_rank(int rank, int size, cp_comm *c, void *p)
{
    disagree_arg *a = p;
    cp_context *ctx = NULL;
    cp_group *g = NULL;
    cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    cfg.a2a_size = rank == 0 ? 2 : 4; /* each valid alone, inconsistent together */
    a->status[rank] = cp_context_create(NULL, &ctx);
    if (a->status[rank] == CP_SUCCESS)
        a->status[rank] = cp_group_create(ctx, c, &cfg, &g);
    snprintf(a->message[rank], sizeof a->message[rank], "%s", cp_last_error());
    cp_group_destroy(g);
    cp_context_destroy(ctx);
}

static void test_group_disagreement(void **state)
{
    disagree_arg a;
    memset(&a, 0, sizeof a);
    run_world(4, group_disagree_rank, &a);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(a.status[r], CP_ERROR_MISMATCH);
        assert_non_null(strstr(a.message[r], "a2a_size"));
    }
}

/* ---- layout gather --------------------------------------------------------- */

typedef struct gather_arg {
    cp_layout layout;
    int64_t batch, seq_len;
    const suite_mem *mem;
    atomic_int wrong;
} gather_arg;

static void gather_rank(int rank, int size, cp_comm *c, void *p)
{
    gather_arg *a = p;
    atomic_fetch_add(&a->wrong, suite_layout_gather(c, a->mem, a->layout, a->batch, a->seq_len, LONG_TIMEOUT_MS));
}

static void test_layout_gather(void **state)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (int l = CP_LAYOUT_CONTIGUOUS; l <= CP_LAYOUT_ZIGZAG; l++)
            for (int64_t batch = 1; batch <= 3; batch += 2)
                for (int dev = 0; dev <= 1; dev++) {
                    gather_arg a = { (cp_layout)l, batch, 2 * n * 3, dev ? &device_mem : &host_mem, 0 };
                    run_world(n, gather_rank, &a);
                    if (atomic_load(&a.wrong))
                        fail_msg("gather: %d ranks, layout %d, batch %lld, %s: wrong", n, l, (long long)batch,
                                 dev ? "device" : "host");
                }
}

/* ---- split corner cases ------------------------------------------------------ */

typedef struct split_arg {
    atomic_int wrong;
} split_arg;

static void split_none_rank(int rank, int size, cp_comm *c, void *p)
{
    split_arg *a = p;
    cp_comm *sub = (cp_comm *)&a; /* must be overwritten */
    if (cp_comm_split(c, -1 - rank, rank, &sub) != CP_SUCCESS || sub != NULL)
        atomic_fetch_add(&a->wrong, 1);
    /* nested: split a split */
    cp_comm *half = NULL, *quarter = NULL;
    int r1 = -1, s1 = -1;
    if (cp_comm_split(c, rank / 2, -rank, &half) != CP_SUCCESS ||
        cp_comm_split(half, 0, 0, &quarter) != CP_SUCCESS || cp_comm_rank(quarter, &r1) != CP_SUCCESS ||
        cp_comm_size(quarter, &s1) != CP_SUCCESS)
        atomic_fetch_add(&a->wrong, 1);
    int pair = size - (rank / 2) * 2 >= 2 ? 2 : 1;
    /* key -rank reverses the order inside each pair */
    if (s1 != pair || r1 != (pair == 2 ? 1 - rank % 2 : 0))
        atomic_fetch_add(&a->wrong, 1);
    cp_comm_destroy(quarter);
    cp_comm_destroy(half);
}

static void test_split_corners(void **state)
{
    for (int n = 1; n <= 5; n++) {
        split_arg a = { 0 };
        run_world(n, split_none_rank, &a);
        assert_int_equal(atomic_load(&a.wrong), 0);
    }
}

/* ---- bad arguments --------------------------------------------------------- */

static void test_bad_arguments(void **state)
{
    cp_comm *comms[2] = { (cp_comm *)1, (cp_comm *)1 };
    EXPECT_ERROR(cp_comm_create_local(0, comms), CP_ERROR_INVALID_ARGUMENT, "nranks = 0");
    EXPECT_ERROR(cp_comm_create_local(-3, comms), CP_ERROR_INVALID_ARGUMENT, "nranks = -3");
    EXPECT_ERROR(cp_comm_create_local(5000, comms), CP_ERROR_INVALID_ARGUMENT, "nranks = 5000");
    EXPECT_ERROR(cp_comm_create_local(2, NULL), CP_ERROR_INVALID_ARGUMENT, "comms is NULL");

    cp_comm *out = (cp_comm *)1;
    EXPECT_ERROR(cp_comm_create_mpi(NULL, &out), CP_ERROR_INVALID_ARGUMENT, "mpi_comm is NULL");
    assert_null(out);
    EXPECT_ERROR(cp_comm_create_mpi(&out, NULL), CP_ERROR_INVALID_ARGUMENT, "out is NULL");
    out = (cp_comm *)1;
    EXPECT_ERROR(cp_comm_split(NULL, 0, 0, &out), CP_ERROR_INVALID_ARGUMENT, "c is NULL");
    assert_null(out);

    /* Collective calls: a rank with bad arguments still takes part (its peers
     * fail at once, see test-agree), so the checks run on a world of one. */
    cp_comm *solo[1];
    assert_int_equal(cp_comm_create_local(1, solo), CP_SUCCESS);
    EXPECT_ERROR(cp_comm_split(solo[0], 0, 0, NULL), CP_ERROR_INVALID_ARGUMENT, "out is NULL");
    assert_int_equal(cp_comm_create_local(2, comms), CP_SUCCESS);
    int v = 7;
    EXPECT_ERROR(cp_comm_rank(NULL, &v), CP_ERROR_INVALID_ARGUMENT, "c is NULL");
    assert_int_equal(v, -1);
    EXPECT_ERROR(cp_comm_rank(comms[0], NULL), CP_ERROR_INVALID_ARGUMENT, "rank is NULL");
    EXPECT_ERROR(cp_comm_size(NULL, &v), CP_ERROR_INVALID_ARGUMENT, "c is NULL");
    EXPECT_ERROR(cp_comm_size(comms[0], NULL), CP_ERROR_INVALID_ARGUMENT, "size is NULL");
    assert_int_equal(cp_comm_rank(comms[1], &v), CP_SUCCESS);
    assert_int_equal(v, 1);
    assert_int_equal(cp_comm_size(comms[1], &v), CP_SUCCESS);
    assert_int_equal(v, 2);

    /* the checked collectives: what one rank can see alone */
    cp_xfer x = { NULL, NULL, 1000 };
    char buf[64];
    EXPECT_ERROR(cpi_all_gather(NULL, &x, buf, buf, 1), CP_ERROR_INVALID_ARGUMENT, "comm is NULL");
    EXPECT_ERROR(cpi_all_gather(comms[0], NULL, buf, buf, 1), CP_ERROR_INVALID_ARGUMENT, "xfer is NULL");
    EXPECT_ERROR(cpi_all_gather(comms[0], &x, buf, buf, SIZE_MAX / 2 + 1), CP_ERROR_INVALID_ARGUMENT,
                 "overflows");
    EXPECT_ERROR(cpi_all_gather(comms[0], &x, NULL, buf, 4), CP_ERROR_INVALID_ARGUMENT, "send is NULL");
    EXPECT_ERROR(cpi_all_gather(comms[0], &x, buf, NULL, 4), CP_ERROR_INVALID_ARGUMENT, "recv is NULL");
    EXPECT_ERROR(cpi_all_gather(comms[0], &x, buf + 2, buf, 4), CP_ERROR_INVALID_ARGUMENT, "overlaps");
    EXPECT_ERROR(cpi_all_to_all(comms[0], &x, buf, buf + 4, 4), CP_ERROR_INVALID_ARGUMENT, "overlap");
    EXPECT_ERROR(cpi_sendrecv(comms[0], &x, buf, 4, 2, buf + 8, 4, 0), CP_ERROR_INVALID_ARGUMENT, "dst = 2");
    EXPECT_ERROR(cpi_sendrecv(comms[0], &x, buf, 4, 1, buf + 8, 4, -1), CP_ERROR_INVALID_ARGUMENT, "src = -1");
    EXPECT_ERROR(cpi_sendrecv(comms[0], &x, buf, 8, 1, buf + 4, 4, 1), CP_ERROR_INVALID_ARGUMENT, "overlap");
    EXPECT_ERROR(cpi_all_reduce(comms[0], &x, buf, buf + 32, 4, (cp_dtype)9, CP_REDUCE_SUM),
                 CP_ERROR_INVALID_ARGUMENT, "dtype = 9");
    EXPECT_ERROR(cpi_all_reduce(comms[0], &x, buf, buf + 32, 4, CP_DTYPE_F32, (cp_reduce_op)5),
                 CP_ERROR_INVALID_ARGUMENT, "op = 5");
    EXPECT_ERROR(cpi_all_reduce(comms[0], &x, buf, buf + 2, 4, CP_DTYPE_F32, CP_REDUCE_SUM),
                 CP_ERROR_INVALID_ARGUMENT, "overlap");
    EXPECT_ERROR(cpi_reduce_scatter(comms[0], &x, buf, buf, SIZE_MAX / 4, CP_DTYPE_F64, CP_REDUCE_MAX),
                 CP_ERROR_INVALID_ARGUMENT, "count");
    EXPECT_ERROR(cpi_barrier(NULL, &x), CP_ERROR_INVALID_ARGUMENT, "comm is NULL");

    /* groups */
    cp_context *ctx = NULL;
    assert_int_equal(cp_context_create(NULL, &ctx), CP_SUCCESS);
    cp_group *g = (cp_group *)1;
    cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    EXPECT_ERROR(cp_group_create(ctx, solo[0], &cfg, NULL), CP_ERROR_INVALID_ARGUMENT, "out is NULL");
    EXPECT_ERROR(cp_group_create(NULL, solo[0], &cfg, &g), CP_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    assert_null(g);
    EXPECT_ERROR(cp_group_create(ctx, NULL, &cfg, &g), CP_ERROR_INVALID_ARGUMENT, "comm is NULL");
    cfg.a2a_size = 0;
    EXPECT_ERROR(cp_group_create(ctx, solo[0], &cfg, &g), CP_ERROR_INVALID_ARGUMENT, "cfg->a2a_size = 0");
    cfg.a2a_size = 3;
    EXPECT_ERROR(cp_group_create(ctx, solo[0], &cfg, &g), CP_ERROR_INVALID_ARGUMENT,
                 "cfg->a2a_size = 3 does not divide the communicator size 1");
    cfg = (cp_group_config)CP_GROUP_CONFIG_INIT;
    cfg.timeout_ms = 0;
    EXPECT_ERROR(cp_group_create(ctx, solo[0], &cfg, &g), CP_ERROR_INVALID_ARGUMENT, "cfg->timeout_ms = 0");
    cfg = (cp_group_config)CP_GROUP_CONFIG_INIT;
    cfg.num_streams = 0;
    EXPECT_ERROR(cp_group_create(ctx, solo[0], &cfg, &g), CP_ERROR_INVALID_ARGUMENT, "cfg->num_streams = 0");
    cfg.num_streams = 65;
    EXPECT_ERROR(cp_group_create(ctx, solo[0], &cfg, &g), CP_ERROR_INVALID_ARGUMENT, "cfg->num_streams = 65");
    cfg = (cp_group_config)CP_GROUP_CONFIG_INIT;
    cfg.struct_size = 4;
    EXPECT_ERROR(cp_group_create(ctx, solo[0], &cfg, &g), CP_ERROR_INVALID_ARGUMENT, "cfg->struct_size = 4");
    EXPECT_ERROR(cp_group_rank(NULL, &v), CP_ERROR_INVALID_ARGUMENT, "g is NULL");
    EXPECT_ERROR(cp_group_size(NULL, &v), CP_ERROR_INVALID_ARGUMENT, "g is NULL");

    /* a real group of one rank to reach the checks behind the NULL ones */
    assert_int_equal(cp_group_create(ctx, solo[0], NULL, &g), CP_SUCCESS);
    EXPECT_ERROR(cp_group_rank(g, NULL), CP_ERROR_INVALID_ARGUMENT, "rank is NULL");
    EXPECT_ERROR(cp_group_size(g, NULL), CP_ERROR_INVALID_ARGUMENT, "size is NULL");
    char local[64], global[256];
    EXPECT_ERROR(cp_layout_gather(NULL, CP_LAYOUT_CONTIGUOUS, local, global, 1, 8, 1), CP_ERROR_INVALID_ARGUMENT,
                 "g is NULL");
    EXPECT_ERROR(cp_layout_gather(g, CP_LAYOUT_CONTIGUOUS, NULL, global, 1, 8, 1), CP_ERROR_INVALID_ARGUMENT,
                 "local is NULL");
    EXPECT_ERROR(cp_layout_gather(g, CP_LAYOUT_CONTIGUOUS, local, NULL, 1, 8, 1), CP_ERROR_INVALID_ARGUMENT,
                 "global is NULL");
    EXPECT_ERROR(cp_layout_gather(g, (cp_layout)2, local, global, 1, 8, 1), CP_ERROR_INVALID_ARGUMENT,
                 "layout = 2");
    EXPECT_ERROR(cp_layout_gather(g, CP_LAYOUT_ZIGZAG, local, global, 1, 7, 1), CP_ERROR_INVALID_ARGUMENT,
                 "seq_len = 7");
    EXPECT_ERROR(cp_layout_gather(g, CP_LAYOUT_CONTIGUOUS, local, global, 0, 8, 1), CP_ERROR_INVALID_ARGUMENT,
                 "batch = 0");
    EXPECT_ERROR(cp_layout_gather(g, CP_LAYOUT_CONTIGUOUS, local, global, 1, 8, 0), CP_ERROR_INVALID_ARGUMENT,
                 "token_bytes = 0");
    EXPECT_ERROR(cp_layout_gather(g, CP_LAYOUT_CONTIGUOUS, local, global, INT64_MAX / 2, 8, 1),
                 CP_ERROR_INVALID_ARGUMENT, "overflows");
    EXPECT_ERROR(cp_layout_gather(g, CP_LAYOUT_CONTIGUOUS, global + 8, global, 1, 8, 4), CP_ERROR_INVALID_ARGUMENT,
                 "overlaps");

    /* destroy(NULL) is a no-op */
    cp_group_destroy(NULL);
    cp_comm_destroy(NULL);
    cp_group_destroy(g);
    cp_comm_destroy(solo[0]);
    cp_context_destroy(ctx);
    cp_comm_destroy(comms[0]);
    cp_comm_destroy(comms[1]);
}

int main(void)
{
    device_mem.ops = fakedev_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_collectives_host),
        cmocka_unit_test(test_collectives_device),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_all_to_all_2d),
        cmocka_unit_test(test_all_to_all_2d_slot),
        cmocka_unit_test(test_a2a_mode_direct_or_packed),
        cmocka_unit_test(test_required_slots),
        cmocka_unit_test(test_mpi_module_load_is_tried_again),
        cmocka_unit_test(test_barrier_waits_for_all),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_group_timeout),
        cmocka_unit_test(test_peer_destroyed),
        cmocka_unit_test(test_group_subgroups),
        cmocka_unit_test(test_group_disagreement),
        cmocka_unit_test(test_split_corners),
        cmocka_unit_test(test_layout_gather),
    };
    return cmocka_run_group_tests_name("comm", tests, NULL, NULL);
}
