// SPDX-License-Identifier: MIT
// FP8 (E4M3, API 1.2) block attention forward on Hopper's FP8 tensor cores:
// S = Q K^T and O += P V both run as wgmma m64n128k32 with E4M3 operands
// and fp32 accumulators, twice the 16-bit kernels' rate per instruction.
//
// The pipeline is the warp-specialised 16-bit forward's (attn_wgmma_fwd.cu:
// a loader warpgroup issuing TMA copies, two consumer warpgroups of 64 query
// rows each in ping-pong, persistent over (row block, head, batch) items,
// the online softmax of mma.cuh). What FP8 changes:
//  - Head dims up to 128, padded to 128 (a tile row is 128 bytes, one
//    128-byte swizzle atom wide; the copy engine fills columns past the head
//    dim with zeros).
//  - FP8 products take both operands K-major. For O += P V the reduction
//    runs over keys, so V must be stored [dim][key]: a first kernel
//    (fp8_vt) writes V transposed into the workspace, each (batch, kv
//    head) a 128 x Skp matrix (Skp = Sk rounded up to 128, zeros past Sk).
//  - P, the fp32 accumulators of S after the softmax, goes to the product
//    as E4M3 in registers. The accumulator layout gives a thread keys
//    8 j + 2 tq, + 1 of row g (and g + 8), while the k32 A fragment wants
//    keys 4 tq .. 4 tq + 3 (and + 16); instead of moving bytes between
//    threads, fp8_vt stores the keys of each group of 32 in the order the
//    fragment reads them (fp8_slot), so the accumulators convert in place.
//    Probabilities are in (0, 1] relative to the running maximum: E4M3
//    keeps them within 2^-4 relative, or 2^-10 absolute below 2^-6; the
//    row sums are taken before the rounding.
//  - The descales: q's and k's multiply the softmax scale (softmax_tile_c;
//    per head where they are), v's the output before it is stored.
//
// Non-finite inputs (docs/RELIABILITY.md): E4M3 has NaN but no infinities.
// A NaN in Q or K reaches only scores, which the mask replaces where hidden.
// V leaks through the zero probabilities of hidden pairs, so fp8_vt (with
// the guard on) stores NaN codes as zeros and sets the guard's flag and key
// row bits (nonfinite.cu's layout: the flag, the bits, then the transposed
// V), and the guard's patch (nf_forward_end) then gives NaN to every output
// element that sees one through a visible pair.
#include <cinttypes>
#include <type_traits>

#include "wgmma.cuh"

namespace cu {
namespace {

using namespace mma;

constexpr int F8_BQ = 128, F8_BK = 128, F8_DP = 128; // rows, keys, padded head dim
constexpr int F8_KST = 2, F8_VST = 3;                // K and V stages
constexpr int F8_THREADS = 384;                      // loader + two consumers
constexpr uint32_t F8_TILE = 128 * 128;              // bytes of every tile

constexpr int fp8_smem()
{
    return (int)((1 + F8_KST + F8_VST) * F8_TILE) + 1024 + wg::fwd_bars_bytes(F8_KST, F8_VST);
}

// Keys per row of the transposed V.
__host__ __device__ inline int64_t fp8_skp(const attn_params &p)
{
    return (p.Sk + F8_BK - 1) / F8_BK * F8_BK;
}

// Where key r (0..31) of a group of 32 is stored in a row of the transposed
// V: the byte of the k32 A fragment that holds its probability (k = 16 h +
// 4 tq + i holds key 16 h + 8 (i >> 1) + 2 tq + (i & 1)).
__host__ __device__ inline int fp8_slot(int r)
{
    const int h = r >> 4, q = r & 15;
    return 16 * h + 4 * ((q & 7) >> 1) + (((q >> 3) << 1) | (q & 1));
}

// --- the transposed V ---
//
// A block per 64 keys of one (batch, kv head): reads the keys' rows (16-byte
// chunks), scans them for NaN codes (with the guard: stored as 0, flag and
// row bits set), and writes 64 bytes of each of the 128 rows of the
// transposed tile, keys in fp8_slot order, zeros past Sk and past Dv.
constexpr int VT_KEYS = 64, VT_THREADS = 256;

__global__ void __launch_bounds__(VT_THREADS) fp8_vt(attn_params p, uint8_t *vt, int64_t skp, int guard, int *flag,
                                                     uint32_t *bits)
{
    __shared__ __align__(16) uint8_t t[F8_DP][VT_KEYS + 16]; // [dim][key slot], padded rows
    const int64_t nkb = skp / VT_KEYS;
    const int64_t kb = blockIdx.x % nkb;
    const int hk = (int)(blockIdx.x / nkb % p.Hkv);
    const int64_t b = blockIdx.x / nkb / p.Hkv;
    const int64_t j0 = kb * VT_KEYS;
    const uint8_t *v = static_cast<const uint8_t *>(p.v.p);
    // read: VT_KEYS rows x 8 chunks of 16 bytes
    for (int e = threadIdx.x; e < VT_KEYS * 8; e += VT_THREADS) {
        const int r = e >> 3, c = e & 7; // key row in the block, chunk
        const int64_t j = j0 + r;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (j < p.Sk && c * 16 < p.Dv)
            x = *reinterpret_cast<const uint4 *>(v + at(p.v, b, j, hk) + c * 16);
        uint32_t w[4] = {x.x, x.y, x.z, x.w};
        bool nan = false;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            // bytes with all of bits 0..6 set are NaN (0x7f, 0xff): 0x80 in each
            const uint32_t isnan = ((w[k] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
            if (isnan) {
                nan = true;
                if (guard)
                    w[k] &= ~((isnan >> 7) * 0xffu);
            }
        }
        if (nan && guard)
            nf_mark_key(p, flag, bits, b, hk, j);
        const int slot = (r & ~31) + fp8_slot(r & 31);
#pragma unroll
        for (int k = 0; k < 16; k++)
            t[c * 16 + k][slot] = (uint8_t)(w[k >> 2] >> (8 * (k & 3)));
    }
    __syncthreads();
    // write: 128 rows x 4 chunks of 16 bytes
    uint8_t *dst = vt + ((b * p.Hkv + hk) * F8_DP) * skp + j0;
    for (int e = threadIdx.x; e < F8_DP * (VT_KEYS / 16); e += VT_THREADS) {
        const int d = e >> 2, c = e & 3;
        *reinterpret_cast<uint4 *>(dst + (int64_t)d * skp + c * 16) = *reinterpret_cast<const uint4 *>(&t[d][c * 16]);
    }
}

// Tensor maps of q, k and the transposed V, for the loader.
using f8_maps = wg::tmaps<3>;

#ifdef CP_WGMMA_BODY

using wg::mbar_arrive_warp;
using wg::mbar_expect_tx;
using wg::mbar_init;
using wg::mbar_wait;
using wg::named_arrive;
using wg::named_sync;
using wg::reg_fence;
using wg::sw128_at;

// Two fp32 values as two E4M3 bytes (lo in the low byte), rounded to
// nearest, saturating (NaN stays NaN).
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi)
{
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// The probabilities of keys [32 kk, 32 kk + 32) (accumulator blocks
// 4 kk .. 4 kk + 3) as the k32 A fragment, in fp8_slot order.
__device__ __forceinline__ void p_to_a(uint32_t (&a)[4], const float (&s)[16][4], int kk)
{
    const float(&s0)[4] = s[4 * kk], (&s1)[4] = s[4 * kk + 1], (&s2)[4] = s[4 * kk + 2], (&s3)[4] = s[4 * kk + 3];
    a[0] = e4m3x2(s0[0], s0[1]) | e4m3x2(s1[0], s1[1]) << 16;
    a[1] = e4m3x2(s0[2], s0[3]) | e4m3x2(s1[2], s1[3]) << 16;
    a[2] = e4m3x2(s2[0], s2[1]) | e4m3x2(s3[0], s3[1]) << 16;
    a[3] = e4m3x2(s2[2], s2[3]) | e4m3x2(s3[2], s3[3]) << 16;
}

#endif // CP_WGMMA_BODY

// The kernel: fwd_wgmma_ws_kernel's structure (see there for the barriers,
// the item queue and the ping-pong); the differences are marked.
__global__ void __launch_bounds__(F8_THREADS, 1) fwd_fp8_kernel(attn_params p, const __grid_constant__ f8_maps mp,
                                                                int items, int *counter)
{
#ifdef CP_WGMMA_BODY
    constexpr int BQ = F8_BQ, BK = F8_BK, NB = BK / 8, NO = F8_DP / 8;
    constexpr int KST = F8_KST, VST = F8_VST;
    constexpr uint32_t TB = F8_TILE;
    constexpr int LOADER_REGS = 40, CONSUMER_REGS = 232;
    static_assert(128 * LOADER_REGS + 256 * CONSUMER_REGS <= 168 * F8_THREADS, "registers of the block");
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Qs = (smem_addr(smem) + 1023) & ~1023u, Ks = Qs + TB, Vs = Ks + KST * TB;
    const wg::fwd_bars<KST, VST> bars(Vs + VST * TB);
    const uint32_t qfull = bars.qfull, qempty = bars.qempty, kfull = bars.kfull, kempty = bars.kempty,
                   vfull = bars.vfull, vempty = bars.vempty;
    const wg::item_queue iq = bars.iq;
    const int wgi = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
    const int lane = threadIdx.x & 31;

    if (threadIdx.x == 0)
        bars.init();
    __syncthreads();

    if (wgi == 0) {
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
                mbar_expect_tx(qfull, TB);
                wg::tma_box(Qs, mp, 0, qfull, 0, (int)w.i0, w.h, (int)w.b);
                nq++;
                for (int n = 0; n < w.ntiles; n++, g++) {
                    const int ks = g % KST, vs = g % VST;
                    if (g >= KST)
                        mbar_wait(kempty + 8 * ks, ((g / KST) + 1) & 1);
                    mbar_expect_tx(kfull + 8 * ks, TB);
                    wg::tma_box(Ks + ks * TB, mp, 1, kfull + 8 * ks, 0, n * BK, w.hk, (int)w.b);
                    if (g >= VST)
                        mbar_wait(vempty + 8 * vs, ((g / VST) + 1) & 1);
                    mbar_expect_tx(vfull + 8 * vs, TB);
                    // FP8: the transposed V's box at column (key) n BK, rows 0..127 (dims)
                    wg::tma_box(Vs + vs * TB, mp, 2, vfull + 8 * vs, n * BK, 0, w.hk, (int)w.b);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
        const int c = wgi - 1, warp = (threadIdx.x >> 5) & 3;
        const int g = lane >> 2, tq = lane & 3;
        const uint32_t qa = Qs + c * 64 * 128; // this warpgroup's 64 rows
        int g0 = 0, nq = 0;
        for (int k = 0;; k++) {
            const int it = iq.next(k, lane);
            if (it >= items)
                break;
            const fwd_block w = fwd_item<BQ, BK>(p, it);
            const int64_t i0 = w.i0;
            const int h = w.h, b = (int)w.b, ntiles = w.ntiles;
            const int64_t row = i0 + c * 64 + warp * 16 + g;
            // FP8: the scale of the scores takes the q and k descales
            const float sc = p.c * (descale(p.qd, p.dph, h) * descale(p.kd, p.dph, w.hk));
            float o[NO][4], s[NB][4], m[2], l[2], alpha[2];
            uint32_t pa[BK / 32][4]; // P of the previous tile as k32 A fragments
#pragma unroll
            for (int nb = 0; nb < NO; nb++)
                o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
            m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;

            if (c == 0)
                named_arrive(1);
            if (ntiles > 0)
                mbar_wait(qfull, nq & 1);
            int64_t nf = p.Sk / BK;
            if (p.causal) {
                const int64_t e = i0 + p.delta + 1;
                nf = e <= 0 ? 0 : e / BK < nf ? e / BK : nf;
            }
            const int nfull = (int)(nf < ntiles ? nf : ntiles);
            auto tile = [&](int n, auto masked, auto pos) {
                const int64_t k0 = (int64_t)n * BK;
                const int gk = g0 + n;
                const int ks = gk % KST, vs = (gk + VST - 1) % VST;
                mbar_wait(kfull + 8 * ks, (gk / KST) & 1);
                if (n > 0)
                    mbar_wait(vfull + 8 * vs, ((gk - 1) / VST) & 1);
                named_sync(1 + c);
                reg_fence(s);
                reg_fence(o);
                reg_fence(pa);
                wg::fence();
#pragma unroll
                for (int kk = 0; kk < F8_DP / 32; kk++)
                    wg::mma_ss_e4m3(s, sw128_at((qa >> 4) + wg::kmajor_step<BQ>(kk)),
                                    sw128_at(((Ks + ks * TB) >> 4) + wg::kmajor_step<BK>(kk)), kk > 0);
                wg::commit();
                if (n > 0) {
#pragma unroll
                    for (int kk = 0; kk < BK / 32; kk++)
                        wg::mma_rs_e4m3(o, pa[kk], sw128_at(((Vs + vs * TB) >> 4) + wg::kmajor_step<F8_DP>(kk)));
                    wg::commit();
                    named_arrive(2 - c);
                    wg::wait<1>();
                } else {
                    named_arrive(2 - c);
                    wg::wait<0>();
                }
                reg_fence(s);
                mbar_arrive_warp(kempty + 8 * ks, lane);
                if (n == ntiles - 1)
                    mbar_arrive_warp(qempty, lane);
                softmax_tile_c<NB, decltype(pos)::value>(s, m, l, alpha, p, sc, decltype(masked)::value, k0, row,
                                                         tq);
                reg_fence(s);
                reg_fence(l);
                reg_fence(alpha);
                wg::wait<0>();
                reg_fence(o);
                if (n > 0)
                    mbar_arrive_warp(vempty + 8 * vs, lane);
                scale_rows(o, alpha);
#pragma unroll
                for (int kk = 0; kk < BK / 32; kk++)
                    p_to_a(pa[kk], s, kk);
            };
            // POS (the max over raw scores, one fused multiply-add a
            // probability) needs a positive scale, known here only
            auto run = [&](auto pos) {
                int n = 0;
                for (; n < nfull; n++)
                    tile(n, std::false_type(), pos);
                for (; n < ntiles; n++)
                    tile(n, std::true_type(), pos);
            };
            if (sc > 0.0f)
                run(std::true_type());
            else
                run(std::false_type());
            if (ntiles > 0) {
                const int gk = g0 + ntiles - 1, vs = gk % VST;
                mbar_wait(vfull + 8 * vs, (gk / VST) & 1);
                reg_fence(o);
                reg_fence(pa);
                wg::fence();
#pragma unroll
                for (int kk = 0; kk < BK / 32; kk++)
                    wg::mma_rs_e4m3(o, pa[kk], sw128_at(((Vs + vs * TB) >> 4) + wg::kmajor_step<F8_DP>(kk)));
                wg::commit();
                wg::wait<0>();
                reg_fence(o);
                mbar_arrive_warp(vempty + 8 * vs, lane);
            }
            if (c == 0)
                named_sync(1);

            // FP8: v's descale on the output (before the merge, which takes O as given)
            const float vd = descale(p.vd, p.dph, w.hk);
#pragma unroll
            for (int nb = 0; nb < NO; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    o[nb][e] *= vd;
            store_rows(p, o, m, l, row, b, h, tq);
            g0 += ntiles;
            nq += ntiles > 0;
        }
    }
#else
    (void)p, (void)mp, (void)items, (void)counter;
#endif
}

} // namespace

bool fp8_fits(const state *s, const attn_params &p)
{
#ifdef CP_HAVE_SM90A
    const int64_t items = (p.Sq + F8_BQ - 1) / F8_BQ * p.H * p.B;
    return s->cc == 90 && p.dt == CP_DTYPE_FP8_E4M3 && !p.rects && p.vec && p.D <= F8_DP && p.Dv <= F8_DP &&
           p.Sq <= INT32_MAX - F8_BQ && fp8_skp(p) <= INT32_MAX && items + s->sm_count <= INT32_MAX &&
           fp8_smem() <= s->smem_optin;
#else
    (void)s, (void)p;
    return false; // no sm_90a machine code in this build
#endif
}

size_t fp8_workspace(const attn_params &p)
{
    return nf_forward_head_bytes(p) + round_up((size_t)p.B * (size_t)p.Hkv * F8_DP * (size_t)fp8_skp(p));
}

cp_status fp8_forward(state *s, const attn_params &p0, void *ws)
{
    attn_params p = p0;
    const int64_t skp = fp8_skp(p);
    char *w = static_cast<char *>(ws);
    int *flag = reinterpret_cast<int *>(w);
    uint32_t *bits = nf_forward_bits(flag);
    uint8_t *vt = reinterpret_cast<uint8_t *>(w + nf_forward_head_bytes(p));
    const int guard = s->knob.nf_guard != 0;

    // First what needs no launch: the tensor maps (where none describes q or
    // k, a stride the copy engine does not take, the SIMT kernels serve the
    // call) and the grid of the transpose.
    f8_maps mp;
    const tensor vtt = {vt, (int64_t)p.Hkv * F8_DP * skp, skp, (int64_t)F8_DP * skp};
    if (!wg::make_map(&mp.m[0], mp.pos[0], p.q, p.dt, p.Sq, p.H, p.B, p.D, F8_BQ) ||
        !wg::make_map(&mp.m[1], mp.pos[1], p.k, p.dt, p.Sk, p.Hkv, p.B, p.D, F8_BK) ||
        !wg::make_map(&mp.m[2], mp.pos[2], vtt, p.dt, F8_DP, p.Hkv, p.B, (int)skp, F8_DP)) {
        if (simt_fits(s, p, 0))
            return simt_forward(s, p);
        return fail(CP_ERROR_UNSUPPORTED,
                    "cp_kernel_attn_forward: FP8 q, k or v that no tensor map describes (strides of %" PRId64
                    ", %" PRId64 ", %" PRId64 " bytes between rows) and head dims %d, %d too large for the SIMT "
                    "kernels",
                    p.q.ss, p.k.ss, p.v.ss, p.D, p.Dv);
    }
    const int64_t vblocks = (int64_t)p.B * p.Hkv * (skp / VT_KEYS);
    if (vblocks > INT32_MAX)
        return fail(CP_ERROR_UNSUPPORTED,
                    "cp_kernel_attn_forward: FP8 with batch %d, num_kv_heads %d, seq_k %" PRId64
                    " (%" PRId64 " blocks of keys to transpose, more than one launch takes)",
                    p.B, p.Hkv, p.Sk, vblocks);
    constexpr int bytes = fp8_smem();
    cp_status r = allow_smem((const void *)fwd_fp8_kernel, bytes, "attention forward (FP8, wgmma)");
    if (r != CP_SUCCESS)
        return r;

    cudaError_t e = cudaMemsetAsync(w, 0, nf_forward_head_bytes(p), s->stream);
    if (e != cudaSuccess)
        return cuda_fail("cudaMemsetAsync (the FP8 forward)", e);
    if (vblocks > 0)
        fp8_vt<<<(unsigned)vblocks, VT_THREADS, 0, s->stream>>>(p, vt, skp, guard, flag, bits);
    if ((r = check_launch("the FP8 forward's transposed V")) != CP_SUCCESS)
        return r;
    const int64_t items = (p.Sq + F8_BQ - 1) / F8_BQ * p.H * p.B;
    if (items > 0) {
        const bool persist = items > s->sm_count;
        int *counter = persist ? take_sched(s) : nullptr;
        fwd_fp8_kernel<<<(unsigned)(persist ? s->sm_count : items), F8_THREADS, bytes, s->stream>>>(p, mp, (int)items,
                                                                                                  counter);
        if ((r = check_launch("attention forward (FP8, wgmma)")) != CP_SUCCESS)
            return r;
    }
    if (guard)
        p.nf_ws = ws;
    return nf_forward_end(s, p);
}

} // namespace cu
