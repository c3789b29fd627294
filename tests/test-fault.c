/* SPDX-License-Identifier: MIT */
/*
 * Faults on the local transport: one rank of a CP group of 4 stops in the
 * middle of a CP attention (it stalls in a transport call, or its thread
 * exits from inside one), in every mode. The other ranks must return
 * CP_ERROR_TIMEOUT or CP_ERROR_COMM within the group's timeout and free all
 * they hold (the suite runs under ASan and valgrind), and afterwards a new
 * world, group and plan must work in the same process.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "faulty.h"
#include "testutil.h"
#include "world.h"

enum { P = 4, S = 32, H = 4, HKV = 2, D = 8, VICTIM = 2 };

/* Short, so the suite is quick; the slack covers a slow (valgrind) run. */
#define TIMEOUT_MS 400
#define SLACK_MS 5000

/* The whole sequence, every rank reads its share (contiguous layout, batch 1:
 * rank r's tokens are rows [r*S/P, (r+1)*S/P)). */
static float gq[S * H * D], gk[S * HKV * D], gv[S * HKV * D], gdo[S * H * D];

static void fill_inputs(void)
{
    float *all[] = { gq, gk, gv, gdo };
    const size_t n[] = { S * H * D, S * HKV * D, S * HKV * D, S * H * D };
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < n[t]; i++)
            all[t][i] = (float)(((i + 7 * (size_t)t) * 2654435761u) % 1000) / 1000.0f - 0.5f;
}

/* What one rank holds (its fixture is its world's) and what became of it. */
typedef struct rank_state {
    float *out, *lse, *dq, *dk, *dv;
    cp_status fwd, bwd;
    double fwd_ms, bwd_ms;
    char error[512];
} rank_state;

typedef struct scenario {
    cp_mode mode;
    faulty_how how;
    int backward; /* stop in the backward (the forward completes) */
    int after;    /* transport calls the victim completes first */
    const char *in; /* the call it stops in */
    faulty_plan plan;
    rank_state r[P];
    world w;
} scenario;

static void free_bufs(rank_state *r)
{
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    r->out = r->lse = r->dq = r->dk = r->dv = NULL;
}

/* Plan a CP attention of the shared inputs on this rank's communicator. */
static cp_status setup_rank(world_rank *wr, rank_state *r, cp_mode mode, int timeout_ms)
{
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.timeout_ms = timeout_ms;
    gc.a2a_size = mode == CP_MODE_A2A_P2P && wr->size % 2 == 0 ? 2 : 1;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = 1;
    d.seq_len = S;
    d.num_heads = H;
    d.num_kv_heads = HKV;
    d.head_dim = D;
    d.mode = mode;
    const fixture_cfg fc = { .context = &cc, .group = &gc, .desc = &d };
    CPI_TRY(fixture_open(wr, &fc));
    const size_t n = (size_t)(S / wr->size);
    r->out = calloc(n * H * D, sizeof(float));
    r->lse = calloc(n * H, sizeof(float));
    r->dq = calloc(n * H * D, sizeof(float));
    r->dk = calloc(n * HKV * D, sizeof(float));
    r->dv = calloc(n * HKV * D, sizeof(float));
    return r->out && r->lse && r->dq && r->dk && r->dv ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
}

static cp_status forward(world_rank *wr, rank_state *r)
{
    const size_t row = (size_t)(S / wr->size) * (size_t)wr->rank;
    return cp_attn_forward(wr->fx.plan, gq + row * H * D, gk + row * HKV * D, gv + row * HKV * D, r->out, r->lse,
                           NULL, 0);
}

static cp_status backward(world_rank *wr, rank_state *r)
{
    const size_t row = (size_t)(S / wr->size) * (size_t)wr->rank;
    return cp_attn_backward(wr->fx.plan, gq + row * H * D, gk + row * HKV * D, gv + row * HKV * D, r->out, r->lse,
                            gdo + row * H * D, r->dq, r->dk, r->dv, NULL, 0);
}

static void fault_rank(world_rank *wr, void *arg)
{
    scenario *sc = arg;
    rank_state *r = &sc->r[wr->rank];
    const int victim = wr->rank == VICTIM;
    /* setting up has all the time it needs; the fault comes later */
    cp_status s = setup_rank(wr, r, sc->mode, TIMEOUT_MS);
    if (s != CP_SUCCESS) {
        snprintf(r->error, sizeof r->error, "setup: %s", cp_last_error());
        r->fwd = s;
        return;
    }
    if (victim && !sc->backward)
        faulty_arm(&sc->plan);
    double t0 = now_ms();
    r->fwd = forward(wr, r);
    r->fwd_ms = now_ms() - t0;
    snprintf(r->error, sizeof r->error, "%s", cp_last_error());
    if (sc->backward && r->fwd == CP_SUCCESS) {
        if (victim)
            faulty_arm(&sc->plan);
        t0 = now_ms();
        r->bwd = backward(wr, r);
        r->bwd_ms = now_ms() - t0;
        snprintf(r->error, sizeof r->error, "%s", cp_last_error());
    }
}

static const char *mode_names[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };
static const char *how_names[] = { "stalls", "exits its thread" };

static void run_scenario(scenario *sc)
{
    cp_comm *comms[P];
    assert_int_equal(cp_comm_create_local(P, comms), CP_SUCCESS);
    sc->plan.rank = VICTIM;
    sc->plan.after = sc->after;
    sc->plan.how = sc->how;
    for (int i = 0; i < P; i++)
        assert_int_equal(faulty_wrap(&comms[i], &sc->plan), CP_SUCCESS);
    assert_int_equal(world_start(&sc->w, P, comms, fault_rank, sc), CP_SUCCESS);
    /* a stalled victim is let go only after the others gave up on it (and
     * freed what they hold) */
    if (sc->how == FAULTY_STALL) {
        double t0 = now_ms();
        while (atomic_load(&sc->w.returned) < P - 1 && now_ms() - t0 < 60000)
            sleep_ms(2);
        faulty_release(&sc->plan);
    }
    /* a thread that exited left its fixture behind: the world frees it */
    world_join(&sc->w);
    for (int i = 0; i < P; i++)
        free_bufs(&sc->r[i]);

    const char *where = sc->backward ? "backward" : "forward";
    if (!atomic_load(&sc->plan.stopped))
        fail_msg("%s %s: the victim never reached transport call %d", mode_names[sc->mode], where, sc->after);
    if (strcmp(sc->plan.stopped_in, sc->in) != 0)
        fail_msg("%s %s: the victim stopped at transport call %d in %s, not in %s: the calls before it changed",
                 mode_names[sc->mode], where, sc->after, sc->plan.stopped_in, sc->in);
    for (int i = 0; i < P; i++) {
        const rank_state *r = &sc->r[i];
        cp_status s = sc->backward ? r->bwd : r->fwd;
        double ms = sc->backward ? r->bwd_ms : r->fwd_ms;
        if (sc->backward && r->fwd != CP_SUCCESS)
            fail_msg("%s: rank %d failed the forward: %s", mode_names[sc->mode], i, r->error);
        if (i == VICTIM) {
            if (sc->how == FAULTY_STALL && s != CP_ERROR_COMM)
                fail_msg("%s %s: the stalled rank returned %d (%s)", mode_names[sc->mode], where, (int)s, r->error);
            continue;
        }
        if (s != CP_ERROR_TIMEOUT && s != CP_ERROR_COMM)
            fail_msg("%s %s, rank %d %s: rank %d returned %d (%s), expected a timeout or comm error",
                     mode_names[sc->mode], where, VICTIM, how_names[sc->how], i, (int)s, r->error);
        if (!r->error[0] || ms > TIMEOUT_MS + SLACK_MS)
            fail_msg("%s %s: rank %d took %.0f ms (timeout %d ms): %s", mode_names[sc->mode], where, i, ms,
                     TIMEOUT_MS, r->error);
        if (s == CP_ERROR_TIMEOUT && !strstr(r->error, "timed out after 400 ms"))
            fail_msg("rank %d: message does not say what timed out: %s", i, r->error);
    }
}

/*
 * Where the victim stops: `after` counts the transport calls it completes
 * first. On a wrapped transport (the faulty one here) the forward and the
 * backward begin with the agreement's vote, one all_reduce (call 0).
 */
static void test_stop_mid_forward(void **state)
{
    (void)state;
    const struct {
        cp_mode mode;
        int after;
        const char *in;
    } cases[] = {
        /* in the vote, before any exchange of the forward */
        { CP_MODE_P2P, 0, "all_reduce" },
        /* the ring's first step shifts K and V (calls 1 and 2): at the
         * second step's shift */
        { CP_MODE_P2P, 3, "sendrecv" },
        /* the others after their first exchange: all_gather after K, at V;
         * a2a after Q, at K; a2a_p2p after the a2a of Q, K and V, at the
         * ring's first shift */
        { CP_MODE_ALL_GATHER, 2, "all_gather" },
        { CP_MODE_A2A, 2, "all_to_all" },
        { CP_MODE_A2A_P2P, 4, "sendrecv" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int how = FAULTY_STALL; how <= FAULTY_EXIT_THREAD; how++) {
            scenario *sc = calloc(1, sizeof *sc);
            assert_non_null(sc);
            sc->mode = cases[c].mode;
            sc->after = cases[c].after;
            sc->in = cases[c].in;
            sc->how = (faulty_how)how;
            run_scenario(sc);
            free(sc);
        }
}

static void test_stop_mid_backward(void **state)
{
    (void)state;
    for (int how = FAULTY_STALL; how <= FAULTY_EXIT_THREAD; how++) {
        scenario *sc = calloc(1, sizeof *sc);
        assert_non_null(sc);
        sc->mode = CP_MODE_P2P;
        /* the vote, the first K and V, the next K and V while the first
         * step computes, then the third shift: dK of the first step */
        sc->after = 5;
        sc->in = "sendrecv";
        sc->how = (faulty_how)how;
        sc->backward = 1;
        run_scenario(sc);
        free(sc);
    }
}

/* ---- afterwards: a healthy world computes what one rank computes ---------- */

typedef struct healthy_job {
    rank_state r[P];
    float *out_all; /* where each rank's output rows go */
} healthy_job;

static void healthy_rank(world_rank *wr, void *arg)
{
    healthy_job *j = arg;
    rank_state *r = &j->r[wr->rank];
    cp_status s = setup_rank(wr, r, CP_MODE_P2P, 60000);
    if (s != CP_SUCCESS)
        world_fail(wr, s, "setup");
    else if (world_fail(wr, forward(wr, r), "cp_attn_forward") == CP_SUCCESS)
        memcpy(j->out_all + (size_t)(S / wr->size) * wr->rank * H * D, r->out,
               (size_t)(S / wr->size) * H * D * sizeof(float));
    free_bufs(r);
}

static void run_healthy(int n, float *out)
{
    healthy_job j = { .out_all = out };
    world w;
    if (world_run(&w, n, NULL, healthy_rank, &j) != CP_SUCCESS)
        fail_msg("healthy world of %d, %s", n, w.error);
}

static void test_new_world_afterwards(void **state)
{
    (void)state;
    static float one[S * H * D], four[S * H * D];
    run_healthy(1, one);
    run_healthy(P, four);
    for (size_t i = 0; i < S * H * D; i++)
        if (!(fabsf(one[i] - four[i]) <= 1e-5f))
            fail_msg("out[%zu]: %g with 4 ranks, %g with one", i, four[i], one[i]);
}

int main(void)
{
    fill_inputs();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_mid_forward),
        cmocka_unit_test(test_stop_mid_backward),
        cmocka_unit_test(test_new_world_afterwards),
    };
    return cmocka_run_group_tests_name("fault", tests, NULL, NULL);
}
