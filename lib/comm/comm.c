/* SPDX-License-Identifier: MIT */
/* cp_comm: the transport-neutral communicator handle. */
#include <stdio.h>
#include <stdlib.h>

#include "comm/agree.h"

/* The first published transport table ends with destroy. */
#define TRANSPORT_OPS_V1_SIZE (offsetof(cp_transport_ops, destroy) + sizeof(void (*)(void *)))

/* The slots every transport must fill (backend.h: all slots up to destroy).
 * The core calls them without looking, so a NULL one would crash a later
 * call; the optional slots after destroy are looked at before each use. */
#define REQUIRED_SLOTS(X)                                                                  \
    X(all_gather) X(reduce_scatter) X(all_to_all) X(sendrecv) X(all_reduce) X(barrier) X(split) X(destroy)

/* Names of the required slots that ops leaves NULL, comma-separated, into
 * buf; returns whether there was one. */
static bool missing_slots(const cp_transport_ops *ops, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    REQUIRED_SLOTS(CPI_LIST_NULL_SLOT)
    return used > 0;
}

cp_status cpi_comm_wrap_caps(const cp_transport_ops *ops, const cpi_transport_caps *caps, void *impl, int rank,
                             int size, cp_comm **out)
{
    char missing[128];
    if (out)
        *out = NULL;
    if (!ops || !impl || !out || size < 1 || rank < 0 || rank >= size)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "comm_wrap: ops %p impl %p out %p rank %d size %d",
                         (const void *)ops, impl, (void *)out, rank, size);
    const char *name = ops->name ? ops->name : "?";
    if (ops->abi_version != CP_MODULE_ABI_VERSION || ops->struct_size < TRANSPORT_OPS_V1_SIZE)
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "comm_wrap: transport \"%s\" has ABI version %u, table size %zu (this library needs "
                         "ABI %u, at least %zu bytes)",
                         name, ops->abi_version, ops->struct_size, CP_MODULE_ABI_VERSION,
                         (size_t)TRANSPORT_OPS_V1_SIZE);
    if (missing_slots(ops, missing, sizeof missing))
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "comm_wrap: transport \"%s\" leaves required slots NULL: %s (only the slots after "
                         "destroy are optional)",
                         name, missing);
    cp_comm *c = cpi_calloc(1, sizeof *c);
    if (!c)
        return CP_ERROR_OUT_OF_MEMORY;
    c->ops = ops;
    c->caps = caps;
    c->impl = impl;
    c->rank = rank;
    c->size = size;
    *out = c;
    return CP_SUCCESS;
}

cp_status cpi_comm_wrap(const cp_transport_ops *ops, void *impl, int rank, int size, cp_comm **out)
{
    return cpi_comm_wrap_caps(ops, NULL, impl, rank, size, out);
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
    s = cpi_comm_wrap_caps(c->ops, c->caps, impl, rank, size, out);
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
