/* SPDX-License-Identifier: MIT */
/* cp_comm: the transport-neutral communicator handle. */
#include <stdlib.h>

#include "comm/agree.h"

/* The first published transport table ends with destroy. */
#define TRANSPORT_OPS_V1_SIZE (offsetof(cp_transport_ops, destroy) + sizeof(void (*)(void *)))

cp_status cpi_comm_wrap(const cp_transport_ops *ops, void *impl, int rank, int size, cp_comm **out)
{
    if (out)
        *out = NULL;
    if (!ops || !impl || !out || size < 1 || rank < 0 || rank >= size)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "comm_wrap: ops %p impl %p out %p rank %d size %d",
                         (const void *)ops, impl, (void *)out, rank, size);
    if (ops->abi_version != CP_MODULE_ABI_VERSION || ops->struct_size < TRANSPORT_OPS_V1_SIZE)
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "comm_wrap: transport \"%s\" has ABI version %u, table size %zu (this library needs "
                         "ABI %u, at least %zu bytes)",
                         ops->name ? ops->name : "?", ops->abi_version, ops->struct_size,
                         CP_MODULE_ABI_VERSION, (size_t)TRANSPORT_OPS_V1_SIZE);
    cp_comm *c = cpi_calloc(1, sizeof *c);
    if (!c)
        return CP_ERROR_OUT_OF_MEMORY;
    c->ops = ops;
    c->impl = impl;
    c->rank = rank;
    c->size = size;
    *out = c;
    return CP_SUCCESS;
}

cp_status cpi_comm_split(cp_comm *c, int color, int key, int timeout_ms, cp_comm **out)
{
    *out = NULL;
    void *impl = NULL;
    int rank = -1, size = 0;
    cp_status s = c->ops->split(c->impl, color, key, timeout_ms, &impl, &rank, &size);
    if (c->agreement)
        cpi_agree_exchanged(c, s);
    CPI_TRY(s);
    if (!impl)
        return CP_SUCCESS; /* a negative color: not a member */
    s = cpi_comm_wrap(c->ops, impl, rank, size, out);
    if (s != CP_SUCCESS)
        c->ops->destroy(impl);
    return s;
}

CP_EXPORT cp_status cp_comm_split(cp_comm *c, int color, int key, cp_comm **out)
{
    if (out)
        *out = NULL;
    CPI_CHECK_PTR(c);
    /* A rank without out still takes part, so that its peers fail at once. */
    cp_status local = out ? CP_SUCCESS : cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: out is NULL", __func__);
    const cpi_agree_call call = { .func = __func__, .comm = c, .timeout_ms = CPI_DEFAULT_TIMEOUT_MS };
    cpi_agreement ag;
    CPI_TRY(cpi_agree_open(&ag, &call, local));
    return cpi_agree_close(&ag, cpi_comm_split(c, color, key, CPI_DEFAULT_TIMEOUT_MS, out));
}

CP_EXPORT cp_status cp_comm_rank(const cp_comm *c, int *rank)
{
    CPI_CHECK_PTR(rank);
    *rank = -1;
    CPI_CHECK_PTR(c);
    *rank = c->rank;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_comm_size(const cp_comm *c, int *size)
{
    CPI_CHECK_PTR(size);
    *size = 0;
    CPI_CHECK_PTR(c);
    *size = c->size;
    return CP_SUCCESS;
}

CP_EXPORT void cp_comm_destroy(cp_comm *c)
{
    if (!c)
        return;
    c->ops->destroy(c->impl);
    free(c);
}
