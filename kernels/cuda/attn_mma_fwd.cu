// SPDX-License-Identifier: MIT
// Fused flash-style block attention forward on tensor cores (F16 / BF16).
//
// A block of 4 warps owns 64 query rows of one (batch, head); each warp owns
// 16 rows and keeps their output (fp32) and running max / sum in registers.
// Key tiles stream through shared memory: the V tile of step n loads while
// the scores of step n are computed, the K tile of step n+1 while P V of step
// n is. Key tiles that the causal mask hides entirely are never visited;
// only tiles that cross the diagonal or the end of the block are masked.
// Probabilities are kept relative to the running maximum (each in (0, 1])
// and rounded to 16 bits for the P V product, which has the same relative
// rounding as rounding the normalised probability; the sum is taken in fp32.
#include "mma.cuh"

namespace cu {
namespace {

using namespace mma;

template <typename T, int DP>
__global__ void __launch_bounds__(128) fwd_mma_kernel(attn_params p)
{
    constexpr int BQ = FWD_BQ, BK = fwd_bk(DP), PITCH = DP + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem), *Ks = Qs + BQ * PITCH, *Vs = Ks + BK * PITCH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int64_t i0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * BQ; // most keys first under a causal mask
    const int h = blockIdx.y, hk = h / p.G;
    const int64_t b = blockIdx.z;
    const int64_t nq = p.Sq - i0 < BQ ? p.Sq - i0 : BQ;
    const int64_t kend = visible_keys(p, i0 + nq - 1);
    const int ntiles = (int)((kend + BK - 1) / BK);
    const int64_t row0 = i0 + warp * 16 + g; // this thread's rows: row0, row0 + 8

    load_tile<T, BQ, DP>(Qs, p.q, b, i0, p.Sq, h, p.D, p.vec);
    if (ntiles > 0)
        load_tile<T, BK, DP>(Ks, p.k, b, 0, p.Sk, hk, p.D, p.vec);
    cp_async_commit();

    float acc[DP / 8][4];
#pragma unroll
    for (int nb = 0; nb < DP / 8; nb++)
        acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int n = 0; n < ntiles; n++) {
        const int64_t k0 = (int64_t)n * BK;
        cp_async_wait_all();
        __syncthreads(); // K tile n is in; every warp is done with V tile n-1
        load_tile<T, BK, DP>(Vs, p.v, b, k0, p.Sk, hk, p.Dv, p.vec);
        cp_async_commit();

        float s[BK / 8][4];
#pragma unroll
        for (int nb = 0; nb < BK / 8; nb++)
            s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t a[4];
            load_a<PITCH>(a, Qs, warp * 16, kk * 16, lane);
#pragma unroll
            for (int nb2 = 0; nb2 < BK / 16; nb2++) {
                uint32_t bb[4];
                load_b_nk<PITCH>(bb, Ks, nb2 * 16, kk * 16, lane);
                mma16816<T>(s[2 * nb2], a, bb[0], bb[1]);
                mma16816<T>(s[2 * nb2 + 1], a, bb[2], bb[3]);
            }
        }

        // base-2 scores, masked where this tile reaches past the block or
        // across the diagonal
        const bool masked = k0 + BK > p.Sk || (p.causal && k0 + BK - 1 > i0 + p.delta);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < BK / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float x = s[nb][c] * p.c;
                if (masked) {
                    const int64_t j = k0 + nb * 8 + 2 * tq + (c & 1), i = row0 + (c >> 1) * 8;
                    if (j >= p.Sk || (p.causal && j > i + p.delta))
                        x = -INFINITY;
                }
                s[nb][c] = x;
                mx[c >> 1] = fmaxf(mx[c >> 1], x);
            }
        float mu[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float mnew = fmaxf(m[r], quad_max(mx[r]));
            mu[r] = mnew == -INFINITY ? 0.0f : mnew; // no key seen yet: 2^(-inf - 0) = 0
            alpha[r] = exp2_fast(m[r] - mu[r]);
            m[r] = mnew;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int nb = 0; nb < BK / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                s[nb][c] = exp2_fast(s[nb][c] - mu[c >> 1]);
                l[c >> 1] += s[nb][c];
            }
#pragma unroll
        for (int nb = 0; nb < DP / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[nb][c] *= alpha[c >> 1];

        cp_async_wait_all();
        __syncthreads(); // V tile n is in; every warp is done with K tile n
        if (n + 1 < ntiles) {
            load_tile<T, BK, DP>(Ks, p.k, b, k0 + BK, p.Sk, hk, p.D, p.vec);
            cp_async_commit();
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t a[4];
            c_to_a<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int nb2 = 0; nb2 < DP / 16; nb2++) {
                uint32_t bb[4];
                load_b_kn<PITCH>(bb, Vs, nb2 * 16, kk * 16, lane);
                mma16816<T>(acc[2 * nb2], a, bb[0], bb[1]);
                mma16816<T>(acc[2 * nb2 + 1], a, bb[2], bb[3]);
            }
        }
    }

    // normalise and write, or merge into the running (o, lse)
    float old[2] = {0.0f, 0.0f};
    if (p.accumulate) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t i = row0 + r * 8;
            if (i < p.Sq)
                old[r] = p.lse[b * p.lsb + h * p.lsh + i];
        }
        __syncwarp(); // the quad has read the running LSE before lane tq = 0 writes it
    }
    void *op = const_cast<void *>(p.o.p);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = row0 + r * 8;
        const float lt = quad_sum(l[r]);
        if (i >= p.Sq)
            continue;
        const float lse_blk = lt > 0.0f ? (m[r] + log2f(lt)) * LN2 : -INFINITY;
        const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
        float *lse = p.lse + b * p.lsb + h * p.lsh + i;
        const int64_t o = at(p.o, b, i, h);
        float w1 = 0.0f, w2 = 1.0f, merged = lse_blk;
        if (p.accumulate && !merge_weights(old[r], lse_blk, &w1, &w2, &merged))
            continue;
#pragma unroll
        for (int nb = 0; nb < DP / 8; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = nb * 8 + 2 * tq + e;
                if (d < p.Dv)
                    store_merged(op, p.odt, o + d, acc[nb][2 * r + e] * inv, w1, w2);
            }
        if (tq == 0)
            *lse = merged;
    }
}

template <typename T, int DP>
cp_status launch_fwd(state *s, const attn_params &p)
{
    const int bytes = fwd_smem(DP);
    auto kernel = fwd_mma_kernel<T, DP>;
    cp_status r = allow_smem((const void *)kernel, bytes, "attention forward (mma)");
    if (r != CP_SUCCESS)
        return r;
    dim3 grid((unsigned)((p.Sq + FWD_BQ - 1) / FWD_BQ), (unsigned)p.H, (unsigned)p.B);
    kernel<<<grid, 128, bytes, s->stream>>>(p);
    return check_launch("attention forward (mma)");
}

template <typename T>
cp_status forward_t(state *s, const attn_params &p)
{
    switch (padded_dim(p.D, p.Dv)) {
    case 64: return launch_fwd<T, 64>(s, p);
    case 128: return launch_fwd<T, 128>(s, p);
    default: return launch_fwd<T, 256>(s, p);
    }
}

} // namespace

bool mma_fits(const state *s, const attn_params &p, int backward)
{
    if (p.dt != CP_DTYPE_F16 && p.dt != CP_DTYPE_BF16)
        return false;
    const int DP = padded_dim(p.D, p.Dv);
    if (!DP || p.H > 65535 || (p.Sq + 63) / 64 > 0x7fffffff || (p.Sk + 63) / 64 > 0x7fffffff)
        return false;
    if (!backward)
        return p.B <= 65535 && fwd_smem(DP) <= s->smem_optin;
    // dO must be in the storage type to be a tensor-core operand
    return p.odt == p.dt && p.B * (DP / dkdv_dc(DP)) <= 65535 && dkdv_smem(DP) <= s->smem_optin &&
           dq_smem(DP) <= s->smem_optin;
}

cp_status mma_forward(state *s, const attn_params &p)
{
    return p.dt == CP_DTYPE_BF16 ? forward_t<__nv_bfloat16>(s, p) : forward_t<__half>(s, p);
}

} // namespace cu
