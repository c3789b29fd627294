/* SPDX-License-Identifier: MIT */
/*
 * Throughput of the CUDA backend's block attention (not a test): forward and
 * backward on random data, 16k tokens per call, FLOPs counted as
 * FlashAttention counts them (4 B H Sq Sk D forward, halved when causal;
 * backward 2.5x the forward). Each entry is the median of several timed runs
 * after a warm-up. Usage: bench-gpu [reps]
 * bench-gpu --csv [reps] times the shapes of bench/bench.sh instead (bf16,
 * head_dim 64 and 128, 2048 values per token, seq 1k to 32k at 16k tokens
 * per batch, causal and not; the attention path INFINICP_CUDA_ATTN names,
 * automatic by default) and prints one CSV line per shape and variant:
 * impl,head_dim,seq,batch,heads,causal,fwd_tflops,bwd_tflops
 * with impl "infinicp" (the default backward, dQ added with atomics) and
 * "infinicp-det" (cp_context_config.deterministic = 1).
 * BENCH_FP8=1 adds "infinicp-fp8": the same shapes' forward with q, k, v in
 * FP8 E4M3 (values in [-1, 1], descales of 1) and the output in BF16
 * (bwd_tflops 0: FP8 is forward only); its bf16 row is the one above it.
 * With --csv, BENCH_DIMS=D[/Dv][,...] adds head dims to 64 and 128 (e.g.
 * 256,192/128: head_dim 256 with 8 heads, MLA's q / k 192 and v 128 with 16;
 * 2048 / Dv heads, FLOPs 2 B H S^2 (D + Dv), halved when causal),
 * BENCH_SHAPES=D:S:causal[,...] keeps only the shapes it lists
 * (e.g. 128:4096:0), and BENCH_RING=1 makes every call one of the CP ring's:
 * the forward merges into an F32 running output (accumulate, as every ring
 * step after the first), the backward adds into F32 dQ / dK / dV sums and
 * reads rowsum(dO * O) stored by the warm-up call.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/context.h"

static const cp_backend_ops *ops;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *dev(void *st, size_t bytes)
{
    void *p;
    if (ops->alloc(st, bytes, &p) != CP_SUCCESS) {
        fprintf(stderr, "alloc: %s\n", cp_last_error());
        exit(1);
    }
    return p;
}

/* Random values in [-1, 1] of type t (bf16 / f16 as raw bits via f32). */
static void *random_buffer(void *st, size_t n, cp_dtype t, uint64_t seed)
{
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        h[i] = (float)((double)(seed >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
    }
    void *f = dev(st, n * 4), *out = dev(st, n * (t == CP_DTYPE_F32 ? 4 : 2));
    ops->copy_2d(st, f, n * 4, h, n * 4, n * 4, 1, CP_COPY_HOST_TO_DEVICE);
    ops->convert(st, out, t, f, CP_DTYPE_F32, n);
    ops->synchronize(st);
    ops->free(st, f);
    free(h);
    return out;
}

typedef struct shape {
    int B, H, D;
    int64_t S;
    int causal;
    int Dv; /* 0: D */
} shape;

static double time_call(void *st, int backward, cp_kernel_attn_args *a, int reps)
{
    double t[32];
    for (int r = -1; r < reps; r++) {
        double t0 = now();
        cp_status s = backward ? ops->attn_backward(st, a) : ops->attn_forward(st, a);
        if (s == CP_SUCCESS)
            s = ops->synchronize(st);
        if (s != CP_SUCCESS) {
            fprintf(stderr, "%s: %s\n", backward ? "backward" : "forward", cp_last_error());
            exit(1);
        }
        if (r >= 0)
            t[r] = now() - t0;
        if (backward && a->drow)
            a->drow_ready = 1; /* later calls read what the warm-up stored */
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

static int csv;      /* print CSV lines instead of the readable report */
static int fwd_only; /* time the forward alone */
static int ring;     /* BENCH_RING: the CP ring's F32 accumulating calls */
static float *drow;  /* BENCH_RING: rowsum(dO * O), stored by the warm-up call */

static void run(void *st, const char *path, cp_dtype dt, const shape *sh, void *q, void *k, void *v, void *o,
                void *dout, void *dq, void *dk, void *dv, float *lse, int reps)
{
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = dt;
    a.format = CP_FORMAT_BSHD;
    a.batch = sh->B;
    a.num_heads = a.num_kv_heads = sh->H;
    const int Dv = sh->Dv ? sh->Dv : sh->D;
    a.head_dim = sh->D;
    a.head_dim_v = Dv;
    a.seq_q = a.seq_k = sh->S;
    a.mask = sh->causal ? CP_MASK_CAUSAL : CP_MASK_NONE;
    a.softmax_scale = 1.0 / sqrt((double)sh->D);
    a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
    a.o_dtype = a.grad_dtype = dt == CP_DTYPE_FP8_E4M3 ? CP_DTYPE_BF16 : dt;
    if (ring) {
        a.o_dtype = a.grad_dtype = CP_DTYPE_F32;
        a.accumulate = a.grad_accumulate = 1;
        a.drow = drow;
    }
    size_t wf = 0, wb = 0;
    ops->attn_workspace_size(st, &a, 0, &wf);
    ops->attn_workspace_size(st, &a, 1, &wb);
    void *ws = dev(st, (wf > wb ? wf : wb) + 1);
    a.workspace = ws;
    a.workspace_bytes = wf > wb ? wf : wb;
    double flops = 2.0 * sh->B * sh->H * (double)sh->S * (double)sh->S * (sh->D + Dv) * (sh->causal ? 0.5 : 1.0);
    if (ring) {
        /* a first step writes the running output and LSE, which the timed
         * calls then merge into */
        a.accumulate = 0;
        if (ops->attn_forward(st, &a) != CP_SUCCESS || ops->synchronize(st) != CP_SUCCESS) {
            fprintf(stderr, "forward: %s\n", cp_last_error());
            exit(1);
        }
        a.accumulate = 1;
    }
    double tf = time_call(st, 0, &a, reps), tb = INFINITY;
    if (!fwd_only && dt != CP_DTYPE_FP8_E4M3) {
        a.o_dtype = dt; /* the backward reads the final output (storage type) */
        tb = time_call(st, 1, &a, reps);
    }
    if (csv) {
        char dims[24];
        snprintf(dims, sizeof dims, Dv == sh->D ? "%d" : "%d/%d", sh->D, Dv);
        printf("%s,%s,%lld,%d,%d,%d,%.2f,%.2f\n",
               !strcmp(path, "mma-det")    ? "infinicp-det"
               : !strcmp(path, "fp8")      ? "infinicp-fp8"
               : !strcmp(path, "mma-w8")   ? "infinicp-w8"
               : !strcmp(path, "mma-sync") ? "infinicp-mma"
                                           : "infinicp",
               dims,
               (long long)sh->S, sh->B, sh->H, sh->causal, flops / tf * 1e-12, 2.5 * flops / tb * 1e-12);
        fflush(stdout);
        ops->free(st, ws);
        return;
    }
    printf("%-8s %-5s B=%d H=%-2d D=%-3d Dv=%-3d S=%-6lld %-6s fwd %8.3f ms %7.1f TFLOP/s   bwd %8.3f ms %7.1f TFLOP/s\n",
           path,
           dt == CP_DTYPE_BF16  ? "bf16"
           : dt == CP_DTYPE_F16 ? "f16"
           : dt == CP_DTYPE_F32 ? "f32"
                                : "fp8",
           sh->B, sh->H, sh->D, Dv,
           (long long)sh->S, sh->causal ? "causal" : "full", tf * 1e3, flops / tf * 1e-12, tb * 1e3,
           2.5 * flops / tb * 1e-12);
    fflush(stdout);
    ops->free(st, ws);
}

/* Whether D:S:causal is one of the comma-separated entries of list. */
static int listed(const char *list, int D, int64_t S, int causal)
{
    for (const char *e = list; e && *e; e = strchr(e, ',') ? strchr(e, ',') + 1 : NULL) {
        int d, c;
        long long s;
        if (sscanf(e, "%d:%lld:%d", &d, &s, &c) == 3 && d == D && s == S && c == causal)
            return 1;
    }
    return 0;
}

static void *open_path(const char *path)
{
    if (path)
        setenv("INFINICP_CUDA_ATTN", path, 1);
    else
        unsetenv("INFINICP_CUDA_ATTN");
    void *st = NULL;
    if (ops->open(0, NULL, 0, &st) != CP_SUCCESS) {
        fprintf(stderr, "open: %s\n", cp_last_error());
        exit(1);
    }
    return st;
}

int main(int argc, char **argv)
{
    csv = argc > 1 && !strcmp(argv[1], "--csv");
    if (csv)
        argc--, argv++;
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1 || reps > 32)
        reps = 5;
    if (cpi_backend_for(CP_DEVICE_CUDA, &ops) != CP_SUCCESS) {
        fprintf(stderr, "no CUDA module: %s\n", cp_last_error());
        return 1;
    }
    /* the automatic choice, or for --csv the path INFINICP_CUDA_ATTN names */
    char want[16] = "";
    if (csv && getenv("INFINICP_CUDA_ATTN"))
        snprintf(want, sizeof want, "%s", getenv("INFINICP_CUDA_ATTN"));
    void *st = open_path(want[0] ? want : NULL), *blas = open_path("cublas"), *simt = open_path("simt");
    void *mma = open_path("mma"), *wgmma = open_path("wgmma");
    setenv("INFINICP_CUDA_WGMMA_WS", "0", 1);
    void *wgcp = open_path("wgmma");
    unsetenv("INFINICP_CUDA_WGMMA_WS");
    setenv("INFINICP_CUDA_BWD_WARPS", "8", 1);
    void *w8 = open_path(want[0] ? want : NULL);
    unsetenv("INFINICP_CUDA_BWD_WARPS");
    void *det = open_path(want[0] ? want : NULL);
    if (!CP_BACKEND_HAS(ops, set_deterministic) || ops->set_deterministic(det, 1) != CP_SUCCESS) {
        fprintf(stderr, "set_deterministic: not available\n");
        return 1;
    }
    setenv("INFINICP_CUDA_FWD_MT", "1", 1);
    void *mt1 = open_path("mma");
    unsetenv("INFINICP_CUDA_FWD_MT");
    /* 16k tokens x 2048 values, every shape below; 32k x 3072 for the CSV
     * shapes (q / k of MLA's 192 with 16 heads) */
    const size_t n = csv ? (size_t)32768 * 3072 : (size_t)16384 * 16 * 128;
    void *q = random_buffer(st, n, CP_DTYPE_BF16, 1), *k = random_buffer(st, n, CP_DTYPE_BF16, 2);
    void *v = random_buffer(st, n, CP_DTYPE_BF16, 3), *dout = random_buffer(st, n, CP_DTYPE_BF16, 4);
    /* room for F32 outputs and gradients (BENCH_RING) */
    void *o = dev(st, n * 4), *dq = dev(st, n * 4), *dk = dev(st, n * 4), *dv = dev(st, n * 4);
    float *lse = dev(st, (size_t)32768 * 32 * 4);
    void *q8 = NULL, *k8 = NULL, *v8 = NULL;
    if (csv && getenv("BENCH_FP8") && atoi(getenv("BENCH_FP8"))) {
        /* E4M3 codes of values in [-1, 1]: exponent fields up to 1.0's */
        uint8_t *h = malloc(n);
        uint64_t seed = 9;
        void **bufs[3] = {&q8, &k8, &v8};
        for (int t = 0; t < 3; t++) {
            for (size_t i = 0; i < n; i++) {
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                h[i] = (uint8_t)((seed >> 20) % 0x39 | ((seed >> 40) & 0x80));
            }
            *bufs[t] = dev(st, n);
            ops->copy_2d(st, *bufs[t], n, h, n, n, 1, CP_COPY_HOST_TO_DEVICE);
        }
        ops->synchronize(st);
        free(h);
    }
    if (csv) {
        fwd_only = getenv("BENCH_FWD_ONLY") != NULL;
        ring = getenv("BENCH_RING") && atoi(getenv("BENCH_RING"));
        drow = ring ? dev(st, (size_t)32768 * 32 * 4) : NULL;
        const char *only = getenv("BENCH_SHAPES");
        /* head dims (q / k, v): 64 and 128, then what BENCH_DIMS adds */
        int dims[8][2] = {{64, 64}, {128, 128}}, nd = 2;
        for (const char *e = getenv("BENCH_DIMS"); e && *e && nd < 8; e = strchr(e, ',') ? strchr(e, ',') + 1 : NULL) {
            int qk, vd;
            const int got = sscanf(e, "%d/%d", &qk, &vd);
            if (got >= 1 && qk >= 8 && qk <= 256 && (got == 1 || (vd >= 8 && vd <= 256)))
                dims[nd][0] = qk, dims[nd][1] = got == 2 ? vd : qk, nd++;
        }
        for (int di = 0; di < nd; di++)
            for (int64_t S = 1024; S <= 32768; S *= 2)
                for (int causal = 0; causal < 2; causal++) {
                    const int D = dims[di][0], Dv = dims[di][1];
                    const shape sh = { S < 16384 ? (int)(16384 / S) : 1, 2048 / Dv, D, S, causal, Dv };
                    if (only && !listed(only, D, S, causal))
                        continue;
                    run(st, "mma", CP_DTYPE_BF16, &sh, q, k, v, o, dout, dq, dk, dv, lse, reps);
                    if (q8)
                        run(st, "fp8", CP_DTYPE_FP8_E4M3, &sh, q8, k8, v8, o, dout, dq, dk, dv, lse, reps);
                    /* BENCH_FWD_ONLY: the forward alone (bwd_tflops 0); BENCH_RING: the default kernels only */
                    if (fwd_only || ring)
                        continue;
                    run(det, "mma-det", CP_DTYPE_BF16, &sh, q, k, v, o, dout, dq, dk, dv, lse, reps);
                    if (getenv("BENCH_MMA")) /* comparison: mma.sync kernels also on Hopper */
                        run(mma, "mma-sync", CP_DTYPE_BF16, &sh, q, k, v, o, dout, dq, dk, dv, lse, reps);
                    if (getenv("BENCH_W8")) /* tuning: the atomic backward with 8-warp blocks */
                        run(w8, "mma-w8", CP_DTYPE_BF16, &sh, q, k, v, o, dout, dq, dk, dv, lse, reps);
                }
        return 0;
    }
    const shape shapes[] = {
        {4, 16, 128, 4096, 0, 0}, {4, 16, 128, 4096, 1, 0}, {2, 16, 128, 8192, 1, 0}, {1, 16, 128, 16384, 0, 0},
        {1, 16, 128, 16384, 1, 0}, {4, 32, 64, 4096, 1, 0},  {1, 32, 64, 16384, 1, 0}, {4, 8, 256, 4096, 1, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        run(st, "auto", CP_DTYPE_BF16, &shapes[i], q, k, v, o, dout, dq, dk, dv, lse, reps);
        run(det, "mma-det", CP_DTYPE_BF16, &shapes[i], q, k, v, o, dout, dq, dk, dv, lse, reps);
    }
    /* the forward on mma.sync and on wgmma (Hopper; elsewhere mma.sync again),
     * there with the TMA loader and with the cp.async kernel */
    fwd_only = 1;
    for (size_t i = 0; i < 7; i++) {
        run(mma, "mma", CP_DTYPE_BF16, &shapes[i], q, k, v, o, dout, dq, dk, dv, lse, reps);
        run(wgmma, "wgmma", CP_DTYPE_BF16, &shapes[i], q, k, v, o, dout, dq, dk, dv, lse, reps);
        run(wgcp, "wgmma-cp", CP_DTYPE_BF16, &shapes[i], q, k, v, o, dout, dq, dk, dv, lse, reps);
    }
    fwd_only = 0;
    /* the forward with one row tile per warp, for comparison */
    run(mt1, "mma-mt1", CP_DTYPE_BF16, &shapes[1], q, k, v, o, dout, dq, dk, dv, lse, reps);
    run(mt1, "mma-mt1", CP_DTYPE_BF16, &shapes[4], q, k, v, o, dout, dq, dk, dv, lse, reps);
    run(mt1, "mma-mt1", CP_DTYPE_BF16, &shapes[6], q, k, v, o, dout, dq, dk, dv, lse, reps);
    const shape small = {1, 16, 128, 4096, 1, 0};
    run(blas, "cublas", CP_DTYPE_BF16, &small, q, k, v, o, dout, dq, dk, dv, lse, reps);
    run(simt, "simt", CP_DTYPE_BF16, &small, q, k, v, o, dout, dq, dk, dv, lse, 3);
    /* F32 (exact path): the bf16 buffers reinterpreted hold half as many floats */
    const shape f32 = {1, 8, 128, 4096, 1, 0};
    void *qf = random_buffer(st, n / 2, CP_DTYPE_F32, 5), *kf = random_buffer(st, n / 2, CP_DTYPE_F32, 6);
    void *vf = random_buffer(st, n / 2, CP_DTYPE_F32, 7), *df = random_buffer(st, n / 2, CP_DTYPE_F32, 8);
    run(st, "simt", CP_DTYPE_F32, &f32, qf, kf, vf, o, df, dq, dk, dv, lse, 3);
    run(blas, "cublas", CP_DTYPE_F32, &f32, qf, kf, vf, o, df, dq, dk, dv, lse, 3);
    return 0;
}
