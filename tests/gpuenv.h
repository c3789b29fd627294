/* SPDX-License-Identifier: MIT */
/* What the GPU suites share: opening the CUDA backend (or explaining why the
 * suite is skipped), and moving buffers between host and device. Include
 * after <cmocka.h>. */
#ifndef INFINICP_TESTS_GPUENV_H
#define INFINICP_TESTS_GPUENV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context.h"

/* Exit status that makes meson report a test as skipped. */
#define GPU_SKIP 77

static const cp_backend_ops *gpu_ops;

/* Load the module and open device 0 with the attention path forced to
 * `path` (NULL = automatic, whose F16 / BF16 backward adds dQ with atomics;
 * "mma" = mma.sync also where the Hopper forward would run; "mma-mt1" = that
 * with one row tile per warp in the forward; "wgmma" = the Hopper forward
 * and backward where they fit; "mma-det" = the automatic path with the deterministic
 * backward). Returns NULL, having printed why, when there is no module,
 * driver or GPU. */
static inline void *gpu_open(const char *path)
{
    const int det = path && !strcmp(path, "mma-det");
    if (det)
        path = NULL;
    if (path && !strcmp(path, "mma-mt1")) {
        setenv("INFINICP_CUDA_FWD_MT", "1", 1);
        path = "mma";
    }
    if (!gpu_ops) {
        cp_status s = cpi_backend_for(CP_DEVICE_CUDA, &gpu_ops);
        if (s != CP_SUCCESS) {
            printf("SKIP: no CUDA backend module: %s\n", cp_last_error());
            return NULL;
        }
    }
    if (path)
        setenv("INFINICP_CUDA_ATTN", path, 1);
    else
        unsetenv("INFINICP_CUDA_ATTN");
    void *st = NULL;
    cp_status s = gpu_ops->open(0, NULL, 0, &st);
    unsetenv("INFINICP_CUDA_ATTN");
    unsetenv("INFINICP_CUDA_FWD_MT");
    if (s != CP_SUCCESS) {
        printf("SKIP: no usable CUDA device: %s (%s)\n", cp_last_error(), cp_status_string(s));
        return NULL;
    }
    if (det) {
        if (!CP_BACKEND_HAS(gpu_ops, set_deterministic))
            fail_msg("the CUDA module has no set_deterministic slot");
        assert_int_equal(gpu_ops->set_deterministic(st, 1), CP_SUCCESS);
    }
    return st;
}

static inline void *dev_alloc(void *st, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(gpu_ops->alloc(st, bytes, &p), CP_SUCCESS);
    return p;
}

static inline void upload(void *st, void *dst, const void *src, size_t bytes)
{
    assert_int_equal(gpu_ops->copy_2d(st, dst, bytes, src, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE), CP_SUCCESS);
}

static inline void download(void *st, void *dst, const void *src, size_t bytes)
{
    assert_int_equal(gpu_ops->copy_2d(st, dst, bytes, src, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST), CP_SUCCESS);
    assert_int_equal(gpu_ops->synchronize(st), CP_SUCCESS);
}

/* A device copy of n host bytes. */
static inline void *dev_copy(void *st, const void *src, size_t bytes)
{
    void *p = dev_alloc(st, bytes);
    upload(st, p, src, bytes);
    return p;
}

#endif
