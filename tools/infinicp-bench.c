/* SPDX-License-Identifier: MIT */
/* infinicp-bench: the demo and benchmark program of libinfinicp. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinicp/infinicp.h>

#include "bench.h"
#include "kernel_bench.h"
#include "pack_bench.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: infinicp-bench [options]\n"
            "\n"
            "Without a mode option: the demo and CP benchmark. CP attention for every mode and\n"
            "layout, timed and checked against a single-rank run; ranks are threads of this\n"
            "process, or processes with --transport nccl-file.\n"
            "\n"
            "modes:\n"
            "  --backends        print the library version and the backends that can be opened\n"
            "  --version         print the library version\n"
            "  --kernel ...      time the single-device CPU kernels against OpenBLAS sgemm\n"
            "                    (--kernel --help lists its options)\n"
            "  --pack ...        how the cp_pack policies split packed documents: work\n"
            "                    imbalance, padding and ring traffic per mix and CP size\n"
            "                    (options: --tokens N, --mask causal|none, --window W,\n"
            "                    --chunk C, --cp P, --mix NAME, --kv-heads N, --dim N)\n"
            "options:\n"
            "  --cp N            CP group size (default 4)\n"
            "  --seq N           global sequence length (default 2048)\n"
            "  --batch N         batch size (default 1)\n"
            "  --heads N         query heads (default 8)\n"
            "  --kv-heads N      key/value heads (default 4)\n"
            "  --dim N           head dimension (default 64)\n"
            "  --dtype T         f32, f16 or bf16 (default f32)\n"
            "  --no-mask         attend to every key (default causal)\n"
            "  --device D        cpu or cuda (default cpu); with cuda every local rank uses\n"
            "                    device 0, except with the NCCL transports (one GPU per rank)\n"
            "  --reps N          timed repetitions after one warm-up, median shown (default 3)\n"
            "  --timing-only     skip the gathers and the error columns\n"
            "  --mode M          only this mode: all_gather, p2p, a2a or a2a_p2p\n"
            "  --layout L        only this layout: contiguous, zigzag or packed (the table of\n"
            "                    packed documents, which runs after the dense one by default)\n"
            "  --memory          peak device memory per rank against the analytical minimum\n"
            "                    (CUDA, local transport; implies --timing-only)\n"
            "  --stream S        CUDA: own (default; each rank a non-blocking stream of its\n"
            "                    own) or default (all ranks on the legacy default stream)\n"
            "  --transport T     local (default), nccl-threads (one thread per GPU,\n"
            "                    ncclCommInitAll; --cp GPUs), nccl-file (one process per GPU)\n"
            "  --rank R --size N this process's rank and the number of processes (nccl-file;\n"
            "                    default from RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*)\n"
            "  --docs MIX        the packed table's documents: a mix of --pack (lognormal-2k,\n"
            "                    lognormal-512, uniform, one-long, web+books; default a fixed row)\n"
            "  --balance B       its split: greedy (default), doc_zigzag, contiguous or auto\n"
            "  --window W        a sliding window on its first attention (default none)\n"
            "  --nccl-id-file F  file on shared storage through which rank 0 hands out the\n"
            "                    ncclUniqueId (nccl-file); it must not exist at the start\n");
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

/* The first of the environment variables in names that is set, as a number; -1 if none. */
static long long env_int(const char *const *names)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v)
            return strtoll(v, NULL, 10);
    }
    return -1;
}

int main(int argc, char **argv)
{
    bench_opts o = { 1, 2048, 8, 4, 64, CP_DTYPE_F32, CP_MASK_CAUSAL, 4, 0, 3, 0, BENCH_LOCAL, -1, -1, NULL, -1, -1, 0, 0,
                     NULL, -1, 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        long long v;
        if (!strcmp(a, "--kernel"))
            return kernel_bench_main(argc - i - 1, argv + i + 1, usage);
        if (!strcmp(a, "--pack"))
            return pack_bench_main(argc - i - 1, argv + i + 1, usage);
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
        } else if (!strcmp(a, "--timing-only")) {
            o.timing_only = 1;
        } else if (!strcmp(a, "--memory")) {
            o.memory = o.timing_only = 1;
        } else if (!strcmp(a, "--stream")) {
            if (!val || (strcmp(val, "own") && strcmp(val, "default"))) {
                fprintf(stderr, "infinicp-bench: --stream takes own or default\n");
                return 2;
            }
            o.default_stream = !strcmp(val, "default");
            i++;
        } else if (!strcmp(a, "--mode")) {
            static const char *const names[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };
            o.only_mode = -1;
            for (int m = 0; m < 4 && val; m++)
                if (!strcmp(val, names[m]))
                    o.only_mode = m;
            if (o.only_mode < 0) {
                fprintf(stderr, "infinicp-bench: --mode takes all_gather, p2p, a2a or a2a_p2p\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--layout")) {
            if (!val || (strcmp(val, "contiguous") && strcmp(val, "zigzag") && strcmp(val, "packed"))) {
                fprintf(stderr, "infinicp-bench: --layout takes contiguous, zigzag or packed\n");
                return 2;
            }
            o.only_layout = !strcmp(val, "zigzag") ? CP_LAYOUT_ZIGZAG : !strcmp(val, "packed") ? CP_LAYOUT_PACKED
                                                                                               : CP_LAYOUT_CONTIGUOUS;
            i++;
        } else if (!strcmp(a, "--device")) {
            if (!val || (strcmp(val, "cpu") && strcmp(val, "cuda"))) {
                fprintf(stderr, "infinicp-bench: --device takes cpu or cuda\n");
                return 2;
            }
            o.cuda = !strcmp(val, "cuda");
            i++;
        } else if (!strcmp(a, "--transport")) {
            if (val && !strcmp(val, "local"))
                o.transport = BENCH_LOCAL;
            else if (val && !strcmp(val, "nccl-threads"))
                o.transport = BENCH_NCCL_THREADS;
            else if (val && !strcmp(val, "nccl-file"))
                o.transport = BENCH_NCCL_FILE;
            else {
                fprintf(stderr, "infinicp-bench: --transport takes local, nccl-threads or nccl-file\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--nccl-id-file")) {
            if (!val) {
                fprintf(stderr, "infinicp-bench: --nccl-id-file needs a path\n");
                return 2;
            }
            o.nccl_id_file = val;
            i++;
        } else if (!strcmp(a, "--reps") || !strcmp(a, "--rank") || !strcmp(a, "--size")) {
            if (parse_int(a, val, !strcmp(a, "--rank") ? 0 : 1, !strcmp(a, "--reps") ? 100 : 63, &v))
                return 2;
            if (!strcmp(a, "--reps"))
                o.reps = (int)v;
            else if (!strcmp(a, "--rank"))
                o.rank = (int)v;
            else
                o.size = (int)v;
            i++;
        } else if (!strcmp(a, "--docs")) {
            if (!val) {
                fprintf(stderr, "infinicp-bench: --docs takes a mix name (see --pack --help)\n");
                return 2;
            }
            o.docs = val;
            i++;
        } else if (!strcmp(a, "--balance")) {
            static const char *const names[] = { "auto", "doc_zigzag", "greedy", "contiguous" }; /* cp_balance order */
            o.balance = -1;
            for (int k = 0; val && k < 4; k++)
                if (!strcmp(val, names[k]))
                    o.balance = k;
            if (o.balance < 0) {
                fprintf(stderr, "infinicp-bench: --balance takes auto, contiguous, doc_zigzag or greedy\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--window")) {
            if (parse_int(a, val, 0, 1ll << 40, &v))
                return 2;
            o.window = v;
            i++;
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
    if (o.transport == BENCH_NCCL_FILE) {
        static const char *const rank_env[] = { "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL };
        static const char *const size_env[] = { "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS",
                                                NULL };
        if (o.rank < 0)
            o.rank = (int)env_int(rank_env);
        if (o.size < 0)
            o.size = (int)env_int(size_env);
        if (o.size < 1 || o.size > 64 || o.rank < 0 || o.rank >= o.size) {
            fprintf(stderr, "infinicp-bench: nccl-file needs 0 <= rank < size <= 64 (got rank %d, size %d)\n",
                    o.rank, o.size);
            return 2;
        }
    }
    if (o.memory && (!o.cuda || o.transport != BENCH_LOCAL)) {
        fprintf(stderr, "infinicp-bench: --memory needs --device cuda and the local transport\n");
        return 2;
    }
    return bench_demo(&o);
}
