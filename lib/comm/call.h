/* SPDX-License-Identifier: MIT */
/* What one rank says about the collective it is entering. Every transport
 * shows these descriptors to every rank before any payload moves, so ranks
 * that disagree (another collective, size, dtype, operator, unpaired
 * send/recv) all return CP_ERROR_MISMATCH instead of corrupting memory.
 * Compiled into the core and into transport modules alike. */
#ifndef INFINICP_CALL_H
#define INFINICP_CALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infinicp/backend.h>

typedef enum cpi_call_kind {
    CPI_CALL_ALL_GATHER = 1,
    CPI_CALL_REDUCE_SCATTER = 2,
    CPI_CALL_ALL_TO_ALL = 3,
    CPI_CALL_SENDRECV = 4,
    CPI_CALL_ALL_REDUCE = 5,
    CPI_CALL_BARRIER = 6,
    CPI_CALL_SPLIT = 7,
    CPI_CALL_ALL_TO_ALL_2D = 8, /* size: bytes per row, recv: rows per block */
    /* Stands in for whatever the peers call next: the rank failed before a
     * collective call's first exchange on this communicator (status), and
     * a and b say which rank of the call's whole communicator failed first
     * and its size (lib/comm/agree.h). */
    CPI_CALL_REJECT = 9,
} cpi_call_kind;

/* Fixed-size and free of pointers, so it can travel as bytes. */
typedef struct cpi_call {
    int32_t kind;   /* cpi_call_kind */
    int32_t status; /* this rank's own failure before any exchange (0 = ready) */
    int32_t dtype;  /* reductions; -1 otherwise */
    int32_t op;     /* reductions; -1 otherwise */
    int32_t a, b;   /* sendrecv: dst, src; split: color, key; -1 otherwise */
    uint64_t size;  /* bytes (per block / sent) or element count (per block) */
    uint64_t recv;  /* sendrecv: bytes expected from src; all_to_all_2d: rows per block */
} cpi_call;

/* Descriptor of one call; unused fields are -1 / 0. */
cpi_call cpi_call_make(cpi_call_kind kind, uint64_t size, int dtype, int op);

/* The collective's name for messages, e.g. "all_gather". */
const char *cpi_call_name(int32_t kind);

/*
 * Do the descriptors of all n ranks describe one consistent call? If not,
 * writes a reason naming the ranks and their values into why[cap]. Every
 * rank that sees the same n descriptors reaches the same verdict.
 */
bool cpi_call_agree(const cpi_call *all, int n, char *why, size_t cap);

/* The first rank (or -1) whose descriptor carries a nonzero status. */
int cpi_call_failed_rank(const cpi_call *all, int n);

/* The first rank (or -1) whose descriptor is a CPI_CALL_REJECT. */
int cpi_call_rejecting_rank(const cpi_call *all, int n);

#endif
