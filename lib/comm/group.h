/* SPDX-License-Identifier: MIT */
/* cp_group internals and the checked collective helpers every caller in the
 * library uses (they validate and dispatch to the transport vtable). */
#ifndef INFINICP_GROUP_H
#define INFINICP_GROUP_H

#include "comm/comm.h"
#include "core/context.h"

struct cp_group {
    cp_context *ctx;     /* not owned */
    cp_comm *comm;       /* the CP communicator, not owned */
    cp_comm *a2a;        /* owned: a2a_size consecutive cp ranks (size 1 when a2a_size == 1) */
    cp_comm *p2p;        /* owned: the ranks with equal (rank % a2a_size) */
    cp_group_config cfg; /* validated copy, defaults filled in */
    int rank, size;      /* in comm */
};

/* The transfer description for buffers on the group's context. */
static inline cp_xfer cpi_group_xfer(const cp_group *g)
{
    return cpi_xfer(g->ctx, g->cfg.timeout_ms);
}

cp_status cpi_all_gather(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t bytes);
cp_status cpi_reduce_scatter(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t count,
                             cp_dtype dtype, cp_reduce_op op);
/*
 * reduce_scatter whose staging may use scratch (on the buffers' device,
 * aligned to 256 bytes), which then must stay untouched until the work
 * queued by this call is done (stream order suffices): the in-process
 * transport stages there instead of allocating, freeing and waiting on the
 * host; other transports need none. cpi_reduce_scratch_bytes (comm.h) is
 * what it uses.
 */
cp_status cpi_reduce_scatter_ws(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t count,
                                cp_dtype dtype, cp_reduce_op op, void *scratch, size_t scratch_bytes);
cp_status cpi_all_to_all(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t bytes);
/*
 * all_to_all of strided blocks, without packing them first: block j of this
 * rank's send is `rows` rows of `width` bytes, the first at send + j *
 * send_step, the others send_pitch apart; what rank i sends this rank lands
 * at recv + i * recv_step, rows recv_pitch apart. Steps may be negative
 * (blocks in reverse rank order). Only transports with the optional slot
 * all_to_all_2d do it (cpi_comm_has_all_to_all_2d; the local transport
 * has it); the others answer CP_ERROR_UNSUPPORTED, and callers pack blocks
 * for cpi_all_to_all instead.
 */
bool cpi_comm_has_all_to_all_2d(const cp_comm *c);
cp_status cpi_all_to_all_2d(cp_comm *c, const cp_xfer *x, const void *send, ptrdiff_t send_step, size_t send_pitch,
                            void *recv, ptrdiff_t recv_step, size_t recv_pitch, size_t width, size_t rows);
cp_status cpi_sendrecv(cp_comm *c, const cp_xfer *x, const void *send, size_t send_bytes, int dst,
                       void *recv, size_t recv_bytes, int src);
cp_status cpi_all_reduce(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t count,
                         cp_dtype dtype, cp_reduce_op op);
cp_status cpi_barrier(cp_comm *c, const cp_xfer *x);

/* Wait, with x->timeout_ms, for the work this rank queued on c (and for x's
 * stream), through the transport's optional wait slot: CP_ERROR_TIMEOUT or
 * CP_ERROR_COMM when it gives up. Transports without the slot finish (or
 * order on the stream) inside each call: CP_SUCCESS at once. Call it before
 * synchronizing a backend on transport work, which could otherwise hang. */
cp_status cpi_comm_wait(cp_comm *c, const cp_xfer *x);

/* v[0..n) = op over the ranks of comm, v in host memory (F64). The numbers
 * travel through memory of ctx's device (host memory when ctx is NULL), so
 * that transports which move only device memory (NCCL) work too. */
cp_status cpi_all_reduce_host(cp_context *ctx, cp_comm *comm, int timeout_ms, double *v, size_t n,
                              cp_reduce_op op);

#endif
