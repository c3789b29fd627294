/* SPDX-License-Identifier: MIT */
/* Shared pieces of infinicp-bench. */
#ifndef INFINICP_BENCH_H
#define INFINICP_BENCH_H

#include <stdint.h>

#include <infinicp/infinicp.h>

/* How the ranks of a run talk (--transport). */
typedef enum bench_transport {
    BENCH_LOCAL,        /* threads of this process, the library's local transport */
    BENCH_NCCL_THREADS, /* threads of this process, one GPU each, ncclCommInitAll */
    BENCH_NCCL_FILE,    /* one process per GPU, ncclUniqueId passed through a file */
} bench_transport;

typedef struct bench_opts {
    int64_t batch, seq;
    int heads, kv_heads, dim;
    cp_dtype dtype;
    cp_mask mask;
    int cp;
    int cuda;        /* --device cuda */
    int reps;        /* timed repetitions (median reported) */
    int timing_only; /* skip the gathers and the comparison with CP=1 */
    bench_transport transport;
    int rank, size;           /* this process in a one-process-per-GPU run */
    const char *nccl_id_file; /* where rank 0 leaves the ncclUniqueId */
    int only_mode, only_layout; /* --mode / --layout: run just these (-1 = all; layout 2 = packed) */
    int memory;                 /* --memory: peak device memory per rank (CUDA, local transport) */
    int default_stream;         /* --stream default: every rank on the device's legacy default stream */
    const char *docs;           /* --docs: the packed table's document mix (pack_bench.c's names; NULL = the demo's) */
    int balance;                /* --balance: its cp_balance (-1 = GREEDY) */
    int64_t window;             /* --window: a sliding window for its first attention (0 = none) */
} bench_opts;

/* Demo: every CP mode and layout on in-process ranks, checked against one rank. */
int bench_demo(const bench_opts *o);

/* 16-bit storage conversions (round to nearest even). */
float bench_f16_to_f32(uint16_t h);
uint16_t bench_f32_to_half(float f, cp_dtype t);

#endif
