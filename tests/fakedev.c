/* SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "core/context.h"
#include "fakedev.h"

#define KEY 0xA5

static void xor_copy(void *dst, const void *src, size_t n, int key)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++)
        d[i] = (unsigned char)(s[i] ^ key);
}

static cp_status fd_open(int device_index, void *stream, int num_threads, void **state)
{
    *state = NULL;
    return CP_SUCCESS;
}

static void fd_close(void *state)
{
}

static cp_status fd_set_stream(void *state, void *stream)
{
    return CP_SUCCESS;
}

static cp_status fd_synchronize(void *state)
{
    return CP_SUCCESS;
}

static cp_status fd_alloc(void *state, size_t bytes, void **ptr)
{
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
}

static void fd_free(void *state, void *ptr)
{
    free(ptr);
}

static cp_status fd_copy_2d(void *state, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t height, cp_copy_kind kind)
{
    /* Crossing between host and device encodes or decodes. */
    int key = kind == CP_COPY_HOST_TO_DEVICE || kind == CP_COPY_DEVICE_TO_HOST ? KEY : 0;
    for (size_t r = 0; r < height; r++)
        xor_copy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, key);
    return CP_SUCCESS;
}

static cp_status fd_memset(void *state, void *dst, int value, size_t bytes)
{
    memset(dst, value ^ KEY, bytes);
    return CP_SUCCESS;
}

/* Decode, run the CPU kernel, encode. */
static cp_status fd_convert(void *state, void *dst, cp_dtype dst_type, const void *src, cp_dtype src_type,
                            size_t count)
{
    size_t sn = count * cpi_dtype_size(src_type), dn = count * cpi_dtype_size(dst_type);
    void *a = malloc(sn + 1), *b = malloc(dn + 1);
    cp_status s = a && b ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
    if (s == CP_SUCCESS) {
        xor_copy(a, src, sn, KEY);
        s = cpi_cpu_backend()->convert(NULL, b, dst_type, a, src_type, count);
        xor_copy(dst, b, dn, KEY);
    }
    free(a);
    free(b);
    return s;
}

static cp_status fd_reduce(void *state, void *acc, const void *x, cp_dtype dtype, size_t count, cp_reduce_op op)
{
    size_t n = count * cpi_dtype_size(dtype);
    void *a = malloc(n + 1), *b = malloc(n + 1);
    cp_status s = a && b ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
    if (s == CP_SUCCESS) {
        xor_copy(a, acc, n, KEY);
        xor_copy(b, x, n, KEY);
        s = cpi_cpu_backend()->reduce(NULL, a, b, dtype, count, op);
        xor_copy(acc, a, n, KEY);
    }
    free(a);
    free(b);
    return s;
}

static const cp_backend_ops ops = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_backend_ops),
    .name = "fakedev",
    .device = CP_DEVICE_CUDA,
    .open = fd_open,
    .close = fd_close,
    .set_stream = fd_set_stream,
    .synchronize = fd_synchronize,
    .alloc = fd_alloc,
    .free = fd_free,
    .copy_2d = fd_copy_2d,
    .memset = fd_memset,
    .convert = fd_convert,
    .reduce = fd_reduce,
};

const cp_backend_ops *fakedev_ops(void)
{
    return &ops;
}
