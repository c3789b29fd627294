// SPDX-License-Identifier: MIT
// Block attention entry points: normalise the arguments, pick one of the three
// paths, size and provide the workspace.
//
// Paths, in the order they are preferred:
//  - mma (attn_mma_fwd.cu, attn_mma_bwd.cu): fused flash-style kernels on
//    tensor cores (mma.sync m16n8k16, fp32 accumulation) for F16 / BF16 with
//    head dims up to 256 (64, 128, 256 natively; others are zero-padded to
//    the next of these); on Hopper (cc 9.0) the forward and the atomic
//    backward run on wgmma instead (attn_wgmma_fwd.cu, attn_wgmma_bwd.cu)
//    where those kernels fit;
//  - simt (attn_simt.cu): fused kernels in plain fp32 arithmetic, for F32
//    (exact: no TF32, accurate exponentials) and any head dim whose tiles fit
//    in shared memory;
//  - cublas (attn_blas.cu): GEMM + softmax + GEMM over chunks of query rows,
//    bounded memory; the fallback, and an independent reference for tests.
// API 1.1 calls (a rectangle list, a window or a softcap) take the rectangle
// kernels instead: attn_mma_rect.cu on tensor cores for F16 / BF16 and the
// SIMT kernels (which walk rectangles too) for F32 and the rest; attn_rect.cu
// builds the list and its tile indexes. The cuBLAS path takes none.
// INFINICP_CUDA_ATTN=mma|simt|cublas forces a path where it applies (mma:
// mma.sync also on Hopper), =wgmma the Hopper kernels where they fit; the
// other variables that pick a kernel variant are listed in knobs.cuh.
//
// FP8 (E4M3) forwards take the Hopper FP8 kernel (attn_wgmma_fp8.cu) where
// it fits, else the SIMT kernels.
//
// Workspace: the FP8 tensor-core forward needs V transposed and its guard's
// flag and bits; the 16-bit tensor-core forward needs the non-finite guard's
// (nonfinite.cu: a flag, a bit per key row and a copy of v; used only by
// calls with hidden pairs in a tile, sized for every call); the SIMT forward
// none. The backward needs one float per query row (rowsum(dO * O)); the
// cuBLAS path adds its chunk buffers, the mma backward with atomics (not
// deterministic) its fp32 dQ sums unless the grads are F32, and the
// tensor-core backward the guard's flag and row bits (last).
#include <cinttypes>
#include <cmath>

#include "common.cuh"

namespace cu {

cp_status make_params(const cp_kernel_attn_args *a, int backward, const char *func, attn_params *p)
{
    if (!a)
        return fail(CP_ERROR_INVALID_ARGUMENT, "%s: a is NULL", func);
    *p = attn_params();
    const bool fp8 = a->dtype == CP_DTYPE_FP8_E4M3;
    const bool storage_ok = a->dtype == CP_DTYPE_F32 || a->dtype == CP_DTYPE_F16 || a->dtype == CP_DTYPE_BF16;
    if (!storage_ok && !fp8)
        return fail(CP_ERROR_UNSUPPORTED, "%s: a->dtype = %d (the CUDA kernels take F32, F16, BF16 or FP8_E4M3)",
                    func, (int)a->dtype);
    // API 1.2: FP8 q, k, v for the forward, out in BF16 (or F32 partials)
    if (fp8 && backward)
        return fail(CP_ERROR_UNSUPPORTED, "%s: a->dtype = CP_DTYPE_FP8_E4M3 (FP8 attention is forward only)", func);
    if (fp8 && a->o_dtype != CP_DTYPE_BF16 && a->o_dtype != CP_DTYPE_F32)
        return fail(CP_ERROR_INVALID_ARGUMENT,
                    "%s: a->o_dtype = %d (with FP8_E4M3 inputs it must be CP_DTYPE_BF16 or CP_DTYPE_F32)", func,
                    (int)a->o_dtype);
    if (!fp8 && a->o_dtype != a->dtype && a->o_dtype != CP_DTYPE_F32)
        return fail(CP_ERROR_INVALID_ARGUMENT, "%s: a->o_dtype = %d (must be a->dtype or CP_DTYPE_F32)", func,
                    (int)a->o_dtype);
    if (backward && a->grad_dtype != a->dtype && a->grad_dtype != CP_DTYPE_F32)
        return fail(CP_ERROR_INVALID_ARGUMENT, "%s: a->grad_dtype = %d (must be a->dtype or CP_DTYPE_F32)", func,
                    (int)a->grad_dtype);
    if (a->batch <= 0 || a->batch > INT32_MAX || a->num_heads <= 0 || a->num_kv_heads <= 0 ||
        a->num_heads % a->num_kv_heads || a->head_dim <= 0 || a->head_dim_v < 0 || a->seq_q <= 0 ||
        a->seq_k <= 0)
        return fail(CP_ERROR_INVALID_ARGUMENT,
                    "%s: batch %" PRId64 ", num_heads %d, num_kv_heads %d, head_dim %d, head_dim_v %d, "
                    "seq_q %" PRId64 ", seq_k %" PRId64 " (sizes must be > 0, kv heads divide heads)",
                    func, a->batch, a->num_heads, a->num_kv_heads, a->head_dim, a->head_dim_v, a->seq_q, a->seq_k);
    p->B = (int)a->batch;
    p->H = a->num_heads;
    p->Hkv = a->num_kv_heads;
    p->G = p->H / p->Hkv;
    p->D = a->head_dim;
    p->Dv = a->head_dim_v ? a->head_dim_v : a->head_dim;
    p->Sq = a->seq_q;
    p->Sk = a->seq_k;
    p->delta = a->q_offset - a->k_offset;
    p->causal = a->mask == CP_MASK_CAUSAL;
    const double scale = a->softmax_scale != 0.0 ? a->softmax_scale : 1.0 / sqrt((double)a->head_dim);
    p->scale = (float)scale;
    p->c = (float)(scale * 1.4426950408889634);
    p->dt = a->dtype;
    p->odt = a->o_dtype;
    p->gdt = a->grad_dtype;
    p->accumulate = a->accumulate;
    p->lse_lo = a->accumulate ? a->lse_lo : nullptr;
    p->grad_accumulate = a->grad_accumulate;
    // API 1.1 (the core has checked the fields; see rect_upload)
    p->window = a->window;
    p->host_rects = a->rects;
    p->num_host_rects = a->rects ? a->num_rects : 0;
    p->q_pos = a->q_offset;
    p->k_pos = a->k_offset;
    if (a->softcap != 0) {
        p->softcap = 1;
        p->cap_in = (float)(scale / a->softcap);
        p->cap_out = (float)(a->softcap * 1.4426950408889634);
    }
    p->rects = a->rects || a->window || a->softcap != 0;
    p->qd = a->q_descale;
    p->kd = a->k_descale;
    p->vd = a->v_descale;
    p->dph = a->descale_per_head;

    const int64_t B = p->B;
    auto view = [&](const void *ptr, int64_t sb, int64_t ss, int64_t sh, int64_t S, int64_t H, int64_t D) {
        tensor t = {ptr, sb, ss, sh};
        if (!sb && !ss && !sh) {
            t.sh = D;
            if (a->format == CP_FORMAT_SBHD) {
                t.sb = H * D;
                t.ss = B * H * D;
            } else {
                t.ss = H * D;
                t.sb = S * H * D;
            }
        }
        return t;
    };
    p->q = view(a->q, a->q_stride_b, a->q_stride_s, a->q_stride_h, p->Sq, p->H, p->D);
    p->k = view(a->k, a->k_stride_b, a->k_stride_s, a->k_stride_h, p->Sk, p->Hkv, p->D);
    p->v = view(a->v, a->v_stride_b, a->v_stride_s, a->v_stride_h, p->Sk, p->Hkv, p->Dv);
    p->o = view(a->o, a->o_stride_b, a->o_stride_s, a->o_stride_h, p->Sq, p->H, p->Dv);
    p->lse = a->lse;
    p->lsb = a->lse_stride_b;
    p->lsh = a->lse_stride_h;
    if (!p->lsb && !p->lsh) {
        p->lsh = p->Sq;
        p->lsb = p->H * p->Sq;
    }
    if (backward) {
        p->dout = view(a->dout, a->dout_stride_b, a->dout_stride_s, a->dout_stride_h, p->Sq, p->H, p->Dv);
        p->dq = view(a->dq, a->dq_stride_b, a->dq_stride_s, a->dq_stride_h, p->Sq, p->H, p->D);
        p->dk = view(a->dk, a->dk_stride_b, a->dk_stride_s, a->dk_stride_h, p->Sk, p->Hkv, p->D);
        p->dv = view(a->dv, a->dv_stride_b, a->dv_stride_s, a->dv_stride_h, p->Sk, p->Hkv, p->Dv);
    }

    // 16-byte loads of whole head rows: aligned bases and strides, and head
    // dims of whole 16-byte chunks.
    const size_t es = a->dtype == CP_DTYPE_F32 ? 4 : fp8 ? 1 : 2;
    const int64_t per = (int64_t)(16 / es);
    auto aligned = [&](const tensor &t) { return rows_16b(t, per); };
    p->vec = p->D % per == 0 && p->Dv % per == 0 && aligned(p->q) && aligned(p->k) && aligned(p->v) &&
             (!backward || a->o_dtype != a->dtype || aligned(p->dout));
    return CP_SUCCESS;
}

namespace {

state *st(void *p)
{
    return static_cast<state *>(p);
}

// Whether the automatic choice takes the wgmma forward on Hopper (verified
// against FP64 on an H200: docs/notes/gpu-testing-runs.md, runs 7 and 9).
constexpr bool WGMMA_BY_DEFAULT = true;

bool use_wgmma(const state *s, const attn_params &p)
{
    return (s->knob.path == PATH_WGMMA || (s->knob.path == PATH_AUTO && WGMMA_BY_DEFAULT)) && wgmma_fits(s, p);
}

// The same for the backward (atomic variant only: deterministic = 1 keeps
// the mma.sync kernels; verified against FP64 on an H200:
// docs/notes/gpu-testing-runs.md, run 8).
constexpr bool WGMMA_BWD_BY_DEFAULT = true;

bool use_wgmma_bwd(const state *s, const attn_params &p)
{
    return (s->knob.path == PATH_WGMMA || (s->knob.path == PATH_AUTO && WGMMA_BWD_BY_DEFAULT)) &&
           wgmma_bwd_fits(s, p);
}

// Whether the SIMT kernels walk rectangle lists (else API 1.1 calls they
// would take are refused as unsupported).
constexpr bool SIMT_RECTS = true;

attn_path choose(const state *s, const attn_params &p, int backward)
{
    if (p.dt == CP_DTYPE_FP8_E4M3) { // API 1.2, forward only: Hopper's FP8 tensor cores, else SIMT
        if (backward)
            return PATH_AUTO;
        if (s->knob.path != PATH_SIMT && fp8_fits(s, p))
            return PATH_MMA;
        return simt_fits(s, p, 0) ? PATH_SIMT : PATH_AUTO;
    }
    if (p.rects) {
        // API 1.1: the rectangle kernels (mma.sync for 16-bit types, SIMT
        // for F32 and what the tensor-core tiles do not take)
        if (s->knob.path != PATH_SIMT && mma_rect_fits(s, p, backward))
            return PATH_MMA;
        return SIMT_RECTS && simt_fits(s, p, backward) ? PATH_SIMT : PATH_AUTO;
    }
    const bool mma = mma_fits(s, p, backward), simt = simt_fits(s, p, backward), blas = blas_fits(p, backward);
    if (s->knob.path == PATH_BLAS && blas)
        return PATH_BLAS;
    if (s->knob.path == PATH_SIMT && simt)
        return PATH_SIMT;
    if (mma)
        return PATH_MMA;
    if (simt)
        return PATH_SIMT;
    if (blas)
        return PATH_BLAS;
    return PATH_AUTO; // nothing fits
}

size_t drow_bytes(const attn_params &p)
{
    return round_up((size_t)p.B * (size_t)p.H * (size_t)p.Sq * sizeof(float));
}

// The tensor-core kernels of F16 / BF16 run the non-finite guard (nonfinite.cu).
bool guarded(const state *s, const attn_params &p, attn_path path)
{
    return s->knob.nf_guard && path == PATH_MMA && (p.dt == CP_DTYPE_F16 || p.dt == CP_DTYPE_BF16);
}

// Whether this call has hidden pairs inside a tile (only those leak): the
// workspace is sized without knowing, since a plan asks for its largest block
// without the rectangle list of each call.
bool hides_pairs(const attn_params &p)
{
    return p.causal || p.rects;
}

cp_status workspace_for(const state *s, const attn_params &p, int backward, attn_path path, size_t *bytes)
{
    size_t n = backward ? drow_bytes(p) : 0;
    if (path == PATH_BLAS)
        n += blas_workspace(p, backward);
    if (path == PATH_MMA && backward)
        n += p.rects ? mma_rect_bwd_workspace(s, p) : mma_bwd_workspace(s, p);
    if (path == PATH_MMA && p.dt == CP_DTYPE_FP8_E4M3)
        n += fp8_workspace(p); // V transposed, and the guard's flag and bits
    if (guarded(s, p, path)) // last: attn_backward finds it at n - this
        n += backward ? nf_backward_workspace(p) : nf_forward_workspace(p);
    *bytes = n;
    return CP_SUCCESS;
}

cp_status unsupported(const attn_params &p, const char *func)
{
    if (p.dt == CP_DTYPE_FP8_E4M3)
        return fail(CP_ERROR_UNSUPPORTED,
                    "%s: a->dtype = CP_DTYPE_FP8_E4M3 with head_dim %d, head_dim_v %d (the CUDA FP8 forward "
                    "runs on Hopper's FP8 tensor cores up to head dim 128, else on the SIMT kernels, whose "
                    "tiles must fit in shared memory)",
                    func, p.D, p.Dv);
    if (p.rects)
        return fail(CP_ERROR_UNSUPPORTED,
                    "%s: no CUDA path for rectangles, windows or softcaps with head_dim %d, head_dim_v %d, "
                    "dtype %d, o_dtype %d (the tensor-core kernels take F16 / BF16 up to head dim 256)",
                    func, p.D, p.Dv, (int)p.dt, (int)p.odt);
    return fail(CP_ERROR_UNSUPPORTED,
                "%s: no CUDA attention path for head_dim %d, head_dim_v %d with o_dtype %d (dtype %d)", func, p.D,
                p.Dv, (int)p.odt, (int)p.dt);
}

// The caller's workspace, or a stream-ordered one of our own.
struct scratch {
    void *base = nullptr;
    bool owned = false;
};

cp_status take_workspace(state *s, const cp_kernel_attn_args *a, size_t need, const char *func, scratch *w)
{
    if (need == 0)
        return CP_SUCCESS;
    if (a->workspace) {
        if (a->workspace_bytes < need)
            return fail(CP_ERROR_INVALID_ARGUMENT,
                        "%s: workspace_bytes = %zu (this call needs %zu; see cp_kernel_attn_workspace_size)", func,
                        a->workspace_bytes, need);
        w->base = a->workspace;
        return CP_SUCCESS;
    }
    cudaError_t e = cudaMallocAsync(&w->base, need, s->stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fail(CP_ERROR_OUT_OF_MEMORY, "%s: cudaMallocAsync of a %zu-byte workspace: %s", func, need,
                    cudaGetErrorString(e));
    }
    w->owned = true;
    return CP_SUCCESS;
}

cp_status release(state *s, scratch *w, cp_status r)
{
    if (w->owned) {
        cudaError_t e = cudaFreeAsync(w->base, s->stream);
        if (e != cudaSuccess && r == CP_SUCCESS)
            return cuda_fail("cudaFreeAsync", e);
    }
    return r;
}

} // namespace

cp_status attn_workspace_size(void *sp, const cp_kernel_attn_args *a, int backward, size_t *bytes)
{
    const char *func = "cp_kernel_attn_workspace_size";
    *bytes = 0;
    attn_params p;
    cp_status r = make_params(a, backward, func, &p);
    if (r != CP_SUCCESS)
        return r;
    attn_path path = choose(st(sp), p, backward);
    if (path == PATH_AUTO)
        return unsupported(p, func);
    return workspace_for(st(sp), p, backward, path, bytes);
}

cp_status attn_forward(void *sp, const cp_kernel_attn_args *a)
{
    const char *func = "cp_kernel_attn_forward";
    state *s = st(sp);
    attn_params p;
    cp_status r = make_params(a, 0, func, &p);
    if (r != CP_SUCCESS || (r = use_device(s)) != CP_SUCCESS)
        return r;
    attn_path path = choose(s, p, 0);
    if (path == PATH_AUTO)
        return unsupported(p, func);
    if (path == PATH_SIMT)
        return simt_forward(s, p);
    // the tensor-core kernels take the guard where a tile may hide pairs (its
    // workspace is all they need); where every pair is visible, none
    const bool guard = guarded(s, p, path) && hides_pairs(p);
    size_t need;
    workspace_for(s, p, 0, path, &need);
    if (path == PATH_MMA && !guard && p.dt != CP_DTYPE_FP8_E4M3)
        need = 0;
    scratch w;
    if ((r = take_workspace(s, a, need, func, &w)) != CP_SUCCESS)
        return r;
    if (path == PATH_BLAS)
        return release(s, &w, blas_forward(s, p, w.base));
    if (p.dt == CP_DTYPE_FP8_E4M3) // runs its guard itself
        return release(s, &w, fp8_forward(s, p, w.base));
    // the rectangle launchers run the guard themselves around their kernel
    // (it reads the list they upload)
    if (guard)
        p.nf_ws = w.base;
    if (p.rects) {
        r = use_wgmma(s, p) ? wgmma_forward(s, p) : mma_rect_forward(s, p);
    } else if ((r = nf_forward_begin(s, &p)) == CP_SUCCESS) {
        r = use_wgmma(s, p) ? wgmma_forward(s, p) : mma_forward(s, p);
        if (r == CP_SUCCESS)
            r = nf_forward_end(s, p);
    }
    return release(s, &w, r);
}

cp_status attn_backward(void *sp, const cp_kernel_attn_args *a)
{
    const char *func = "cp_kernel_attn_backward";
    state *s = st(sp);
    attn_params p;
    cp_status r = make_params(a, 1, func, &p);
    if (r != CP_SUCCESS || (r = use_device(s)) != CP_SUCCESS)
        return r;
    attn_path path = choose(s, p, 1);
    if (path == PATH_AUTO)
        return unsupported(p, func);
    size_t need;
    workspace_for(s, p, 1, path, &need);
    scratch w;
    if ((r = take_workspace(s, a, need, func, &w)) != CP_SUCCESS)
        return r;
    // rowsum(dO * O): the kernels read it where the caller keeps it
    // (a->drow, laid out like lse), computed into it first unless an earlier
    // call stored it there (a->drow_ready); without a->drow, or with
    // INFINICP_CUDA_DROW=0 (knob.drow_reuse, for comparison), it is computed
    // into a dense buffer at the start of the workspace.
    const bool caller = s->knob.drow_reuse && a->drow;
    p.drow = caller ? a->drow : static_cast<float *>(w.base);
    p.drb = caller ? p.lsb : (int64_t)p.H * p.Sq;
    p.drh = caller ? p.lsh : p.Sq;
    r = caller && a->drow_ready ? CP_SUCCESS : launch_drow(s, p);
    // the guard where a tile may hide pairs, in the workspace's last bytes;
    // the rectangle launcher runs it around its kernels (it reads the list)
    if (guarded(s, p, path) && hides_pairs(p))
        p.nf_ws = static_cast<char *>(w.base) + need - nf_backward_workspace(p);
    if (r == CP_SUCCESS) {
        if (path == PATH_MMA && p.rects) {
            r = mma_rect_backward(s, p, static_cast<char *>(w.base) + drow_bytes(p));
        } else if (path == PATH_MMA) {
            if ((r = nf_backward_begin(s, &p)) == CP_SUCCESS &&
                (r = mma_backward(s, p, static_cast<char *>(w.base) + drow_bytes(p), use_wgmma_bwd(s, p))) ==
                    CP_SUCCESS)
                r = nf_backward_end(s, p);
        } else if (path == PATH_SIMT)
            r = simt_backward(s, p);
        else
            r = blas_backward(s, p, static_cast<char *>(w.base) + drow_bytes(p));
    }
    return release(s, &w, r);
}

} // namespace cu
