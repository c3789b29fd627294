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
// kernel's (mma.cuh). Key tiles of 128 stream through shared memory with
// cp.async, K double- and V triple-buffered, in the 128-byte swizzle that the
// wgmma shared-memory descriptors describe: 8-row x 128-byte atoms, 16-byte
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
#include "mma.cuh"

// Only sm_90a has wgmma; every other target compiles an empty kernel that
// the dispatch never launches (wgmma_fits).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CP_WGMMA_BODY 1
#endif

namespace cu {
namespace {

using namespace mma;

constexpr int WG_THREADS = 256; // two warpgroups
constexpr int WG_BQ = 128;      // query rows per block, 64 per warpgroup
constexpr int WG_BK = 128;      // keys per tile
constexpr int WG_KSTAGES = 2, WG_VSTAGES = 3;

// Bytes of dynamic shared memory: Q, the K and V stages, and room to align
// the tiles to the 1024 bytes the swizzle pattern repeats over.
constexpr int wgmma_smem(int DP)
{
    return (WG_BQ + (WG_KSTAGES + WG_VSTAGES) * WG_BK) * DP * 2 + 1024;
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

__device__ __forceinline__ void zero16(uint32_t dst)
{
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0));
}

// Rows [r0, r0 + R) of head h of t, columns [0, dim), into a swizzled R x DP
// tile at dst; rows past n and columns past dim are zero (V's must be: P is
// 0 there, but 0 * NaN is not). Needs p.vec (16-byte aligned rows).
template <typename T, int R, int DP>
__device__ __forceinline__ void load_sw(uint32_t dst, const tensor &t, int64_t b, int64_t r0, int64_t n, int h,
                                        int dim)
{
    constexpr int CH = DP / 8, RP = WG_THREADS / CH; // chunks per row, rows per pass
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
}

// Shared-memory matrix descriptor of a 128-byte-swizzled operand at addr:
// lbo = byte stride between 64-element column blocks (MN-major; K-major
// ignores it), 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo)
{
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 |
           1ull << 62;
}

__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keep the compiler from moving accesses of accumulators across the issue
// and the wait of an asynchronous product.
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

__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#define WG_ACC2(d, j)                                                                                          \
    "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3]), "+f"(d[(j) + 1][0]), "+f"(d[(j) + 1][1]),      \
        "+f"(d[(j) + 1][2]), "+f"(d[(j) + 1][3])
#define WG_ACC8(d, j) WG_ACC2(d, j), WG_ACC2(d, (j) + 2), WG_ACC2(d, (j) + 4), WG_ACC2(d, (j) + 6)
#define WG_REGS32                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_REGS64                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d (64 x 128) (+)= A B, one k16 step, A and B K-major in shared memory;
// acc = 0 overwrites d.
template <typename T>
__device__ __forceinline__ void wgmma_ss128(float (&d)[16][4], uint64_t da, uint64_t db, int acc);
// d (64 x 8 NB) += A B, one k16 step, A in registers, B MN-major in shared memory.
template <typename T, int NB>
__device__ __forceinline__ void wgmma_rs(float (&d)[NB][4], const uint32_t (&a)[4], uint64_t db);

#define WG_DEFINE(T, TY)                                                                                       \
    template <>                                                                                                \
    __device__ __forceinline__ void wgmma_ss128<T>(float (&d)[16][4], uint64_t da, uint64_t db, int acc)       \
    {                                                                                                          \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                              \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " WG_REGS64                    \
                     ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                                         \
                     : WG_ACC8(d, 0), WG_ACC8(d, 8)                                                            \
                     : "l"(da), "l"(db), "r"(acc));                                                            \
    }                                                                                                          \
    template <>                                                                                                \
    __device__ __forceinline__ void wgmma_rs<T, 16>(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db)    \
    {                                                                                                          \
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " WG_REGS64                    \
                     ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"                                              \
                     : WG_ACC8(d, 0), WG_ACC8(d, 8)                                                            \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                   \
    }                                                                                                          \
    template <>                                                                                                \
    __device__ __forceinline__ void wgmma_rs<T, 8>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db)      \
    {                                                                                                          \
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " WG_REGS32                     \
                     ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"                                              \
                     : WG_ACC8(d, 0)                                                                           \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                   \
    }

WG_DEFINE(__nv_bfloat16, "bf16")
WG_DEFINE(__half, "f16")

#endif // CP_WGMMA_BODY

template <typename T, int DP>
__global__ void __launch_bounds__(WG_THREADS, 1) fwd_wgmma_kernel(attn_params p)
{
#ifdef CP_WGMMA_BODY
    constexpr int BQ = WG_BQ, BK = WG_BK, NB = BK / 8, NO = DP / 8;
    constexpr uint32_t QB = BQ * DP * 2, KB = BK * DP * 2; // tile bytes
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t Qs = (smem_addr(smem) + 1023) & ~1023u, Ks = Qs + QB, Vs = Ks + WG_KSTAGES * KB;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int64_t i0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * BQ; // most keys first under a causal mask
    const int h = blockIdx.y, hk = h / p.G;
    const int64_t b = blockIdx.z;
    const int64_t nq = p.Sq - i0 < BQ ? p.Sq - i0 : BQ;
    const int64_t kend = visible_keys(p, i0 + nq - 1);
    const int ntiles = (int)((kend + BK - 1) / BK);
    const int64_t row = i0 + wg * 64 + warp * 16 + g; // this thread's rows: row, row + 8

    if (ntiles > 0) {
        load_sw<T, BQ, DP>(Qs, p.q, b, i0, p.Sq, h, p.D);
        load_sw<T, BK, DP>(Ks, p.k, b, 0, p.Sk, hk, p.D);
        load_sw<T, BK, DP>(Vs, p.v, b, 0, p.Sk, hk, p.Dv);
        cp_async_commit();
    }

    float o[NO][4], s[NB][4], m[2], l[2], alpha[2];
    uint32_t pa[BK / 16][4]; // P of the previous tile as A fragments
#pragma unroll
    for (int nb = 0; nb < NO; nb++)
        o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
    m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;
    const uint32_t qa = Qs + wg * 64 * 128; // this warpgroup's 64 rows (8 whole atoms)

    for (int n = 0; n < ntiles; n++) {
        const int64_t k0 = (int64_t)n * BK;
        cp_async_wait_all();
        fence_proxy_async(); // the tiles were written through the generic proxy; wgmma reads through the async one
        __syncthreads();     // K, V tile n are in; both warpgroups are done with K n-1 and V n-2
        if (n + 1 < ntiles) {
            load_sw<T, BK, DP>(Ks + ((n + 1) % WG_KSTAGES) * KB, p.k, b, k0 + BK, p.Sk, hk, p.D);
            load_sw<T, BK, DP>(Vs + ((n + 1) % WG_VSTAGES) * KB, p.v, b, k0 + BK, p.Sk, hk, p.Dv);
            cp_async_commit();
        }
        const uint32_t kt = Ks + (n % WG_KSTAGES) * KB;
        reg_fence(s);
        reg_fence(o);
        reg_fence(pa);
        wgmma_fence(); // orders the register writes above before the products read them
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) // 64-column block kk / 4, 32 bytes per k16 step inside it
            wgmma_ss128<T>(s, sw128_desc(qa + (kk >> 2) * BQ * 128 + (kk & 3) * 32, 16),
                           sw128_desc(kt + (kk >> 2) * BK * 128 + (kk & 3) * 32, 16), kk > 0);
        wgmma_commit();
        if (n > 0) {
            const uint32_t vt = Vs + ((n - 1) % WG_VSTAGES) * KB;
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) // 16 key rows = 2048 bytes per step
                wgmma_rs<T, NO>(o, pa[kk], sw128_desc(vt + kk * 2048, BK * 128));
            wgmma_commit();
            wgmma_wait<1>();
        } else {
            wgmma_wait<0>();
        }
        reg_fence(s);

        // masked always (key limits of BK where nothing is hidden): no
        // branch may separate the two waits, or the compiler waits for both
        softmax_tile(s, m, l, alpha, p, true, k0, row, tq);
        // the softmax's results are used before the wait below, so that the
        // compiler cannot sink that arithmetic past it (the overlap with P V)
        reg_fence(s);
        reg_fence(l);
        reg_fence(alpha);
        wgmma_wait<0>();
        reg_fence(o);
        scale_rows(o, alpha);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            c_to_a<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
    }
    if (ntiles > 0) {
        const uint32_t vt = Vs + ((ntiles - 1) % WG_VSTAGES) * KB;
        reg_fence(o);
        reg_fence(pa);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wgmma_rs<T, NO>(o, pa[kk], sw128_desc(vt + kk * 2048, BK * 128));
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(o);
    }

    // normalise and write, or merge into the running (o, lse)
    store_rows(p, o, m, l, row, b, h, tq);
#else
    (void)p;
#endif
}

template <typename T, int DP>
cp_status launch(state *s, const attn_params &p)
{
    constexpr int bytes = wgmma_smem(DP);
    auto kernel = fwd_wgmma_kernel<T, DP>;
    cp_status r = allow_smem((const void *)kernel, bytes, "attention forward (wgmma)");
    if (r != CP_SUCCESS)
        return r;
    dim3 grid((unsigned)((p.Sq + WG_BQ - 1) / WG_BQ), (unsigned)p.H, (unsigned)p.B);
    kernel<<<grid, WG_THREADS, bytes, s->stream>>>(p);
    return check_launch("attention forward (wgmma)");
}

template <typename T>
cp_status forward_t(state *s, const attn_params &p)
{
    return padded_dim(p.D, p.Dv) == 64 ? launch<T, 64>(s, p) : launch<T, 128>(s, p);
}

} // namespace

bool wgmma_fits(const state *s, const attn_params &p)
{
#ifdef CP_HAVE_SM90A
    const int DP = padded_dim(p.D, p.Dv);
    return s->cc == 90 && (p.dt == CP_DTYPE_F16 || p.dt == CP_DTYPE_BF16) && p.vec && (DP == 64 || DP == 128) &&
           p.B <= 65535 && p.H <= 65535 && (p.Sq + WG_BQ - 1) / WG_BQ <= 0x7fffffff &&
           wgmma_smem(DP) <= s->smem_optin;
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
