/* SPDX-License-Identifier: MIT */
#ifndef INFINICP_COMM_H
#define INFINICP_COMM_H

#include "core/internal.h"

struct cpi_agreement;

/*
 * What the core can ask of a built-in transport beyond the module ABI: the
 * agreement's fold (agree.h). A fold is the agreement's own protocol - a
 * rejection that stands in for whichever collective the peers call next,
 * naming a rank of another communicator (the call's) - which the ABI does
 * not freeze while the agreement is young; so no module table carries it,
 * and a comm whose transport lacks it holds a vote instead.
 */
typedef struct cpi_transport_caps {
    /* Stand in for the peers' next collective on this communicator: every
     * peer's next call fails before any byte moves. origin (a rank of the
     * agreement's communicator, of size ranks) failed with s first. */
    cp_status (*reject)(void *impl, int timeout_ms, cp_status s, int origin, int size);
    /* Whether a peer's reject failed this rank's last call, and its origin
     * and status. */
    bool (*rejected)(const void *impl, int *origin, cp_status *s);
    /* reduce_scatter that stages in the caller's scratch (on the buffers'
     * device) where it fits, instead of memory of its own; may be NULL. */
    cp_status (*reduce_scatter_ws)(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                                   cp_dtype dtype, cp_reduce_op op, void *scratch, size_t scratch_bytes);
} cpi_transport_caps;

/* A communicator: one rank's handle on a transport instance. */
struct cp_comm {
    const cp_transport_ops *ops;
    const cpi_transport_caps *caps; /* NULL: none (every module transport) */
    void *impl; /* the transport's; destroyed with ops->destroy */
    int rank;
    int size;
    /* The agreement whose verdict this communicator's next exchange
     * carries (agree.h), NULL when none: only the calling thread uses it. */
    struct cpi_agreement *agreement;
};

/* The module host's comm_wrap (backend.h): a comm without caps. Refuses a
 * table of another ABI version or one with a required slot NULL. */
cp_status cpi_comm_wrap(const cp_transport_ops *ops, void *impl, int rank, int size, cp_comm **out);

/* cpi_comm_wrap for a built-in transport with capabilities (NULL: none);
 * communicators split from the result have them too. */
cp_status cpi_comm_wrap_caps(const cp_transport_ops *ops, const cpi_transport_caps *caps, void *impl, int rank,
                             int size, cp_comm **out);

/* cp_comm_split with a wait limit for the peers (timeout_ms <= 0: forever). */
cp_status cpi_comm_split(cp_comm *c, int color, int key, int timeout_ms, cp_comm **out);

/* The transfer with a backend table filled in: NULL means host memory, and
 * host memory is served by the CPU backend, whose copies, conversions and
 * reductions need no state. Transports then always have a table. */
cp_xfer cpi_xfer_resolve(const cp_xfer *x);

/* Scratch bytes the in-process transport stages a reduction of count
 * elements in (cpi_reduce_scatter_ws; recv_apart: recv does not overlap
 * this rank's send). */
size_t cpi_reduce_scratch_bytes(size_t count, cp_dtype dtype, bool recv_apart);

/* Default wait for peers where no group supplies one (CP_GROUP_CONFIG_INIT). */
#define CPI_DEFAULT_TIMEOUT_MS 300000

#endif
