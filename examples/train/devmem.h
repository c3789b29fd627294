/* SPDX-License-Identifier: MIT */
/*
 * Memory on the device the CP attention runs on. The model's other layers
 * run on the CPU in this example, so the attention's tensors are copied to
 * the device and back around each call: on the CPU that is a plain copy;
 * with --device cuda it goes through the CUDA runtime, loaded at run time
 * (dlopen) so that the example builds and runs where no CUDA is installed.
 * A real trainer keeps everything on the GPU and needs none of this.
 */
#ifndef TRAIN_DEVMEM_H
#define TRAIN_DEVMEM_H

#include <stddef.h>

typedef struct devmem {
    int cuda; /* 0: host memory */
    int device_count;
} devmem;

/* Load the CUDA runtime when cuda != 0; on failure writes why into err. */
int devmem_init(devmem *d, int cuda, char *err, size_t cap);
/* Make `index` the calling thread's device (CUDA only; no-op on the CPU). */
int devmem_use(const devmem *d, int index);
void *devmem_alloc(const devmem *d, size_t bytes); /* zeroed */
void devmem_free(const devmem *d, void *p);
int devmem_to_device(const devmem *d, void *dst, const void *src, size_t bytes);
int devmem_to_host(const devmem *d, void *dst, const void *src, size_t bytes);
/* Wait for all work on the calling thread's device (CUDA only): a copy from
 * pageable host memory may still be in flight when cudaMemcpy returns, and
 * the library's streams do not wait for it. */
int devmem_sync(const devmem *d);
/* A stream of its own on the calling thread's device that does not wait for
 * the legacy default stream (cudaStreamNonBlocking); *stream = NULL on the
 * CPU. devmem_stream_destroy(NULL) is a no-op. */
int devmem_stream_create(const devmem *d, void **stream);
void devmem_stream_destroy(const devmem *d, void *stream);
/* Bytes in use on the calling thread's device, by every process and
 * context (cudaMemGetInfo); CUDA only, -1 elsewhere. */
int devmem_used(const devmem *d, size_t *used);

#endif
