// SPDX-License-Identifier: MIT
// Fused flash-style block attention forward for Hopper (sm_90a): the products
// run on wgmma, the warpgroup-wide asynchronous tensor-core instruction, which
// reads its B operand (and here also Q) straight from shared memory; mma.sync
// tops out near 200 TFLOP/s on an H200 because every fragment has to pass
// through registers first.
//
// A block of two warpgroups owns 128 query rows of one (batch, head); each
// warpgroup owns 64 rows and keeps their output (fp32) and running max / sum
// in registers, in the accumulator layout of wgmma, which per warp is the
// m16n8 C layout of mma.sync: the softmax and the epilogue are the mma
// kernel's (mma.cuh). Key tiles of 128 (64 for head dims past 128, up to
// 256: wg_bk) stream through shared memory with cp.async, K double- and V
// triple-buffered (double for MLA's shape: wg_vst), in the 128-byte swizzle
// that the wgmma shared-memory descriptors describe: 8-row x 128-byte atoms, 16-byte
// chunk c of row r stored at chunk c ^ (r & 7), head columns in blocks of 64.
// K is the K-major B of S = Q K^T; V, stored the same way ([key][dim]), is
// the MN-major ("transposed") B of O += P V, with P as the register A operand
// (the S accumulators rounded to 16-bit pairs).
//
// Each warpgroup overlaps its softmax of key tile n with the P V product of
// tile n - 1: S_n and P_{n-1} V_{n-1} are issued together, S_n is waited for,
// its softmax computed, then P V is waited for and O rescaled. The tile
// order, the causal skipping and masking and the numerics (base-2 scores,
// probabilities relative to the running maximum) are the mma kernel's.
//
// Two kernels share all of this. The warp-specialised one (the default,
// fwd_wgmma_ws_kernel) adds a third warpgroup whose first thread only loads:
// Q, K and V tiles come through the bulk tensor copy engine (TMA, tensor maps
// built on the host; out-of-range rows and columns arrive as zeros), each
// stage with a "full" mbarrier the copies complete and an "empty" one the
// consumers arrive on when their products have read it. No block-wide
// barrier is left in the loop, so the two consumer warpgroups can run half a
// tile apart: named barriers make them issue their products in turn
// (ping-pong), one warpgroup's softmax running while the other's products
// keep the tensor cores busy. setmaxnreg moves registers from the loader
// (24; 40 at D = 64) to the consumers (240; 224 at D = 64). Its consumers
// mask only the tiles that reach past the keys or across the diagonal, and
// (for a positive scale) turn scores into probabilities with one fused
// multiply-add each. It is persistent: with more (row block, head, batch)
// items than SMs, one block per SM takes items from a per-launch work
// counter, and its loader fetches the next item's Q and first tiles while the
// consumers finish the last one and merge its output, which hides a block's
// start and end (they weigh 4-8x more on the short blocks of a CP ring step
// than in one long call).
// The first kernel (fwd_wgmma_kernel: every thread loads with cp.async, one
// __syncthreads per tile) is kept for tensors a tensor map cannot describe
// and as INFINICP_CUDA_WGMMA_WS=0 (tuning).
// Calls with a rectangle list, a window or a softcap (API 1.1) take the
// same two designs over the band index (attn_rect.cu):
// fwd_wgmma_ws_rect_kernel (the default) and fwd_wgmma_rect_kernel.
// Only sm_90a has wgmma; every other target compiles an empty kernel that
// the dispatch never launches (wgmma_fits). wgmma.cuh defines CP_WGMMA_BODY
// there and holds the primitives both wgmma kernels use.
#include "wgmma.cuh"

namespace cu {
namespace {

using namespace mma;

constexpr int WG_THREADS = 256; // two warpgroups
constexpr int WG_BQ = 128;      // query rows per block, 64 per warpgroup
constexpr int WG_KSTAGES = 2; // K stages; V has wg_vst

// Keys per tile for Q / K columns DP and V / O columns DV (multiples of 64,
// at most 256): 128, and 64 past 128 columns (but for MLA's 192 / 128). A
// consumer thread holds its rows' output (DV / 2 registers), scores (BK / 2)
// and probabilities (BK / 4): at DV = 256 and BK = 128 that is 224 of its
// 240 registers before any address, and Q with five 128-key stages would not
// fit in shared memory either.
__host__ __device__ constexpr int wg_bk(int DP, int DV)
{
    return DV <= 128 && DP <= 192 ? 128 : 64;
}

// V stages: 3, or 2 where three do not fit beside Q and two K stages
// (MLA's 192 / 128 with 128-key tiles) in Hopper's 227 KB a block, with
// 2048 bytes kept for the alignment, the barriers and the rectangle
// kernel's stash.
__host__ __device__ constexpr int wg_vst(int DP, int DV)
{
    return (WG_BQ + WG_KSTAGES * wg_bk(DP, DV)) * DP * 2 + 3 * wg_bk(DP, DV) * DV * 2 + 2048 <= 227 * 1024 ? 3 : 2;
}

// Head columns of the wgmma forward: the larger of D and Dv rounded up to a
// 64-column block (0 past 256), for Q, K and V alike, but for MLA's q / k of
// 160-192 with v of at most 128, which keeps V at 128 columns (wg_dim_v).
__host__ __device__ constexpr int round64(int d)
{
    return (d + 63) / 64 * 64;
}

__host__ __device__ constexpr bool wg_mla(int D, int Dv)
{
    return round64(D) == 192 && round64(Dv) == 128;
}

__host__ __device__ constexpr int wg_dim(int D, int Dv)
{
    return (D > Dv ? D : Dv) > 256 ? 0 : round64(D > Dv ? D : Dv);
}

__host__ __device__ constexpr int wg_dim_v(int D, int Dv)
{
    return wg_mla(D, Dv) ? 128 : wg_dim(D, Dv);
}

// Bytes of dynamic shared memory: Q, the K and V stages, and room to align
// the tiles to the 1024 bytes the swizzle pattern repeats over.
constexpr int wgmma_smem(int DP, int DV)
{
    return (WG_BQ + WG_KSTAGES * wg_bk(DP, DV)) * DP * 2 + wg_vst(DP, DV) * wg_bk(DP, DV) * DV * 2 + 1024;
}

// The warp-specialised kernel: a loader warpgroup and the two consumers; its
// mbarriers (8 bytes each) follow the tiles.
constexpr int WS_THREADS = 384;
constexpr int wgmma_ws_smem(int DP, int DV)
{
    return wgmma_smem(DP, DV) + wg::fwd_bars_bytes(WG_KSTAGES, wg_vst(DP, DV));
}

// The rectangle kernel's item slots carry the item and its first bands
// (rect_stash) beside the queue's numbers, after the barriers.
constexpr int RECT_STASH_BANDS = 4;
constexpr int rect_stash_bytes = 2 * (48 + RECT_STASH_BANDS * 64);
constexpr int rect_ws_smem(int DP, int DV)
{
    return wgmma_ws_smem(DP, DV) + 16 + rect_stash_bytes;
}

// Tensor maps of q, k, v and v's copy without non-finite values (the
// non-finite guard's, or v again without one), in this order, for the loader.
using wg_maps = wg::tmaps<4>;

#ifdef CP_WGMMA_BODY

using wg::fence_proxy_async;
using wg::item_queue;
using wg::mbar_arrive_warp;
using wg::mbar_expect_tx;
using wg::mbar_init;
using wg::mbar_wait;
using wg::named_arrive;
using wg::named_sync;
using wg::reg_fence;
using wg::sw128_at;
using wg::sw_off;
using wg::tma_tile;

// --- the per-tile steps both kernels take (per consumer warpgroup) ---

// A warpgroup's rows before the first key tile: O = 0, no maximum, no sum.
template <int DV>
__device__ __forceinline__ void start_rows(float (&o)[DV / 8][4], float (&m)[2], float (&l)[2])
{
#pragma unroll
    for (int nb = 0; nb < DV / 8; nb++)
        o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
    m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;
}

// Issue S = Q K^T for the key tile at kt (this warpgroup's rows of Q at qa);
// committed, not waited for. The fences order the registers' last writes
// (the previous tile's softmax, rescale and P fragments) before any product
// of this tile reads or writes them.
template <typename T, int DP, int DV>
__device__ __forceinline__ void issue_s(float (&s)[wg_bk(DP, DV) / 8][4], float (&o)[DV / 8][4],
                                        uint32_t (&pa)[wg_bk(DP, DV) / 16][4], uint32_t qa, uint32_t kt)
{
    reg_fence(s);
    reg_fence(o);
    reg_fence(pa);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++)
        wg::mma_ss<T, 0, 0>(s, sw128_at((qa >> 4) + wg::kmajor_step<WG_BQ>(kk)),
                            sw128_at((kt >> 4) + wg::kmajor_step<wg_bk(DP, DV)>(kk)), kk > 0);
    wg::commit();
}

// Issue O += P V for the V tile at vt, P the previous tile's probabilities;
// committed, not waited for.
// Past DV = 128 (N = 128, the widest product the wrappers hold) the
// output's columns take two products, the second over V's column blocks from
// 2 (2 BK 128 bytes further).
template <typename T, int DP, int DV>
__device__ __forceinline__ void issue_pv(float (&o)[DV / 8][4], const uint32_t (&pa)[wg_bk(DP, DV) / 16][4], uint32_t vt)
{
    constexpr int BK = wg_bk(DP, DV);
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
        if constexpr (DV <= 128) {
            wg::mma_rs<T>(o, pa[kk], sw128_at((vt >> 4) + wg::mnmajor_step<BK>(kk)));
        } else {
            wg::mma_rs<T>(reinterpret_cast<float(&)[16][4]>(o[0]), pa[kk],
                          sw128_at((vt >> 4) + wg::mnmajor_step<BK>(kk)));
            wg::mma_rs<T>(reinterpret_cast<float(&)[DV / 8 - 16][4]>(o[16]), pa[kk],
                          sw128_at(((vt + 2 * BK * 128) >> 4) + wg::mnmajor_step<BK>(kk)));
        }
    }
    wg::commit();
}

// Consumer c's turn of the warp-specialised kernels' ping-pong: after
// named barrier 1 + c, issue S = Q K^T of the K tile at kt and, with_pv,
// O += P V of the previous tile's V at vt, let the other consumer issue
// (its barrier), and return once S is in (P V may still run).
template <typename T, int DP, int DV>
__device__ __forceinline__ void issue_turn(float (&s)[wg_bk(DP, DV) / 8][4], float (&o)[DV / 8][4],
                                           uint32_t (&pa)[wg_bk(DP, DV) / 16][4], uint32_t qa, uint32_t kt, uint32_t vt,
                                           bool with_pv, int c)
{
    named_sync(1 + c);
    issue_s<T, DP, DV>(s, o, pa, qa, kt);
    if (with_pv) {
        issue_pv<T, DP, DV>(o, pa, vt);
        named_arrive(2 - c);
        wg::wait<1>();
    } else {
        named_arrive(2 - c);
        wg::wait<0>();
    }
    reg_fence(s);
}

// With S of the tile in: its online softmax (MASKED a constant, so that no
// branch separates the two waits, or the compiler waits for both), then the
// wait for P V of the previous tile. The softmax's results are used before
// that wait, so that the compiler cannot sink the arithmetic past it (the
// overlap with P V). POS: see softmax_tile.
template <int DP, int DV, bool MASKED = true, bool POS = false>
__device__ __forceinline__ void softmax_then_wait(float (&s)[wg_bk(DP, DV) / 8][4], float (&o)[DV / 8][4], float (&m)[2],
                                                  float (&l)[2], float (&alpha)[2], const attn_params &p, int64_t k0,
                                                  int64_t row, int tq)
{
    softmax_tile<wg_bk(DP, DV) / 8, POS>(s, m, l, alpha, p, MASKED, k0, row, tq);
    reg_fence(s);
    reg_fence(l);
    reg_fence(alpha);
    wg::wait<0>();
    reg_fence(o);
}

// End of a tile: O rescaled to the new maximum, P as A fragments.
template <typename T, int DP, int DV>
__device__ __forceinline__ void finish_tile(float (&o)[DV / 8][4], const float (&alpha)[2], const float (&s)[wg_bk(DP, DV) / 8][4],
                                            uint32_t (&pa)[wg_bk(DP, DV) / 16][4])
{
    scale_rows(o, alpha);
#pragma unroll
    for (int kk = 0; kk < wg_bk(DP, DV) / 16; kk++)
        c_to_a<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
}

// After the last tile: its P V, waited for.
template <typename T, int DP, int DV>
__device__ __forceinline__ void last_pv(float (&o)[DV / 8][4], uint32_t (&pa)[wg_bk(DP, DV) / 16][4], uint32_t vt)
{
    reg_fence(o);
    reg_fence(pa);
    wg::fence();
    issue_pv<T, DP, DV>(o, pa, vt);
    wg::wait<0>();
    reg_fence(o);
}

#endif // CP_WGMMA_BODY

template <typename T, int DP, int DV>
__global__ void __launch_bounds__(WG_THREADS, 1) fwd_wgmma_kernel(attn_params p)
{
#ifdef CP_WGMMA_BODY
    constexpr int BQ = WG_BQ, BK = wg_bk(DP, DV), NB = BK / 8, NO = DV / 8, VST = wg_vst(DP, DV);
    constexpr uint32_t QB = BQ * DP * 2, KB = BK * DP * 2, VB = BK * DV * 2; // tile bytes
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Qs = (smem_addr(smem) + 1023) & ~1023u, Ks = Qs + QB, Vs = Ks + WG_KSTAGES * KB;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const fwd_block w = fwd_block_of<BQ, BK>(p);
    const int64_t i0 = w.i0, b = w.b;
    const int h = w.h, hk = w.hk, ntiles = w.ntiles;
    const int64_t row = i0 + wg * 64 + warp * 16 + g; // this thread's rows: row, row + 8

    if (ntiles > 0) {
        wg::load_sw<T, BQ, DP, WG_THREADS>(Qs, p.q, b, i0, p.Sq, h, p.D);
        wg::load_sw<T, BK, DP, WG_THREADS>(Ks, p.k, b, 0, p.Sk, hk, p.D);
        wg::load_sw<T, BK, DV, WG_THREADS>(Vs, v_of(p), b, 0, p.Sk, hk, p.Dv);
        cp_async_commit();
    }

    float o[NO][4], s[NB][4], m[2], l[2], alpha[2];
    uint32_t pa[BK / 16][4]; // P of the previous tile as A fragments
    start_rows<DV>(o, m, l);
    const uint32_t qa = Qs + wg * 64 * 128; // this warpgroup's 64 rows (8 whole atoms)

    for (int n = 0; n < ntiles; n++) {
        const int64_t k0 = (int64_t)n * BK;
        cp_async_wait_all();
        fence_proxy_async(); // the tiles were written through the generic proxy; wgmma reads through the async one
        __syncthreads();     // K, V tile n are in; both warpgroups are done with K n-1 and V n-2
        if (n + 1 < ntiles) {
            wg::load_sw<T, BK, DP, WG_THREADS>(Ks + ((n + 1) % WG_KSTAGES) * KB, p.k, b, k0 + BK, p.Sk, hk, p.D);
            wg::load_sw<T, BK, DV, WG_THREADS>(Vs + ((n + 1) % VST) * VB, v_of(p), b, k0 + BK, p.Sk, hk, p.Dv);
            cp_async_commit();
        }
        issue_s<T, DP, DV>(s, o, pa, qa, Ks + (n % WG_KSTAGES) * KB);
        if (n > 0) {
            issue_pv<T, DP, DV>(o, pa, Vs + ((n - 1) % VST) * VB);
            wg::wait<1>();
        } else {
            wg::wait<0>();
        }
        reg_fence(s);
        softmax_then_wait<DP, DV>(s, o, m, l, alpha, p, k0, row, tq);
        finish_tile<T, DP, DV>(o, alpha, s, pa);
    }
    if (ntiles > 0)
        last_pv<T, DP, DV>(o, pa, Vs + ((ntiles - 1) % VST) * VB);

    // normalise and write, or merge into the running (o, lse)
    store_rows(p, o, m, l, row, b, h, tq);
#else
    (void)p;
#endif
}

// API 1.1: fwd_wgmma_kernel's pipeline over a rectangle list. A block takes
// query tile and head (tile_head_at: most work first) and walks the key tiles
// of its bands (next_key_tile, mma.cuh): a key tile starts at the band's
// first visible key and loads zeros past the band's keys; the softmax masks
// with the band's limits per row unless the band covers the whole tile, and
// one online softmax runs through every band of the tile.
template <typename T, int DP, int DV>
__global__ void __launch_bounds__(WG_THREADS, 1) fwd_wgmma_rect_kernel(attn_params p)
{
#ifdef CP_WGMMA_BODY
    constexpr int BQ = WG_BQ, BK = wg_bk(DP, DV), NB = BK / 8, NO = DV / 8, VST = wg_vst(DP, DV);
    constexpr uint32_t QB = BQ * DP * 2, KB = BK * DP * 2, VB = BK * DV * 2; // tile bytes
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Qs = (smem_addr(smem) + 1023) & ~1023u, Ks = Qs + QB, Vs = Ks + WG_KSTAGES * KB;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const tile_head th = tile_head_at(p.rs.by_q, blockIdx.x);
    const int tile = th.tile, h = th.h, hk = h / p.G;
    const int64_t b = blockIdx.z;
    const int64_t i0 = (int64_t)tile * BQ, nq = p.Sq - i0 < BQ ? p.Sq - i0 : BQ;
    const int64_t row = i0 + wg * 64 + warp * 16 + g; // this thread's rows: row, row + 8
    const int be = p.rs.by_q.start[tile + 1];
    // the step computed now (cbi, ck0) and the next one to load (lbi, lk0)
    int cbi = p.rs.by_q.start[tile];
    int64_t ck0 = 0, ckhi = 0;
    if (cbi < be) {
        const band r = p.rs.bands[p.rs.by_q.ids[cbi]];
        band_rows_keys(r, i0, nq, &ck0, &ckhi);
        wg::load_sw<T, BQ, DP, WG_THREADS>(Qs, p.q, b, i0, p.Sq, h, p.D);
        wg::load_sw<T, BK, DP, WG_THREADS>(Ks, p.k, b, ck0, r.k1, hk, p.D);
        wg::load_sw<T, BK, DV, WG_THREADS>(Vs, v_of(p), b, ck0, r.k1, hk, p.Dv);
        cp_async_commit();
    }
    int lbi = cbi;
    int64_t lk0 = ck0, lkhi = ckhi;
    if (lbi < be)
        next_key_tile<BK>(p, be, i0, nq, lbi, lk0, lkhi);

    float o[NO][4], s[NB][4], m[2], l[2], alpha[2];
    uint32_t pa[BK / 16][4]; // P of the previous tile as A fragments
    start_rows<DV>(o, m, l);
    const uint32_t qa = Qs + wg * 64 * 128; // this warpgroup's 64 rows (8 whole atoms)

    int n = 0;
    for (; cbi < be; n++) {
        cp_async_wait_all();
        fence_proxy_async(); // the tiles were written through the generic proxy; wgmma reads through the async one
        __syncthreads();     // K, V tile n are in; both warpgroups are done with K n-1 and V n-2
        if (lbi < be) {
            const int64_t kend = p.rs.bands[p.rs.by_q.ids[lbi]].k1;
            wg::load_sw<T, BK, DP, WG_THREADS>(Ks + ((n + 1) % WG_KSTAGES) * KB, p.k, b, lk0, kend, hk, p.D);
            wg::load_sw<T, BK, DV, WG_THREADS>(Vs + ((n + 1) % VST) * VB, v_of(p), b, lk0, kend, hk, p.Dv);
            cp_async_commit();
        }
        issue_s<T, DP, DV>(s, o, pa, qa, Ks + (n % WG_KSTAGES) * KB);
        if (n > 0) {
            issue_pv<T, DP, DV>(o, pa, Vs + ((n - 1) % VST) * VB);
            wg::wait<1>();
        } else {
            wg::wait<0>();
        }
        reg_fence(s);
        const band r = p.rs.bands[p.rs.by_q.ids[cbi]];
        const bool full = band_covers(r, i0, BQ, ck0, BK);
        int lo[2] = {0, 0}, hi[2] = {BK, BK};
        if (!full) {
            row_limits(r, row, ck0, BK, &lo[0], &hi[0]);
            row_limits(r, row + 8, ck0, BK, &lo[1], &hi[1]);
        }
        softmax_band<NB>(s, m, l, alpha, p, full, lo, hi, tq);
        reg_fence(s);
        reg_fence(l);
        reg_fence(alpha);
        wg::wait<0>();
        reg_fence(o);
        finish_tile<T, DP, DV>(o, alpha, s, pa);
        cbi = lbi;
        ck0 = lk0;
        if (lbi < be)
            next_key_tile<BK>(p, be, i0, nq, lbi, lk0, lkhi);
    }
    if (n > 0)
        last_pv<T, DP, DV>(o, pa, Vs + ((n - 1) % VST) * VB);
    store_rows(p, o, m, l, row, b, h, tq);
#else
    (void)p;
#endif
}

// The same computation as fwd_wgmma_kernel with a loader warpgroup (its first
// thread issues every copy) and the two consumer warpgroups in ping-pong.
// Persistent: a block works on items of `items` (fwd_item) in turn, taken
// from *counter, or j, j + gridDim.x, ... for block j without one; the
// launch gives it one item per block or one block per SM.
// Across items the stages and their barrier phases run on (counted by the
// key tiles loaded so far), and the loader brings the next item's Q (once
// both consumers' last S product of an item is done: qempty) and first K / V
// tiles while the consumers finish the item and merge its output, so that a
// block's start and end costs overlap its neighbour's work.
template <typename T, int DP, int DV, bool POS>
__global__ void __launch_bounds__(WS_THREADS, 1) fwd_wgmma_ws_kernel(attn_params p, const __grid_constant__ wg_maps mp,
                                                                      int items, int *counter)
{
#ifdef CP_WGMMA_BODY
    constexpr int BQ = WG_BQ, BK = wg_bk(DP, DV), NB = BK / 8, NO = DV / 8;
    constexpr int KST = WG_KSTAGES, VST = wg_vst(DP, DV);
    constexpr uint32_t QB = BQ * DP * 2, KB = BK * DP * 2, VB = BK * DV * 2; // tile bytes
    // setmaxnreg: the consumers of D = 128 need 240 registers; at D = 64 the
    // loader gets more (its item bookkeeping spilled at 24), within the
    // 168 x 384 the launch bounds give the block
    constexpr int LOADER_REGS = DP == 64 && DV == 64 ? 40 : 24, CONSUMER_REGS = DP == 64 && DV == 64 ? 224 : 240;
    static_assert(128 * LOADER_REGS + 256 * CONSUMER_REGS <= 168 * WS_THREADS, "registers of the block");
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Qs = (smem_addr(smem) + 1023) & ~1023u, Ks = Qs + QB, Vs = Ks + KST * KB;
    const wg::fwd_bars<KST, VST> bars(Vs + VST * VB);
    const uint32_t qfull = bars.qfull, qempty = bars.qempty, kfull = bars.kfull, kempty = bars.kempty,
                   vfull = bars.vfull, vempty = bars.vempty;
    const item_queue iq = bars.iq;
    const int wgi = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0); // uniform: descriptors in uniform registers
    const int lane = threadIdx.x & 31;

    if (threadIdx.x == 0)
        bars.init();
    __syncthreads();

    // The items a block works on, in turn (item_queue): with a counter, the
    // next one not taken, so that blocks that finish early take more (the
    // causal row blocks, longest first, even out).
    if (wgi == 0) {
        // the loader: one thread; K tile g (counted over the block's items)
        // waits for both consumers to have read tile g - KST from its stage,
        // V likewise, Q for them to be done with the previous item's
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(LOADER_REGS) : "memory");
        if (threadIdx.x == 0) {
            int g = 0, nq = 0;
            for (int k = 0;; k++) {
                const int it = iq.post(k, items, counter);
                if (it >= items)
                    break;
                const fwd_block w = fwd_item<BQ, BK>(p, it);
                if (w.ntiles <= 0)
                    continue;
                if (nq > 0)
                    mbar_wait(qempty, (nq - 1) & 1);
                mbar_expect_tx(qfull, QB);
                tma_tile<BQ, DP>(Qs, mp, 0, qfull, (int)w.i0, w.h, (int)w.b);
                nq++;
                for (int n = 0; n < w.ntiles; n++, g++) {
                    const int ks = g % KST, vs = g % VST;
                    if (g >= KST)
                        mbar_wait(kempty + 8 * ks, ((g / KST) + 1) & 1);
                    mbar_expect_tx(kfull + 8 * ks, KB);
                    tma_tile<BK, DP>(Ks + ks * KB, mp, 1, kfull + 8 * ks, n * BK, w.hk, (int)w.b);
                    if (g >= VST)
                        mbar_wait(vempty + 8 * vs, ((g / VST) + 1) & 1);
                    mbar_expect_tx(vfull + 8 * vs, VB);
                    tma_tile<BK, DV>(Vs + vs * VB, mp, p.vflag && *p.vflag ? 3 : 2, vfull + 8 * vs, n * BK, w.hk, (int)w.b);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
        const int c = wgi - 1, warp = (threadIdx.x >> 5) & 3;
        const int g = lane >> 2, tq = lane & 3;
        const uint32_t qa = Qs + c * 64 * 128; // this warpgroup's 64 rows (8 whole atoms)
        int g0 = 0, nq = 0;                    // key tiles and Q tiles of the items before
        for (int k = 0;; k++) {
            const int it = iq.next(k, lane);
            if (it >= items)
                break;
            const fwd_block w = fwd_item<BQ, BK>(p, it);
            const int64_t i0 = w.i0;
            const int h = w.h, b = (int)w.b, ntiles = w.ntiles;
            const int64_t row = i0 + c * 64 + warp * 16 + g; // this thread's rows: row, row + 8
            float o[NO][4], s[NB][4], m[2], l[2], alpha[2];
            uint32_t pa[BK / 16][4]; // P of the previous tile as A fragments
            start_rows<DV>(o, m, l);

            // Ping-pong: consumer c issues its products after named barrier
            // 1 + c and then lets the other one issue (its barrier); consumer
            // 0 starts.
            if (c == 0)
                named_arrive(1);
            if (ntiles > 0)
                mbar_wait(qfull, nq & 1);
            // POS: tiles [0, nfull) are seen whole by every row of the block
            // and skip the mask (no product is in flight between two tiles,
            // so the two loops cost no wait); otherwise every tile is masked.
            int64_t nf = p.Sk / BK;
            if (p.causal) {
                const int64_t e = i0 + p.delta + 1; // keys the block's first row sees
                nf = e <= 0 ? 0 : e / BK < nf ? e / BK : nf;
            }
            const int nfull = POS ? (int)(nf < ntiles ? nf : ntiles) : 0;
            auto tile = [&](int n, auto masked) {
                const int64_t k0 = (int64_t)n * BK;
                const int gk = g0 + n; // this tile's number in the block's stream of tiles
                const int ks = gk % KST, vs = (gk + VST - 1) % VST; // K of tile n, V of tile n - 1
                mbar_wait(kfull + 8 * ks, (gk / KST) & 1);
                if (n > 0)
                    mbar_wait(vfull + 8 * vs, ((gk - 1) / VST) & 1);
                issue_turn<T, DP, DV>(s, o, pa, qa, Ks + ks * KB, Vs + vs * VB, n > 0, c);
                mbar_arrive_warp(kempty + 8 * ks, lane); // K tile n is read
                if (n == ntiles - 1)
                    mbar_arrive_warp(qempty, lane); // and Q, for this item

                softmax_then_wait<DP, DV, decltype(masked)::value, POS>(s, o, m, l, alpha, p, k0, row, tq);
                if (n > 0)
                    mbar_arrive_warp(vempty + 8 * vs, lane); // V tile n - 1 is read
                finish_tile<T, DP, DV>(o, alpha, s, pa);
            };
            int n = 0;
            for (; n < nfull; n++)
                tile(n, std::false_type());
            for (; n < ntiles; n++)
                tile(n, std::true_type());
            if (ntiles > 0) {
                const int gk = g0 + ntiles - 1, vs = gk % VST;
                mbar_wait(vfull + 8 * vs, (gk / VST) & 1);
                last_pv<T, DP, DV>(o, pa, Vs + vs * VB);
                mbar_arrive_warp(vempty + 8 * vs, lane); // the last V tile is read
            }
            if (c == 0)
                named_sync(1); // takes consumer 1's last arrival: no barrier is left half-way

            store_rows(p, o, m, l, row, b, h, tq);
            g0 += ntiles;
            nq += ntiles > 0;
        }
    }
#else
    (void)p, (void)mp, (void)items, (void)counter;
#endif
}

#ifdef CP_WGMMA_BODY
// Rows [z, BK) of the V tile at vt as zeros, by the 128 threads of a
// warpgroup (tid its thread): a band's last key tile reaches past the
// band's keys, and the rows there may hold anything (a CP ring's buffers
// hold rows nobody wrote); P is 0 there, but 0 times NaN is not.
template <int DP, int DV>
__device__ __forceinline__ void zero_tail(uint32_t vt, int z, int tid)
{
    constexpr int BK = wg_bk(DP, DV);
    const int chunks = (BK - z) * 8; // 16-byte chunks of each 64-column block
#pragma unroll
    for (int kb = 0; kb < DV / 64; kb++)
#pragma unroll 1
        for (int e = tid; e < chunks; e += 128)
            wg::zero16(vt + (uint32_t)(kb * BK + z) * 128 + (uint32_t)e * 16);
}

// The work item `it` of the rectangle kernel: query tiles fastest (most
// visible pairs first), then heads (tile_head_at), then batches.
struct rect_item {
    int64_t i0, nq;
    int h, hk, b, first, end; // bands p.rs.by_q.ids[first..end)
};

__device__ __forceinline__ rect_item rect_item_at(const attn_params &p, int it)
{
    const int per_b = p.rs.by_q.ntiles * p.H, rem = it % per_b;
    rect_item w;
    const tile_head th = tile_head_at(p.rs.by_q, rem);
    const int tile = th.tile;
    w.b = it / per_b;
    w.h = th.h;
    w.hk = w.h / p.G;
    w.i0 = (int64_t)tile * WG_BQ;
    w.nq = p.Sq - w.i0 < WG_BQ ? p.Sq - w.i0 : WG_BQ;
    w.first = p.rs.by_q.start[tile];
    w.end = p.rs.by_q.start[tile + 1];
    return w;
}

// A band's limits for a query tile from i0 and this thread's rows (row,
// row + 8), computed once per band instead of per key tile: a key tile from
// j0 is seen whole by every row of the tile iff flo <= j0 and j0 + BK <=
// fhi; row e sees keys [ka[e], kb[e]) (empty outside the band); the band's
// keys end at k1.
struct rect_limits {
    int64_t flo, fhi, k1, ka[2], kb[2];
};

__device__ __forceinline__ rect_limits rect_limits_of(const band &r, int64_t i0, int64_t row)
{
    rect_limits L;
    L.flo = INT64_MAX, L.fhi = INT64_MIN;
    if (i0 >= r.q0 && i0 + WG_BQ <= r.q1) {
        int64_t lo, hi, x;
        band_keys(r, i0 + WG_BQ - 1, &lo, &x);
        band_keys(r, i0, &x, &hi);
        L.flo = lo > r.k0 ? lo : r.k0;
        L.fhi = hi < r.k1 ? hi : r.k1;
    }
    L.k1 = r.k1;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int64_t i = row + 8 * e;
        L.ka[e] = L.kb[e] = 0;
        if (i >= r.q0 && i < r.q1)
            band_keys(r, i, &L.ka[e], &L.kb[e]);
    }
    return L;
}

// What the loader passes on with an item of the rectangle kernel, in the
// item's slot (two, as the queue's): the item decoded and its first bands,
// so that the consumers start an item without a chain of global loads
// (order, start, ids, bands) after the previous one's store.
struct rect_stash {
    rect_item w;
    band b[RECT_STASH_BANDS];
};
static_assert(sizeof(rect_item) <= 48 && sizeof(rect_stash) <= 48 + RECT_STASH_BANDS * 64, "rect_stash_bytes");

// Band i of item w (w.first <= i < w.end): from the stash where it holds it.
__device__ __forceinline__ band stash_band(const attn_params &p, const rect_stash &st, int i)
{
    return i - st.w.first < RECT_STASH_BANDS ? st.b[i - st.w.first] : p.rs.bands[p.rs.by_q.ids[i]];
}

#endif // CP_WGMMA_BODY

// API 1.1 on the warp-specialised pipeline (fwd_wgmma_ws_kernel's loader,
// ping-pong consumers and persistent items) over a rectangle list: an item
// is a query tile of one head (rect_item_at, most work first, taken from the
// counter: longest-first list scheduling over the SMs), and its key tiles
// are the walk of fwd_wgmma_rect_kernel (each band's visible keys from its
// first, next_key_tile), which the loader and the consumers each take in
// the same order. The loader's copies start at any key row; rows past the
// band's last key come in with the tile, and the consumers mask their
// scores and zero their V rows (zero_tail) before the P V product.
template <typename T, int DP, int DV, bool CAP, bool POS>
__global__ void __launch_bounds__(WS_THREADS, 1)
    fwd_wgmma_ws_rect_kernel(attn_params p, const __grid_constant__ wg_maps mp, int items, int *counter)
{
#ifdef CP_WGMMA_BODY
    constexpr int BQ = WG_BQ, BK = wg_bk(DP, DV), NB = BK / 8, NO = DV / 8;
    constexpr int KST = WG_KSTAGES, VST = wg_vst(DP, DV);
    constexpr uint32_t QB = BQ * DP * 2, KB = BK * DP * 2, VB = BK * DV * 2; // tile bytes
    // the loader walks the bands too: at 24 registers it spilled 76 bytes;
    // the consumers' band softmax fits 232 at D = 128 (no spills)
    constexpr int LOADER_REGS = 40, CONSUMER_REGS = DP == 64 && DV == 64 ? 224 : 232;
    static_assert(128 * LOADER_REGS + 256 * CONSUMER_REGS <= 168 * WS_THREADS, "registers of the block");
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Qs = (smem_addr(smem) + 1023) & ~1023u, Ks = Qs + QB, Vs = Ks + KST * KB;
    const wg::fwd_bars<KST, VST> bars(Vs + VST * VB);
    const uint32_t qfull = bars.qfull, qempty = bars.qempty, kfull = bars.kfull, kempty = bars.kempty,
                   vfull = bars.vfull, vempty = bars.vempty;
    const item_queue iq = bars.iq;
    // the two slots' stashes, 16-byte aligned after the barriers
    constexpr uint32_t BARS = wg::fwd_bars_bytes(KST, VST);
    rect_stash *const stash =
        reinterpret_cast<rect_stash *>(smem + (((Vs + VST * VB + BARS + 15) & ~15u) - smem_addr(smem)));
    const int wgi = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    const int lane = threadIdx.x & 31;

    if (threadIdx.x == 0)
        bars.init();
    __syncthreads();

    if (wgi == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(LOADER_REGS) : "memory");
        if (threadIdx.x == 0) {
            const int vmap = p.vflag && *p.vflag ? 3 : 2;
            int g = 0, nql = 0;
            for (int k = 0;; k++) {
                const int it = iq.take(k, items, counter);
                if (it >= items) {
                    iq.publish(k);
                    break;
                }
                const rect_item w = rect_item_at(p, it);
                rect_stash &st = stash[k & 1];
                st.w = w;
                for (int j = 0; j < RECT_STASH_BANDS && w.first + j < w.end; j++)
                    st.b[j] = p.rs.bands[p.rs.by_q.ids[w.first + j]];
                iq.publish(k);
                int bi = w.first;
                if (bi >= w.end)
                    continue;
                if (nql > 0)
                    mbar_wait(qempty, (nql - 1) & 1);
                mbar_expect_tx(qfull, QB);
                tma_tile<BQ, DP>(Qs, mp, 0, qfull, (int)w.i0, w.h, w.b);
                nql++;
                int64_t k0, khi;
                band_rows_keys(p.rs.bands[p.rs.by_q.ids[bi]], w.i0, w.nq, &k0, &khi);
                for (; bi < w.end; g++) {
                    const int ks = g % KST, vs = g % VST;
                    if (g >= KST)
                        mbar_wait(kempty + 8 * ks, ((g / KST) + 1) & 1);
                    mbar_expect_tx(kfull + 8 * ks, KB);
                    tma_tile<BK, DP>(Ks + ks * KB, mp, 1, kfull + 8 * ks, (int)k0, w.hk, w.b);
                    if (g >= VST)
                        mbar_wait(vempty + 8 * vs, ((g / VST) + 1) & 1);
                    mbar_expect_tx(vfull + 8 * vs, VB);
                    tma_tile<BK, DV>(Vs + vs * VB, mp, vmap, vfull + 8 * vs, (int)k0, w.hk, w.b);
                    next_key_tile<BK>(p, w.end, w.i0, w.nq, bi, k0, khi);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
        const int c = wgi - 1, warp = (threadIdx.x >> 5) & 3;
        const int g = lane >> 2, tq = lane & 3;
        const uint32_t qa = Qs + c * 64 * 128;
        int g0 = 0, nqc = 0; // key tiles and Q tiles of the items before
        for (int k = 0;; k++) {
            if (iq.peek(k) >= items)
                break;
            const rect_stash &st = stash[k & 1];
            const rect_item w = st.w;
            const int64_t i0 = w.i0, row = i0 + c * 64 + warp * 16 + g; // this thread's rows: row, row + 8
            float o[NO][4], s[NB][4], m[2], l[2], alpha[2];
            uint32_t pa[BK / 16][4];
            start_rows<DV>(o, m, l);
            if (c == 0)
                named_arrive(1);
            // the walk: band cbi of the tile's list, key tile from ck0 (the
            // band's keys for these rows end at ckhi); L: the band's limits
            int cbi = w.first;
            int64_t ck0 = 0, ckhi = 0;
            rect_limits L;
            if (cbi < w.end) {
                const band r = stash_band(p, st, cbi);
                band_rows_keys(r, i0, w.nq, &ck0, &ckhi);
                L = rect_limits_of(r, i0, row);
                mbar_wait(qfull, nqc & 1);
            }
            int n = 0, tail = BK; // rows of the last tile inside its band
            // One key tile; MASKED a constant, so that no branch separates
            // the product's issue from its wait (ptxas would wait for every
            // product at the join).
            auto tile = [&](auto masked, const int (&lo)[2], const int (&hi)[2], bool last) {
                constexpr bool M = decltype(masked)::value;
                const int gk = g0 + n, ks = gk % KST, vs = (gk + VST - 1) % VST;
                mbar_wait(kfull + 8 * ks, (gk / KST) & 1);
                if (n > 0) {
                    mbar_wait(vfull + 8 * vs, ((gk - 1) / VST) & 1);
                    if (tail < BK) {
                        zero_tail<DP, DV>(Vs + vs * VB, tail, threadIdx.x & 127);
                        fence_proxy_async();
                        named_sync<128>(3 + c);
                    }
                }
                issue_turn<T, DP, DV>(s, o, pa, qa, Ks + ks * KB, Vs + vs * VB, n > 0, c);
                mbar_arrive_warp(kempty + 8 * ks, lane);
                if (last)
                    mbar_arrive_warp(qempty, lane); // the item's last S product is done: Q is free
                if constexpr (M || CAP)
                    softmax_band<NB, CAP ? 1 : 0, POS && !CAP>(s, m, l, alpha, p, !M, lo, hi, tq);
                else // a whole tile: the dense kernel's softmax
                    softmax_tile<NB, POS>(s, m, l, alpha, p, false, 0, row, tq);
                reg_fence(s);
                reg_fence(l);
                reg_fence(alpha);
                wg::wait<0>();
                reg_fence(o);
                if (n > 0)
                    mbar_arrive_warp(vempty + 8 * vs, lane);
                finish_tile<T, DP, DV>(o, alpha, s, pa);
            };
            while (cbi < w.end) {
                const bool last = ck0 + BK >= ckhi && cbi + 1 >= w.end;
                if (ck0 >= L.flo && ck0 + BK <= L.fhi) {
                    const int all[2] = {0, 0};
                    tile(std::false_type(), all, all, last);
                } else {
                    int lo[2], hi[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        lo[e] = (int)(L.ka[e] - ck0 < 0 ? 0 : L.ka[e] - ck0 > BK ? BK : L.ka[e] - ck0);
                        hi[e] = (int)(L.kb[e] - ck0 < 0 ? 0 : L.kb[e] - ck0 > BK ? BK : L.kb[e] - ck0);
                    }
                    tile(std::true_type(), lo, hi, last);
                }
                n++;
                tail = L.k1 - ck0 < BK ? (int)(L.k1 - ck0) : BK;
                ck0 += BK;
                if (ck0 >= ckhi && ++cbi < w.end) { // the next band
                    const band r = stash_band(p, st, cbi);
                    band_rows_keys(r, i0, w.nq, &ck0, &ckhi);
                    L = rect_limits_of(r, i0, row);
                }
            }
            iq.release(k, lane); // the item's stash is read
            if (n > 0) {
                const int gk = g0 + n - 1, vs = gk % VST;
                mbar_wait(vfull + 8 * vs, (gk / VST) & 1);
                if (tail < BK) {
                    zero_tail<DP, DV>(Vs + vs * VB, tail, threadIdx.x & 127);
                    fence_proxy_async();
                    named_sync<128>(3 + c);
                }
                last_pv<T, DP, DV>(o, pa, Vs + vs * VB);
                mbar_arrive_warp(vempty + 8 * vs, lane);
            }
            if (c == 0)
                named_sync(1); // takes consumer 1's last arrival
            store_rows(p, o, m, l, row, w.b, w.h, tq);
            g0 += n;
            nqc += n > 0;
        }
    }
#else
    (void)p, (void)mp, (void)items, (void)counter;
#endif
}

// The loader's tensor maps (wg_maps' order) for key tiles of bk rows; false
// where one of q, k, v (or v's clean copy) has none.
bool make_maps(const attn_params &p, int bk, wg_maps *mp)
{
    return wg::make_map(&mp->m[0], mp->pos[0], p.q, p.dt, p.Sq, p.H, p.B, p.D, WG_BQ) &&
           wg::make_map(&mp->m[1], mp->pos[1], p.k, p.dt, p.Sk, p.Hkv, p.B, p.D, bk) &&
           wg::make_map(&mp->m[2], mp->pos[2], p.v, p.dt, p.Sk, p.Hkv, p.B, p.Dv, bk) &&
           wg::make_map(&mp->m[3], mp->pos[3], p.vflag ? p.vs : p.v, p.dt, p.Sk, p.Hkv, p.B, p.Dv, bk);
}

template <typename T, int DP, int DV>
cp_status launch(state *s, const attn_params &p)
{
    const dim3 grid((unsigned)((p.Sq + WG_BQ - 1) / WG_BQ), (unsigned)p.H, (unsigned)p.B);
    wg_maps mp;
    if (s->knob.wgmma_ws && wgmma_ws_smem(DP, DV) <= s->smem_optin && p.Sq <= INT32_MAX && p.Sk <= INT32_MAX &&
        (int64_t)grid.x * grid.y * grid.z + s->sm_count <= INT32_MAX && make_maps(p, wg_bk(DP, DV), &mp)) {
        constexpr int bytes = wgmma_ws_smem(DP, DV);
        auto kernel = p.c > 0 ? fwd_wgmma_ws_kernel<T, DP, DV, true> : fwd_wgmma_ws_kernel<T, DP, DV, false>;
        cp_status r = allow_smem((const void *)kernel, bytes, "attention forward (wgmma, warp-specialised)");
        if (r != CP_SUCCESS)
            return r;
        // one item a block, or (persistent) one block an SM when there are
        // more items than SMs
        const int64_t items = (int64_t)grid.x * grid.y * grid.z;
        const bool persist = items > s->sm_count;
        int *counter = persist ? take_sched(s) : nullptr;
        kernel<<<(unsigned)(persist ? s->sm_count : items), WS_THREADS, bytes, s->stream>>>(p, mp, (int)items,
                                                                                          counter);
        return check_launch("attention forward (wgmma, warp-specialised)");
    }
    constexpr int bytes = wgmma_smem(DP, DV);
    auto kernel = fwd_wgmma_kernel<T, DP, DV>;
    cp_status r = allow_smem((const void *)kernel, bytes, "attention forward (wgmma)");
    if (r != CP_SUCCESS)
        return r;
    kernel<<<grid, WG_THREADS, bytes, s->stream>>>(p);
    return check_launch("attention forward (wgmma)");
}

// The warp-specialised rectangle kernel where tensor maps describe q, k and
// v (after the guard's begin: v's map may be its clean copy), else false.
template <typename T, int DP, int DV>
bool launch_rect_ws(state *s, const attn_params &p, cp_status *r)
{
    const int64_t items = (int64_t)p.rs.by_q.ntiles * p.H * p.B;
    wg_maps mp;
    if (!(s->knob.wgmma_ws && rect_ws_smem(DP, DV) <= s->smem_optin && p.Sq <= INT32_MAX && p.Sk <= INT32_MAX &&
          items + s->sm_count <= INT32_MAX && make_maps(p, wg_bk(DP, DV), &mp)))
        return false;
    constexpr int bytes = rect_ws_smem(DP, DV);
    // CAP: a softcap (every tile through softmax_band); POS (no softcap and
    // a positive scale): whole tiles take the dense kernel's softmax with
    // one multiply-add a probability
    auto kernel = p.softcap      ? fwd_wgmma_ws_rect_kernel<T, DP, DV, true, false>
                  : p.c > 0 ? fwd_wgmma_ws_rect_kernel<T, DP, DV, false, true>
                            : fwd_wgmma_ws_rect_kernel<T, DP, DV, false, false>;
    *r = allow_smem((const void *)kernel, bytes, "attention forward (wgmma, warp-specialised, rectangles)");
    if (*r != CP_SUCCESS || items == 0)
        return true;
    const bool persist = items > s->sm_count;
    int *counter = persist ? take_sched(s) : nullptr;
    kernel<<<(unsigned)(persist ? s->sm_count : items), WS_THREADS, bytes, s->stream>>>(p, mp, (int)items, counter);
    *r = check_launch("attention forward (wgmma, warp-specialised, rectangles)");
    return true;
}

template <typename T, int DP, int DV>
cp_status launch_rect(state *s, const attn_params &p0)
{
    attn_params p = p0;
    void *buf;
    cp_status r = rect_upload(s, &p, WG_BQ, 64, &buf);
    if (r != CP_SUCCESS)
        return r;
    r = nf_forward_begin(s, &p); // the guard, after the list is up
    if (r == CP_SUCCESS && !launch_rect_ws<T, DP, DV>(s, p, &r)) {
        constexpr int bytes = wgmma_smem(DP, DV);
        auto kernel = fwd_wgmma_rect_kernel<T, DP, DV>;
        r = allow_smem((const void *)kernel, bytes, "attention forward (wgmma, rectangles)");
        if (r == CP_SUCCESS) {
            dim3 grid((unsigned)((int64_t)p.rs.by_q.ntiles * p.H), 1, (unsigned)p.B);
            kernel<<<grid, WG_THREADS, bytes, s->stream>>>(p);
            r = check_launch("attention forward (wgmma, rectangles)");
        }
    }
    if (r == CP_SUCCESS)
        r = nf_forward_end(s, p); // the guard's patch reads the list too
    return rect_release(s, buf, r);
}

template <typename T>
cp_status forward_t(state *s, const attn_params &p)
{
    if (wg_mla(p.D, p.Dv)) // V of 128 columns
        return p.rects ? launch_rect<T, 192, 128>(s, p) : launch<T, 192, 128>(s, p);
    switch (wg_dim(p.D, p.Dv)) {
    case 64:
        return p.rects ? launch_rect<T, 64, 64>(s, p) : launch<T, 64, 64>(s, p);
    case 128:
        return p.rects ? launch_rect<T, 128, 128>(s, p) : launch<T, 128, 128>(s, p);
    case 192:
        return p.rects ? launch_rect<T, 192, 192>(s, p) : launch<T, 192, 192>(s, p);
    default:
        return p.rects ? launch_rect<T, 256, 256>(s, p) : launch<T, 256, 256>(s, p);
    }
}

} // namespace

bool wgmma_fits(const state *s, const attn_params &p)
{
#ifdef CP_HAVE_SM90A
    const int DP = wg_dim(p.D, p.Dv), DV = wg_dim_v(p.D, p.Dv);
    return s->cc == 90 && (p.dt == CP_DTYPE_F16 || p.dt == CP_DTYPE_BF16) && p.vec && DP > 0 &&
           p.B <= 65535 && p.H <= 65535 && (p.Sq + WG_BQ - 1) / WG_BQ * (p.rects ? p.H : 1) <= 0x7fffffff &&
           wgmma_smem(DP, DV) <= s->smem_optin;
#else
    (void)s, (void)p;
    return false; // no sm_90a machine code in this build
#endif
}

cp_status wgmma_forward(state *s, const attn_params &p)
{
    return p.dt == CP_DTYPE_BF16 ? forward_t<__nv_bfloat16>(s, p) : forward_t<__half>(s, p);
}

} // namespace cu
