// SPDX-License-Identifier: MIT
// Tensor-core building blocks of the fused F16 / BF16 attention kernels:
// mma.sync m16n8k16 with fp32 accumulators, ldmatrix fragment loads, cp.async
// tile loads, and the tile shapes both attention files agree on.
//
// Fragment layout of m16n8k16 (g = lane / 4, t = lane % 4): the accumulator
// c[0..3] holds (row g, cols 2t, 2t+1) and (row g+8, cols 2t, 2t+1); A holds
// a[0] (g, 2t..), a[1] (g+8, 2t..), a[2] (g, 2t+8..), a[3] (g+8, 2t+8..); B
// holds b[0] (k 2t.., col g) and b[1] (k 2t+8.., col g). Two accumulators of
// adjacent 8-column blocks therefore form the A operand of the next product
// directly (the probabilities never leave registers).
//
// Shared-memory tiles are row-major with a pitch of DP + 8 elements: rows
// start 16 bytes apart modulo 128, so the 8 row addresses of every ldmatrix
// hit distinct banks.
#ifndef INFINICP_KERNELS_CUDA_MMA_CUH
#define INFINICP_KERNELS_CUDA_MMA_CUH

#include "common.cuh"

namespace cu {
namespace mma {

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

// Four 8x8 matrices; lanes 8m..8m+7 give the row addresses of matrix m.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// 2^x with the hardware approximation (rel. error ~2^-22, far below the
// 16-bit rounding the probabilities get next); 2^-inf = 0.
__device__ __forceinline__ float exp2_fast(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Rows [r0, r0 + R) of head h of t, columns [0, dim), into an R x DP tile;
// everything outside is zero. With vec, 16-byte cp.async copies (commit and
// wait are the caller's); otherwise element by element.
template <typename T, int R, int DP>
__device__ __forceinline__ void load_tile(T *dst, const tensor &t, int64_t b, int64_t r0, int64_t n, int h,
                                          int dim, int vec)
{
    constexpr int PITCH = DP + 8, CH = DP / 8;
    const T *src = static_cast<const T *>(t.p);
    if (vec) {
        for (int e = threadIdx.x; e < R * CH; e += blockDim.x) {
            const int r = e / CH, c = e % CH;
            T *d = dst + r * PITCH + c * 8;
            const int64_t row = r0 + r;
            if (row < n && c * 8 < dim)
                cp_async16(d, src + at(t, b, row, h) + c * 8);
            else
                *reinterpret_cast<uint4 *>(d) = make_uint4(0, 0, 0, 0);
        }
    } else {
        for (int e = threadIdx.x; e < R * DP; e += blockDim.x) {
            const int r = e / DP, c = e % DP;
            const int64_t row = r0 + r;
            dst[r * PITCH + c] = row < n && c < dim ? src[at(t, b, row, h) + c] : T(0.0f);
        }
    }
}

// A operand (16 rows from row0 of the tile, k columns [k0, k0 + 16)).
template <int PITCH, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T *tile, int row0, int k0, int lane)
{
    ldsm_x4(a, tile + (row0 + (lane & 15)) * PITCH + k0 + (lane >> 4) * 8);
}

// B operands of two 8-column blocks [n0, n0 + 16) for k [k0, k0 + 16), from a
// tile stored [n][k] (k contiguous): b[0], b[1] for n0, b[2], b[3] for n0 + 8.
template <int PITCH, typename T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T *tile, int n0, int k0, int lane)
{
    ldsm_x4(b, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * PITCH + k0 + ((lane >> 3) & 1) * 8);
}

// The same from a tile stored [k][n] (n contiguous), through the transposing load.
template <int PITCH, typename T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T *tile, int n0, int k0, int lane)
{
    ldsm_x4_t(b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * PITCH + n0 + (lane >> 4) * 8);
}

// Accumulators s[2k], s[2k+1] (a 16 x 16 block in C layout) as an A operand.
template <typename T>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4])
{
    a[0] = pack2<T>(lo[0], lo[1]);
    a[1] = pack2<T>(lo[2], lo[3]);
    a[2] = pack2<T>(hi[0], hi[1]);
    a[3] = pack2<T>(hi[2], hi[3]);
}

// The work of one block of a forward kernel (grid: query row blocks, heads,
// batches): BQ query rows from i0 - blocks in reverse order, so that under a
// causal mask the ones with the most keys start first - of head h (kv head
// hk) in batch b, and the ntiles key tiles of BK that cover every key they see.
struct fwd_block {
    int64_t i0, b;
    int h, hk, ntiles;
};

// Row block x (of nx), head h, batch b.
template <int BQ, int BK>
__device__ __forceinline__ fwd_block fwd_block_at(const attn_params &p, int64_t x, int64_t nx, int h, int64_t b)
{
    fwd_block w;
    w.i0 = (nx - 1 - x) * BQ;
    w.h = h;
    w.hk = w.h / p.G;
    w.b = b;
    const int64_t nq = p.Sq - w.i0 < BQ ? p.Sq - w.i0 : BQ;
    w.ntiles = (int)((visible_keys(p, w.i0 + nq - 1) + BK - 1) / BK);
    return w;
}

template <int BQ, int BK>
__device__ __forceinline__ fwd_block fwd_block_of(const attn_params &p)
{
    return fwd_block_at<BQ, BK>(p, blockIdx.x, gridDim.x, blockIdx.y, blockIdx.z);
}

// Work item w of a persistent kernel (items in the order fwd_block_of's grid
// would start them: row blocks fastest, then heads, then batches; fewer
// than 2^31 of them).
template <int BQ, int BK>
__device__ __forceinline__ fwd_block fwd_item(const attn_params &p, int w)
{
    const int nx = (int)((p.Sq + BQ - 1) / BQ), hb = w / nx;
    return fwd_block_at<BQ, BK>(p, w - hb * nx, nx, hb % p.H, hb / p.H);
}

// Keys [k0, k0 + lim) of a tile of bk keys that query row i sees.
__device__ __forceinline__ int key_limit(const attn_params &p, int64_t k0, int64_t i, int bk)
{
    const int64_t e = visible_keys(p, i) - k0;
    return e < 0 ? 0 : e > bk ? bk : (int)e;
}

// One online-softmax step of a 16-row tile in C layout (this thread: rows
// row and row + 8, columns k0 + 8 nb + 2 tq + e): scores to base 2, masked
// where `masked` says the tile reaches past the block or across the
// diagonal, then to probabilities relative to the new running maximum m (each
// in (0, 1]); l is rescaled and gets this tile's (per-thread) sums. alpha is
// what the output accumulators must be multiplied by (scale_rows). The mask
// is applied with selects only (no branch when `masked` is a constant: the
// wgmma kernel needs straight-line code here to overlap it with a product).
// POS (only where p.c > 0): the maximum is taken over the raw scores and
// scaled once, and each probability is 2^(s c - m) with one fused
// multiply-add, instead of scaling every score first.
// softmax_tile_c takes the scale sc in place of p.c (the FP8 kernel folds
// its descales into it).
template <int NB, bool POS = false>
__device__ __forceinline__ void softmax_tile_c(float (&s)[NB][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                               const attn_params &p, float sc, bool masked, int64_t k0, int64_t row,
                                               int tq)
{
    int lim[2] = {8 * NB, 8 * NB};
    if (masked)
        lim[0] = key_limit(p, k0, row, 8 * NB), lim[1] = key_limit(p, k0, row + 8, 8 * NB);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            float x = POS ? s[nb][c] : s[nb][c] * sc;
            if (masked)
                x = nb * 8 + 2 * tq + (c & 1) < lim[c >> 1] ? x : -INFINITY;
            s[nb][c] = x;
            mx[c >> 1] = fmaxf(mx[c >> 1], x);
        }
    float mu[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float mnew = fmaxf(m[r], POS ? quad_max(mx[r]) * sc : quad_max(mx[r]));
        mu[r] = mnew == -INFINITY ? 0.0f : mnew; // no key seen yet: 2^(-inf - 0) = 0
        alpha[r] = exp2_fast(m[r] - mu[r]);
        m[r] = mnew;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            s[nb][c] = exp2_fast(POS ? fmaf(s[nb][c], sc, -mu[c >> 1]) : s[nb][c] - mu[c >> 1]);
            l[c >> 1] += s[nb][c];
        }
}

template <int NB, bool POS = false>
__device__ __forceinline__ void softmax_tile(float (&s)[NB][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             const attn_params &p, bool masked, int64_t k0, int64_t row, int tq)
{
    softmax_tile_c<NB, POS>(s, m, l, alpha, p, p.c, masked, k0, row, tq);
}

template <int NB>
__device__ __forceinline__ void scale_rows(float (&acc)[NB][4], const float (&alpha)[2])
{
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            acc[nb][c] *= alpha[c >> 1];
}

// Row r's pairs of a thread's C fragments (columns 8 nb + 2 tq, + 1) times
// inv, at q[4 nb] (q: the row's pair at column 2 tq); cols: Dv - 2 tq.
__device__ __forceinline__ void put_pair(__nv_bfloat162 *q, float a, float b) { *q = __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ void put_pair(__half2 *q, float a, float b) { *q = __floats2half2_rn(a, b); }

template <int NB, typename V>
__device__ __forceinline__ void store_pairs(V *q, const float (&acc)[NB][4], int r, float inv, int cols)
{
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
        if (nb * 8 < cols)
            put_pair(q + 4 * nb, acc[nb][2 * r] * inv, acc[nb][2 * r + 1] * inv);
}

// The forward epilogue of a 16-row tile in C layout (rows row, row + 8 of
// batch b, head h): normalise by the row sums and write o and the LSE, or
// merge them into the running (o, lse). Every lane of the warp calls it.
//
// Merging into an F32 running output (every CP block after a row's first)
// loads a chunk of (up to) 32 old values before it stores any: written load,
// store, load, ... the loads cannot pass the stores before them, and each
// CTA would wait out one memory latency per element (measured: +20-35 % on
// the short blocks of a CP ring step). The first chunk's loads go out before
// the merge weights are computed; they depend on nothing but the running
// LSE being finite (an empty running row, LSE -inf, may hold anything and
// is not read).
template <int NB>
__device__ __forceinline__ void store_rows(const attn_params &p, const float (&acc)[NB][4], const float (&m)[2],
                                           const float (&l)[2], int64_t row, int64_t b, int h, int tq)
{
    float old_hi[2], old_lo[2]; // the running LSE (value and residual)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = row + r * 8;
        const bool rd = p.accumulate && i < p.Sq;
        old_hi[r] = rd ? p.lse[b * p.lsb + h * p.lsh + i] : 0.0f;
        old_lo[r] = rd ? lse_lo_at(p, b * p.lsb + h * p.lsh + i) : 0.0f;
    }
    __syncwarp(); // the quad has read the running LSE before lane tq = 0 writes it
    void *op = const_cast<void *>(p.o.p);
    float w1[2], w2[2], inv[2];
    int64_t ob[2];
    bool live[2], rd[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = row + r * 8;
        live[r] = i < p.Sq;
        rd[r] = live[r] && p.accumulate && old_hi[r] != -INFINITY;
        ob[r] = live[r] ? at(p.o, b, i, h) : 0;
    }
    // the merge weights; a row this block saw no key of keeps its running values
    auto weights = [&]() {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t i = row + r * 8;
            const float lt = quad_sum(l[r]);
            w1[r] = 0.0f, w2[r] = 1.0f, inv[r] = 0.0f;
            if (!live[r])
                continue;
            // lt is NaN after a NaN score (or inf - inf): not a row without keys
            const double lse_blk = lt != 0.0f ? ((double)m[r] + log2((double)lt)) * LN2 : -INFINITY;
            inv[r] = lt != 0.0f ? 1.0f / lt : 0.0f;
            double merged = lse_blk;
            if (p.accumulate && !merge_weights(old_hi[r], old_lo[r], lse_blk, &w1[r], &w2[r], &merged)) {
                live[r] = false;
                continue;
            }
            if (tq == 0)
                store_lse(p, b * p.lsb + h * p.lsh + i, merged);
        }
    };
    if (p.odt != CP_DTYPE_F32) {
        weights();
        // a thread's columns d, d + 1 (d even) as one 4-byte store where the
        // rows allow it: half the store instructions, no dtype switch each
        const bool pair = (p.odt == CP_DTYPE_BF16 || p.odt == CP_DTYPE_F16) && p.Dv % 2 == 0 &&
                          (uintptr_t)op % 4 == 0 && (p.o.sb | p.o.ss | p.o.sh) % 2 == 0;
        if (pair) {
            const bool bf = p.odt == CP_DTYPE_BF16;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                if (!live[r])
                    continue;
                if (!p.accumulate) { // w1 = 0, w2 = 1: one pointer a row, stores at fixed offsets
                    if (bf)
                        store_pairs(reinterpret_cast<__nv_bfloat162 *>(static_cast<__nv_bfloat16 *>(op) + ob[r]) + tq,
                                    acc, r, inv[r], p.Dv - 2 * tq);
                    else
                        store_pairs(reinterpret_cast<__half2 *>(static_cast<__half *>(op) + ob[r]) + tq, acc, r,
                                    inv[r], p.Dv - 2 * tq);
                    continue;
                }
#pragma unroll
                for (int nb = 0; nb < NB; nb++) {
                    const int d = nb * 8 + 2 * tq;
                    if (d < p.Dv)
                        store_merged2(op, bf, ob[r] + d, acc[nb][2 * r] * inv[r], acc[nb][2 * r + 1] * inv[r], w1[r],
                                      w2[r]);
                }
            }
            return;
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (!live[r])
                continue;
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int d = nb * 8 + 2 * tq + e;
                    if (d < p.Dv)
                        store_merged(op, p.odt, ob[r] + d, acc[nb][2 * r + e] * inv[r], w1[r], w2[r]);
                }
        }
        return;
    }
    float *of = static_cast<float *>(op);
    constexpr int C = NB < 8 ? NB : 8; // 4 C old values in flight
    static_assert(NB % C == 0, "whole chunks");
    float prev[C][4];
    auto load_chunk = [&](int nb0) {
#pragma unroll
        for (int nb = 0; nb < C; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int r = c >> 1, d = (nb0 + nb) * 8 + 2 * tq + (c & 1);
                prev[nb][c] = rd[r] && d < p.Dv ? of[ob[r] + d] : 0.0f;
            }
    };
    load_chunk(0);
    weights();
#pragma unroll
    for (int nb0 = 0; nb0 < NB; nb0 += C) {
        if (nb0 > 0)
            load_chunk(nb0);
#pragma unroll
        for (int nb = 0; nb < C; nb++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int r = c >> 1, d = (nb0 + nb) * 8 + 2 * tq + (c & 1);
                if (live[r] && d < p.Dv)
                    of[ob[r] + d] = (w1[r] != 0.0f ? w1[r] * prev[nb][c] : 0.0f) + w2[r] * (acc[nb0 + nb][c] * inv[r]);
            }
    }
}

// row[0..3] += v: one 16-byte reduction on sm_90, four atomics before.
__device__ __forceinline__ void red_add4(float *row, float a, float b, float c, float d)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(row), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
#else
    atomicAdd(row, a);
    atomicAdd(row + 1, b);
    atomicAdd(row + 2, c);
    atomicAdd(row + 3, d);
#endif
}

#if __CUDA_ARCH__ >= 900
// row[0..1] += v: one 8-byte reduction (sm_90).
__device__ __forceinline__ void red_add2(float *row, float a, float b)
{
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(row), "f"(a), "f"(b) : "memory");
}

// add_dq_rows (below) for p.dqa_vec on sm_90 with 8-byte reductions taken
// straight from the accumulator pairs: no shuffles, and no four-register
// operand that the compiler builds in the same registers for every
// reduction (each then waits until the previous one has read them).
template <int NB>
__device__ __forceinline__ void add_dq_rows2(const attn_params &p, const float (&acc)[NB][4], int64_t b, int h,
                                             int64_t r0, int col0, int tq)
{
    float *dq = static_cast<float *>(const_cast<void *>(p.dqa.p));
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = r0 + r * 8;
        if (i < p.Sq) {
            float *row = dq + at(p.dqa, b, i, h) + col0 + 2 * tq;
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
                if (col0 + nb * 8 + 2 * tq < p.dqa_cols)
                    red_add2(row + nb * 8, acc[nb][2 * r], acc[nb][2 * r + 1]);
        }
    }
}
#endif

// Backward with atomics: add a 16-row dQ piece in C layout (this thread:
// query rows r0, r0 + 8 of batch b, head h; columns col0 + 8 nb + 2 tq + e)
// into the fp32 sums p.dqa. Every lane of the warp calls it.
template <int NB>
__device__ __forceinline__ void add_dq_rows(const attn_params &p, const float (&acc)[NB][4], int64_t b, int h,
                                            int64_t r0, int col0, int tq)
{
    float *dq = static_cast<float *>(const_cast<void *>(p.dqa.p));
    if (p.dqa_vec) {
        // Lanes 2t and 2t+1 swap halves so that each holds four consecutive
        // columns of one row: the even lane row g, the odd one row g + 8.
        const bool odd = tq & 1;
        const int64_t i = r0 + (odd ? 8 : 0);
        const bool row_ok = i < p.Sq;
        float *row = dq + (row_ok ? at(p.dqa, b, i, h) : 0);
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            const float s0 = odd ? acc[nb][0] : acc[nb][2], s1 = odd ? acc[nb][1] : acc[nb][3];
            const float x0 = __shfl_xor_sync(0xffffffffu, s0, 1), x1 = __shfl_xor_sync(0xffffffffu, s1, 1);
            const int d = col0 + nb * 8 + (tq & 2) * 2;
            if (row_ok && d < p.dqa_cols) {
                if (odd)
                    red_add4(row + d, x0, x1, acc[nb][2], acc[nb][3]);
                else
                    red_add4(row + d, acc[nb][0], acc[nb][1], x0, x1);
            }
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = r0 + r * 8;
        if (i >= p.Sq)
            continue;
        float *row = dq + at(p.dqa, b, i, h);
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = col0 + nb * 8 + 2 * tq + e;
                if (d < p.dqa_cols)
                    atomicAdd(row + d, acc[nb][2 * r + e]);
            }
    }
}

// The dK / dV epilogue of a 16-key piece in C layout (this thread: key rows
// j0, j0 + 8 of batch b, kv head hk; columns c0 + 8 nb + 2 tq + e): store
// into p.dk, p.dv, or add with grad_accumulate. Adding into F32 grads loads
// a chunk of old values before storing any (see store_rows), unless BATCH is
// false.
template <bool BATCH = true, int NB>
__device__ __forceinline__ void store_dkdv_rows(const attn_params &p, const float (&adk)[NB][4],
                                                const float (&adv)[NB][4], int64_t b, int hk, int64_t j0, int c0,
                                                int tq)
{
    void *dk = const_cast<void *>(p.dk.p), *dv = const_cast<void *>(p.dv.p);
    // (BATCH = false where the caller has no registers to spare)
    if (BATCH && p.grad_accumulate && p.gdt == CP_DTYPE_F32) {
        float *fk = static_cast<float *>(dk), *fv = static_cast<float *>(dv);
        int64_t ok[2], ov[2];
        bool live[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t j = j0 + r * 8;
            live[r] = j < p.Sk;
            ok[r] = live[r] ? at(p.dk, b, j, hk) : 0;
            ov[r] = live[r] ? at(p.dv, b, j, hk) : 0;
        }
        constexpr int CH = NB < 4 ? NB : 4; // 8 CH old values in flight
        static_assert(NB % CH == 0, "whole chunks");
#pragma unroll
        for (int nb0 = 0; nb0 < NB; nb0 += CH) {
            float pk[CH][4], pv[CH][4];
#pragma unroll
            for (int nb = 0; nb < CH; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int r = c >> 1, d = c0 + (nb0 + nb) * 8 + 2 * tq + (c & 1);
                    pk[nb][c] = live[r] && d < p.D ? fk[ok[r] + d] : 0.0f;
                    pv[nb][c] = live[r] && d < p.Dv ? fv[ov[r] + d] : 0.0f;
                }
#pragma unroll
            for (int nb = 0; nb < CH; nb++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int r = c >> 1, d = c0 + (nb0 + nb) * 8 + 2 * tq + (c & 1);
                    if (live[r] && d < p.D)
                        fk[ok[r] + d] = pk[nb][c] + adk[nb0 + nb][c];
                    if (live[r] && d < p.Dv)
                        fv[ov[r] + d] = pv[nb][c] + adv[nb0 + nb][c];
                }
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t j = j0 + r * 8;
        if (j >= p.Sk)
            continue;
        const int64_t ok = at(p.dk, b, j, hk), ov = at(p.dv, b, j, hk);
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
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

// ---------------------------------------------------------------------------
// API 1.1: walking a call's bands (attn_mma_rect.cu, the wgmma rectangle
// forward).

// The band, the rows of the tile [i0, i0 + nq) inside it, and the key range
// [*klo, *khi) those rows see.
__device__ __forceinline__ void band_rows_keys(const band &r, int64_t i0, int64_t nq, int64_t *klo, int64_t *khi)
{
    const int64_t ra = r.q0 > i0 ? r.q0 : i0, rb = r.q1 < i0 + nq ? r.q1 : i0 + nq;
    int64_t x;
    band_keys(r, ra, klo, &x);
    band_keys(r, rb - 1, &x, khi);
}

// The same from the key side: keys [j0, j0 + nk) of the band, the query rows
// [*qlo, *qhi) that see them.
__device__ __forceinline__ void band_keys_rows(const band &r, int64_t j0, int64_t nk, int64_t *qlo, int64_t *qhi)
{
    const int64_t ka = r.k0 > j0 ? r.k0 : j0, kb = r.k1 < j0 + nk ? r.k1 : j0 + nk;
    int64_t x;
    band_queries(r, ka, qlo, &x);
    band_queries(r, kb - 1, &x, qhi);
}

// Whether every pair of rows [i0, i0 + ni) x keys [j0, j0 + nj) is in the band.
__device__ __forceinline__ bool band_covers(const band &r, int64_t i0, int64_t ni, int64_t j0, int64_t nj)
{
    if (i0 < r.q0 || i0 + ni > r.q1 || j0 < r.k0 || j0 + nj > r.k1)
        return false;
    // row q0 + t sees k0 + [t + a_lo, t + a_hi): need j0 >= last row's lo
    // and j0 + nj <= first row's hi
    int64_t lo, hi, x;
    band_keys(r, i0 + ni - 1, &lo, &x);
    band_keys(r, i0, &x, &hi);
    return lo <= j0 && hi >= j0 + nj;
}

// The columns [lo, hi) of a tile of bk keys from k0 that row i sees in band r
// (0, 0 for a row outside it).
__device__ __forceinline__ void row_limits(const band &r, int64_t i, int64_t k0, int bk, int *lo, int *hi)
{
    if (i < r.q0 || i >= r.q1) {
        *lo = *hi = 0;
        return;
    }
    int64_t a, b;
    band_keys(r, i, &a, &b);
    a -= k0;
    b -= k0;
    *lo = a < 0 ? 0 : a > bk ? bk : (int)a;
    *hi = b < 0 ? 0 : b > bk ? bk : (int)b;
}

// The columns [lo, hi) of a tile of bq query rows from i0 that key j sees.
__device__ __forceinline__ void key_limits(const band &r, int64_t j, int64_t i0, int bq, int *lo, int *hi)
{
    if (j < r.k0 || j >= r.k1) {
        *lo = *hi = 0;
        return;
    }
    int64_t a, b;
    band_queries(r, j, &a, &b);
    a -= i0;
    b -= i0;
    *lo = a < 0 ? 0 : a > bq ? bq : (int)a;
    *hi = b < 0 ? 0 : b > bq ? bq : (int)b;
}

// One online-softmax step of a 16-row tile in C layout (softmax_tile of
// mma.cuh with two-sided limits per row and the softcap): scores to base 2,
// masked outside [lo[r], hi[r]) unless `full`, probabilities relative to the
// new running maximum, alpha for the accumulators.
// CAP: 1 or 0 where the caller knows whether there is a softcap (no
// branch on it then: the wgmma kernels keep products in flight across this
// code), -1 to ask p. POS (CAP = 0 and p.c > 0): softmax_tile_c's one
// multiply-add a probability, the maximum over the raw scores.
template <int NB, int CAP = -1, bool POS = false>
__device__ __forceinline__ void softmax_band(float (&s)[NB][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             const attn_params &p, bool full, const int (&lo)[2],
                                             const int (&hi)[2], int tq)
{
    static_assert(!POS || CAP == 0, "POS: no softcap");
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            float x = POS     ? s[nb][c]
                      : CAP < 0 ? score2(p, s[nb][c])
                      : CAP     ? p.cap_out * tanh_cap(s[nb][c] * p.cap_in)
                                : s[nb][c] * p.c;
            if (!full) {
                const int col = nb * 8 + 2 * tq + (c & 1);
                x = col >= lo[c >> 1] && col < hi[c >> 1] ? x : -INFINITY;
            }
            s[nb][c] = x;
            mx[c >> 1] = fmaxf(mx[c >> 1], x);
        }
    float mu[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float mnew = fmaxf(m[r], POS ? quad_max(mx[r]) * p.c : quad_max(mx[r]));
        mu[r] = mnew == -INFINITY ? 0.0f : mnew;
        alpha[r] = exp2_fast(m[r] - mu[r]);
        m[r] = mnew;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            s[nb][c] = exp2_fast(POS ? fmaf(s[nb][c], p.c, -mu[c >> 1]) : s[nb][c] - mu[c >> 1]);
            l[c >> 1] += s[nb][c];
        }
}

// The key tile after (bi, k0) of a query tile's walk: the next tile of the
// band, or the first of the next band (bi = be: none).
template <int BK>
__device__ __forceinline__ void next_key_tile(const attn_params &p, int be, int64_t i0, int64_t nq, int &bi,
                                              int64_t &k0, int64_t &khi)
{
    k0 += BK;
    if (k0 < khi)
        return;
    if (++bi < be)
        band_rows_keys(p.rs.bands[p.rs.by_q.ids[bi]], i0, nq, &k0, &khi);
}

// Padded head dim the kernels are compiled for: 64, 128 or 256 (0 = none).
inline int padded_dim(int D, int Dv)
{
    const int m = D > Dv ? D : Dv;
    return m <= 64 ? 64 : m <= 128 ? 128 : m <= 256 ? 256 : 0;
}

// Tile shapes. Forward: 4 warps of 16 * MT query rows against BK keys. For
// head dim 128 two row tiles per warp share every K / V fragment loaded from
// shared memory, halving that traffic per product: +20-25% on an H200
// (docs/notes/gpu-testing-runs.md, run 2). For 64 the doubled registers cost more than that
// saves (-10%), and 256 has no registers to spare. INFINICP_CUDA_FWD_MT=1
// selects one tile for 128 too (tuning).
__host__ __device__ constexpr int fwd_mt(int DP) { return DP == 128 ? 2 : 1; }
__host__ __device__ constexpr int fwd_bk(int DP) { return DP == 256 ? 32 : 64; }
// dK/dV: 64 key rows against BQ query rows; for DP = 256 the accumulators
// are split into column chunks of 128 (one block per chunk).
constexpr int DKDV_BK = 64;
__host__ __device__ constexpr int dkdv_bq(int DP) { return DP == 64 ? 64 : 32; }
__host__ __device__ constexpr int dkdv_dc(int DP) { return DP == 256 ? 128 : DP; }
// dQ: 64 query rows against BK keys.
constexpr int DQ_BQ = 64;
__host__ __device__ constexpr int dq_bk(int DP) { return DP == 256 ? 32 : 64; }

inline int tile_bytes(int rows, int DP)
{
    return rows * (DP + 8) * 2;
}
inline int fwd_smem(int DP, int MT)
{
    return tile_bytes(64 * MT + 2 * fwd_bk(DP), DP);
}
inline int dkdv_smem(int DP)
{
    return tile_bytes(2 * DKDV_BK + 2 * dkdv_bq(DP), DP) + 2 * dkdv_bq(DP) * 4;
}
inline int dq_smem(int DP)
{
    return tile_bytes(2 * DQ_BQ + 2 * dq_bk(DP), DP);
}

// ---------------------------------------------------------------------------
// Backward pieces shared by the dense and the rectangle dK/dV kernels
// (attn_mma_bwd.cu, attn_mma_rect.cu).

// The atomic variant keeps dS^T of the query tile in shared memory, stored
// [key][query] (the layout its registers hold), for the dQ product.
__host__ __device__ constexpr int ds_pitch(int DP) { return dkdv_bq(DP) + 8; }

// dK/dV blocks of NW warps own 16 NW keys: the deterministic variant uses 4
// (DKDV_BK = 64 keys); the atomic one 4 or 8 (INFINICP_CUDA_BWD_WARPS,
// tuning: 128 keys halve the reductions and the Q / dO tile loads per key).
inline int dkdv_smem_nw(int DP, int NW, bool atomic)
{
    const int BK = 16 * NW, BQ = dkdv_bq(DP);
    return tile_bytes(2 * BK + 2 * BQ, DP) + 2 * BQ * 4 + (atomic ? BK * ds_pitch(DP) * 2 : 0);
}

// A operand (16 rows from m0, k columns [k0, k0 + 16)) from a tile stored
// [k][m] (m contiguous), through the transposing load.
template <int PITCH, typename T>
__device__ __forceinline__ void load_a_km(uint32_t (&a)[4], const T *tile, int m0, int k0, int lane)
{
    ldsm_x4_t(a, tile + (k0 + (lane >> 4) * 8 + (lane & 7)) * PITCH + m0 + ((lane >> 3) & 1) * 8);
}

// dQ rows [i0 + 16 wm, +16) x columns [col0, col0 + NC) of query head h from
// dS (in dSs, [key][query]) and the K tile: dq += dS K, added into p.dqa.
template <typename T, int DP, int BK, int NC>
__device__ __forceinline__ void add_dq(const attn_params &p, const T *dSs, const T *Ks, int64_t b, int h,
                                       int64_t i0, int wm, int col0, int lane)
{
    constexpr int PITCH = DP + 8, SP = ds_pitch(DP);
    const int g = lane >> 2, tq = lane & 3;
    float acc[NC / 8][4];
#pragma unroll
    for (int nb = 0; nb < NC / 8; nb++)
        acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
        uint32_t a[4];
        load_a_km<SP>(a, dSs, wm * 16, kk * 16, lane);
#pragma unroll
        for (int nb2 = 0; nb2 < NC / 16; nb2++) {
            uint32_t bb[4];
            load_b_kn<PITCH>(bb, Ks, col0 + nb2 * 16, kk * 16, lane);
            mma16816<T>(acc[2 * nb2], a, bb[0], bb[1]);
            mma16816<T>(acc[2 * nb2 + 1], a, bb[2], bb[3]);
        }
    }
    add_dq_rows(p, acc, b, h, i0 + wm * 16 + g, col0, tq);
}

} // namespace mma
} // namespace cu

#endif
