/* SPDX-License-Identifier: MIT */
/*
 * The in-process transport in stream order, on the asynchronous pretend
 * device of fakeasync.c (each rank a thread with a backend state of its own,
 * whose streams run later, in random time): the collective suite; rings
 * where every rank keeps queueing work on its buffers right after each
 * collective, which give wrong data unless readers wait for owners and
 * owners for readers; the same on the host path (INFINICP_LOCAL_HOST_SYNC=1);
 * ranks that disagree on the ordering; a rank that never arrives. The
 * pretend device itself comes first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/group.h"
#include "commsuite.h"
#include "fakeasync.h"
#include "testutil.h"
#include "world.h"

#define MAX_RANKS 4
#define MAX_DELAY_US 200
#define SHORT_TIMEOUT_MS 2000
#define LONG_TIMEOUT_MS 60000

/* ---- running one function per rank, each with its own device state ------- */

typedef void (*rank_fn)(int rank, int size, cp_comm *c, void *dev, void *arg);

/* The device states of a world's ranks, and what each rank runs on its own. */
typedef struct fake_world {
    rank_fn fn;
    void *arg;
    void *devs[MAX_RANKS];
} fake_world;

static void fake_rank(world_rank *r, void *p)
{
    fake_world *f = p;
    f->fn(r->rank, r->size, r->comm, f->devs[r->rank], f->arg);
}

/* A fresh world of n ranks (made with INFINICP_LOCAL_HOST_SYNC=1 when
 * host_sync) and a fresh pretend device state per rank, for one run of fn.
 * The states are closed only once the whole world is done: work a rank
 * queued may wait on events of a peer's state. */
static void run_world(int n, bool host_sync, unsigned seed, rank_fn fn, void *arg)
{
    fake_world f = { fn, arg, { NULL } };
    cp_comm *comms[MAX_RANKS];
    for (int i = 0; i < n; i++)
        assert_int_equal(fakeasync_open(seed * 16 + (unsigned)i, MAX_DELAY_US, &f.devs[i]), CP_SUCCESS);
    /* the world reads it when it is made */
    if (host_sync)
        assert_int_equal(setenv("INFINICP_LOCAL_HOST_SYNC", "1", 1), 0);
    cp_status s = cp_comm_create_local(n, comms);
    if (host_sync)
        unsetenv("INFINICP_LOCAL_HOST_SYNC");
    assert_int_equal(s, CP_SUCCESS);
    world w;
    if (world_run(&w, n, comms, fake_rank, &f) != CP_SUCCESS)
        fail_msg("%s", w.error);
    for (int i = 0; i < n; i++)
        fakeasync_ops()->close(f.devs[i]);
}

/* bytes of memory on backend b (NULL: the host), or abort. */
static void *must_alloc(const cp_backend_ops *b, void *dev, size_t bytes)
{
    void *p = NULL;
    if (b ? b->alloc(dev, bytes, &p) != CP_SUCCESS : !(p = malloc(bytes))) {
        fprintf(stderr, "out of memory in the test\n");
        abort();
    }
    return p;
}

/* ---- the pretend device -------------------------------------------------- */

static void fill_host(const cp_backend_ops *b, void *dev, void *dst, const void *src, size_t bytes)
{
    assert_int_equal(b->copy_2d(dev, dst, bytes, src, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE), CP_SUCCESS);
}

static void expect_bytes(const cp_backend_ops *b, void *dev, const void *buf, size_t bytes, unsigned char want)
{
    unsigned char host[256];
    assert_true(bytes <= sizeof host);
    assert_int_equal(b->copy_2d(dev, host, bytes, buf, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST), CP_SUCCESS);
    for (size_t i = 0; i < bytes; i++)
        if (host[i] != want)
            fail_msg("byte %zu is 0x%02x, want 0x%02x", i, host[i], want);
}

/* Streams run in order, events order them across streams and states, and
 * a wait keeps what its event marked when it was queued. */
static void test_fake_device(void **unused)
{
    const cp_backend_ops *b = fakeasync_ops();
    assert_true(CP_BACKEND_HAS(b, event_wait) && CP_BACKEND_HAS(b, stream_select));
    void *s1 = NULL, *s2 = NULL, *p = NULL, *q = NULL, *ev = NULL, *never = NULL;
    assert_int_equal(fakeasync_open(1, MAX_DELAY_US, &s1), CP_SUCCESS);
    assert_int_equal(fakeasync_open(2, MAX_DELAY_US, &s2), CP_SUCCESS);
    assert_int_equal(b->alloc(s1, 64, &p), CP_SUCCESS);
    assert_int_equal(b->alloc(s2, 64, &q), CP_SUCCESS);
    expect_bytes(b, s1, p, 64, 0xCD);

    /* one stream: the last of many queued writes wins */
    for (int v = 1; v <= 20; v++)
        assert_int_equal(b->memset(s1, p, v, 64), CP_SUCCESS);
    expect_bytes(b, s1, p, 64, 20);

    /* across states: s2 copies p only after s1's writes before the record,
     * though the event is recorded again and then destroyed meanwhile */
    assert_int_equal(b->event_create(s1, &ev), CP_SUCCESS);
    for (int round = 0; round < 5; round++) {
        for (int v = 1; v <= 8; v++)
            assert_int_equal(b->memset(s1, p, 30 + round * 10 + v, 64), CP_SUCCESS);
        assert_int_equal(b->event_record(s1, ev), CP_SUCCESS);
        assert_int_equal(b->event_wait(s2, ev), CP_SUCCESS);
        assert_int_equal(b->copy_2d(s2, q, 64, p, 64, 64, 1, CP_COPY_DEVICE_TO_DEVICE), CP_SUCCESS);
        assert_int_equal(b->event_record(s2, ev), CP_SUCCESS); /* now it marks s2's copy */
        assert_int_equal(b->event_wait(s1, ev), CP_SUCCESS);
        expect_bytes(b, s2, q, 64, (unsigned char)(38 + round * 10));
    }
    b->event_destroy(s1, ev);

    /* an auxiliary stream of the same state, and back */
    assert_int_equal(b->event_create(s1, &ev), CP_SUCCESS);
    assert_int_equal(b->memset(s1, p, 77, 64), CP_SUCCESS);
    assert_int_equal(b->event_record(s1, ev), CP_SUCCESS);
    assert_int_equal(b->stream_select(s1, 3), CP_SUCCESS);
    assert_int_equal(b->event_wait(s1, ev), CP_SUCCESS);
    assert_int_equal(b->memset(s1, p, 78, 32), CP_SUCCESS);
    assert_int_equal(b->event_record(s1, ev), CP_SUCCESS);
    assert_int_equal(b->stream_select(s1, 0), CP_SUCCESS);
    assert_int_equal(b->event_wait(s1, ev), CP_SUCCESS);
    b->event_destroy(s1, ev);
    expect_bytes(b, s1, p, 32, 78);
    expect_bytes(b, s1, (char *)p + 32, 32, 77);
    assert_int_equal(b->stream_select(s1, CP_BACKEND_MAX_STREAMS), CP_ERROR_INVALID_ARGUMENT);

    /* an event never recorded: waiting is a no-op */
    assert_int_equal(b->event_create(s2, &never), CP_SUCCESS);
    assert_int_equal(b->event_wait(s2, never), CP_SUCCESS);
    assert_int_equal(b->synchronize(s2), CP_SUCCESS);
    b->event_destroy(s2, never);
    b->event_destroy(s2, NULL);

    /* convert and reduce on the stream, with the CPU backend's semantics */
    float in[4] = { 1.5f, -2.0f, 3.25f, 1e-3f }, sum[4], two[4] = { 2, 2, 2, 2 };
    fill_host(b, s1, p, in, sizeof in);
    fill_host(b, s1, (char *)p + 16, two, sizeof two);
    assert_int_equal(b->reduce(s1, p, (char *)p + 16, CP_DTYPE_F32, 4, CP_REDUCE_SUM), CP_SUCCESS);
    assert_int_equal(b->convert(s1, q, CP_DTYPE_BF16, p, CP_DTYPE_F32, 4), CP_SUCCESS);
    assert_int_equal(b->convert(s1, p, CP_DTYPE_F32, q, CP_DTYPE_BF16, 4), CP_SUCCESS);
    assert_int_equal(b->copy_2d(s1, sum, 16, p, 16, 16, 1, CP_COPY_DEVICE_TO_HOST), CP_SUCCESS);
    assert_true(sum[0] == 3.5f && sum[1] == 0.0f && sum[2] == 5.25f && sum[3] == 2.0f);
    assert_int_equal(b->convert(s1, q, (cp_dtype)9, p, CP_DTYPE_F32, 4), CP_ERROR_INVALID_ARGUMENT);

    b->free(s1, p);
    b->free(s2, q);
    b->close(s1);
    b->close(s2);
}

/* ---- the collective suite ------------------------------------------------ */

typedef struct suite_arg {
    int (*suite)(cp_comm *c, const suite_mem *m, int timeout_ms);
    atomic_int failures;
} suite_arg;

static void suite_rank(int rank, int size, cp_comm *c, void *dev, void *p)
{
    suite_arg *a = p;
    suite_mem m = { fakeasync_ops(), dev };
    atomic_fetch_add(&a->failures, a->suite(c, &m, LONG_TIMEOUT_MS));
}

static void run_suite(int (*suite)(cp_comm *c, const suite_mem *m, int timeout_ms), unsigned seed)
{
    for (int n = 2; n <= MAX_RANKS; n++) {
        suite_arg a = { suite, 0 };
        run_world(n, false, seed + (unsigned)n, suite_rank, &a);
        if (atomic_load(&a.failures))
            fail_msg("world of %d ranks on fakeasync: %d failed checks (see above)", n, atomic_load(&a.failures));
    }
}

static void test_collectives(void **unused)
{
    run_suite(suite_collectives, 100);
}

static void test_mismatch(void **unused)
{
    run_suite(suite_mismatch, 200);
}

/* ---- rings: queue, exchange, queue more at once ----------------------------- */

#define RING_ITERS 20
#define RING_BYTES 256 /* a block of the byte-moving collectives */
#define RING_COUNT 64  /* elements each rank gets from a reduction */
#define SEND_GARBAGE 0xEE
#define RECV_GARBAGE 0xDD

typedef enum ring_kind {
    RING_SENDRECV,
    RING_ALL_GATHER,
    RING_ALL_TO_ALL,
    RING_ALL_REDUCE,
    RING_REDUCE_SCATTER,
    RING_KINDS
} ring_kind;

static const char *const ring_names[] = { "sendrecv", "all_gather", "all_to_all", "all_reduce (BF16, in place)",
                                          "reduce_scatter (F32)" };

/* One rank's send and recv bytes, and the unit a check reports. */
typedef struct ring_shape {
    size_t send, recv, block;
} ring_shape;

static ring_shape ring_shape_of(ring_kind k, int size)
{
    size_t n = (size_t)size;
    switch (k) {
    case RING_SENDRECV: return (ring_shape){ RING_BYTES, RING_BYTES, RING_BYTES };
    case RING_ALL_GATHER: return (ring_shape){ RING_BYTES, n * RING_BYTES, RING_BYTES };
    case RING_ALL_TO_ALL: return (ring_shape){ n * RING_BYTES, n * RING_BYTES, RING_BYTES };
    case RING_ALL_REDUCE: return (ring_shape){ RING_COUNT * 2, RING_COUNT * 2, RING_COUNT * 2 };
    default: return (ring_shape){ n * RING_COUNT * 4, RING_COUNT * 4, RING_COUNT * 4 };
    }
}

/* What rank `from` sends rank `to` in iteration `iter` (to = -1: to all):
 * in 1..200, so never the garbage bytes nor fresh memory (0xCD). */
static unsigned char pattern(int from, int to, int iter)
{
    return (unsigned char)(1 + (unsigned)(from * 7 + (to + 1) * 3 + iter * 13) % 200u);
}

/* Element i of rank r's reduction input in iteration it: small integers,
 * so every sum is exact in BF16 and F32. */
static double ring_value(int r, int it, size_t i)
{
    return (double)(int)(((size_t)(r * 5 + it * 3) + i) % 17) - 8;
}

/* The send buffer of rank r in iteration it. */
static void ring_send(ring_kind k, int r, int size, int it, unsigned char *out)
{
    ring_shape sh = ring_shape_of(k, size);
    switch (k) {
    case RING_SENDRECV:
        memset(out, pattern(r, (r + 1) % size, it), sh.send);
        break;
    case RING_ALL_GATHER:
        memset(out, pattern(r, -1, it), sh.send);
        break;
    case RING_ALL_TO_ALL:
        for (int j = 0; j < size; j++)
            memset(out + (size_t)j * RING_BYTES, pattern(r, j, it), RING_BYTES);
        break;
    case RING_ALL_REDUCE:
        for (size_t i = 0; i < RING_COUNT; i++)
            suite_encode(CP_DTYPE_BF16, out, i, ring_value(r, it, i));
        break;
    default:
        for (size_t i = 0; i < (size_t)size * RING_COUNT; i++)
            suite_encode(CP_DTYPE_F32, out, i, ring_value(r, it, i));
        break;
    }
}

/* What rank r must receive in iteration it. */
static void ring_expect(ring_kind k, int r, int size, int it, unsigned char *out)
{
    switch (k) {
    case RING_SENDRECV:
        memset(out, pattern((r + size - 1) % size, r, it), RING_BYTES);
        break;
    case RING_ALL_GATHER:
    case RING_ALL_TO_ALL:
        for (int j = 0; j < size; j++)
            memset(out + (size_t)j * RING_BYTES, pattern(j, k == RING_ALL_GATHER ? -1 : r, it), RING_BYTES);
        break;
    default: {
        size_t first = k == RING_REDUCE_SCATTER ? (size_t)r * RING_COUNT : 0;
        for (size_t i = 0; i < RING_COUNT; i++) {
            double sum = 0;
            for (int j = 0; j < size; j++)
                sum += ring_value(j, it, first + i);
            suite_encode(k == RING_ALL_REDUCE ? CP_DTYPE_BF16 : CP_DTYPE_F32, out, i, sum);
        }
        break;
    }
    }
}

typedef struct ring_arg {
    ring_kind kind;
    atomic_int wrong;  /* received blocks with a wrong byte */
    atomic_int blocks; /* received blocks checked */
    atomic_int errors; /* calls that failed */
} ring_arg;

#define RING_CALL(a, call)                                                                          \
    do {                                                                                            \
        cp_status ring_s_ = (call);                                                                 \
        if (ring_s_ != CP_SUCCESS) {                                                                \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,                     \
                    cp_status_string(ring_s_), cp_last_error());                                     \
            atomic_fetch_add(&(a)->errors, 1);                                                      \
        }                                                                                           \
    } while (0)

/*
 * Each iteration only queues: fill send (a copy from a pattern uploaded at
 * the start, run after the stream's random delay), the collective, a copy
 * of recv into this iteration's slot of a check buffer, then garbage over
 * send and recv. The garbage and the next fill must not reach a peer (the
 * owner's stream waits for its readers), the fill must be there before a
 * peer reads (readers wait for the owner), and the own copy of recv comes
 * before its overwrite (one stream). Only the end drains.
 */
static void ring_rank(int rank, int size, cp_comm *c, void *dev, void *p)
{
    ring_arg *a = p;
    const cp_backend_ops *b = fakeasync_ops();
    cp_xfer x = { b, dev, LONG_TIMEOUT_MS };
    ring_shape sh = ring_shape_of(a->kind, size);
    int dst = (rank + 1) % size, src = (rank + size - 1) % size;
    bool in_place = a->kind == RING_ALL_REDUCE;
    unsigned char *pat_host = must_alloc(NULL, NULL, sh.send * RING_ITERS);
    unsigned char *want = must_alloc(NULL, NULL, sh.recv * RING_ITERS);
    unsigned char *got = must_alloc(NULL, NULL, sh.recv * RING_ITERS);
    void *pat = must_alloc(b, dev, sh.send * RING_ITERS), *send = must_alloc(b, dev, sh.send);
    void *recv = in_place ? send : must_alloc(b, dev, sh.recv), *check = must_alloc(b, dev, sh.recv * RING_ITERS);
    for (int it = 0; it < RING_ITERS; it++) {
        ring_send(a->kind, rank, size, it, pat_host + (size_t)it * sh.send);
        ring_expect(a->kind, rank, size, it, want + (size_t)it * sh.recv);
    }
    RING_CALL(a, b->copy_2d(dev, pat, sh.send * RING_ITERS, pat_host, sh.send * RING_ITERS, sh.send * RING_ITERS, 1,
                            CP_COPY_HOST_TO_DEVICE));
    for (int it = 0; it < RING_ITERS; it++) {
        RING_CALL(a, b->copy_2d(dev, send, sh.send, (char *)pat + (size_t)it * sh.send, sh.send, sh.send, 1,
                                CP_COPY_DEVICE_TO_DEVICE));
        switch (a->kind) {
        case RING_SENDRECV:
            RING_CALL(a, cpi_sendrecv(c, &x, send, sh.send, dst, recv, sh.recv, src));
            break;
        case RING_ALL_GATHER:
            RING_CALL(a, cpi_all_gather(c, &x, send, recv, RING_BYTES));
            break;
        case RING_ALL_TO_ALL:
            RING_CALL(a, cpi_all_to_all(c, &x, send, recv, RING_BYTES));
            break;
        case RING_ALL_REDUCE:
            RING_CALL(a, cpi_all_reduce(c, &x, send, recv, RING_COUNT, CP_DTYPE_BF16, CP_REDUCE_SUM));
            break;
        default:
            RING_CALL(a, cpi_reduce_scatter(c, &x, send, recv, RING_COUNT, CP_DTYPE_F32, CP_REDUCE_SUM));
            break;
        }
        RING_CALL(a, b->copy_2d(dev, (char *)check + (size_t)it * sh.recv, sh.recv, recv, sh.recv, sh.recv, 1,
                                CP_COPY_DEVICE_TO_DEVICE));
        RING_CALL(a, b->memset(dev, send, SEND_GARBAGE, sh.send));
        if (!in_place)
            RING_CALL(a, b->memset(dev, recv, RECV_GARBAGE, sh.recv));
    }
    RING_CALL(a, b->synchronize(dev));
    RING_CALL(a, b->copy_2d(dev, got, sh.recv * RING_ITERS, check, sh.recv * RING_ITERS, sh.recv * RING_ITERS, 1,
                            CP_COPY_DEVICE_TO_HOST));
    int wrong = 0;
    for (int it = 0; it < RING_ITERS; it++)
        for (size_t blk = 0; blk < sh.recv / sh.block; blk++) {
            size_t at = (size_t)it * sh.recv + blk * sh.block;
            for (size_t i = 0; i < sh.block; i++)
                if (got[at + i] != want[at + i]) {
                    if (wrong++ < 4)
                        fprintf(stderr, "%s ring, rank %d, iteration %d: block %zu, byte %zu is 0x%02x, want 0x%02x\n",
                                ring_names[a->kind], rank, it, blk, i, got[at + i], want[at + i]);
                    break;
                }
            atomic_fetch_add(&a->blocks, 1);
        }
    atomic_fetch_add(&a->wrong, wrong);
    b->free(dev, pat);
    b->free(dev, send);
    if (!in_place)
        b->free(dev, recv);
    b->free(dev, check);
    free(pat_host);
    free(want);
    free(got);
}

/* Every kind runs (and says what it found) before the test fails. */
static void run_rings(bool host_sync, unsigned seed)
{
    int failed = 0;
    for (int k = 0; k < RING_KINDS; k++) {
        ring_arg a = { (ring_kind)k, 0, 0, 0 };
        run_world(MAX_RANKS, host_sync, seed + (unsigned)k, ring_rank, &a);
        ring_shape sh = ring_shape_of((ring_kind)k, MAX_RANKS);
        int want = MAX_RANKS * RING_ITERS * (int)(sh.recv / sh.block);
        if (atomic_load(&a.errors) || atomic_load(&a.wrong) || atomic_load(&a.blocks) != want) {
            fprintf(stderr, "%s ring of %d ranks%s: %d failed calls, %d of %d received blocks wrong\n",
                    ring_names[k], MAX_RANKS, host_sync ? " (host sync)" : "", atomic_load(&a.errors),
                    atomic_load(&a.wrong), atomic_load(&a.blocks));
            failed++;
        }
    }
    if (failed)
        fail_msg("%d of %d rings failed (see above)", failed, RING_KINDS);
}

static void test_rings(void **unused)
{
    run_rings(false, 300);
}

/* The host path with an asynchronous device: synchronizing orders it too. */
static void test_rings_host_sync(void **unused)
{
    run_rings(true, 400);
}

/* ---- ranks that disagree on the ordering ---------------------------------------- */

/* A second table with the same functions: another device backend to the
 * transport, which compares tables. */
static cp_backend_ops other_ops;

typedef enum placement { ON_FAKEASYNC, ON_HOST, ON_OTHER } placement;

typedef struct order_arg {
    placement where[MAX_RANKS];
    cp_status got[MAX_RANKS][5];
    char message[MAX_RANKS][5][256]; /* cp_last_error() */
    bool untouched[MAX_RANKS];       /* recv kept its poison */
    cp_status after[MAX_RANKS];      /* a collective everyone agrees on, afterwards */
    bool after_ok[MAX_RANKS];
} order_arg;

static void order_rank(int rank, int size, cp_comm *c, void *dev, void *p)
{
    order_arg *a = p;
    placement w = a->where[rank];
    const cp_backend_ops *b = w == ON_HOST ? NULL : w == ON_OTHER ? &other_ops : fakeasync_ops();
    cp_xfer x = { b, b ? dev : NULL, SHORT_TIMEOUT_MS };
    size_t bytes = 64 * (size_t)size;
    unsigned char poison[256], seen[256];
    memset(poison, 0x5C, sizeof poison);
    void *send = must_alloc(b, dev, bytes), *recv = must_alloc(b, dev, bytes);
    if (b) {
        b->copy_2d(dev, send, bytes, poison, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE);
        b->copy_2d(dev, recv, bytes, poison, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE);
    } else {
        memcpy(send, poison, bytes);
        memcpy(recv, poison, bytes);
    }
    int dst = (rank + 1) % size, src = (rank + size - 1) % size;
    for (int k = 0; k < 5; k++) {
        cp_status s = CP_ERROR_INTERNAL;
        switch (k) {
        case 0: s = cpi_all_gather(c, &x, send, recv, 64); break;
        case 1: s = cpi_all_to_all(c, &x, send, recv, 64); break;
        case 2: s = cpi_sendrecv(c, &x, send, 64, dst, recv, 64, src); break;
        case 3: s = cpi_all_reduce(c, &x, send, recv, 16, CP_DTYPE_F32, CP_REDUCE_SUM); break;
        case 4: s = cpi_reduce_scatter(c, &x, send, recv, 16 / size, CP_DTYPE_F32, CP_REDUCE_SUM); break;
        }
        a->got[rank][k] = s;
        snprintf(a->message[rank][k], sizeof a->message[rank][k], "%s", cp_last_error() ? cp_last_error() : "");
    }
    if (b)
        b->copy_2d(dev, seen, bytes, recv, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST);
    else
        memcpy(seen, recv, bytes);
    a->untouched[rank] = !memcmp(seen, poison, bytes);

    /* the world still works: everyone on its device state now */
    const cp_backend_ops *f = fakeasync_ops();
    cp_xfer y = { f, dev, SHORT_TIMEOUT_MS };
    void *one = must_alloc(f, dev, 8), *all = must_alloc(f, dev, 8 * (size_t)size);
    f->memset(dev, one, 0x40 + rank, 8);
    a->after[rank] = cpi_all_gather(c, &y, one, all, 8);
    f->copy_2d(dev, seen, 8 * (size_t)size, all, 8 * (size_t)size, 8 * (size_t)size, 1, CP_COPY_DEVICE_TO_HOST);
    a->after_ok[rank] = true;
    for (int j = 0; j < size * 8; j++)
        if (seen[j] != 0x40 + j / 8)
            a->after_ok[rank] = false;
    f->free(dev, one);
    f->free(dev, all);
    if (b) {
        b->free(dev, send);
        b->free(dev, recv);
    } else {
        free(send);
        free(recv);
    }
}

static void test_order_mismatch(void **unused)
{
    static const char *const names[] = { "all_gather", "all_to_all", "sendrecv", "all_reduce",
                                         "reduce_scatter" };
    static const placement cases[][MAX_RANKS] = {
        { ON_FAKEASYNC, ON_HOST },
        { ON_HOST, ON_FAKEASYNC },
        { ON_FAKEASYNC, ON_HOST, ON_FAKEASYNC },
        { ON_FAKEASYNC, ON_OTHER },
        { ON_FAKEASYNC, ON_FAKEASYNC, ON_FAKEASYNC, ON_OTHER },
    };
    static const int sizes[] = { 2, 2, 3, 2, 4 };
    other_ops = *fakeasync_ops();
    other_ops.name = "fakeasync-other";
    for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
        order_arg a;
        memset(&a, 0, sizeof a);
        memcpy(a.where, cases[t], sizeof a.where);
        run_world(sizes[t], false, 500 + (unsigned)t, order_rank, &a);
        for (int r = 0; r < sizes[t]; r++) {
            for (int k = 0; k < 5; k++) {
                if (a.got[r][k] != CP_ERROR_MISMATCH)
                    fail_msg("case %zu, rank %d, %s: %s, want CP_ERROR_MISMATCH", t, r, names[k],
                             cp_status_string(a.got[r][k]));
                /* disagreeing calls name the ranks, and how each one queues */
                if (!strstr(a.message[r][k], "rank") || !strstr(a.message[r][k], "backend"))
                    fail_msg("case %zu, rank %d, %s: message \"%s\"", t, r, names[k], a.message[r][k]);
            }
            if (!a.untouched[r])
                fail_msg("case %zu, rank %d: recv was written", t, r);
            if (a.after[r] != CP_SUCCESS || !a.after_ok[r])
                fail_msg("case %zu, rank %d: the all_gather afterwards gave %s%s", t, r,
                         cp_status_string(a.after[r]), a.after_ok[r] ? "" : " and wrong data");
        }
    }
}

/* ---- a rank that never arrives ------------------------------------------ */

#define STALL_TIMEOUT_MS 200

typedef struct stall_arg {
    cp_status got[MAX_RANKS], again[MAX_RANKS];
    double ms[MAX_RANKS];
} stall_arg;

/* The last rank stops before the exchange; the others have queued work on
 * their send buffers and posted their events when they give up. */
static void stall_rank(int rank, int size, cp_comm *c, void *dev, void *p)
{
    stall_arg *a = p;
    if (rank == size - 1)
        return;
    const cp_backend_ops *f = fakeasync_ops();
    cp_xfer x = { f, dev, STALL_TIMEOUT_MS };
    void *send = must_alloc(f, dev, 64), *recv = must_alloc(f, dev, 64);
    assert_int_equal(f->memset(dev, send, rank + 1, 64), CP_SUCCESS);
    double t0 = now_ms();
    a->got[rank] = cpi_sendrecv(c, &x, send, 64, (rank + 1) % size, recv, 64, (rank + size - 1) % size);
    a->ms[rank] = now_ms() - t0;
    a->again[rank] = cpi_all_gather(c, &x, send, recv, 16); /* the world is broken now */
    f->free(dev, send);
    f->free(dev, recv);
}

/* One all_gather whose data is checked: ok[rank]. */
static void gather_rank(int rank, int size, cp_comm *c, void *dev, void *p)
{
    bool *ok = p;
    const cp_backend_ops *f = fakeasync_ops();
    cp_xfer y = { f, dev, LONG_TIMEOUT_MS };
    unsigned char seen[8 * MAX_RANKS];
    void *one = must_alloc(f, dev, 8), *all = must_alloc(f, dev, 8 * (size_t)size);
    f->memset(dev, one, 0x40 + rank, 8);
    cp_status s = cpi_all_gather(c, &y, one, all, 8);
    f->copy_2d(dev, seen, 8 * (size_t)size, all, 8 * (size_t)size, 8 * (size_t)size, 1, CP_COPY_DEVICE_TO_HOST);
    ok[rank] = s == CP_SUCCESS;
    for (int j = 0; j < size * 8; j++)
        if (seen[j] != 0x40 + j / 8)
            ok[rank] = false;
    f->free(dev, one);
    f->free(dev, all);
}

/* In stream order too, the ranks a peer leaves waiting fail with
 * CP_ERROR_TIMEOUT within the timeout, everything they made in the call
 * goes (valgrind and ASan watch), later calls fail at once, and a new world
 * works. */
static void test_stalled_rank(void **unused)
{
    (void)unused;
    stall_arg a;
    memset(&a, 0, sizeof a);
    run_world(3, false, 600, stall_rank, &a);
    /* The first rank to time out breaks the world and wakes the others, so
     * only the longest wait is bounded below by the timeout: a rank that
     * entered later (thread start-up, valgrind) returns sooner. */
    double longest = 0;
    for (int r = 0; r < 2; r++) {
        if (a.got[r] != CP_ERROR_TIMEOUT)
            fail_msg("rank %d: %s, want CP_ERROR_TIMEOUT", r, cp_status_string(a.got[r]));
        if (!(a.ms[r] < STALL_TIMEOUT_MS + 5000)) /* slack for a loaded machine under valgrind */
            fail_msg("rank %d gave up after %.1f ms (timeout %d ms)", r, a.ms[r], STALL_TIMEOUT_MS);
        if (a.ms[r] > longest)
            longest = a.ms[r];
        assert_int_not_equal(a.again[r], CP_SUCCESS);
    }
    if (!(longest >= STALL_TIMEOUT_MS - 5))
        fail_msg("the first rank gave up after %.1f ms, before the timeout of %d ms", longest, STALL_TIMEOUT_MS);
    bool ok[MAX_RANKS] = { false };
    run_world(3, false, 601, gather_rank, ok);
    for (int r = 0; r < 3; r++)
        assert_true(ok[r]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_device),
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_rings),
        cmocka_unit_test(test_rings_host_sync),
        cmocka_unit_test(test_order_mismatch),
        cmocka_unit_test(test_stalled_rank),
    };
    return cmocka_run_group_tests_name("local-order", tests, NULL, NULL);
}
