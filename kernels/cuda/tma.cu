// SPDX-License-Identifier: MIT
// Tensor maps for the bulk tensor copy engine (TMA) of the Hopper kernels:
// the host side of the loads that wgmma.cuh's tma_tile issues.
#include "wgmma.cuh"

namespace cu {
namespace wg {
namespace {

using encode_fn = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's tensor-map encoder (the module links only the runtime), or
// NULL where the driver has none.
encode_fn tensor_map_encoder()
{
    static const encode_fn fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
        cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError(); // not sticky; clear it for check_launch
            return (encode_fn) nullptr;
        }
        return reinterpret_cast<encode_fn>(f);
    }();
    return fn;
}

struct axis {
    int64_t size, stride; // stride in elements
    uint32_t box;
    int which; // 0 rows, 1 heads, 2 batches
};

// The common part: dimension 0 holds `cols` contiguous elements of esize
// bytes (boxes of bcols); ax the other three, ordered here by stride.
bool encode(CUtensorMap *map, int (&pos)[3], const void *base, CUtensorMapDataType type, int esize, int64_t cols,
            uint32_t bcols, axis (&ax)[3], CUtensorMapSwizzle swz)
{
    const encode_fn enc = tensor_map_encoder();
    if (!enc || ((uintptr_t)base & 15) || cols > ((int64_t)1 << 31))
        return false;
    const int64_t lim = ((int64_t)1 << 40) / esize; // strides below 2^40 bytes
    for (axis &a : ax)
        if (a.size > 1 && (a.stride <= 0 || a.stride >= lim || a.stride * esize % 16))
            return false;
    // dimensions of one index last (their stride is never used, but must be valid)
    auto key = [](const axis &a) { return a.size > 1 ? a.stride : INT64_MAX; };
    for (int i = 1; i < 3; i++)
        for (int j = i; j > 0 && key(ax[j]) < key(ax[j - 1]); j--) {
            const axis x = ax[j];
            ax[j] = ax[j - 1], ax[j - 1] = x;
        }
    cuuint64_t gdim[4] = {(cuuint64_t)cols, 0, 0, 0}, gstride[3];
    cuuint32_t box[4] = {bcols, 0, 0, 0}, estr[4] = {1, 1, 1, 1};
    int64_t prev = 16 / esize; // elements (16 bytes)
    for (int i = 0; i < 3; i++) {
        const int64_t st = ax[i].size > 1 ? ax[i].stride : prev;
        if (st >= lim || ax[i].size > ((int64_t)1 << 31))
            return false;
        gdim[i + 1] = (cuuint64_t)ax[i].size;
        gstride[i] = (cuuint64_t)(st * esize);
        box[i + 1] = ax[i].box;
        pos[ax[i].which] = i + 1;
        prev = st;
    }
    const CUresult r = enc(map, type, 4, const_cast<void *>(base), gdim, gstride, box, estr,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

} // namespace

bool make_map(CUtensorMap *map, int (&pos)[3], const tensor &t, cp_dtype dt, int64_t n, int nh, int nb, int dim,
              int rows)
{
    axis ax[3] = {{n, t.ss, (uint32_t)rows, 0}, {nh, t.sh, 1, 1}, {nb, t.sb, 1, 2}};
    if (dt == CP_DTYPE_FP8_E4M3) // 128 one-byte columns a box: the same 128-byte rows
        return encode(map, pos, t.p, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, dim, 128, ax, CU_TENSOR_MAP_SWIZZLE_128B);
    const CUtensorMapDataType type =
        dt == CP_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return encode(map, pos, t.p, type, 2, dim, 64, ax, CU_TENSOR_MAP_SWIZZLE_128B);
}

bool make_sum_map(CUtensorMap *map, int (&pos)[3], const tensor &t, int64_t n, int nh, int nb, int dim, int rows)
{
    axis ax[3] = {{n, t.ss, (uint32_t)rows, 0}, {nh, t.sh, 1, 1}, {nb, t.sb, 1, 2}};
    return encode(map, pos, t.p, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, dim, 32, ax, CU_TENSOR_MAP_SWIZZLE_128B);
}

bool make_row_map(CUtensorMap *map, int (&pos)[3], const float *base, int64_t n, int nh, int64_t sh, int nb,
                  int64_t sb, int len)
{
    axis ax[3] = {{1, 1, 1, 0}, {nh, sh, 1, 1}, {nb, sb, 1, 2}};
    return encode(map, pos, base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, n, (uint32_t)len, ax,
                  CU_TENSOR_MAP_SWIZZLE_NONE);
}

} // namespace wg
} // namespace cu
