/* SPDX-License-Identifier: MIT */
/* infinicp-bench: the demo and benchmark program of libinfinicp. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinicp/infinicp.h>

#include "kernel_bench.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: infinicp-bench [--version] [--help]\n"
            "       infinicp-bench --kernel [--batch N] [--heads N] [--kv-heads N] [--seq N]\n"
            "                      [--dim N] [--dtype f32|f16|bf16] [--mask causal|none|both]\n"
            "                      [--threads N] [--reps N]\n"
            "\n"
            "Without options: print the library version and the device backends\n"
            "that can be opened on this machine.\n"
            "--kernel: time the single-device attention kernels on the CPU and\n"
            "compare their GFLOP/s with OpenBLAS sgemm on the same threads\n"
            "(defaults: batch 1, 8 heads, seq 4096, dim 128, f32, both masks,\n"
            "one thread per processor, best of 3).\n");
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

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernel"))
            return kernel_bench_main(argc - i - 1, argv + i + 1, usage);
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) {
            unsigned v = cp_version();
            printf("%u.%u.%u\n", v / 10000, v / 100 % 100, v % 100);
            return 0;
        }
        fprintf(stderr, "infinicp-bench: unknown option '%s'\n", argv[i]);
        usage(stderr);
        return 2;
    }
    return show_backends();
}
