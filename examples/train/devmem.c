/* SPDX-License-Identifier: MIT */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"

/* The few CUDA runtime entry points used, with their C signatures
 * (cudaError_t is an int, 0 = success; cudaMemcpyKind 1 = host to device,
 * 2 = device to host). */
static struct {
    int (*get_device_count)(int *);
    int (*set_device)(int);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*memset_)(void *, int, size_t);
    int (*device_synchronize)(void);
    int (*mem_get_info)(size_t *, size_t *);
    int (*stream_create)(void **, unsigned);
    int (*stream_destroy)(void *);
} cu;

int devmem_init(devmem *d, int cuda, char *err, size_t cap)
{
    memset(d, 0, sizeof *d);
    if (!cuda)
        return 0;
    static const char *names[] = { "libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0" };
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        snprintf(err, cap, "the CUDA runtime (libcudart.so) cannot be loaded: %s", dlerror());
        return -1;
    }
    *(void **)&cu.get_device_count = dlsym(h, "cudaGetDeviceCount");
    *(void **)&cu.set_device = dlsym(h, "cudaSetDevice");
    *(void **)&cu.malloc_ = dlsym(h, "cudaMalloc");
    *(void **)&cu.free_ = dlsym(h, "cudaFree");
    *(void **)&cu.memcpy_ = dlsym(h, "cudaMemcpy");
    *(void **)&cu.memset_ = dlsym(h, "cudaMemset");
    *(void **)&cu.device_synchronize = dlsym(h, "cudaDeviceSynchronize");
    *(void **)&cu.mem_get_info = dlsym(h, "cudaMemGetInfo");
    *(void **)&cu.stream_create = dlsym(h, "cudaStreamCreateWithFlags");
    *(void **)&cu.stream_destroy = dlsym(h, "cudaStreamDestroy");
    if (!cu.stream_create || !cu.stream_destroy ||
        !cu.get_device_count || !cu.set_device || !cu.malloc_ || !cu.free_ || !cu.memcpy_ || !cu.memset_ ||
        !cu.device_synchronize || !cu.mem_get_info) {
        snprintf(err, cap, "the CUDA runtime lacks an entry point this example uses");
        return -1;
    }
    if (cu.get_device_count(&d->device_count) != 0 || d->device_count < 1) {
        snprintf(err, cap, "no CUDA device");
        return -1;
    }
    d->cuda = 1;
    return 0;
}

int devmem_use(const devmem *d, int index)
{
    return d->cuda ? cu.set_device(index % d->device_count) : 0;
}

void *devmem_alloc(const devmem *d, size_t bytes)
{
    if (!d->cuda)
        return calloc(bytes ? bytes : 1, 1);
    void *p = NULL;
    if (cu.malloc_(&p, bytes ? bytes : 1) != 0)
        return NULL;
    if (cu.memset_(p, 0, bytes) != 0) {
        cu.free_(p);
        return NULL;
    }
    return p;
}

void devmem_free(const devmem *d, void *p)
{
    if (!p)
        return;
    if (d->cuda)
        cu.free_(p);
    else
        free(p);
}

int devmem_to_device(const devmem *d, void *dst, const void *src, size_t bytes)
{
    if (!d->cuda) {
        memcpy(dst, src, bytes);
        return 0;
    }
    return cu.memcpy_(dst, src, bytes, 1);
}

int devmem_to_host(const devmem *d, void *dst, const void *src, size_t bytes)
{
    if (!d->cuda) {
        memcpy(dst, src, bytes);
        return 0;
    }
    return cu.memcpy_(dst, src, bytes, 2);
}

int devmem_sync(const devmem *d)
{
    return d->cuda ? cu.device_synchronize() : 0;
}

int devmem_used(const devmem *d, size_t *used)
{
    size_t free_b = 0, total = 0;
    *used = 0;
    if (!d->cuda || cu.mem_get_info(&free_b, &total) != 0)
        return -1;
    *used = total - free_b;
    return 0;
}

int devmem_stream_create(const devmem *d, void **stream)
{
    *stream = NULL;
    /* 1 = cudaStreamNonBlocking */
    return d->cuda ? cu.stream_create(stream, 1) : 0;
}

void devmem_stream_destroy(const devmem *d, void *stream)
{
    if (d->cuda && stream)
        cu.stream_destroy(stream);
}
