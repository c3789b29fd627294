/* SPDX-License-Identifier: MIT */
/*
 * The demo and CP benchmark: CP attention on every mode and layout, each
 * timed and checked against a single-rank run of the same inputs. Each rank
 * is a thread with its own context (on the CPU, or on a CUDA device with
 * --device cuda); with --transport nccl-file this process is one rank of a
 * run spread over processes. Inputs are made on the host, copied to the
 * device, sharded with cp_layout_shard() and results reassembled with
 * cp_layout_gather().
 *
 * Then the same for one packed row of documents (API 1.1): a fixed mix of
 * document lengths split by a GREEDY cp_pack, sharded with cp_pack_shard(),
 * attention through cp_attn_forward_ex() / cp_attn_backward_ex() with the
 * pack, results reassembled with cp_pack_gather(), and compared with a
 * single-rank run of the same row (a pack of one rank: the same document
 * mask); one row adds a sliding window and attention sinks.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infinicp/infinicp.h>

#include "bench.h"
#include "pack_bench.h"
#include "devmem.h"
#include "launch.h"

/* Global tensors in host memory (storage type), and results. */
typedef struct demo_data {
    void *q, *k, *v, *dout;
    float *sinks;             /* [heads] sink logits (packed runs with sinks) */
    void *out, *dq, *dk, *dv; /* results gathered from rank 0 */
    float *dsinks;            /* the sinks' gradient summed over the ranks */
} demo_data;

/* A packed row of documents: the first batch row of the inputs, seq tokens. */
typedef struct pack_spec {
    const int64_t *cu; /* num_seqs + 1 document offsets */
    int num_seqs;
    cp_balance balance;
    int64_t window; /* sliding window (0 = none) */
    int sinks;      /* 1: one sink logit per head */
} pack_spec;

typedef struct run_spec {
    cp_mode mode;
    cp_layout layout;
    int P, A;
    const pack_spec *pack; /* CP_LAYOUT_PACKED: the documents; else NULL */
} run_spec;

enum { MAX_REPS = 100 };

typedef struct run_result {
    double fwd_s[MAX_REPS], bwd_s[MAX_REPS]; /* per repetition, the slowest rank */
    /* per repetition: the first rank's start of the forward and the last
     * rank's end of the backward (host clock) */
    double start_s[MAX_REPS], end_s[MAX_REPS];
    /* per repetition, the slowest rank: from the call to its return (the
     * host's time to queue the work; on a device backend the call returns
     * before the work is done) */
    double fwd_host_s[MAX_REPS], bwd_host_s[MAX_REPS];
    size_t ws_bytes;
    size_t peak_bytes; /* --memory: device bytes the ranks held at most, all ranks together */
    cp_status status;
    char error[512];
} run_result;

/* What every rank of one run shares. */
typedef struct run_shared {
    const bench_opts *c;
    const run_spec *r;
    const demo_data *in;
    demo_data *out;
    run_result *res;
    const devmem *dm;
    int threads, gather;
    pthread_mutex_t lock;
    pthread_barrier_t barrier;
    atomic_int sampling; /* --memory: every rank is set up; the sampler records */
    atomic_int stop;     /* the ranks are done; the sampler ends */
} run_shared;

typedef struct rank_arg {
    run_shared *sh;
    run_result *res;
    cp_comm *comm;
    int device;
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
    pthread_mutex_lock(&a->sh->lock);
    if (a->res->status == CP_SUCCESS) {
        a->res->status = s;
        snprintf(a->res->error, sizeof a->res->error, "%s: %s", what, cp_last_error());
    }
    pthread_mutex_unlock(&a->sh->lock);
}

/* A device buffer (host memory on the CPU); NULL after a failure. */
static void *dev_alloc(rank_arg *a, size_t bytes)
{
    void *p = devmem_alloc(a->sh->dm, bytes);
    if (!p)
        fail(a, CP_ERROR_OUT_OF_MEMORY, "device allocation");
    return p;
}

#define TRY(call)                                                                                   \
    do {                                                                                            \
        cp_status s_ = (call);                                                                      \
        if (s_ != CP_SUCCESS) {                                                                     \
            fail(a, s_, #call);                                                                     \
            goto out;                                                                               \
        }                                                                                           \
    } while (0)

/* One rank: shard the inputs on its device, time forward and backward
 * (median of reps after one warm-up; every rank starts each repetition
 * together and the slowest counts), then gather the results to rank 0. */
static void *rank_main(void *arg)
{
    rank_arg *a = arg;
    run_shared *sh = a->sh;
    const bench_opts *c = sh->c;
    const devmem *dm = sh->dm;
    cp_context *ctx = NULL;
    cp_group *g = NULL;
    cp_attn_plan *plan = NULL;
    cp_pack *pk = NULL;
    const pack_spec *ps = sh->r->pack;
    float *sinks = NULL, *dsinks = NULL;
    void *t[9] = { 0 }; /* q k v dout out dq dk dv lse */
    void *ws = NULL, *global = NULL, *stream = NULL;
    int owed = sh->c->reps + 1; /* arrivals this rank still owes the barrier */
    const size_t es = dtype_bytes(c->dtype);
    const size_t tq = (size_t)c->heads * (size_t)c->dim * es, tk = (size_t)c->kv_heads * (size_t)c->dim * es;
    const int64_t n = c->seq / sh->r->P;
    const size_t gbytes = (size_t)c->batch * (size_t)c->seq * tq; /* the largest global tensor */

    if (devmem_use(dm, a->device)) {
        fail(a, CP_ERROR_BACKEND, "cudaSetDevice");
        goto out;
    }
    /* As on a GPU of its own, a rank's work does not queue behind the
     * others' on one shared stream (unless --stream default). */
    if (!c->default_stream && devmem_stream_create(dm, &stream)) {
        fail(a, CP_ERROR_BACKEND, "cudaStreamCreateWithFlags");
        goto out;
    }
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.stream = stream;
    cc.num_threads = sh->threads;
    cc.device = c->cuda ? CP_DEVICE_CUDA : CP_DEVICE_CPU;
    cc.device_index = a->device;
    TRY(cp_context_create(&cc, &ctx));
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.a2a_size = sh->r->A;
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
    d.layout = sh->r->layout;
    d.mode = sh->r->mode;
    if (ps) {
        d.window = ps->window;
        d.sinks = ps->sinks;
    }
    TRY(cp_attn_plan_create(g, &d, &plan));
    if (ps) {
        /* every rank makes the same split from the same documents: no communication */
        cp_pack_config pc = CP_PACK_CONFIG_INIT;
        pc.cp_size = sh->r->P;
        pc.cu_seqlens = ps->cu;
        pc.num_seqs = ps->num_seqs;
        pc.mask = c->mask;
        pc.window = ps->window;
        pc.balance = ps->balance;
        TRY(cp_pack_create(&pc, &pk));
    }
    size_t wf, wb;
    TRY(cp_attn_workspace_size(plan, &wf, &wb));
    size_t wmax = wf > wb ? wf : wb;

    const size_t sizes[8] = { tq, tk, tk, tq, tq, tq, tk, tk }; /* q k v dout out dq dk dv, per token */
    for (int i = 0; i < 8; i++)
        if (!(t[i] = dev_alloc(a, (size_t)c->batch * (size_t)n * sizes[i])))
            goto out;
    if (!(t[8] = dev_alloc(a, (size_t)c->batch * (size_t)c->heads * (size_t)n * sizeof(float))) ||
        !(ws = dev_alloc(a, wmax)) || !(global = dev_alloc(a, gbytes)))
        goto out;
    const size_t sink_bytes = (size_t)c->heads * sizeof(float);
    if (ps && ps->sinks) {
        if (!(sinks = dev_alloc(a, sink_bytes)) || !(dsinks = dev_alloc(a, sink_bytes)))
            goto out;
        if (devmem_to_device(dm, sinks, sh->in->sinks, sink_bytes) || devmem_sync(dm)) {
            fail(a, CP_ERROR_BACKEND, "copy to the device");
            goto out;
        }
    }
    /* the whole tensor goes to the device, where cp_layout_shard cuts this rank's share */
    const void *gin[4] = { sh->in->q, sh->in->k, sh->in->v, sh->in->dout };
    for (int i = 0; i < 4; i++) {
        if (devmem_to_device(dm, global, gin[i], (size_t)c->batch * (size_t)c->seq * sizes[i]) || devmem_sync(dm)) {
            fail(a, CP_ERROR_BACKEND, "copy to the device");
            goto out;
        }
        if (pk)
            TRY(cp_pack_shard(ctx, pk, rank, global, t[i], sizes[i]));
        else
            TRY(cp_layout_shard(ctx, d.layout, sh->r->P, rank, global, t[i], c->batch, c->seq, sizes[i]));
        TRY(cp_context_synchronize(ctx));
    }
    if (!sh->gather) {
        /* the whole-sequence staging buffer is not the rank's to keep */
        devmem_free(dm, global);
        global = NULL;
    }

    /* API 1.1 calls: the pack, the sinks and their gradient */
    cp_attn_args xf = CP_ATTN_ARGS_INIT;
    xf.pack = pk;
    xf.sinks = sinks;
    xf.workspace = ws;
    xf.workspace_bytes = wf;
    cp_attn_args xb = xf;
    xb.dsinks = dsinks;
    xb.workspace_bytes = wb;
    for (int rep = -1; rep < c->reps; rep++) {
        pthread_barrier_wait(&sh->barrier);
        owed--;
        /* a rank that failed leaves every later barrier to the others */
        if (a->res->status != CP_SUCCESS)
            goto out;
        if (rep < 0 && rank == 0)
            atomic_store(&sh->sampling, 1);
        double t0 = now();
        if (ps)
            TRY(cp_attn_forward_ex(plan, t[0], t[1], t[2], t[4], t[8], &xf));
        else
            TRY(cp_attn_forward(plan, t[0], t[1], t[2], t[4], t[8], ws, wf));
        double t0q = now();
        TRY(cp_context_synchronize(ctx));
        double t1 = now();
        if (ps)
            TRY(cp_attn_backward_ex(plan, t[0], t[1], t[2], t[4], t[8], t[3], t[5], t[6], t[7], &xb));
        else
            TRY(cp_attn_backward(plan, t[0], t[1], t[2], t[4], t[8], t[3], t[5], t[6], t[7], ws, wb));
        double t1q = now();
        TRY(cp_context_synchronize(ctx));
        double t2 = now();
        if (rep < 0)
            continue;
        pthread_mutex_lock(&sh->lock);
        run_result *res = a->res;
        res->fwd_s[rep] = fmax(res->fwd_s[rep], t1 - t0);
        res->bwd_s[rep] = fmax(res->bwd_s[rep], t2 - t1);
        res->fwd_host_s[rep] = fmax(res->fwd_host_s[rep], t0q - t0);
        res->bwd_host_s[rep] = fmax(res->bwd_host_s[rep], t1q - t1);
        res->start_s[rep] = res->end_s[rep] == 0 ? t0 : fmin(res->start_s[rep], t0);
        res->end_s[rep] = fmax(res->end_s[rep], t2);
        pthread_mutex_unlock(&sh->lock);
    }
    pthread_mutex_lock(&sh->lock);
    if (wmax > a->res->ws_bytes)
        a->res->ws_bytes = wmax;
    pthread_mutex_unlock(&sh->lock);

    if (sh->gather) {
        /* Every rank takes part in the gathers; rank 0's copy is kept. */
        void *gout[4] = { sh->out->out, sh->out->dq, sh->out->dk, sh->out->dv };
        const int src[4] = { 4, 5, 6, 7 };
        for (int i = 0; i < 4; i++) {
            size_t bytes = (size_t)c->batch * (size_t)c->seq * sizes[src[i]];
            if (pk)
                TRY(cp_pack_gather(g, pk, t[src[i]], global, sizes[src[i]]));
            else
                TRY(cp_layout_gather(g, d.layout, t[src[i]], global, c->batch, c->seq, sizes[src[i]]));
            TRY(cp_context_synchronize(ctx));
            if (rank == 0 && devmem_to_host(dm, gout[i], global, bytes)) {
                fail(a, CP_ERROR_BACKEND, "copy to the host");
                goto out;
            }
        }
        if (dsinks) {
            /* each rank holds the sinks' gradient of its own queries: the
             * sum over the group, like any replicated parameter's */
            TRY(cp_grad_all_reduce(ctx, a->comm, dsinks, (size_t)c->heads, CP_DTYPE_F32, CP_GRAD_SUM, 0));
            TRY(cp_context_synchronize(ctx));
            if (rank == 0 && devmem_to_host(dm, sh->out->dsinks, dsinks, sink_bytes)) {
                fail(a, CP_ERROR_BACKEND, "copy to the host");
                goto out;
            }
        }
    }
out:
    /* keep the barrier count right for the ranks still timing */
    while (owed-- > 0)
        pthread_barrier_wait(&sh->barrier);
    for (int i = 0; i < 9; i++)
        devmem_free(dm, t[i]);
    devmem_free(dm, ws);
    devmem_free(dm, global);
    devmem_free(dm, sinks);
    devmem_free(dm, dsinks);
    cp_pack_destroy(pk);
    cp_attn_plan_destroy(plan);
    cp_group_destroy(g);
    cp_comm_destroy(a->comm);
    cp_context_destroy(ctx);
    devmem_stream_destroy(dm, stream);
    return NULL;
}

/* --memory: device memory in use, sampled every 50 us while the ranks run
 * (from the first barrier, when every rank holds its tensors, workspace and
 * context, to the end); the peak goes to sh->res->peak_bytes. */
static void *sampler_main(void *arg)
{
    run_shared *sh = arg;
    size_t peak = 0, used;
    devmem_use(sh->dm, 0);
    while (!atomic_load(&sh->stop)) {
        if (atomic_load(&sh->sampling) && devmem_used(sh->dm, &used) == 0 && used > peak)
            peak = used;
        usleep(50);
    }
    sh->res->peak_bytes = peak;
    return NULL;
}

/* One run over the ranks this process drives (all of them, except with one
 * process per GPU). */
static int run(const bench_opts *c, const launch *l, const run_spec *r, const demo_data *in, demo_data *out,
               run_result *res, const devmem *dm, int cores, int gather)
{
    memset(res, 0, sizeof *res);
    cp_comm *comms[64];
    cp_status s = launch_comms(l, comms);
    if (s != CP_SUCCESS) {
        snprintf(res->error, sizeof res->error, "communicator: %s", cp_last_error());
        return -1;
    }
    run_shared sh = { c, r, in, out, res, dm, cores / l->count > 0 ? cores / l->count : 1, gather,
                      PTHREAD_MUTEX_INITIALIZER, { { 0 } }, 0, 0 };
    pthread_barrier_init(&sh.barrier, NULL, (unsigned)l->count);
    /* what device 0 holds before the ranks exist (the runtime's own context included) */
    size_t used0 = 0;
    pthread_t sampler;
    const int sample = c->memory && devmem_use(dm, 0) == 0 && devmem_used(dm, &used0) == 0 &&
                       pthread_create(&sampler, NULL, sampler_main, &sh) == 0;
    rank_arg args[64];
    pthread_t th[64];
    for (int i = 0; i < l->count; i++) {
        args[i] = (rank_arg){ &sh, res, comms[i], launch_device(l, i) };
        pthread_create(&th[i], NULL, rank_main, &args[i]);
    }
    for (int i = 0; i < l->count; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&sh.barrier);
    if (sample) {
        atomic_store(&sh.stop, 1);
        pthread_join(sampler, NULL);
        res->peak_bytes = res->peak_bytes > used0 ? res->peak_bytes - used0 : 0;
    }
    return res->status == CP_SUCCESS ? 0 : -1;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(const double *v, int n)
{
    double t[MAX_REPS];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Median over the repetitions of first start to last end (the step). */
static double median_step(const run_result *rr, int reps)
{
    double st[MAX_REPS];
    for (int i = 0; i < reps; i++)
        st[i] = rr->end_s[i] - rr->start_s[i];
    return median(st, reps);
}

/* The single-rank run every CP run is compared with: local transport, this
 * process's first device; out gets its results when gather is set. With a
 * pack, the same packed row split for one rank (the same document mask). */
static int run_single(const bench_opts *c, const launch *l, const pack_spec *ps, const demo_data *in,
                      demo_data *out, run_result *rr, const devmem *dm, int cores, int gather)
{
    launch single = { BENCH_LOCAL, 1, 0, 1, l->devices, { 0 } };
    run_spec one = { CP_MODE_P2P, ps ? CP_LAYOUT_PACKED : CP_LAYOUT_CONTIGUOUS, 1, 1, ps };
    bench_opts c1 = *c;
    c1.cp = 1;
    return run(&c1, &single, &one, in, out, rr, dm, cores, gather);
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

static void alloc_results(const bench_opts *c, demo_data *d)
{
    const size_t es = dtype_bytes(c->dtype), tokens = (size_t)c->batch * (size_t)c->seq;
    d->out = malloc(tokens * (size_t)c->heads * (size_t)c->dim * es);
    d->dq = malloc(tokens * (size_t)c->heads * (size_t)c->dim * es);
    d->dk = malloc(tokens * (size_t)c->kv_heads * (size_t)c->dim * es);
    d->dv = malloc(tokens * (size_t)c->kv_heads * (size_t)c->dim * es);
    d->dsinks = calloc((size_t)c->heads, sizeof(float));
}

static void free_results(demo_data *d)
{
    free(d->out);
    free(d->dq);
    free(d->dk);
    free(d->dv);
    free(d->dsinks);
}

/* The least device memory one p2p rank can hold at the peak (the backward):
 * its shards of q, k, v, out, lse, dout, dq, dk, dv, and - with more than one
 * rank - double buffers for the K, V that circulate (storage type) and for
 * the dK, dV accumulators that travel with them (fp32, as the numerics of
 * docs/ARCHITECTURE.md require). Anything else is overhead. */
static double p2p_min_bytes(const bench_opts *c, int P)
{
    const double n = (double)c->batch * (double)(c->seq / P), es = (double)dtype_bytes(c->dtype);
    const double tq = (double)c->heads * c->dim, tk = (double)c->kv_heads * c->dim;
    double b = n * (4 * tq * es + 4 * tk * es + 4.0 * c->heads);
    if (P > 1)
        b += n * (2 * 2 * tk * es + 2 * 2 * tk * 4);
    return b;
}

/* CUDA: the host's share, median over the repetitions of the slowest
 * rank's time to queue the forward and the backward. */
static void print_host(const bench_opts *c, const run_result *rr)
{
    if (c->cuda)
        printf("  %8.2f %8.2f", 1e3 * median(rr->fwd_host_s, c->reps), 1e3 * median(rr->bwd_host_s, c->reps));
}

/* --memory columns: peak per rank, the analytical minimum (p2p only), their ratio. */
static void print_memory(const bench_opts *c, const run_result *rr, int P, int p2p)
{
    if (!c->memory)
        return;
    const double peak = (double)rr->peak_bytes / P / 1048576.0;
    if (p2p) {
        const double m = p2p_min_bytes(c, P) / 1048576.0;
        printf("  %9.1f %9.1f %6.3f", peak, m, peak / m);
    } else {
        printf("  %9.1f %9s %6s", peak, "-", "-");
    }
}

static const char *transport_name(bench_transport t)
{
    return t == BENCH_NCCL_THREADS ? "nccl-threads" : t == BENCH_NCCL_FILE ? "nccl-file" : "local";
}

/* The a2a part of CP for the hybrid mode: the power of two nearest sqrt(P) from above, 1 if it does not divide P. */
static int hybrid_a2a(int P)
{
    int A = 2;
    while (A * A < P)
        A *= 2;
    return P % A ? 1 : A;
}

/* The demo's packed row: documents of 1000, 333, 211, 190, 120, 77, 64 and
 * 53 tokens at seq 2048, scaled to other lengths: a long one, a few of
 * medium size, short ones, none a multiple of the chunk (so chunks straddle
 * document ends). cu receives the offsets; returns the number of documents. */
static int demo_docs(int64_t T, int64_t cu[9])
{
    static const int64_t len[8] = { 1000, 333, 211, 190, 120, 77, 64, 53 };
    int n = 0;
    int64_t at = 0;
    cu[0] = 0;
    for (int i = 0; i < 8; i++) {
        at += len[i];
        const int64_t end = i == 7 ? T : at * T / 2048;
        if (end > cu[n])
            cu[++n] = end;
    }
    return n;
}

/* The most work of a rank over the mean (cp_pack_work: visible query-key
 * pairs of its queries), 1 = even, for a split of ps over P ranks; -1 if
 * the pack cannot be made. */
static double pack_imbalance(const pack_spec *ps, int P, cp_mask mask, cp_balance balance)
{
    cp_pack_config pc = CP_PACK_CONFIG_INIT;
    pc.cp_size = P;
    pc.cu_seqlens = ps->cu;
    pc.num_seqs = ps->num_seqs;
    pc.mask = mask;
    pc.window = ps->window;
    pc.balance = balance;
    cp_pack *pk = NULL;
    if (cp_pack_create(&pc, &pk) != CP_SUCCESS)
        return -1;
    double top = 0, sum = 0;
    for (int r = 0; r < P; r++) {
        double w = 0;
        if (cp_pack_work(pk, r, &w) != CP_SUCCESS) {
            cp_pack_destroy(pk);
            return -1;
        }
        top = fmax(top, w);
        sum += w;
    }
    cp_pack_destroy(pk);
    return sum > 0 ? top * P / sum : 1;
}

/* The packed-documents table: the first sample's row of the inputs as one
 * packed row of documents, every mode on a GREEDY split, and p2p once more
 * with a sliding window and sinks, each against the same row on one rank.
 * Returns the number of failed or mismatching runs. */
static int packed_table(const bench_opts *c, const launch *l, const demo_data *in, const devmem *dm, int cores,
                        int lead, double tol)
{
    static const char *mode_names[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };
    bench_opts cb = *c;
    cb.batch = 1; /* a packed row is one sample */
    int64_t cu9[9], *cu = cu9;
    int nd;
    if (c->docs) {
        const int e = pack_bench_docs(c->docs, cb.seq, &cu, &nd);
        if (e) {
            fprintf(stderr, "infinicp-bench: --docs %s: %s\n", c->docs, e == -1 ? "no such mix" : "out of memory");
            return 1;
        }
    } else {
        nd = demo_docs(cb.seq, cu9);
    }
    if (c->balance == CP_BALANCE_DOC_ZIGZAG) {
        /* every length a multiple of 2P (the padding that split needs):
         * each end moved to the nearest multiple, none crossing the next */
        const int64_t m = 2 * (int64_t)cb.cp;
        int k = 0;
        for (int i = 1; i <= nd; i++) {
            int64_t e = i == nd ? cb.seq / m * m : (cu[i] + m / 2) / m * m;
            if (e > cu[k] && (i == nd || e < cb.seq / m * m))
                cu[++k] = e;
        }
        if (cu[k] != cb.seq / m * m || cb.seq % m) {
            fprintf(stderr, "infinicp-bench: --balance doc_zigzag needs --seq a multiple of 2 * --cp\n");
            if (cu != cu9)
                free(cu);
            return 1;
        }
        nd = k;
    }
    const int64_t W = cb.seq / 8 > 0 ? cb.seq / 8 : 1;
    const cp_balance bal = c->balance >= 0 ? (cp_balance)c->balance : CP_BALANCE_GREEDY;
    const pack_spec packs[2] = { { cu, nd, bal, c->window, 0 }, { cu, nd, bal, W, 1 } };
    char wname[48], dname[48];
    snprintf(wname, sizeof wname, "docs W=%lld sinks", (long long)W);
    if (c->window)
        snprintf(dname, sizeof dname, "docs W=%lld", (long long)c->window);
    else
        snprintf(dname, sizeof dname, "documents");
    const char *att_names[2] = { dname, wname };
    const size_t nq = (size_t)cb.seq * (size_t)cb.heads * (size_t)cb.dim;
    const size_t nk = (size_t)cb.seq * (size_t)cb.kv_heads * (size_t)cb.dim;
    demo_data ref = { 0 }, got = { 0 };
    alloc_results(&cb, &ref);
    alloc_results(&cb, &got);
    run_result *rr = calloc(1, sizeof *rr);
    int bad = 0;
    if (lead) {
        printf("\npacked documents (CP_LAYOUT_PACKED): one row of %lld tokens, %d documents of", (long long)cb.seq,
               nd);
        for (int i = 0; i < nd && i < 12; i++)
            printf(" %lld", (long long)(cu[i + 1] - cu[i]));
        static const char *const bal_names[] = { "AUTO", "DOC_ZIGZAG", "GREEDY", "CONTIGUOUS" };
        printf("%s tokens%s%s, CP_BALANCE_%s split\n", nd > 12 ? " ..." : "", c->docs ? ", mix " : "",
               c->docs ? c->docs : "", (unsigned)bal < 4 ? bal_names[bal] : "?");
        printf("%-10s %-16s %4s %7s %9s  %9s %9s %9s %9s %9s  %9s %9s %9s %7s %7s  %10s", "mode", "attention", "cp",
               "a2a*p2p", "work x", "err out", "err dq", "err dk", "err dv", "err sinks", "fwd ms", "bwd ms",
               "step ms", "vs cp1", "f+b/cp1", "ws/rank");
        if (cb.memory)
            printf("  %9s %9s %6s", "peak MiB", "min MiB", "x min");
        if (cb.cuda)
            printf("  %8s %8s", "host fwd", "host bwd");
        printf("\n");
    }
    for (int v = 0; v < 2; v++) {
        const pack_spec *ps = &packs[v];
        /* the window and sinks once, on the ring */
        const int first_mode = v ? CP_MODE_P2P : 0, last_mode = v ? CP_MODE_P2P : CP_MODE_A2A_P2P;
        if (c->only_mode >= 0 && (c->only_mode < first_mode || c->only_mode > last_mode))
            continue;
        if (ps->sinks)
            for (int h = 0; h < cb.heads; h++)
                in->sinks[h] = (float)(h % 3) - 1.0f + 0.25f * (float)h / (float)cb.heads;
        double one_s = 0, one_fb = 0;
        int have_ref = 0;
        if (lead) {
            if (run_single(&cb, l, ps, in, &ref, rr, dm, cores, !cb.timing_only)) {
                printf("%-10s %-16s %4d %7s %9s  single-rank run: %s\n", "(single)", att_names[v], 1, "-", "-",
                       rr->error);
                bad += rr->status != CP_ERROR_UNSUPPORTED;
            } else {
                const double f = median(rr->fwd_s, cb.reps), b = median(rr->bwd_s, cb.reps);
                one_s = median_step(rr, cb.reps);
                one_fb = f + b;
                have_ref = 1;
                printf("%-10s %-16s %4d %7s %9.3f  %9s %9s %9s %9s %9s  %9.2f %9.2f %9.2f %7.3f %7.3f  %7.2f MiB",
                       "(single)", att_names[v], 1, "-", 1.0, "-", "-", "-", "-", "-", 1e3 * f, 1e3 * b, 1e3 * one_s,
                       1.0, 1.0, (double)rr->ws_bytes / 1048576.0);
                print_memory(&cb, rr, 1, 1);
                print_host(&cb, rr);
                printf("\n");
            }
        }
        for (int mode = first_mode; mode <= last_mode; mode++) {
            if (c->only_mode >= 0 && mode != c->only_mode)
                continue;
            run_spec r = { (cp_mode)mode, CP_LAYOUT_PACKED, cb.cp, 1, ps };
            if (mode == CP_MODE_A2A_P2P)
                r.A = hybrid_a2a(cb.cp);
            char fact[16];
            snprintf(fact, sizeof fact, "%dx%d", mode == CP_MODE_A2A ? cb.cp : r.A,
                     mode == CP_MODE_A2A ? 1 : cb.cp / r.A);
            const double imb = pack_imbalance(ps, cb.cp, cb.mask, ps->balance);
            if (run(&cb, l, &r, in, &got, rr, dm, cores, !cb.timing_only)) {
                if (lead)
                    printf("%-10s %-16s %4d %7s %9.3f  %s\n", mode_names[mode], att_names[v], cb.cp, fact, imb,
                           rr->error);
                if (rr->status != CP_ERROR_UNSUPPORTED)
                    bad++;
                continue;
            }
            if (!lead)
                continue;
            const double f = median(rr->fwd_s, cb.reps), b = median(rr->bwd_s, cb.reps), st = median_step(rr, cb.reps);
            char errs[64] = "        -         -         -         -         -";
            int ok = 1;
            if (!cb.timing_only && have_ref) {
                const double e[5] = { max_rel(got.out, ref.out, cb.dtype, nq), max_rel(got.dq, ref.dq, cb.dtype, nq),
                                      max_rel(got.dk, ref.dk, cb.dtype, nk), max_rel(got.dv, ref.dv, cb.dtype, nk),
                                      ps->sinks ? max_rel(got.dsinks, ref.dsinks, CP_DTYPE_F32, (size_t)cb.heads) : 0 };
                ok = e[0] <= tol && e[1] <= tol && e[2] <= tol && e[3] <= tol && e[4] <= tol;
                const int w = snprintf(errs, sizeof errs, "%9.2e %9.2e %9.2e %9.2e ", e[0], e[1], e[2], e[3]);
                if (ps->sinks)
                    snprintf(errs + w, sizeof errs - (size_t)w, "%9.2e", e[4]);
                else
                    snprintf(errs + w, sizeof errs - (size_t)w, "%9s", "-");
            }
            bad += !ok;
            printf("%-10s %-16s %4d %7s %9.3f  %s  %9.2f %9.2f %9.2f %7.3f %7.3f  %7.2f MiB", mode_names[mode],
                   att_names[v], cb.cp, fact, imb, errs, 1e3 * f, 1e3 * b, 1e3 * st, one_s > 0 ? st / one_s : 0,
                   one_fb > 0 ? (f + b) / one_fb : 0, (double)rr->ws_bytes / 1048576.0);
            print_memory(&cb, rr, cb.cp, mode == CP_MODE_P2P);
            print_host(&cb, rr);
            printf("%s\n", ok ? "" : "  MISMATCH");
            fflush(stdout);
        }
    }
    if (lead) {
        const double contig = pack_imbalance(&packs[0], cb.cp, cb.mask, CP_BALANCE_CONTIGUOUS);
        printf("packed: attention never crosses a document; the single-rank run takes the same row as a pack\n"
               "of one rank (the same document mask); err sinks: the sinks' gradient, each rank's share summed\n"
               "with cp_grad_all_reduce; work x: the most visible (query, key) pairs of a rank over the mean\n"
               "(cp_pack_work), 1 = even; the same row cut in %d contiguous pieces: %.3f\n",
               cb.cp, contig);
    }
    free(rr);
    free_results(&got);
    free_results(&ref);
    if (cu != cu9)
        free(cu);
    return bad;
}

int bench_demo(const bench_opts *o)
{
    bench_opts c = *o;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = ncpu > 0 ? (int)ncpu : 1;
    char err[512];
    devmem dm;
    if (devmem_init(&dm, c.cuda, err, sizeof err)) {
        fprintf(stderr, "infinicp-bench: %s\n", err);
        return 1;
    }
    launch l;
    if (launch_init(&l, &c, dm.device_count, err, sizeof err)) {
        fprintf(stderr, "infinicp-bench: %s\n", err);
        return 1;
    }
    c.cp = l.world;
    /* only the process holding rank 0 reports (and checks) */
    const int lead = l.first == 0;
    const char *dn = c.dtype == CP_DTYPE_F32 ? "F32" : c.dtype == CP_DTYPE_BF16 ? "BF16" : "F16";
    if (lead) {
        printf("CP attention demo: batch %lld, seq %lld, heads %d (kv %d), head_dim %d, %s, %s, %s, %d reps\n",
               (long long)c.batch, (long long)c.seq, c.heads, c.kv_heads, c.dim, dn,
               c.mask == CP_MASK_CAUSAL ? "causal" : "no mask", c.cuda ? "CUDA" : "CPU", c.reps);
        printf("%d ranks, transport %s (%d in this process)%s; %s\n\n", l.world, transport_name(l.transport), l.count,
               !c.cuda ? "" : c.default_stream ? ", all on the default stream" : ", a stream per rank",
               c.timing_only ? "timing only" : "every run is checked against a single-rank run");
    }

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
    in.sinks = calloc((size_t)c.heads, sizeof(float));

    /* --layout packed: the packed-documents table only; contiguous or zigzag: no packed table */
    const int dense = c.only_layout != CP_LAYOUT_PACKED,
              packed = c.only_layout < 0 || c.only_layout == CP_LAYOUT_PACKED;
    demo_data ref = { 0 };
    alloc_results(&c, &ref);
    run_result *rr = calloc(1, sizeof *rr);
    double one_s = 0, one_fb = 0;
    int bad = 0;
    if (lead && dense) {
        if (run_single(&c, &l, NULL, &in, &ref, rr, &dm, cores, !c.timing_only)) {
            fprintf(stderr, "single-rank run failed: %s\n", rr->error);
            return 1;
        }
        double f = median(rr->fwd_s, c.reps), b = median(rr->bwd_s, c.reps);
        one_s = median_step(rr, c.reps);
        one_fb = f + b;
        printf("%-10s %-10s %4s %7s  %9s %9s %9s %9s  %9s %9s %9s %7s %7s  %10s", "mode", "layout", "cp", "a2a*p2p",
               "err out", "err dq", "err dk", "err dv", "fwd ms", "bwd ms", "step ms", "vs cp1", "f+b/cp1",
               "ws/rank");
        if (c.memory)
            printf("  %9s %9s %6s", "peak MiB", "min MiB", "x min");
        if (c.cuda)
            printf("  %8s %8s", "host fwd", "host bwd");
        printf("\n%-10s %-10s %4d %7s  %9s %9s %9s %9s  %9.2f %9.2f %9.2f %7.3f %7.3f  %7.2f MiB", "(single)", "-", 1,
               "-", "-", "-", "-", "-", 1e3 * f, 1e3 * b, 1e3 * one_s, 1.0, 1.0, (double)rr->ws_bytes / 1048576.0);
        print_memory(&c, rr, 1, 1);
        print_host(&c, rr);
        printf("\n");
    }
    /* F32 differs from CP=1 only by fp32 rounding order; 16-bit types by
     * at most a few ulps of the storage type. */
    const double tol = c.dtype == CP_DTYPE_F32 ? 1e-4 : c.dtype == CP_DTYPE_F16 ? 1e-2 : 4e-2;
    static const char *mode_names[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };
    demo_data got = { 0 };
    alloc_results(&c, &got);
    for (int mode = 0; mode < 4; mode++)
        for (int layout = 0; layout < 2; layout++) {
            if ((c.only_mode >= 0 && mode != c.only_mode) || (c.only_layout >= 0 && layout != c.only_layout))
                continue;
            run_spec r = { (cp_mode)mode, (cp_layout)layout, c.cp, 1, NULL };
            if (mode == CP_MODE_A2A_P2P)
                r.A = hybrid_a2a(c.cp);
            char fact[16];
            snprintf(fact, sizeof fact, "%dx%d", mode == CP_MODE_A2A ? c.cp : r.A,
                     mode == CP_MODE_A2A ? 1 : c.cp / r.A);
            const char *ln = layout ? "zigzag" : "contiguous";
            if (run(&c, &l, &r, &in, &got, rr, &dm, cores, !c.timing_only)) {
                if (lead)
                    printf("%-10s %-10s %4d %7s  %s\n", mode_names[mode], ln, c.cp, fact, rr->error);
                if (rr->status != CP_ERROR_UNSUPPORTED)
                    bad++;
                continue;
            }
            if (!lead)
                continue;
            double f = median(rr->fwd_s, c.reps), b = median(rr->bwd_s, c.reps), st = median_step(rr, c.reps);
            char errs[64] = "        -         -         -         -";
            int ok = 1;
            if (!c.timing_only) {
                double e[4] = { max_rel(got.out, ref.out, c.dtype, nq), max_rel(got.dq, ref.dq, c.dtype, nq),
                                max_rel(got.dk, ref.dk, c.dtype, nk), max_rel(got.dv, ref.dv, c.dtype, nk) };
                ok = e[0] <= tol && e[1] <= tol && e[2] <= tol && e[3] <= tol;
                snprintf(errs, sizeof errs, "%9.2e %9.2e %9.2e %9.2e", e[0], e[1], e[2], e[3]);
            }
            bad += !ok;
            printf("%-10s %-10s %4d %7s  %s  %9.2f %9.2f %9.2f %7.3f %7.3f  %7.2f MiB", mode_names[mode], ln, c.cp,
                   fact, errs, 1e3 * f, 1e3 * b, 1e3 * st, st / one_s, (f + b) / one_fb,
                   (double)rr->ws_bytes / 1048576.0);
            print_memory(&c, rr, c.cp, mode == CP_MODE_P2P);
            print_host(&c, rr);
            printf("%s\n", ok ? "" : "  MISMATCH");
            fflush(stdout);
        }
    if (lead && dense) {
        /* The single-rank run once more: a GPU that clocks down as it warms
         * up would make the later CP runs look slower than they are; the
         * difference between the two single-rank runs shows how much. */
        if (run_single(&c, &l, NULL, &in, &got, rr, &dm, cores, 0) == 0) {
            double f = median(rr->fwd_s, c.reps), b = median(rr->bwd_s, c.reps), st = median_step(rr, c.reps);
            printf("%-10s %-10s %4d %7s  %9s %9s %9s %9s  %9.2f %9.2f %9.2f %7.3f %7.3f\n", "(single)", "again", 1, "-",
                   "-", "-", "-", "-", 1e3 * f, 1e3 * b, 1e3 * st, st / one_s, (f + b) / one_fb);
        }
    }
    if (packed)
        bad += packed_table(&c, &l, &in, &dm, cores, lead, tol);
    if (lead) {
        printf("\nfwd/bwd: median of %d repetitions after a warm-up, slowest rank, host clock after\n"
               "cp_context_synchronize; step: from the first rank's start of the forward to the last\n"
               "rank's end of the backward (ranks of this process; every repetition starts them together);\n"
               "vs cp1: step / step of the single-rank run; f+b/cp1: (fwd + bwd) / (fwd + bwd of the\n"
               "single-rank run), where the spread of the ranks' ends of the forward (ranks sharing a GPU\n"
               "end it one after another) counts in both phases; (single) again: the single-rank run\n"
               "repeated after the others, its ratios to the first (drift of the device's speed)\n",
               c.reps);
        if (c.cuda)
            printf("host fwd/bwd (ms): how long the slowest rank's call took to return, i.e. to queue its\n"
                   "work on the device (median); near fwd/bwd, the host is what the device waits for\n");
        if (c.memory)
            printf("peak: device memory in use (cudaMemGetInfo, sampled every 50 us while the ranks run)\n"
                   "above what the device held before they started, over the ranks sharing it; min: the\n"
                   "rank's q, k, v, out, lse, dout, dq, dk, dv shards + double buffers of the circulating\n"
                   "K, V (storage type) and dK, dV (fp32)\n");
        if (!c.timing_only) {
            printf("err: max |x - x_cp1| / max |x_cp1| over the whole tensor; tolerance %.0e\n", tol);
            printf("%s\n", bad ? "FAILED: some runs differ from the single-rank result"
                               : packed ? "all modes, layouts and packed rows match the single-rank result"
                                        : "all modes and layouts match the single-rank result");
        }
    }
    free(rr);
    free_results(&got);
    free_results(&ref);
    free(in.q);
    free(in.k);
    free(in.v);
    free(in.dout);
    free(in.sinks);
    launch_fini(&l);
    return bad ? 1 : 0;
}
