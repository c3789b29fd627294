/* SPDX-License-Identifier: MIT */
/*
 * The ranks of a benchmark run and their communicators: threads on the
 * local transport, threads with one NCCL communicator per GPU
 * (ncclCommInitAll), or one process per GPU whose NCCL communicator is
 * bootstrapped through a file. NCCL is loaded at run time (dlopen), like
 * the CUDA runtime, so the program builds where neither is installed.
 */
#ifndef INFINICP_BENCH_LAUNCH_H
#define INFINICP_BENCH_LAUNCH_H

#include <stddef.h>

#include "bench.h"

typedef struct launch {
    bench_transport transport;
    int world;       /* ranks in the run (the CP size) */
    int first, count; /* the ranks this process drives: first .. first + count - 1 */
    int devices;     /* CUDA devices visible (0 on the CPU) */
    void *nccl[64];  /* ncclComm_t per local rank (NCCL transports) */
} launch;

/* Set up the ranks of this process for o->transport; on failure writes why into err. */
int launch_init(launch *l, const bench_opts *o, int devices, char *err, size_t cap);
/* The device of local rank i (0 .. count-1). */
int launch_device(const launch *l, int i);
/* Communicators for the local ranks of a run over all l->world ranks. */
cp_status launch_comms(const launch *l, cp_comm **out);
void launch_fini(launch *l);

#endif
