/* SPDX-License-Identifier: MIT */
/*
 * The demo: CP attention across in-process ranks on the CPU, every mode and
 * layout, each checked against a single-rank run of the same inputs.
 * Each rank is a thread with its own context; inputs are sharded with
 * cp_layout_shard() and results reassembled with cp_layout_gather().
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infinicp/infinicp.h>

#include "bench.h"

typedef struct demo_cfg {
    int64_t batch, seq;
    int heads, kv_heads, dim;
    cp_dtype dtype;
    cp_mask mask;
    int cp;
} demo_cfg;

/* Global tensors (storage type) and results. */
typedef struct demo_data {
    void *q, *k, *v, *dout;
    void *out, *dq, *dk, *dv; /* results gathered from rank 0 */
    float *lse;
} demo_data;

typedef struct run_spec {
    cp_mode mode;
    cp_layout layout;
    int P, A;
} run_spec;

typedef struct run_result {
    double fwd_s, bwd_s;
    size_t ws_bytes;
    cp_status status;
    char error[512];
} run_result;

typedef struct rank_arg {
    const demo_cfg *c;
    const run_spec *r;
    const demo_data *in;
    demo_data *out;
    run_result *res;
    cp_comm *comm;
    int threads;
    pthread_mutex_t *lock;
} rank_arg;

static size_t dtype_bytes(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? 4 : 2;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float half_to_float(uint16_t h, cp_dtype t)
{
    if (t == CP_DTYPE_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return (float)bench_f16_to_f32(h);
}

static double value(const void *p, cp_dtype t, size_t i)
{
    if (t == CP_DTYPE_F32)
        return ((const float *)p)[i];
    return half_to_float(((const uint16_t *)p)[i], t);
}

static void fill(void *p, cp_dtype t, size_t n, uint64_t *seed)
{
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        float x = (float)((double)(*seed >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        if (t == CP_DTYPE_F32)
            ((float *)p)[i] = x;
        else
            ((uint16_t *)p)[i] = bench_f32_to_half(x, t);
    }
}

static void fail(rank_arg *a, cp_status s, const char *what)
{
    pthread_mutex_lock(a->lock);
    if (a->res->status == CP_SUCCESS) {
        a->res->status = s;
        snprintf(a->res->error, sizeof a->res->error, "%s: %s", what, cp_last_error());
    }
    pthread_mutex_unlock(a->lock);
}

#define TRY(call)                                                                                   \
    do {                                                                                            \
        cp_status s_ = (call);                                                                      \
        if (s_ != CP_SUCCESS) {                                                                     \
            fail(a, s_, #call);                                                                     \
            goto out;                                                                               \
        }                                                                                           \
    } while (0)

static void *rank_main(void *arg)
{
    rank_arg *a = arg;
    const demo_cfg *c = a->c;
    cp_context *ctx = NULL;
    cp_group *g = NULL;
    cp_attn_plan *plan = NULL;
    void *t[8] = { 0 };
    float *lse = NULL;
    void *ws = NULL;
    const size_t es = dtype_bytes(c->dtype);
    const size_t tq = (size_t)c->heads * (size_t)c->dim * es, tk = (size_t)c->kv_heads * (size_t)c->dim * es;
    const int64_t n = c->seq / a->r->P;

    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = a->threads;
    TRY(cp_context_create(&cc, &ctx));
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.a2a_size = a->r->A;
    TRY(cp_group_create(ctx, a->comm, &gc, &g));
    int rank = 0;
    cp_group_rank(g, &rank);

    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.dtype = c->dtype;
    d.batch = c->batch;
    d.seq_len = c->seq;
    d.num_heads = c->heads;
    d.num_kv_heads = c->kv_heads;
    d.head_dim = c->dim;
    d.mask = c->mask;
    d.layout = a->r->layout;
    d.mode = a->r->mode;
    TRY(cp_attn_plan_create(g, &d, &plan));
    size_t wf, wb;
    TRY(cp_attn_workspace_size(plan, &wf, &wb));
    size_t wmax = wf > wb ? wf : wb;
    ws = malloc(wmax ? wmax : 1);

    const size_t sizes[8] = { tq, tk, tk, tq, tq, tq, tk, tk }; /* q k v dout out dq dk dv, per token */
    for (int i = 0; i < 8; i++)
        t[i] = malloc((size_t)c->batch * (size_t)n * sizes[i]);
    lse = malloc((size_t)c->batch * (size_t)c->heads * (size_t)n * sizeof *lse);
    if (!ws || !lse || !t[7]) {
        fail(a, CP_ERROR_OUT_OF_MEMORY, "malloc");
        goto out;
    }
    const void *gin[4] = { a->in->q, a->in->k, a->in->v, a->in->dout };
    for (int i = 0; i < 4; i++)
        TRY(cp_layout_shard(ctx, d.layout, a->r->P, rank, gin[i], t[i], c->batch, c->seq, sizes[i]));

    double t0 = now();
    TRY(cp_attn_forward(plan, t[0], t[1], t[2], t[4], lse, ws, wf));
    double t1 = now();
    TRY(cp_attn_backward(plan, t[0], t[1], t[2], t[4], lse, t[3], t[5], t[6], t[7], ws, wb));
    double t2 = now();

    /* Every rank takes part in the gathers; rank 0's copy is kept. */
    void *gout[4] = { a->out->out, a->out->dq, a->out->dk, a->out->dv };
    const int src[4] = { 4, 5, 6, 7 };
    for (int i = 0; i < 4; i++) {
        size_t bytes = (size_t)c->batch * (size_t)c->seq * sizes[src[i]];
        void *dst = rank == 0 ? gout[i] : malloc(bytes);
        cp_status s = cp_layout_gather(g, d.layout, t[src[i]], dst, c->batch, c->seq, sizes[src[i]]);
        if (rank != 0)
            free(dst);
        TRY(s);
    }
    pthread_mutex_lock(a->lock);
    if (t1 - t0 > a->res->fwd_s)
        a->res->fwd_s = t1 - t0;
    if (t2 - t1 > a->res->bwd_s)
        a->res->bwd_s = t2 - t1;
    if (wmax > a->res->ws_bytes)
        a->res->ws_bytes = wmax;
    pthread_mutex_unlock(a->lock);
out:
    for (int i = 0; i < 8; i++)
        free(t[i]);
    free(lse);
    free(ws);
    cp_attn_plan_destroy(plan);
    cp_group_destroy(g);
    cp_comm_destroy(a->comm);
    cp_context_destroy(ctx);
    return NULL;
}

static int run(const demo_cfg *c, const run_spec *r, const demo_data *in, demo_data *out, run_result *res,
               int cores)
{
    memset(res, 0, sizeof *res);
    cp_comm *comms[64];
    cp_status s = cp_comm_create_local(r->P, comms);
    if (s != CP_SUCCESS) {
        snprintf(res->error, sizeof res->error, "cp_comm_create_local: %s", cp_last_error());
        return -1;
    }
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    rank_arg args[64];
    pthread_t th[64];
    int threads = cores / r->P > 0 ? cores / r->P : 1;
    for (int i = 0; i < r->P; i++) {
        args[i] = (rank_arg){ c, r, in, out, res, comms[i], threads, &lock };
        pthread_create(&th[i], NULL, rank_main, &args[i]);
    }
    for (int i = 0; i < r->P; i++)
        pthread_join(th[i], NULL);
    return res->status == CP_SUCCESS ? 0 : -1;
}

/* max |x - ref| / max |ref| over a tensor of n values. */
static double max_rel(const void *x, const void *ref, cp_dtype t, size_t n)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double a = value(x, t, i), b = value(ref, t, i);
        e = fmax(e, fabs(a - b));
        m = fmax(m, fabs(b));
    }
    return m > 0 ? e / m : e;
}

static void alloc_results(const demo_cfg *c, demo_data *d)
{
    const size_t es = dtype_bytes(c->dtype), tokens = (size_t)c->batch * (size_t)c->seq;
    d->out = malloc(tokens * (size_t)c->heads * (size_t)c->dim * es);
    d->dq = malloc(tokens * (size_t)c->heads * (size_t)c->dim * es);
    d->dk = malloc(tokens * (size_t)c->kv_heads * (size_t)c->dim * es);
    d->dv = malloc(tokens * (size_t)c->kv_heads * (size_t)c->dim * es);
}

static void free_results(demo_data *d)
{
    free(d->out);
    free(d->dq);
    free(d->dk);
    free(d->dv);
}

int bench_demo(const bench_opts *o)
{
    demo_cfg c = { o->batch, o->seq, o->heads, o->kv_heads, o->dim, o->dtype, o->mask, o->cp };
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = ncpu > 0 ? (int)ncpu : 1;
    const char *dn = c.dtype == CP_DTYPE_F32 ? "F32" : c.dtype == CP_DTYPE_BF16 ? "BF16" : "F16";
    printf("CP attention demo: batch %lld, seq %lld, heads %d (kv %d), head_dim %d, %s, %s, %d cores\n",
           (long long)c.batch, (long long)c.seq, c.heads, c.kv_heads, c.dim, dn,
           c.mask == CP_MASK_CAUSAL ? "causal" : "no mask", cores);
    printf("ranks are threads of this process; every run is checked against a single-rank run\n\n");

    const size_t es = dtype_bytes(c.dtype), tokens = (size_t)c.batch * (size_t)c.seq;
    const size_t nq = tokens * (size_t)c.heads * (size_t)c.dim, nk = tokens * (size_t)c.kv_heads * (size_t)c.dim;
    demo_data in = { 0 };
    in.q = malloc(nq * es);
    in.k = malloc(nk * es);
    in.v = malloc(nk * es);
    in.dout = malloc(nq * es);
    uint64_t seed = 20261202;
    fill(in.q, c.dtype, nq, &seed);
    fill(in.k, c.dtype, nk, &seed);
    fill(in.v, c.dtype, nk, &seed);
    fill(in.dout, c.dtype, nq, &seed);

    demo_data ref = { 0 };
    alloc_results(&c, &ref);
    run_result rr;
    run_spec one = { CP_MODE_P2P, CP_LAYOUT_CONTIGUOUS, 1, 1 };
    if (run(&c, &one, &in, &ref, &rr, cores)) {
        fprintf(stderr, "single-rank run failed: %s\n", rr.error);
        return 1;
    }
    /* F32 differs from CP=1 only by fp32 rounding order; 16-bit types by
     * at most a few ulps of the storage type. */
    const double tol = c.dtype == CP_DTYPE_F32 ? 1e-4 : c.dtype == CP_DTYPE_F16 ? 1e-2 : 4e-2;

    printf("%-10s %-10s %4s %7s  %9s %9s %9s %9s  %9s %9s  %10s\n", "mode", "layout", "cp", "a2a*p2p",
           "err out", "err dq", "err dk", "err dv", "fwd ms", "bwd ms", "ws/rank");
    printf("%-10s %-10s %4d %7s  %9s %9s %9s %9s  %9.1f %9.1f  %7.2f MiB\n", "(single)", "-", 1, "-", "-", "-",
           "-", "-", 1e3 * rr.fwd_s, 1e3 * rr.bwd_s, (double)rr.ws_bytes / 1048576.0);
    static const char *mode_names[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };
    int bad = 0;
    demo_data got = { 0 };
    alloc_results(&c, &got);
    for (int mode = 0; mode < 4; mode++)
        for (int layout = 0; layout < 2; layout++) {
            run_spec r = { (cp_mode)mode, (cp_layout)layout, c.cp, 1 };
            if (mode == CP_MODE_A2A_P2P) {
                r.A = 2;
                while (r.A * r.A < c.cp)
                    r.A *= 2;
                if (c.cp % r.A)
                    r.A = 1;
            }
            char fact[16];
            snprintf(fact, sizeof fact, "%dx%d", mode == CP_MODE_A2A ? c.cp : r.A,
                     mode == CP_MODE_A2A ? 1 : c.cp / r.A);
            const char *ln = layout ? "zigzag" : "contiguous";
            if (run(&c, &r, &in, &got, &rr, cores)) {
                printf("%-10s %-10s %4d %7s  %s\n", mode_names[mode], ln, c.cp, fact, rr.error);
                if (rr.status != CP_ERROR_UNSUPPORTED)
                    bad++;
                continue;
            }
            double e[4] = { max_rel(got.out, ref.out, c.dtype, nq), max_rel(got.dq, ref.dq, c.dtype, nq),
                            max_rel(got.dk, ref.dk, c.dtype, nk), max_rel(got.dv, ref.dv, c.dtype, nk) };
            int ok = e[0] <= tol && e[1] <= tol && e[2] <= tol && e[3] <= tol;
            bad += !ok;
            printf("%-10s %-10s %4d %7s  %9.2e %9.2e %9.2e %9.2e  %9.1f %9.1f  %7.2f MiB%s\n", mode_names[mode], ln,
                   c.cp, fact, e[0], e[1], e[2], e[3], 1e3 * rr.fwd_s, 1e3 * rr.bwd_s,
                   (double)rr.ws_bytes / 1048576.0, ok ? "" : "  MISMATCH");
        }
    printf("\nerr: max |x - x_cp1| / max |x_cp1| over the whole tensor; tolerance %.0e\n", tol);
    printf("%s\n", bad ? "FAILED: some runs differ from the single-rank result"
                       : "all modes and layouts match the single-rank result");
    free_results(&got);
    free_results(&ref);
    free(in.q);
    free(in.k);
    free(in.v);
    free(in.dout);
    return bad ? 1 : 0;
}
