/* SPDX-License-Identifier: MIT */
/* cp_comm: the transport-neutral communicator handle. */
#include <stdlib.h>

#include "comm/comm.h"

cp_status cpi_comm_wrap(const cp_transport_ops *ops, void *impl, int rank, int size, cp_comm **out)
{
    if (!ops || !impl || !out || size < 1 || rank < 0 || rank >= size)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "comm_wrap: ops %p impl %p rank %d size %d",
                         (const void *)ops, impl, rank, size);
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
