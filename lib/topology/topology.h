/* SPDX-License-Identifier: MIT */
/* cp_topology internals: the sizes and axis order of a validated topology,
 * for library code that needs them (checkpoint metadata, groups). */
#ifndef INFINICP_TOPOLOGY_H
#define INFINICP_TOPOLOGY_H

#include "core/internal.h"

/* The four named axes of the order string, as indices of the arrays below. */
typedef enum cpi_axis {
    CPI_AXIS_TP = 0,
    CPI_AXIS_CP = 1,
    CPI_AXIS_DP = 2,
    CPI_AXIS_PP = 3,
    CPI_NUM_AXES = 4
} cpi_axis;

/* "tp-cp-dp-pp" is 11 characters; any permutation has the same length. */
#define CPI_ORDER_LEN 11

/* Every field is set by cp_topology_create and never changes afterwards. */
struct cp_topology {
    int world_size;
    int size[CPI_NUM_AXES];   /* tp, cp, dp (derived when the config said 0), pp */
    int cp_a2a, cp_p2p;       /* size[CPI_AXIS_CP] == cp_a2a * cp_p2p */
    int order[CPI_NUM_AXES];  /* axis indices, fastest varying first */
    int stride[CPI_NUM_AXES]; /* rank distance between neighbours along each axis */
    char order_name[CPI_ORDER_LEN + 1]; /* canonical spelling of order, e.g. "tp-cp-dp-pp" */
};

/* "tp", "cp", "dp" or "pp". */
const char *cpi_axis_name(cpi_axis a);

/* Parse an order string (a permutation of the four names joined by '-',
 * fastest first) into axis indices. On failure the message starts with
 * `func` and names `what` and the offending part of the string. */
cp_status cpi_topology_parse_order(const char *func, const char *what, const char *s,
                                   int order[CPI_NUM_AXES]);

#endif
