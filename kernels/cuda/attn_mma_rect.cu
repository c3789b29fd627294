// SPDX-License-Identifier: MIT
// API 1.1 on tensor cores (mma.sync m16n8k16, F16 / BF16): block attention
// over a rectangle list with windows and softcaps, one launch per call.
//
// The kernels are the dense ones of attn_mma_fwd.cu / attn_mma_bwd.cu with
// the tile walk replaced: a block takes one tile of the call's tile index
// (attn_rect.cu: tiles in launch order, most visible pairs first) and walks
// the bands that meet it, and in each band only the tiles of the other side
// that the band reaches. Tiles a band covers entirely run unmasked; the
// others mask with the band's limits per row. Keys or queries outside every
// band of a tile are never loaded except where a tile of the other side
// straddles a band's edge.
//
//  - forward: a block of 4 warps owns 64 MT query rows; one online softmax
//    runs through every band of the tile (a row in several rectangles gets
//    their merged result); key tiles start at the band's first visible key,
//    not at a multiple of the tile, and rows past the band's keys load as
//    zeros.
//  - backward, dK / dV: a block owns 16 NW keys of one kv head and walks,
//    band by band and head by head of its GQA group, the query tiles that
//    see them (starting at the band's first query row that sees a key of
//    the tile); the atomic variant adds dQ += dS K as the dense one.
//  - backward, dQ (deterministic variant): a block owns 64 query rows and
//    walks the key tiles of their bands, like the forward.
//
// Softcap c: the base-2 score is c log2(e) tanh(s scale / c) (score2); its
// gradient brings the factor 1 - tanh^2, recomputed in the backward from the
// same tanh. dS is a select (0 outside the bands), so a non-finite dP of a
// pair no row sees does not reach dK or dQ.
#include "mma.cuh"

namespace cu {
namespace {

using namespace mma;

template <typename T, int DP, int MT>
__global__ void __launch_bounds__(128) fwd_rect_kernel(attn_params p)
{
    constexpr int BQ = 64 * MT, BK = fwd_bk(DP), PITCH = DP + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem), *Ks = Qs + BQ * PITCH, *Vs = Ks + BK * PITCH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const tile_head th = tile_head_at(p.rs.by_q, blockIdx.x);
    const int tile = th.tile, h = th.h, hk = h / p.G;
    const int64_t b = blockIdx.z;
    const int64_t i0 = (int64_t)tile * BQ, nq = p.Sq - i0 < BQ ? p.Sq - i0 : BQ;
    const int wrow = warp * 16 * MT;
    const int64_t row0 = i0 + wrow + g;
    const int be = p.rs.by_q.start[tile + 1];
    int bi = p.rs.by_q.start[tile];
    int64_t k0 = 0, khi = 0;

    load_tile<T, BQ, DP>(Qs, p.q, b, i0, p.Sq, h, p.D, p.vec);
    if (bi < be) {
        const band r = p.rs.bands[p.rs.by_q.ids[bi]];
        band_rows_keys(r, i0, nq, &k0, &khi);
        load_tile<T, BK, DP>(Ks, p.k, b, k0, r.k1, hk, p.D, p.vec);
    }
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

    while (bi < be) {
        const band r = p.rs.bands[p.rs.by_q.ids[bi]];
        cp_async_wait_all();
        __syncthreads(); // K tile is in; every warp is done with the previous V tile
        load_tile<T, BK, DP>(Vs, v_of(p), b, k0, r.k1, hk, p.Dv, p.vec);
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

        const bool full = band_covers(r, i0, BQ, k0, BK);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            int lo[2] = {0, 0}, hi[2] = {BK, BK};
            if (!full) {
                row_limits(r, row0 + mt * 16, k0, BK, &lo[0], &hi[0]);
                row_limits(r, row0 + mt * 16 + 8, k0, BK, &lo[1], &hi[1]);
            }
            float alpha[2];
            softmax_band(s[mt], m[mt], l[mt], alpha, p, full, lo, hi, tq);
            scale_rows(acc[mt], alpha);
        }

        int nbi = bi;
        int64_t nk0 = k0, nkhi = khi;
        next_key_tile<BK>(p, be, i0, nq, nbi, nk0, nkhi);
        cp_async_wait_all();
        __syncthreads(); // V tile is in; every warp is done with the K tile
        if (nbi < be) {
            load_tile<T, BK, DP>(Ks, p.k, b, nk0, p.rs.bands[p.rs.by_q.ids[nbi]].k1, hk, p.D, p.vec);
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
        bi = nbi;
        k0 = nk0;
        khi = nkhi;
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        store_rows(p, acc[mt], m[mt], l[mt], row0 + mt * 16, b, h, tq);
}

// The dK/dV blocks here have 4 warps (64 keys).
inline int dkdv_rect_smem(int DP, bool atomic)
{
    return dkdv_smem_nw(DP, 4, atomic);
}

template <typename T, int DP, bool ATOMIC>
__global__ void __launch_bounds__(128) dkdv_rect_kernel(attn_params p)
{
    constexpr int NW = 4, BK = 16 * NW, BQ = dkdv_bq(DP), DC = dkdv_dc(DP), NCH = DP / DC, PITCH = DP + 8;
    constexpr int WM = BQ / 16, WN = NW / WM, NC = DC / WN, SP = ds_pitch(DP);
    static_assert(WM * WN == NW && NC % 16 == 0, "dQ pieces cover the tile");
    extern __shared__ __align__(16) unsigned char smem[];
    T *Ks = reinterpret_cast<T *>(smem), *Vs = Ks + BK * PITCH, *Qs = Vs + BK * PITCH, *dOs = Qs + BQ * PITCH;
    float *lse2s = reinterpret_cast<float *>(dOs + BQ * PITCH), *drs = lse2s + BQ;
    T *dSs = reinterpret_cast<T *>(drs + BQ);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const tile_head th = tile_head_at(p.rs.by_k, blockIdx.x);
    const int tile = th.tile, hk = th.h;
    const int64_t k0 = (int64_t)tile * BK, nk = p.Sk - k0 < BK ? p.Sk - k0 : BK;
    const int64_t b = blockIdx.z / NCH;
    const int c0 = (int)(blockIdx.z % NCH) * DC;
    const int64_t jrow0 = k0 + warp * 16 + g;
    const int bs = p.rs.by_k.start[tile], be = p.rs.by_k.start[tile + 1];

    load_tile<T, BK, DP>(Ks, p.k, b, k0, p.Sk, hk, p.D, p.vec);
    load_tile<T, BK, DP>(Vs, p.v, b, k0, p.Sk, hk, p.Dv, p.vec);
    cp_async_commit();
    // keys outside every band: zeros (key_in_bands); with the non-finite
    // guard flagged, the others' non-finite values too
    cp_async_wait_all();
    __syncthreads();
    const bool nf = nf_on(p);
    for (int e = threadIdx.x; e < BK * (DP / 8); e += blockDim.x) {
        const int rr = e / (DP / 8), c = e % (DP / 8);
        uint4 *kc = reinterpret_cast<uint4 *>(Ks + rr * PITCH + c * 8);
        uint4 *vc = reinterpret_cast<uint4 *>(Vs + rr * PITCH + c * 8);
        if (!key_in_bands(p, bs, be, k0 + rr)) {
            *kc = make_uint4(0, 0, 0, 0);
            *vc = make_uint4(0, 0, 0, 0);
        } else if (nf) {
            *kc = finite8<T>(*kc);
            *vc = finite8<T>(*vc);
        }
    }

    float adk[DC / 8][4], adv[DC / 8][4];
#pragma unroll
    for (int nb = 0; nb < DC / 8; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            adk[nb][c] = adv[nb][c] = 0.0f;

    for (int bi = bs; bi < be; bi++) {
        const band r = p.rs.bands[p.rs.by_k.ids[bi]];
        int64_t qlo, qhi;
        band_keys_rows(r, k0, nk, &qlo, &qhi);
        for (int gq = 0; gq < p.G; gq++) {
            const int h = hk * p.G + gq;
            for (int64_t i0 = qlo; i0 < qhi; i0 += BQ) {
                __syncthreads(); // every warp is done with the previous query tile
                load_tile<T, BQ, DP>(Qs, p.q, b, i0, r.q1, h, p.D, p.vec);
                load_tile<T, BQ, DP>(dOs, p.dout, b, i0, r.q1, h, p.Dv, p.vec);
                cp_async_commit();
                for (int e = threadIdx.x; e < BQ; e += blockDim.x) {
                    const int64_t i = i0 + e;
                    lse2s[e] = i < r.q1 ? lse2_of(p.lse[b * p.lsb + h * p.lsh + i]) : INFINITY;
                    const float dr = i < r.q1 ? p.drow[b * p.drb + h * p.drh + i] : 0.0f;
                    drs[e] = nf ? finite_or_0(dr) : dr;
                }
                cp_async_wait_all();
                __syncthreads();
                if (nf) { // Q and dO (contiguous)
                    nf_clean<T>(Qs, 2 * BQ * PITCH / 8, threadIdx.x, blockDim.x);
                    __syncthreads();
                }

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
                // this thread's keys jrow0, jrow0 + 8 see query columns [lo, hi)
                int lo[2], hi[2];
                key_limits(r, jrow0, i0, BQ, &lo[0], &hi[0]);
                key_limits(r, jrow0 + 8, i0, BQ, &lo[1], &hi[1]);
#pragma unroll
                for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const int il = nb * 8 + 2 * tq + (c & 1);
                        const bool vis = il >= lo[c >> 1] && il < hi[c >> 1];
                        float t = 0.0f, x;
                        if (p.softcap) {
                            t = tanh_cap(st[nb][c] * p.cap_in);
                            x = p.cap_out * t;
                        } else {
                            x = st[nb][c] * p.c;
                        }
                        const float pv = vis ? exp2_fast(x - lse2s[il]) : 0.0f;
                        float ds = p.scale * pv * (dpt[nb][c] - drs[il]);
                        if (p.softcap)
                            ds *= 1.0f - t * t;
                        st[nb][c] = pv;
                        dpt[nb][c] = vis ? ds : 0.0f;
                    }
                if (ATOMIC) {
#pragma unroll
                    for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
                        for (int rr = 0; rr < 2; rr++)
                            *reinterpret_cast<uint32_t *>(dSs + (warp * 16 + g + rr * 8) * SP + nb * 8 + 2 * tq) =
                                pack2<T>(dpt[nb][2 * rr], dpt[nb][2 * rr + 1]);
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
                if (ATOMIC) {
                    __syncthreads(); // every warp's dS rows are in
                    add_dq<T, DP, BK, NC>(p, dSs, Ks, b, h, i0, warp % WM, c0 + (warp / WM) * NC, lane);
                }
            }
        }
    }
    if (p.grad_accumulate && bs == be)
        return; // no query sees these keys: nothing to add
    store_dkdv_rows<(DP <= 128)>(p, adk, adv, b, hk, jrow0, c0, tq);
}

template <typename T, int DP>
__global__ void __launch_bounds__(128) dq_rect_kernel(attn_params p)
{
    constexpr int BQ = DQ_BQ, BK = dq_bk(DP), PITCH = DP + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = reinterpret_cast<T *>(smem), *dOs = Qs + BQ * PITCH, *Ks = dOs + BQ * PITCH, *Vs = Ks + BK * PITCH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const tile_head th = tile_head_at(p.rs.by_q, blockIdx.x);
    const int tile = th.tile, h = th.h, hk = h / p.G;
    const int64_t b = blockIdx.z;
    const int64_t i0 = (int64_t)tile * BQ, nq = p.Sq - i0 < BQ ? p.Sq - i0 : BQ;
    const int64_t row0 = i0 + warp * 16 + g;
    const int be = p.rs.by_q.start[tile + 1];
    int bi = p.rs.by_q.start[tile];
    const bool any = bi < be;

    load_tile<T, BQ, DP>(Qs, p.q, b, i0, p.Sq, h, p.D, p.vec);
    load_tile<T, BQ, DP>(dOs, p.dout, b, i0, p.Sq, h, p.Dv, p.vec);
    cp_async_commit();
    float lse2[2], dr[2];
    const bool nf = nf_on(p); // the non-finite guard found a value to clean
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int64_t i = row0 + rr * 8;
        lse2[rr] = i < p.Sq ? lse2_of(p.lse[b * p.lsb + h * p.lsh + i]) : INFINITY;
        dr[rr] = i < p.Sq ? p.drow[b * p.drb + h * p.drh + i] : 0.0f;
        dr[rr] = nf ? finite_or_0(dr[rr]) : dr[rr];
    }
    float adq[DP / 8][4];
#pragma unroll
    for (int nb = 0; nb < DP / 8; nb++)
        adq[nb][0] = adq[nb][1] = adq[nb][2] = adq[nb][3] = 0.0f;

    int64_t k0 = 0, khi = 0;
    if (bi < be)
        band_rows_keys(p.rs.bands[p.rs.by_q.ids[bi]], i0, nq, &k0, &khi);
    if (nf) { // Q and dO (contiguous); the loop's first barrier publishes them
        cp_async_wait_all();
        __syncthreads();
        nf_clean<T>(Qs, 2 * BQ * PITCH / 8, threadIdx.x, blockDim.x);
    }
    while (bi < be) {
        const band r = p.rs.bands[p.rs.by_q.ids[bi]];
        __syncthreads(); // every warp is done with the previous key tile
        load_tile<T, BK, DP>(Ks, p.k, b, k0, r.k1, hk, p.D, p.vec);
        load_tile<T, BK, DP>(Vs, p.v, b, k0, r.k1, hk, p.Dv, p.vec);
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
        if (nf_on(p)) { // K and V (contiguous); the flag re-read: no register held across the loop
            nf_clean<T>(Ks, 2 * BK * PITCH / 8, threadIdx.x, blockDim.x);
            __syncthreads();
        }

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
        int lo[2], hi[2];
        row_limits(r, row0, k0, BK, &lo[0], &hi[0]);
        row_limits(r, row0 + 8, k0, BK, &lo[1], &hi[1]);
#pragma unroll
        for (int nb = 0; nb < BK / 8; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int col = nb * 8 + 2 * tq + (c & 1);
                const bool vis = col >= lo[c >> 1] && col < hi[c >> 1];
                float t = 0.0f, x;
                if (p.softcap) {
                    t = tanh_cap(s[nb][c] * p.cap_in);
                    x = p.cap_out * t;
                } else {
                    x = s[nb][c] * p.c;
                }
                const float pv = vis ? exp2_fast(x - lse2[c >> 1]) : 0.0f;
                float ds = p.scale * pv * (dp[nb][c] - dr[c >> 1]);
                if (p.softcap)
                    ds *= 1.0f - t * t;
                s[nb][c] = vis ? ds : 0.0f;
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
        next_key_tile<BK>(p, be, i0, nq, bi, k0, khi);
    }
    if (p.grad_accumulate && !any)
        return;
    void *dq = const_cast<void *>(p.dq.p);
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int64_t i = row0 + rr * 8;
        if (i >= p.Sq)
            continue;
        const int64_t o = at(p.dq, b, i, h);
#pragma unroll
        for (int nb = 0; nb < DP / 8; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = nb * 8 + 2 * tq + e;
                if (d < p.D)
                    store_grad(dq, p.gdt, o + d, adq[nb][2 * rr + e], p.grad_accumulate);
            }
    }
}

template <typename T, int DP>
cp_status launch_fwd_rect(state *s, const attn_params &p0)
{
    constexpr int MT = fwd_mt(DP), BQ = 64 * MT;
    attn_params p = p0;
    void *buf;
    cp_status r = rect_upload(s, &p, BQ, DKDV_BK, &buf);
    if (r != CP_SUCCESS)
        return r;
    const int bytes = fwd_smem(DP, MT);
    auto kernel = fwd_rect_kernel<T, DP, MT>;
    r = nf_forward_begin(s, &p); // the guard, after the list is up
    if (r == CP_SUCCESS)
        r = allow_smem((const void *)kernel, bytes, "attention forward (mma, rectangles)");
    if (r == CP_SUCCESS) {
        dim3 grid((unsigned)((int64_t)p.rs.by_q.ntiles * p.H), 1, (unsigned)p.B);
        kernel<<<grid, 128, bytes, s->stream>>>(p);
        r = check_launch("attention forward (mma, rectangles)");
    }
    if (r == CP_SUCCESS)
        r = nf_forward_end(s, p); // the guard's patch reads the list too
    return rect_release(s, buf, r);
}

template <typename T, int DP, bool ATOMIC>
cp_status launch_dkdv_rect(state *s, const attn_params &p)
{
    auto k1 = dkdv_rect_kernel<T, DP, ATOMIC>;
    const int b1 = dkdv_rect_smem(DP, ATOMIC);
    const char *what = ATOMIC ? "attention backward dK/dV/dQ (mma, rectangles, atomic)"
                              : "attention backward dK/dV (mma, rectangles)";
    cp_status r = allow_smem((const void *)k1, b1, what);
    if (r != CP_SUCCESS)
        return r;
    dim3 g1((unsigned)((int64_t)p.rs.by_k.ntiles * p.Hkv), 1, (unsigned)(p.B * (DP / dkdv_dc(DP))));
    k1<<<g1, 128, b1, s->stream>>>(p);
    return check_launch(what);
}

template <typename T, int DP>
cp_status launch_bwd_rect(state *s, const attn_params &p0, void *ws)
{
    attn_params p = p0;
    const bool atomic = !s->deterministic && dkdv_rect_smem(DP, true) <= s->smem_optin;
    // on Hopper the atomic variant runs the wgmma kernel (key tiles of 128)
    const bool wg = atomic && s->knob.path != PATH_MMA && wgmma_bwd_fits(s, p) &&
                    (p.Sk + 127) / 128 * p.Hkv <= 0x7fffffff;
    void *buf;
    cp_status r = rect_upload(s, &p, DQ_BQ, wg ? 128 : DKDV_BK, &buf);
    if (r != CP_SUCCESS)
        return r;
    r = nf_backward_begin(s, &p); // the guard, after the list is up
    if (r != CP_SUCCESS)
        return rect_release(s, buf, r);
    if (atomic) {
        float *sums;
        r = mma_dq_sums_begin(s, &p, ws, &sums);
        if (r == CP_SUCCESS)
            r = wg ? wgmma_backward_atomic(s, p) : launch_dkdv_rect<T, DP, true>(s, p);
        if (r == CP_SUCCESS)
            r = mma_dq_sums_end(s, p, sums);
        if (r == CP_SUCCESS)
            r = nf_backward_end(s, p); // dq converted, the list still up
        return rect_release(s, buf, r);
    }
    r = launch_dkdv_rect<T, DP, false>(s, p);
    if (r == CP_SUCCESS) {
        auto k2 = dq_rect_kernel<T, DP>;
        const int b2 = dq_smem(DP);
        r = allow_smem((const void *)k2, b2, "attention backward dQ (mma, rectangles)");
        if (r == CP_SUCCESS) {
            dim3 g2((unsigned)((int64_t)p.rs.by_q.ntiles * p.H), 1, (unsigned)p.B);
            k2<<<g2, 128, b2, s->stream>>>(p);
            r = check_launch("attention backward dQ (mma, rectangles)");
        }
    }
    if (r == CP_SUCCESS)
        r = nf_backward_end(s, p);
    return rect_release(s, buf, r);
}

} // namespace

bool mma_rect_fits(const state *s, const attn_params &p, int backward)
{
    if (p.dt != CP_DTYPE_F16 && p.dt != CP_DTYPE_BF16)
        return false;
    const int DP = padded_dim(p.D, p.Dv);
    if (!DP || p.B > 65535)
        return false;
    // grid.x = tiles x heads
    const int64_t tq = (p.Sq + 63) / 64 * p.H, tk = (p.Sk + DKDV_BK - 1) / DKDV_BK * p.Hkv;
    if (tq > 0x7fffffff || tk > 0x7fffffff)
        return false;
    if (!backward)
        return fwd_smem(DP, fwd_mt(DP)) <= s->smem_optin;
    return p.odt == p.dt && p.B * (DP / dkdv_dc(DP)) <= 65535 && dkdv_rect_smem(DP, false) <= s->smem_optin &&
           dq_smem(DP) <= s->smem_optin;
}

cp_status mma_rect_forward(state *s, const attn_params &p)
{
    const bool bf = p.dt == CP_DTYPE_BF16;
    switch (padded_dim(p.D, p.Dv)) {
    case 64: return bf ? launch_fwd_rect<__nv_bfloat16, 64>(s, p) : launch_fwd_rect<__half, 64>(s, p);
    case 128: return bf ? launch_fwd_rect<__nv_bfloat16, 128>(s, p) : launch_fwd_rect<__half, 128>(s, p);
    default: return bf ? launch_fwd_rect<__nv_bfloat16, 256>(s, p) : launch_fwd_rect<__half, 256>(s, p);
    }
}

cp_status mma_rect_backward(state *s, const attn_params &p, void *ws)
{
    const bool bf = p.dt == CP_DTYPE_BF16;
    switch (padded_dim(p.D, p.Dv)) {
    case 64: return bf ? launch_bwd_rect<__nv_bfloat16, 64>(s, p, ws) : launch_bwd_rect<__half, 64>(s, p, ws);
    case 128: return bf ? launch_bwd_rect<__nv_bfloat16, 128>(s, p, ws) : launch_bwd_rect<__half, 128>(s, p, ws);
    default: return bf ? launch_bwd_rect<__nv_bfloat16, 256>(s, p, ws) : launch_bwd_rect<__half, 256>(s, p, ws);
    }
}

size_t mma_rect_bwd_workspace(const state *s, const attn_params &p)
{
    const int DP = padded_dim(p.D, p.Dv);
    const bool atomic = !s->deterministic && DP && dkdv_rect_smem(DP, true) <= s->smem_optin;
    if (!atomic || p.gdt == CP_DTYPE_F32)
        return 0;
    return (size_t)p.B * (size_t)p.Sq * (size_t)p.H * (size_t)((p.D + 3) / 4 * 4) * sizeof(float); // as mma_dq_sums_begin
}

} // namespace cu
