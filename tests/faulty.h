/* SPDX-License-Identifier: MIT */
/*
 * A transport that makes one rank fail: it wraps a real communicator and
 * passes every call through, until the chosen rank has completed `after`
 * calls since the fault was armed; at the next call that rank stops in the
 * way the fault says. Communicators split from a wrapped one are wrapped
 * too (they share the fault), so a stop can come in any collective of a
 * group or plan built on it. A plan whose rank is -1 never stops anyone and
 * only counts what passes (sendrecv_bytes).
 */
#ifndef INFINICP_TEST_FAULTY_H
#define INFINICP_TEST_FAULTY_H

#include <stdatomic.h>

#include <infinicp/infinicp.h>

typedef enum faulty_how {
    FAULTY_STALL = 0,       /* block until faulty_release(), then fail with CP_ERROR_COMM */
    FAULTY_EXIT_THREAD = 1, /* pthread_exit() from inside the call */
    FAULTY_EXIT_PROCESS = 2 /* _exit(0) from inside the call (a rank that dies) */
} faulty_how;

typedef struct faulty_plan {
    int rank;        /* the rank (in the wrapped world) that stops */
    int after;       /* transport calls it completes once armed */
    faulty_how how;
    atomic_int armed;    /* calls count only while set */
    atomic_int calls;    /* counted so far */
    atomic_int stopped;  /* the rank has stopped */
    const char *stopped_in; /* in which call ("sendrecv", "all_reduce", ...), once stopped */
    atomic_int released; /* FAULTY_STALL: let the stalled call return */
    atomic_llong sendrecv_bytes; /* bytes sent by the sendrecv calls of every wrapped rank */
} faulty_plan;

/* Wrap *c (taking it over) so that it fails as plan says; rank is c's rank
 * in the world the plan numbers. */
cp_status faulty_wrap(cp_comm **c, faulty_plan *plan);

/* Start counting (call right before the operation to disturb). */
void faulty_arm(faulty_plan *plan);

/* Let a stalled rank's call return CP_ERROR_COMM. */
void faulty_release(faulty_plan *plan);

#endif
