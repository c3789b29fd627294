// SPDX-License-Identifier: MIT
// Fused block attention backward on tensor cores (F16 / BF16), in two
// variants:
//  - deterministic (cp_context_config.deterministic = 1): no atomics, every
//    gradient element is owned by one thread; a dK/dV kernel and a dQ kernel
//    that recomputes S and dP;
//  - atomic (the default): the dK/dV kernel alone, which also multiplies the
//    dS tile it has by its K tile and adds dQ += dS K into fp32 sums with
//    vector reductions (red.global.add.v4.f32 on sm_90). The order of those
//    additions varies, so dq's last bits vary from run to run. On Hopper
//    its kernel is the wgmma one of attn_wgmma_bwd.cu where that fits (the
//    set-up and the conversion of the dQ sums here stay the same).
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

template <typename T, int DP, bool ATOMIC, int NW>
__global__ void __launch_bounds__(32 * NW) dkdv_mma_kernel(attn_params p)
{
    constexpr int BK = 16 * NW, BQ = dkdv_bq(DP), DC = dkdv_dc(DP), NCH = DP / DC, PITCH = DP + 8;
    // atomic dQ: warp w takes query rows 16 (w % WM) and columns NC (w / WM)
    // of its chunk (16 x 64 pieces with 4 warps, 16 x 32 with 8)
    constexpr int WM = BQ / 16, WN = NW / WM, NC = DC / WN, SP = ds_pitch(DP);
    static_assert(WM * WN == NW && NC % 16 == 0, "dQ pieces cover the tile");
    extern __shared__ __align__(16) unsigned char smem[];
    T *Ks = reinterpret_cast<T *>(smem), *Vs = Ks + BK * PITCH, *Qs = Vs + BK * PITCH, *dOs = Qs + BQ * PITCH;
    float *lse2s = reinterpret_cast<float *>(dOs + BQ * PITCH), *drs = lse2s + BQ;
    T *dSs = reinterpret_cast<T *>(drs + BQ); // atomic variant only
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
    const bool nf = nf_on(p); // the non-finite guard found a value to clean
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
                const float dr = i < p.Sq ? p.drow[b * p.drb + h * p.drh + i] : 0.0f;
                drs[e] = nf ? finite_or_0(dr) : dr;
            }
            cp_async_wait_all();
            __syncthreads();
            if (nf) { // Q and dO (contiguous), and K and V with the first tile
                nf_clean<T>(Qs, 2 * BQ * PITCH / 8, threadIdx.x, blockDim.x);
                if (gq == 0 && i0 == i_first)
                    nf_clean<T>(Ks, 2 * BK * PITCH / 8, threadIdx.x, blockDim.x);
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
            if (ATOMIC) {
#pragma unroll
                for (int nb = 0; nb < BQ / 8; nb++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        *reinterpret_cast<uint32_t *>(dSs + (warp * 16 + g + r * 8) * SP + nb * 8 + 2 * tq) =
                            pack2<T>(dpt[nb][2 * r], dpt[nb][2 * r + 1]);
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
    if (p.grad_accumulate && i_first >= p.Sq)
        return; // no query sees these keys: nothing to add
    store_dkdv_rows<(DP <= 128)>(p, adk, adv, b, hk, jrow0, c0, tq); // D = 256: no registers for batching
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
    const bool nf = nf_on(p); // the non-finite guard found a value to clean
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = row0 + r * 8;
        lse2[r] = i < p.Sq ? lse2_of(p.lse[b * p.lsb + h * p.lsh + i]) : INFINITY;
        dr[r] = i < p.Sq ? p.drow[b * p.drb + h * p.drh + i] : 0.0f;
        dr[r] = nf ? finite_or_0(dr[r]) : dr[r];
    }
    if (nf) { // Q and dO (contiguous); the loop's first barrier publishes them
        cp_async_wait_all();
        __syncthreads();
        nf_clean<T>(Qs, 2 * BQ * PITCH / 8, threadIdx.x, blockDim.x);
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

// dq (grad dtype, strided) = sums (fp32, p.dqa), or += with grad_accumulate;
// with sums = NULL, dq = 0 (the F32 case, before atomics add into dq itself).
__global__ void dq_finish_kernel(attn_params p, const float *sums)
{
    const int64_t rows = (int64_t)p.B * p.Sq * p.H;
    void *dq = const_cast<void *>(p.dq.p);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int h = (int)(r % p.H);
        const int64_t i = r / p.H % p.Sq, b = r / p.H / p.Sq;
        const int64_t o = at(p.dq, b, i, h);
        const float *src = sums ? sums + at(p.dqa, b, i, h) : nullptr;
        for (int d = threadIdx.x; d < p.D; d += blockDim.x) {
            const float v = src ? src[d] : 0.0f;
            st_f(dq, p.gdt, o + d, p.grad_accumulate && src ? ld_f(dq, p.gdt, o + d) + v : v);
        }
    }
}

// The same for a 16-bit dq and sums whose rows allow 16-byte accesses: TPR
// threads a row (TPR * 8 >= D where it can), eight values a thread at a
// time. The kernel above (a block a row, one element a thread through
// st_f's dtype switch) moved 384 MiB in 349 us on the H100 (32k tokens,
// 16 heads, D = 128), a third of the memory's speed.
template <typename T, int TPR>
__global__ void dq_finish16_kernel(attn_params p, const float *sums)
{
    const int64_t rows = (int64_t)p.B * p.Sq * p.H, step = (int64_t)gridDim.x * blockDim.x / TPR;
    T *dq = static_cast<T *>(const_cast<void *>(p.dq.p));
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / TPR; r < rows; r += step) {
        const int h = (int)(r % p.H);
        const int64_t i = r / p.H % p.Sq, b = r / p.H / p.Sq;
        T *o = dq + at(p.dq, b, i, h);
        const float *src = sums + at(p.dqa, b, i, h);
        for (int d = (int)(threadIdx.x % TPR) * 8; d < p.D; d += TPR * 8) {
            const float4 x0 = *reinterpret_cast<const float4 *>(src + d),
                         x1 = *reinterpret_cast<const float4 *>(src + d + 4);
            float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            uint4 y;
            T *ys = reinterpret_cast<T *>(&y);
            if (p.grad_accumulate) {
                y = *reinterpret_cast<const uint4 *>(o + d);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    v[e] += get_f(ys[e]);
            }
#pragma unroll
            for (int e = 0; e < 8; e++)
                put_f(ys[e], v[e]);
            *reinterpret_cast<uint4 *>(o + d) = y;
        }
    }
}

template <typename T>
void launch_finish16(state *s, const attn_params &p, const float *sums, int64_t rows)
{
    const int tpr = threads_per_row(p.D / 8);
    auto kernel = tpr == 32 ? dq_finish16_kernel<T, 32>
                  : tpr == 16 ? dq_finish16_kernel<T, 16>
                  : tpr == 8  ? dq_finish16_kernel<T, 8>
                              : dq_finish16_kernel<T, 4>;
    const int64_t want = (rows * tpr + 255) / 256;
    kernel<<<(unsigned)(want < 65536 ? want : 65536), 256, 0, s->stream>>>(p, sums);
}

int finish_threads(int D)
{
    return D <= 64 ? 64 : 128;
}

cp_status launch_finish(state *s, const attn_params &p, const float *sums)
{
    const int64_t rows = (int64_t)p.B * p.Sq * p.H;
    if (sums && p.D % 8 == 0 && rows_16b(p.dq, 8) && p.dqa_vec &&
        (p.gdt == CP_DTYPE_BF16 || p.gdt == CP_DTYPE_F16)) {
        if (p.gdt == CP_DTYPE_BF16)
            launch_finish16<__nv_bfloat16>(s, p, sums, rows);
        else
            launch_finish16<__half>(s, p, sums, rows);
        return check_launch("attention backward dQ finish (mma)");
    }
    const int64_t blocks = rows < 65536 ? rows : 65536;
    dq_finish_kernel<<<(unsigned)blocks, finish_threads(p.D), 0, s->stream>>>(p, sums);
    return check_launch("attention backward dQ finish (mma)");
}

bool dqa_aligned(const tensor &t)
{
    return rows_16b(t, 4);
}

// Columns of the fp32 dQ sums in the workspace: D rounded up to 4, so that
// every row takes 16-byte reductions.
int64_t sums_cols(const attn_params &p)
{
    return (p.D + 3) / 4 * 4;
}

// Warps of the atomic dK/dV blocks (0 = deterministic variant).
int atomic_warps(const state *s, const attn_params &p)
{
    if (s->deterministic)
        return 0;
    const int DP = padded_dim(p.D, p.Dv);
    if (s->knob.bwd_warps == 8 && DP <= 128 && dkdv_smem_nw(DP, 8, true) <= s->smem_optin)
        return 8;
    return dkdv_smem_nw(DP, 4, true) <= s->smem_optin ? 4 : 0;
}

bool use_atomic(const state *s, const attn_params &p)
{
    return atomic_warps(s, p) != 0;
}

template <typename T, int DP, bool ATOMIC, int NW>
cp_status launch_dkdv(state *s, const attn_params &p)
{
    auto k1 = dkdv_mma_kernel<T, DP, ATOMIC, NW>;
    const int b1 = dkdv_smem_nw(DP, NW, ATOMIC);
    const char *what = ATOMIC ? "attention backward dK/dV/dQ (mma, atomic)" : "attention backward dK/dV (mma)";
    cp_status r = allow_smem((const void *)k1, b1, what);
    if (r != CP_SUCCESS)
        return r;
    dim3 g1((unsigned)((p.Sk + 16 * NW - 1) / (16 * NW)), (unsigned)p.Hkv, (unsigned)(p.B * (DP / dkdv_dc(DP))));
    k1<<<g1, 32 * NW, b1, s->stream>>>(p);
    return check_launch(what);
}

template <typename T, int DP>
cp_status launch_bwd(state *s, const attn_params &p0, void *ws, bool wgmma)
{
    cp_status r;
    if (use_atomic(s, p0)) {
        attn_params p = p0;
        float *sums;
        if ((r = mma_dq_sums_begin(s, &p, ws, &sums)) != CP_SUCCESS)
            return r;
        if (wgmma)
            r = wgmma_backward_atomic(s, p);
        else
            r = atomic_warps(s, p) == 8 && DP <= 128 ? launch_dkdv<T, DP, true, DP <= 128 ? 8 : 4>(s, p)
                                                 : launch_dkdv<T, DP, true, 4>(s, p);
        if (r != CP_SUCCESS)
            return r;
        return mma_dq_sums_end(s, p, sums);
    }
    if ((r = launch_dkdv<T, DP, false, 4>(s, p0)) != CP_SUCCESS)
        return r;
    auto k2 = dq_mma_kernel<T, DP>;
    const int b2 = dq_smem(DP);
    if ((r = allow_smem((const void *)k2, b2, "attention backward dQ (mma)")) != CP_SUCCESS)
        return r;
    dim3 g2((unsigned)((p0.Sq + DQ_BQ - 1) / DQ_BQ), (unsigned)p0.H, (unsigned)p0.B);
    k2<<<g2, 128, b2, s->stream>>>(p0);
    return check_launch("attention backward dQ (mma)");
}

template <typename T>
cp_status backward_t(state *s, const attn_params &p, void *ws, bool wgmma)
{
    switch (padded_dim(p.D, p.Dv)) {
    case 64: return launch_bwd<T, 64>(s, p, ws, wgmma);
    case 128: return launch_bwd<T, 128>(s, p, ws, wgmma);
    default: return launch_bwd<T, 256>(s, p, ws, wgmma);
    }
}

} // namespace

cp_status mma_dq_sums_begin(state *s, attn_params *p, void *ws, float **sums)
{
    *sums = nullptr;
    if (p->gdt == CP_DTYPE_F32) {
        // add into dq itself; cleared first unless accumulating
        p->dqa = p->dq;
        p->dqa_cols = p->D;
        p->dqa_vec = p->D % 4 == 0 && dqa_aligned(p->dq);
        return p->grad_accumulate ? CP_SUCCESS : launch_finish(s, *p, nullptr);
    }
    const int64_t cols = sums_cols(*p);
    *sums = static_cast<float *>(ws);
    p->dqa = tensor{*sums, p->Sq * p->H * cols, p->H * cols, cols};
    p->dqa_cols = (int)cols;
    p->dqa_vec = dqa_aligned(p->dqa);
    cudaError_t e = cudaMemsetAsync(*sums, 0, (size_t)p->B * (size_t)p->Sq * (size_t)p->H * (size_t)cols * sizeof(float),
                                    s->stream);
    return e == cudaSuccess ? CP_SUCCESS : cuda_fail("cudaMemsetAsync", e);
}

cp_status mma_dq_sums_end(state *s, const attn_params &p, const float *sums)
{
    return sums ? launch_finish(s, p, sums) : CP_SUCCESS;
}

size_t mma_bwd_workspace(const state *s, const attn_params &p)
{
    if (!use_atomic(s, p) || p.gdt == CP_DTYPE_F32)
        return 0;
    return (size_t)p.B * (size_t)p.Sq * (size_t)p.H * (size_t)sums_cols(p) * sizeof(float);
}

cp_status mma_backward(state *s, const attn_params &p, void *ws, bool wgmma)
{
    return p.dt == CP_DTYPE_BF16 ? backward_t<__nv_bfloat16>(s, p, ws, wgmma)
                                 : backward_t<__half>(s, p, ws, wgmma);
}

} // namespace cu
