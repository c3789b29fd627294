// SPDX-License-Identifier: MIT
// Hopper (sm_90a) building blocks of the wgmma attention kernels: the
// warpgroup-wide asynchronous tensor-core product (wgmma.mma_async, fp32
// accumulators, F16 / BF16 operands), its shared-memory descriptors, the
// fences and waits around it, and tile loads into the 128-byte swizzle the
// descriptors describe.
//
// Tile layout: an R-row tile of DP 16-bit columns is stored in column blocks
// of 64 elements (128 bytes a row), block cb at cb * R * 128 bytes; inside a
// block, 8-row x 128-byte atoms, 16-byte chunk c of row r at chunk c ^ (r & 7)
// (tiles aligned to 1024 bytes, the period of that pattern). Such a tile is:
//  - a K-major operand (A of M x K, B of N x K, K contiguous) where its rows
//    are M or N: the descriptor of k16 step kk starts at block kk / 4, byte
//    32 (kk % 4) of the row;
//  - an MN-major ("transposed") operand where its rows are K: step kk starts
//    16 rows (2048 bytes) further, and the descriptor's leading byte offset
//    is the stride between 64-element column blocks (R * 128).
// Per warp, the accumulator of m64nN is the m16n8 C layout of mma.sync (warp
// w of the warpgroup: rows 16 w + g, 16 w + g + 8), and the register A
// operand is mma.sync's A fragment (mma.cuh), so the fragment helpers there
// apply.
//
// Everything is compiled for sm_90a only (CP_WGMMA_BODY); other targets see
// the declarations and build empty kernels.
#ifndef INFINICP_KERNELS_CUDA_WGMMA_CUH
#define INFINICP_KERNELS_CUDA_WGMMA_CUH

#include <cudaTypedefs.h>
#include <type_traits>

#include "mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CP_WGMMA_BODY 1
#endif

namespace cu {
namespace wg {

// N tensor maps for a loader: dimension 0 the contiguous one (head columns,
// or the sequence of a row map), 1..3 the rows, heads and batches ordered by
// stride; pos[t] says which dimension holds tensor t's rows, heads and
// batches.
template <int N>
struct tmaps {
    CUtensorMap m[N];
    int pos[N][3];
};

// Map *map over columns [0, dim) x rows [0, n) x heads [0, nh) x batches
// [0, nb) of the 16-bit tensor t, in boxes of 64 columns x `rows` rows,
// 128-byte swizzled (the layout of load_sw); of the FP8 one (dt
// CP_DTYPE_FP8_E4M3), boxes of 128 columns, the same 128-byte rows. False
// where no map describes t (a dimension of more than one index with a
// stride of 0 or below, not a multiple of 16 bytes, or beyond what the copy
// engine takes); the caller then loads with cp.async (FP8: the SIMT
// kernels).
bool make_map(CUtensorMap *map, int (&pos)[3], const tensor &t, cp_dtype dt, int64_t n, int nh, int nb, int dim,
              int rows);

// Map *map over columns [0, dim) x rows [0, n) x heads [0, nh) x batches
// [0, nb) of the fp32 tensor t (the dQ sums), in boxes of 32 columns x `rows`
// rows, 128-byte swizzled, for bulk reductions into it.
bool make_sum_map(CUtensorMap *map, int (&pos)[3], const tensor &t, int64_t n, int nh, int nb, int dim, int rows);

// Map *map over fp32 rows laid out like the LSE (element (b, h, s) at base +
// b sb + h sh + s, s < n), in boxes of len consecutive elements of one row;
// elements past n arrive as 0. False where no map describes them.
bool make_row_map(CUtensorMap *map, int (&pos)[3], const float *base, int64_t n, int nh, int64_t sh, int nb,
                  int64_t sb, int len);

// Bytes of the barriers of a warp-specialised forward with kst K and vst V
// stages (fwd_bars).
__host__ __device__ constexpr int fwd_bars_bytes(int kst, int vst)
{
    return 8 * (2 + 2 * kst + 2 * vst) + 3 * 16;
}

#ifdef CP_WGMMA_BODY

// Byte offset of 16-byte chunk c of row r in a swizzled R-row tile.
template <int R>
__device__ __forceinline__ uint32_t sw_off(int r, int c)
{
    return (uint32_t)((c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void cp_async16_to(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void cp_async4_to(uint32_t dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void zero16(uint32_t dst)
{
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0));
}

__device__ __forceinline__ void st_shared_f32(uint32_t dst, float v)
{
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(dst), "f"(v));
}

__device__ __forceinline__ void st_shared_u32(uint32_t dst, uint32_t v)
{
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(v));
}

__device__ __forceinline__ void st_shared_v2(uint32_t dst, float a, float b)
{
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(dst), "f"(a), "f"(b));
}

__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t src)
{
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(src));
    return v;
}

__device__ __forceinline__ float ld_shared_f32(uint32_t src)
{
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(src));
    return v;
}

// The backward's non-finite guard (common.cuh, nf_clean) on shared-memory
// addresses: `bytes` (a multiple of 16) of 16-bit values at a, or n floats
// (rowsums), non-finite ones as +0; thread tid of nt.
template <typename T>
__device__ __forceinline__ void nf_clean_sh(uint32_t a, uint32_t bytes, int tid, int nt)
{
#pragma unroll 1
    for (uint32_t o = (uint32_t)tid * 16; o < bytes; o += (uint32_t)nt * 16) {
        uint32_t x0, x1, x2, x3;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3)
                     : "r"(a + o));
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a + o), "r"(finite2<T>(x0)),
                     "r"(finite2<T>(x1)), "r"(finite2<T>(x2)), "r"(finite2<T>(x3)));
    }
}

__device__ __forceinline__ void nf_clean_sh_f32(uint32_t a, int n, int tid, int nt)
{
#pragma unroll 1
    for (int e = tid; e < n; e += nt)
        st_shared_f32(a + 4 * e, finite_or_0(ld_shared_f32(a + 4 * e)));
}

// Rows [r0, r0 + R) of head h of t, columns [0, dim), into a swizzled R x DP
// tile at dst by the NT threads of the block; rows past n and columns past
// dim are zero (an operand multiplied by a zero probability must not be NaN).
// Needs p.vec (16-byte aligned rows). Commit and wait are the caller's.
template <typename T, int R, int DP, int NT>
__device__ __forceinline__ void load_sw(uint32_t dst, const tensor &t, int64_t b, int64_t r0, int64_t n, int h,
                                        int dim)
{
    constexpr int CH = DP / 8; // chunks per row
    if constexpr (NT % CH == 0) {
        // whole rows a pass: a thread keeps its column
        constexpr int RP = NT / CH; // rows per pass
        static_assert(R % RP == 0, "whole passes");
        const int c = threadIdx.x % CH, r1 = threadIdx.x / CH;
        const T *src = static_cast<const T *>(t.p) + at(t, b, r0 + r1, h) + c * 8;
        const bool col = c * 8 < dim;
#pragma unroll
        for (int it = 0; it < R / RP; it++) {
            const int r = r1 + it * RP;
            if (col && r0 + r < n)
                cp_async16_to(dst + sw_off<R>(r, c), src + (int64_t)it * RP * t.ss);
            else
                zero16(dst + sw_off<R>(r, c));
        }
    } else {
        // DP = 192: chunk e of the tile, row e / CH
        static_assert(R * CH % NT == 0, "whole passes");
#pragma unroll
        for (int it = 0; it < R * CH / NT; it++) {
            const int e = threadIdx.x + it * NT, r = e / CH, c = e % CH;
            if (c * 8 < dim && r0 + r < n)
                cp_async16_to(dst + sw_off<R>(r, c), static_cast<const T *>(t.p) + at(t, b, r0 + r, h) + c * 8);
            else
                zero16(dst + sw_off<R>(r, c));
        }
    }
}

__device__ __forceinline__ void fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Shared memory written through the generic proxy (st.shared, cp.async),
// made visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keep the compiler from moving accesses of registers across the issue and
// the wait of an asynchronous product (it sees the asm's outputs as final).
template <int NB>
__device__ __forceinline__ void reg_fence(float (&d)[NB][4])
{
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            asm volatile("" : "+f"(d[nb][c])::"memory");
}

__device__ __forceinline__ void reg_fence(float (&d)[2])
{
    asm volatile("" : "+f"(d[0]), "+f"(d[1])::"memory");
}

template <int NB>
__device__ __forceinline__ void reg_fence(uint32_t (&d)[NB][4])
{
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            asm volatile("" : "+r"(d[nb][c])::"memory");
}

// --- synchronisation and copies of the warp-specialised kernels ---

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// The loader's arrival on a full barrier, announcing the bytes its copies
// will complete on it.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// One arrival per warp (lane 0), as a predicated instruction: a branch here
// would sit between two wgmma waits.
__device__ __forceinline__ void mbar_arrive_warp(uint32_t bar, int lane)
{
    asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(
                     bar),
                 "r"(lane)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

// The work items of a persistent warp-specialised kernel: the loader takes
// them (from a per-launch counter, or every gridDim.x-th without one) and
// passes each on to the 8 consumer warps through one of two shared slots,
// each with a full barrier (1 arrival) and an empty one (8). Item numbers
// past the last (>= items) end the block's loop: every block takes one.
struct item_queue {
    uint32_t full, empty, slot; // two barriers and two slots each, 8 bytes apart

    __device__ __forceinline__ void init() const
    {
        for (int sl = 0; sl < 2; sl++)
            mbar_init(full + 8 * sl, 1), mbar_init(empty + 8 * sl, 8);
    }
    // The loader thread: take item k of this block into its slot; publish
    // passes it on (take, then publish: room to put more beside it).
    __device__ __forceinline__ int take(int k, int items, int *counter) const
    {
        const int sl = k & 1;
        if (k >= 2)
            mbar_wait(empty + 8 * sl, (uint32_t)((k >> 1) + 1) & 1);
        int it;
        if (!counter) { // (items + gridDim.x < 2^31: checked at launch)
            it = (int)blockIdx.x + k * (int)gridDim.x;
        } else {
            it = atomicAdd(counter, 1);
            // every block takes one number past the last item; whoever takes
            // the very last number leaves the counter at 0 for the next launch
            if (it == items + (int)gridDim.x - 1)
                atomicExch(counter, 0);
        }
        st_shared_u32(slot + 8 * sl, (uint32_t)it);
        return it;
    }
    __device__ __forceinline__ void publish(int k) const { mbar_arrive_warp(full + 8 * (k & 1), 0); }
    __device__ __forceinline__ int post(int k, int items, int *counter) const
    {
        const int it = take(k, items, counter);
        publish(k);
        return it;
    }
    // A consumer warp: item k of this block; release hands its slot back
    // (next: both at once).
    __device__ __forceinline__ int peek(int k) const
    {
        const int sl = k & 1;
        mbar_wait(full + 8 * sl, (uint32_t)(k >> 1) & 1);
        return (int)ld_shared_u32(slot + 8 * sl);
    }
    __device__ __forceinline__ void release(int k, int lane) const
    {
        __syncwarp(); // every lane has read what lies beside the slot
        mbar_arrive_warp(empty + 8 * (k & 1), lane);
    }
    __device__ __forceinline__ int next(int k, int lane) const
    {
        const int it = peek(k);
        release(k, lane);
        return it;
    }
};

// The mbarriers of a warp-specialised forward (the 16-bit dense and
// rectangle kernels, FP8), from `at` on, 8 bytes each: Q's full and empty
// ones, a full and an empty one per K stage and per V stage, then the item
// queue's (fwd_bars_bytes in all). A full barrier takes the loader's one
// arrival (with its copies' bytes), an empty one the 8 consumer warps'.
template <int KST, int VST>
struct fwd_bars {
    uint32_t qfull, qempty, kfull, kempty, vfull, vempty;
    item_queue iq;

    __device__ __forceinline__ explicit fwd_bars(uint32_t at)
        : qfull(at), qempty(at + 8), kfull(at + 16), kempty(kfull + 8 * KST), vfull(kempty + 8 * KST),
          vempty(vfull + 8 * VST), iq{vempty + 8 * VST, vempty + 8 * VST + 16, vempty + 8 * VST + 32}
    {
    }
    // By one thread, before the block's first __syncthreads.
    __device__ __forceinline__ void init() const
    {
        mbar_init(qfull, 1), mbar_init(qempty, 8);
        for (int st = 0; st < KST; st++)
            mbar_init(kfull + 8 * st, 1), mbar_init(kempty + 8 * st, 8);
        for (int st = 0; st < VST; st++)
            mbar_init(vfull + 8 * st, 1), mbar_init(vempty + 8 * st, 8);
        iq.init();
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
};

// Named barrier id (0 is __syncthreads) over N threads: by default the 256
// of both consumer warpgroups.
template <int N = 256>
__device__ __forceinline__ void named_sync(int id)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(N) : "memory");
}

__device__ __forceinline__ void named_arrive(int id)
{
    asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

// The box of a 4-d tensor map at coordinates c0..c3 into dst.
__device__ __forceinline__ void tma_load4(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1, int c2,
                                          int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
                 "%5, %6}], [%2];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

// Coordinates of dimensions 1..3 of a map (pos as in tmaps) for row r of
// head hd, batch bt.
__device__ __forceinline__ void tma_coords(const int (&pos)[3], int r, int hd, int bt, int (&c)[3])
{
#pragma unroll
    for (int d = 1; d <= 3; d++)
        c[d - 1] = pos[0] == d ? r : pos[1] == d ? hd : bt;
}

// The box at column col, row r of head hd, batch bt of map t into dst (zero
// past the tensor's edges); the copy completes on bar.
template <int N>
__device__ __forceinline__ void tma_box(uint32_t dst, const tmaps<N> &mp, int t, uint32_t bar, int col, int r, int hd,
                                        int bt)
{
    int c[3];
    tma_coords(mp.pos[t], r, hd, bt, c);
    tma_load4(dst, &mp.m[t], bar, col, c[0], c[1], c[2]);
}

// Rows [r, r + R) of head hd, batch bt of tensor t of the maps (columns [0,
// DP), zero past the tensor's edges) into the swizzled R x DP tile at dst; the
// copies complete on bar.
template <int R, int DP, int N>
__device__ __forceinline__ void tma_tile(uint32_t dst, const tmaps<N> &mp, int t, uint32_t bar, int r, int hd, int bt)
{
#pragma unroll
    for (int kb = 0; kb < DP / 64; kb++)
        tma_box(dst + kb * R * 128, mp, t, bar, kb * 64, r, hd, bt);
}

// Shared-memory matrix descriptor of a 128-byte-swizzled operand from its
// low word lo = (start address >> 4) | (lbo >> 4) << 16, lbo the byte stride
// between 64-element column blocks (MN-major; K-major ignores it). The high
// word (8-row groups 1024 bytes apart, 128-byte swizzle) is the same for
// every operand, so callers build lo once per tile and add each k-step's
// (bytes >> 4) as an immediate: no carry leaves the address field, since
// shared addresses stay below 2^18.
__device__ __forceinline__ uint64_t sw128_at(uint32_t lo)
{
    return (uint64_t)lo | (uint64_t)((1024 >> 4) | 1u << 30) << 32;
}

// What k16 step kk adds to the low word of an R-row tile's descriptor (the
// tile layout at the top of this file). K-major: 64-column block kk / 4, 32
// bytes per step inside it (leading byte offset 16, unused). MN-major: 16
// rows (2048 bytes) per step, column blocks R * 128 bytes apart.
template <int R>
__device__ __forceinline__ constexpr uint32_t kmajor_step(int kk)
{
    return (uint32_t)(((kk >> 2) * R * 128 + (kk & 3) * 32) >> 4) + (16u >> 4 << 16);
}

template <int R>
__device__ __forceinline__ constexpr uint32_t mnmajor_step(int kk)
{
    return (uint32_t)(kk * (2048 >> 4)) + ((uint32_t)(R * 128) >> 4 << 16);
}

// Accumulator operand lists: NB blocks of 8 columns, 4 registers each.
#define CP_WG_D1(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define CP_WG_D4(d, j) CP_WG_D1(d, j), CP_WG_D1(d, (j) + 1), CP_WG_D1(d, (j) + 2), CP_WG_D1(d, (j) + 3)
#define CP_WG_D8(d) CP_WG_D4(d, 0), CP_WG_D4(d, 4)
#define CP_WG_D16(d) CP_WG_D4(d, 0), CP_WG_D4(d, 4), CP_WG_D4(d, 8), CP_WG_D4(d, 12)
#define CP_WG_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define CP_WG_R32                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define CP_WG_R64                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// One asm statement for T = bf16 or f16 (the type is part of the opcode).
#define CP_WG_TYPED(T, STMT)                                                                                   \
    do {                                                                                                       \
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {                                                 \
            STMT("bf16");                                                                                      \
        } else {                                                                                               \
            STMT("f16");                                                                                       \
        }                                                                                                      \
    } while (0)

// d (64 x 8 NB) (+)= A B, one k16 step, both operands in shared memory
// (descriptors da, db); TA / TB = 1: A / B MN-major; acc = 0 overwrites d.
// NB = 4, 8 or 16 (N = 32, 64, 128).
#define CP_WG_SS_BODY(TY, N, REGS, DL, IA, IB, IC, ITA, ITB)                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IC ", 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " REGS ", " IA ", " IB          \
                 ", p, 1, 1, " ITA ", " ITB ";\n}\n"                                                           \
                 : DL                                                                                          \
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB))

#define CP_WG_SS_ASM(TY) CP_WG_SS_BODY(TY, 32, CP_WG_R16, CP_WG_D4(d, 0), "%16", "%17", "%18", "%19", "%20")
template <typename T, int TA, int TB>
__device__ __forceinline__ void mma_ss(float (&d)[4][4], uint64_t da, uint64_t db, int acc)
{
    CP_WG_TYPED(T, CP_WG_SS_ASM);
}
#undef CP_WG_SS_ASM
#define CP_WG_SS_ASM(TY) CP_WG_SS_BODY(TY, 64, CP_WG_R32, CP_WG_D8(d), "%32", "%33", "%34", "%35", "%36")
template <typename T, int TA, int TB>
__device__ __forceinline__ void mma_ss(float (&d)[8][4], uint64_t da, uint64_t db, int acc)
{
    CP_WG_TYPED(T, CP_WG_SS_ASM);
}
#undef CP_WG_SS_ASM
#define CP_WG_SS_ASM(TY) CP_WG_SS_BODY(TY, 128, CP_WG_R64, CP_WG_D16(d), "%64", "%65", "%66", "%67", "%68")
template <typename T, int TA, int TB>
__device__ __forceinline__ void mma_ss(float (&d)[16][4], uint64_t da, uint64_t db, int acc)
{
    CP_WG_TYPED(T, CP_WG_SS_ASM);
}
#undef CP_WG_SS_ASM

// d (64 x 8 NB) += A B, one k16 step, A in registers (the A fragment of
// mma.cuh, per warp its 16 rows), B MN-major in shared memory.
#define CP_WG_RS_BODY(TY, N, REGS, DL, IA0, IA1, IA2, IA3, IB)                                                  \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " REGS ", {" IA0 ", " IA1      \
                 ", " IA2 ", " IA3 "}, " IB ", 1, 1, 1, 1;\n"                                                  \
                 : DL                                                                                          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))

#define CP_WG_RS_ASM(TY) CP_WG_RS_BODY(TY, 32, CP_WG_R16, CP_WG_D4(d, 0), "%16", "%17", "%18", "%19", "%20")
template <typename T>
__device__ __forceinline__ void mma_rs(float (&d)[4][4], const uint32_t (&a)[4], uint64_t db)
{
    CP_WG_TYPED(T, CP_WG_RS_ASM);
}
#undef CP_WG_RS_ASM
#define CP_WG_RS_ASM(TY) CP_WG_RS_BODY(TY, 64, CP_WG_R32, CP_WG_D8(d), "%32", "%33", "%34", "%35", "%36")
template <typename T>
__device__ __forceinline__ void mma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db)
{
    CP_WG_TYPED(T, CP_WG_RS_ASM);
}
#undef CP_WG_RS_ASM
#define CP_WG_RS_ASM(TY) CP_WG_RS_BODY(TY, 128, CP_WG_R64, CP_WG_D16(d), "%64", "%65", "%66", "%67", "%68")
template <typename T>
__device__ __forceinline__ void mma_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db)
{
    CP_WG_TYPED(T, CP_WG_RS_ASM);
}
#undef CP_WG_RS_ASM
#undef CP_WG_RS_BODY

// FP8 (E4M3) products, N = 128, one k32 step (fp32 accumulators; FP8
// operands are K-major only). mma_ss_e4m3: d (+)= A B, both operands in
// shared memory; mma_rs_e4m3: d += A B, A in registers (per warp the A
// fragment of mma.sync's m16n8k32: register 0 row g, k 4 tq .. 4 tq + 3;
// 1 row g + 8, the same k; 2 and 3 the same with k + 16; lowest byte first).
__device__ __forceinline__ void mma_ss_e4m3(float (&d)[16][4], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " CP_WG_R64 ", %64, %65, p, 1, 1;\n}\n"
                 : CP_WG_D16(d)
                 : "l"(da), "l"(db), "r"(acc));
}

__device__ __forceinline__ void mma_rs_e4m3(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db)
{
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " CP_WG_R64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
                 : CP_WG_D16(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

#undef CP_WG_SS_BODY
#undef CP_WG_TYPED
#undef CP_WG_R16
#undef CP_WG_R32
#undef CP_WG_R64
#undef CP_WG_D1
#undef CP_WG_D4
#undef CP_WG_D8
#undef CP_WG_D16

#endif // CP_WGMMA_BODY

} // namespace wg
} // namespace cu

#endif
