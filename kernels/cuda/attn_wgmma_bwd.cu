// SPDX-License-Identifier: MIT
// Fused block attention backward for Hopper (sm_90a) on wgmma: the one-pass
// variant with atomic dQ (the contract of the atomic kernel of
// attn_mma_bwd.cu, which sets up p.dqa, clears and converts the sums; the
// deterministic backward stays on mma.sync).
//
// A block of two warpgroups owns 128 keys of one kv head (64 per warpgroup)
// and walks over every query head of its GQA group and every query tile of 64
// rows that sees its keys. Per tile, each warpgroup computes the transposed
// products S^T = K Q^T and dP^T = V dO^T with both operands in shared memory
// (K, V, Q, dO all K-major there), so that P^T and dS^T land in registers in
// the A layout of dV += P^T dO and dK += dS^T Q, whose B operands are the same
// dO and Q tiles read MN-major. dS^T also goes to shared memory ([key][query],
// one 128-byte row per key), where it is the MN-major A of dQ = dS K over the
// block's 128 keys; warpgroup w takes dQ's column half w, and adds its
// accumulators into the fp32 sums with vector reductions while dK += dS^T Q,
// issued after dQ, keeps the tensor cores busy.
//
// The Q / dO tiles, their LSE and rowsum(dO * O) are double-buffered with
// cp.async: tile n+1 loads while tile n is computed. Masking is branch-free
// (a per-row query limit and selects; see bench/NOTES.md: ptxas waits for
// every wgmma group at a branch join), so the probabilities of S^T are
// computed while dP^T is still in flight.
//
// P = 2^(S * scale * log2 e - LSE2) with LSE2 = +inf for rows that see no key
// (P = 0, no NaN); dS = scale * P * (dP - rowsum(dO * O)).
#include "wgmma.cuh"

namespace cu {
namespace {

using namespace mma;

constexpr int WB_THREADS = 256; // two warpgroups
constexpr int WB_BK = 128;      // keys per block, 64 per warpgroup
constexpr int WB_BQ = 64;       // query rows per tile

// Shared memory: K, V (WB_BK x DP), two stages of Q, dO (WB_BQ x DP), dS^T
// (WB_BK x WB_BQ), two stages of LSE and rowsum(dO * O), 1024 bytes of room
// to align the tiles to the swizzle's period.
constexpr int wgbwd_smem(int DP)
{
    return (2 * WB_BK + 4 * WB_BQ) * DP * 2 + WB_BK * WB_BQ * 2 + 2 * 2 * WB_BQ * 4 + 1024;
}

// How dQ reaches the fp32 sums (bench/NOTES.md). LATE_DK (the default):
// dK is issued after dQ, and dQ is added with 8-byte reductions straight
// from the accumulators while the tensor cores compute dK. Without it
// (INFINICP_CUDA_WGBWD=0, for comparison): dV and dK before the barrier,
// and 16-byte reductions after a lane shuffle once all three are done.
template <typename T, int DP, bool LATE_DK>
__global__ void __launch_bounds__(WB_THREADS, 1) bwd_wgmma_kernel(attn_params p)
{
#ifdef CP_WGMMA_BODY
    using namespace wg;
    constexpr int BK = WB_BK, BQ = WB_BQ, NQ = BQ / 8, ND = DP / 8, NH = DP / 16;
    constexpr uint32_t KB = BK * DP * 2, QB = BQ * DP * 2, SB = BK * BQ * 2; // tile bytes
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Ks = (smem_addr(smem) + 1023) & ~1023u, Vs = Ks + KB, Qs = Vs + KB, dOs = Qs + 2 * QB,
                   dSs = dOs + 2 * QB, Ls = dSs + SB; // Ls: [stage][lse | drow][BQ] floats
    const int wgi = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int64_t k0 = (int64_t)blockIdx.x * BK;
    const int hk = blockIdx.y;
    const int64_t b = blockIdx.z;
    const int64_t jrow0 = k0 + wgi * 64 + warp * 16 + g; // this thread's keys: jrow0, jrow0 + 8
    const int dcol0 = wgi * (DP / 2);                    // this warpgroup's dQ columns

    const int64_t i_first = first_query(p, k0) / BQ * BQ;
    const int64_t nt = i_first < p.Sq ? (p.Sq - i_first + BQ - 1) / BQ : 0; // query tiles per head
    const int64_t ntotal = nt * p.G;

    // Query tile t: head hk * G + t / nt, rows i_first + (t % nt) * BQ.
    auto load_q = [&](int64_t t) {
        const int h = hk * p.G + (int)(t / nt);
        const int64_t i0 = i_first + (t % nt) * BQ;
        const uint32_t st = (uint32_t)(t & 1);
        load_sw<T, BQ, DP, WB_THREADS>(Qs + st * QB, p.q, b, i0, p.Sq, h, p.D);
        load_sw<T, BQ, DP, WB_THREADS>(dOs + st * QB, p.dout, b, i0, p.Sq, h, p.Dv);
        if (threadIdx.x < 2 * BQ) {
            const int e = threadIdx.x % BQ;
            const bool is_lse = threadIdx.x < BQ;
            const int64_t i = i0 + e;
            const uint32_t dst = Ls + (st * 2 * BQ + threadIdx.x) * 4;
            if (i < p.Sq)
                cp_async4_to(dst, is_lse ? (const void *)(p.lse + b * p.lsb + h * p.lsh + i)
                                         : (const void *)(p.drow + b * p.drb + h * p.drh + i));
            else
                st_shared_f32(dst, is_lse ? -INFINITY : 0.0f); // P = 0 for rows past the end
        }
    };

    if (ntotal > 0) {
        load_sw<T, BK, DP, WB_THREADS>(Ks, p.k, b, k0, p.Sk, hk, p.D);
        load_sw<T, BK, DP, WB_THREADS>(Vs, p.v, b, k0, p.Sk, hk, p.Dv);
        load_q(0);
        cp_async_commit();
    }

    float adk[ND][4], adv[ND][4];
#pragma unroll
    for (int nb = 0; nb < ND; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            adk[nb][c] = adv[nb][c] = 0.0f;

    const uint32_t ka = Ks + wgi * 64 * 128, va = Vs + wgi * 64 * 128; // this warpgroup's 64 keys
    // dQ's B = K columns [dcol0, dcol0 + DP / 2), MN-major
    const uint32_t kb = Ks + (dcol0 >> 6) * BK * 128 + (dcol0 & 63) * 2;
    const float scale = p.scale, c2 = p.c;

    for (int64_t t = 0; t < ntotal; t++) {
        const int h = hk * p.G + (int)(t / nt);
        const int64_t i0 = i_first + (t % nt) * BQ;
        const uint32_t st = (uint32_t)(t & 1);
        const uint32_t qt = Qs + st * QB, ot = dOs + st * QB, lt = Ls + st * 2 * BQ * 4;
        cp_async_wait_all();
        fence_proxy_async(); // tiles written through the generic proxy, read by wgmma through the async one
        __syncthreads();     // tile t is in; every product of tile t - 1 is done
        if (t + 1 < ntotal) {
            load_q(t + 1);
            cp_async_commit();
        }

        float s[NQ][4], dp[NQ][4];
        reg_fence(adk);
        reg_fence(adv);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < NH; kk++) // 64-column block kk / 4, 32 bytes per k16 step inside it
            mma_ss<T, 0, 0>(s, sw128_desc(ka + (kk >> 2) * BK * 128 + (kk & 3) * 32, 16),
                            sw128_desc(qt + (kk >> 2) * BQ * 128 + (kk & 3) * 32, 16), kk > 0);
        wg::commit();
#pragma unroll
        for (int kk = 0; kk < NH; kk++)
            mma_ss<T, 0, 0>(dp, sw128_desc(va + (kk >> 2) * BK * 128 + (kk & 3) * 32, 16),
                            sw128_desc(ot + (kk >> 2) * BQ * 128 + (kk & 3) * 32, 16), kk > 0);
        wg::commit();

        // Query columns il >= lim[r] see key row r (lim = BQ: none). No
        // branch between here and the second wait.
        int lim[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t j = jrow0 + r * 8;
            const int64_t q = p.causal ? j - p.delta - i0 : 0;
            const int64_t qc = q < 0 ? 0 : q > BQ ? BQ : q;
            lim[r] = j < p.Sk ? (int)qc : BQ;
        }
        wg::wait<1>();
        reg_fence(s);
#pragma unroll
        for (int nb = 0; nb < NQ; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int il = nb * 8 + 2 * tq + (c & 1);
                const float pv = exp2_fast(s[nb][c] * c2 - lse2_of(ld_shared_f32(lt + il * 4)));
                s[nb][c] = il >= lim[c >> 1] ? pv : 0.0f;
            }
        reg_fence(s);
        wg::wait<0>();
        reg_fence(dp);
        uint32_t pa[BQ / 16][4], da[BQ / 16][4];
#pragma unroll
        for (int nb = 0; nb < NQ; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int il = nb * 8 + 2 * tq + (c & 1);
                dp[nb][c] = scale * s[nb][c] * (dp[nb][c] - ld_shared_f32(lt + (BQ + il) * 4));
            }
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            c_to_a<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
            c_to_a<T>(da[kk], dp[2 * kk], dp[2 * kk + 1]);
        }
        // dS^T rows of this thread's keys, 16-byte chunk nb = queries 8 nb..
        const int kr = wgi * 64 + warp * 16 + g;
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++)
                    st_shared_u32(dSs + sw_off<BK>(kr + 8 * r, 2 * kk + hf) + tq * 4, da[kk][r + 2 * hf]);

        reg_fence(pa);
        reg_fence(da);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) // 16 query rows = 2048 bytes per step
            mma_rs<T>(adv, pa[kk], sw128_desc(ot + kk * 2048, BQ * 128));
        if (!LATE_DK)
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++)
                mma_rs<T>(adk, da[kk], sw128_desc(qt + kk * 2048, BQ * 128));
        wg::commit();

        fence_proxy_async();
        __syncthreads(); // both warpgroups' dS^T rows are in
        float dq[DP / 16][4];
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) // 16 keys = 2048 bytes per step
            mma_ss<T, 1, 1>(dq, sw128_desc(dSs + kk * 2048, BK * 128), sw128_desc(kb + kk * 2048, BK * 128),
                            kk > 0);
        wg::commit();
        if (LATE_DK) {
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++)
                mma_rs<T>(adk, da[kk], sw128_desc(qt + kk * 2048, BQ * 128));
            wg::commit();
            wg::wait<1>(); // dV, dQ done; dK runs during the reductions
            reg_fence(dq);
            add_dq_rows2(p, dq, b, h, i0 + warp * 16 + g, dcol0, tq);
        }
        wg::wait<0>();
        reg_fence(dq);
        reg_fence(adk);
        reg_fence(adv);
        reg_fence(pa);
        reg_fence(da);
        if (!LATE_DK)
            add_dq_rows(p, dq, b, h, i0 + warp * 16 + g, dcol0, tq);
    }
    if (p.grad_accumulate && ntotal == 0)
        return; // no query sees these keys: nothing to add
    store_dkdv_rows(p, adk, adv, b, hk, jrow0, 0, tq);
#else
    (void)p;
#endif
}

template <typename T, int DP>
cp_status launch(state *s, const attn_params &p)
{
    constexpr int bytes = wgbwd_smem(DP);
    auto kernel = s->wgbwd_early_dk ? bwd_wgmma_kernel<T, DP, false> : bwd_wgmma_kernel<T, DP, true>;
    const char *what = "attention backward dK/dV/dQ (wgmma)";
    cp_status r = allow_smem((const void *)kernel, bytes, what);
    if (r != CP_SUCCESS)
        return r;
    dim3 grid((unsigned)((p.Sk + WB_BK - 1) / WB_BK), (unsigned)p.Hkv, (unsigned)p.B);
    kernel<<<grid, WB_THREADS, bytes, s->stream>>>(p);
    return check_launch(what);
}

template <typename T>
cp_status backward_t(state *s, const attn_params &p)
{
    return padded_dim(p.D, p.Dv) == 64 ? launch<T, 64>(s, p) : launch<T, 128>(s, p);
}

} // namespace

bool wgmma_bwd_fits(const state *s, const attn_params &p)
{
#ifdef CP_HAVE_SM90A
    const int DP = padded_dim(p.D, p.Dv);
    return s->cc == 90 && !s->deterministic && (p.dt == CP_DTYPE_F16 || p.dt == CP_DTYPE_BF16) && p.vec &&
           (DP == 64 || DP == 128) && p.B <= 65535 && p.Hkv <= 65535 &&
           (p.Sk + WB_BK - 1) / WB_BK <= 0x7fffffff && wgbwd_smem(DP) <= s->smem_optin;
#else
    (void)s, (void)p;
    return false; // no sm_90a machine code in this build
#endif
}

cp_status wgmma_backward_atomic(state *s, const attn_params &p)
{
    return p.dt == CP_DTYPE_BF16 ? backward_t<__nv_bfloat16>(s, p) : backward_t<__half>(s, p);
}

} // namespace cu
