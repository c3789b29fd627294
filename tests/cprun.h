/* SPDX-License-Identifier: MIT */
/* One CP rank's part of a test run: the library side of the CP tests. */
#ifndef INFINICP_TESTS_CPRUN_H
#define INFINICP_TESTS_CPRUN_H

#include "cpref.h"
#include "world.h"

/* The descriptor of a cpref shape. */
cp_attn_desc cprun_desc(const cpref_shape *sh, cp_dtype dtype, cp_format format, cp_layout layout, cp_mode mode);

/*
 * Shard d's inputs for rank `rank` of P, move them to the device of ctx (the
 * plan's context), run forward and backward on plan p (an FP8 plan: the
 * forward alone, out in BF16, its dq, dk, dv left as they were)
 * (with the plan's own workspace when own_workspace, else a caller-side
 * buffer of exactly the reported size), and, when `into` is not NULL,
 * write this rank's results into the global tensors there. On failure,
 * *what names the failing call (cp_last_error() has the detail).
 */
cp_status cprun_rank(cp_context *ctx, cp_attn_plan *p, const cpref_data *d, const cp_attn_desc *desc, int P,
                     int rank, int own_workspace, cpref_result *into, const char **what);

/* The device every rank of a CP test run uses: the CPU, or CUDA device 0 in
 * the GPU builds of the suites (compiled with -DCPRUN_CUDA). */
extern const cp_device cprun_device;

/* Whether cprun_device cannot be opened (always false on the CPU); prints
 * why, for a suite's main to return 77 (meson: SKIP). */
int cprun_device_missing(const char *suite);

/* One CP run of the tests: which mode, layout, dtype and format, on how many
 * ranks, and how the CP group sits in its world. */
typedef struct cprun_cfg {
    cp_mode mode;
    cp_layout layout;
    cp_dtype dtype;
    cp_format format;
    int P, A;
    int strided;  /* CP groups split from a world with tp = 2: world ranks {t, t+2, t+4, ...} */
    int permuted; /* CP rank order reversed against world rank order */
    /* Where each rank's context is: NULL for a context of one thread on
     * cprun_device, else a pretend device of the suite's. */
    const fixture_device *device;
    /* The plan's own workspace on CP ranks whose rank + mode + ws_salt is
     * odd, the caller's on the others: a suite that runs a configuration
     * more than once moves the split with the salt. */
    unsigned ws_salt;
    /* Called on each rank just before its forward (after = 0) and just
     * after its backward (after = 1), both after its uploads and before
     * its downloads, with whether the plan uses its own workspace there;
     * NULL: none. */
    void (*calls)(cp_context *ctx, int after, int own_workspace, void *arg);
    void *calls_arg;
} cprun_cfg;

typedef struct cprun_out {
    cpref_result g;        /* global results, FP64 */
    size_t ws_fwd, ws_bwd; /* of CP rank 0 */
    cp_status status;
    char error[WORLD_ERROR_MAX]; /* the first failure: world rank, call, cp_last_error() */
} cprun_out;

/*
 * Run CP attention forward and backward on d's inputs with c->P ranks (2 *
 * c->P world ranks when strided), each a thread of a world (world.h) with
 * its own context on cprun_device (or c->device), over the in-process
 * transport, and gather the results into o->g (allocated here: free with
 * cprun_out_free, also after a failure). Returns the first failure's
 * status (o->error says where).
 */
cp_status cprun_world(const cpref_data *d, const cprun_cfg *c, cprun_out *o);
void cprun_out_free(cprun_out *o);

#endif
