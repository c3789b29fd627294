/* SPDX-License-Identifier: MIT */
/*
 * infinicp-bench --kernel: GFLOP/s of cp_kernel_attn_forward and
 * cp_kernel_attn_backward on the CPU, beside the machine's single-precision
 * GEMM rate (OpenBLAS sgemm, same number of threads) measured in the same run.
 *
 * FP8 E4M3 (--dtype fp8, API 1.2) times the forward alone (FP8 has no
 * backward), with per-tensor descales and a BF16 output.
 *
 * FLOPs counted: forward 4 * B * H * Sq * Sk * D (Q K^T and P V), halved for
 * the causal mask, or with a sliding window 4 * B * H * D per visible pair;
 * backward 2.5 times the forward (Q K^T recomputed, dP, dV, dQ, dK). Softmax
 * (and softcap) work is not counted.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infinicp/infinicp.h>

#include "kernel_bench.h"

#ifdef INFINICP_BENCH_OPENBLAS
#include <cblas.h>
#endif

typedef struct {
    int64_t batch, seq;
    int heads, kv_heads, dim, threads, reps;
    cp_dtype dtype;
    int masks; /* bit 0: none, bit 1: causal */
    int64_t window;
    double softcap;
} options;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int parse_int(const char *opt, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > hi) {
        fprintf(stderr, "infinicp-bench: %s needs an integer in [%lld, %lld], got '%s'\n", opt, lo, hi,
                v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

static void kernel_usage(FILE *f)
{
    fprintf(f, "usage: infinicp-bench --kernel [options]\n\n"
               "Times cp_kernel_attn_forward and cp_kernel_attn_backward on the CPU, beside\n"
               "OpenBLAS sgemm with as many threads.\n\n"
               "options:\n"
               "  --dtype T     f32, f16, bf16 or fp8 (E4M3, forward only; default f32)\n"
               "  --mask M      causal, none or both (default both)\n"
               "  --batch N     batch size (default 1)\n"
               "  --seq N       sequence length, queries and keys (default 4096)\n"
               "  --heads N     query heads (default 8)\n"
               "  --kv-heads N  key/value heads (default: --heads)\n"
               "  --dim N       head dimension (default 128)\n"
               "  --threads N   threads of the context (default: every core)\n"
               "  --reps N      timed repetitions after one warm-up, best shown (default 3)\n"
               "  --window W    sliding window (default 0 = none); GFLOP/s count visible pairs\n"
               "  --softcap C   logit softcap (default 0 = none)\n");
}

/* 0: run; 1: --help was printed; -1: a bad option. */
static int parse(int argc, char **argv, options *o)
{
    *o = (options){.batch = 1, .seq = 4096, .heads = 8, .kv_heads = 0, .dim = 128, .threads = 0, .reps = 3,
                   .dtype = CP_DTYPE_F32, .masks = 3};
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(opt, "--help")) {
            kernel_usage(stdout);
            return 1;
        }
        if (!strcmp(opt, "--dtype")) {
            if (!v || (strcmp(v, "f32") && strcmp(v, "f16") && strcmp(v, "bf16") && strcmp(v, "fp8"))) {
                fprintf(stderr, "infinicp-bench: --dtype must be f32, f16, bf16 or fp8\n");
                return -1;
            }
            o->dtype = !strcmp(v, "f32")   ? CP_DTYPE_F32
                       : !strcmp(v, "f16") ? CP_DTYPE_F16
                       : !strcmp(v, "fp8") ? CP_DTYPE_FP8_E4M3
                                           : CP_DTYPE_BF16;
        } else if (!strcmp(opt, "--mask")) {
            if (!v || (strcmp(v, "causal") && strcmp(v, "none") && strcmp(v, "both"))) {
                fprintf(stderr, "infinicp-bench: --mask must be causal, none or both\n");
                return -1;
            }
            o->masks = !strcmp(v, "none") ? 1 : !strcmp(v, "causal") ? 2 : 3;
        } else if (!strcmp(opt, "--batch")) {
            if (parse_int(opt, v, 1, 1 << 20, &x)) return -1;
            o->batch = x;
        } else if (!strcmp(opt, "--seq")) {
            if (parse_int(opt, v, 1, 1 << 24, &x)) return -1;
            o->seq = x;
        } else if (!strcmp(opt, "--heads")) {
            if (parse_int(opt, v, 1, 1 << 16, &x)) return -1;
            o->heads = (int)x;
        } else if (!strcmp(opt, "--kv-heads")) {
            if (parse_int(opt, v, 1, 1 << 16, &x)) return -1;
            o->kv_heads = (int)x;
        } else if (!strcmp(opt, "--dim")) {
            if (parse_int(opt, v, 1, 4096, &x)) return -1;
            o->dim = (int)x;
        } else if (!strcmp(opt, "--threads")) {
            if (parse_int(opt, v, 0, 4096, &x)) return -1;
            o->threads = (int)x;
        } else if (!strcmp(opt, "--reps")) {
            if (parse_int(opt, v, 1, 1000, &x)) return -1;
            o->reps = (int)x;
        } else if (!strcmp(opt, "--window")) {
            if (parse_int(opt, v, 0, INT64_MAX, &x)) return -1;
            o->window = x;
        } else if (!strcmp(opt, "--softcap")) {
            char *end;
            o->softcap = v ? strtod(v, &end) : -1;
            if (!v || *end || !(o->softcap >= 0 && o->softcap < 1e30)) {
                fprintf(stderr, "infinicp-bench: --softcap needs a number >= 0, got '%s'\n", v ? v : "");
                return -1;
            }
        } else {
            fprintf(stderr, "infinicp-bench: unknown option '%s'\n", opt);
            return -1;
        }
        i++;
    }
    if (!o->kv_heads)
        o->kv_heads = o->heads;
    if (o->heads % o->kv_heads) {
        fprintf(stderr, "infinicp-bench: --kv-heads %d does not divide --heads %d\n", o->kv_heads, o->heads);
        return -1;
    }
    return 0;
}

/* Best sgemm rate over a few square sizes (sizes that are not powers of two:
 * those hit cache-set conflicts in some BLAS builds and would flatter us). */
static double sgemm_gflops(int threads)
{
#ifdef INFINICP_BENCH_OPENBLAS
    openblas_set_num_threads(threads);
    const int sizes[] = {1000, 2000, 3000};
    double best = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        size_t nn = (size_t)n * (size_t)n;
        float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float)), *c = malloc(nn * sizeof(float));
        if (!a || !b || !c) {
            free(a), free(b), free(c);
            return 0;
        }
        for (size_t i = 0; i < nn; i++) {
            a[i] = (float)((i * 7919u) % 1000) * 1e-3f;
            b[i] = (float)((i * 104729u) % 1000) * 1e-3f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        for (int r = 0; r < 3; r++) {
            double t = now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            t = now() - t;
            double g = 2.0 * n * (double)n * n / t * 1e-9;
            if (g > best)
                best = g;
        }
        free(a), free(b), free(c);
    }
    return best;
#else
    (void)threads;
    return 0;
#endif
}

static size_t dsize(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? 4 : t == CP_DTYPE_FP8_E4M3 ? 1 : 2;
}

/* f in [-1, 1) to binary16 by truncation (tiny values become 0). */
static uint16_t to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (fabsf(f) < 6.2e-5f)
        return sign;
    return sign | (uint16_t)((((u >> 23) & 0xffu) - 112u) << 10) | (uint16_t)((u >> 13) & 0x3ffu);
}

/* Random values in [-1, 1) in the storage type (16-bit ones by truncation:
 * they only need to be plausible). */
static void *random_tensor(size_t n, cp_dtype t, unsigned seed)
{
    void *p = malloc(n * dsize(t));
    if (!p)
        return NULL;
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        float f = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        if (t == CP_DTYPE_F32)
            ((float *)p)[i] = f;
        else if (t == CP_DTYPE_FP8_E4M3) /* sign, exponent 3 .. 7 (1/16 .. 2), mantissa: never NaN */
            ((uint8_t *)p)[i] = (uint8_t)((x >> 24 & 0x87u) | ((x >> 8) % 5u + 3u) << 3);
        else if (t == CP_DTYPE_BF16)
            ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        else
            ((uint16_t *)p)[i] = to_f16(f);
    }
    return p;
}

/* Query-key pairs counted: S^2 (halved under the causal mask), or with a
 * window the pairs it leaves visible. */
static double visible_pairs(int64_t S, int causal, int64_t W)
{
    if (!W)
        return (double)S * (double)S * (causal ? 0.5 : 1.0);
    double n = 0;
    for (int64_t i = 0; i < S; i++) {
        int64_t lo = i - W + 1 > 0 ? i - W + 1 : 0, hi = causal ? i + 1 : (S - i > W ? i + W : S);
        n += (double)(hi - lo);
    }
    return n;
}

static int run(cp_context *ctx, const options *o, double sgemm, int threads)
{
    int64_t B = o->batch, S = o->seq;
    int H = o->heads, Hk = o->kv_heads, D = o->dim;
    size_t nq = (size_t)(B * S * H * D), nk = (size_t)(B * S * Hk * D), nl = (size_t)(B * H * S);
    void *q = random_tensor(nq, o->dtype, 1), *k = random_tensor(nk, o->dtype, 2),
         *v = random_tensor(nk, o->dtype, 3), *dout = random_tensor(nq, o->dtype, 4);
    /* an FP8 forward writes BF16 */
    const cp_dtype ot = o->dtype == CP_DTYPE_FP8_E4M3 ? CP_DTYPE_BF16 : o->dtype;
    static const float descale = 0.5f;
    void *out = malloc(nq * dsize(ot)), *dq = malloc(nq * dsize(o->dtype)),
         *dk = malloc(nk * dsize(o->dtype)), *dv = malloc(nk * dsize(o->dtype));
    float *lse = malloc(nl * sizeof(float));
    int rc = 0;
    void *ws = NULL;
    if (!q || !k || !v || !dout || !out || !dq || !dk || !dv || !lse) {
        fprintf(stderr, "infinicp-bench: out of memory\n");
        rc = 1;
        goto done;
    }
    const char *dn = o->dtype == CP_DTYPE_F32   ? "F32"
                     : o->dtype == CP_DTYPE_F16 ? "F16"
                     : o->dtype == CP_DTYPE_BF16 ? "BF16"
                                                 : "FP8_E4M3 (descales 0.5, out BF16)";
    printf("attention kernels: batch %lld, heads %d (kv %d), seq %lld, head_dim %d, %s, %d thread%s", (long long)B,
           H, Hk, (long long)S, D, dn, threads, threads == 1 ? "" : "s");
    if (o->window)
        printf(", window %lld", (long long)o->window);
    if (o->softcap != 0)
        printf(", softcap %g", o->softcap);
    printf("\n");
    if (sgemm > 0)
        printf("sgemm (OpenBLAS, %d thread%s, best of n = 1000, 2000, 3000): %.1f GFLOP/s\n", threads,
               threads == 1 ? "" : "s", sgemm);
    else
        printf("sgemm: not measured (built without OpenBLAS)\n");
    printf("%-7s %-9s %10s %10s %9s %12s\n", "mask", "pass", "time ms", "GFLOP/s", "/ sgemm", "workspace");

    for (int m = 0; m < 2; m++) {
        if (!(o->masks & (1 << m)))
            continue;
        cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
        a.dtype = o->dtype;
        a.format = CP_FORMAT_BSHD;
        a.batch = B;
        a.num_heads = H;
        a.num_kv_heads = Hk;
        a.head_dim = D;
        a.seq_q = a.seq_k = S;
        a.mask = m ? CP_MASK_CAUSAL : CP_MASK_NONE;
        a.q = q, a.k = k, a.v = v, a.o = out, a.o_dtype = ot, a.lse = lse;
        if (o->dtype == CP_DTYPE_FP8_E4M3)
            a.q_descale = a.k_descale = a.v_descale = &descale;
        a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv, a.grad_dtype = o->dtype;
        a.window = o->window;
        a.softcap = o->softcap;
        double fwd_flops = 4.0 * (double)B * H * D * visible_pairs(S, m, o->window);
        for (int pass = 0; pass < (o->dtype == CP_DTYPE_FP8_E4M3 ? 1 : 2); pass++) {
            size_t bytes;
            cp_status st = cp_kernel_attn_workspace_size(ctx, &a, pass, &bytes);
            free(ws);
            ws = st == CP_SUCCESS ? malloc(bytes ? bytes : 1) : NULL;
            if (!ws) {
                fprintf(stderr, "infinicp-bench: workspace: %s\n", st ? cp_last_error() : "out of memory");
                rc = 1;
                goto done;
            }
            a.workspace = ws;
            a.workspace_bytes = bytes;
            double best = INFINITY;
            for (int r = 0; r < o->reps + 1; r++) { /* the first run warms up */
                double t = now();
                st = pass ? cp_kernel_attn_backward(ctx, &a) : cp_kernel_attn_forward(ctx, &a);
                t = now() - t;
                if (st != CP_SUCCESS) {
                    fprintf(stderr, "infinicp-bench: %s\n", cp_last_error());
                    rc = 1;
                    goto done;
                }
                if (r > 0 && t < best)
                    best = t;
            }
            double flops = fwd_flops * (pass ? 2.5 : 1.0), g = flops / best * 1e-9;
            char ratio[16] = "-";
            if (sgemm > 0)
                snprintf(ratio, sizeof ratio, "%.0f%%", 100.0 * g / sgemm);
            printf("%-7s %-9s %10.1f %10.1f %9s %9.1f MiB\n", m ? "causal" : "none", pass ? "backward" : "forward",
                   best * 1e3, g, ratio, (double)bytes / 1048576.0);
        }
    }
done:
    free(ws);
    free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv), free(lse);
    return rc;
}

int kernel_bench_main(int argc, char **argv, void (*usage)(FILE *))
{
    options o;
    int pr = parse(argc, argv, &o);
    if (pr < 0) {
        usage(stderr);
        return 2;
    }
    if (pr > 0)
        return 0;
    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.num_threads = o.threads;
    cp_context *ctx;
    if (cp_context_create(&cfg, &ctx) != CP_SUCCESS) {
        fprintf(stderr, "infinicp-bench: cp_context_create: %s\n", cp_last_error());
        return 1;
    }
    int threads = o.threads;
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    int rc = run(ctx, &o, sgemm_gflops(threads), threads);
    cp_context_destroy(ctx);
    return rc;
}
