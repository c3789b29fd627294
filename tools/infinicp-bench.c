/* SPDX-License-Identifier: MIT */
/* infinicp-bench: the demo and benchmark program of libinfinicp. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinicp/infinicp.h>

#include "bench.h"
#include "kernel_bench.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: infinicp-bench [options]\n"
            "\n"
            "Without a mode option: the demo. CP attention on in-process ranks (threads) on the\n"
            "CPU, for every mode and layout, each checked against a single-rank run.\n"
            "\n"
            "modes:\n"
            "  --backends        print the library version and the backends that can be opened\n"
            "  --version         print the library version\n"
            "  --kernel ...      time the single-device CPU kernels against OpenBLAS sgemm\n"
            "                    (--kernel --help lists its options)\n"
            "options:\n"
            "  --cp N            CP group size (default 4)\n"
            "  --seq N           global sequence length (default 2048)\n"
            "  --batch N         batch size (default 1)\n"
            "  --heads N         query heads (default 8)\n"
            "  --kv-heads N      key/value heads (default 4)\n"
            "  --dim N           head dimension (default 64)\n"
            "  --dtype T         f32, f16 or bf16 (default f32)\n"
            "  --no-mask         attend to every key (default causal)\n");
}

static int show_backends(void)
{
    unsigned v = cp_version();
    printf("libinfinicp %u.%u.%u (header %d.%d.%d)\n", v / 10000, v / 100 % 100, v % 100,
           CP_VERSION_MAJOR, CP_VERSION_MINOR, CP_VERSION_PATCH);
    printf("%-8s %-10s %s\n", "backend", "status", "detail");
    static const struct {
        cp_device device;
        const char *name;
    } devs[] = {{CP_DEVICE_CPU, "cpu"}, {CP_DEVICE_CUDA, "cuda"}};
    int ok = 0;
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) {
        cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
        cfg.device = devs[i].device;
        cp_context *ctx = NULL;
        cp_status s = cp_context_create(&cfg, &ctx);
        if (s == CP_SUCCESS) {
            printf("%-8s %-10s %s\n", devs[i].name, "available", "device 0 opened");
            ok++;
        } else {
            printf("%-8s %-10s %s: %s\n", devs[i].name, "absent", cp_status_string(s), cp_last_error());
        }
        cp_context_destroy(ctx);
    }
    return ok > 0 ? 0 : 1;
}

static int parse_int(const char *opt, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || *end || v < lo || v > hi) {
        fprintf(stderr, "infinicp-bench: %s needs a whole number in [%lld, %lld]\n", opt, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    bench_opts o = { 1, 2048, 8, 4, 64, CP_DTYPE_F32, CP_MASK_CAUSAL, 4 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        long long v;
        if (!strcmp(a, "--kernel"))
            return kernel_bench_main(argc - i - 1, argv + i + 1, usage);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            unsigned ver = cp_version();
            printf("%u.%u.%u\n", ver / 10000, ver / 100 % 100, ver % 100);
            return 0;
        } else if (!strcmp(a, "--backends")) {
            return show_backends();
        } else if (!strcmp(a, "--no-mask")) {
            o.mask = CP_MASK_NONE;
        } else if (!strcmp(a, "--dtype")) {
            if (!val || (strcmp(val, "f32") && strcmp(val, "f16") && strcmp(val, "bf16"))) {
                fprintf(stderr, "infinicp-bench: --dtype takes f32, f16 or bf16\n");
                return 2;
            }
            o.dtype = !strcmp(val, "f32") ? CP_DTYPE_F32 : !strcmp(val, "f16") ? CP_DTYPE_F16 : CP_DTYPE_BF16;
            i++;
        } else if (!strcmp(a, "--cp") || !strcmp(a, "--seq") || !strcmp(a, "--batch") || !strcmp(a, "--heads") ||
                   !strcmp(a, "--kv-heads") || !strcmp(a, "--dim")) {
            long long hi = !strcmp(a, "--cp") ? 64 : !strcmp(a, "--seq") ? (1ll << 30) : 1 << 16;
            if (parse_int(a, val, 1, hi, &v))
                return 2;
            if (!strcmp(a, "--cp"))
                o.cp = (int)v;
            else if (!strcmp(a, "--seq"))
                o.seq = v;
            else if (!strcmp(a, "--batch"))
                o.batch = v;
            else if (!strcmp(a, "--heads"))
                o.heads = (int)v;
            else if (!strcmp(a, "--kv-heads"))
                o.kv_heads = (int)v;
            else
                o.dim = (int)v;
            i++;
        } else {
            fprintf(stderr, "infinicp-bench: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    return bench_demo(&o);
}
