/* SPDX-License-Identifier: MIT */
/*
 * Thread safety: 8 CP attention jobs, each with its own local world,
 * contexts, groups and plans (modes, dtypes, layouts, formats and group
 * sizes all differ), run forward and backward at the same time - one thread
 * per rank, 20 in all - and must give bit for bit what the same jobs give
 * when they run one after another.
 *
 * fork: a child of a process that holds a multi-threaded CPU context can
 * still use it (on one thread) and destroy it, with the parent's results.
 */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
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
#include "world.h"

enum { JOBS = 8, MAX_P = 4, B = 2, S = 32, H = 4, HKV = 2, D = 16 };

typedef struct job_cfg {
    cp_mode mode;
    cp_dtype dtype;
    cp_format format;
    cp_layout layout;
    cp_mask mask;
    int P, a2a, threads; /* ranks, a2a size, CPU threads of each context */
} job_cfg;

static const job_cfg jobs[JOBS] = {
    { CP_MODE_P2P, CP_DTYPE_F32, CP_FORMAT_BSHD, CP_LAYOUT_CONTIGUOUS, CP_MASK_CAUSAL, 2, 1, 2 },
    { CP_MODE_ALL_GATHER, CP_DTYPE_BF16, CP_FORMAT_SBHD, CP_LAYOUT_ZIGZAG, CP_MASK_CAUSAL, 2, 1, 1 },
    { CP_MODE_A2A, CP_DTYPE_F16, CP_FORMAT_BSHD, CP_LAYOUT_CONTIGUOUS, CP_MASK_NONE, 2, 1, 2 },
    { CP_MODE_A2A_P2P, CP_DTYPE_F32, CP_FORMAT_BSHD, CP_LAYOUT_ZIGZAG, CP_MASK_CAUSAL, 4, 2, 1 },
    { CP_MODE_P2P, CP_DTYPE_BF16, CP_FORMAT_BSHD, CP_LAYOUT_ZIGZAG, CP_MASK_CAUSAL, 4, 1, 2 },
    { CP_MODE_ALL_GATHER, CP_DTYPE_F32, CP_FORMAT_SBHD, CP_LAYOUT_CONTIGUOUS, CP_MASK_NONE, 1, 1, 1 },
    { CP_MODE_A2A, CP_DTYPE_F32, CP_FORMAT_SBHD, CP_LAYOUT_ZIGZAG, CP_MASK_CAUSAL, 4, 1, 2 },
    { CP_MODE_P2P, CP_DTYPE_F16, CP_FORMAT_BSHD, CP_LAYOUT_CONTIGUOUS, CP_MASK_CAUSAL, 1, 1, 1 },
};

/* One rank's tensors: inputs q, k, v, dout; results out, lse, dq, dk, dv. */
typedef struct tensors {
    void *q, *k, *v, *dout, *out, *dq, *dk, *dv;
    float *lse;
    size_t nq, nk, es; /* elements of q-like and k-like tensors, element size */
} tensors;

/* Deterministic values of the job's dtype in [-2, 2], different per job,
 * rank and tensor: BF16 as the top half of an F32, F16 built from bits. */
static void fill(void *p, size_t n, cp_dtype t, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        uint32_t r = x >> 8;
        if (t == CP_DTYPE_F32) {
            float f = (float)(r % 4001) / 1000.0f - 2.0f;
            memcpy((char *)p + 4 * i, &f, 4);
        } else if (t == CP_DTYPE_BF16) {
            float f = (float)(r % 4001) / 1000.0f - 2.0f;
            uint32_t u;
            memcpy(&u, &f, 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy((char *)p + 2 * i, &h, 2);
        } else { /* sign, exponent 11..15 (2^-4 .. 2), mantissa */
            uint16_t h = (uint16_t)(((r & 1) << 15) | ((11 + (r >> 1) % 5) << 10) | ((r >> 4) & 0x3ff));
            memcpy((char *)p + 2 * i, &h, 2);
        }
    }
}

static void tensors_alloc(tensors *t, const job_cfg *c, int job, int rank)
{
    t->es = c->dtype == CP_DTYPE_F32 ? 4 : 2;
    const size_t tok = (size_t)(B * S / c->P);
    t->nq = tok * H * D;
    t->nk = tok * HKV * D;
    void **q_like[] = { &t->q, &t->dout, &t->out, &t->dq }, **k_like[] = { &t->k, &t->v, &t->dk, &t->dv };
    for (int i = 0; i < 4; i++) {
        *q_like[i] = calloc(t->nq, t->es);
        *k_like[i] = calloc(t->nk, t->es);
        assert_true(*q_like[i] && *k_like[i]);
    }
    t->lse = calloc(tok * H, sizeof *t->lse);
    assert_non_null(t->lse);
    const uint32_t seed = (uint32_t)(job * 64 + rank * 4);
    fill(t->q, t->nq, c->dtype, seed);
    fill(t->k, t->nk, c->dtype, seed + 1);
    fill(t->v, t->nk, c->dtype, seed + 2);
    fill(t->dout, t->nq, c->dtype, seed + 3);
}

static void tensors_free(tensors *t)
{
    void *all[] = { t->q, t->k, t->v, t->dout, t->out, t->dq, t->dk, t->dv, t->lse };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* One job: its config and each rank's tensors. */
typedef struct job_run {
    const job_cfg *cfg;
    tensors t[MAX_P];
} job_run;

/* One rank of one job: its own context, group and plan, forward and backward. */
static void rank_main(world_rank *wr, void *arg)
{
    const job_run *job = arg;
    const job_cfg *c = job->cfg;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = c->threads;
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.a2a_size = c->a2a;
    gc.timeout_ms = 120000;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.dtype = c->dtype;
    d.format = c->format;
    d.batch = B;
    d.seq_len = S;
    d.num_heads = H;
    d.num_kv_heads = HKV;
    d.head_dim = D;
    d.mask = c->mask;
    d.layout = c->layout;
    d.mode = c->mode;
    const tensors *t = &job->t[wr->rank];
    const fixture_cfg fc = { .context = &cc, .group = &gc, .desc = &d };
    if (fixture_open(wr, &fc) != CP_SUCCESS ||
        world_fail(wr, cp_attn_forward(wr->fx.plan, t->q, t->k, t->v, t->out, t->lse, NULL, 0), "cp_attn_forward"))
        return;
    world_fail(wr,
               cp_attn_backward(wr->fx.plan, t->q, t->k, t->v, t->out, t->lse, t->dout, t->dq, t->dk, t->dv, NULL, 0),
               "cp_attn_backward");
}

typedef struct runs {
    job_run job[JOBS];
    world w[JOBS];
} runs;

static void prepare(runs *all)
{
    for (int j = 0; j < JOBS; j++) {
        all->job[j].cfg = &jobs[j];
        for (int i = 0; i < jobs[j].P; i++)
            tensors_alloc(&all->job[j].t[i], &jobs[j], j, i);
    }
}

/* Start the ranks of jobs [first, last), wait for them all, then fail on
 * the first job that failed. */
static void run_jobs(runs *all, int first, int last)
{
    cp_status s[JOBS];
    for (int j = first; j < last; j++)
        s[j] = world_start(&all->w[j], jobs[j].P, NULL, rank_main, &all->job[j]);
    for (int j = first; j < last; j++)
        if (s[j] == CP_SUCCESS)
            s[j] = world_join(&all->w[j]);
    for (int j = first; j < last; j++)
        if (s[j] != CP_SUCCESS)
            fail_msg("job %d: %s", j, all->w[j].error);
}

static void test_concurrent_equals_serial(void **state)
{
    (void)state;
    runs *serial = calloc(1, sizeof *serial), *together = calloc(1, sizeof *together);
    assert_true(serial && together);
    prepare(serial);
    prepare(together);
    for (int j = 0; j < JOBS; j++)
        run_jobs(serial, j, j + 1);
    run_jobs(together, 0, JOBS);
    for (int j = 0; j < JOBS; j++)
        for (int i = 0; i < jobs[j].P; i++) {
            const tensors *a = &serial->job[j].t[i], *b = &together->job[j].t[i];
            const struct {
                const char *name;
                const void *x, *y;
                size_t bytes;
            } results[] = {
                { "out", a->out, b->out, a->nq * a->es }, { "lse", a->lse, b->lse, a->nq / D * sizeof(float) },
                { "dq", a->dq, b->dq, a->nq * a->es },    { "dk", a->dk, b->dk, a->nk * a->es },
                { "dv", a->dv, b->dv, a->nk * a->es },
            };
            for (size_t k = 0; k < sizeof results / sizeof results[0]; k++) {
                const unsigned char *x = results[k].x;
                size_t nonzero = 0;
                for (size_t n = 0; n < results[k].bytes; n++)
                    nonzero += x[n] != 0;
                if (nonzero < results[k].bytes / 4) /* a result, not an untouched buffer */
                    fail_msg("job %d rank %d: %s is mostly zero", j, i, results[k].name);
                if (memcmp(results[k].x, results[k].y, results[k].bytes))
                    fail_msg("job %d rank %d: %s differs between the serial and the concurrent run", j, i,
                             results[k].name);
            }
            tensors_free(&serial->job[j].t[i]);
            tensors_free(&together->job[j].t[i]);
        }
    free(serial);
    free(together);
}

/* Forward + backward of one F32 block on ctx into the buffers of r. */
typedef struct fork_bufs {
    float q[B * S * H * D], k[B * S * HKV * D], v[B * S * HKV * D], dout[B * S * H * D];
    float out[B * S * H * D], lse[B * H * S], dq[B * S * H * D], dk[B * S * HKV * D], dv[B * S * HKV * D];
} fork_bufs;

static cp_status fork_run(cp_context *ctx, fork_bufs *r)
{
    /* the gradient buffers join only for the backward: the forward gets none */
    cp_kernel_attn_args a =
        f32_kernel_attn_args(B, H, HKV, D, S, S, r->q, r->k, r->v, r->out, r->lse, NULL, NULL, NULL, NULL);
    cp_status s = cp_kernel_attn_forward(ctx, &a);
    if (s != CP_SUCCESS)
        return s;
    a.dout = r->dout;
    a.dq = r->dq;
    a.dk = r->dk;
    a.dv = r->dv;
    return cp_kernel_attn_backward(ctx, &a);
}

static void test_fork_child_uses_context(void **state)
{
    (void)state;
    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.num_threads = 4;
    cp_context *ctx = NULL;
    assert_int_equal(cp_context_create(&cfg, &ctx), CP_SUCCESS);
    fork_bufs *parent = calloc(1, sizeof *parent), *child = calloc(1, sizeof *child);
    assert_true(parent && child);
    fill(parent->q, sizeof parent->q / sizeof(float), CP_DTYPE_F32, 1);
    fill(parent->k, sizeof parent->k / sizeof(float), CP_DTYPE_F32, 2);
    fill(parent->v, sizeof parent->v / sizeof(float), CP_DTYPE_F32, 3);
    fill(parent->dout, sizeof parent->dout / sizeof(float), CP_DTYPE_F32, 4);
    memcpy(child, parent, sizeof *child);
    assert_int_equal(fork_run(ctx, parent), CP_SUCCESS);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the workers stayed in the parent: this must neither hang nor differ */
        int bad = fork_run(ctx, child) != CP_SUCCESS || memcmp(child->out, parent->out, sizeof child->out) ||
                  memcmp(child->lse, parent->lse, sizeof child->lse) ||
                  memcmp(child->dq, parent->dq, sizeof child->dq) ||
                  memcmp(child->dk, parent->dk, sizeof child->dk) || memcmp(child->dv, parent->dv, sizeof child->dv);
        cp_context_destroy(ctx);
        free(parent); /* the child leaves nothing behind for leak checkers either */
        free(child);
        _exit(bad ? 1 : 0);
    }
    /* wait at most 60 s (valgrind is slow), then call it a hang */
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < 6000 && (got = waitpid(pid, &status, WNOHANG)) == 0; i++)
        nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("the forked child hung using its parent's context");
    }
    assert_int_equal(got, pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* and the parent's pool still works */
    memcpy(child, parent, sizeof *child);
    assert_int_equal(fork_run(ctx, child), CP_SUCCESS);
    assert_memory_equal(child->dq, parent->dq, sizeof child->dq);
    cp_context_destroy(ctx);
    free(parent);
    free(child);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_equals_serial),
        cmocka_unit_test(test_fork_child_uses_context),
    };
    return cmocka_run_group_tests_name("threads", tests, NULL, NULL);
}
