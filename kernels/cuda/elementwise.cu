// SPDX-License-Identifier: MIT
// Element-wise kernels: dtype conversion, reduction (fp32 or wider), the merge
// of partial attention results, and rowsum(dO * O) for the backward passes.
// Each follows the CPU backend's arithmetic so that both give the same values
// up to fp32 rounding order.
#include <cmath>

#include "common.cuh"

namespace cu {
namespace {

// Exact loads and stores through double (F64 stays F64; F16 / BF16 go through
// f32, which is exact for every value that came from F32, F16 or BF16).
__device__ __forceinline__ double ld_d(const void *p, cp_dtype t, size_t i)
{
    return t == CP_DTYPE_F64 ? static_cast<const double *>(p)[i] : (double)ld_f(p, t, (int64_t)i);
}

__device__ __forceinline__ void st_d(void *p, cp_dtype t, size_t i, double v)
{
    if (t == CP_DTYPE_F64)
        static_cast<double *>(p)[i] = v;
    else
        st_f(p, t, (int64_t)i, (float)v);
}

__global__ void convert_kernel(void *dst, cp_dtype dt, const void *src, cp_dtype sdt, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        st_d(dst, dt, i, ld_d(src, sdt, i));
}

// Between F32 and a 16-bit type, eight elements a thread per step (two
// 16-byte accesses on the F32 side, one on the other) where both pointers
// are 16-byte aligned: the F32 accumulators of a CP ring come back to the
// storage type this way at the end of every forward and backward, and the
// one-element kernel above reaches about half the memory bandwidth. The
// rounding is convert_kernel's (put_f: to nearest even).
template <typename D, typename S>
__global__ void convert8_kernel(D *dst, const S *src, size_t n)
{
    const size_t n8 = n / 8, stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (size_t i = first; i < n8; i += stride) {
        float f[8];
        if constexpr (sizeof(S) == 4) {
            const float4 a = reinterpret_cast<const float4 *>(src)[2 * i],
                         b = reinterpret_cast<const float4 *>(src)[2 * i + 1];
            f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
        } else {
            const uint4 a = reinterpret_cast<const uint4 *>(src)[i];
            const S *h = reinterpret_cast<const S *>(&a);
#pragma unroll
            for (int e = 0; e < 8; e++)
                f[e] = get_f(h[e]);
        }
        if constexpr (sizeof(D) == 4) {
            reinterpret_cast<float4 *>(dst)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
            reinterpret_cast<float4 *>(dst)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
        } else {
            uint4 a;
            D *h = reinterpret_cast<D *>(&a);
#pragma unroll
            for (int e = 0; e < 8; e++)
                put_f(h[e], f[e]);
            reinterpret_cast<uint4 *>(dst)[i] = a;
        }
    }
    for (size_t i = 8 * n8 + first; i < n; i += stride) // the last n % 8
        put_f(dst[i], get_f(src[i]));
}

__global__ void reduce_kernel(void *acc, const void *x, cp_dtype t, size_t n, cp_reduce_op op)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double a = ld_d(acc, t, i), b = ld_d(x, t, i);
        // max keeps a NaN of x, and otherwise the larger (as the CPU backend)
        double r = op == CP_REDUCE_SUM ? a + b : (a >= b || b != b ? (b != b ? b : a) : b);
        if (t != CP_DTYPE_F64)
            r = (float)r; // the sum is formed in fp32
        st_d(acc, t, i, r);
    }
}

unsigned grid_for(size_t n, int threads)
{
    size_t blocks = (n + threads - 1) / threads;
    return (unsigned)(blocks < 65536 ? blocks : 65536);
}

// dst rows = src rows, `chunks` V-sized pieces a row; one piece a thread and
// step, four steps' loads issued before their stores.
template <typename V>
__global__ void copy_2d_kernel(char *dst, size_t dpitch, const char *src, size_t spitch, size_t chunks, size_t total)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i0 < total; i0 += 4 * stride) {
        V v[4];
        size_t at[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const size_t i = i0 + u * stride, r = i / chunks, c = i - r * chunks;
            at[u] = r * dpitch + c * sizeof(V);
            if (i < total)
                v[u] = *reinterpret_cast<const V *>(src + r * spitch + c * sizeof(V));
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (i0 + u * stride < total)
                *reinterpret_cast<V *>(dst + at[u]) = v[u];
    }
}

// One warp per (b, s, h) row: every lane reads the two LSE values before lane
// 0 overwrites the running one.
__global__ void merge_kernel(cp_kernel_merge_args a)
{
    const int64_t rows = a.batch * a.seq * a.num_heads;
    const int lane = threadIdx.x & 31;
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; r < rows;
         r += (int64_t)gridDim.x * blockDim.x / 32) {
        const int h = (int)(r % a.num_heads);
        const int64_t bs = r / a.num_heads, s = bs % a.seq, b = bs / a.seq;
        float *lse = a.lse + b * a.lse_stride_b + h * a.lse_stride_h + s;
        const float lse_x = a.lse_part[b * a.lse_part_stride_b + h * a.lse_part_stride_h + s];
        float w1, w2;
        double merged;
        const bool add = merge_weights(*lse, 0.0f, lse_x, &w1, &w2, &merged);
        __syncwarp();
        if (!add)
            continue;
        const int64_t o = b * a.o_stride_b + s * a.o_stride_s + h * a.o_stride_h;
        const int64_t x = b * a.o_part_stride_b + s * a.o_part_stride_s + h * a.o_part_stride_h;
        for (int d = lane; d < a.head_dim_v; d += 32)
            store_merged(a.o, a.o_dtype, o + d, ld_f(a.o_part, a.o_part_dtype, x + d), w1, w2);
        if (lane == 0)
            *lse = (float)merged;
    }
}

// One warp per query row.
__global__ void drow_kernel(attn_params p)
{
    const int64_t rows = (int64_t)p.B * p.H * p.Sq;
    const int lane = threadIdx.x & 31;
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; r < rows;
         r += (int64_t)gridDim.x * blockDim.x / 32) {
        const int64_t i = r % p.Sq, bh = r / p.Sq, b = bh / p.H;
        const int h = (int)(bh % p.H);
        const int64_t od = at(p.dout, b, i, h), oo = at(p.o, b, i, h);
        float sum = 0.0f;
        for (int d = lane; d < p.Dv; d += 32)
            sum += ld_f(p.dout.p, p.odt, od + d) * ld_f(p.o.p, p.odt, oo + d);
        for (int m = 16; m; m >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, m);
        if (lane == 0)
            p.drow[b * p.drb + h * p.drh + i] = sum;
    }
}

// The same for 16-bit dO and O whose head rows allow 16-byte loads: TPR
// threads a row (TPR * 8 >= Dv where it can), each summing 8 products of a
// chunk at a time. The old kernel's element loads through ld_f ran at a
// sixth of the memory's speed. Every lane of a warp runs the same number of
// rounds (rows past the end add nothing), so the shuffles see all lanes.
template <typename T, int TPR>
__global__ void drow16_kernel(attn_params p)
{
    const int64_t rows = (int64_t)p.B * p.H * p.Sq, step = (int64_t)gridDim.x * blockDim.x / TPR;
    const int sub = threadIdx.x % TPR;
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / TPR, r0 = r - (threadIdx.x & 31) / TPR;
         r0 < rows; r += step, r0 += step) {
        float sum = 0.0f;
        const int64_t i = r % p.Sq, bh = r / p.Sq, b = bh / p.H;
        const int h = (int)(bh % p.H);
        if (r < rows) {
            const T *od = static_cast<const T *>(p.dout.p) + at(p.dout, b, i, h);
            const T *oo = static_cast<const T *>(p.o.p) + at(p.o, b, i, h);
            for (int d = sub * 8; d < p.Dv; d += TPR * 8) {
                const uint4 x = *reinterpret_cast<const uint4 *>(od + d), y = *reinterpret_cast<const uint4 *>(oo + d);
                const T *xs = reinterpret_cast<const T *>(&x), *ys = reinterpret_cast<const T *>(&y);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    sum += get_f(xs[e]) * get_f(ys[e]);
            }
        }
#pragma unroll
        for (int m = TPR / 2; m; m >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, m);
        if (sub == 0 && r < rows)
            p.drow[b * p.drb + h * p.drh + i] = sum;
    }
}

template <typename T>
cp_status launch_drow16(state *s, const attn_params &p, int64_t rows)
{
    const int tpr = threads_per_row(p.Dv / 8);
    auto kernel = tpr == 32   ? drow16_kernel<T, 32>
                  : tpr == 16 ? drow16_kernel<T, 16>
                  : tpr == 8  ? drow16_kernel<T, 8>
                              : drow16_kernel<T, 4>;
    kernel<<<grid_for((size_t)rows * tpr, 256), 256, 0, s->stream>>>(p);
    return check_launch("rowsum(dO * O) kernel");
}

} // namespace

template <typename D, typename S>
cp_status launch_convert8(state *s, void *dst, const void *src, size_t n)
{
    convert8_kernel<D, S><<<grid_for(n / 8 + 1, 256), 256, 0, s->stream>>>(static_cast<D *>(dst),
                                                                            static_cast<const S *>(src), n);
    return check_launch("convert kernel");
}

cp_status launch_convert(state *s, void *dst, cp_dtype dt, const void *src, cp_dtype sdt, size_t n)
{
    if (((uintptr_t)dst | (uintptr_t)src) % 16 == 0) {
        if (sdt == CP_DTYPE_F32 && dt == CP_DTYPE_BF16)
            return launch_convert8<__nv_bfloat16, float>(s, dst, src, n);
        if (sdt == CP_DTYPE_F32 && dt == CP_DTYPE_F16)
            return launch_convert8<__half, float>(s, dst, src, n);
        if (sdt == CP_DTYPE_BF16 && dt == CP_DTYPE_F32)
            return launch_convert8<float, __nv_bfloat16>(s, dst, src, n);
        if (sdt == CP_DTYPE_F16 && dt == CP_DTYPE_F32)
            return launch_convert8<float, __half>(s, dst, src, n);
    }
    convert_kernel<<<grid_for(n, 256), 256, 0, s->stream>>>(dst, dt, src, sdt, n);
    return check_launch("convert kernel");
}

// g[h] = -sum over (b, i) of exp(sinks[h] - lse) * rows, rows whose LSE is
// -inf left out; a block per head, each thread a fixed stride of its rows,
// then a tree in shared memory: the order never changes.
constexpr int SG_THREADS = 256;

__global__ void __launch_bounds__(SG_THREADS) sink_grad_kernel(float *g, const float *sinks, const float *lse,
                                                               const float *rows, int64_t batch, int64_t seq,
                                                               int heads)
{
    __shared__ double part[SG_THREADS];
    const int h = blockIdx.x;
    const double sink = sinks[h];
    double sum = 0;
    for (int64_t e = threadIdx.x; e < batch * seq; e += SG_THREADS) {
        const int64_t b = e / seq, i = e - b * seq;
        const size_t at = ((size_t)b * (size_t)heads + (size_t)h) * (size_t)seq + (size_t)i;
        const float l = lse[at];
        if (l == -INFINITY)
            continue; // no key and no sink weight
        sum -= exp(sink - (double)l) * (double)rows[at];
    }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int w = SG_THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        g[h] = (float)part[0];
}

cp_status launch_sink_grad(state *s, float *g, const float *sinks, const float *lse, const float *rows,
                           int64_t batch, int64_t seq, int heads)
{
    sink_grad_kernel<<<(unsigned)heads, SG_THREADS, 0, s->stream>>>(g, sinks, lse, rows, batch, seq, heads);
    return check_launch("sink gradient kernel");
}

cp_status launch_reduce(state *s, void *acc, const void *x, cp_dtype t, size_t n, cp_reduce_op op)
{
    reduce_kernel<<<grid_for(n, 256), 256, 0, s->stream>>>(acc, x, t, n, op);
    return check_launch("reduce kernel");
}

cp_status launch_merge(state *s, const cp_kernel_merge_args *a)
{
    if (a->batch <= 0 || a->seq <= 0 || a->num_heads <= 0 || a->head_dim_v <= 0 || !a->o || !a->lse ||
        !a->o_part || !a->lse_part)
        return fail(CP_ERROR_INVALID_ARGUMENT,
                    "cuda merge: batch %lld, seq %lld, num_heads %d, head_dim_v %d (must be > 0), "
                    "o %p, lse %p, o_part %p, lse_part %p (must not be NULL)",
                    (long long)a->batch, (long long)a->seq, a->num_heads, a->head_dim_v, a->o, (void *)a->lse,
                    a->o_part, (const void *)a->lse_part);
    cp_kernel_merge_args m = *a;
    // Zero strides mean dense tensors of this shape (the core normally
    // resolves them already).
    const int64_t hd = (int64_t)m.num_heads * m.head_dim_v;
    auto dense = [&](int64_t *sb, int64_t *ss, int64_t *sh) {
        if (*sb || *ss || *sh)
            return;
        *sh = m.head_dim_v;
        if (m.format == CP_FORMAT_SBHD) {
            *sb = hd;
            *ss = m.batch * hd;
        } else {
            *ss = hd;
            *sb = m.seq * hd;
        }
    };
    dense(&m.o_stride_b, &m.o_stride_s, &m.o_stride_h);
    dense(&m.o_part_stride_b, &m.o_part_stride_s, &m.o_part_stride_h);
    if (!m.lse_stride_b && !m.lse_stride_h) {
        m.lse_stride_h = m.seq;
        m.lse_stride_b = m.num_heads * m.seq;
    }
    if (!m.lse_part_stride_b && !m.lse_part_stride_h) {
        m.lse_part_stride_h = m.seq;
        m.lse_part_stride_b = m.num_heads * m.seq;
    }
    const int64_t rows = m.batch * m.seq * m.num_heads;
    merge_kernel<<<grid_for((size_t)rows * 32, 256), 256, 0, s->stream>>>(m);
    return check_launch("merge kernel");
}

template <typename V>
cp_status copy_2d_as(state *s, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height)
{
    const size_t chunks = width / sizeof(V), total = chunks * height;
    copy_2d_kernel<V><<<grid_for((total + 3) / 4, 256), 256, 0, s->stream>>>(
        static_cast<char *>(dst), dpitch, static_cast<const char *>(src), spitch, chunks, total);
    return check_launch("copy kernel");
}

cp_status launch_copy_2d(state *s, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height)
{
    const uintptr_t a = (uintptr_t)dst | (uintptr_t)src | dpitch | spitch | width;
    if (a % 16 == 0)
        return copy_2d_as<uint4>(s, dst, dpitch, src, spitch, width, height);
    if (a % 4 == 0)
        return copy_2d_as<uint32_t>(s, dst, dpitch, src, spitch, width, height);
    return copy_2d_as<unsigned char>(s, dst, dpitch, src, spitch, width, height);
}

cp_status launch_drow(state *s, const attn_params &p)
{
    const int64_t rows = (int64_t)p.B * p.H * p.Sq;
    if (p.Dv % 8 == 0 && rows_16b(p.o, 8) && rows_16b(p.dout, 8)) {
        if (p.odt == CP_DTYPE_BF16)
            return launch_drow16<__nv_bfloat16>(s, p, rows);
        if (p.odt == CP_DTYPE_F16)
            return launch_drow16<__half>(s, p, rows);
    }
    drow_kernel<<<grid_for((size_t)rows * 32, 256), 256, 0, s->stream>>>(p);
    return check_launch("rowsum(dO * O) kernel");
}

} // namespace cu
