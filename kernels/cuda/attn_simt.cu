// SPDX-License-Identifier: MIT
// Fused block attention in plain fp32 arithmetic: the exact path for F32
// (no TF32, accurate exp2 / log2) and the generic path for any dtype and any
// head dim whose tiles fit in shared memory.
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

    load_tile<R>(Qs, QP, p.q, p.dt, b, i0, p.Sq, h, D, p.c); // base-2 scores
    zero_tile<R>(Os, OP, Dv);
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    const int64_t kend = visible_keys(p, i0 + nq - 1);
    for (int64_t k0 = 0; k0 < kend; k0 += R) {
        __syncthreads(); // the previous tile is no longer read
        load_tile<R>(Ks, KP, p.k, p.dt, b, k0, p.Sk, hk, D, 1.0f);
        load_tile<R>(Vs, Dv, p.v, p.dt, b, k0, p.Sk, hk, Dv, 1.0f);
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
        for (int dv = c8; dv < Dv; dv += TPR) {
            float acc = Os[r * OP + dv] * alpha;
            for (int j = 0; j < R; j++)
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
            for (int d = c8; d < Dv; d += TPR) {
                float acc = dVs[r * VP + d];
                for (int ii = 0; ii < R; ii++)
                    acc += PTs[r * PP + ii] * dOs[ii * OP + d];
                dVs[r * VP + d] = acc;
            }
            for (int d = c8; d < D; d += TPR) {
                float acc = dKs[r * KP + d];
                for (int ii = 0; ii < R; ii++)
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
        for (int d = c8; d < D; d += TPR) {
            float acc = dQs[r * QP + d];
            for (int jj = 0; jj < R; jj++)
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

} // namespace

bool simt_fits(const state *s, const attn_params &p, int backward)
{
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

cp_status simt_forward(state *s, const attn_params &p)
{
    CU_SIMT_LAUNCH(fwd_smem, fwd_kernel, p.Sq, p.H, "attention forward (simt)");
    return CP_SUCCESS;
}

cp_status simt_backward(state *s, const attn_params &p)
{
    CU_SIMT_LAUNCH(dkdv_smem, dkdv_kernel, p.Sk, p.Hkv, "attention backward dK/dV (simt)");
    CU_SIMT_LAUNCH(dq_smem, dq_kernel, p.Sq, p.H, "attention backward dQ (simt)");
    return CP_SUCCESS;
}

} // namespace cu
