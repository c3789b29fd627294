// SPDX-License-Identifier: MIT
// The tensor-core forward's guard against non-finite values (common.cuh,
// nf_forward_begin / nf_forward_end).
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
#include <type_traits>

#include "common.cuh"

namespace cu {
namespace {

constexpr int NF_THREADS = 256;

// 32-bit words of row bits per (batch, kv head).
__host__ __device__ inline int64_t bit_words(const attn_params &p)
{
    return (p.Sk + 31) / 32;
}

// The workspace: the flag (in 256 bytes of its own), the row bits, the copy
// of v.
constexpr size_t FLAG_BYTES = 256;

size_t bits_bytes(const attn_params &p)
{
    return round_up((size_t)p.B * (size_t)p.Hkv * (size_t)bit_words(p) * 4);
}

uint32_t *bits_of(const int *flag)
{
    return reinterpret_cast<uint32_t *>(reinterpret_cast<uintptr_t>(flag) + FLAG_BYTES);
}

// Class of a 16-bit value: 0 finite, 1 NaN, 2 +inf, 4 -inf.
template <typename T>
__device__ __forceinline__ int class16(uint16_t x)
{
    constexpr uint16_t EXP = std::is_same<T, __half>::value ? 0x7c00 : 0x7f80;
    if ((x & EXP) != EXP)
        return 0;
    if (x & (uint16_t)(~EXP & 0x7fff))
        return 1;
    return x & 0x8000 ? 4 : 2;
}

// The 16-byte chunks (p.vec) or elements of v's rows, as one index range:
// element e is chunk c of the row (b, j, hk).
struct chunks {
    int64_t per, per_row, total;
};

chunks chunks_of(const attn_params &p)
{
    chunks c;
    c.per = p.vec ? 8 : 1;
    c.per_row = (p.Dv + c.per - 1) / c.per;
    c.total = (int64_t)p.B * p.Sk * p.Hkv * c.per_row;
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

template <typename T>
__global__ void __launch_bounds__(NF_THREADS) nf_scan(attn_params p, chunks c, int *flag, uint32_t *bits)
{
    const uint16_t *v = static_cast<const uint16_t *>(p.v.p);
    const int64_t nw = bit_words(p);
    for (int64_t e = (int64_t)blockIdx.x * NF_THREADS + threadIdx.x; e < c.total; e += (int64_t)gridDim.x * NF_THREADS) {
        const chunk_at a = locate(p, c, e);
        if (p.rects) { // only rows in a band: the others may be memory nobody wrote
            const int t = (int)(a.j / p.rs.by_k.tile);
            if (!key_in_bands(p, p.rs.by_k.start[t], p.rs.by_k.start[t + 1], a.j))
                continue;
        }
        int cls = 0;
        if (c.per == 8) {
            const uint4 x = *reinterpret_cast<const uint4 *>(v + a.src);
            const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
            for (int k = 0; k < 4; k++)
                cls |= class16<T>((uint16_t)w[k]) | class16<T>((uint16_t)(w[k] >> 16));
        } else {
            cls = class16<T>(v[a.src]);
        }
        if (cls) {
            *flag = 1;
            atomicOr(bits + (a.b * p.Hkv + a.hk) * nw + a.j / 32, 1u << (a.j % 32));
        }
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

// One block per output row (b, i, h) in turn, a thread per column d.
template <typename T>
__global__ void __launch_bounds__(128) nf_patch(attn_params p, const int *flag, const uint32_t *bits)
{
    if (!*flag)
        return;
    const uint16_t *v = static_cast<const uint16_t *>(p.v.p);
    const int64_t nw = bit_words(p), rows = (int64_t)p.B * p.Sq * p.H;
    for (int64_t it = blockIdx.x; it < rows; it += gridDim.x) {
        const int h = (int)(it % p.H), hk = h / p.G;
        const int64_t i = (it / p.H) % p.Sq, b = it / p.H / p.Sq;
        const uint32_t *bw = bits + (b * p.Hkv + hk) * nw;
        for (int d = threadIdx.x; d < p.Dv; d += blockDim.x) {
            int cls = 0;
            // the flagged key rows of [lo, hi), their class at column d
            auto visit = [&](int64_t lo, int64_t hi) {
                for (int64_t w = lo / 32; w * 32 < hi; w++) {
                    uint32_t m = bw[w];
                    if (w * 32 < lo)
                        m &= ~0u << (lo - w * 32);
                    if (hi - w * 32 < 32)
                        m &= (1u << (hi - w * 32)) - 1;
                    while (m) {
                        const int64_t j = w * 32 + __ffs(m) - 1;
                        m &= m - 1;
                        cls |= class16<T>(v[at(p.v, b, j, hk) + d]);
                    }
                }
            };
            if (p.rects) {
                const tile_index &t = p.rs.by_q;
                const int tile = (int)(i / t.tile);
                for (int x = t.start[tile]; x < t.start[tile + 1]; x++) {
                    const band r = p.rs.bands[t.ids[x]];
                    if (i < r.q0 || i >= r.q1)
                        continue;
                    int64_t lo, hi;
                    band_keys(r, i, &lo, &hi);
                    visit(lo, hi);
                }
            } else {
                visit(0, visible_keys(p, i));
            }
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

} // namespace

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
    p->vflag = flag;
    p->vs = tensor{vs, p->Sk * p->Hkv * p->Dv, (int64_t)p->Hkv * p->Dv, p->Dv};
    return check_launch("the non-finite guard's scan");
}

cp_status nf_forward_end(state *s, const attn_params &p)
{
    if (!p.vflag)
        return CP_SUCCESS;
    const int *flag = p.vflag;
    const uint32_t *bits = bits_of(flag);
    const unsigned grid = grid_for(s, (int64_t)p.B * p.Sq * p.H, 1);
    if (p.dt == CP_DTYPE_BF16)
        nf_patch<__nv_bfloat16><<<grid, 128, 0, s->stream>>>(p, flag, bits);
    else
        nf_patch<__half><<<grid, 128, 0, s->stream>>>(p, flag, bits);
    return check_launch("the non-finite guard's patch");
}

} // namespace cu
