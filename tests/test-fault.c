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
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "faulty.h"
#include "testutil.h"

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

/* What one rank holds and what became of it. */
typedef struct rank_state {
    int rank, size;
    cp_comm *comm;
    cp_context *ctx;
    cp_group *group;
    cp_attn_plan *plan;
    float *out, *lse, *dq, *dk, *dv;
    cp_status fwd, bwd;
    double fwd_ms, bwd_ms;
    char error[512];
    int done; /* returned from the run, resources freed */
} rank_state;

typedef struct scenario {
    cp_mode mode;
    faulty_how how;
    int backward; /* stop in the backward (the forward completes) */
    int after;    /* transport calls the victim completes first */
    faulty_plan plan;
    rank_state r[P];
    atomic_int finished; /* ranks other than the victim that returned */
} scenario;

static void release(rank_state *r)
{
    cp_attn_plan_destroy(r->plan);
    cp_group_destroy(r->group);
    cp_context_destroy(r->ctx);
    cp_comm_destroy(r->comm);
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    r->plan = NULL, r->group = NULL, r->ctx = NULL, r->comm = NULL;
    r->out = r->lse = r->dq = r->dk = r->dv = NULL;
}

/* Plan a CP attention of the shared inputs on this rank's communicator. */
static cp_status setup_rank(rank_state *r, cp_mode mode, int timeout_ms)
{
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.timeout_ms = timeout_ms;
    gc.a2a_size = mode == CP_MODE_A2A_P2P && r->size % 2 == 0 ? 2 : 1;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = 1;
    d.seq_len = S;
    d.num_heads = H;
    d.num_kv_heads = HKV;
    d.head_dim = D;
    d.mode = mode;
    CPI_TRY(cp_context_create(&cc, &r->ctx));
    CPI_TRY(cp_group_create(r->ctx, r->comm, &gc, &r->group));
    CPI_TRY(cp_attn_plan_create(r->group, &d, &r->plan));
    const size_t n = (size_t)(S / r->size);
    r->out = calloc(n * H * D, sizeof(float));
    r->lse = calloc(n * H, sizeof(float));
    r->dq = calloc(n * H * D, sizeof(float));
    r->dk = calloc(n * HKV * D, sizeof(float));
    r->dv = calloc(n * HKV * D, sizeof(float));
    return r->out && r->lse && r->dq && r->dk && r->dv ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
}

static cp_status forward(rank_state *r)
{
    const size_t row = (size_t)(S / r->size) * (size_t)r->rank;
    return cp_attn_forward(r->plan, gq + row * H * D, gk + row * HKV * D, gv + row * HKV * D, r->out, r->lse,
                           NULL, 0);
}

static cp_status backward(rank_state *r)
{
    const size_t row = (size_t)(S / r->size) * (size_t)r->rank;
    return cp_attn_backward(r->plan, gq + row * H * D, gk + row * HKV * D, gv + row * HKV * D, r->out, r->lse,
                            gdo + row * H * D, r->dq, r->dk, r->dv, NULL, 0);
}

typedef struct rank_job {
    scenario *sc;
    rank_state *r;
} rank_job;

static void *fault_rank(void *p)
{
    rank_job *j = p;
    scenario *sc = j->sc;
    rank_state *r = j->r;
    const int victim = r->rank == VICTIM;
    /* setting up has all the time it needs; the fault comes later */
    cp_status s = setup_rank(r, sc->mode, TIMEOUT_MS);
    if (s != CP_SUCCESS) {
        snprintf(r->error, sizeof r->error, "setup: %s", cp_last_error());
        r->fwd = s;
    } else {
        if (victim && !sc->backward)
            faulty_arm(&sc->plan);
        double t0 = now_ms();
        r->fwd = forward(r);
        r->fwd_ms = now_ms() - t0;
        snprintf(r->error, sizeof r->error, "%s", cp_last_error());
        if (sc->backward && r->fwd == CP_SUCCESS) {
            if (victim)
                faulty_arm(&sc->plan);
            t0 = now_ms();
            r->bwd = backward(r);
            r->bwd_ms = now_ms() - t0;
            snprintf(r->error, sizeof r->error, "%s", cp_last_error());
        }
    }
    release(r);
    r->done = 1;
    if (!victim)
        atomic_fetch_add(&sc->finished, 1);
    return NULL;
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
    pthread_t th[P];
    rank_job jobs[P];
    for (int i = 0; i < P; i++) {
        assert_int_equal(faulty_wrap(&comms[i], &sc->plan), CP_SUCCESS);
        sc->r[i] = (rank_state){ .rank = i, .size = P, .comm = comms[i] };
        jobs[i] = (rank_job){ sc, &sc->r[i] };
        assert_int_equal(pthread_create(&th[i], NULL, fault_rank, &jobs[i]), 0);
    }
    /* a stalled victim is let go only after the others gave up on it */
    if (sc->how == FAULTY_STALL) {
        double t0 = now_ms();
        while (atomic_load(&sc->finished) < P - 1 && now_ms() - t0 < 60000)
            sleep_ms(2);
        faulty_release(&sc->plan);
    }
    for (int i = 0; i < P; i++)
        pthread_join(th[i], NULL);
    /* a thread that exited left its resources behind: its owner frees them */
    if (!sc->r[VICTIM].done)
        release(&sc->r[VICTIM]);

    const char *where = sc->backward ? "backward" : "forward";
    if (!atomic_load(&sc->plan.stopped))
        fail_msg("%s %s: the victim never reached transport call %d", mode_names[sc->mode], where, sc->after);
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

static void test_stop_mid_forward(void **state)
{
    (void)state;
    /* after: in p2p the ring's first step shifts K and V, so 2 stops it at
     * the second step; the others stop after their first exchange */
    const struct {
        cp_mode mode;
        int after;
    } cases[] = { { CP_MODE_P2P, 2 }, { CP_MODE_P2P, 0 }, { CP_MODE_ALL_GATHER, 1 }, { CP_MODE_A2A, 1 },
                  { CP_MODE_A2A_P2P, 3 } };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int how = FAULTY_STALL; how <= FAULTY_EXIT_THREAD; how++) {
            scenario *sc = calloc(1, sizeof *sc);
            assert_non_null(sc);
            sc->mode = cases[c].mode;
            sc->after = cases[c].after;
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
        sc->after = 5; /* the backward's third shift: dK of the first step */
        sc->how = (faulty_how)how;
        sc->backward = 1;
        run_scenario(sc);
        free(sc);
    }
}

/* ---- afterwards: a healthy world computes what one rank computes ---------- */

typedef struct healthy_job {
    rank_state r;
    cp_status status;
    char error[512];
    float *out_all; /* where this rank's output rows go */
} healthy_job;

static void *healthy_rank(void *p)
{
    healthy_job *j = p;
    rank_state *r = &j->r;
    j->status = setup_rank(r, CP_MODE_P2P, 60000);
    if (j->status == CP_SUCCESS)
        j->status = forward(r);
    if (j->status == CP_SUCCESS)
        memcpy(j->out_all + (size_t)(S / r->size) * r->rank * H * D, r->out, (size_t)(S / r->size) * H * D * sizeof(float));
    else
        snprintf(j->error, sizeof j->error, "%s", cp_last_error());
    release(r);
    return NULL;
}

static void run_healthy(int n, float *out)
{
    cp_comm *comms[P];
    assert_int_equal(cp_comm_create_local(n, comms), CP_SUCCESS);
    healthy_job jobs[P];
    pthread_t th[P];
    for (int i = 0; i < n; i++) {
        jobs[i] = (healthy_job){ .r = { .rank = i, .size = n, .comm = comms[i] }, .out_all = out };
        assert_int_equal(pthread_create(&th[i], NULL, healthy_rank, &jobs[i]), 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++)
        if (jobs[i].status != CP_SUCCESS)
            fail_msg("healthy world of %d, rank %d: %s", n, i, jobs[i].error);
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
