// SPDX-License-Identifier: MIT
// Fused block attention backward on tensor cores (F16 / BF16), deterministic:
// no atomics, every gradient element is owned by one thread.
//
// dK/dV kernel: a block of 4 warps owns 64 key rows of one kv head (16 per
// warp) and walks over every query head of its GQA group and every query
// tile that sees its keys, computing the transposed products directly
// (S^T = K Q^T, dP^T = V dO^T), so P^T and dS^T land in registers in the A
// layout of dV += P^T dO and dK += dS^T Q. For head dim 256 the dK / dV
// accumulators are split into two column halves, one block each.
//
// dQ kernel: a block owns 64 query rows of one head and walks over the key
// tiles they see, recomputing S and dP, and accumulates dQ += dS K.
//
// P = 2^(S * scale * log2 e - LSE2) with LSE2 = +inf for rows that see no key
// (P = 0, no NaN); dS = scale * P * (dP - rowsum(dO * O)).
#include "mma.cuh"

namespace cu {
namespace {

using namespace mma;

template <typename T, int DP>
__global__ void __launch_bounds__(128) dkdv_mma_kernel(attn_params p)
{
    constexpr int BK = DKDV_BK, BQ = dkdv_bq(DP), DC = dkdv_dc(DP), NCH = DP / DC, PITCH = DP + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Ks = reinterpret_cast<T *>(smem), *Vs = Ks + BK * PITCH, *Qs = Vs + BK * PITCH, *dOs = Qs + BQ * PITCH;
    float *lse2s = reinterpret_cast<float *>(dOs + BQ * PITCH), *drs = lse2s + BQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int64_t k0 = (int64_t)blockIdx.x * BK;
    const int hk = blockIdx.y;
    const int64_t b = blockIdx.z / NCH;
    const int c0 = (int)(blockIdx.z % NCH) * DC;
    const int64_t jrow0 = k0 + warp * 16 + g; // this thread's key rows: jrow0, jrow0 + 8

    load_tile<T, BK, DP>(Ks, p.k, b, k0, p.Sk, hk, p.D, p.vec);
    load_tile<T, BK, DP>(Vs, p.v, b, k0, p.Sk, hk, p.Dv, p.vec);
    cp_async_commit();

    float adk[DC / 8][4], adv[DC / 8][4];
#pragma unroll
    for (int nb = 0; nb < DC / 8; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            adk[nb][c] = adv[nb][c] = 0.0f;

    const int64_t i_first = first_query(p, k0) / BQ * BQ;
    for (int gq = 0; gq < p.G; gq++) {
        const int h = hk * p.G + gq;
        for (int64_t i0 = i_first; i0 < p.Sq; i0 += BQ) {
            __syncthreads(); // every warp is done with the previous query tile
            load_tile<T, BQ, DP>(Qs, p.q, b, i0, p.Sq, h, p.D, p.vec);
            load_tile<T, BQ, DP>(dOs, p.dout, b, i0, p.Sq, h, p.Dv, p.vec);
            cp_async_commit();
            for (int e = threadIdx.x; e < BQ; e += blockDim.x) {
                const int64_t i = i0 + e;
                lse2s[e] = i < p.Sq ? lse2_of(p.lse[b * p.lsb + h * p.lsh + i]) : INFINITY;
                drs[e] = i < p.Sq ? p.drow[((int64_t)b * p.H + h) * p.Sq + i] : 0.0f;
            }
            cp_async_wait_all();
            __syncthreads();

            float st[BQ / 8][4], dpt[BQ / 8][4];
#pragma unroll
            for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    st[nb][c] = dpt[nb][c] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DP / 16; kk++) {
                uint32_t ak[4], av[4];
                load_a<PITCH>(ak, Ks, warp * 16, kk * 16, lane);
                load_a<PITCH>(av, Vs, warp * 16, kk * 16, lane);
#pragma unroll
                for (int nb2 = 0; nb2 < BQ / 16; nb2++) {
                    uint32_t bq[4], bo[4];
                    load_b_nk<PITCH>(bq, Qs, nb2 * 16, kk * 16, lane);
                    load_b_nk<PITCH>(bo, dOs, nb2 * 16, kk * 16, lane);
                    mma16816<T>(st[2 * nb2], ak, bq[0], bq[1]);
                    mma16816<T>(st[2 * nb2 + 1], ak, bq[2], bq[3]);
                    mma16816<T>(dpt[2 * nb2], av, bo[0], bo[1]);
                    mma16816<T>(dpt[2 * nb2 + 1], av, bo[2], bo[3]);
                }
            }
#pragma unroll
            for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int il = nb * 8 + 2 * tq + (c & 1);
                    const int64_t i = i0 + il, j = jrow0 + (c >> 1) * 8;
                    const bool vis = j < p.Sk && (!p.causal || j <= i + p.delta);
                    const float pv = vis ? exp2_fast(st[nb][c] * p.c - lse2s[il]) : 0.0f;
                    st[nb][c] = pv;
                    dpt[nb][c] = p.scale * pv * (dpt[nb][c] - drs[il]);
                }
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) {
                uint32_t ap[4], as[4];
                c_to_a<T>(ap, st[2 * kk], st[2 * kk + 1]);
                c_to_a<T>(as, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
                for (int nb2 = 0; nb2 < DC / 16; nb2++) {
                    uint32_t bo[4], bq[4];
                    load_b_kn<PITCH>(bo, dOs, c0 + nb2 * 16, kk * 16, lane);
                    load_b_kn<PITCH>(bq, Qs, c0 + nb2 * 16, kk * 16, lane);
                    mma16816<T>(adv[2 * nb2], ap, bo[0], bo[1]);
                    mma16816<T>(adv[2 * nb2 + 1], ap, bo[2], bo[3]);
                    mma16816<T>(adk[2 * nb2], as, bq[0], bq[1]);
                    mma16816<T>(adk[2 * nb2 + 1], as, bq[2], bq[3]);
                }
            }
        }
    }
    if (p.grad_accumulate && i_first >= p.Sq)
        return; // no query sees these keys: nothing to add
    void *dk = const_cast<void *>(p.dk.p), *dv = const_cast<void *>(p.dv.p);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t j = jrow0 + r * 8;
        if (j >= p.Sk)
            continue;
        const int64_t ok = at(p.dk, b, j, hk), ov = at(p.dv, b, j, hk);
#pragma unroll
        for (int nb = 0; nb < DC / 8; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = c0 + nb * 8 + 2 * tq + e;
                if (d < p.D)
                    store_grad(dk, p.gdt, ok + d, adk[nb][2 * r + e], p.grad_accumulate);
                if (d < p.Dv)
                    store_grad(dv, p.gdt, ov + d, adv[nb][2 * r + e], p.grad_accumulate);
            }
    }
}

template <typename T, int DP>
__global__ void __launch_bounds__(128) dq_mma_kernel(attn_params p)
{
    constexpr int BQ = DQ_BQ, BK = dq_bk(DP), PITCH = DP + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem), *dOs = Qs + BQ * PITCH, *Ks = dOs + BQ * PITCH, *Vs = Ks + BK * PITCH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int64_t i0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * BQ;
    const int h = blockIdx.y, hk = h / p.G;
    const int64_t b = blockIdx.z;
    const int64_t nq = p.Sq - i0 < BQ ? p.Sq - i0 : BQ;
    const int64_t kend = visible_keys(p, i0 + nq - 1);
    const int ntiles = (int)((kend + BK - 1) / BK);
    const int64_t row0 = i0 + warp * 16 + g;

    load_tile<T, BQ, DP>(Qs, p.q, b, i0, p.Sq, h, p.D, p.vec);
    load_tile<T, BQ, DP>(dOs, p.dout, b, i0, p.Sq, h, p.Dv, p.vec);
    cp_async_commit();
    float lse2[2], dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = row0 + r * 8;
        lse2[r] = i < p.Sq ? lse2_of(p.lse[b * p.lsb + h * p.lsh + i]) : INFINITY;
        dr[r] = i < p.Sq ? p.drow[((int64_t)b * p.H + h) * p.Sq + i] : 0.0f;
    }
    float adq[DP / 8][4];
#pragma unroll
    for (int nb = 0; nb < DP / 8; nb++)
        adq[nb][0] = adq[nb][1] = adq[nb][2] = adq[nb][3] = 0.0f;

    for (int n = 0; n < ntiles; n++) {
        const int64_t k0 = (int64_t)n * BK;
        __syncthreads(); // every warp is done with the previous key tile
        load_tile<T, BK, DP>(Ks, p.k, b, k0, p.Sk, hk, p.D, p.vec);
        load_tile<T, BK, DP>(Vs, p.v, b, k0, p.Sk, hk, p.Dv, p.vec);
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();

        float s[BK / 8][4], dp[BK / 8][4];
#pragma unroll
        for (int nb = 0; nb < BK / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                s[nb][c] = dp[nb][c] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t aq[4], ao[4];
            load_a<PITCH>(aq, Qs, warp * 16, kk * 16, lane);
            load_a<PITCH>(ao, dOs, warp * 16, kk * 16, lane);
#pragma unroll
            for (int nb2 = 0; nb2 < BK / 16; nb2++) {
                uint32_t bk[4], bv[4];
                load_b_nk<PITCH>(bk, Ks, nb2 * 16, kk * 16, lane);
                load_b_nk<PITCH>(bv, Vs, nb2 * 16, kk * 16, lane);
                mma16816<T>(s[2 * nb2], aq, bk[0], bk[1]);
                mma16816<T>(s[2 * nb2 + 1], aq, bk[2], bk[3]);
                mma16816<T>(dp[2 * nb2], ao, bv[0], bv[1]);
                mma16816<T>(dp[2 * nb2 + 1], ao, bv[2], bv[3]);
            }
        }
#pragma unroll
        for (int nb = 0; nb < BK / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int64_t j = k0 + nb * 8 + 2 * tq + (c & 1), i = row0 + (c >> 1) * 8;
                const bool vis = j < p.Sk && (!p.causal || j <= i + p.delta);
                const float pv = vis ? exp2_fast(s[nb][c] * p.c - lse2[c >> 1]) : 0.0f;
                s[nb][c] = p.scale * pv * (dp[nb][c] - dr[c >> 1]);
            }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t a[4];
            c_to_a<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int nb2 = 0; nb2 < DP / 16; nb2++) {
                uint32_t bb[4];
                load_b_kn<PITCH>(bb, Ks, nb2 * 16, kk * 16, lane);
                mma16816<T>(adq[2 * nb2], a, bb[0], bb[1]);
                mma16816<T>(adq[2 * nb2 + 1], a, bb[2], bb[3]);
            }
        }
    }
    if (p.grad_accumulate && ntiles == 0)
        return;
    void *dq = const_cast<void *>(p.dq.p);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = row0 + r * 8;
        if (i >= p.Sq)
            continue;
        const int64_t o = at(p.dq, b, i, h);
#pragma unroll
        for (int nb = 0; nb < DP / 8; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = nb * 8 + 2 * tq + e;
                if (d < p.D)
                    store_grad(dq, p.gdt, o + d, adq[nb][2 * r + e], p.grad_accumulate);
            }
    }
}

template <typename T, int DP>
cp_status launch_bwd(state *s, const attn_params &p)
{
    auto k1 = dkdv_mma_kernel<T, DP>;
    auto k2 = dq_mma_kernel<T, DP>;
    const int b1 = dkdv_smem(DP), b2 = dq_smem(DP);
    cp_status r;
    if ((r = allow_smem((const void *)k1, b1, "attention backward dK/dV (mma)")) != CP_SUCCESS ||
        (r = allow_smem((const void *)k2, b2, "attention backward dQ (mma)")) != CP_SUCCESS)
        return r;
    dim3 g1((unsigned)((p.Sk + DKDV_BK - 1) / DKDV_BK), (unsigned)p.Hkv, (unsigned)(p.B * (DP / dkdv_dc(DP))));
    k1<<<g1, 128, b1, s->stream>>>(p);
    if ((r = check_launch("attention backward dK/dV (mma)")) != CP_SUCCESS)
        return r;
    dim3 g2((unsigned)((p.Sq + DQ_BQ - 1) / DQ_BQ), (unsigned)p.H, (unsigned)p.B);
    k2<<<g2, 128, b2, s->stream>>>(p);
    return check_launch("attention backward dQ (mma)");
}

template <typename T>
cp_status backward_t(state *s, const attn_params &p)
{
    switch (padded_dim(p.D, p.Dv)) {
    case 64: return launch_bwd<T, 64>(s, p);
    case 128: return launch_bwd<T, 128>(s, p);
    default: return launch_bwd<T, 256>(s, p);
    }
}

} // namespace

cp_status mma_backward(state *s, const attn_params &p)
{
    return p.dt == CP_DTYPE_BF16 ? backward_t<__nv_bfloat16>(s, p) : backward_t<__half>(s, p);
}

} // namespace cu
