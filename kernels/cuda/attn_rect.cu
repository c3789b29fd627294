// SPDX-License-Identifier: MIT
// API 1.1 on the host side: the rectangle list of a call as bands (trimmed to
// the rows and keys that see something), the tile indexes the kernels walk,
// and their trip to the device.
//
// A call's list can be anything from one rectangle (a dense block with a
// window or softcap) to thousands (a packed block of short documents). The
// kernels take one tile of rows each; a tile's index entry lists the bands
// that meet it, and the launch order puts the tiles with the most visible
// pairs first, so the long tiles of large documents do not start last and
// leave SMs idle at the end (the longest-first rule of list scheduling).
//
// The list and indexes are built into pinned host memory and copied into a
// stream-ordered device allocation: no host wait, so a CP ring's calls still
// overlap their transfers. The pinned buffers are a small ring per state;
// reusing one waits for the copy that last read it (an event), which is long
// done by then.
#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstring>
#include <new>
#include <vector>

#include "common.cuh"

namespace cu {
namespace {

int64_t sat_add(int64_t x, int64_t y)
{
    int64_t r;
    return __builtin_add_overflow(x, y, &r) ? (y > 0 ? INT64_MAX : INT64_MIN) : r;
}

int64_t sat_sub(int64_t x, int64_t y)
{
    int64_t r;
    return __builtin_sub_overflow(x, y, &r) ? (y < 0 ? INT64_MAX : INT64_MIN) : r;
}

// The band of one rectangle (rows and positions as cp_attn_rect), trimmed to
// its visible rows and keys; false when it has no visible pair.
bool make_band(const attn_params &p, int64_t q_row, int64_t q_len, int64_t k_row, int64_t k_len, int64_t q_pos,
               int64_t k_pos, band *out)
{
    if (q_len <= 0 || k_len <= 0)
        return false;
    const int64_t e = q_pos - k_pos; // both in [0, 2^62]
    int64_t a_lo = INT64_MIN, a_hi = INT64_MAX;
    if (p.window)
        a_lo = sat_sub(e, p.window - 1);
    if (p.causal)
        a_hi = sat_add(e, 1);
    else if (p.window)
        a_hi = sat_add(e, p.window);
    if (a_lo >= a_hi)
        return false;
    // row t sees keys [t + a_lo, t + a_hi) of [0, k_len): rows (-a_hi,
    // k_len - a_lo) see some; key u is seen by rows (u - a_hi, u - a_lo]:
    // keys [a_lo, q_len - 1 + a_hi) are seen
    const int64_t t_lo = std::max<int64_t>(0, sat_sub(1, a_hi));
    const int64_t t_hi = std::min<int64_t>(q_len, sat_sub(k_len, a_lo));
    const int64_t u_lo = std::max<int64_t>(0, a_lo);
    const int64_t u_hi = std::min<int64_t>(k_len, sat_add(q_len - 1, a_hi));
    if (t_lo >= t_hi || u_lo >= u_hi)
        return false;
    // the new origins move the bands by t_lo - u_lo
    band r;
    r.q0 = q_row + t_lo;
    r.q1 = q_row + t_hi;
    r.k0 = k_row + u_lo;
    r.k1 = k_row + u_hi;
    r.a_lo = sat_add(a_lo, t_lo - u_lo);
    r.a_hi = sat_add(a_hi, t_lo - u_lo);
    r.b_lo = sat_sub(1, r.a_hi);
    r.b_hi = sat_sub(1, r.a_lo);
    *out = r;
    return true;
}

// Visible pairs of band r in query rows [i0, i1) (inside the band's rows),
// or in key rows [i0, i1) with by_key: the trapezoid of the first and last
// row's counts (exact where the counts change linearly, which is all a
// band does between its kinks; close enough to order tiles).
double pairs(const band &r, int64_t i0, int64_t i1, bool by_key)
{
    int64_t lo, hi, lo2, hi2;
    if (by_key) {
        band_queries(r, i0, &lo, &hi);
        band_queries(r, i1 - 1, &lo2, &hi2);
    } else {
        band_keys(r, i0, &lo, &hi);
        band_keys(r, i1 - 1, &lo2, &hi2);
    }
    return 0.5 * (double)((hi - lo) + (hi2 - lo2)) * (double)(i1 - i0);
}

struct index_host {
    std::vector<int> start, ids, order;
};

// The index of tiles of `tile` rows over n rows; by_key: key tiles.
void build_index(const std::vector<band> &bands, int64_t n, int tile, bool by_key, index_host *ix)
{
    const int64_t ntiles = (n + tile - 1) / tile;
    std::vector<int> count((size_t)ntiles + 1, 0);
    std::vector<double> cost((size_t)ntiles, 0.0);
    for (const band &r : bands) {
        const int64_t a = by_key ? r.k0 : r.q0, b = by_key ? r.k1 : r.q1;
        for (int64_t t = a / tile; t * tile < b; t++) {
            count[(size_t)t + 1]++;
            cost[(size_t)t] += pairs(r, std::max(a, t * tile), std::min(b, (t + 1) * tile), by_key);
        }
    }
    ix->start.assign((size_t)ntiles + 1, 0);
    for (int64_t t = 0; t < ntiles; t++)
        ix->start[(size_t)t + 1] = ix->start[(size_t)t] + count[(size_t)t + 1];
    ix->ids.assign((size_t)ix->start[(size_t)ntiles], 0);
    std::vector<int> fill(ix->start.begin(), ix->start.end() - 1);
    for (size_t i = 0; i < bands.size(); i++) {
        const band &r = bands[i];
        const int64_t a = by_key ? r.k0 : r.q0, b = by_key ? r.k1 : r.q1;
        for (int64_t t = a / tile; t * tile < b; t++)
            ix->ids[(size_t)fill[(size_t)t]++] = (int)i;
    }
    // a fixed cost per tile (loads, epilogue) on top of its pairs
    ix->order.resize((size_t)ntiles);
    for (int64_t t = 0; t < ntiles; t++)
        ix->order[(size_t)t] = (int)t;
    std::stable_sort(ix->order.begin(), ix->order.end(),
                     [&](int x, int y) { return cost[(size_t)x] > cost[(size_t)y]; });
}

// Pinned staging buffers, used in turn, and the memory pool of the device
// copies. The copies are stream-ordered allocations, one per call and freed
// after its kernels: the device's default pool hands its memory back at
// every synchronisation, which made each call's cudaMallocAsync map memory
// again (40-75 us); this pool keeps up to POOL_KEEP bytes.
constexpr int STAGES = 16;
constexpr uint64_t POOL_KEEP = 64ull << 20;
struct stage_ring {
    struct slot {
        void *host = nullptr;
        size_t bytes = 0;
        cudaEvent_t done = nullptr; // recorded after the copy that read it
        bool used = false;
    } slot[STAGES];
    int next = 0;
    cudaMemPool_t pool = nullptr;
};

size_t align8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

} // namespace

void rect_stage_free(state *s)
{
    stage_ring *ring = static_cast<stage_ring *>(s->rect_stage);
    if (!ring)
        return;
    for (auto &sl : ring->slot) {
        if (sl.done) {
            cudaEventSynchronize(sl.done);
            cudaEventDestroy(sl.done);
        }
        if (sl.host)
            cudaFreeHost(sl.host);
    }
    if (ring->pool) // (released once its last stream-ordered free has run)
        cudaMemPoolDestroy(ring->pool);
    delete ring;
    s->rect_stage = nullptr;
}

cp_status rect_upload(state *s, attn_params *p, int q_tile, int k_tile, void **buf)
{
    *buf = nullptr;
    const char *what = "attention rectangles";
    std::vector<band> bands;
    index_host byq, byk;
    try {
        if (p->host_rects) {
            bands.reserve((size_t)p->num_host_rects);
            for (int64_t i = 0; i < p->num_host_rects; i++) {
                const cp_attn_rect &g = p->host_rects[i];
                band r;
                if (make_band(*p, g.q_row, g.q_len, g.k_row, g.k_len, g.q_pos, g.k_pos, &r))
                    bands.push_back(r);
            }
        } else {
            band r;
            if (make_band(*p, 0, p->Sq, 0, p->Sk, p->q_pos, p->k_pos, &r))
                bands.push_back(r);
        }
        if (bands.size() > (size_t)INT_MAX / 4)
            return fail(CP_ERROR_UNSUPPORTED, "%s: %zu rectangles (at most %d)", what, bands.size(), INT_MAX / 4);
        build_index(bands, p->Sq, q_tile, false, &byq);
        build_index(bands, p->Sk, k_tile, true, &byk);
        if (byq.ids.size() > (size_t)INT_MAX / 2 || byk.ids.size() > (size_t)INT_MAX / 2)
            return fail(CP_ERROR_UNSUPPORTED, "%s: %zu and %zu tile entries (too many)", what, byq.ids.size(),
                        byk.ids.size());
    } catch (const std::bad_alloc &) {
        return fail(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory for %" PRId64 " rectangles", what,
                    p->num_host_rects);
    }

    // one buffer: bands, then for each index start, ids, order
    const std::vector<int> *arrays[6] = {&byq.start, &byq.ids, &byq.order, &byk.start, &byk.ids, &byk.order};
    size_t off[7];
    off[0] = align8(bands.size() * sizeof(band));
    for (int i = 0; i < 6; i++)
        off[i + 1] = off[i] + align8(arrays[i]->size() * sizeof(int));
    const size_t total = off[6] > 0 ? off[6] : 8;

    if (!s->rect_stage) {
        s->rect_stage = new (std::nothrow) stage_ring();
        if (!s->rect_stage)
            return fail(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what);
    }
    stage_ring *ring = static_cast<stage_ring *>(s->rect_stage);
    cudaError_t e;
    if (!ring->pool) {
        cudaMemPoolProps props = {};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = s->device;
        if ((e = cudaMemPoolCreate(&ring->pool, &props)) != cudaSuccess) {
            ring->pool = nullptr;
            return cuda_fail("cudaMemPoolCreate", e);
        }
        uint64_t keep = POOL_KEEP;
        if ((e = cudaMemPoolSetAttribute(ring->pool, cudaMemPoolAttrReleaseThreshold, &keep)) != cudaSuccess)
            return cuda_fail("cudaMemPoolSetAttribute", e);
    }
    auto &sl = ring->slot[ring->next];
    ring->next = (ring->next + 1) % STAGES;
    if (sl.used && (e = cudaEventSynchronize(sl.done)) != cudaSuccess)
        return cuda_fail("cudaEventSynchronize", e);
    if (!sl.done && (e = cudaEventCreateWithFlags(&sl.done, cudaEventDisableTiming)) != cudaSuccess)
        return cuda_fail("cudaEventCreateWithFlags", e);
    if (sl.bytes < total) {
        const size_t want = std::max(total, 2 * sl.bytes);
        if (sl.host)
            cudaFreeHost(sl.host);
        sl.host = nullptr;
        sl.bytes = 0;
        if ((e = cudaMallocHost(&sl.host, want)) != cudaSuccess) {
            cudaGetLastError();
            return fail(CP_ERROR_OUT_OF_MEMORY, "%s: cudaMallocHost of %zu bytes: %s", what, want,
                        cudaGetErrorString(e));
        }
        sl.bytes = want;
    }
    char *h = static_cast<char *>(sl.host);
    if (!bands.empty())
        memcpy(h, bands.data(), bands.size() * sizeof(band));
    for (int i = 0; i < 6; i++)
        if (!arrays[i]->empty())
            memcpy(h + off[i], arrays[i]->data(), arrays[i]->size() * sizeof(int));

    void *d = nullptr;
    if ((e = cudaMallocFromPoolAsync(&d, total, ring->pool, s->stream)) != cudaSuccess) {
        cudaGetLastError();
        return fail(CP_ERROR_OUT_OF_MEMORY, "%s: cudaMallocFromPoolAsync of %zu bytes: %s", what, total,
                    cudaGetErrorString(e));
    }
    if ((e = cudaMemcpyAsync(d, h, total, cudaMemcpyHostToDevice, s->stream)) != cudaSuccess ||
        (e = cudaEventRecord(sl.done, s->stream)) != cudaSuccess) {
        cudaFreeAsync(d, s->stream);
        return cuda_fail("cudaMemcpyAsync", e);
    }
    sl.used = true;
    char *dc = static_cast<char *>(d);
    p->rs.bands = reinterpret_cast<const band *>(dc);
    p->rs.nbands = (int)bands.size();
    p->rs.by_q = tile_index{reinterpret_cast<const int *>(dc + off[0]), reinterpret_cast<const int *>(dc + off[1]),
                            reinterpret_cast<const int *>(dc + off[2]), q_tile, (int)(byq.start.size() - 1)};
    p->rs.by_k = tile_index{reinterpret_cast<const int *>(dc + off[3]), reinterpret_cast<const int *>(dc + off[4]),
                            reinterpret_cast<const int *>(dc + off[5]), k_tile, (int)(byk.start.size() - 1)};
    *buf = d;
    return CP_SUCCESS;
}

cp_status rect_release(state *s, void *buf, cp_status r)
{
    if (!buf)
        return r;
    cudaError_t e = cudaFreeAsync(buf, s->stream);
    if (e != cudaSuccess && r == CP_SUCCESS)
        return cuda_fail("cudaFreeAsync", e);
    return r;
}

} // namespace cu
