/* SPDX-License-Identifier: MIT */
/* A backend module for test-module, built as backend-cuda.so and found
 * through INFINICP_MODULE_PATH. Every slot is a stub that succeeds; the
 * optional slots are left NULL, and so is the slot that $TESTMOD_NULL_SLOT
 * names, so that the core's check of module tables can be tried slot by
 * slot in one process (the core keeps only a table it accepted, and calls
 * the module again after a refusal). */
#include <stdlib.h>
#include <string.h>

#include <infinicp/backend.h>

static cp_status tm_open(int device_index, void *stream, int num_threads, void **state)
{
    /* Real memory, so that valgrind sees a close that is missing. */
    *state = malloc(1);
    return *state ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
}

static void tm_close(void *state)
{
    free(state);
}

static cp_status tm_set_stream(void *state, void *stream)
{
    return CP_SUCCESS;
}

static cp_status tm_synchronize(void *state)
{
    return CP_SUCCESS;
}

static cp_status tm_alloc(void *state, size_t bytes, void **ptr)
{
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
}

static void tm_free(void *state, void *ptr)
{
    free(ptr);
}

static cp_status tm_copy_2d(void *state, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t height, cp_copy_kind kind)
{
    return CP_SUCCESS;
}

static cp_status tm_memset(void *state, void *dst, int value, size_t bytes)
{
    return CP_SUCCESS;
}

static cp_status tm_convert(void *state, void *dst, cp_dtype dst_type, const void *src, cp_dtype src_type,
                            size_t count)
{
    return CP_SUCCESS;
}

static cp_status tm_reduce(void *state, void *acc, const void *x, cp_dtype dtype, size_t count, cp_reduce_op op)
{
    return CP_SUCCESS;
}

static cp_status tm_attn_workspace_size(void *state, const cp_kernel_attn_args *a, int backward, size_t *bytes)
{
    *bytes = 0;
    return CP_SUCCESS;
}

static cp_status tm_attn(void *state, const cp_kernel_attn_args *a)
{
    return CP_SUCCESS;
}

static cp_status tm_merge(void *state, const cp_kernel_merge_args *a)
{
    return CP_SUCCESS;
}

static const cp_backend_ops full = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_backend_ops),
    .name = "testmod",
    .device = CP_DEVICE_CUDA,
    .open = tm_open,
    .close = tm_close,
    .set_stream = tm_set_stream,
    .synchronize = tm_synchronize,
    .alloc = tm_alloc,
    .free = tm_free,
    .copy_2d = tm_copy_2d,
    .memset = tm_memset,
    .convert = tm_convert,
    .reduce = tm_reduce,
    .attn_workspace_size = tm_attn_workspace_size,
    .attn_forward = tm_attn,
    .attn_backward = tm_attn,
    .merge = tm_merge,
};

static cp_backend_ops table;

__attribute__((visibility("default"))) const cp_backend_ops *cp_backend_module_v1(const cp_module_host *host);

__attribute__((visibility("default"))) const cp_backend_ops *cp_backend_module_v1(const cp_module_host *host)
{
    table = full;
    const char *slot = getenv("TESTMOD_NULL_SLOT");
#define CLEAR(name)                                                                        \
    if (slot && !strcmp(slot, #name))                                                      \
        table.name = NULL;
    CLEAR(open) CLEAR(close) CLEAR(set_stream) CLEAR(synchronize) CLEAR(alloc) CLEAR(free) CLEAR(copy_2d)
    CLEAR(memset) CLEAR(convert) CLEAR(reduce) CLEAR(attn_workspace_size) CLEAR(attn_forward)
    CLEAR(attn_backward) CLEAR(merge)
#undef CLEAR
    return &table;
}
