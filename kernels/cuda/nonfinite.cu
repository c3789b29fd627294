// SPDX-License-Identifier: MIT
// The tensor-core kernels' guard against non-finite values (common.cuh):
// the forward's (nf_forward_begin / nf_forward_end) first, then the
// backward's (nf_backward_begin / nf_backward_end, below).
//
// Inside a key tile that straddles the mask (the causal diagonal, a window
// edge, a band edge) a hidden pair has P = 0 exactly, and O += P V multiplies
// it anyway: a NaN or an infinity in a value row turns 0 into NaN for rows
// that never see that key. Scores are safe (hidden ones are replaced, not
// multiplied), so for the forward V is the only operand that leaks.
//
// Three kernels, queued on the call's stream; nothing waits for the host:
//  1. scan: every element of v; a non-finite one sets the call's flag and the
//     bit of its (batch, kv head, key row);
//  2. copy (returns at once unless flagged): v into the workspace with every
//     non-finite value as +0; the attention kernels read this copy instead of
//     v when the flag is set (v_of, common.cuh). A hidden pair then adds
//     0 x 0 instead of 0 x (the clean value): the same +-0, so every output
//     the plant does not reach keeps the clean run's bits;
//  3. patch (after the attention kernel; returns at once unless flagged): for
//     each output element o[b, i, h, d], the values v[b, j, hk, d] of the key
//     rows j it sees (bits set, visible to row i: causal limit or the bands of
//     the rectangle list) fold their class into o: a NaN gives NaN, +inf and
//     -inf together give NaN, one infinity gives itself unless o already holds
//     the other (or NaN). Visible pairs have weights > 0, so that is the class
//     exact arithmetic gives; it does not depend on the finite terms, so it is
//     right also after a merge into a running (o, lse) (accumulate).
// Workspace (nf_forward_workspace): the flag, the row bits, the copy of v.
// The FP8 forward (attn_wgmma_fp8.cu) does steps 1 and 2 itself, in the
// transposed copy of v its kernel reads anyway (E4M3 has NaN codes, no
// infinities), and then runs step 3 (nf_forward_end; v_class).
//
// The backward leaks through every operand (dV += P^T dO, dK += dS^T Q,
// dQ += dS K, dP - D through V, dO and the rowsum D), so it cleans in place
// instead of copying four tensors:
//  1. scan (nf_scan_bwd): q, k, v chunk by chunk and the LSE and rowsum of
//     each query row; a bad row sets the flag and its bit (query rows
//     [B][H], key rows [B][Hkv]);
//  2. clean (in the attention kernels, only when flagged: nf_on, nf_clean*):
//     every Q, dO, K, V tile loaded, non-finite values to +0, and non-finite
//     rowsums to 0. A pair with no bad row then adds exactly the clean run's
//     term, a pair with one a finite wrong term;
//  3. patch (nf_patch_bwd, after the kernels; returns at once unless
//     flagged): for each pair with a bad row, its exact term (raw rows, the
//     model's formula) minus its cleaned term goes into dq, dk and dv, each
//     product rounded on its own so that agreeing terms cancel exactly.
// Workspace (nf_backward_workspace): the flag and the two sets of row bits.
#include <type_traits>

#include "common.cuh"

namespace cu {
namespace {

constexpr int NF_THREADS = 256;

// The workspace: the flag (in 256 bytes of its own), the row bits, the copy
// of v.
constexpr size_t FLAG_BYTES = 256;

size_t bits_bytes(const attn_params &p)
{
    return round_up((size_t)p.B * (size_t)p.Hkv * (size_t)nf_key_words(p) * 4);
}

uint32_t *bits_of(const int *flag)
{
    return reinterpret_cast<uint32_t *>(reinterpret_cast<uintptr_t>(flag) + FLAG_BYTES);
}

// Class of a 16-bit value: 0 finite, 1 NaN, 2 +inf, 4 -inf.
template <typename T>
__device__ __forceinline__ int class16(uint16_t x)
{
    constexpr uint16_t EXP = (uint16_t)EXP16<T>;
    if ((x & EXP) != EXP)
        return 0;
    if (x & (uint16_t)(~EXP & 0x7fff))
        return 1;
    return x & 0x8000 ? 4 : 2;
}

// The classes (class16) of a chunk at v: 8 values (per = 8, one 16-byte
// load) or one, or-ed together; 0 where all are finite.
template <typename T>
__device__ __forceinline__ int chunk_class(const uint16_t *v, int64_t per)
{
    if (per != 8)
        return class16<T>(*v);
    const uint4 x = *reinterpret_cast<const uint4 *>(v);
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
    int cls = 0;
#pragma unroll
    for (int k = 0; k < 4; k++)
        cls |= class16<T>((uint16_t)w[k]) | class16<T>((uint16_t)(w[k] >> 16));
    return cls;
}

// The 16-byte chunks (p.vec) or elements of v's rows, as one index range:
// element e is chunk c of the row (b, j, hk).
struct chunks {
    int64_t per, per_row, total;
    int flat; // v's rows lie end to end: chunk e is at v + 8 e (16-byte chunks)
};

chunks chunks_of(const attn_params &p)
{
    chunks c;
    c.per = p.vec ? 8 : 1;
    c.per_row = (p.Dv + c.per - 1) / c.per;
    c.total = (int64_t)p.B * p.Sk * p.Hkv * c.per_row;
    c.flat = p.vec && p.v.sh == p.Dv && p.v.ss == (int64_t)p.Hkv * p.Dv && p.v.sb == p.Sk * p.v.ss;
    return c;
}

struct chunk_at {
    int64_t b, j, src, dst;
    int hk, d0;
};

__device__ __forceinline__ chunk_at locate(const attn_params &p, const chunks &c, int64_t e)
{
    chunk_at a;
    const int64_t r = e / c.per_row;
    a.d0 = (int)((e % c.per_row) * c.per);
    a.hk = (int)(r % p.Hkv);
    a.j = (r / p.Hkv) % p.Sk;
    a.b = r / p.Hkv / p.Sk;
    a.src = at(p.v, a.b, a.j, a.hk) + a.d0;
    a.dst = ((a.b * p.Sk + a.j) * p.Hkv + a.hk) * p.Dv + a.d0;
    return a;
}

// The rows the other side of a pair sees, as ranges: for a query row x
// (BY_KEY false) the key rows [lo, hi) it sees, for a key row x (BY_KEY) the
// query rows that see it; f(lo, hi) once without a list (causal limit), or
// once per band of the list that holds x (a pair in two bands counts twice,
// as the kernels count it).
template <bool BY_KEY, typename F>
__device__ __forceinline__ void band_ranges(const attn_params &p, int64_t x, F f)
{
    if (!p.rects) {
        if (BY_KEY)
            f(first_query(p, x), p.Sq);
        else
            f((int64_t)0, visible_keys(p, x));
        return;
    }
    const tile_index &t = BY_KEY ? p.rs.by_k : p.rs.by_q;
    const int tile = (int)(x / t.tile);
    for (int e = t.start[tile]; e < t.start[tile + 1]; e++) {
        const band r = p.rs.bands[t.ids[e]];
        if (BY_KEY ? x < r.k0 || x >= r.k1 : x < r.q0 || x >= r.q1)
            continue;
        int64_t lo, hi;
        if (BY_KEY)
            band_queries(r, x, &lo, &hi);
        else
            band_keys(r, x, &lo, &hi);
        f(lo, hi);
    }
}

// Calls f(x) for every x of [lo, hi): all of them, or only those whose bit
// is set in w.
template <typename F>
__device__ __forceinline__ void each(int64_t lo, int64_t hi, bool all, const uint32_t *w, F f)
{
    if (all) {
        for (int64_t x = lo; x < hi; x++)
            f(x);
        return;
    }
    for (int64_t k = lo / 32; k * 32 < hi; k++) {
        uint32_t m = w[k];
        if (k * 32 < lo)
            m &= ~0u << (lo - k * 32);
        if (hi - k * 32 < 32)
            m &= (1u << (hi - k * 32)) - 1;
        while (m) {
            f(k * 32 + __ffs(m) - 1);
            m &= m - 1;
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(NF_THREADS) nf_scan(attn_params p, chunks c, int *flag, uint32_t *bits)
{
    const uint16_t *v = static_cast<const uint16_t *>(p.v.p);
    for (int64_t e = (int64_t)blockIdx.x * NF_THREADS + threadIdx.x; e < c.total; e += (int64_t)gridDim.x * NF_THREADS) {
        // rows end to end: test the chunk first and find its row only when
        // it is bad (the 64-bit divisions of locate held the scan to a
        // third of the memory's speed)
        if (c.flat && !chunk_class<T>(v + e * 8, 8))
            continue;
        const chunk_at a = locate(p, c, e);
        if (p.rects) { // only rows in a band: the others may be memory nobody wrote
            const int t = (int)(a.j / p.rs.by_k.tile);
            if (!key_in_bands(p, p.rs.by_k.start[t], p.rs.by_k.start[t + 1], a.j))
                continue;
        }
        if (chunk_class<T>(v + a.src, c.per))
            nf_mark_key(p, flag, bits, a.b, a.hk, a.j);
    }
}

template <typename T>
__global__ void __launch_bounds__(NF_THREADS) nf_copy(attn_params p, chunks c, const int *flag, uint16_t *vs)
{
    if (!*flag)
        return;
    const uint16_t *v = static_cast<const uint16_t *>(p.v.p);
    for (int64_t e = (int64_t)blockIdx.x * NF_THREADS + threadIdx.x; e < c.total; e += (int64_t)gridDim.x * NF_THREADS) {
        const chunk_at a = locate(p, c, e);
        for (int k = 0; k < c.per; k++) {
            const uint16_t x = v[a.src + k];
            vs[a.dst + k] = class16<T>(x) ? (uint16_t)0 : x;
        }
    }
}

// Class (class16) of element i of v: 16-bit, or E4M3 (NaN only: bits 0..6
// all set; it has no infinities).
template <typename T>
__device__ __forceinline__ int v_class(const void *v, int64_t i)
{
    if constexpr (std::is_same<T, __nv_fp8_e4m3>::value)
        return (static_cast<const uint8_t *>(v)[i] & 0x7f) == 0x7f;
    else
        return class16<T>(static_cast<const uint16_t *>(v)[i]);
}

// One block per output row (b, i, h) in turn, a thread per column d.
template <typename T>
__global__ void __launch_bounds__(128) nf_patch(attn_params p, const int *flag, const uint32_t *bits)
{
    if (!*flag)
        return;
    const void *v = p.v.p;
    const int64_t nw = nf_key_words(p), rows = (int64_t)p.B * p.Sq * p.H;
    for (int64_t it = blockIdx.x; it < rows; it += gridDim.x) {
        const int h = (int)(it % p.H), hk = h / p.G;
        const int64_t i = (it / p.H) % p.Sq, b = it / p.H / p.Sq;
        const uint32_t *bw = bits + (b * p.Hkv + hk) * nw;
        for (int d = threadIdx.x; d < p.Dv; d += blockDim.x) {
            int cls = 0; // the classes of the flagged key rows row i sees, at column d
            band_ranges<false>(p, i, [&](int64_t lo, int64_t hi) {
                each(lo, hi, false, bw, [&](int64_t j) { cls |= v_class<T>(v, at(p.v, b, j, hk) + d); });
            });
            if (!cls)
                continue;
            const int64_t oi = at(p.o, b, i, h) + d;
            void *o = const_cast<void *>(p.o.p);
            const float x = ld_f(o, p.odt, oi);
            float y;
            if ((cls & 1) || (cls & 6) == 6 || x != x)
                y = NAN;
            else if (cls & 2)
                y = x == -INFINITY ? NAN : INFINITY;
            else
                y = x == INFINITY ? NAN : -INFINITY;
            st_f(o, p.odt, oi, y);
        }
    }
}

unsigned grid_for(const state *s, int64_t work, int per_block)
{
    const int64_t want = (work + per_block - 1) / per_block, most = (int64_t)s->sm_count * 8;
    return (unsigned)(want < 1 ? 1 : want < most ? want : most);
}

// ---- the backward ----------------------------------------------------------
//
// Workspace: the flag (FLAG_BYTES), a bit per query row [B][H][words] and one
// per key row [B][Hkv][words] (nf_key_words).

constexpr int NB_WARPS = 8; // warps of a block of the backward's patch: one row each in turn

__host__ __device__ inline int64_t q_words(const attn_params &p)
{
    return (p.Sq + 31) / 32;
}

size_t qbits_bytes(const attn_params &p)
{
    return round_up((size_t)p.B * (size_t)p.H * (size_t)q_words(p) * 4);
}

__device__ __forceinline__ bool bit_at(const uint32_t *w, int64_t i)
{
    return (w[i / 32] >> (i % 32)) & 1u;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// One tensor the backward's scan reads, as 16-byte chunks (p.vec) or
// elements: element e is chunk e % per_row of row e / per_row, the rows in
// (b, s, h) order with h fastest.
struct scan_span {
    tensor t;
    int64_t S, per_row, total;
    int heads, per;
    int flat; // rows end to end in 16-byte chunks: chunk e is at t.p + 8 e
};

scan_span span_of(const attn_params &p, const tensor &t, int64_t S, int heads, int dim)
{
    scan_span x;
    x.t = t;
    x.S = S;
    x.heads = heads;
    x.per = p.vec ? 8 : 1;
    x.per_row = (dim + x.per - 1) / x.per;
    x.total = (int64_t)p.B * S * heads * x.per_row;
    x.flat = x.per == 8 && t.sh == dim && t.ss == (int64_t)heads * dim && t.sb == S * t.ss;
    return x;
}

// Whether chunk e of x holds a non-finite value; its row (b, s, h).
template <typename T>
__device__ __forceinline__ bool chunk_bad(const scan_span &x, int64_t e, int64_t *b, int64_t *s, int *h)
{
    // rows end to end: the chunk's row only when it is bad (64-bit
    // divisions for every chunk held the scan to a third of the memory's
    // speed)
    if (x.flat && !chunk_class<T>(static_cast<const uint16_t *>(x.t.p) + e * 8, 8))
        return false;
    const int64_t r = e / x.per_row;
    *h = (int)(r % x.heads);
    *s = (r / x.heads) % x.S;
    *b = r / x.heads / x.S;
    const uint16_t *v = static_cast<const uint16_t *>(x.t.p) + at(x.t, *b, *s, *h) + (e % x.per_row) * x.per;
    return chunk_class<T>(v, x.per) != 0;
}

// The scan, a thread per 16-byte chunk of q, k and v, then a thread per
// query row for its LSE and rowsum, in one launch (a ring step's short
// calls feel every launch; a chunk per thread keeps the loads in flight). A
// query row is bad where q, its LSE (NaN or +inf; -inf is a row that sees
// no key) or its rowsum (not finite where dO or O is not) is; a key row
// where k or v is (for a list only rows in a band: the others may be memory
// nobody wrote).
template <typename T>
__global__ void __launch_bounds__(NF_THREADS) nf_scan_bwd(attn_params p, scan_span sq, scan_span sk, scan_span sv,
                                                        int *flag, uint32_t *qbits, uint32_t *kbits)
{
    const int64_t n1 = sq.total, n2 = n1 + sk.total, n3 = n2 + sv.total, n = n3 + (int64_t)p.B * p.H * p.Sq;
    for (int64_t e = (int64_t)blockIdx.x * NF_THREADS + threadIdx.x; e < n; e += (int64_t)gridDim.x * NF_THREADS) {
        bool bad;
        int64_t b = 0, x = 0;
        int h = 0;
        uint32_t *bits;
        if (e < n1) {
            bad = chunk_bad<T>(sq, e, &b, &x, &h);
            bits = qbits + (b * p.H + h) * q_words(p);
        } else if (e < n3) {
            bad = e < n2 ? chunk_bad<T>(sk, e - n1, &b, &x, &h) : chunk_bad<T>(sv, e - n2, &b, &x, &h);
            if (bad && p.rects) {
                const int t = (int)(x / p.rs.by_k.tile);
                bad = key_in_bands(p, p.rs.by_k.start[t], p.rs.by_k.start[t + 1], x);
            }
            bits = kbits + (b * p.Hkv + h) * nf_key_words(p);
        } else { // query row (b, h, x), x fastest: the LSE's layout
            const int64_t r = e - n3;
            x = r % p.Sq;
            h = (int)((r / p.Sq) % p.H);
            b = r / p.Sq / p.H;
            const float l = p.lse[b * p.lsb + h * p.lsh + x], d = p.drow[b * p.drb + h * p.drh + x];
            bad = l != l || l == INFINITY || !isfinite(d);
            bits = qbits + (b * p.H + h) * q_words(p);
        }
        if (bad) {
            *flag = 1;
            atomicOr(bits + x / 32, 1u << (x % 32));
        }
    }
}

// Head rows of up to 256 values, a lane holding columns lane + 32 m.
constexpr int NM = 8;

template <typename T>
__device__ __forceinline__ void load_row(float (&x)[NM], const tensor &t, int64_t off, int dim, int lane)
{
    const T *s = static_cast<const T *>(t.p) + off;
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const int d = lane + 32 * m;
        x[m] = d < dim ? get_f(s[d]) : 0.0f;
    }
}

// The dot product of two rows over the warp, raw and with non-finite values
// as 0 (what the cleaned tiles multiply).
__device__ __forceinline__ void dots(const float (&a)[NM], const float (&b)[NM], float *raw, float *clean)
{
    float r = 0.0f, c = 0.0f;
#pragma unroll
    for (int m = 0; m < NM; m++) {
        r += a[m] * b[m];
        c += finite_or_0(a[m]) * finite_or_0(b[m]);
    }
    *raw = warp_sum(r);
    *clean = warp_sum(c);
}

// One pair's P and dS (scale and softcap factor in), exact (from the raw
// rows) and as the cleaned kernel computed them.
struct pair_terms {
    float p, ds, pc, dsc;
};

__device__ __forceinline__ pair_terms terms(const attn_params &p, float qk, float qkc, float dp, float dpc, float lse,
                                           float drow)
{
    pair_terms t;
    const float l2 = lse2_of(lse);
    auto score = [&](float x, float *f) {
        if (!p.softcap) {
            *f = p.scale;
            return x * p.c;
        }
        const float th = tanhf(x * p.cap_in);
        *f = p.scale * (1.0f - th * th);
        return p.cap_out * th;
    };
    float f, fc;
    const float s = score(qk, &f), sc = score(qkc, &fc);
    // exact: a row that sees no key (LSE -inf) weighs nothing, as in the model
    t.p = lse == -INFINITY ? 0.0f : exp2f(s - l2);
    t.ds = t.p * (dp - drow) * f;
    t.pc = exp2f(sc - l2);
    t.dsc = t.pc != 0.0f ? t.pc * (dpc - finite_or_0(drow)) * fc : 0.0f;
    return t;
}

// A pair's term a x minus its cleaned term ac x' (x' = x, or 0 where x is
// not finite): exactly 0 where the two agree (a row bad only through its
// rowsum leaves dV's terms as they are), so no contraction into an FMA.
__device__ __forceinline__ float delta(float a, float x, float ac)
{
    return __fmul_rn(a, x) - __fmul_rn(ac, finite_or_0(x));
}

// Adds x (a lane's columns) into row off of a gradient, where any pair was
// met (so that untouched rows keep their bits).
__device__ __forceinline__ void add_row(const attn_params &p, const tensor &t, int64_t off, int dim,
                                        const float (&x)[NM], int lane)
{
    void *g = const_cast<void *>(t.p);
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const int d = lane + 32 * m;
        if (d < dim)
            st_f(g, p.gdt, off + d, ld_f(g, p.gdt, off + d) + x[m]);
    }
}

// dQ of query row `it` (b, i, h): the pairs with a bad row or a bad key.
template <typename T>
__device__ void patch_dq(const attn_params &p, int64_t it, const uint32_t *qbits, const uint32_t *kbits, int lane)
{
    const int h = (int)(it % p.H), hk = h / p.G;
    const int64_t i = (it / p.H) % p.Sq, b = it / p.H / p.Sq;
    const bool bad_row = bit_at(qbits + (b * p.H + h) * q_words(p), i);
    const uint32_t *kb = kbits + (b * p.Hkv + hk) * nf_key_words(p);
    float q[NM], go[NM], k[NM], v[NM], acc[NM] = {};
    load_row<T>(q, p.q, at(p.q, b, i, h), p.D, lane);
    load_row<T>(go, p.dout, at(p.dout, b, i, h), p.Dv, lane);
    const float lse = p.lse[b * p.lsb + h * p.lsh + i], dr = p.drow[b * p.drb + h * p.drh + i];
    bool any = false;
    band_ranges<false>(p, i, [&](int64_t lo, int64_t hi) {
        each(lo, hi, bad_row, kb, [&](int64_t j) {
            load_row<T>(k, p.k, at(p.k, b, j, hk), p.D, lane);
            load_row<T>(v, p.v, at(p.v, b, j, hk), p.Dv, lane);
            float qk, qkc, dp, dpc;
            dots(q, k, &qk, &qkc);
            dots(go, v, &dp, &dpc);
            const pair_terms t = terms(p, qk, qkc, dp, dpc, lse, dr);
#pragma unroll
            for (int m = 0; m < NM; m++)
                acc[m] += delta(t.ds, k[m], t.dsc);
            any = true;
        });
    });
    if (any)
        add_row(p, p.dq, at(p.dq, b, i, h), p.D, acc, lane);
}

// dK and dV of key row `it` (b, j, hk) over the query heads of its group:
// the pairs with a bad key or a bad row.
template <typename T>
__device__ void patch_dkdv(const attn_params &p, int64_t it, const uint32_t *qbits, const uint32_t *kbits, int lane)
{
    const int hk = (int)(it % p.Hkv);
    const int64_t j = (it / p.Hkv) % p.Sk, b = it / p.Hkv / p.Sk;
    const bool bad_key = bit_at(kbits + (b * p.Hkv + hk) * nf_key_words(p), j);
    float k[NM], v[NM], q[NM], go[NM], ak[NM] = {}, av[NM] = {};
    load_row<T>(k, p.k, at(p.k, b, j, hk), p.D, lane);
    load_row<T>(v, p.v, at(p.v, b, j, hk), p.Dv, lane);
    bool any = false;
    for (int h = hk * p.G; h < (hk + 1) * p.G; h++) {
        const uint32_t *qb = qbits + (b * p.H + h) * q_words(p);
        band_ranges<true>(p, j, [&](int64_t lo, int64_t hi) {
            each(lo, hi, bad_key, qb, [&](int64_t i) {
                load_row<T>(q, p.q, at(p.q, b, i, h), p.D, lane);
                load_row<T>(go, p.dout, at(p.dout, b, i, h), p.Dv, lane);
                const float lse = p.lse[b * p.lsb + h * p.lsh + i], dr = p.drow[b * p.drb + h * p.drh + i];
                float qk, qkc, dp, dpc;
                dots(q, k, &qk, &qkc);
                dots(go, v, &dp, &dpc);
                const pair_terms t = terms(p, qk, qkc, dp, dpc, lse, dr);
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    ak[m] += delta(t.ds, q[m], t.dsc);
                    av[m] += delta(t.p, go[m], t.pc);
                }
                any = true;
            });
        });
    }
    if (any) {
        add_row(p, p.dk, at(p.dk, b, j, hk), p.D, ak, lane);
        add_row(p, p.dv, at(p.dv, b, j, hk), p.Dv, av, lane);
    }
}

// The patch (returns at once unless flagged), a warp per row: dQ of the
// query rows first, then dK and dV of the key rows, in one launch.
template <typename T>
__global__ void __launch_bounds__(32 * NB_WARPS) nf_patch_bwd(attn_params p, const int *flag, const uint32_t *qbits,
                                                            const uint32_t *kbits)
{
    if (!*flag)
        return;
    const int lane = threadIdx.x & 31;
    const int64_t nq = (int64_t)p.B * p.Sq * p.H, rows = nq + (int64_t)p.B * p.Sk * p.Hkv;
    for (int64_t it = (int64_t)blockIdx.x * NB_WARPS + (threadIdx.x >> 5); it < rows;
         it += (int64_t)gridDim.x * NB_WARPS) {
        if (it < nq)
            patch_dq<T>(p, it, qbits, kbits, lane);
        else
            patch_dkdv<T>(p, it - nq, qbits, kbits, lane);
    }
}

} // namespace

size_t nf_forward_head_bytes(const attn_params &p)
{
    return FLAG_BYTES + bits_bytes(p);
}

uint32_t *nf_forward_bits(int *flag)
{
    return bits_of(flag);
}

size_t nf_forward_workspace(const attn_params &p)
{
    return FLAG_BYTES + bits_bytes(p) + round_up((size_t)p.B * (size_t)p.Sk * (size_t)p.Hkv * (size_t)p.Dv * 2);
}

cp_status nf_forward_begin(state *s, attn_params *p)
{
    if (!p->nf_ws)
        return CP_SUCCESS;
    char *w = static_cast<char *>(p->nf_ws);
    int *flag = reinterpret_cast<int *>(w);
    uint32_t *bits = bits_of(flag);
    uint16_t *vs = reinterpret_cast<uint16_t *>(w + FLAG_BYTES + bits_bytes(*p));
    cudaError_t e = cudaMemsetAsync(w, 0, FLAG_BYTES + bits_bytes(*p), s->stream);
    if (e != cudaSuccess)
        return cuda_fail("cudaMemsetAsync (the non-finite guard)", e);
    const chunks c = chunks_of(*p);
    const unsigned grid = grid_for(s, c.total, NF_THREADS);
    if (p->dt == CP_DTYPE_BF16) {
        nf_scan<__nv_bfloat16><<<grid, NF_THREADS, 0, s->stream>>>(*p, c, flag, bits);
        nf_copy<__nv_bfloat16><<<grid, NF_THREADS, 0, s->stream>>>(*p, c, flag, vs);
    } else {
        nf_scan<__half><<<grid, NF_THREADS, 0, s->stream>>>(*p, c, flag, bits);
        nf_copy<__half><<<grid, NF_THREADS, 0, s->stream>>>(*p, c, flag, vs);
    }
    p->vflag = s->knob.nf_guard == NF_SCAN_ONLY ? nullptr : flag;
    p->vs = tensor{vs, p->Sk * p->Hkv * p->Dv, (int64_t)p->Hkv * p->Dv, p->Dv};
    return check_launch("the non-finite guard's scan");
}

cp_status nf_forward_end(state *s, const attn_params &p)
{
    if (!p.nf_ws)
        return CP_SUCCESS;
    const int *flag = static_cast<const int *>(p.nf_ws);
    const uint32_t *bits = bits_of(flag);
    const unsigned grid = grid_for(s, (int64_t)p.B * p.Sq * p.H, 1);
    if (p.dt == CP_DTYPE_BF16)
        nf_patch<__nv_bfloat16><<<grid, 128, 0, s->stream>>>(p, flag, bits);
    else if (p.dt == CP_DTYPE_FP8_E4M3)
        nf_patch<__nv_fp8_e4m3><<<grid, 128, 0, s->stream>>>(p, flag, bits);
    else
        nf_patch<__half><<<grid, 128, 0, s->stream>>>(p, flag, bits);
    return check_launch("the non-finite guard's patch");
}

size_t nf_backward_workspace(const attn_params &p)
{
    return FLAG_BYTES + qbits_bytes(p) + bits_bytes(p);
}

cp_status nf_backward_begin(state *s, attn_params *p)
{
    if (!p->nf_ws)
        return CP_SUCCESS;
    char *w = static_cast<char *>(p->nf_ws);
    int *flag = reinterpret_cast<int *>(w);
    uint32_t *qbits = bits_of(flag), *kbits = qbits + qbits_bytes(*p) / 4;
    cudaError_t e = cudaMemsetAsync(w, 0, nf_backward_workspace(*p), s->stream);
    if (e != cudaSuccess)
        return cuda_fail("cudaMemsetAsync (the non-finite guard)", e);
    const scan_span sq = span_of(*p, p->q, p->Sq, p->H, p->D), sk = span_of(*p, p->k, p->Sk, p->Hkv, p->D),
                    sv = span_of(*p, p->v, p->Sk, p->Hkv, p->Dv);
    const unsigned grid = grid_for(s, sq.total + sk.total + sv.total + (int64_t)p->B * p->H * p->Sq, NF_THREADS);
    if (p->dt == CP_DTYPE_BF16)
        nf_scan_bwd<__nv_bfloat16><<<grid, NF_THREADS, 0, s->stream>>>(*p, sq, sk, sv, flag, qbits, kbits);
    else
        nf_scan_bwd<__half><<<grid, NF_THREADS, 0, s->stream>>>(*p, sq, sk, sv, flag, qbits, kbits);
    p->bflag = s->knob.nf_guard == NF_SCAN_ONLY ? nullptr : flag;
    return check_launch("the non-finite guard's scan (backward)");
}

cp_status nf_backward_end(state *s, const attn_params &p)
{
    if (!p.nf_ws)
        return CP_SUCCESS;
    const int *flag = static_cast<const int *>(p.nf_ws);
    const uint32_t *qbits = bits_of(flag), *kbits = qbits + qbits_bytes(p) / 4;
    const unsigned grid = grid_for(s, (int64_t)p.B * (p.Sq * p.H + p.Sk * p.Hkv), NB_WARPS);
    if (p.dt == CP_DTYPE_BF16)
        nf_patch_bwd<__nv_bfloat16><<<grid, 32 * NB_WARPS, 0, s->stream>>>(p, flag, qbits, kbits);
    else
        nf_patch_bwd<__half><<<grid, 32 * NB_WARPS, 0, s->stream>>>(p, flag, qbits, kbits);
    return check_launch("the non-finite guard's patch (backward)");
}

} // namespace cu
