/* SPDX-License-Identifier: MIT */
/*
 * CP attention with the arguments of API 1.1 and 1.2 (packed documents,
 * windows, softcaps, sinks; FP8 inputs and their descales) on a world of
 * ranks, compared with the FP64 model at CP=1 and CP=P: the harness of
 * test-attn-v11.c and test-fp8.c. A suite makes the inputs and the model's
 * results; cpattn_check shards the inputs per rank, runs the plan on every
 * rank, gathers, and fails the test unless CP=1's relative RMS error stays
 * within a bound per dtype and CP=P's within 1.25x of CP=1's (CP adds no
 * error).
 *
 * An FP8 configuration (CP_DTYPE_FP8_E4M3) runs the forward alone with the
 * data's descales, its out in BF16; only out and lse are compared. Every
 * other dtype runs forward and backward.
 */
#ifndef INFINICP_TESTS_CPATTN_H
#define INFINICP_TESTS_CPATTN_H

#include <stddef.h>
#include <stdint.h>

#include "world.h"

#define CPATTN_MAX_HEADS 64

typedef struct cpattn_cfg {
    cp_mode mode;
    cp_layout layout; /* CP_LAYOUT_PACKED: the documents below */
    cp_dtype dtype;
    cp_format format;
    cp_mask mask;
    int P, A;
    int strided; /* CP groups split from a world of 2P ranks with tp = 2 */
    int64_t B, S;
    int H, Hkv, D, Dv; /* H <= CPATTN_MAX_HEADS */
    int64_t window;
    double softcap;
    int sinks;
    int per_head; /* FP8: descales per head, else one per tensor */
    int ndocs;
    int64_t cu[64];
    cp_balance balance;
    int64_t chunk;
    /* Where each rank's context is: NULL for a context of one thread on
     * cprun_device, else a pretend device of the suite's. */
    const fixture_device *device;
    /* Called on each rank's context right before (after = 0) and right
     * after (after = 1) its backward call, NULL for none: a suite counts
     * what made the host wait there. */
    void (*bwd_hook)(cp_context *ctx, int after, void *arg);
    void *bwd_hook_arg;
} cpattn_cfg;

/* Global data in double ([B][S][heads][dim], lse [B][H][S]): the inputs
 * (already values of the storage type), and a run's results or the
 * model's. */
typedef struct cpattn_data {
    double *q, *k, *v, *dout, *sinks; /* FP8: no dout */
    float qd[CPATTN_MAX_HEADS], kd[CPATTN_MAX_HEADS], vd[CPATTN_MAX_HEADS]; /* FP8: descales ([0] per tensor) */
    double dsinks_scale; /* sqrt(sum_h (sum_i |exp(sink_h - lse_i) rowsum(dout_i * o_i)|)^2): the sum's size
                          * without its cancellation */
    double *out, *lse, *dq, *dk, *dv, *dsinks;
} cpattn_data;

/* The tensors compared, in the order of cpattn_worst_ratio. */
enum { CPATTN_OUT, CPATTN_LSE, CPATTN_DQ, CPATTN_DK, CPATTN_DV, CPATTN_DSINKS, CPATTN_NERR };

/* Elements of c's global q, k, v, out and lse. */
static inline size_t cpattn_nq(const cpattn_cfg *c) { return (size_t)(c->B * c->S * c->H * c->D); }
static inline size_t cpattn_nk(const cpattn_cfg *c) { return (size_t)(c->B * c->S * c->Hkv * c->D); }
static inline size_t cpattn_nv(const cpattn_cfg *c) { return (size_t)(c->B * c->S * c->Hkv * c->Dv); }
static inline size_t cpattn_no(const cpattn_cfg *c) { return (size_t)(c->B * c->S * c->H * c->Dv); }
static inline size_t cpattn_nl(const cpattn_cfg *c) { return (size_t)(c->B * c->H * c->S); }

/* Zeroed out, lse, dq, dk, dv, dsinks of c's size into d (a failure to
 * allocate fails the test); free them again; free them and the inputs. */
void cpattn_results_alloc(const cpattn_cfg *c, cpattn_data *d);
void cpattn_results_free(cpattn_data *d);
void cpattn_data_free(cpattn_data *d);

/*
 * Run c on d's inputs, each rank a thread of a world (world.h), and gather
 * the results into *res (allocated here: cpattn_results_free, also after a
 * failure). bad_pack_rank >= 0: that rank's pack moves a document boundary,
 * and every rank must get CP_ERROR_MISMATCH from the forward (no results).
 * Returns the world's first failure, described in err.
 */
cp_status cpattn_run(const cpattn_cfg *c, const cpattn_data *d, int bad_pack_rank, cpattn_data *res, char *err,
                     size_t errn);

/* c at CP=1 (one rank, no split, a2a_p2p as p2p) and as it is, on d's
 * inputs, against d's model results; fails the test where either error is
 * out of bounds. TEST_VERBOSE prints the errors of each configuration. */
void cpattn_check(const cpattn_cfg *c, const cpattn_data *d);

/* The largest CP=P / CP=1 error ratio per tensor cpattn_check has seen (a
 * suite reports and resets it). */
extern double cpattn_worst_ratio[CPATTN_NERR];

const char *cpattn_mode_name(cp_mode m);

#endif
