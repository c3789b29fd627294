// SPDX-License-Identifier: MIT
// Unfused block attention through cuBLAS: for each (batch, head) and each
// chunk of C query rows, S = Q K^T (fp32), a softmax kernel, O = P V; the
// backward recomputes P from the LSE and forms dP = dO V^T, dS, then
// dV += P^T dO, dK += dS^T Q, dQ = dS K. Memory is bounded by the chunk
// (C x seq_k scores) plus one fp32 dK / dV accumulator of the key block.
//
// It shares no code with the fused kernels beyond argument handling, which
// makes it the independent GPU reference of the tests, and it takes any head
// dim. Probabilities and dS are rounded to the storage type after
// normalisation (exact for F32; cuBLAS runs F32 in pedantic fp32, no TF32).
#include <climits>
#include <cmath>

#include <cublas_v2.h>

#include "common.cuh"

namespace cu {
namespace {

// Scores per chunk: C * seq_k <= this many floats (32 MiB), C >= 1.
constexpr int64_t CHUNK_FLOATS = (int64_t)8 << 20;

size_t esize(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? 4 : 2;
}

int64_t chunk_rows(const attn_params &p)
{
    int64_t c = CHUNK_FLOATS / p.Sk;
    if (c < 1)
        c = 1;
    return c < p.Sq ? c : p.Sq;
}

// Workspace carving shared by sizing and use.
struct layout {
    float *S, *dP, *Oc, *dQc, *dKacc, *dVacc, *lsec;
    void *P, *dS;
    size_t bytes;
};

layout carve(const attn_params &p, int backward, void *base)
{
    layout l = {};
    char *at = static_cast<char *>(base);
    size_t off = 0;
    const size_t C = (size_t)chunk_rows(p), Sk = (size_t)p.Sk, es = esize(p.dt);
    auto take = [&](size_t bytes) {
        void *r = at ? at + off : nullptr;
        off += round_up(bytes);
        return r;
    };
    l.S = static_cast<float *>(take(C * Sk * 4));
    l.P = take(C * Sk * es);
    l.lsec = static_cast<float *>(take(C * 4));
    if (!backward) {
        l.Oc = static_cast<float *>(take(C * (size_t)p.Dv * 4));
    } else {
        l.dP = static_cast<float *>(take(C * Sk * 4));
        l.dS = take(C * Sk * es);
        l.dQc = static_cast<float *>(take(C * (size_t)p.D * 4));
        l.dKacc = static_cast<float *>(take(Sk * (size_t)p.D * 4));
        l.dVacc = static_cast<float *>(take(Sk * (size_t)p.Dv * 4));
    }
    l.bytes = off;
    return l;
}

// ---- kernels ----

__device__ float block_max(float x, float *red)
{
    for (int m = 16; m; m >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = x;
    __syncthreads();
    x = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        x = fmaxf(x, red[w]);
    return x;
}

__device__ float block_sum(float x, float *red)
{
    for (int m = 16; m; m >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, m);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = x;
    __syncthreads();
    x = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        x += red[w];
    return x;
}

// One block per chunk row: P = softmax of the masked, scaled scores (in the
// storage type), and the row's natural-log LSE (-inf, P = 0 if no key).
__global__ void softmax_kernel(attn_params p, int64_t r0, const float *S, void *P, float *lsec)
{
    __shared__ float red[32];
    const int64_t i = blockIdx.x, qi = r0 + i;
    const int64_t nvis = visible_keys(p, qi);
    const float *srow = S + i * p.Sk;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < nvis; j += blockDim.x)
        mx = fmaxf(mx, srow[j] * p.c);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < nvis; j += blockDim.x)
        sum += exp2f(srow[j] * p.c - mx);
    sum = block_sum(sum, red);
    // sum is NaN after a NaN score (or inf - inf): not a row without keys
    const float lse2 = sum != 0.0f ? mx + log2f(sum) : INFINITY;
    for (int64_t j = threadIdx.x; j < p.Sk; j += blockDim.x)
        st_f(P, p.dt, i * p.Sk + j, j < nvis ? exp2f(srow[j] * p.c - lse2) : 0.0f);
    if (threadIdx.x == 0)
        lsec[i] = sum != 0.0f ? lse2 * LN2 : -INFINITY;
}

// One warp per chunk row: write (or merge) the chunk's normalised output.
__global__ void fwd_store_kernel(attn_params p, int64_t b, int h, int64_t r0, int64_t rows, const float *Oc,
                                 const float *lsec)
{
    const int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (i >= rows)
        return;
    const int64_t qi = r0 + i;
    const int64_t li = b * p.lsb + h * p.lsh + qi;
    float w1 = 0.0f, w2 = 1.0f;
    double merged = lsec[i];
    const bool add = !p.accumulate || merge_weights(p.lse[li], lse_lo_at(p, li), lsec[i], &w1, &w2, &merged);
    __syncwarp();
    if (!add)
        return;
    const int64_t o = at(p.o, b, qi, h);
    for (int d = lane; d < p.Dv; d += 32)
        store_merged(const_cast<void *>(p.o.p), p.odt, o + d, Oc[i * p.Dv + d], w1, w2);
    if (lane == 0)
        store_lse(p, li, merged);
}

// Element-wise backward of a chunk: P from the LSE, dS = scale P (dP - D).
__global__ void bwd_elem_kernel(attn_params p, int64_t b, int h, int64_t r0, const float *S, const float *dP,
                                void *P, void *dS)
{
    const int64_t i = blockIdx.x, qi = r0 + i;
    const int64_t nvis = visible_keys(p, qi);
    const float lse2 = lse2_of(p.lse[b * p.lsb + h * p.lsh + qi]);
    const float dr = p.drow[b * p.drb + h * p.drh + qi];
    for (int64_t j = threadIdx.x; j < p.Sk; j += blockDim.x) {
        const int64_t e = i * p.Sk + j;
        const float pv = j < nvis ? exp2f(S[e] * p.c - lse2) : 0.0f;
        st_f(P, p.dt, e, pv);
        st_f(dS, p.dt, e, j < nvis ? p.scale * pv * (dP[e] - dr) : 0.0f); // a hidden dP may be NaN
    }
}

// dst rows [r0, r0 + rows) of head h (+)= src (fp32, row pitch ld).
__global__ void store_rows_kernel(tensor dst, cp_dtype t, int64_t b, int h, int64_t r0, int64_t rows, int cols,
                                  const float *src, int accumulate)
{
    const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= rows * cols)
        return;
    const int64_t i = e / cols;
    const int d = (int)(e - i * cols);
    store_grad(const_cast<void *>(dst.p), t, at(dst, b, r0 + i, h) + d, src[e], accumulate);
}

// ---- host side ----

cp_status blas_fail(const char *what, cublasStatus_t e)
{
    return fail(CP_ERROR_BACKEND, "cuda: cuBLAS %s: %s", what, cublasGetStatusString(e));
}

cp_status handle(state *s, cublasHandle_t *h)
{
    cublasStatus_t e;
    if (!s->blas) {
        cublasHandle_t nh;
        if ((e = cublasCreate(&nh)) != CUBLAS_STATUS_SUCCESS)
            return blas_fail("cublasCreate", e);
        s->blas = nh;
    }
    *h = static_cast<cublasHandle_t>(s->blas);
    if ((e = cublasSetStream(*h, s->stream)) != CUBLAS_STATUS_SUCCESS)
        return blas_fail("cublasSetStream", e);
    return CP_SUCCESS;
}

struct gemm_env {
    cublasHandle_t h;
    cudaDataType io;
    cublasComputeType_t compute;
};

// Column-major C (m x n, ldc) = op(A) op(B) + beta C, A and B of type io.
cp_status gemm(const gemm_env &g, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
               const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    const float alpha = 1.0f;
    cublasStatus_t e = cublasGemmEx(g.h, ta, tb, (int)m, (int)n, (int)k, &alpha, A, g.io, (int)lda, B, g.io, (int)ldb,
                                    &beta, C, CUDA_R_32F, (int)ldc, g.compute, CUBLAS_GEMM_DEFAULT);
    return e == CUBLAS_STATUS_SUCCESS ? CP_SUCCESS : blas_fail("cublasGemmEx", e);
}

cp_status env_for(state *s, const attn_params &p, gemm_env *g)
{
    g->io = p.dt == CP_DTYPE_BF16 ? CUDA_R_16BF : p.dt == CP_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
    g->compute = p.dt == CP_DTYPE_F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    return handle(s, &g->h);
}

const void *row_ptr(const tensor &t, cp_dtype dt, int64_t b, int64_t s, int64_t h)
{
    return static_cast<const char *>(t.p) + (size_t)(b * t.sb + s * t.ss + h * t.sh) * esize(dt);
}

unsigned blocks_for(int64_t n, int threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

} // namespace

bool blas_fits(const attn_params &p, int backward)
{
    auto fits = [](const tensor &t, int dim) { return t.ss >= dim && t.ss <= INT_MAX; };
    if (p.dt != CP_DTYPE_F32 && p.dt != CP_DTYPE_F16 && p.dt != CP_DTYPE_BF16)
        return false; // FP8 (API 1.2) takes the SIMT kernels
    if (p.Sk > INT_MAX / 2 || p.Sq > INT_MAX / 2 || !fits(p.q, p.D) || !fits(p.k, p.D) || !fits(p.v, p.Dv))
        return false;
    if (p.B > INT_MAX || (int64_t)p.Sk * p.D > (int64_t)1 << 40)
        return false;
    // dO must have the type of V to be a GEMM operand with it
    return !backward || (p.odt == p.dt && fits(p.dout, p.Dv));
}

size_t blas_workspace(const attn_params &p, int backward)
{
    return carve(p, backward, nullptr).bytes;
}

cp_status blas_forward(state *s, const attn_params &p, void *ws)
{
    gemm_env g;
    cp_status r = env_for(s, p, &g);
    if (r != CP_SUCCESS)
        return r;
    const layout w = carve(p, 0, ws);
    const int64_t C = chunk_rows(p);
    for (int64_t b = 0; b < p.B; b++)
        for (int h = 0; h < p.H; h++) {
            const int hk = h / p.G;
            const void *K = row_ptr(p.k, p.dt, b, 0, hk), *V = row_ptr(p.v, p.dt, b, 0, hk);
            for (int64_t r0 = 0; r0 < p.Sq; r0 += C) {
                const int64_t rows = p.Sq - r0 < C ? p.Sq - r0 : C;
                // S^T (Sk x rows, column-major) = K Q^T
                if ((r = gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, p.Sk, rows, p.D, K, p.k.ss,
                              row_ptr(p.q, p.dt, b, r0, h), p.q.ss, 0.0f, w.S, p.Sk)) != CP_SUCCESS)
                    return r;
                softmax_kernel<<<(unsigned)rows, 256, 0, s->stream>>>(p, r0, w.S, w.P, w.lsec);
                // O^T (Dv x rows) = V^T P^T
                if ((r = check_launch("softmax kernel (cublas path)")) != CP_SUCCESS ||
                    (r = gemm(g, CUBLAS_OP_N, CUBLAS_OP_N, p.Dv, rows, p.Sk, V, p.v.ss, w.P, p.Sk, 0.0f, w.Oc,
                              p.Dv)) != CP_SUCCESS)
                    return r;
                fwd_store_kernel<<<blocks_for(rows * 32, 256), 256, 0, s->stream>>>(p, b, h, r0, rows, w.Oc,
                                                                                   w.lsec);
                if ((r = check_launch("output kernel (cublas path)")) != CP_SUCCESS)
                    return r;
            }
        }
    return CP_SUCCESS;
}

cp_status blas_backward(state *s, const attn_params &p, void *ws)
{
    gemm_env g;
    cp_status r = env_for(s, p, &g);
    if (r != CP_SUCCESS)
        return r;
    const layout w = carve(p, 1, ws);
    const int64_t C = chunk_rows(p);
    cudaError_t e;
    for (int64_t b = 0; b < p.B; b++)
        for (int hk = 0; hk < p.Hkv; hk++) {
            const void *K = row_ptr(p.k, p.dt, b, 0, hk), *V = row_ptr(p.v, p.dt, b, 0, hk);
            if ((e = cudaMemsetAsync(w.dKacc, 0, (size_t)p.Sk * p.D * 4, s->stream)) != cudaSuccess ||
                (e = cudaMemsetAsync(w.dVacc, 0, (size_t)p.Sk * p.Dv * 4, s->stream)) != cudaSuccess)
                return cuda_fail("cudaMemsetAsync", e);
            for (int h = hk * p.G; h < (hk + 1) * p.G; h++)
                for (int64_t r0 = 0; r0 < p.Sq; r0 += C) {
                    const int64_t rows = p.Sq - r0 < C ? p.Sq - r0 : C;
                    const void *Q = row_ptr(p.q, p.dt, b, r0, h), *dO = row_ptr(p.dout, p.odt, b, r0, h);
                    if ((r = gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, p.Sk, rows, p.D, K, p.k.ss, Q, p.q.ss, 0.0f, w.S,
                                  p.Sk)) != CP_SUCCESS ||
                        (r = gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, p.Sk, rows, p.Dv, V, p.v.ss, dO, p.dout.ss, 0.0f,
                                  w.dP, p.Sk)) != CP_SUCCESS)
                        return r;
                    bwd_elem_kernel<<<(unsigned)rows, 256, 0, s->stream>>>(p, b, h, r0, w.S, w.dP, w.P, w.dS);
                    if ((r = check_launch("backward kernel (cublas path)")) != CP_SUCCESS)
                        return r;
                    // dV^T (Dv x Sk) += dO^T P ; dK^T (D x Sk) += Q^T dS ; dQ^T (D x rows) = K^T dS^T
                    if ((r = gemm(g, CUBLAS_OP_N, CUBLAS_OP_T, p.Dv, p.Sk, rows, dO, p.dout.ss, w.P, p.Sk, 1.0f,
                                  w.dVacc, p.Dv)) != CP_SUCCESS ||
                        (r = gemm(g, CUBLAS_OP_N, CUBLAS_OP_T, p.D, p.Sk, rows, Q, p.q.ss, w.dS, p.Sk, 1.0f,
                                  w.dKacc, p.D)) != CP_SUCCESS ||
                        (r = gemm(g, CUBLAS_OP_N, CUBLAS_OP_N, p.D, rows, p.Sk, K, p.k.ss, w.dS, p.Sk, 0.0f,
                                  w.dQc, p.D)) != CP_SUCCESS)
                        return r;
                    store_rows_kernel<<<blocks_for(rows * p.D, 256), 256, 0, s->stream>>>(
                        p.dq, p.gdt, b, h, r0, rows, p.D, w.dQc, p.grad_accumulate);
                    if ((r = check_launch("dQ store kernel (cublas path)")) != CP_SUCCESS)
                        return r;
                }
            store_rows_kernel<<<blocks_for(p.Sk * p.D, 256), 256, 0, s->stream>>>(p.dk, p.gdt, b, hk, 0, p.Sk, p.D,
                                                                                  w.dKacc, p.grad_accumulate);
            store_rows_kernel<<<blocks_for(p.Sk * p.Dv, 256), 256, 0, s->stream>>>(
                p.dv, p.gdt, b, hk, 0, p.Sk, p.Dv, w.dVacc, p.grad_accumulate);
            if ((r = check_launch("dK / dV store kernel (cublas path)")) != CP_SUCCESS)
                return r;
        }
    return CP_SUCCESS;
}

} // namespace cu
