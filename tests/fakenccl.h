/* SPDX-License-Identifier: MIT */
/*
 * A stand-in for NCCL (tests/fakenccl.cu), built only for
 * test-gpu-nccl-fault: the test executable links it, so the CUDA module's
 * NCCL calls bind to it (the executable's libraries come first in symbol
 * lookup) while the module's own polling and abort code runs unchanged.
 * Communicators have one rank (collectives copy on the stream). It can make
 * a collective hang on the device like a peer that never comes (a kernel
 * spinning until the communicator is aborted), report ncclRemoteError
 * asynchronously, and never finish a split. It counts what the caller does,
 * including misuse: a call on an aborted or destroyed communicator, a call
 * on one whose non-blocking operation is still in progress, destroying one
 * whose work is stuck (NCCL would hang there).
 */
#ifndef INFINICP_TESTS_FAKENCCL_H
#define INFINICP_TESTS_FAKENCCL_H

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fakenccl_stats {
    int created;   /* communicators made (init and split) */
    int destroyed; /* by ncclCommDestroy */
    int aborted;   /* by ncclCommAbort */
    int misuse;    /* see above; fakenccl_last_misuse() says what */
} fakenccl_stats;

/* Behave normally again and zero the counters. */
void fakenccl_reset(void);
/* From now on every collective first launches a kernel that spins until its
 * communicator is aborted. */
void fakenccl_set_stuck(int on);
/* After @p polls calls of ncclCommGetAsyncError on a communicator with stuck
 * work, report ncclRemoteError for it (0 = never). */
void fakenccl_set_error_after(int polls);
/* Non-blocking splits never finish (the other members never join). */
void fakenccl_set_split_hangs(int on);
/* ncclCommCount reports @p n ranks (this process stays rank 0, collectives
 * still copy locally): a communicator of one GPU that the library must treat
 * as a group of several, so that cp_group_create's agreement runs. */
void fakenccl_set_count(int n);
fakenccl_stats fakenccl_get(void);
/* Text of the last misuse ("" if none). */
const char *fakenccl_last_misuse(void);
/* Whether @p comm was aborted. */
int fakenccl_was_aborted(ncclComm_t comm);

#ifdef __cplusplus
}
#endif

#endif
