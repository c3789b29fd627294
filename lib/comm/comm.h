/* SPDX-License-Identifier: MIT */
#ifndef INFINICP_COMM_H
#define INFINICP_COMM_H

#include "core/internal.h"

/* A communicator: one rank's handle on a transport instance. */
struct cp_comm {
    const cp_transport_ops *ops;
    void *impl; /* the transport's; destroyed with ops->destroy */
    int rank;
    int size;
};

cp_status cpi_comm_wrap(const cp_transport_ops *ops, void *impl, int rank, int size, cp_comm **out);

#endif
