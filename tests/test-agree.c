/* SPDX-License-Identifier: MIT */
/*
 * One rank with a bad argument in a collective call. Every public function
 * that communicates lets that rank take part in the call's agreement, so in
 * a CP group of 4 ranks (threads), for a bad argument on the first, a middle
 * or the last rank:
 *  - that rank returns CP_ERROR_INVALID_ARGUMENT with its own message,
 *    which names the argument;
 *  - every other rank returns CP_ERROR_MISMATCH naming that rank;
 *  - every rank is back within 1 s of the last one's arrival (the group's
 *    timeout is 20 s, so a rank left waiting shows as a failure);
 *  - the world still works: the next good calls on the same communicators,
 *    group and plan give bit for bit the forward and backward they gave
 *    before anything failed.
 * Worlds on the local transport take the folded path (the verdict rides the
 * call's first exchanges), worlds wrapped in a pass-through transport the
 * voted one (a small all-reduce first). Also here: the plan's own workspace
 * is the forward's size until a backward needs more.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/context.h"
#include "cprun.h"
#include "faulty.h"
#include "testutil.h"
#include "world.h"

enum { P = 4, S = 32, H = 4, HKV = 2, D = 8, NGRAD = 10, MAX_ROUNDS = 12 };

/* Long enough that a rank left waiting for a peer fails the 1 s bound. */
#define TIMEOUT_MS 20000
#define BOUND_MS 1000.0

/* The collective calls, each with one bad argument, and what the bad
 * rank's message must name. */
typedef enum call {
    GROUP_STREAMS,
    PLAN_HEAD_DIM,
    FORWARD_NULL_K,
    FORWARD_SMALL_WS,
    BACKWARD_NULL_DQ,
    BACKWARD_SMALL_WS,
    GATHER_NULL_LOCAL,
    LOSS_TOKENS,
    GRAD_OP,
    SPLIT_NULL_OUT,
} call;

static const struct {
    const char *name, *needle;
} calls[] = {
    [GROUP_STREAMS] = { "cp_group_create", "cfg->num_streams = 0" },
    [PLAN_HEAD_DIM] = { "cp_attn_plan_create", "desc->head_dim = 0" },
    [FORWARD_NULL_K] = { "cp_attn_forward", "k is NULL" },
    [FORWARD_SMALL_WS] = { "cp_attn_forward", "workspace_bytes = " },
    [BACKWARD_NULL_DQ] = { "cp_attn_backward", "dq is NULL" },
    [BACKWARD_SMALL_WS] = { "cp_attn_backward", "workspace_bytes = " },
    [GATHER_NULL_LOCAL] = { "cp_layout_gather", "local is NULL" },
    [LOSS_TOKENS] = { "cp_loss_reduce", "tokens = -1" },
    [GRAD_OP] = { "cp_grad_all_reduce", "op = 5" },
    [SPLIT_NULL_OUT] = { "cp_comm_split", "out is NULL" },
};

typedef struct round {
    call c;
    int bad; /* the rank that passes the bad argument */
} round;

/* What one rank saw in one round. */
typedef struct seen {
    cp_status s;
    char msg[512];
    double arrive, back; /* around the call */
    cp_status next;      /* of the good calls after it */
    char next_msg[600];
} seen;

typedef struct scenario {
    const char *name;
    cp_mode mode;
    cp_layout layout;
    int a2a;
    int wrapped; /* behind the pass-through transport: the voted path */
    const round *rounds;
    int nrounds;
    const cpref_data *d;
    cpref_result clean;              /* before anything failed */
    cpref_result after[MAX_ROUNDS];  /* by the good calls after each round */
    seen r[MAX_ROUNDS][P];
    pthread_barrier_t bar;
} scenario;

/* One rank's handles (in its fixture) and buffers. */
typedef struct rank_state {
    scenario *w;
    world_rank *wr;
    int rank;
    cp_comm *comm;
    cp_context *ctx;
    cp_group *g;
    cp_attn_plan *p;
    cp_attn_desc desc;
    size_t wf, wb;
    void *ws;
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, grad[NGRAD];
    int64_t tokens[S / P], global[S];
} rank_state;

static cp_group_config group_config(const scenario *w)
{
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.timeout_ms = TIMEOUT_MS;
    gc.a2a_size = w->a2a;
    return gc;
}

/* The rank's fixture (the world closes it), then its buffers; a failure
 * is noted with world_fail. */
static cp_status setup_rank(rank_state *r)
{
    scenario *w = r->w;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cp_group_config gc = group_config(w);
    r->desc = cprun_desc(&w->d->sh, CP_DTYPE_F32, CP_FORMAT_BSHD, w->layout, w->mode);
    const fixture_cfg fc = { .context = &cc, .group = &gc, .desc = &r->desc };
    CPI_TRY(fixture_open(r->wr, &fc));
    r->ctx = r->wr->fx.ctx;
    r->g = r->wr->fx.group;
    r->p = r->wr->fx.plan;
    CPI_TRY(world_fail(r->wr, cp_attn_workspace_size(r->p, &r->wf, &r->wb), "cp_attn_workspace_size"));
    const size_t nq = S / P * H * D, nk = S / P * HKV * D;
    float **bufs[] = { &r->q, &r->out, &r->dout, &r->dq, &r->k, &r->v, &r->dk, &r->dv, &r->lse };
    const size_t n[] = { nq, nq, nq, nq, nk, nk, nk, nk, S / P * H };
    for (int i = 0; i < 9; i++)
        if (!(*bufs[i] = calloc(n[i], sizeof(float))))
            return CP_ERROR_OUT_OF_MEMORY;
    const size_t ws = r->wf > r->wb ? r->wf : r->wb;
    r->ws = aligned_alloc(64, (ws + 63) / 64 * 64);
    return r->ws ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
}

static void release(rank_state *r)
{
    float *bufs[] = { r->q, r->out, r->dout, r->dq, r->k, r->v, r->dk, r->dv, r->lse };
    for (int i = 0; i < 9; i++)
        free(bufs[i]);
    free(r->ws);
}

/* The call of a round, with its bad argument on this rank or not. */
static cp_status bad_call(rank_state *r, call c, int bad)
{
    cp_status s = CP_SUCCESS;
    switch (c) {
    case GROUP_STREAMS: {
        cp_group_config gc = group_config(r->w);
        gc.num_streams = bad ? 0 : 1;
        cp_group *g = NULL;
        s = cp_group_create(r->ctx, r->comm, &gc, &g);
        cp_group_destroy(g);
        break;
    }
    case PLAN_HEAD_DIM: {
        cp_attn_desc d = r->desc;
        d.head_dim = bad ? 0 : D;
        cp_attn_plan *p = NULL;
        s = cp_attn_plan_create(r->g, &d, &p);
        cp_attn_plan_destroy(p);
        break;
    }
    case FORWARD_NULL_K:
        s = cp_attn_forward(r->p, r->q, bad ? NULL : r->k, r->v, r->out, r->lse, r->ws, r->wf);
        break;
    case FORWARD_SMALL_WS:
        s = cp_attn_forward(r->p, r->q, r->k, r->v, r->out, r->lse, r->ws, bad ? r->wf - 1 : r->wf);
        break;
    case BACKWARD_NULL_DQ:
        s = cp_attn_backward(r->p, r->q, r->k, r->v, r->out, r->lse, r->dout, bad ? NULL : r->dq, r->dk, r->dv,
                             r->ws, r->wb);
        break;
    case BACKWARD_SMALL_WS:
        s = cp_attn_backward(r->p, r->q, r->k, r->v, r->out, r->lse, r->dout, r->dq, r->dk, r->dv, r->ws,
                             bad ? r->wb / 2 : r->wb);
        break;
    case GATHER_NULL_LOCAL:
        s = cp_layout_gather(r->g, r->w->layout, bad ? NULL : r->tokens, r->global, 1, S, sizeof(int64_t));
        break;
    case LOSS_TOKENS: {
        double mean;
        s = cp_loss_reduce(r->ctx, r->comm, 1.0, bad ? -1 : 4, &mean, NULL);
        break;
    }
    case GRAD_OP:
        s = cp_grad_all_reduce(r->ctx, r->comm, r->grad, NGRAD, CP_DTYPE_F32, bad ? (cp_grad_reduce)5 : CP_GRAD_SUM,
                               16);
        break;
    case SPLIT_NULL_OUT: {
        cp_comm *sub = NULL;
        s = cp_comm_split(r->comm, 0, r->rank, bad ? NULL : &sub);
        cp_comm_destroy(sub);
        break;
    }
    }
    return s;
}

#define NEXT_CHECK(cond, ...)                                                                                \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            snprintf(msg, cap, __VA_ARGS__);                                                                 \
            return CP_ERROR_INTERNAL;                                                                        \
        }                                                                                                    \
    } while (0)

#define NEXT_TRY(what, expr)                                                                                 \
    do {                                                                                                     \
        cp_status next_s_ = (expr);                                                                          \
        if (next_s_ != CP_SUCCESS) {                                                                         \
            snprintf(msg, cap, "%s: %s", what, cp_last_error());                                             \
            return next_s_;                                                                                  \
        }                                                                                                    \
    } while (0)

/* The good calls after a round: the same call without a bad argument
 * anywhere (its result checked where it has one), then a forward and
 * backward on the rank's plan (or on the group or plan just made) into
 * `into`. */
static cp_status next_calls(rank_state *r, call c, cpref_result *into, char *msg, size_t cap)
{
    const cpref_data *d = r->w->d;
    const char *what = "";
    cp_attn_plan *p = r->p;
    cp_group *g = NULL;
    cp_status s = CP_SUCCESS;
    switch (c) {
    case GROUP_STREAMS: {
        cp_group_config gc = group_config(r->w);
        NEXT_TRY("cp_group_create", cp_group_create(r->ctx, r->comm, &gc, &g));
        p = NULL;
        s = cp_attn_plan_create(g, &r->desc, &p);
        if (s == CP_SUCCESS)
            s = cprun_rank(r->ctx, p, d, &r->desc, P, r->rank, 1, into, &what);
        else
            what = "cp_attn_plan_create";
        if (s != CP_SUCCESS)
            snprintf(msg, cap, "%s: %s", what, cp_last_error());
        cp_attn_plan_destroy(p);
        cp_group_destroy(g);
        return s;
    }
    case PLAN_HEAD_DIM:
        p = NULL;
        NEXT_TRY("cp_attn_plan_create", cp_attn_plan_create(r->g, &r->desc, &p));
        s = cprun_rank(r->ctx, p, d, &r->desc, P, r->rank, 1, into, &what);
        if (s != CP_SUCCESS)
            snprintf(msg, cap, "%s: %s", what, cp_last_error());
        cp_attn_plan_destroy(p);
        return s;
    case GATHER_NULL_LOCAL:
        NEXT_TRY("cp_layout_positions", cp_layout_positions(r->w->layout, P, r->rank, S, r->tokens));
        NEXT_TRY("cp_layout_gather",
                 cp_layout_gather(r->g, r->w->layout, r->tokens, r->global, 1, S, sizeof(int64_t)));
        for (int i = 0; i < S; i++)
            NEXT_CHECK(r->global[i] == i, "cp_layout_gather: global[%d] = %lld", i, (long long)r->global[i]);
        break;
    case LOSS_TOKENS: {
        double mean = 0;
        int64_t total = 0;
        NEXT_TRY("cp_loss_reduce", cp_loss_reduce(r->ctx, r->comm, 1.0 + r->rank, 4, &mean, &total));
        NEXT_CHECK(mean == (1.0 + 2 + 3 + 4) / 16 && total == 16, "cp_loss_reduce: mean %g, %lld tokens", mean,
                   (long long)total);
        break;
    }
    case GRAD_OP:
        for (int i = 0; i < NGRAD; i++)
            r->grad[i] = (float)(r->rank + i);
        NEXT_TRY("cp_grad_all_reduce",
                 cp_grad_all_reduce(r->ctx, r->comm, r->grad, NGRAD, CP_DTYPE_F32, CP_GRAD_SUM, 16));
        for (int i = 0; i < NGRAD; i++)
            NEXT_CHECK(r->grad[i] == (float)(4 * i + 6), "cp_grad_all_reduce: grad[%d] = %g", i, r->grad[i]);
        break;
    case SPLIT_NULL_OUT: {
        cp_comm *sub = NULL;
        int size = 0;
        NEXT_TRY("cp_comm_split", cp_comm_split(r->comm, 0, r->rank, &sub));
        cp_comm_size(sub, &size);
        cp_comm_destroy(sub);
        NEXT_CHECK(size == P, "cp_comm_split: a communicator of %d ranks", size);
        break;
    }
    default:
        break;
    }
    s = cprun_rank(r->ctx, p, d, &r->desc, P, r->rank, 0, into, &what);
    if (s != CP_SUCCESS)
        snprintf(msg, cap, "%s: %s", what, cp_last_error());
    return s;
}

static void rank_main(world_rank *wr, void *arg)
{
    scenario *w = arg;
    rank_state r = { .w = w, .wr = wr, .rank = wr->rank, .comm = wr->comm };
    const char *what = "";
    cp_status s = setup_rank(&r);
    if (s == CP_SUCCESS)
        world_fail(wr, cprun_rank(r.ctx, r.p, w->d, &r.desc, P, r.rank, 0, &w->clean, &what), what);
    else
        world_fail(wr, s, "setup");
    /* every rank goes through every round, so none is left waiting */
    for (int i = 0; i < w->nrounds; i++) {
        seen *o = &w->r[i][r.rank];
        pthread_barrier_wait(&w->bar);
        if (world_status(wr->w) != CP_SUCCESS)
            continue;
        /* arrivals in a different order every round */
        sleep_ms(((r.rank + i) % P) * 3);
        o->arrive = now_ms();
        o->s = bad_call(&r, w->rounds[i].c, r.rank == w->rounds[i].bad);
        o->back = now_ms();
        snprintf(o->msg, sizeof o->msg, "%s", o->s == CP_SUCCESS ? "" : cp_last_error());
        o->next = next_calls(&r, w->rounds[i].c, &w->after[i], o->next_msg, sizeof o->next_msg);
    }
    release(&r);
}

static int same(const double *a, const double *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

static void check_round(const scenario *w, int i)
{
    const round *rd = &w->rounds[i];
    const char *name = calls[rd->c].name;
    char names_bad[64];
    snprintf(names_bad, sizeof names_bad, "rank %d of %d rejected its arguments", rd->bad, P);
    double last = 0, back = 0;
    for (int k = 0; k < P; k++) {
        const seen *o = &w->r[i][k];
        if (k == rd->bad) {
            if (o->s != CP_ERROR_INVALID_ARGUMENT || !strstr(o->msg, calls[rd->c].needle))
                fail_msg("%s, %s, bad rank %d: returned %d (%s), expected %d naming \"%s\"", w->name, name, k,
                         (int)o->s, o->msg, CP_ERROR_INVALID_ARGUMENT, calls[rd->c].needle);
        } else if (o->s != CP_ERROR_MISMATCH || !strstr(o->msg, names_bad) || !strstr(o->msg, name)) {
            fail_msg("%s, %s, bad rank %d: rank %d returned %d (%s), expected %d with \"%s: ... %s\"", w->name, name,
                     rd->bad, k, (int)o->s, o->msg, CP_ERROR_MISMATCH, name, names_bad);
        }
        if (o->next != CP_SUCCESS)
            fail_msg("%s, after %s with bad rank %d: rank %d's next calls failed: %s", w->name, name, rd->bad, k,
                     o->next_msg);
        last = o->arrive > last ? o->arrive : last;
        back = o->back > back ? o->back : back;
    }
    if (back - last > BOUND_MS)
        fail_msg("%s, %s, bad rank %d: the last rank returned %.0f ms after the last arrival (bound %.0f ms)",
                 w->name, name, rd->bad, back - last, BOUND_MS);
    const cpref_shape *sh = &w->d->sh;
    const size_t nq = (size_t)(sh->B * sh->S * sh->H * sh->D), nk = (size_t)(sh->B * sh->S * sh->Hkv * sh->D);
    const cpref_result *a = &w->after[i], *c = &w->clean;
    if (!same(a->out, c->out, nq) || !same(a->lse, c->lse, (size_t)(sh->B * sh->H * sh->S)) ||
        !same(a->dq, c->dq, nq) || !same(a->dk, c->dk, nk) || !same(a->dv, c->dv, nk))
        fail_msg("%s, after %s with bad rank %d: forward / backward differ from the clean world's", w->name, name,
                 rd->bad);
}

static cpref_data data;

static int setup(void **state)
{
    (void)state;
    const cpref_shape sh = { 1, S, H, HKV, D, D, 1, 1.0 / 2.8284271247461903 };
    return cpref_make(&data, &sh, CP_DTYPE_F32, 25, 1.0) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    cpref_free(&data);
    return 0;
}

static void run_scenario(scenario *w)
{
    w->d = &data;
    cpref_result_alloc(&w->clean, &data.sh);
    for (int i = 0; i < w->nrounds; i++)
        cpref_result_alloc(&w->after[i], &data.sh);
    pthread_barrier_init(&w->bar, NULL, P);
    cp_comm *comms[P];
    assert_int_equal(cp_comm_create_local(P, comms), CP_SUCCESS);
    faulty_plan pass = { .rank = -1 }; /* passes every call through */
    for (int k = 0; k < P && w->wrapped; k++)
        assert_int_equal(faulty_wrap(&comms[k], &pass), CP_SUCCESS);
    world wo;
    cp_status s = world_run(&wo, P, comms, rank_main, w);
    pthread_barrier_destroy(&w->bar);
    if (s != CP_SUCCESS)
        fail_msg("%s: %s", w->name, wo.error);
    for (int i = 0; i < w->nrounds; i++)
        check_round(w, i);
    cpref_result_free(&w->clean);
    for (int i = 0; i < w->nrounds; i++)
        cpref_result_free(&w->after[i]);
}

/* The rounds of a world, in order (a compound literal and its length). */
#define ROUNDS(...)                                                                                          \
    .rounds = (const round[]){ __VA_ARGS__ }, .nrounds = sizeof((round[]){ __VA_ARGS__ }) / sizeof(round)

/* Every call once or more, bad ranks first, in the middle and last. */
static void test_p2p_every_call(void **state)
{
    (void)state;
    scenario w = { .name = "p2p zigzag",
                   .mode = CP_MODE_P2P,
                   .layout = CP_LAYOUT_ZIGZAG,
                   .a2a = 1,
                   ROUNDS({ GROUP_STREAMS, 1 }, { PLAN_HEAD_DIM, 3 }, { FORWARD_NULL_K, 0 }, { FORWARD_SMALL_WS, 3 },
                          { BACKWARD_NULL_DQ, 2 }, { BACKWARD_SMALL_WS, 0 }, { GATHER_NULL_LOCAL, 3 },
                          { LOSS_TOKENS, 1 }, { GRAD_OP, 0 }, { SPLIT_NULL_OUT, 2 }) };
    run_scenario(&w);
}

/* The other modes: the verdict rides each mode's first exchange. */
static void test_modes(void **state)
{
    (void)state;
    scenario ws[] = {
        { .name = "all_gather zigzag",
          .mode = CP_MODE_ALL_GATHER,
          .layout = CP_LAYOUT_ZIGZAG,
          .a2a = 1,
          ROUNDS({ FORWARD_NULL_K, 3 }, { BACKWARD_SMALL_WS, 1 }, { GATHER_NULL_LOCAL, 2 }) },
        { .name = "a2a contiguous",
          .mode = CP_MODE_A2A,
          .layout = CP_LAYOUT_CONTIGUOUS,
          .a2a = 1,
          ROUNDS({ FORWARD_SMALL_WS, 1 }, { BACKWARD_NULL_DQ, 3 }) },
        /* a2a sub-groups {0, 1} and {2, 3}: the ranks of the other sub-group
         * learn of the bad rank only at the ring's first exchange */
        { .name = "a2a_p2p zigzag",
          .mode = CP_MODE_A2A_P2P,
          .layout = CP_LAYOUT_ZIGZAG,
          .a2a = 2,
          ROUNDS({ FORWARD_NULL_K, 1 }, { FORWARD_SMALL_WS, 2 }, { BACKWARD_NULL_DQ, 3 },
                 { BACKWARD_SMALL_WS, 0 }) },
    };
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        run_scenario(&ws[i]);
}

/* A transport the core cannot fold the verdict into: the ranks vote. */
static void test_voted(void **state)
{
    (void)state;
    scenario ws[] = {
        { .name = "p2p contiguous, wrapped",
          .mode = CP_MODE_P2P,
          .layout = CP_LAYOUT_CONTIGUOUS,
          .a2a = 1,
          .wrapped = 1,
          ROUNDS({ GROUP_STREAMS, 0 }, { FORWARD_NULL_K, 2 }, { BACKWARD_SMALL_WS, 1 }, { GATHER_NULL_LOCAL, 0 },
                 { SPLIT_NULL_OUT, 3 }) },
        { .name = "a2a_p2p contiguous, wrapped",
          .mode = CP_MODE_A2A_P2P,
          .layout = CP_LAYOUT_CONTIGUOUS,
          .a2a = 2,
          .wrapped = 1,
          ROUNDS({ FORWARD_SMALL_WS, 3 }, { PLAN_HEAD_DIM, 1 }) },
    };
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        run_scenario(&ws[i]);
}

/* ---- the plan's own workspace ------------------------------------------- */

/* A CPU backend that records the sizes it allocates. */
static const cp_backend_ops *cpu_ops;
static size_t allocs[8];
static int nalloc, nfree;

static cp_status counting_alloc(void *state, size_t bytes, void **ptr)
{
    if (nalloc < 8)
        allocs[nalloc] = bytes;
    nalloc++;
    return cpu_ops->alloc(state, bytes, ptr);
}

static void counting_free(void *state, void *ptr)
{
    nfree += ptr != NULL;
    cpu_ops->free(state, ptr);
}

static void test_own_workspace(void **state)
{
    (void)state;
    cp_comm *comm;
    cp_context *ctx;
    cp_group *g;
    cp_attn_plan *p;
    assert_int_equal(cp_comm_create_local(1, &comm), CP_SUCCESS);
    assert_int_equal(cp_context_create(NULL, &ctx), CP_SUCCESS);
    static cp_backend_ops counting;
    cpu_ops = ctx->ops;
    counting = *cpu_ops;
    counting.alloc = counting_alloc;
    counting.free = counting_free;
    ctx->ops = &counting;
    assert_int_equal(cp_group_create(ctx, comm, NULL, &g), CP_SUCCESS);
    cp_attn_desc d = cprun_desc(&data.sh, CP_DTYPE_F32, CP_FORMAT_BSHD, CP_LAYOUT_CONTIGUOUS, CP_MODE_P2P);
    assert_int_equal(cp_attn_plan_create(g, &d, &p), CP_SUCCESS);
    size_t wf, wb;
    assert_int_equal(cp_attn_workspace_size(p, &wf, &wb), CP_SUCCESS);
    assert_true(wb > wf);

    const size_t nq = S * H * D, nk = S * HKV * D;
    float *q = calloc(nq, 4), *k = calloc(nk, 4), *v = calloc(nk, 4), *o = calloc(nq, 4), *lse = calloc(S * H, 4),
          *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4);
    nalloc = nfree = 0;
    /* a forward takes what the forward needs, and keeps it */
    assert_int_equal(cp_attn_forward(p, q, k, v, o, lse, NULL, 0), CP_SUCCESS);
    assert_int_equal(cp_attn_forward(p, q, k, v, o, lse, NULL, 0), CP_SUCCESS);
    assert_int_equal(nalloc, 1);
    assert_int_equal(allocs[0], wf);
    /* the first backward grows it once; later forwards use it as it is */
    assert_int_equal(cp_attn_backward(p, q, k, v, o, lse, o, dq, dk, dv, NULL, 0), CP_SUCCESS);
    assert_int_equal(cp_attn_backward(p, q, k, v, o, lse, o, dq, dk, dv, NULL, 0), CP_SUCCESS);
    assert_int_equal(cp_attn_forward(p, q, k, v, o, lse, NULL, 0), CP_SUCCESS);
    assert_int_equal(nalloc, 2);
    assert_int_equal(allocs[1], wb);
    assert_int_equal(nfree, 1);
    cp_attn_plan_destroy(p);
    assert_int_equal(nfree, 2);

    free(q), free(k), free(v), free(o), free(lse), free(dq), free(dk), free(dv);
    cp_group_destroy(g);
    cp_context_destroy(ctx);
    cp_comm_destroy(comm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_p2p_every_call),
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_voted),
        cmocka_unit_test(test_own_workspace),
    };
    return cmocka_run_group_tests_name("agree", tests, setup, teardown);
}
