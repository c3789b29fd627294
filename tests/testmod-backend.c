/* SPDX-License-Identifier: MIT */
/* A backend module for test-module, built as backend-cuda.so and found
 * through INFINICP_MODULE_PATH. Every slot is a stub that succeeds; the
 * optional slots are left NULL, and so is the slot that $TESTMOD_NULL_SLOT
 * names, so that the core's check of module tables can be tried slot by
 * slot in one process (the core keeps only a table it accepted, and calls
 * the module again after a refusal).
 *
 * testmod_nccl(1), which the test finds with dlsym, fills the NCCL slots of
 * the table the core kept (nccl_unique_id, nccl_comm_create): stand-ins
 * that make a known id and communicators over a stub transport, and count
 * what they are given in testmod_nccl_log. */
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

/* ---- the NCCL slots ---------------------------------------------------- */

typedef struct testmod_nccl_log {
    int ids;                 /* nccl_unique_id calls */
    int created, destroyed;  /* communicators */
    void *state;             /* the last nccl_comm_create's arguments */
    unsigned char id[128];
    size_t bytes;
    int nranks, rank;
} testmod_nccl_log;

static const cp_module_host *g_host;
static testmod_nccl_log g_log;

__attribute__((visibility("default"))) testmod_nccl_log *testmod_nccl_stats(void);
__attribute__((visibility("default"))) testmod_nccl_log *testmod_nccl_stats(void)
{
    return &g_log;
}

static cp_status tm_nccl_unique_id(void *id, size_t bytes)
{
    unsigned char *p = id;
    for (size_t i = 0; i < bytes; i++)
        p[i] = (unsigned char)(i * 7 + 3);
    g_log.ids++;
    return CP_SUCCESS;
}

static cp_status tp_all_gather(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    return CP_SUCCESS;
}

static cp_status tp_reduce_scatter(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                                   cp_dtype dtype, cp_reduce_op op)
{
    return CP_SUCCESS;
}

static cp_status tp_all_to_all(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    return CP_SUCCESS;
}

static cp_status tp_sendrecv(void *impl, const cp_xfer *x, const void *send, size_t send_bytes, int dst, void *recv,
                             size_t recv_bytes, int src)
{
    return CP_SUCCESS;
}

static cp_status tp_all_reduce(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                               cp_dtype dtype, cp_reduce_op op)
{
    return CP_SUCCESS;
}

static cp_status tp_barrier(void *impl, const cp_xfer *x)
{
    return CP_SUCCESS;
}

static cp_status tp_split(void *impl, int color, int key, int timeout_ms, void **out_impl, int *out_rank,
                          int *out_size)
{
    *out_impl = NULL;
    return g_host->set_error(CP_ERROR_UNSUPPORTED, "testmod: no split");
}

static void tp_destroy(void *impl)
{
    free(impl);
    g_log.destroyed++;
}

static const cp_transport_ops stub_transport = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_transport_ops),
    .name = "testmod-nccl",
    .all_gather = tp_all_gather,
    .reduce_scatter = tp_reduce_scatter,
    .all_to_all = tp_all_to_all,
    .sendrecv = tp_sendrecv,
    .all_reduce = tp_all_reduce,
    .barrier = tp_barrier,
    .split = tp_split,
    .destroy = tp_destroy,
};

static cp_status tm_nccl_comm_create(void *state, const void *id, size_t bytes, int nranks, int rank, cp_comm **out)
{
    g_log.state = state;
    g_log.bytes = bytes;
    memcpy(g_log.id, id, bytes < sizeof g_log.id ? bytes : sizeof g_log.id);
    g_log.nranks = nranks;
    g_log.rank = rank;
    /* real memory, so that a communicator never destroyed shows as a leak */
    void *impl = malloc(1);
    if (!impl)
        return CP_ERROR_OUT_OF_MEMORY;
    cp_status s = g_host->comm_wrap(&stub_transport, impl, rank, nranks, out);
    if (s != CP_SUCCESS) {
        free(impl);
        return s;
    }
    g_log.created++;
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

/* Fill (on = 1) or clear the NCCL slots of the table, also after the core kept it. */
__attribute__((visibility("default"))) void testmod_nccl(int on);
__attribute__((visibility("default"))) void testmod_nccl(int on)
{
    table.nccl_unique_id = on ? tm_nccl_unique_id : NULL;
    table.nccl_comm_create = on ? tm_nccl_comm_create : NULL;
}

__attribute__((visibility("default"))) const cp_backend_ops *cp_backend_module_v1(const cp_module_host *host)
{
    g_host = host;
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
