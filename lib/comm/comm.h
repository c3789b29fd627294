/* SPDX-License-Identifier: MIT */
#ifndef INFINICP_COMM_H
#define INFINICP_COMM_H

#include "core/internal.h"

struct cpi_agreement;

/* A communicator: one rank's handle on a transport instance. */
struct cp_comm {
    const cp_transport_ops *ops;
    void *impl; /* the transport's; destroyed with ops->destroy */
    int rank;
    int size;
    /* The agreement whose verdict this communicator's next exchange
     * carries (agree.h), NULL when none: only the calling thread uses it. */
    struct cpi_agreement *agreement;
};

cp_status cpi_comm_wrap(const cp_transport_ops *ops, void *impl, int rank, int size, cp_comm **out);

/* cp_comm_split with a wait limit for the peers (timeout_ms <= 0: forever). */
cp_status cpi_comm_split(cp_comm *c, int color, int key, int timeout_ms, cp_comm **out);

/* The transfer with a backend table filled in: NULL means host memory, and
 * host memory is served by the CPU backend, whose copies, conversions and
 * reductions need no state. Transports then always have a table. */
cp_xfer cpi_xfer_resolve(const cp_xfer *x);

/* The built-in in-process transport (local.c). */
extern const cp_transport_ops cpi_local_transport;

/* all_to_all of strided blocks on the local transport (impl: its instance);
 * see cpi_all_to_all_2d. */
cp_status cpi_local_all_to_all_2d(void *impl, const cp_xfer *x, const void *send, ptrdiff_t send_step,
                                  size_t send_pitch, void *recv, ptrdiff_t recv_step, size_t recv_pitch, size_t width,
                                  size_t rows);

/* The local transport's side of an agreement (agree.h): stand in for the
 * peers' next collective with a CPI_CALL_REJECT descriptor, and tell which
 * peer's rejection failed this rank's last call. */
cp_status cpi_local_reject(void *impl, int timeout_ms, cp_status s, int origin, int size);
bool cpi_local_rejected(const void *impl, int *origin, cp_status *s);

/* Default wait for peers where no group supplies one (CP_GROUP_CONFIG_INIT). */
#define CPI_DEFAULT_TIMEOUT_MS 300000

#endif
