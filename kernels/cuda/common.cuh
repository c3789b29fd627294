// SPDX-License-Identifier: MIT
// Shared by every translation unit of the CUDA backend module: the per-context
// state, error reporting through the core, the normalised attention problem
// that all three attention paths take, and small device helpers.
#ifndef INFINICP_KERNELS_CUDA_COMMON_CUH
#define INFINICP_KERNELS_CUDA_COMMON_CUH

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <infinicp/backend.h>

#include "knobs.cuh"

namespace cu {

// The core's services, handed to cp_backend_module_v1.
extern const cp_module_host *host;
// This module's backend table (the NCCL transport checks buffers against it).
const cp_backend_ops *ops();

// Record cp_last_error() text through the core and return s.
cp_status fail(cp_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// A failed CUDA runtime call: CP_ERROR_BACKEND with the runtime's message, or
// CP_ERROR_NOT_FOUND (saying what to install) when there is no driver or GPU.
cp_status cuda_fail(const char *what, cudaError_t e);
// After kernel launches: the launch error, if any.
cp_status check_launch(const char *what);

// Streams a state can put work on (backend.h, stream_select): index 0 is the
// context's stream, 1..MAX_STREAMS-1 are created on first use.
constexpr int MAX_STREAMS = 8;
// Work counters for persistent kernels, taken in turn by the launches: two
// launches running at once (on different streams) must not share one, so
// this bounds how many may overlap.
constexpr int SCHED_SLOTS = 64;

// Attention path, forced by INFINICP_CUDA_ATTN (state::knob.path, knobs.cuh).
// PATH_WGMMA is the mma path with the Hopper forward and backward kernels
// where they fit (what PATH_AUTO picks when WGMMA_BY_DEFAULT /
// WGMMA_BWD_BY_DEFAULT); PATH_MMA keeps mma.sync.
enum attn_path { PATH_AUTO = 0, PATH_MMA = 1, PATH_SIMT = 2, PATH_BLAS = 3, PATH_WGMMA = 4 };

// knob.nf_guard: 0 off, 1 on, NF_SCAN_ONLY the scans and patches without the
// kernels' cleaning (nonfinite.cu; for measuring).
constexpr int NF_SCAN_ONLY = 2;

struct state {
    int device;
    cudaStream_t user;                // the context's stream (stream 0)
    cudaStream_t stream;              // where work goes now
    int current;                      // index of `stream`
    cudaStream_t aux[MAX_STREAMS];    // [1..] created on first use
    void *blas;                       // cublasHandle_t, created on first use
    knobs knob;                       // the environment's settings, read when the context opens
    int sm_count;
    int smem_optin;                   // bytes of shared memory a block may opt into
    int cc;                           // compute capability, major * 10 + minor
    int deterministic;                // backward bitwise reproducible (no atomics); 0 = fastest
    int *sched;                       // SCHED_SLOTS work counters of persistent kernels, 0 between launches
    unsigned sched_next;              // the slot the next launch takes
    void *rect_stage;                 // pinned staging of rectangle lists (attn_rect.cu), made on first use
};

// The work counter of the next persistent launch (slots in turn: SCHED_SLOTS).
inline int *take_sched(state *s)
{
    return s->sched + s->sched_next++ % SCHED_SLOTS;
}

// Make the state's device current on the calling thread.
cp_status use_device(state *s);

// ---------------------------------------------------------------------------
// The attention problem, normalised once on the host and passed by value to
// every kernel. Strides are in elements; element (b, s, h, d) of a tensor is
// at p + b*sb + s*ss + h*sh + d.

struct tensor {
    const void *p;
    int64_t sb, ss, sh;
};

// Whether t's head rows allow 16-byte accesses: its base on 16 bytes and its
// strides multiples of `per`, the elements in 16 bytes.
inline bool rows_16b(const tensor &t, int64_t per)
{
    return (uintptr_t)t.p % 16 == 0 && t.sb % per == 0 && t.ss % per == 0 && t.sh % per == 0;
}

// Threads a row of `chunks` 16-byte chunks for the kernels that give a row
// to a group of threads: the power of two in [4, 32] that covers them where
// it can (a thread then takes chunk c, c + TPR, ...).
inline int threads_per_row(int chunks)
{
    return chunks > 16 ? 32 : chunks > 8 ? 16 : chunks > 4 ? 8 : 4;
}

// ---------------------------------------------------------------------------
// API 1.1: windows, softcaps and rectangle lists.
//
// A rectangle of the block in rows with its band, as the CPU kernels keep it
// (kernels/cpu/attention.c, rect): query row q0 + t sees the key rows
// k0 + [t + a_lo, t + a_hi), key row k0 + u is seen by the query rows
// q0 + [u + b_lo, u + b_hi), each clamped to the rectangle. The bounds are
// saturated at INT64_MIN / INT64_MAX where a side has none.
struct band {
    int64_t q0, q1, k0, k1;
    int64_t a_lo, a_hi, b_lo, b_hi;
};

// clamp(t + a, 0, n) for 0 <= t, 0 <= n and any a, without overflow.
__host__ __device__ inline int64_t clamp_add(int64_t t, int64_t a, int64_t n)
{
    if (a >= n - t)
        return n;
    return t + a < 0 ? 0 : t + a;
}

// Key rows [*lo, *hi) of r that query row i (q0 <= i < q1) sees; lo <= hi.
__host__ __device__ inline void band_keys(const band &r, int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t n = r.k1 - r.k0, t = i - r.q0;
    *lo = r.k0 + clamp_add(t, r.a_lo, n);
    *hi = r.k0 + clamp_add(t, r.a_hi, n);
}

// Query rows [*lo, *hi) of r that see key row j (k0 <= j < k1); lo <= hi.
__host__ __device__ inline void band_queries(const band &r, int64_t j, int64_t *lo, int64_t *hi)
{
    const int64_t n = r.q1 - r.q0, u = j - r.k0;
    *lo = r.q0 + clamp_add(u, r.b_lo, n);
    *hi = r.q0 + clamp_add(u, r.b_hi, n);
}

// Tiles of `tile` rows (query rows or key rows) and the bands that meet
// them: tile t's are ids[start[t] .. start[t + 1]); order lists every tile,
// the most work first (the launch order: a block takes order[x]).
struct tile_index {
    const int *start, *ids, *order;
    int tile, ntiles;
};

// Block or item x of a launch over an index's tiles for `heads` heads: the
// tiles fastest, in the index's order (most work first), then the heads.
// Blocks that run together then read the rows of one head, which they share
// in L2; with the heads fastest, they read a different (document, head)'s
// rows each, from memory.
struct tile_head {
    int tile, h;
};

__device__ __forceinline__ tile_head tile_head_at(const tile_index &t, int x)
{
    const int h = x / t.ntiles;
    return tile_head{t.order[x - h * t.ntiles], h};
}

// The rectangle list of a call on the device (rect_upload, attn_rect.cu).
struct rect_set {
    const band *bands;
    int nbands;
    tile_index by_q; // query tiles (forward, deterministic dQ)
    tile_index by_k; // key tiles (dK / dV)
};

struct attn_params {
    tensor q, k, v, o, dout, dq, dk, dv;
    float *lse;
    float *lse_lo;      // forward accumulate: the running LSE's rounding residual, laid out like lse; or NULL
    int64_t lsb, lsh;   // LSE element (b, h, s) at lse + b*lsb + h*lsh + s
    int B, H, Hkv, G;   // G = H / Hkv query heads per kv head
    int D, Dv;          // head dims of q/k and v/o
    int64_t Sq, Sk;
    int64_t delta;      // q_offset - k_offset: key j is visible to query i iff j <= i + delta
    int causal;
    float scale;        // softmax scale
    float c;            // scale * log2(e): scores are kept in base 2
    cp_dtype dt, odt, gdt;
    int accumulate, grad_accumulate;
    // Backward: rowsum(dO * O) of row (b, h, s) at drow + b*drb + h*drh + s:
    // the caller's cp_kernel_attn_args.drow (laid out like lse), or a dense
    // [B][H][Sq] buffer in the workspace.
    float *drow;
    int64_t drb, drh;
    int vec;            // q, k, v (and dout) allow 16-byte loads of head rows
    // Backward with atomics (mma path, deterministic = 0): the fp32 tensor dq
    // is summed into (dq itself for F32 grads, else a workspace buffer), the
    // columns it has (D, or D rounded up to 4 in the workspace), and whether
    // its rows allow 16-byte vector reductions.
    tensor dqa;
    int dqa_cols, dqa_vec;
    // API 1.1. rects: the call takes the rectangle kernels (a list, or the
    // block as one rectangle with a window or softcap); rs is filled by
    // rect_upload. With a softcap c the base-2 score is cap_out * tanh(s *
    // cap_in) (cap_in = scale / c, cap_out = c log2 e).
    int rects;
    int64_t window;
    const cp_attn_rect *host_rects; // the caller's list (host memory), or NULL
    int64_t num_host_rects;
    int64_t q_pos, k_pos;           // the block's positions without a list
    int softcap;
    float cap_in, cap_out;
    rect_set rs;
    // API 1.2 (FP8 forward, SIMT path): the stored value times its descale
    // is the real one; NULL = 1; per head (dph) or one float each.
    const float *qd, *kd, *vd;
    int dph;
    // The tensor-core forward's guard against non-finite values (nonfinite.cu):
    // *vflag set on the device when v holds one; the kernels then read vs,
    // v with those values as 0 (v_of). NULL: no guard (v is read as is).
    const int *vflag;
    tensor vs;
    void *nf_ws; // the guard's workspace (nf_forward_begin / nf_backward_begin), or NULL: no guard
    // The backward's guard (nonfinite.cu): *bflag set on the device when q,
    // k, v, dout, lse or rowsum(dO * O) hold a non-finite value in a row the
    // call reads; the kernels then turn the non-finite values of every q, k,
    // v and dout tile they load, and every non-finite rowsum, into +0
    // (nf_clean*). NULL: no guard.
    const int *bflag;
};

// The values the forward's kernels multiply by P: v, or its sanitised copy
// when the guard found a non-finite value in it (nonfinite.cu).
__device__ __forceinline__ tensor v_of(const attn_params &p)
{
    return p.vflag && *p.vflag ? p.vs : p.v;
}

// The guard's key-row bits (nonfinite.cu): a 32-bit word per 32 key rows of
// each (batch, kv head), [B][Hkv][nf_key_words]; nf_mark_key raises the
// flag and the bit of key row j (the forward's scan, and the FP8 forward's
// transposed copy of v).
__host__ __device__ inline int64_t nf_key_words(const attn_params &p)
{
    return (p.Sk + 31) / 32;
}

__device__ __forceinline__ void nf_mark_key(const attn_params &p, int *flag, uint32_t *bits, int64_t b, int hk,
                                            int64_t j)
{
    *flag = 1;
    atomicOr(bits + (b * p.Hkv + hk) * nf_key_words(p) + j / 32, 1u << (j % 32));
}

// Whether the backward's kernels pass their tiles over (p.bflag set and
// flagged; the guard's scan has run before them, in stream order). Kernels
// whose loops have no register to spare read it again at each tile.
__device__ __forceinline__ bool nf_on(const attn_params &p)
{
    return p.bflag && *p.bflag;
}

// 16-bit storage: whether the value with bits x is not finite (exponent all
// ones), and a word of two such values with the non-finite ones as +0.
template <typename T>
constexpr uint32_t EXP16 = std::is_same<T, __half>::value ? 0x7c00u : 0x7f80u;

template <typename T>
__device__ __forceinline__ uint32_t finite2(uint32_t w)
{
    constexpr uint32_t E = EXP16<T>;
    const uint32_t lo = (w & E) == E ? 0u : w & 0xffffu, hi = ((w >> 16) & E) == E ? 0u : w >> 16;
    return lo | hi << 16;
}

template <typename T>
__device__ __forceinline__ uint4 finite8(uint4 x)
{
    return make_uint4(finite2<T>(x.x), finite2<T>(x.y), finite2<T>(x.z), finite2<T>(x.w));
}

// A float, or +0 where it is not finite (a rowsum(dO * O) the guard clears).
__device__ __forceinline__ float finite_or_0(float x)
{
    return isfinite(x) ? x : 0.0f;
}

// The backward guard's pass over `chunks` 16-byte chunks of 16-bit values at
// s in shared memory (thread tid of nt): non-finite values become +0. The
// caller synchronises before and after.
template <typename T>
__device__ __forceinline__ void nf_clean(void *s, int chunks, int tid, int nt)
{
    uint4 *c = static_cast<uint4 *>(s);
#pragma unroll 1
    for (int e = tid; e < chunks; e += nt)
        c[e] = finite8<T>(c[e]);
}

// A tensor's descale for head h (query head for q, kv head for k and v).
__host__ __device__ inline float descale(const float *d, int per_head, int h)
{
    return d ? d[per_head ? h : 0] : 1.0f;
}

// Whether key row j lies in a band of the list [bs, be) of p.rs.by_k. A key
// tile's rows outside every band may be memory nobody wrote (a CP ring
// carries only the rows that some later holder sees): the key-tile kernels
// zero them after loading, so that a dS of 0 times them stays 0, and the
// forward's non-finite guard scans only rows in a band.
__device__ __forceinline__ bool key_in_bands(const attn_params &p, int bs, int be, int64_t j)
{
    for (int bi = bs; bi < be; bi++) {
        const band &r = p.rs.bands[p.rs.by_k.ids[bi]];
        if (j >= r.k0 && j < r.k1)
            return true;
    }
    return false;
}

// Fill p from a (defaults resolved as the core does; checks what the kernels
// rely on). func names the entry point in messages.
cp_status make_params(const cp_kernel_attn_args *a, int backward, const char *func, attn_params *p);

// Keys [0, n) of the block are the ones query row i may see.
__host__ __device__ inline int64_t visible_keys(const attn_params &p, int64_t i)
{
    if (!p.causal)
        return p.Sk;
    int64_t n = i + p.delta + 1;
    return n < 0 ? 0 : (n > p.Sk ? p.Sk : n);
}

// First query row that sees key j (Sq if none).
__host__ __device__ inline int64_t first_query(const attn_params &p, int64_t j)
{
    if (!p.causal)
        return 0;
    int64_t i = j - p.delta;
    return i < 0 ? 0 : (i > p.Sq ? p.Sq : i);
}

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------
// Device helpers.

// One element of a storage type to float and back (to nearest even).
__device__ __forceinline__ float get_f(float v) { return v; }
__device__ __forceinline__ float get_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float get_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float get_f(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
__device__ __forceinline__ void put_f(float &d, float v) { d = v; }
__device__ __forceinline__ void put_f(__half &d, float v) { d = __float2half_rn(v); }
__device__ __forceinline__ void put_f(__nv_bfloat16 &d, float v) { d = __float2bfloat16_rn(v); }
__device__ __forceinline__ void put_f(__nv_fp8_e4m3 &d, float v) { d = __nv_fp8_e4m3(v); } // to nearest, saturating

// The same for an element of a runtime dtype.
__device__ __forceinline__ float ld_f(const void *p, cp_dtype t, int64_t i)
{
    switch (t) {
    case CP_DTYPE_F16: return get_f(static_cast<const __half *>(p)[i]);
    case CP_DTYPE_BF16: return get_f(static_cast<const __nv_bfloat16 *>(p)[i]);
    case CP_DTYPE_FP8_E4M3: return get_f(static_cast<const __nv_fp8_e4m3 *>(p)[i]);
    case CP_DTYPE_F64: return (float)static_cast<const double *>(p)[i];
    default: return static_cast<const float *>(p)[i];
    }
}

__device__ __forceinline__ void st_f(void *p, cp_dtype t, int64_t i, float v)
{
    switch (t) {
    case CP_DTYPE_F16: put_f(static_cast<__half *>(p)[i], v); break;
    case CP_DTYPE_BF16: put_f(static_cast<__nv_bfloat16 *>(p)[i], v); break;
    case CP_DTYPE_FP8_E4M3: put_f(static_cast<__nv_fp8_e4m3 *>(p)[i], v); break;
    case CP_DTYPE_F64: static_cast<double *>(p)[i] = v; break;
    default: static_cast<float *>(p)[i] = v; break;
    }
}

__device__ __forceinline__ int64_t at(const tensor &t, int64_t b, int64_t s, int64_t h)
{
    return b * t.sb + s * t.ss + h * t.sh;
}

// Base-2 LSE of a row for recomputing probabilities: +inf for a row that sees
// no key, so that 2^(s - lse2) = 0 there (the CPU kernels do the same).
__device__ __forceinline__ float lse2_of(float lse)
{
    return lse == -INFINITY ? INFINITY : lse * LOG2E;
}

// Merge one element-row's weights: (o, lse) <- merge((o, lse), (x, lse_x)),
// exactly as the CPU backend (weights in double, the row in fp32). Returns
// false when x contributes nothing (lse_x = -inf); sets *w1 = 0 when the
// running result is empty (lse = -inf), so o's old value is never read.
__device__ __forceinline__ bool merge_weights(float lse, float lse_lo, double lse_x, float *w1, float *w2,
                                              double *merged)
{
    if (lse_x == -INFINITY)
        return false;
    if (lse == -INFINITY) {
        *w1 = 0.0f;
        *w2 = 1.0f;
        *merged = lse_x;
        return true;
    }
    const double l1 = (double)lse + (double)lse_lo;
    double mx = l1 > lse_x ? l1 : lse_x;
    double m = mx + log(exp(l1 - mx) + exp(lse_x - mx));
    *w1 = (float)exp(l1 - m);
    *w2 = (float)exp(lse_x - m);
    *merged = m;
    return true;
}

// Store a (running) LSE: the float nearest to v, and its residual where the
// caller keeps one, so that a chain of merges rounds once.
__device__ __forceinline__ void store_lse(const attn_params &p, int64_t idx, double v)
{
    const float hi = (float)v;
    p.lse[idx] = hi;
    if (p.lse_lo)
        p.lse_lo[idx] = v == -INFINITY ? 0.0f : (float)(v - (double)hi);
}

// The running LSE's residual at idx (0 without one).
__device__ __forceinline__ float lse_lo_at(const attn_params &p, int64_t idx)
{
    return p.lse_lo ? p.lse_lo[idx] : 0.0f;
}

// Store one output value: o = v (accumulate 0), o += v (grads), or the merged
// value w1 * o + w2 * v with w1 = 0 meaning "do not read o".
__device__ __forceinline__ void store_merged(void *o, cp_dtype t, int64_t i, float v, float w1, float w2)
{
    float old = w1 != 0.0f ? ld_f(o, t, i) : 0.0f;
    st_f(o, t, i, w1 != 0.0f ? w1 * old + w2 * v : w2 * v);
}

// Elements i, i + 1 of a BF16 (bf) or F16 tensor, 4-byte aligned, as
// store_merged does each.
__device__ __forceinline__ void store_merged2(void *o, bool bf, int64_t i, float v0, float v1, float w1, float w2)
{
    if (bf) {
        __nv_bfloat162 *q = reinterpret_cast<__nv_bfloat162 *>(static_cast<__nv_bfloat16 *>(o) + i);
        const float2 old = w1 != 0.0f ? __bfloat1622float2(*q) : make_float2(0.0f, 0.0f);
        *q = __floats2bfloat162_rn(w1 != 0.0f ? w1 * old.x + w2 * v0 : w2 * v0, w1 != 0.0f ? w1 * old.y + w2 * v1 : w2 * v1);
    } else {
        __half2 *q = reinterpret_cast<__half2 *>(static_cast<__half *>(o) + i);
        const float2 old = w1 != 0.0f ? __half22float2(*q) : make_float2(0.0f, 0.0f);
        *q = __floats2half2_rn(w1 != 0.0f ? w1 * old.x + w2 * v0 : w2 * v0, w1 != 0.0f ? w1 * old.y + w2 * v1 : w2 * v1);
    }
}

__device__ __forceinline__ void store_grad(void *o, cp_dtype t, int64_t i, float v, int accumulate)
{
    st_f(o, t, i, accumulate ? ld_f(o, t, i) + v : v);
}

// ---------------------------------------------------------------------------
// Launchers shared between translation units (all queue on s->stream).

cp_status launch_convert(state *s, void *dst, cp_dtype dt, const void *src, cp_dtype st, size_t n);
cp_status launch_reduce(state *s, void *acc, const void *x, cp_dtype t, size_t n, cp_reduce_op op);
cp_status launch_merge(state *s, const cp_kernel_merge_args *a);
// The attention sinks' gradient (cp_backend_ops.sink_grad): a block per
// head, fp64 sums in a fixed order (the same bits every call).
cp_status launch_sink_grad(state *s, float *g, const float *sinks, const float *lse, const float *rows,
                           int64_t batch, int64_t seq, int heads);
// drow[b][h][i] = sum_d dout * o for every query row of p.
cp_status launch_drow(state *s, const attn_params &p);
// height rows of width bytes between device buffers of this device, by a
// kernel (elementwise.cu).
cp_status launch_copy_2d(state *s, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height);

// The three attention paths. Forward / backward take p with drow set.
bool simt_fits(const state *s, const attn_params &p, int backward);
cp_status simt_forward(state *s, const attn_params &p);
cp_status simt_backward(state *s, const attn_params &p);
bool mma_fits(const state *s, const attn_params &p, int backward);
cp_status mma_forward(state *s, const attn_params &p);
// ws: mma_bwd_workspace(s, p) bytes (or none when that is 0). wgmma: the
// atomic variant's kernel is the Hopper one (wgmma_bwd_fits must hold).
cp_status mma_backward(state *s, const attn_params &p, void *ws, bool wgmma);
// Scratch the mma backward needs beyond drow: the fp32 dQ sums of the atomic
// variant when the grads are not F32 (0 for the deterministic one).
size_t mma_bwd_workspace(const state *s, const attn_params &p);
// The atomic backward's dQ target (attn_mma_bwd.cu; also the rectangle
// kernels'): with F32 grads p->dqa is dq itself, cleared unless
// accumulating (*sums = NULL); else fp32 sums at ws (B Sq H columns of D
// rounded up to 4), zeroed. mma_dq_sums_end converts the sums into dq.
cp_status mma_dq_sums_begin(state *s, attn_params *p, void *ws, float **sums);
cp_status mma_dq_sums_end(state *s, const attn_params &p, const float *sums);
// The Hopper (sm_90a, wgmma) forward: for F16 / BF16, padded head dims 64 and
// 128, aligned rows, on a cc 9.0 device of a build with sm_90a code (with
// p.rects, the rectangle forward: attn_wgmma_fwd.cu, fwd_wgmma_rect_kernel).
bool wgmma_fits(const state *s, const attn_params &p);
cp_status wgmma_forward(state *s, const attn_params &p);
// The Hopper backward with atomic dQ (deterministic = 0), same conditions;
// wgmma_backward_atomic is the kernel alone, p.dqa set up and cleared by
// mma_backward.
bool wgmma_bwd_fits(const state *s, const attn_params &p);
// The FP8 (E4M3) forward on Hopper's FP8 tensor cores (attn_wgmma_fp8.cu):
// head dims up to 128, aligned rows, no rectangle list, on a cc 9.0 device
// of a build with sm_90a code; its workspace (fp8_workspace) holds the
// guard's flag and bits and V transposed. Otherwise FP8 runs on the SIMT
// kernels.
bool fp8_fits(const state *s, const attn_params &p);
size_t fp8_workspace(const attn_params &p);
cp_status fp8_forward(state *s, const attn_params &p, void *ws);
cp_status wgmma_backward_atomic(state *s, const attn_params &p);
bool blas_fits(const attn_params &p, int backward);
size_t blas_workspace(const attn_params &p, int backward);
cp_status blas_forward(state *s, const attn_params &p, void *ws);
cp_status blas_backward(state *s, const attn_params &p, void *ws);

// API 1.1 (attn_rect.cu, attn_mma_rect.cu, attn_simt.cu).
// Build the rectangle list of p (bands trimmed to their visible pairs) and
// its tile indexes for query tiles of q_tile rows and key tiles of k_tile
// rows, copy them into one stream-ordered device buffer (*buf, freed with
// rect_release after the kernels that read it are queued) and point p->rs
// at it.
cp_status rect_upload(state *s, attn_params *p, int q_tile, int k_tile, void **buf);
cp_status rect_release(state *s, void *buf, cp_status r);
// Free the state's staging buffers (cu_close; waits for their last copies).
void rect_stage_free(state *s);
// tanh(x) from one fast exp2: absolute error about 1e-7; NaN stays NaN and
// +-inf give +-1.
__device__ __forceinline__ float tanh_cap(float x)
{
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(e) : "f"(x * (2.0f * LOG2E)));
    return 1.0f - __fdividef(2.0f, e + 1.0f);
}
// The base-2 score of a raw product s (q . k): softcapped or scaled.
__device__ __forceinline__ float score2(const attn_params &p, float s)
{
    return p.softcap ? p.cap_out * tanh_cap(s * p.cap_in) : s * p.c;
}
bool mma_rect_fits(const state *s, const attn_params &p, int backward);
cp_status mma_rect_forward(state *s, const attn_params &p);
// ws: mma_bwd_workspace(s, p) bytes, as mma_backward.
cp_status mma_rect_backward(state *s, const attn_params &p, void *ws);
size_t mma_rect_bwd_workspace(const state *s, const attn_params &p);

// The non-finite guard of the tensor-core forward (nonfinite.cu). A hidden
// pair of a tile has P = 0, and the tensor cores multiply it anyway: 0 x inf
// or 0 x NaN of a value row would reach rows that do not see it. So, for
// F16 / BF16: nf_forward_begin queues a scan of v (flag and a bit per key
// row) and, only when flagged, a copy of v with non-finite values as 0 that
// the kernels read instead (p->vflag, p->vs); nf_forward_end, queued after
// the kernel (with p.rs still uploaded for rectangle calls), gives every
// output element that sees a non-finite value through a visible pair its
// class (NaN, or the infinity's sign), only when flagged. Clean calls pay
// the scan; untouched outputs of a flagged call keep the clean run's bits.
// Both do nothing without p->nf_ws. For a rectangle list, begin runs after
// rect_upload (the scan reads only key rows in a band).
// FP8 (attn_wgmma_fp8.cu) fills the flag and bits itself, at the start of
// its workspace (nf_forward_head_bytes of them, the bits at
// nf_forward_bits(flag)), and runs nf_forward_end after its kernel.
size_t nf_forward_workspace(const attn_params &p);
cp_status nf_forward_begin(state *s, attn_params *p);
cp_status nf_forward_end(state *s, const attn_params &p);
size_t nf_forward_head_bytes(const attn_params &p);
uint32_t *nf_forward_bits(int *flag);

// The backward's guard. In a tile that straddles the mask the tensor cores
// multiply hidden pairs too: 0 x a non-finite dO reaches dV, 0 x Q dK,
// 0 x K dQ, and a non-finite V, dO or rowsum makes dP - D non-finite. So:
// nf_backward_begin (after the rowsums are in) queues a scan of the query
// rows (q, lse, rowsum) and of the key rows (k, v; for a rectangle list only
// those in a band) that sets p->bflag's flag and a bit per bad row; when
// flagged, the kernels clean their tiles (nf_on, nf_clean), so that every
// pair with a bad row contributes a finite wrong value and every other pair
// exactly the clean run's. nf_backward_end, queued after the kernels (dQ
// converted; p.rs still up for a list), adds for every pair with a bad row
// its exact contribution minus the cleaned one into dq, dk and dv (fp32,
// IEEE: NaN, infinities and finite values come out as exact arithmetic
// says), only when flagged. Both do nothing without p->nf_ws.
size_t nf_backward_workspace(const attn_params &p);
cp_status nf_backward_begin(state *s, attn_params *p);
cp_status nf_backward_end(state *s, const attn_params &p);

// n rounded up to 256 bytes: the alignment of every buffer the module carves
// from a workspace.
inline size_t round_up(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

// Opt a kernel into `bytes` of dynamic shared memory (once per kernel).
cp_status allow_smem(const void *kernel, int bytes, const char *what);

} // namespace cu

#endif
