/* SPDX-License-Identifier: MIT */
/*
 * The collective suite every transport must pass, run by each rank of a
 * communicator (threads of a local world, or MPI processes). Each rank
 * computes every rank's contribution from a formula, so the expected result
 * of each collective is a serial computation done here (reductions: exact
 * sums in double, then rounded once to the storage type), independent of
 * the code under test.
 *
 * Checks do not abort: a failing rank keeps calling the collectives its
 * peers call, and the count of failures is returned.
 */
#ifndef INFINICP_TEST_COMMSUITE_H
#define INFINICP_TEST_COMMSUITE_H

#include <infinicp/backend.h>

/* Where the suite's buffers live: ops NULL = plain host memory. */
typedef struct suite_mem {
    const cp_backend_ops *ops;
    void *state;
} suite_mem;

/* Every collective at several sizes and dtypes on c, then on communicators
 * split from c by color = rank % k (k = 2, 3; the last rank left out when
 * k = 3). Returns the number of failed checks (0 = pass). */
int suite_collectives(cp_comm *c, const suite_mem *m, int timeout_ms);

/* Ranks that disagree (size, dtype, op, collective, send/recv pairs) must
 * all get CP_ERROR_MISMATCH with recv untouched, and the communicator must
 * work afterwards. Needs size >= 2. Returns the number of failed checks. */
int suite_mismatch(cp_comm *c, const suite_mem *m, int timeout_ms);

/* A CP group with a2a_size on c (size divisible by it) on a CPU context:
 * the group's rank and size, and its a2a / p2p sub-communicators' ranks,
 * sizes and members must be the consecutive / strided ones. */
int suite_group(cp_comm *c, int a2a_size, int timeout_ms);

/* cp_layout_gather on a group over c, with the group's context on m's
 * device (a context built around m->ops) or the CPU: the gathered tensor
 * must be the global one each rank's share was cut from (5-byte tokens). */
int suite_layout_gather(cp_comm *c, const suite_mem *m, cp_layout l, int64_t batch, int64_t seq_len,
                        int timeout_ms);

/* Reference conversions written from the IEEE formats, for tests. */
double suite_round(cp_dtype t, double v);
void suite_encode(cp_dtype t, void *buf, size_t i, double v);
double suite_decode(cp_dtype t, const void *buf, size_t i);

#endif
