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
// block's 128 keys; warpgroup w takes dQ's column half w and hands it to the
// fp32 sums while dK += dS^T Q, issued after dQ, keeps the tensor cores busy.
//
// Two kernels share the per-tile work (bwd_tile). The warp-specialised one
// (the default, bwd_wgmma_ws_kernel) adds a loader warpgroup: K, V, and per
// query tile Q, dO, their LSE and rowsum(dO * O) come through TMA into two
// stages guarded by mbarriers; the consumers meet once per tile, at the
// barrier that publishes dS^T. With more items (key blocks) than SMs it is
// persistent: one block per SM takes items from a work counter. Its dQ
// columns go through shared memory to bulk tensor reductions (whole lines,
// one thread issuing them), and so do dK and dV where they are F32 sums
// added into (the CP layer's travelling accumulators); 16-bit dK and dV that
// are stored go through shared memory to bulk tensor stores. The other
// kernel loads with cp.async, double-buffered, one __syncthreads per tile,
// and adds dQ with per-thread vector reductions: for tensors no tensor map
// describes, and as INFINICP_CUDA_WGMMA_WS=0. Calls with a rectangle list,
// a window or a softcap (API 1.1) take the warp-specialised kernel with
// RECT (items are key tiles of the band index) or bwd_wgmma_rect_kernel.
//
// Masking is branch-free (a per-row query limit and selects; see
// docs/notes/bench-notes.md: ptxas waits for every wgmma group at a branch join), so the
// probabilities of S^T are computed while dP^T is still in flight.
//
// P = 2^(S * scale * log2 e - LSE2) with LSE2 = +inf for rows that see no key
// (P = 0, no NaN); dS = scale * P * (dP - rowsum(dO * O)) where P != 0, and
// 0 by a select where P = 0 (every hidden pair): a non-finite V or dO makes
// dP NaN for hidden pairs too, and 0 x NaN would reach dQ and dK. (Selecting
// on the mask instead made ptxas spill here; a visible P that underflows to
// 0 drops its NaN, which the row's NaN rowsum(dO * O) carries anyway. The
// mma.sync kernels keep the product: the select spills up to 360 bytes
// there.)
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

// Shared-memory addresses of one query tile's operands, for one warpgroup.
// Fields ending in 4 are addresses >> 4, the low words of the wgmma
// descriptors (wgmma.cuh, sw128_at).
struct tile_smem {
    uint32_t ka4, va4; // this warpgroup's 64 keys of K and V
    uint32_t kb4;      // dQ's B: K columns [dcol0, dcol0 + DP / 2), MN-major
    uint32_t q4, o4;   // the Q and dO tiles
    uint32_t ds;       // dS^T ([key][query])
    uint32_t lse;      // LSE, then rowsum(dO * O), BQ floats each
};

#ifdef CP_WGMMA_BODY
// bwd_tile's band limits where it takes none (the dense kernels).
__device__ const int no_limits[2] = {0, 0};

// The non-finite guard's pass (nf_on: flagged) over a query tile's stage: Q,
// dO and the rowsums after the LSE at ls (BQ floats each), and with_kv K and
// V at kv (contiguous); by the 256 threads of the two warpgroups (thread
// index tid). The caller fences the async proxy and synchronises.
template <typename T>
__device__ __forceinline__ void clean_stage(uint32_t q, uint32_t o, uint32_t ls, bool with_kv, uint32_t kv,
                                            uint32_t qb, uint32_t kb, int tid, int dr = WB_BQ)
{
    using namespace wg;
    nf_clean_sh<T>(q, qb, tid, 256);
    nf_clean_sh<T>(o, qb, tid, 256);
    nf_clean_sh_f32(ls + dr * 4, WB_BQ, tid, 256);
    if (with_kv)
        nf_clean_sh<T>(kv, 2 * kb, tid, 256);
}

// The products of one query tile (rows i0.., head h) for this warpgroup;
// adk / adv accumulate dK and dV of its 64 keys. ds_sync() must return once
// both warpgroups have stored their dS^T rows (and made them visible to the
// async proxy). Returns with every product waited for: the tile's operands
// may be overwritten then.
//
// How dQ reaches the fp32 sums (docs/notes/bench-notes.md). LATE_DK (the default):
// dK is issued after dQ, and dq_sink(dq) takes this warpgroup's dQ columns
// while the tensor cores compute dK (p.dqa_vec: 8-byte reductions straight
// from the accumulators, or a copy to shared memory for a bulk reduction).
// Without it (rows without 16-byte alignment): dV and dK before the
// barrier, and add_dq_rows once all three are done.
//
// RECT (API 1.1, the rectangle kernel): key row r sees the query columns
// [rlo[r], rhi[r]) of the tile (a band's limits), the scores go through the
// softcap where there is one (its factor 1 - tanh^2 on dS), and dS is a
// select, 0 outside the band.
template <typename T, int DP, bool LATE_DK, bool RECT, bool CAP, int DR, typename Sync, typename Sink>
__device__ __forceinline__ void bwd_tile(const attn_params &p, float (&adk)[DP / 8][4], float (&adv)[DP / 8][4],
                                         const tile_smem &a, int64_t i0, int h, int64_t b, int64_t jrow0, int kr,
                                         int dcol0, int warp, int g, int tq, Sync ds_sync, Sink dq_sink,
                                         const int (&rlo)[2], const int (&rhi)[2])
{
    using namespace wg;
    constexpr int BK = WB_BK, BQ = WB_BQ, NQ = BQ / 8, NH = DP / 16;
    float s[NQ][4], dp[NQ][4];
    reg_fence(adk);
    reg_fence(adv);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < NH; kk++)
        mma_ss<T, 0, 0>(s, sw128_at(a.ka4 + kmajor_step<BK>(kk)), sw128_at(a.q4 + kmajor_step<BQ>(kk)), kk > 0);
    wg::commit();
#pragma unroll
    for (int kk = 0; kk < NH; kk++)
        mma_ss<T, 0, 0>(dp, sw128_at(a.va4 + kmajor_step<BK>(kk)), sw128_at(a.o4 + kmajor_step<BQ>(kk)), kk > 0);
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
    const float scale = p.scale, c2 = p.c;
    constexpr bool TC = RECT && CAP;
    float tc[TC ? NQ : 1][4]; // with a softcap: tanh of each score
    wg::wait<1>();
    reg_fence(s);
#pragma unroll
    for (int nb = 0; nb < NQ; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int il = nb * 8 + 2 * tq + (c & 1);
            if (RECT) {
                float x;
                if (TC && p.softcap) {
                    const float t = tanh_cap(s[nb][c] * p.cap_in);
                    tc[TC ? nb : 0][c] = t;
                    x = p.cap_out * t;
                } else {
                    x = s[nb][c] * c2;
                }
                const float pv = exp2_fast(x - lse2_of(ld_shared_f32(a.lse + il * 4)));
                s[nb][c] = il >= rlo[c >> 1] && il < rhi[c >> 1] ? pv : 0.0f;
            } else {
                const float pv = exp2_fast(s[nb][c] * c2 - lse2_of(ld_shared_f32(a.lse + il * 4)));
                s[nb][c] = il >= lim[c >> 1] ? pv : 0.0f;
            }
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
            float ds = scale * s[nb][c] * (dp[nb][c] - ld_shared_f32(a.lse + (DR + il) * 4));
            if (RECT) {
                if (TC && p.softcap) {
                    const float t = tc[TC ? nb : 0][c];
                    ds *= 1.0f - t * t;
                }
                ds = il >= rlo[c >> 1] && il < rhi[c >> 1] ? ds : 0.0f;
            } else {
                ds = s[nb][c] != 0.0f ? ds : 0.0f;
            }
            dp[nb][c] = ds;
        }
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) {
        c_to_a<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
        c_to_a<T>(da[kk], dp[2 * kk], dp[2 * kk + 1]);
    }
    // dS^T rows of this thread's keys, 16-byte chunk nb = queries 8 nb..
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                st_shared_u32(a.ds + sw_off<BK>(kr + 8 * r, 2 * kk + hf) + tq * 4, da[kk][r + 2 * hf]);

    reg_fence(pa);
    reg_fence(da);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
        mma_rs<T>(adv, pa[kk], sw128_at(a.o4 + mnmajor_step<BQ>(kk)));
    if (!LATE_DK)
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++)
            mma_rs<T>(adk, da[kk], sw128_at(a.q4 + mnmajor_step<BQ>(kk)));
    wg::commit();

    fence_proxy_async();
    ds_sync(); // both warpgroups' dS^T rows are in
    float dq[DP / 16][4];
    const uint32_t ds4 = a.ds >> 4;
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++)
        mma_ss<T, 1, 1>(dq, sw128_at(ds4 + mnmajor_step<BK>(kk)), sw128_at(a.kb4 + mnmajor_step<BK>(kk)), kk > 0);
    wg::commit();
    if (LATE_DK) {
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++)
            mma_rs<T>(adk, da[kk], sw128_at(a.q4 + mnmajor_step<BQ>(kk)));
        wg::commit();
        wg::wait<1>(); // dV, dQ done; dK runs during the reductions
        reg_fence(dq);
        dq_sink(dq);
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

// The block's keys and query tiles: keys [k0, k0 + BK) of kv head hk, batch
// b; query tile t (of ntotal) is head(t) = hk * G + t / nt, rows from row(t)
// = i_first + (t % nt) * BQ.
struct bwd_block {
    int64_t k0, b, i_first, nt, ntotal;
    int hk;

    __device__ __forceinline__ int head(int64_t t, int G) const
    {
        return hk * G + (int)(t / nt);
    }
    __device__ __forceinline__ int64_t row(int64_t t) const
    {
        return i_first + (t % nt) * WB_BQ;
    }
};

__device__ __forceinline__ bwd_block bwd_block_at(const attn_params &p, int64_t x, int hk, int64_t b)
{
    bwd_block w;
    w.k0 = x * WB_BK;
    w.hk = hk;
    w.b = b;
    w.i_first = first_query(p, w.k0) / WB_BQ * WB_BQ;
    w.nt = w.i_first < p.Sq ? (p.Sq - w.i_first + WB_BQ - 1) / WB_BQ : 0; // query tiles per head
    w.ntotal = w.nt * p.G;
    return w;
}

__device__ __forceinline__ bwd_block bwd_block_of(const attn_params &p)
{
    return bwd_block_at(p, blockIdx.x, blockIdx.y, blockIdx.z);
}

// Work item w of the warp-specialised kernel: key blocks fastest, then kv
// heads, then batches (the order of bwd_block_of's grid; causal key blocks
// with the most query tiles first).
__device__ __forceinline__ bwd_block bwd_item(const attn_params &p, int w)
{
    const int nx = (int)((p.Sk + WB_BK - 1) / WB_BK), hb = w / nx;
    return bwd_block_at(p, w - hb * nx, hb % p.Hkv, hb / p.Hkv);
}

// API 1.1: a key tile of the rectangle kernels: keys [k0, k0 + nk) of kv
// head hk, batch b, key tile `tile` of p.rs.by_k, the bands bs..be of its
// list.
struct bwd_rect {
    int64_t k0, nk, b;
    int hk, bs, be;
};

__device__ __forceinline__ bwd_rect bwd_rect_at(const attn_params &p, int tile, int hk, int64_t b)
{
    bwd_rect w;
    w.k0 = (int64_t)tile * WB_BK;
    w.nk = p.Sk - w.k0 < WB_BK ? p.Sk - w.k0 : WB_BK;
    w.b = b;
    w.hk = hk;
    w.bs = p.rs.by_k.start[tile];
    w.be = p.rs.by_k.start[tile + 1];
    return w;
}

// Work item `it` of the warp-specialised rectangle kernel: key tiles
// fastest, in the index's order, then kv heads (tile_head_at), then batches.
__device__ __forceinline__ bwd_rect bwd_rect_item(const attn_params &p, int it)
{
    const int per_b = p.rs.by_k.ntiles * p.Hkv;
    const tile_head th = tile_head_at(p.rs.by_k, it % per_b);
    return bwd_rect_at(p, th.tile, th.h, it / per_b);
}

// A step of a key tile's walk: band bi of its list, head gq of the GQA
// group, query rows from i0 (the band's first row that sees the tile's keys,
// then on in steps of WB_BQ while below qhi).
struct kstep {
    int bi, gq;
    int64_t i0, qhi;
};

__device__ __forceinline__ void kstep_open(const attn_params &p, const bwd_rect &w, kstep &x)
{
    int64_t qlo;
    band_keys_rows(p.rs.bands[p.rs.by_k.ids[x.bi]], w.k0, w.nk, &qlo, &x.qhi);
    x.i0 = qlo;
}

// The first step (x.bi = w.be: the tile has none).
__device__ __forceinline__ kstep kstep_first(const attn_params &p, const bwd_rect &w)
{
    kstep x = {w.bs, 0, 0, 0};
    if (x.bi < w.be)
        kstep_open(p, w, x);
    return x;
}

// The step after x: the next rows, the next head, or the next band.
__device__ __forceinline__ void kstep_next(const attn_params &p, const bwd_rect &w, kstep &x)
{
    x.i0 += WB_BQ;
    if (x.i0 < x.qhi)
        return;
    if (++x.gq < p.G) {
        kstep_open(p, w, x);
        return;
    }
    x.gq = 0;
    if (++x.bi < w.be)
        kstep_open(p, w, x);
}

// K and V of a key tile in shared memory: rows outside every band of its
// list as zeros (the tile's products must not see them; they may hold
// anything), and with the non-finite guard on, the others cleaned too;
// thread tid of nt. Nothing to do where one band covers the tile's keys and
// the guard is off.
template <typename T, int DP>
__device__ __forceinline__ void band_kv_pass(const attn_params &p, const bwd_rect &w, uint32_t Ks, uint32_t Vs,
                                             int tid, int nt)
{
    using namespace wg;
    const bool nf = nf_on(p);
    bool cover = false;
    for (int bi = w.bs; bi < w.be && !cover; bi++) {
        const band &r = p.rs.bands[p.rs.by_k.ids[bi]];
        cover = r.k0 <= w.k0 && r.k1 >= w.k0 + w.nk;
    }
    if (cover && !nf)
        return;
    for (int e = tid; e < WB_BK * (DP / 8); e += nt) {
        const int rr = e / (DP / 8), c = e % (DP / 8);
        const uint32_t off = sw_off<WB_BK>(rr, c);
        if (!cover && !key_in_bands(p, w.bs, w.be, w.k0 + rr)) {
            st_shared_v2(Ks + off, 0.0f, 0.0f), st_shared_v2(Ks + off + 8, 0.0f, 0.0f);
            st_shared_v2(Vs + off, 0.0f, 0.0f), st_shared_v2(Vs + off + 8, 0.0f, 0.0f);
        } else if (nf) { // the non-finite guard: the others' non-finite values too
            nf_clean_sh<T>(Ks + off, 16, 0, 1);
            nf_clean_sh<T>(Vs + off, 16, 0, 1);
        }
    }
}

// Rows [z, WB_BQ) of a stage's Q and dO tiles (TMA's layout: 64-column
// boxes) as zeros: rows past a band's last row, which may hold anything;
// thread tid of nt.
template <int DP>
__device__ __forceinline__ void zero_q_tail(uint32_t q, uint32_t o, int z, int tid, int nt)
{
    const int chunks = (WB_BQ - z) * 8;
#pragma unroll
    for (int kb = 0; kb < DP / 64; kb++)
#pragma unroll 1
        for (int e = tid; e < chunks; e += nt) {
            const uint32_t off = (uint32_t)(kb * WB_BQ + z) * 128 + (uint32_t)e * 16;
            wg::zero16(q + off), wg::zero16(o + off);
        }
}
#endif // CP_WGMMA_BODY

// Every thread loads with cp.async, one __syncthreads per tile; kept for
// tensors no tensor map describes and as INFINICP_CUDA_WGMMA_WS=0.
template <typename T, int DP, bool LATE_DK>
__global__ void __launch_bounds__(WB_THREADS, 1) bwd_wgmma_kernel(attn_params p)
{
#ifdef CP_WGMMA_BODY
    using namespace wg;
    constexpr int BK = WB_BK, BQ = WB_BQ, ND = DP / 8;
    constexpr uint32_t KB = BK * DP * 2, QB = BQ * DP * 2, SB = BK * BQ * 2; // tile bytes
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Ks = (smem_addr(smem) + 1023) & ~1023u, Vs = Ks + KB, Qs = Vs + KB, dOs = Qs + 2 * QB,
                   dSs = dOs + 2 * QB, Ls = dSs + SB; // Ls: [stage][lse | drow][BQ] floats
    const int wgi = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0); // uniform: descriptors in uniform registers
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const bwd_block w = bwd_block_of(p);
    const int64_t b = w.b, ntotal = w.ntotal;
    const int hk = w.hk;
    const int64_t jrow0 = w.k0 + wgi * 64 + warp * 16 + g; // this thread's keys: jrow0, jrow0 + 8
    const int dcol0 = wgi * (DP / 2);                      // this warpgroup's dQ columns

    auto load_q = [&](int64_t t) {
        const int h = w.head(t, p.G);
        const int64_t i0 = w.row(t);
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
        load_sw<T, BK, DP, WB_THREADS>(Ks, p.k, b, w.k0, p.Sk, hk, p.D);
        load_sw<T, BK, DP, WB_THREADS>(Vs, p.v, b, w.k0, p.Sk, hk, p.Dv);
        load_q(0);
        cp_async_commit();
    }

    float adk[ND][4], adv[ND][4];
#pragma unroll
    for (int nb = 0; nb < ND; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            adk[nb][c] = adv[nb][c] = 0.0f;

    tile_smem a;
    a.ka4 = (Ks + wgi * 64 * 128) >> 4, a.va4 = (Vs + wgi * 64 * 128) >> 4;
    a.kb4 = (Ks + (dcol0 >> 6) * BK * 128 + (dcol0 & 63) * 2) >> 4;
    a.ds = dSs;
    for (int64_t t = 0; t < ntotal; t++) {
        const int h = w.head(t, p.G);
        const int64_t i0 = w.row(t);
        const uint32_t st = (uint32_t)(t & 1);
        a.q4 = (Qs + st * QB) >> 4, a.o4 = (dOs + st * QB) >> 4, a.lse = Ls + st * 2 * BQ * 4;
        cp_async_wait_all();
        fence_proxy_async(); // tiles written through the generic proxy, read by wgmma through the async one
        __syncthreads();     // tile t is in; every product of tile t - 1 is done
        if (nf_on(p)) { // the non-finite guard (the flag re-read: no register held across the loop)
            clean_stage<T>(Qs + st * QB, dOs + st * QB, a.lse, t == 0, Ks, QB, KB, (int)threadIdx.x);
            fence_proxy_async();
            __syncthreads();
        }
        if (t + 1 < ntotal) {
            load_q(t + 1);
            cp_async_commit();
        }
        bwd_tile<T, DP, LATE_DK, false, false, WB_BQ>(p, adk, adv, a, i0, h, b, jrow0, wgi * 64 + warp * 16 + g, dcol0, warp, g,
                                        tq, [] { __syncthreads(); },
                                        [&](const float(&dq)[DP / 16][4]) {
                                            add_dq_rows2(p, dq, b, h, i0 + warp * 16 + g, dcol0, tq);
                                        },
                                        no_limits, no_limits);
    }
    if (p.grad_accumulate && ntotal == 0)
        return; // no query sees these keys: nothing to add
    store_dkdv_rows(p, adk, adv, b, hk, jrow0, 0, tq);
#else
    (void)p;
#endif
}

// API 1.1: bwd_wgmma_kernel over a rectangle list. A block takes key tile
// and kv head (tile_head_at; 128 keys) and walks, band by band and head by
// head of its GQA group, the query tiles of 64 rows that see its keys
// (from the band's first such row); rows past the band's end load as zeros
// (LSE -inf), and each key row masks with its band limits (key_limits).
template <typename T, int DP, bool LATE_DK>
__global__ void __launch_bounds__(WB_THREADS, 1) bwd_wgmma_rect_kernel(attn_params p)
{
#ifdef CP_WGMMA_BODY
    using namespace wg;
    constexpr int BK = WB_BK, BQ = WB_BQ, ND = DP / 8;
    constexpr uint32_t KB = BK * DP * 2, QB = BQ * DP * 2, SB = BK * BQ * 2; // tile bytes
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Ks = (smem_addr(smem) + 1023) & ~1023u, Vs = Ks + KB, Qs = Vs + KB, dOs = Qs + 2 * QB,
                   dSs = dOs + 2 * QB, Ls = dSs + SB;
    const int wgi = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const tile_head th = tile_head_at(p.rs.by_k, blockIdx.x);
    const bwd_rect w = bwd_rect_at(p, th.tile, th.h, blockIdx.z);
    const int64_t b = w.b, k0 = w.k0;
    const int hk = w.hk, be = w.be;
    const int64_t jrow0 = k0 + wgi * 64 + warp * 16 + g; // this thread's keys: jrow0, jrow0 + 8
    const int dcol0 = wgi * (DP / 2);

    auto load_q = [&](const kstep &x, uint32_t st) {
        const int h = hk * p.G + x.gq;
        const int64_t q1 = p.rs.bands[p.rs.by_k.ids[x.bi]].q1;
        load_sw<T, BQ, DP, WB_THREADS>(Qs + st * QB, p.q, b, x.i0, q1, h, p.D);
        load_sw<T, BQ, DP, WB_THREADS>(dOs + st * QB, p.dout, b, x.i0, q1, h, p.Dv);
        if (threadIdx.x < 2 * BQ) {
            const int e = threadIdx.x % BQ;
            const bool is_lse = threadIdx.x < BQ;
            const int64_t i = x.i0 + e;
            const uint32_t dst = Ls + (st * 2 * BQ + threadIdx.x) * 4;
            if (i < q1)
                cp_async4_to(dst, is_lse ? (const void *)(p.lse + b * p.lsb + h * p.lsh + i)
                                         : (const void *)(p.drow + b * p.drb + h * p.drh + i));
            else
                st_shared_f32(dst, is_lse ? -INFINITY : 0.0f);
        }
    };

    kstep cur = kstep_first(p, w);
    if (cur.bi < be) {
        load_sw<T, BK, DP, WB_THREADS>(Ks, p.k, b, k0, p.Sk, hk, p.D);
        load_sw<T, BK, DP, WB_THREADS>(Vs, p.v, b, k0, p.Sk, hk, p.Dv);
        load_q(cur, 0);
        cp_async_commit();
        // keys outside every band: zeros; the loop's first barrier and proxy
        // fence order these stores before wgmma reads
        cp_async_wait_all();
        __syncthreads();
        band_kv_pass<T, DP>(p, w, Ks, Vs, (int)threadIdx.x, WB_THREADS);
    }

    float adk[ND][4], adv[ND][4];
#pragma unroll
    for (int nb = 0; nb < ND; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            adk[nb][c] = adv[nb][c] = 0.0f;

    tile_smem a;
    a.ka4 = (Ks + wgi * 64 * 128) >> 4, a.va4 = (Vs + wgi * 64 * 128) >> 4;
    a.kb4 = (Ks + (dcol0 >> 6) * BK * 128 + (dcol0 & 63) * 2) >> 4;
    a.ds = dSs;
    for (uint32_t t = 0; cur.bi < be; t++) {
        const int h = hk * p.G + cur.gq;
        const int64_t i0 = cur.i0;
        const uint32_t st = t & 1;
        a.q4 = (Qs + st * QB) >> 4, a.o4 = (dOs + st * QB) >> 4, a.lse = Ls + st * 2 * BQ * 4;
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads(); // tile t is in; every product of tile t - 1 is done
        if (nf_on(p)) { // the non-finite guard (K and V were cleaned with the band zeros)
            clean_stage<T>(Qs + st * QB, dOs + st * QB, a.lse, false, Ks, QB, KB, (int)threadIdx.x);
            fence_proxy_async();
            __syncthreads();
        }
        kstep nxt = cur;
        kstep_next(p, w, nxt);
        if (nxt.bi < be) {
            load_q(nxt, st ^ 1);
            cp_async_commit();
        }
        const band r = p.rs.bands[p.rs.by_k.ids[cur.bi]];
        int lo[2], hi[2];
        key_limits(r, jrow0, i0, BQ, &lo[0], &hi[0]);
        key_limits(r, jrow0 + 8, i0, BQ, &lo[1], &hi[1]);
        bwd_tile<T, DP, LATE_DK, true, true, WB_BQ>(p, adk, adv, a, i0, h, b, jrow0, wgi * 64 + warp * 16 + g, dcol0, warp, g,
                                       tq, [] { __syncthreads(); },
                                       [&](const float(&dq)[DP / 16][4]) {
                                           add_dq_rows2(p, dq, b, h, i0 + warp * 16 + g, dcol0, tq);
                                       },
                                       lo, hi);
        cur = nxt;
    }
    if (p.grad_accumulate && w.bs == be)
        return; // no query sees these keys: nothing to add
    store_dkdv_rows(p, adk, adv, b, hk, jrow0, 0, tq);
#else
    (void)p;
#endif
}

// Tensor maps of the warp-specialised kernel, in this order.
enum { MQ, MK, MV, MDO, MLSE, MDROW, MDQ, MDK, MDV, NMAPS };
using wb_maps = wg::tmaps<NMAPS>;

constexpr int WS_THREADS = 384; // a loader warpgroup and the two consumers
enum { EPI_ROWS, EPI_SUM, EPI_STORE }; // how the warp-specialised kernel's dK / dV leave
constexpr int WS_STAGES = 2;    // Q / dO / LSE / rowsum stages

// Bytes of dynamic shared memory: K, V, the Q / dO stages, two dS^T buffers,
// with DQ_TMA two fp32 dQ tiles (64 x DP / 2) per consumer, the LSE / rowsum
// stages, the mbarriers (8 bytes each: K / V full and empty, a full and an
// empty one per stage and per item slot), the two item slots and the
// alignment.
//
// The rectangle kernel's query tiles start at any row, and the copy engine
// takes a box of the LSE (or rowsums) only from a 16-byte boundary: it loads
// WR_LBOX values from the row rounded down to a multiple of 4 (the first
// 0-3 unused), the rowsums WR_DROW floats after the LSE (128-byte aligned).
constexpr int WR_LBOX = WB_BQ + 4, WR_DROW = 96;
constexpr int wgbwd_ws_smem(int DP, bool dq_tma, bool rect = false)
{
    return (2 * WB_BK + 2 * WS_STAGES * WB_BQ) * DP * 2 + 2 * WB_BK * WB_BQ * 2 +
           (dq_tma ? 2 * 2 * WB_BQ * DP * 2 : 0) + WS_STAGES * 2 * (rect ? WR_DROW : WB_BQ) * 4 +
           8 * (2 + 2 * WS_STAGES + 4) + 16 + 1024;
}

#ifdef CP_WGMMA_BODY
// The bulk operations of one thread per consumer (`on`), as predicated
// instructions: a branch would sit between a wgmma and its wait.
//
// Box (32 fp32 columns x 64 rows, 128-byte swizzled) at src added into map
// t's tensor at column col, row r of head hd, batch bt; rows and columns past
// the edges are dropped.
__device__ __forceinline__ void tma_reduce_add(bool on, const wb_maps &mp, int t, uint32_t src, int col, int r,
                                               int hd, int bt)
{
    int c[3];
    wg::tma_coords(mp.pos[t], r, hd, bt, c);
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "@p cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], "
                 "[%5];\n}\n" ::"l"(reinterpret_cast<uint64_t>(&mp.m[t])),
                 "r"(col), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(src), "r"((int)on)
                 : "memory");
}

// The same box at src stored into map t's tensor (16-bit dK / dV).
__device__ __forceinline__ void tma_store(bool on, const wb_maps &mp, int t, uint32_t src, int col, int r, int hd,
                                          int bt)
{
    int c[3];
    wg::tma_coords(mp.pos[t], r, hd, bt, c);
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "@p cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n}\n" ::"l"(
                     reinterpret_cast<uint64_t>(&mp.m[t])),
                 "r"(col), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(src), "r"((int)on)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit(bool on)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p cp.async.bulk.commit_group;\n}\n" ::"r"((int)on)
                 : "memory");
}

// Until at most N of this thread's bulk groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read(bool on)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p cp.async.bulk.wait_group.read %0;\n}\n" ::"n"(N),
                 "r"((int)on)
                 : "memory");
}

// Until every bulk group of this thread is complete (its writes done).
__device__ __forceinline__ void bulk_wait_all(bool on)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p cp.async.bulk.wait_group 0;\n}\n" ::"r"((int)on)
                 : "memory");
}

// Byte offset of this thread's accumulator pair (8-column block nb, row
// half r) in fp32 tiles of 32-column boxes, 64 rows x 128 bytes each, 16-byte
// chunks swizzled by row & 7 (= g): the layout of the sum maps.
__device__ __forceinline__ uint32_t sum_off(int nb, int r, int warp, int g, int tq)
{
    return (nb >> 2) * (64 * 128) + (warp * 16 + 8 * r + g) * 128 + ((((nb & 3) * 2 + (tq >> 1)) ^ g) << 4) +
           (tq & 1) * 8;
}

// Once this consumer's earlier bulk groups have read its two dQ tiles:
// write() fills them, and after the 128 threads' writes are visible to the
// async proxy, issue() (predicated on the leader) sends them out as one bulk
// group.
template <typename W, typename I>
__device__ __forceinline__ void stage_out(bool leader, int c, W write, I issue)
{
    using namespace wg;
    bulk_wait_read<0>(leader);
    named_sync<128>(2 + c); // the tiles are free
    write();
    fence_proxy_async();
    named_sync<128>(2 + c); // this consumer's rows are in
    issue();
    bulk_commit(leader);
}

// Byte offset of this thread's pair of 16-bit values (8-column block nb, row
// half r) in 16-bit tiles of 64-column boxes, 64 rows x 128 bytes each,
// 16-byte chunks swizzled by row & 7 (= g): the layout of make_map's maps.
__device__ __forceinline__ uint32_t half_off(int nb, int r, int warp, int g, int tq)
{
    return (nb >> 3) * (64 * 128) + (warp * 16 + 8 * r + g) * 128 + (((nb & 7) ^ g) << 4) + tq * 4;
}

#endif // CP_WGMMA_BODY

// The same computation with a loader warpgroup whose first thread issues
// every copy through TMA: K and V of an item, then per query tile Q, dO,
// their LSE and rowsum(dO * O) into one of WS_STAGES stages, each with a
// "full" mbarrier the copies complete and an "empty" one the 8 consumer warps
// arrive on once their products have read it. Rows past Sq arrive as zeros
// (LSE 0, rowsum 0, Q and dO rows 0: their P is 1 but every product it
// enters has a zero factor, and their dQ is never stored). No block-wide
// barrier is left in the loop: the consumers meet once per tile, at the
// named barrier that publishes dS^T, which is double-buffered (a warpgroup
// writes tile t + 1's rows only after passing tile t's barrier, which the
// other warpgroup reaches only after its dQ of tile t - 1 is done).
//
// Persistent: a block works on items (bwd_item: key blocks of a kv head) in
// turn, taken from *counter, or j, j + gridDim.x, ... for block j without
// one; the launch gives it one item per block or one block per SM. Across
// items the query-tile stages, their barrier phases and the dS^T / dQ
// buffers run on (counted by the tiles of the block so far), and the loader
// brings the next item's K and V (once both consumers' last products of an
// item are done: kvempty) and first query tiles while the consumers store
// dK and dV, so that an item's start and end overlap its neighbour's work.
//
// epi (DQ_TMA only): EPI_SUM (F32 gradients added into, p.grad_accumulate):
// dK and dV reach their sums through shared memory and bulk reductions too
// (each consumer stages them, dK then dV, in its own two dQ tiles), instead
// of loading the old values, adding and storing. EPI_STORE (16-bit
// gradients of the input's type, stored): each consumer converts dK and dV
// into its two dQ tiles at once and stores them with bulk tensor copies,
// instead of a 2-byte store per value from every thread (~14 us an item).
//
// DQ_TMA: each consumer writes its dQ columns (fp32) to one of two shared
// tiles and its first thread adds the tile into p.dqa with bulk tensor
// reductions (whole 128-byte lines, issued once per tile) instead of 16 vector
// reductions per thread. A tile is written again two query tiles later, once
// that thread has seen the reduction's reads finish (before the dS^T barrier,
// which the other threads pass after it).
template <typename T, int DP, bool DQ_TMA, bool RECT, bool CAP>
__global__ void __launch_bounds__(WS_THREADS, 1)
    bwd_wgmma_ws_kernel(attn_params p, const __grid_constant__ wb_maps mp, int epi, int items, int *counter)
{
#ifdef CP_WGMMA_BODY
    using namespace wg;
    constexpr int BK = WB_BK, BQ = WB_BQ, ND = DP / 8, ST = WS_STAGES;
    constexpr uint32_t KB = BK * DP * 2, QB = BQ * DP * 2, SB = BK * BQ * 2, LB = 2 * (RECT ? WR_DROW : BQ) * 4; // bytes
    constexpr uint32_t DQB = DQ_TMA ? BQ * DP * 2 : 0; // one consumer's fp32 dQ tile (DP / 2 columns)
    // setmaxnreg: the consumers of D = 128 need 240 registers; at D = 64 the
    // loader spills below 56 (its item bookkeeping) and the consumers fit in
    // 216, within the 168 x 384 the launch bounds give the block
    // (RECT: the loader's band walk needs 40 at D = 128, and the consumers
    // fit in 232)
    constexpr int LOADER_REGS = DP == 64 ? 56 : RECT ? 40 : 24, CONSUMER_REGS = DP == 64 ? 216 : RECT ? 232 : 240;
    static_assert(128 * LOADER_REGS + 256 * CONSUMER_REGS <= 168 * WS_THREADS, "registers of the block");
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Ks = (smem_addr(smem) + 1023) & ~1023u, Vs = Ks + KB, Qs = Vs + KB, dOs = Qs + ST * QB,
                   dSs = dOs + ST * QB, dQs = dSs + 2 * SB, Ls = dQs + 4 * DQB, kvfull = Ls + ST * LB,
                   kvempty = kvfull + 8, full = kvempty + 8, empty = full + 8 * ST, ifull = empty + 8 * ST;
    const item_queue iq = {ifull, ifull + 16, ifull + 32}; // full and empty barriers, slots: two each
    const int wgi = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0); // uniform: descriptors in uniform registers
    const int lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
        mbar_init(kvfull, 1), mbar_init(kvempty, 8); // 8 consumer warps release K and V
        for (int st = 0; st < ST; st++)
            mbar_init(full + 8 * st, 1), mbar_init(empty + 8 * st, 8); // and a stage
        iq.init();
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    // The items a block works on, in turn: item_queue.
    if (wgi == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(LOADER_REGS) : "memory");
        if (threadIdx.x == 0) {
            // 32-bit counters (24 registers): rows < 2^31 (make_maps), and
            // only gt mod 4 matters, which wrapping keeps
            uint32_t gt = 0; // query tiles loaded so far
            int nkv = 0;     // items whose K and V were loaded
            for (int k = 0;; k++) {
                const int it = iq.post(k, items, counter);
                if (it >= items)
                    break;
                if constexpr (RECT) {
                    const bwd_rect w = bwd_rect_item(p, it);
                    kstep x = kstep_first(p, w);
                    if (x.bi >= w.be)
                        continue;
                    if (nkv > 0)
                        mbar_wait(kvempty, (uint32_t)(nkv - 1) & 1);
                    mbar_expect_tx(kvfull, 2 * KB);
                    tma_tile<BK, DP>(Ks, mp, MK, kvfull, (int)w.k0, w.hk, (int)w.b);
                    tma_tile<BK, DP>(Vs, mp, MV, kvfull, (int)w.k0, w.hk, (int)w.b);
                    nkv++;
                    for (; x.bi < w.be; kstep_next(p, w, x), gt++) {
                        const uint32_t st = gt % ST, bar = full + 8 * st;
                        const int h = w.hk * p.G + x.gq, i0 = (int)x.i0;
                        mbar_wait(empty + 8 * st, ((gt / ST) + 1) & 1);
                        mbar_expect_tx(bar, 2 * QB + 2 * WR_LBOX * 4);
                        tma_tile<BQ, DP>(Qs + st * QB, mp, MQ, bar, i0, h, (int)w.b);
                        tma_tile<BQ, DP>(dOs + st * QB, mp, MDO, bar, i0, h, (int)w.b);
                        tma_box(Ls + st * LB, mp, MLSE, bar, i0 & ~3, 0, h, (int)w.b);
                        tma_box(Ls + st * LB + WR_DROW * 4, mp, MDROW, bar, i0 & ~3, 0, h, (int)w.b);
                    }
                    continue;
                }
                const bwd_block w = bwd_item(p, it);
                const int nt = (int)w.nt, r0 = (int)w.i_first, bt = (int)w.b, h0 = w.hk * p.G;
                if (nt == 0)
                    continue;
                if (nkv > 0)
                    mbar_wait(kvempty, (uint32_t)(nkv - 1) & 1);
                mbar_expect_tx(kvfull, 2 * KB);
                tma_tile<BK, DP>(Ks, mp, MK, kvfull, (int)w.k0, w.hk, bt);
                tma_tile<BK, DP>(Vs, mp, MV, kvfull, (int)w.k0, w.hk, bt);
                nkv++;
                for (int h = h0; h < h0 + p.G; h++) // the tiles in bwd_block's order (head, row)
                    for (int i0 = r0; i0 < r0 + nt * BQ; i0 += BQ, gt++) {
                        // (parity 1 of a fresh barrier: its first two waits pass)
                        const uint32_t st = gt % ST;
                        mbar_wait(empty + 8 * st, ((gt / ST) + 1) & 1);
                        const uint32_t bar = full + 8 * st;
                        mbar_expect_tx(bar, 2 * QB + LB);
                        tma_tile<BQ, DP>(Qs + st * QB, mp, MQ, bar, i0, h, bt);
                        tma_tile<BQ, DP>(dOs + st * QB, mp, MDO, bar, i0, h, bt);
                        tma_box(Ls + st * LB, mp, MLSE, bar, i0, 0, h, bt);
                        tma_box(Ls + st * LB + BQ * 4, mp, MDROW, bar, i0, 0, h, bt);
                    }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
        const int c = wgi - 1, warp = (threadIdx.x >> 5) & 3;
        const int g = lane >> 2, tq = lane & 3;
        const bool leader = (threadIdx.x & 127) == 0; // issues the consumer's bulk reductions
        const int dcol0 = c * (DP / 2);               // this warpgroup's dQ columns
        tile_smem a;
        a.ka4 = (Ks + c * 64 * 128) >> 4, a.va4 = (Vs + c * 64 * 128) >> 4;
        a.kb4 = (Ks + (dcol0 >> 6) * BK * 128 + (dcol0 & 63) * 2) >> 4;
        uint32_t gt = 0; // query tiles of the block so far (mod 2^32: only gt mod 4 matters)
        int nkv = 0;     // items with K and V loaded so far
        bool staged = false; // the last bulk group read both dQ tiles (dK / dV staging)
        for (int k = 0;; k++) {
            const int it = iq.next(k, lane);
            if (it >= items)
                break;
            // the item: a key block and its query tiles t < ntotal, or (RECT)
            // a key tile of the index and the steps of its walk (rx)
            bwd_block w;
            bwd_rect wr;
            kstep rx;
            if constexpr (RECT) {
                wr = bwd_rect_item(p, it);
                rx = kstep_first(p, wr);
                w.k0 = wr.k0, w.b = wr.b, w.hk = wr.hk;
                w.ntotal = rx.bi < wr.be; // (only whether there is a step)
            } else {
                w = bwd_item(p, it);
            }
            const int64_t b = w.b, ntotal = w.ntotal;
            if (p.grad_accumulate && ntotal == 0)
                continue; // no query sees these keys: nothing to add
            const int64_t jrow0 = w.k0 + c * 64 + warp * 16 + g; // this thread's keys: jrow0, jrow0 + 8
            float adk[ND][4], adv[ND][4];
#pragma unroll
            for (int nb = 0; nb < ND; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    adk[nb][e] = adv[nb][e] = 0.0f;
            if (ntotal > 0) {
                mbar_wait(kvfull, (uint32_t)nkv & 1);
                if constexpr (RECT) { // keys outside the bands as zeros (and the guard's pass)
                    band_kv_pass<T, DP>(p, wr, Ks, Vs, (int)threadIdx.x - 128, 256);
                    fence_proxy_async();
                    named_sync(4);
                }
            }
            for (int64_t t = 0;; t++, gt++) {
                int h;
                int64_t i0;
                int lo[2] = {0, 0}, hi[2] = {0, 0};
                if constexpr (RECT) {
                    if (rx.bi >= wr.be)
                        break;
                    h = wr.hk * p.G + rx.gq;
                    i0 = rx.i0;
                } else {
                    if (t >= ntotal)
                        break;
                    h = w.head(t, p.G);
                    i0 = w.row(t);
                }
                const uint32_t st = gt % ST;
                a.q4 = (Qs + st * QB) >> 4, a.o4 = (dOs + st * QB) >> 4;
                a.lse = Ls + st * LB + (RECT ? (uint32_t)(i0 & 3) * 4 : 0); // (RECT: from a 4-row boundary)
                a.ds = dSs + (gt & 1) * SB;
                const uint32_t dqt = dQs + (2 * c + (gt & 1)) * DQB;
                mbar_wait(full + 8 * st, (gt / ST) & 1);
                if constexpr (RECT) {
                    // the band's limits for this thread's keys; rows past the
                    // band's last as zeros, then the guard's pass (not K, V:
                    // band_kv_pass did)
                    const band r = p.rs.bands[p.rs.by_k.ids[rx.bi]];
                    key_limits(r, jrow0, i0, BQ, &lo[0], &hi[0]);
                    key_limits(r, jrow0 + 8, i0, BQ, &lo[1], &hi[1]);
                    const int64_t in = r.q1 - i0;
                    const bool nf = nf_on(p);
                    if (in < BQ) {
                        zero_q_tail<DP>(Qs + st * QB, dOs + st * QB, (int)in, (int)threadIdx.x - 128, 256);
                        if (nf) {
                            fence_proxy_async();
                            named_sync(4);
                        }
                    }
                    if (nf)
                        clean_stage<T>(Qs + st * QB, dOs + st * QB, a.lse, false, Ks, QB, KB, (int)threadIdx.x - 128,
                                       WR_DROW);
                    if (in < BQ || nf) {
                        fence_proxy_async();
                        named_sync(4);
                    }
                    kstep_next(p, wr, rx);
                } else if (nf_on(p)) { // the non-finite guard: both consumers clean the stage (and K, V first)
                    clean_stage<T>(Qs + st * QB, dOs + st * QB, a.lse, t == 0, Ks, QB, KB, (int)threadIdx.x - 128);
                    fence_proxy_async();
                    named_sync(4);
                }
                const bool after_staging = staged && t == 0;
                bwd_tile<T, DP, true, RECT, CAP, RECT ? WR_DROW : WB_BQ>(
                    p, adk, adv, a, i0, h, b, jrow0, c * 64 + warp * 16 + g, dcol0, warp, g, tq,
                    [&] {
                        if constexpr (DQ_TMA) {
                            bulk_wait_read<1>(leader); // the reduction of tile t - 2 has read dqt
                            bulk_wait_read<0>(leader && after_staging); // dK / dV staging has
                        }
                        named_sync(1);
                    },
                    [&](const float(&dq)[DP / 16][4]) {
                        if constexpr (!DQ_TMA) {
                            add_dq_rows2(p, dq, b, h, i0 + warp * 16 + g, dcol0, tq);
                        } else {
#pragma unroll
                            for (int nb = 0; nb < DP / 16; nb++)
#pragma unroll
                                for (int r = 0; r < 2; r++)
                                    st_shared_v2(dqt + sum_off(nb, r, warp, g, tq), dq[nb][2 * r],
                                                 dq[nb][2 * r + 1]);
                            fence_proxy_async();
                            named_sync<128>(2 + c); // this consumer's rows are in
#pragma unroll
                            for (int bx = 0; bx < DP / 64; bx++)
                                tma_reduce_add(leader, mp, MDQ, dqt + bx * (BQ * 128), dcol0 + bx * 32, (int)i0,
                                               h, (int)b);
                            bulk_commit(leader);
                        }
                    },
                    lo, hi);
                mbar_arrive_warp(empty + 8 * st, lane); // tile t's stage is read
            }
            if (ntotal > 0) {
                mbar_arrive_warp(kvempty, lane); // every product of the item is done: K and V are free
                nkv++;
            }
            staged = false;
            if constexpr (DQ_TMA) {
                if (epi == EPI_STORE) {
                    // dK in the first dQ tile, dV in the second (64 x DP 16-bit
                    // values each, DP / 64 boxes), once the reductions of the
                    // item's last two dQ tiles have read them
                    static_assert(DQB == 64 * DP * 2, "dK and dV in the two dQ tiles");
                    const uint32_t e = dQs + (uint32_t)(2 * c) * DQB;
                    stage_out(
                        leader, c,
                        [&] {
#pragma unroll
                            for (int nb = 0; nb < ND; nb++)
#pragma unroll
                                for (int r = 0; r < 2; r++) {
                                    const uint32_t o = half_off(nb, r, warp, g, tq);
                                    st_shared_u32(e + o, pack2<T>(adk[nb][2 * r], adk[nb][2 * r + 1]));
                                    st_shared_u32(e + DQB + o, pack2<T>(adv[nb][2 * r], adv[nb][2 * r + 1]));
                                }
                        },
                        [&] {
                            const int k0 = (int)(w.k0 + c * 64);
#pragma unroll
                            for (int bx = 0; bx < DP / 64; bx++) {
                                tma_store(leader, mp, MDK, e + bx * (64 * 128), bx * 64, k0, w.hk, (int)b);
                                tma_store(leader, mp, MDV, e + DQB + bx * (64 * 128), bx * 64, k0, w.hk, (int)b);
                            }
                        });
                    staged = true;
                    continue;
                }
                if (epi == EPI_SUM) {
                    // dK, then dV, of this consumer's 64 keys as fp32 32-column
                    // boxes in its two dQ tiles, once the reductions of the
                    // item's last two dQ tiles have read them
                    constexpr uint32_t EB = 64 * DP * 4; // one consumer's dK (or dV), fp32
                    static_assert(EB == 2 * DQB, "dK staged in a consumer's two dQ tiles");
                    static_assert(BQ == 64, "64-row boxes: the dQ layout");
                    const uint32_t e = dQs + (uint32_t)(2 * c) * DQB;
#pragma unroll
                    for (int pass = 0; pass < 2; pass++) {
                        const float(&acc)[ND][4] = pass ? adv : adk;
                        stage_out(
                            leader, c,
                            [&] {
#pragma unroll
                                for (int nb = 0; nb < ND; nb++)
#pragma unroll
                                    for (int r = 0; r < 2; r++)
                                        st_shared_v2(e + sum_off(nb, r, warp, g, tq), acc[nb][2 * r],
                                                     acc[nb][2 * r + 1]);
                            },
                            [&] {
#pragma unroll
                                for (int bx = 0; bx < DP / 32; bx++)
                                    tma_reduce_add(leader, mp, pass ? MDV : MDK, e + bx * (BQ * 128), bx * 32,
                                                   (int)(w.k0 + c * 64), w.hk, (int)b);
                            });
                    }
                    staged = true;
                    continue;
                }
            }
            store_dkdv_rows(p, adk, adv, b, w.hk, jrow0, 0, tq);
        }
        if constexpr (DQ_TMA)
            bulk_wait_all(leader); // the reductions read shared memory (and write) until they are done
    }
#else
    (void)p, (void)mp, (void)epi, (void)items, (void)counter;
#endif
}

// The maps of the warp-specialised kernel; false where one of its tensors has
// none (the cp.async kernel runs then). *dq_tma: whether p.dqa has one too;
// *epi: how dK and dV leave (EPI_SUM: F32 sums with maps, EPI_STORE: stored
// in the input's 16-bit type with maps, EPI_ROWS: per-thread stores).
bool make_maps(wb_maps &mp, const attn_params &p, bool *dq_tma, int *epi, int row_box = WB_BQ)
{
    using wg::make_map;
    // (the loader's 32-bit row walk goes up to Sq rounded up to whole tiles)
    if (p.Sq > INT32_MAX - WB_BQ || p.Sk > INT32_MAX || !p.dqa_vec)
        return false;
    const bool ok = make_map(&mp.m[MQ], mp.pos[MQ], p.q, p.dt, p.Sq, p.H, p.B, p.D, WB_BQ) &&
                    make_map(&mp.m[MDO], mp.pos[MDO], p.dout, p.dt, p.Sq, p.H, p.B, p.Dv, WB_BQ) &&
                    make_map(&mp.m[MK], mp.pos[MK], p.k, p.dt, p.Sk, p.Hkv, p.B, p.D, WB_BK) &&
                    make_map(&mp.m[MV], mp.pos[MV], p.v, p.dt, p.Sk, p.Hkv, p.B, p.Dv, WB_BK) &&
                    wg::make_row_map(&mp.m[MLSE], mp.pos[MLSE], p.lse, p.Sq, p.H, p.lsh, p.B, p.lsb, row_box) &&
                    wg::make_row_map(&mp.m[MDROW], mp.pos[MDROW], p.drow, p.Sq, p.H, p.drh, p.B, p.drb, row_box);
    *dq_tma = ok && wg::make_sum_map(&mp.m[MDQ], mp.pos[MDQ], p.dqa, p.Sq, p.H, p.B, p.dqa_cols, WB_BQ);
    *epi = EPI_ROWS;
    if (*dq_tma && p.grad_accumulate && p.gdt == CP_DTYPE_F32 &&
        wg::make_sum_map(&mp.m[MDK], mp.pos[MDK], p.dk, p.Sk, p.Hkv, p.B, p.D, 64) &&
        wg::make_sum_map(&mp.m[MDV], mp.pos[MDV], p.dv, p.Sk, p.Hkv, p.B, p.Dv, 64))
        *epi = EPI_SUM;
    else if (*dq_tma && !p.grad_accumulate && p.gdt == p.dt &&
             make_map(&mp.m[MDK], mp.pos[MDK], p.dk, p.gdt, p.Sk, p.Hkv, p.B, p.D, 64) &&
             make_map(&mp.m[MDV], mp.pos[MDV], p.dv, p.gdt, p.Sk, p.Hkv, p.B, p.Dv, 64))
        *epi = EPI_STORE;
    return ok;
}

// One item a block, or (persistent) one block an SM when there are more
// items than SMs.
template <typename T, int DP, bool DQ_TMA, bool RECT>
cp_status launch_ws(state *s, const attn_params &p, const wb_maps &mp, int64_t items, int epi)
{
    constexpr int bytes = wgbwd_ws_smem(DP, DQ_TMA, RECT);
    auto kernel = RECT && p.softcap ? bwd_wgmma_ws_kernel<T, DP, DQ_TMA, RECT, RECT>
                                    : bwd_wgmma_ws_kernel<T, DP, DQ_TMA, RECT, false>;
    const char *what = RECT ? "attention backward dK/dV/dQ (wgmma, warp-specialised, rectangles)"
                            : "attention backward dK/dV/dQ (wgmma, warp-specialised)";
    cp_status r = allow_smem((const void *)kernel, bytes, what);
    if (r != CP_SUCCESS)
        return r;
    const bool persist = items > s->sm_count;
    int *counter = persist ? take_sched(s) : nullptr;
    kernel<<<(unsigned)(persist ? s->sm_count : items), WS_THREADS, bytes, s->stream>>>(p, mp, (int)epi, (int)items,
                                                                                      counter);
    return check_launch(what);
}

template <typename T, int DP>
cp_status launch(state *s, const attn_params &p)
{
    dim3 grid((unsigned)((p.Sk + WB_BK - 1) / WB_BK), (unsigned)p.Hkv, (unsigned)p.B);
    const int64_t items = (int64_t)grid.x * grid.y * grid.z;
    wb_maps mp;
    bool dq_tma = false;
    int epi = EPI_ROWS;
    if (s->knob.wgmma_ws && wgbwd_ws_smem(DP, false) <= s->smem_optin && items + s->sm_count <= INT32_MAX &&
        make_maps(mp, p, &dq_tma, &epi)) {
        if (dq_tma && wgbwd_ws_smem(DP, true) <= s->smem_optin)
            return launch_ws<T, DP, true, false>(s, p, mp, items, epi);
        return launch_ws<T, DP, false, false>(s, p, mp, items, EPI_ROWS);
    }
    constexpr int bytes = wgbwd_smem(DP);
    auto kernel = !p.dqa_vec ? bwd_wgmma_kernel<T, DP, false> : bwd_wgmma_kernel<T, DP, true>;
    const char *what = "attention backward dK/dV/dQ (wgmma)";
    cp_status r = allow_smem((const void *)kernel, bytes, what);
    if (r != CP_SUCCESS)
        return r;
    kernel<<<grid, WB_THREADS, bytes, s->stream>>>(p);
    return check_launch(what);
}

// The warp-specialised kernel over the key tiles of the index where maps
// describe every tensor (its loader's rows start anywhere: a band's first
// row that sees a tile), else the cp.async one.
template <typename T, int DP>
cp_status launch_rect(state *s, const attn_params &p)
{
    const int64_t items = (int64_t)p.rs.by_k.ntiles * p.Hkv * p.B;
    wb_maps mp;
    bool dq_tma = false;
    int epi = EPI_ROWS;
    if (s->knob.wgmma_ws && wgbwd_ws_smem(DP, false, true) <= s->smem_optin && items + s->sm_count <= INT32_MAX &&
        make_maps(mp, p, &dq_tma, &epi, WR_LBOX)) {
        if (items == 0)
            return CP_SUCCESS;
        if (dq_tma && wgbwd_ws_smem(DP, true, true) <= s->smem_optin)
            return launch_ws<T, DP, true, true>(s, p, mp, items, epi);
        return launch_ws<T, DP, false, true>(s, p, mp, items, EPI_ROWS);
    }
    dim3 grid((unsigned)((int64_t)p.rs.by_k.ntiles * p.Hkv), 1, (unsigned)p.B);
    constexpr int bytes = wgbwd_smem(DP);
    auto kernel = !p.dqa_vec ? bwd_wgmma_rect_kernel<T, DP, false> : bwd_wgmma_rect_kernel<T, DP, true>;
    const char *what = "attention backward dK/dV/dQ (wgmma, rectangles)";
    cp_status r = allow_smem((const void *)kernel, bytes, what);
    if (r != CP_SUCCESS)
        return r;
    kernel<<<grid, WB_THREADS, bytes, s->stream>>>(p);
    return check_launch(what);
}

template <typename T>
cp_status backward_t(state *s, const attn_params &p)
{
    if (p.rects) // p.rs indexes key tiles of WB_BK
        return padded_dim(p.D, p.Dv) == 64 ? launch_rect<T, 64>(s, p) : launch_rect<T, 128>(s, p);
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
