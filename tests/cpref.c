/* SPDX-License-Identifier: MIT */
#include "cpref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "storage.h"

/* ---- storage types, modelled independently of the library ---- */
/* (FP8 E4M3 by storage.c's model of the format.) */

size_t cpref_dtype_size(cp_dtype t)
{
    return t == CP_DTYPE_F64 ? 8 : t == CP_DTYPE_F32 ? 4 : t == CP_DTYPE_FP8_E4M3 ? 1 : 2;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lsb = (u >> 16) & 1;
    u += 0x7fff + lsb;
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

double cpref_round(double x, cp_dtype t)
{
    switch (t) {
    case CP_DTYPE_F64: return x;
    case CP_DTYPE_F32: return (float)x;
    case CP_DTYPE_F16: return (double)(_Float16)(float)x;
    case CP_DTYPE_BF16: return from_bf16(to_bf16((float)x));
    case CP_DTYPE_FP8_E4M3: return ref_round(x, t);
    }
    return x;
}

void cpref_store(void *dst, cp_dtype t, const double *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case CP_DTYPE_F64: ((double *)dst)[i] = src[i]; break;
        case CP_DTYPE_F32: ((float *)dst)[i] = (float)src[i]; break;
        case CP_DTYPE_F16: ((_Float16 *)dst)[i] = (_Float16)(float)src[i]; break;
        case CP_DTYPE_BF16: ((uint16_t *)dst)[i] = to_bf16((float)src[i]); break;
        case CP_DTYPE_FP8_E4M3: ref_store(dst, t, i, src[i]); break;
        }
    }
}

void cpref_load(double *dst, const void *src, cp_dtype t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case CP_DTYPE_F64: dst[i] = ((const double *)src)[i]; break;
        case CP_DTYPE_F32: dst[i] = ((const float *)src)[i]; break;
        case CP_DTYPE_F16: dst[i] = (double)((const _Float16 *)src)[i]; break;
        case CP_DTYPE_BF16: dst[i] = from_bf16(((const uint16_t *)src)[i]); break;
        case CP_DTYPE_FP8_E4M3: dst[i] = ref_load(src, t, i); break;
        }
    }
}

/* ---- the model over the whole sequence ---- */

model_shape cpref_model_shape(const cpref_shape *sh)
{
    model_shape m = { .batch = sh->B, .seq_q = sh->S, .seq_k = sh->S, .heads = sh->H, .kv_heads = sh->Hkv,
                      .head_dim = sh->D, .head_dim_v = sh->Dv, .causal = sh->causal, .scale = sh->scale };
    return m;
}

void cpref_model(const cpref_shape *sh, const double *q, const double *k, const double *v, const double *dout,
                 cpref_result *r)
{
    const model_shape m = cpref_model_shape(sh);
    model_forward(&m, q, k, v, r->out, r->lse);
    model_backward(&m, q, k, v, r->out, r->lse, dout, r->dq, r->dk, r->dv);
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double *random_tensor(size_t n, uint64_t *seed, double amp, cp_dtype t)
{
    double *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = cpref_round(amp * ((double)(splitmix(seed) >> 11) * 0x1.0p-53 * 2.0 - 1.0), t);
    return x;
}

int cpref_make(cpref_data *d, const cpref_shape *sh, cp_dtype dtype, uint64_t seed, double amp)
{
    memset(d, 0, sizeof *d);
    d->sh = *sh;
    size_t nq = (size_t)sh->B * (size_t)sh->S * (size_t)sh->H * (size_t)sh->D;
    size_t nk = (size_t)sh->B * (size_t)sh->S * (size_t)sh->Hkv * (size_t)sh->D;
    size_t nv = (size_t)sh->B * (size_t)sh->S * (size_t)sh->Hkv * (size_t)sh->Dv;
    size_t no = (size_t)sh->B * (size_t)sh->S * (size_t)sh->H * (size_t)sh->Dv;
    d->q = random_tensor(nq, &seed, amp, dtype);
    d->k = random_tensor(nk, &seed, amp, dtype);
    d->v = random_tensor(nv, &seed, 1.0, dtype);
    d->dout = random_tensor(no, &seed, 1.0, dtype);
    d->out = malloc(no * sizeof(double));
    d->lse = malloc((size_t)sh->B * (size_t)sh->H * (size_t)sh->S * sizeof(double));
    d->dq = malloc(nq * sizeof(double));
    d->dk = malloc(nk * sizeof(double));
    d->dv = malloc(nv * sizeof(double));
    cpref_result r = { d->out, d->lse, d->dq, d->dk, d->dv };
    cpref_model(sh, d->q, d->k, d->v, d->dout, &r);
    return 0;
}

void cpref_free(cpref_data *d)
{
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->dout);
    free(d->out);
    free(d->lse);
    free(d->dq);
    free(d->dk);
    free(d->dv);
    memset(d, 0, sizeof *d);
}

/* ---- layouts ---- */

int64_t cpref_positions(cp_layout l, int P, int r, int64_t S, int64_t *pos)
{
    int64_t n = 0;
    if (l == CP_LAYOUT_CONTIGUOUS) {
        for (int64_t i = r * (S / P); i < (r + 1) * (S / P); i++)
            pos[n++] = i;
        return n;
    }
    int64_t c = S / (2 * P);
    int chunks[2] = { r, 2 * P - 1 - r };
    for (int k = 0; k < 2; k++)
        for (int64_t i = 0; i < c; i++)
            pos[n++] = chunks[k] * c + i;
    return n;
}

/* Element offset of (b, global s, h) in a global tensor. */
static size_t at(const cpref_shape *sh, int64_t b, int64_t s, int h, int heads, int dim)
{
    return (((size_t)b * (size_t)sh->S + (size_t)s) * (size_t)heads + (size_t)h) * (size_t)dim;
}

/* Element offset of (b, local s, h) in a local tensor of n tokens. */
static size_t local_at(cp_format f, int64_t B, int64_t n, int64_t b, int64_t s, int h, int heads, int dim)
{
    if (f == CP_FORMAT_SBHD)
        return (((size_t)s * (size_t)B + (size_t)b) * (size_t)heads + (size_t)h) * (size_t)dim;
    return (((size_t)b * (size_t)n + (size_t)s) * (size_t)heads + (size_t)h) * (size_t)dim;
}

static void move_rows(const cpref_shape *sh, cp_layout l, int P, int r, cp_format f, cp_dtype t, double *global,
                      int heads, int dim, void *local, int to_local)
{
    int64_t *pos = malloc((size_t)sh->S * sizeof *pos);
    int64_t n = cpref_positions(l, P, r, sh->S, pos);
    const size_t es = cpref_dtype_size(t);
    for (int64_t b = 0; b < sh->B; b++)
        for (int64_t s = 0; s < n; s++)
            for (int h = 0; h < heads; h++) {
                double *g = global + at(sh, b, pos[s], h, heads, dim);
                char *lp = (char *)local + local_at(f, sh->B, n, b, s, h, heads, dim) * es;
                if (to_local)
                    cpref_store(lp, t, g, (size_t)dim);
                else
                    cpref_load(g, lp, t, (size_t)dim);
            }
    free(pos);
}

void cpref_shard(const cpref_shape *sh, cp_layout l, int P, int r, cp_format f, cp_dtype t, const double *global,
                 int heads, int dim, void *local)
{
    move_rows(sh, l, P, r, f, t, (double *)global, heads, dim, local, 1);
}

void cpref_unshard(const cpref_shape *sh, cp_layout l, int P, int r, cp_format f, cp_dtype t, const void *local,
                   int heads, int dim, double *global)
{
    move_rows(sh, l, P, r, f, t, global, heads, dim, (void *)local, 0);
}

void cpref_unshard_lse(const cpref_shape *sh, cp_layout l, int P, int r, const float *local, double *global)
{
    int64_t *pos = malloc((size_t)sh->S * sizeof *pos);
    int64_t n = cpref_positions(l, P, r, sh->S, pos);
    for (int64_t b = 0; b < sh->B; b++)
        for (int h = 0; h < sh->H; h++)
            for (int64_t s = 0; s < n; s++)
                global[((size_t)b * (size_t)sh->H + (size_t)h) * (size_t)sh->S + (size_t)pos[s]] =
                    local[((size_t)b * (size_t)sh->H + (size_t)h) * (size_t)n + (size_t)s];
    free(pos);
}

double cpref_rel_rms(const double *x, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = x[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static size_t count(const cpref_shape *sh, int heads, int dim)
{
    return (size_t)sh->B * (size_t)sh->S * (size_t)heads * (size_t)dim;
}

void cpref_result_alloc(cpref_result *r, const cpref_shape *sh)
{
    r->out = calloc(count(sh, sh->H, sh->Dv), sizeof(double));
    r->lse = calloc(count(sh, sh->H, 1), sizeof(double));
    r->dq = calloc(count(sh, sh->H, sh->D), sizeof(double));
    r->dk = calloc(count(sh, sh->Hkv, sh->D), sizeof(double));
    r->dv = calloc(count(sh, sh->Hkv, sh->Dv), sizeof(double));
}

void cpref_result_free(cpref_result *r)
{
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    memset(r, 0, sizeof *r);
}

const char *const cpref_error_names[5] = { "out", "lse", "dq", "dk", "dv" };

void cpref_errors(const cpref_data *d, const cpref_result *r, double e[5])
{
    const cpref_shape *sh = &d->sh;
    e[0] = cpref_rel_rms(r->out, d->out, count(sh, sh->H, sh->Dv));
    e[1] = cpref_rel_rms(r->lse, d->lse, count(sh, sh->H, 1));
    e[2] = cpref_rel_rms(r->dq, d->dq, count(sh, sh->H, sh->D));
    e[3] = cpref_rel_rms(r->dk, d->dk, count(sh, sh->Hkv, sh->D));
    e[4] = cpref_rel_rms(r->dv, d->dv, count(sh, sh->Hkv, sh->Dv));
}
