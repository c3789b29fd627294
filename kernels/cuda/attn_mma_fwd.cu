// SPDX-License-Identifier: MIT
// Fused flash-style block attention forward on tensor cores (F16 / BF16).
//
// A block of 4 warps owns 64 or 128 query rows of one (batch, head); each
// warp owns 16 or 32 of them (one or two row tiles, sharing every K / V
// fragment) and keeps their output (fp32) and running max / sum in registers.
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

template <typename T, int DP, int MT>
__global__ void __launch_bounds__(128) fwd_mma_kernel(attn_params p)
{
    constexpr int BQ = 64 * MT, BK = fwd_bk(DP), PITCH = DP + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem), *Ks = Qs + BQ * PITCH, *Vs = Ks + BK * PITCH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const fwd_block w = fwd_block_of<BQ, BK>(p);
    const int64_t i0 = w.i0, b = w.b;
    const int h = w.h, hk = w.hk, ntiles = w.ntiles;
    const int wrow = warp * 16 * MT;      // the warp's first row in the tile
    const int64_t row0 = i0 + wrow + g;   // this thread's rows: row0 + 16 mt + 8 r

    load_tile<T, BQ, DP>(Qs, p.q, b, i0, p.Sq, h, p.D, p.vec);
    if (ntiles > 0)
        load_tile<T, BK, DP>(Ks, p.k, b, 0, p.Sk, hk, p.D, p.vec);
    cp_async_commit();

    float acc[MT][DP / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nb = 0; nb < DP / 8; nb++)
            acc[mt][nb][0] = acc[mt][nb][1] = acc[mt][nb][2] = acc[mt][nb][3] = 0.0f;
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

    for (int n = 0; n < ntiles; n++) {
        const int64_t k0 = (int64_t)n * BK;
        cp_async_wait_all();
        __syncthreads(); // K tile n is in; every warp is done with V tile n-1
        load_tile<T, BK, DP>(Vs, v_of(p), b, k0, p.Sk, hk, p.Dv, p.vec);
        cp_async_commit();

        float s[MT][BK / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nb = 0; nb < BK / 8; nb++)
                s[mt][nb][0] = s[mt][nb][1] = s[mt][nb][2] = s[mt][nb][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                load_a<PITCH>(a[mt], Qs, wrow + mt * 16, kk * 16, lane);
#pragma unroll
            for (int nb2 = 0; nb2 < BK / 16; nb2++) {
                uint32_t bb[4];
                load_b_nk<PITCH>(bb, Ks, nb2 * 16, kk * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816<T>(s[mt][2 * nb2], a[mt], bb[0], bb[1]);
                    mma16816<T>(s[mt][2 * nb2 + 1], a[mt], bb[2], bb[3]);
                }
            }
        }

        // base-2 scores, masked where this tile reaches past the block or
        // across the diagonal; then the online softmax of each row
        const bool masked = k0 + BK > p.Sk || (p.causal && k0 + BK - 1 > i0 + p.delta);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float alpha[2];
            softmax_tile(s[mt], m[mt], l[mt], alpha, p, masked, k0, row0 + mt * 16, tq);
            scale_rows(acc[mt], alpha);
        }

        cp_async_wait_all();
        __syncthreads(); // V tile n is in; every warp is done with K tile n
        if (n + 1 < ntiles) {
            load_tile<T, BK, DP>(Ks, p.k, b, k0 + BK, p.Sk, hk, p.D, p.vec);
            cp_async_commit();
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                c_to_a<T>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
            for (int nb2 = 0; nb2 < DP / 16; nb2++) {
                uint32_t bb[4];
                load_b_kn<PITCH>(bb, Vs, nb2 * 16, kk * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816<T>(acc[mt][2 * nb2], a[mt], bb[0], bb[1]);
                    mma16816<T>(acc[mt][2 * nb2 + 1], a[mt], bb[2], bb[3]);
                }
            }
        }
    }

    // normalise and write, or merge into the running (o, lse)
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        store_rows(p, acc[mt], m[mt], l[mt], row0 + mt * 16, b, h, tq);
}

template <typename T, int DP, int MT>
cp_status launch_fwd(state *s, const attn_params &p)
{
    const int bytes = fwd_smem(DP, MT);
    auto kernel = fwd_mma_kernel<T, DP, MT>;
    cp_status r = allow_smem((const void *)kernel, bytes, "attention forward (mma)");
    if (r != CP_SUCCESS)
        return r;
    dim3 grid((unsigned)((p.Sq + 64 * MT - 1) / (64 * MT)), (unsigned)p.H, (unsigned)p.B);
    kernel<<<grid, 128, bytes, s->stream>>>(p);
    return check_launch("attention forward (mma)");
}

template <typename T>
cp_status forward_t(state *s, const attn_params &p)
{
    const bool one = s->knob.fwd_mt == 1;
    switch (padded_dim(p.D, p.Dv)) {
    case 64: return launch_fwd<T, 64, fwd_mt(64)>(s, p);
    case 128: return one ? launch_fwd<T, 128, 1>(s, p) : launch_fwd<T, 128, fwd_mt(128)>(s, p);
    default: return launch_fwd<T, 256, fwd_mt(256)>(s, p);
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
        return p.B <= 65535 && fwd_smem(DP, fwd_mt(DP)) <= s->smem_optin;
    // dO must be in the storage type to be a tensor-core operand
    return p.odt == p.dt && p.B * (DP / dkdv_dc(DP)) <= 65535 && dkdv_smem(DP) <= s->smem_optin &&
           dq_smem(DP) <= s->smem_optin;
}

cp_status mma_forward(state *s, const attn_params &p)
{
    return p.dt == CP_DTYPE_BF16 ? forward_t<__nv_bfloat16>(s, p) : forward_t<__half>(s, p);
}

} // namespace cu
