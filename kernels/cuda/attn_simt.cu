// SPDX-License-Identifier: MIT
// Fused block attention in plain fp32 arithmetic: the exact path for F32
// (no TF32, accurate exp2 / log2) and the generic path for any dtype and any
// head dim whose tiles fit in shared memory. It is also the FP8 (E4M3,
// API 1.2) forward for now: tiles decode to fp32 with the descales folded
// into the query tile's multiplier (q and k) and the value tile's (v).
//
// A block owns R rows (query rows in the forward and dQ kernels, key rows in
// the dK/dV kernel) with 8 threads per row; tiles of the other side have R
// rows too. Every tile is converted to fp32 in shared memory, and each thread
// keeps the values it owns (running output, accumulated gradients) in shared
// memory at fixed places, so a warp-level barrier orders the row's own work.
//
// Backward is deterministic (no atomics): one kernel per key tile owns dK and
// dV (all query heads of a GQA group add into them in a fixed order), and a
// second kernel per query tile recomputes the probabilities for dQ.
//
// Every product sums over the pairs a row (or key) sees only: a hidden
// pair's P and dS are 0, but 0 x NaN is NaN, and a NaN or inf in a row of
// q, k, v or dO that a row does not see must not reach it
// (docs/RELIABILITY.md). Skipping exact zeros leaves finite results' bits
// as they were.
//
// API 1.1 (p.rects: rectangle lists, windows, softcaps) takes kernels of its
// own with the same tiles and arithmetic; the dense ones stay as they are.
// A block takes one tile of the call's tile index (attn_rect.cu, in launch
// order: grid.x = tiles x heads) and walks the bands that meet it, and in
// each band only the tiles of the other side that the band reaches, starting
// at the band's first row there (not at a tile multiple); rows of a tile
// past the band load as zeros. Each row (or key) sums only over the columns
// of the band it sees, so nothing of a pair it does not see, finite or not,
// reaches it; P and dS are selects. One online softmax runs through all
// bands of a query tile (a row in several rectangles gets their merged
// result). With a softcap c the base-2 score is c log2(e) tanh(s scale / c)
// (tanh_cap, absolute error about 1e-7) and dS takes the factor 1 - tanh^2.
#include <climits>
#include <cmath>

#include "common.cuh"

namespace cu {
namespace {

constexpr int TPR = 8; // threads per row

// Pitches (floats) chosen so that the 4 rows a warp touches at once, or the
// 8 consecutive rows of a tile read by one row group, fall in distinct banks.
__host__ __device__ inline int pitch_row(int n) { return n + 8; }  // read by rows (4 per warp)
__host__ __device__ inline int pitch_col(int n) { return n + 1; }  // read by 8 consecutive rows

// Load rows [r0, r0 + R) of head h of t (dim columns) into a float tile with
// the given pitch, times mul; rows at or past n are zero.
template <int R>
__device__ void load_tile(float *dst, int pitch, const tensor &t, cp_dtype dt, int64_t b, int64_t r0, int64_t n,
                          int h, int dim, float mul)
{
    for (int e = threadIdx.x; e < R * dim; e += blockDim.x) {
        const int r = e / dim, d = e - r * dim;
        const int64_t row = r0 + r;
        dst[r * pitch + d] = row < n ? ld_f(t.p, dt, at(t, b, row, h) + d) * mul : 0.0f;
    }
}

template <int R>
__device__ void zero_tile(float *dst, int pitch, int dim)
{
    for (int e = threadIdx.x; e < R * dim; e += blockDim.x) {
        const int r = e / dim;
        dst[r * pitch + e - r * dim] = 0.0f;
    }
}

__device__ __forceinline__ float row_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
}

__device__ __forceinline__ float row_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x + __shfl_xor_sync(0xffffffffu, x, 4);
}

// x - t0 clamped to the columns [0, R] of a tile starting at t0.
template <int R>
__device__ __forceinline__ int tile_col(int64_t x, int64_t t0)
{
    const int64_t c = x - t0;
    return c < 0 ? 0 : c > R ? R : (int)c;
}

template <int R>
struct fwd_smem {
    static size_t floats(int D, int Dv)
    {
        return (size_t)R * pitch_row(D) + (size_t)R * pitch_col(D) + (size_t)R * Dv + (size_t)R * pitch_row(R) +
               (size_t)R * pitch_row(Dv);
    }
};

template <int R>
__global__ void __launch_bounds__(R * TPR) fwd_kernel(attn_params p)
{
    extern __shared__ float sm[];
    const int D = p.D, Dv = p.Dv;
    const int QP = pitch_row(D), KP = pitch_col(D), PP = pitch_row(R), OP = pitch_row(Dv);
    float *Qs = sm, *Ks = Qs + R * QP, *Vs = Ks + R * KP, *Ps = Vs + R * Dv, *Os = Ps + R * PP;
    const int r = threadIdx.x / TPR, c8 = threadIdx.x % TPR;
    const int64_t i0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * R; // most keys first under a causal mask
    const int h = blockIdx.y, hk = h / p.G;
    const int64_t b = blockIdx.z, i = i0 + r;
    const int64_t nq = p.Sq - i0 < R ? p.Sq - i0 : R;

    // base-2 scores (FP8: the q and k descales folded in; 1 otherwise)
    const float qmul = p.c * (descale(p.qd, p.dph, h) * descale(p.kd, p.dph, hk)), vmul = descale(p.vd, p.dph, hk);
    load_tile<R>(Qs, QP, p.q, p.dt, b, i0, p.Sq, h, D, qmul);
    zero_tile<R>(Os, OP, Dv);
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    const int64_t kend = visible_keys(p, i0 + nq - 1);
    for (int64_t k0 = 0; k0 < kend; k0 += R) {
        __syncthreads(); // the previous tile is no longer read
        load_tile<R>(Ks, KP, p.k, p.dt, b, k0, p.Sk, hk, D, 1.0f);
        load_tile<R>(Vs, Dv, p.v, p.dt, b, k0, p.Sk, hk, Dv, vmul);
        __syncthreads();
        float s[R / TPR];
        float mx = -INFINITY;
#pragma unroll
        for (int u = 0; u < R / TPR; u++) {
            const int j = c8 + TPR * u;
            float acc = 0.0f;
            for (int d = 0; d < D; d++)
                acc += Qs[r * QP + d] * Ks[j * KP + d];
            const int64_t kj = k0 + j;
            const bool vis = kj < p.Sk && (!p.causal || kj <= i + p.delta);
            s[u] = vis ? acc : -INFINITY;
            mx = fmaxf(mx, s[u]);
        }
        const float mnew = fmaxf(m, row_max(mx));
        const float mu = mnew == -INFINITY ? 0.0f : mnew; // a row that saw nothing yet stays at 0
        const float alpha = exp2f(m - mu);
        float ps = 0.0f;
#pragma unroll
        for (int u = 0; u < R / TPR; u++) {
            const float pv = exp2f(s[u] - mu);
            Ps[r * PP + c8 + TPR * u] = pv;
            ps += pv;
        }
        l = l * alpha + row_sum(ps);
        m = mnew;
        __syncwarp(); // the row's probabilities are written by its own 8 lanes
        // only the keys the row sees: a hidden one's P is 0, but 0 x NaN is not
        const int hi = tile_col<R>(visible_keys(p, i), k0);
        for (int dv = c8; dv < Dv; dv += TPR) {
            float acc = Os[r * OP + dv] * alpha;
            for (int j = 0; j < hi; j++)
                acc += Ps[r * PP + j] * Vs[j * Dv + dv];
            Os[r * OP + dv] = acc;
        }
    }

    // Rows past the block take part in the warp barrier but write nothing.
    const bool valid = i < p.Sq;
    // l is NaN after a NaN score (or inf - inf): not a row without keys
    const double lse_blk = l != 0.0f ? ((double)m + log2((double)l)) * LN2 : -INFINITY;
    const float inv = l != 0.0f ? 1.0f / l : 0.0f;
    const int64_t li = b * p.lsb + h * p.lsh + i;
    const int64_t o = valid ? at(p.o, b, i, h) : 0;
    void *op = const_cast<void *>(p.o.p);
    float w1 = 0.0f, w2 = 1.0f;
    double merged = lse_blk;
    bool add = valid;
    if (p.accumulate) {
        add = valid && merge_weights(p.lse[li], lse_lo_at(p, li), lse_blk, &w1, &w2, &merged);
        __syncwarp(); // all lanes of the row have read the running LSE
    }
    if (!add)
        return;
    for (int dv = c8; dv < Dv; dv += TPR)
        store_merged(op, p.odt, o + dv, Os[r * OP + dv] * inv, w1, w2);
    if (c8 == 0)
        store_lse(p, li, merged);
}

// dK, dV of R key rows (kv head blockIdx.y): all query heads of the group,
// all visible query tiles.
template <int R>
struct dkdv_smem {
    static size_t floats(int D, int Dv)
    {
        return 2 * (size_t)R * pitch_row(D) + 2 * (size_t)R * pitch_row(Dv) + (size_t)R * pitch_col(D) +
               (size_t)R * pitch_col(Dv) + 2 * (size_t)R * pitch_row(R) + 2 * (size_t)R;
    }
};

template <int R>
__global__ void __launch_bounds__(R * TPR) dkdv_kernel(attn_params p)
{
    extern __shared__ float sm[];
    const int D = p.D, Dv = p.Dv;
    const int KP = pitch_row(D), VP = pitch_row(Dv), QP = pitch_col(D), OP = pitch_col(Dv), PP = pitch_row(R);
    float *Ks = sm, *Vs = Ks + R * KP, *dKs = Vs + R * VP, *dVs = dKs + R * KP, *Qs = dVs + R * VP;
    float *dOs = Qs + R * QP, *PTs = dOs + R * OP, *dSTs = PTs + R * PP, *lse2s = dSTs + R * PP, *drs = lse2s + R;
    const int r = threadIdx.x / TPR, c8 = threadIdx.x % TPR;
    const int64_t k0 = (int64_t)blockIdx.x * R, j = k0 + r;
    const int hk = blockIdx.y;
    const int64_t b = blockIdx.z;

    load_tile<R>(Ks, KP, p.k, p.dt, b, k0, p.Sk, hk, D, 1.0f);
    load_tile<R>(Vs, VP, p.v, p.dt, b, k0, p.Sk, hk, Dv, 1.0f);
    zero_tile<R>(dKs, KP, D);
    zero_tile<R>(dVs, VP, Dv);
    __syncthreads();
    const int64_t i_first = first_query(p, k0) / R * R;
    for (int g = 0; g < p.G; g++) {
        const int h = hk * p.G + g;
        for (int64_t i0 = i_first; i0 < p.Sq; i0 += R) {
            __syncthreads(); // the previous query tile is no longer read
            load_tile<R>(Qs, QP, p.q, p.dt, b, i0, p.Sq, h, D, 1.0f);
            load_tile<R>(dOs, OP, p.dout, p.odt, b, i0, p.Sq, h, Dv, 1.0f);
            for (int e = threadIdx.x; e < R; e += blockDim.x) {
                const int64_t i = i0 + e;
                lse2s[e] = i < p.Sq ? lse2_of(p.lse[b * p.lsb + h * p.lsh + i]) : INFINITY;
                drs[e] = i < p.Sq ? p.drow[b * p.drb + h * p.drh + i] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int u = 0; u < R / TPR; u++) {
                const int ii = c8 + TPR * u;
                const int64_t i = i0 + ii;
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < D; d++)
                    s += Ks[r * KP + d] * Qs[ii * QP + d];
                for (int d = 0; d < Dv; d++)
                    dp += Vs[r * VP + d] * dOs[ii * OP + d];
                const bool vis = j < p.Sk && i < p.Sq && (!p.causal || j <= i + p.delta);
                const float pv = vis ? exp2f(s * p.c - lse2s[ii]) : 0.0f;
                PTs[r * PP + ii] = pv;
                dSTs[r * PP + ii] = vis ? p.scale * pv * (dp - drs[ii]) : 0.0f; // a hidden dP may be NaN
            }
            __syncwarp();
            // only the query rows that see the key: 0 x NaN is not 0
            const int lo = tile_col<R>(first_query(p, j), i0), hi = tile_col<R>(p.Sq, i0);
            for (int d = c8; d < Dv; d += TPR) {
                float acc = dVs[r * VP + d];
                for (int ii = lo; ii < hi; ii++)
                    acc += PTs[r * PP + ii] * dOs[ii * OP + d];
                dVs[r * VP + d] = acc;
            }
            for (int d = c8; d < D; d += TPR) {
                float acc = dKs[r * KP + d];
                for (int ii = lo; ii < hi; ii++)
                    acc += dSTs[r * PP + ii] * Qs[ii * QP + d];
                dKs[r * KP + d] = acc;
            }
        }
    }
    if (j >= p.Sk || (p.grad_accumulate && i_first >= p.Sq))
        return; // past the block, or nothing to add
    const int64_t ok = at(p.dk, b, j, hk), ov = at(p.dv, b, j, hk);
    for (int d = c8; d < D; d += TPR)
        store_grad(const_cast<void *>(p.dk.p), p.gdt, ok + d, dKs[r * KP + d], p.grad_accumulate);
    for (int d = c8; d < Dv; d += TPR)
        store_grad(const_cast<void *>(p.dv.p), p.gdt, ov + d, dVs[r * VP + d], p.grad_accumulate);
}

// dQ of R query rows of head blockIdx.y over all visible key tiles.
template <int R>
struct dq_smem {
    static size_t floats(int D, int Dv)
    {
        return 2 * (size_t)R * pitch_row(D) + (size_t)R * pitch_row(Dv) + (size_t)R * pitch_col(D) +
               (size_t)R * pitch_col(Dv) + (size_t)R * pitch_row(R);
    }
};

template <int R>
__global__ void __launch_bounds__(R * TPR) dq_kernel(attn_params p)
{
    extern __shared__ float sm[];
    const int D = p.D, Dv = p.Dv;
    const int QP = pitch_row(D), OP = pitch_row(Dv), KP = pitch_col(D), VP = pitch_col(Dv), PP = pitch_row(R);
    float *Qs = sm, *dQs = Qs + R * QP, *dOs = dQs + R * QP, *Ks = dOs + R * OP, *Vs = Ks + R * KP;
    float *dSs = Vs + R * VP;
    const int r = threadIdx.x / TPR, c8 = threadIdx.x % TPR;
    const int64_t i0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * R, i = i0 + r;
    const int h = blockIdx.y, hk = h / p.G;
    const int64_t b = blockIdx.z;
    const int64_t nq = p.Sq - i0 < R ? p.Sq - i0 : R;

    load_tile<R>(Qs, QP, p.q, p.dt, b, i0, p.Sq, h, D, 1.0f);
    load_tile<R>(dOs, OP, p.dout, p.odt, b, i0, p.Sq, h, Dv, 1.0f);
    zero_tile<R>(dQs, QP, D);
    __syncthreads();
    const float lse2 = i < p.Sq ? lse2_of(p.lse[b * p.lsb + h * p.lsh + i]) : INFINITY;
    const float dr = i < p.Sq ? p.drow[b * p.drb + h * p.drh + i] : 0.0f;
    const int64_t kend = visible_keys(p, i0 + nq - 1);
    for (int64_t k0 = 0; k0 < kend; k0 += R) {
        __syncthreads();
        load_tile<R>(Ks, KP, p.k, p.dt, b, k0, p.Sk, hk, D, 1.0f);
        load_tile<R>(Vs, VP, p.v, p.dt, b, k0, p.Sk, hk, Dv, 1.0f);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < R / TPR; u++) {
            const int jj = c8 + TPR * u;
            const int64_t j = k0 + jj;
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < D; d++)
                s += Qs[r * QP + d] * Ks[jj * KP + d];
            for (int d = 0; d < Dv; d++)
                dp += dOs[r * OP + d] * Vs[jj * VP + d];
            const bool vis = j < p.Sk && (!p.causal || j <= i + p.delta);
            const float pv = vis ? exp2f(s * p.c - lse2) : 0.0f;
            dSs[r * PP + jj] = vis ? p.scale * pv * (dp - dr) : 0.0f; // a hidden dP may be NaN
        }
        __syncwarp();
        const int hi = tile_col<R>(visible_keys(p, i), k0); // the keys the row sees (0 x NaN is not 0)
        for (int d = c8; d < D; d += TPR) {
            float acc = dQs[r * QP + d];
            for (int jj = 0; jj < hi; jj++)
                acc += dSs[r * PP + jj] * Ks[jj * KP + d];
            dQs[r * QP + d] = acc;
        }
    }
    if (i >= p.Sq || (p.grad_accumulate && kend == 0))
        return;
    const int64_t oq = at(p.dq, b, i, h);
    for (int d = c8; d < D; d += TPR)
        store_grad(const_cast<void *>(p.dq.p), p.gdt, oq + d, dQs[r * QP + d], p.grad_accumulate);
}

// ---------------------------------------------------------------------------
// API 1.1: the rectangle kernels.

// Key rows [*klo, *khi) that the rows [i0, i0 + n) of a query tile see in
// band r: the first of its rows inside the band sees from klo, the last up to
// khi (band ends never decrease). Empty when no row of the tile is in r.
__device__ __forceinline__ void tile_keys(const band &r, int64_t i0, int64_t n, int64_t *klo, int64_t *khi)
{
    const int64_t ra = r.q0 > i0 ? r.q0 : i0, rb = r.q1 < i0 + n ? r.q1 : i0 + n;
    *klo = *khi = 0;
    if (ra >= rb)
        return;
    int64_t x;
    band_keys(r, ra, klo, &x);
    band_keys(r, rb - 1, &x, khi);
}

// Query rows [*qlo, *qhi) that see the keys [j0, j0 + n) of a key tile in r.
__device__ __forceinline__ void tile_queries(const band &r, int64_t j0, int64_t n, int64_t *qlo, int64_t *qhi)
{
    const int64_t ka = r.k0 > j0 ? r.k0 : j0, kb = r.k1 < j0 + n ? r.k1 : j0 + n;
    *qlo = *qhi = 0;
    if (ka >= kb)
        return;
    int64_t x;
    band_queries(r, ka, qlo, &x);
    band_queries(r, kb - 1, &x, qhi);
}

// The forward over a query tile of one head (tile_head_at): dense fwd_kernel's online softmax, through the key tiles of
// every band of the tile.
template <int R>
__global__ void __launch_bounds__(R * TPR) fwd_rect_kernel(attn_params p)
{
    extern __shared__ float sm[];
    const int D = p.D, Dv = p.Dv;
    const int QP = pitch_row(D), KP = pitch_col(D), PP = pitch_row(R), OP = pitch_row(Dv);
    float *Qs = sm, *Ks = Qs + R * QP, *Vs = Ks + R * KP, *Ps = Vs + R * Dv, *Os = Ps + R * PP;
    const int r = threadIdx.x / TPR, c8 = threadIdx.x % TPR;
    const tile_head th = tile_head_at(p.rs.by_q, blockIdx.x);
    const int tile = th.tile, h = th.h, hk = h / p.G;
    const int64_t b = blockIdx.z, i0 = (int64_t)tile * R, i = i0 + r;
    const int64_t nq = p.Sq - i0 < R ? p.Sq - i0 : R;
    const int bs = p.rs.by_q.start[tile], be = p.rs.by_q.start[tile + 1];

    // base-2 scores, or the softcap's argument (FP8: times the q and k descales)
    const float qmul = (p.softcap ? p.cap_in : p.c) * (descale(p.qd, p.dph, h) * descale(p.kd, p.dph, hk));
    const float vmul = descale(p.vd, p.dph, hk);
    load_tile<R>(Qs, QP, p.q, p.dt, b, i0, p.Sq, h, D, qmul);
    zero_tile<R>(Os, OP, Dv);
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    for (int bi = bs; bi < be; bi++) {
        const band bd = p.rs.bands[p.rs.by_q.ids[bi]];
        int64_t klo, khi, rlo = 0, rhi = 0; // keys of the tile's rows; this row's (none outside the band)
        tile_keys(bd, i0, nq, &klo, &khi);
        if (i >= bd.q0 && i < bd.q1)
            band_keys(bd, i, &rlo, &rhi);
        for (int64_t k0 = klo; k0 < khi; k0 += R) {
            __syncthreads(); // the previous tile is no longer read
            load_tile<R>(Ks, KP, p.k, p.dt, b, k0, bd.k1, hk, D, 1.0f);
            load_tile<R>(Vs, Dv, p.v, p.dt, b, k0, bd.k1, hk, Dv, vmul);
            __syncthreads();
            const int lo = tile_col<R>(rlo, k0), hi = tile_col<R>(rhi, k0); // columns the row sees
            float s[R / TPR];
            float mx = -INFINITY;
#pragma unroll
            for (int u = 0; u < R / TPR; u++) {
                const int j = c8 + TPR * u;
                float acc = 0.0f;
                for (int d = 0; d < D; d++)
                    acc += Qs[r * QP + d] * Ks[j * KP + d];
                if (p.softcap)
                    acc = p.cap_out * tanh_cap(acc);
                s[u] = j >= lo && j < hi ? acc : -INFINITY;
                mx = fmaxf(mx, s[u]);
            }
            const float mnew = fmaxf(m, row_max(mx));
            const float mu = mnew == -INFINITY ? 0.0f : mnew; // a row that saw nothing yet stays at 0
            const float alpha = exp2f(m - mu);
            float ps = 0.0f;
#pragma unroll
            for (int u = 0; u < R / TPR; u++) {
                const float pv = exp2f(s[u] - mu);
                Ps[r * PP + c8 + TPR * u] = pv;
                ps += pv;
            }
            l = l * alpha + row_sum(ps);
            m = mnew;
            __syncwarp(); // the row's probabilities are written by its own 8 lanes
            for (int dv = c8; dv < Dv; dv += TPR) {
                float acc = Os[r * OP + dv] * alpha;
                for (int j = lo; j < hi; j++)
                    acc += Ps[r * PP + j] * Vs[j * Dv + dv];
                Os[r * OP + dv] = acc;
            }
        }
    }

    // as fwd_kernel: rows past the block take part in the barriers but write
    // nothing; a row in no band gets O = 0, LSE = -inf (or keeps its values)
    const bool valid = i < p.Sq;
    const double lse_blk = l != 0.0f ? ((double)m + log2((double)l)) * LN2 : -INFINITY;
    const float inv = l != 0.0f ? 1.0f / l : 0.0f;
    const int64_t li = b * p.lsb + h * p.lsh + i;
    const int64_t o = valid ? at(p.o, b, i, h) : 0;
    void *op = const_cast<void *>(p.o.p);
    float w1 = 0.0f, w2 = 1.0f;
    double merged = lse_blk;
    bool add = valid;
    if (p.accumulate) {
        add = valid && merge_weights(p.lse[li], lse_lo_at(p, li), lse_blk, &w1, &w2, &merged);
        __syncwarp();
    }
    if (!add)
        return;
    for (int dv = c8; dv < Dv; dv += TPR)
        store_merged(op, p.odt, o + dv, Os[r * OP + dv] * inv, w1, w2);
    if (c8 == 0)
        store_lse(p, li, merged);
}

// P and dS of one pair from its raw product s and dP (dS a select: 0 where
// the pair is not visible, whatever s, dP and the row's LSE are).
__device__ __forceinline__ void rect_p_ds(const attn_params &p, bool vis, float s, float dp, float lse2, float dr,
                                          float *pv, float *ds)
{
    float t = 0.0f, x;
    if (p.softcap) {
        t = tanh_cap(s * p.cap_in);
        x = p.cap_out * t;
    } else {
        x = s * p.c;
    }
    const float pr = vis ? exp2f(x - lse2) : 0.0f;
    float g = p.scale * pr * (dp - dr);
    if (p.softcap)
        g *= 1.0f - t * t;
    *pv = pr;
    *ds = vis ? g : 0.0f;
}

// dK, dV of a key tile of one kv head (tile_head_at): per band, the query tiles (all heads of the group) that
// see its keys. The launch bounds allow 64 registers a thread (without a
// block count the compiler aims at fewer and spills).
template <int R>
__global__ void __launch_bounds__(R * TPR, 1024 / (R * TPR)) dkdv_rect_kernel(attn_params p)
{
    extern __shared__ float sm[];
    const int D = p.D, Dv = p.Dv;
    const int KP = pitch_row(D), VP = pitch_row(Dv), QP = pitch_col(D), OP = pitch_col(Dv), PP = pitch_row(R);
    float *Ks = sm, *Vs = Ks + R * KP, *dKs = Vs + R * VP, *dVs = dKs + R * KP, *Qs = dVs + R * VP;
    float *dOs = Qs + R * QP, *PTs = dOs + R * OP, *dSTs = PTs + R * PP, *lse2s = dSTs + R * PP, *drs = lse2s + R;
    const int r = threadIdx.x / TPR, c8 = threadIdx.x % TPR;
    const tile_head th = tile_head_at(p.rs.by_k, blockIdx.x);
    const int tile = th.tile, hk = th.h;
    const int64_t b = blockIdx.z, k0 = (int64_t)tile * R, j = k0 + r;
    const int64_t nk = p.Sk - k0 < R ? p.Sk - k0 : R;
    const int bs = p.rs.by_k.start[tile], be = p.rs.by_k.start[tile + 1];

    load_tile<R>(Ks, KP, p.k, p.dt, b, k0, p.Sk, hk, D, 1.0f);
    load_tile<R>(Vs, VP, p.v, p.dt, b, k0, p.Sk, hk, Dv, 1.0f);
    zero_tile<R>(dKs, KP, D);
    zero_tile<R>(dVs, VP, Dv);
    __syncthreads();
    bool seen = false; // some query row sees key j
    for (int bi = bs; bi < be; bi++) {
        const band bd = p.rs.bands[p.rs.by_k.ids[bi]];
        int64_t qlo, qhi, jlo = 0, jhi = 0; // rows that see the tile's keys; key j's (none outside the band)
        tile_queries(bd, k0, nk, &qlo, &qhi);
        if (j >= bd.k0 && j < bd.k1)
            band_queries(bd, j, &jlo, &jhi);
        seen = seen || jlo < jhi;
        for (int g = 0; g < p.G; g++) {
            const int h = hk * p.G + g;
            for (int64_t i0 = qlo; i0 < qhi; i0 += R) {
                __syncthreads(); // the previous query tile is no longer read
                load_tile<R>(Qs, QP, p.q, p.dt, b, i0, bd.q1, h, D, 1.0f);
                load_tile<R>(dOs, OP, p.dout, p.odt, b, i0, bd.q1, h, Dv, 1.0f);
                for (int e = threadIdx.x; e < R; e += blockDim.x) {
                    const int64_t i = i0 + e;
                    lse2s[e] = i < bd.q1 ? lse2_of(p.lse[b * p.lsb + h * p.lsh + i]) : INFINITY;
                    drs[e] = i < bd.q1 ? p.drow[b * p.drb + h * p.drh + i] : 0.0f;
                }
                __syncthreads();
                const int lo = tile_col<R>(jlo, i0), hi = tile_col<R>(jhi, i0); // rows that see key j
#pragma unroll
                for (int u = 0; u < R / TPR; u++) {
                    const int ii = c8 + TPR * u;
                    float s = 0.0f, dp = 0.0f;
                    for (int d = 0; d < D; d++)
                        s += Ks[r * KP + d] * Qs[ii * QP + d];
                    for (int d = 0; d < Dv; d++)
                        dp += Vs[r * VP + d] * dOs[ii * OP + d];
                    rect_p_ds(p, ii >= lo && ii < hi, s, dp, lse2s[ii], drs[ii], &PTs[r * PP + ii],
                              &dSTs[r * PP + ii]);
                }
                __syncwarp();
                for (int d = c8; d < Dv; d += TPR) {
                    float acc = dVs[r * VP + d];
                    for (int ii = lo; ii < hi; ii++)
                        acc += PTs[r * PP + ii] * dOs[ii * OP + d];
                    dVs[r * VP + d] = acc;
                }
                for (int d = c8; d < D; d += TPR) {
                    float acc = dKs[r * KP + d];
                    for (int ii = lo; ii < hi; ii++)
                        acc += dSTs[r * PP + ii] * Qs[ii * QP + d];
                    dKs[r * KP + d] = acc;
                }
            }
        }
    }
    if (j >= p.Sk || (p.grad_accumulate && !seen))
        return; // past the block, or nothing to add
    const int64_t ok = at(p.dk, b, j, hk), ov = at(p.dv, b, j, hk);
    for (int d = c8; d < D; d += TPR)
        store_grad(const_cast<void *>(p.dk.p), p.gdt, ok + d, dKs[r * KP + d], p.grad_accumulate);
    for (int d = c8; d < Dv; d += TPR)
        store_grad(const_cast<void *>(p.dv.p), p.gdt, ov + d, dVs[r * VP + d], p.grad_accumulate);
}

// dQ of a query tile of one head (tile_head_at) over the key tiles of its
// bands.
template <int R>
__global__ void __launch_bounds__(R * TPR) dq_rect_kernel(attn_params p)
{
    extern __shared__ float sm[];
    const int D = p.D, Dv = p.Dv;
    const int QP = pitch_row(D), OP = pitch_row(Dv), KP = pitch_col(D), VP = pitch_col(Dv), PP = pitch_row(R);
    float *Qs = sm, *dQs = Qs + R * QP, *dOs = dQs + R * QP, *Ks = dOs + R * OP, *Vs = Ks + R * KP;
    float *dSs = Vs + R * VP;
    const int r = threadIdx.x / TPR, c8 = threadIdx.x % TPR;
    const tile_head th = tile_head_at(p.rs.by_q, blockIdx.x);
    const int tile = th.tile, h = th.h, hk = h / p.G;
    const int64_t b = blockIdx.z, i0 = (int64_t)tile * R, i = i0 + r;
    const int64_t nq = p.Sq - i0 < R ? p.Sq - i0 : R;
    const int bs = p.rs.by_q.start[tile], be = p.rs.by_q.start[tile + 1];

    load_tile<R>(Qs, QP, p.q, p.dt, b, i0, p.Sq, h, D, 1.0f);
    load_tile<R>(dOs, OP, p.dout, p.odt, b, i0, p.Sq, h, Dv, 1.0f);
    zero_tile<R>(dQs, QP, D);
    __syncthreads();
    const float lse2 = i < p.Sq ? lse2_of(p.lse[b * p.lsb + h * p.lsh + i]) : INFINITY;
    const float dr = i < p.Sq ? p.drow[b * p.drb + h * p.drh + i] : 0.0f;
    bool seen = false; // row i sees some key
    for (int bi = bs; bi < be; bi++) {
        const band bd = p.rs.bands[p.rs.by_q.ids[bi]];
        int64_t klo, khi, rlo = 0, rhi = 0;
        tile_keys(bd, i0, nq, &klo, &khi);
        if (i >= bd.q0 && i < bd.q1)
            band_keys(bd, i, &rlo, &rhi);
        seen = seen || rlo < rhi;
        for (int64_t k0 = klo; k0 < khi; k0 += R) {
            __syncthreads();
            load_tile<R>(Ks, KP, p.k, p.dt, b, k0, bd.k1, hk, D, 1.0f);
            load_tile<R>(Vs, VP, p.v, p.dt, b, k0, bd.k1, hk, Dv, 1.0f);
            __syncthreads();
            const int lo = tile_col<R>(rlo, k0), hi = tile_col<R>(rhi, k0);
#pragma unroll
            for (int u = 0; u < R / TPR; u++) {
                const int jj = c8 + TPR * u;
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < D; d++)
                    s += Qs[r * QP + d] * Ks[jj * KP + d];
                for (int d = 0; d < Dv; d++)
                    dp += dOs[r * OP + d] * Vs[jj * VP + d];
                float pv;
                rect_p_ds(p, jj >= lo && jj < hi, s, dp, lse2, dr, &pv, &dSs[r * PP + jj]);
            }
            __syncwarp();
            for (int d = c8; d < D; d += TPR) {
                float acc = dQs[r * QP + d];
                for (int jj = lo; jj < hi; jj++)
                    acc += dSs[r * PP + jj] * Ks[jj * KP + d];
                dQs[r * QP + d] = acc;
            }
        }
    }
    if (i >= p.Sq || (p.grad_accumulate && !seen))
        return;
    const int64_t oq = at(p.dq, b, i, h);
    for (int d = c8; d < D; d += TPR)
        store_grad(const_cast<void *>(p.dq.p), p.gdt, oq + d, dQs[r * QP + d], p.grad_accumulate);
}

// The largest row count whose tiles fit; 0 if none.
template <template <int> class S>
int rows_for(const state *s, const attn_params &p)
{
    if (S<32>::floats(p.D, p.Dv) * 4 <= (size_t)s->smem_optin)
        return 32;
    if (S<16>::floats(p.D, p.Dv) * 4 <= (size_t)s->smem_optin)
        return 16;
    if (S<8>::floats(p.D, p.Dv) * 4 <= (size_t)s->smem_optin)
        return 8;
    return 0;
}

template <template <int> class S, int R>
cp_status launch(state *s, void (*kernel)(attn_params), const attn_params &p, int64_t tiles, int heads,
                 const char *what)
{
    const int bytes = (int)(S<R>::floats(p.D, p.Dv) * 4);
    cp_status r = allow_smem((const void *)kernel, bytes, what);
    if (r != CP_SUCCESS)
        return r;
    dim3 grid((unsigned)tiles, (unsigned)heads, (unsigned)p.B);
    kernel<<<grid, R * TPR, bytes, s->stream>>>(p);
    return check_launch(what);
}

// The tile index's launch: grid.x = tiles x heads (the kernel takes tile
// and head by tile_head_at), the batch in grid.z.
template <template <int> class S, int R>
cp_status launch_rect(state *s, void (*kernel)(attn_params), const attn_params &p, int ntiles, int heads,
                      const char *what)
{
    const int bytes = (int)(S<R>::floats(p.D, p.Dv) * 4);
    cp_status r = allow_smem((const void *)kernel, bytes, what);
    if (r != CP_SUCCESS)
        return r;
    dim3 grid((unsigned)((int64_t)ntiles * heads), 1, (unsigned)p.B);
    kernel<<<grid, R * TPR, bytes, s->stream>>>(p);
    return check_launch(what);
}

// Whether tiles of R rows over n rows, times heads, fit grid.x (and the
// tile index's int ids).
bool rect_grid_fits(int64_t n, int R, int heads)
{
    return R > 0 && (n + R - 1) / R <= INT_MAX / heads;
}

// The forward reads no key-tile index: a coarse one costs the host less.
constexpr int FWD_UNUSED_K_TILE = 4096;

template <int R>
cp_status rect_forward(state *s, const attn_params &p0)
{
    attn_params p = p0;
    void *buf;
    cp_status r = rect_upload(s, &p, R, FWD_UNUSED_K_TILE, &buf);
    if (r != CP_SUCCESS)
        return r;
    r = launch_rect<fwd_smem, R>(s, fwd_rect_kernel<R>, p, p.rs.by_q.ntiles, p.H,
                                 "attention forward (simt, rectangles)");
    return rect_release(s, buf, r);
}

template <int RK>
cp_status rect_dkdv(state *s, const attn_params &p)
{
    return launch_rect<dkdv_smem, RK>(s, dkdv_rect_kernel<RK>, p, p.rs.by_k.ntiles, p.Hkv,
                                      "attention backward dK/dV (simt, rectangles)");
}

template <int RQ>
cp_status rect_dq(state *s, const attn_params &p)
{
    return launch_rect<dq_smem, RQ>(s, dq_rect_kernel<RQ>, p, p.rs.by_q.ntiles, p.H,
                                    "attention backward dQ (simt, rectangles)");
}

cp_status rect_backward(state *s, const attn_params &p0)
{
    const int RK = rows_for<dkdv_smem>(s, p0), RQ = rows_for<dq_smem>(s, p0);
    attn_params p = p0;
    void *buf;
    cp_status r = rect_upload(s, &p, RQ, RK, &buf);
    if (r != CP_SUCCESS)
        return r;
    r = RK == 32 ? rect_dkdv<32>(s, p) : RK == 16 ? rect_dkdv<16>(s, p) : rect_dkdv<8>(s, p);
    if (r == CP_SUCCESS)
        r = RQ == 32 ? rect_dq<32>(s, p) : RQ == 16 ? rect_dq<16>(s, p) : rect_dq<8>(s, p);
    return rect_release(s, buf, r);
}

} // namespace

bool simt_fits(const state *s, const attn_params &p, int backward)
{
    if (p.rects) {
        // grid.x = tiles x heads, grid.z = batch
        if (p.B > 65535)
            return false;
        if (!backward)
            return rect_grid_fits(p.Sq, rows_for<fwd_smem>(s, p), p.H);
        return rect_grid_fits(p.Sk, rows_for<dkdv_smem>(s, p), p.Hkv) &&
               rect_grid_fits(p.Sq, rows_for<dq_smem>(s, p), p.H);
    }
    if ((p.Sq + 7) / 8 > 0x7fffffff || (p.Sk + 7) / 8 > 0x7fffffff || p.B > 65535 || p.H > 65535)
        return false;
    if (!backward)
        return rows_for<fwd_smem>(s, p) > 0;
    return rows_for<dkdv_smem>(s, p) > 0 && rows_for<dq_smem>(s, p) > 0;
}

#define CU_SIMT_LAUNCH(SMEM, KERNEL, ROWS, HEADS, WHAT)                                                         \
    do {                                                                                                       \
        const int R_ = rows_for<SMEM>(s, p);                                                                   \
        cp_status r_;                                                                                          \
        if (R_ == 32)                                                                                          \
            r_ = launch<SMEM, 32>(s, KERNEL<32>, p, ((ROWS) + 31) / 32, HEADS, WHAT);                          \
        else if (R_ == 16)                                                                                     \
            r_ = launch<SMEM, 16>(s, KERNEL<16>, p, ((ROWS) + 15) / 16, HEADS, WHAT);                          \
        else                                                                                                   \
            r_ = launch<SMEM, 8>(s, KERNEL<8>, p, ((ROWS) + 7) / 8, HEADS, WHAT);                              \
        if (r_ != CP_SUCCESS)                                                                                  \
            return r_;                                                                                         \
    } while (0)

// With p.rects: the rectangle kernels, the call's list uploaded for their
// tiles and freed (stream-ordered) after them.
cp_status simt_forward(state *s, const attn_params &p)
{
    if (p.rects) {
        const int R = rows_for<fwd_smem>(s, p);
        return R == 32 ? rect_forward<32>(s, p) : R == 16 ? rect_forward<16>(s, p) : rect_forward<8>(s, p);
    }
    CU_SIMT_LAUNCH(fwd_smem, fwd_kernel, p.Sq, p.H, "attention forward (simt)");
    return CP_SUCCESS;
}

cp_status simt_backward(state *s, const attn_params &p)
{
    if (p.rects)
        return rect_backward(s, p);
    CU_SIMT_LAUNCH(dkdv_smem, dkdv_kernel, p.Sk, p.Hkv, "attention backward dK/dV (simt)");
    CU_SIMT_LAUNCH(dq_smem, dq_kernel, p.Sq, p.H, "attention backward dQ (simt)");
    return CP_SUCCESS;
}

} // namespace cu
