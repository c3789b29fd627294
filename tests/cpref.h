/* SPDX-License-Identifier: MIT */
/*
 * Test-side model of CP attention, written apart from the library: global
 * tensors in double, the FP64 attention of attn_model.h over the whole sequence,
 * storage-type rounding, the layouts' shard / unshard, and error measures.
 * Nothing here calls libinfinicp.
 */
#ifndef INFINICP_TESTS_CPREF_H
#define INFINICP_TESTS_CPREF_H

#include <stddef.h>
#include <stdint.h>

#include <infinicp/infinicp.h>

#include "attn_model.h"

typedef struct cpref_shape {
    int64_t B, S;
    int H, Hkv, D, Dv;
    int causal;
    double scale;
} cpref_shape;

/* Global tensors, always [B, S, heads, dim] in double, and lse [B, H, S]. */
typedef struct cpref_data {
    cpref_shape sh;
    double *q, *k, *v, *dout;      /* inputs, already rounded to the storage type */
    double *out, *lse;             /* FP64 forward */
    double *dq, *dk, *dv;          /* FP64 backward */
} cpref_data;

/* Random inputs (uniform in [-1, 1], q and k scaled by `amp`) rounded to
 * `dtype`, and the FP64 reference results. */
int cpref_make(cpref_data *d, const cpref_shape *sh, cp_dtype dtype, uint64_t seed, double amp);
void cpref_free(cpref_data *d);


/* Round to the storage type and back. */
double cpref_round(double x, cp_dtype t);
size_t cpref_dtype_size(cp_dtype t);
/* Store / load n values of a storage type. */
void cpref_store(void *dst, cp_dtype t, const double *src, size_t n);
void cpref_load(double *dst, const void *src, cp_dtype t, size_t n);

/* The global positions held by cp rank r, in local order (layout model of
 * docs/ARCHITECTURE.md, Sequence layouts). Returns the count (S / P). */
int64_t cpref_positions(cp_layout l, int P, int r, int64_t S, int64_t *pos);

/* Copy the rows of rank r's tokens between a global [B, S, heads, dim]
 * double tensor and a local storage-type tensor in `format`. */
void cpref_shard(const cpref_shape *sh, cp_layout l, int P, int r, cp_format f, cp_dtype t, const double *global,
                 int heads, int dim, void *local);
void cpref_unshard(const cpref_shape *sh, cp_layout l, int P, int r, cp_format f, cp_dtype t, const void *local,
                   int heads, int dim, double *global);
/* lse: global [B, H, S] double <-> local [B, H, S/P] float. */
void cpref_unshard_lse(const cpref_shape *sh, cp_layout l, int P, int r, const float *local, double *global);

/* sqrt(sum (x - ref)^2 / sum ref^2) over n values. */
double cpref_rel_rms(const double *x, const double *ref, size_t n);

/* Global results of a CP run, [B, S, heads, dim] (lse [B, H, S]) in double. */
typedef struct cpref_result {
    double *out, *lse, *dq, *dk, *dv;
} cpref_result;
void cpref_result_alloc(cpref_result *r, const cpref_shape *sh);
void cpref_result_free(cpref_result *r);
/* Relative RMS error of out, lse, dq, dk, dv against the reference. */
void cpref_errors(const cpref_data *d, const cpref_result *r, double e[5]);
extern const char *const cpref_error_names[5];

/* The model's shape for the whole sequence of sh (queries and keys alike). */
model_shape cpref_model_shape(const cpref_shape *sh);
/* The model's forward and backward of the given global inputs into r. */
void cpref_model(const cpref_shape *sh, const double *q, const double *k, const double *v, const double *dout,
                 cpref_result *r);

#endif
