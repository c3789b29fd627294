/* SPDX-License-Identifier: MIT */
/*
 * Faults of the NCCL transport on one GPU: the CUDA module runs unchanged,
 * but its NCCL calls reach the fake NCCL of tests/fakenccl.cu, which can hang
 * a collective on the device like a peer that never comes, report
 * ncclRemoteError asynchronously, or never finish a split. Asserted: every
 * host wait of the library ends within the group's timeout (plus slack) with
 * CP_ERROR_TIMEOUT, or early with CP_ERROR_COMM for an asynchronous error,
 * naming the call; communicators the library made are aborted, the caller's
 * never; cp_group_destroy returns within one timeout even when both
 * sub-communicators are stuck; nothing is used after abort or destroyed while
 * stuck; and a new group works afterwards. Skips (exit 77) without a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fakenccl.h"
#include <cuda_runtime_api.h>
#include <infinicp/cuda.h>

#include "comm/group.h"
#include "gpuenv.h"
#include "testutil.h"

/* The deadline the stuck cases wait for, and what the host may add to it
 * (polling naps are at most 1 ms; the rest is scheduling). */
#define TIMEOUT_MS 300
#define SLACK_MS 250

static cudaStream_t stream;
static cp_context *ctx;

static void no_misuse(void)
{
    if (fakenccl_get().misuse)
        fail_msg("the module misused NCCL: %s", fakenccl_last_misuse());
}

/* An elapsed time that shows a wait ran to its deadline, and no further. */
static void assert_waited_one_timeout(double ms)
{
    printf("waited %.1f ms (timeout %d ms): %s\n", ms, TIMEOUT_MS, cp_last_error());
    if (ms < TIMEOUT_MS - 1 || ms > TIMEOUT_MS + SLACK_MS)
        fail_msg("waited %.1f ms; the timeout is %d ms (slack %d ms)", ms, TIMEOUT_MS, SLACK_MS);
}

static cp_group *make_group(cp_comm *comm, int timeout_ms)
{
    cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    cfg.timeout_ms = timeout_ms;
    cp_group *g = NULL;
    cp_status s = cp_group_create(ctx, comm, &cfg, &g);
    if (s != CP_SUCCESS)
        fail_msg("cp_group_create: %s", cp_last_error());
    return g;
}

static cp_comm *user_comm(ncclComm_t *nc)
{
    int dev = 0;
    assert_int_equal(ncclCommInitAll(nc, 1, &dev), ncclSuccess);
    cp_comm *c = NULL;
    assert_int_equal(cp_comm_create_nccl_comm(*nc, &c), CP_SUCCESS);
    return c;
}

/* The stream is free again: synchronize returns (and promptly). */
static void stream_is_free(void)
{
    double t0 = now_ms();
    assert_int_equal(cp_context_synchronize(ctx), CP_SUCCESS);
    assert_true(now_ms() - t0 < 1000);
}

/* A new communicator and group after a fault: data moves through both
 * sub-communicators, the host waits succeed, destroy releases both without
 * aborting anything. */
static void fresh_group_works(void)
{
    fakenccl_reset();
    ncclComm_t nc;
    cp_comm *comm = user_comm(&nc);
    cp_group *g = make_group(comm, 5000);
    enum { N = 1000 };
    unsigned char host[N], back[N];
    for (int i = 0; i < N; i++)
        host[i] = (unsigned char)(i * 7 + 3);
    void *a = dev_alloc(ctx->state, N), *b = dev_alloc(ctx->state, N), *c = dev_alloc(ctx->state, N);
    upload(ctx->state, a, host, N);
    cp_xfer x = cpi_group_xfer(g);
    assert_int_equal(cpi_all_gather(g->a2a, &x, a, b, N), CP_SUCCESS);
    assert_int_equal(cpi_sendrecv(g->p2p, &x, b, N, 0, c, N, 0), CP_SUCCESS);
    assert_int_equal(cpi_barrier(g->p2p, &x), CP_SUCCESS);
    assert_int_equal(cpi_comm_wait(g->a2a, &x), CP_SUCCESS);
    download(ctx->state, back, c, N);
    assert_memory_equal(back, host, N);
    cp_group_destroy(g);
    fakenccl_stats st = fakenccl_get();
    assert_int_equal(st.created, 3);   /* the caller's and two splits */
    assert_int_equal(st.destroyed, 2); /* the splits, finalized first */
    assert_int_equal(st.aborted, 0);
    no_misuse();
    gpu_ops->free(ctx->state, a), gpu_ops->free(ctx->state, b), gpu_ops->free(ctx->state, c);
    cp_comm_destroy(comm);
    assert_int_equal(ncclCommDestroy(nc), ncclSuccess);
}

/* The caller's communicator hangs in the plan agreement of cp_group_create:
 * CP_ERROR_TIMEOUT after the timeout, the communicator left alone. */
static void test_user_comm_stuck(void **unused)
{
    (void)unused;
    fakenccl_reset();
    ncclComm_t nc;
    fakenccl_set_count(2); /* one rank would need no agreement */
    cp_comm *comm = user_comm(&nc);
    fakenccl_set_stuck(1);
    cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    cfg.timeout_ms = TIMEOUT_MS;
    cp_group *g = (cp_group *)&g;
    double t0 = now_ms();
    EXPECT_ERROR(cp_group_create(ctx, comm, &cfg, &g), CP_ERROR_TIMEOUT, "all_reduce");
    assert_waited_one_timeout(now_ms() - t0);
    assert_null(g);
    assert_non_null(strstr(cp_last_error(), "not aborted"));
    assert_false(fakenccl_was_aborted(nc));
    assert_int_equal(fakenccl_get().aborted, 0);
    no_misuse();
    /* later calls on the wrapper fail at once */
    cp_xfer x = cpi_xfer(ctx, TIMEOUT_MS);
    t0 = now_ms();
    EXPECT_ERROR(cpi_barrier(comm, &x), CP_ERROR_COMM, "failed earlier");
    assert_true(now_ms() - t0 < 50);
    /* what the man page tells the caller to do */
    assert_int_equal(ncclCommAbort(nc), ncclSuccess);
    stream_is_free();
    cp_comm_destroy(comm);
    no_misuse();
    fresh_group_works();
}

/* Both library-made communicators stuck: destroy waits one timeout in all,
 * aborts both, and the stream is free afterwards. */
static void test_destroy_aborts_stuck_splits(void **unused)
{
    (void)unused;
    fakenccl_reset();
    ncclComm_t nc;
    cp_comm *comm = user_comm(&nc);
    cp_group *g = make_group(comm, TIMEOUT_MS);
    enum { N = 256 };
    void *a = dev_alloc(ctx->state, N), *b = dev_alloc(ctx->state, N);
    fakenccl_set_stuck(1);
    cp_xfer x = cpi_group_xfer(g);
    assert_int_equal(cpi_all_gather(g->a2a, &x, a, b, N), CP_SUCCESS);
    assert_int_equal(cpi_sendrecv(g->p2p, &x, a, N, 0, b, N, 0), CP_SUCCESS);
    const int destroyed = fakenccl_get().destroyed;
    double t0 = now_ms();
    cp_group_destroy(g);
    assert_waited_one_timeout(now_ms() - t0);
    fakenccl_stats st = fakenccl_get();
    assert_int_equal(st.aborted, 2);
    assert_int_equal(st.destroyed, destroyed);
    assert_false(fakenccl_was_aborted(nc));
    no_misuse();
    assert_non_null(strstr(cp_last_error(), "aborted"));
    assert_non_null(strstr(cp_last_error(), "had not finished after"));
    stream_is_free();
    gpu_ops->free(ctx->state, a), gpu_ops->free(ctx->state, b);
    cp_comm_destroy(comm);
    assert_int_equal(ncclCommDestroy(nc), ncclSuccess);
    no_misuse();
    fresh_group_works();
}

/* An asynchronous error on a library-made communicator during a host wait:
 * CP_ERROR_COMM long before the timeout, that communicator aborted, later
 * calls refused, destroy prompt. */
static void test_async_error_owned(void **unused)
{
    (void)unused;
    fakenccl_reset();
    ncclComm_t nc;
    cp_comm *comm = user_comm(&nc);
    cp_group *g = make_group(comm, 20000);
    fakenccl_set_stuck(1);
    fakenccl_set_error_after(3);
    cp_xfer x = cpi_group_xfer(g);
    double t0 = now_ms();
    EXPECT_ERROR(cpi_barrier(g->p2p, &x), CP_ERROR_COMM, "ncclRemoteError");
    printf("CP_ERROR_COMM after %.1f ms: %s\n", now_ms() - t0, cp_last_error());
    assert_true(now_ms() - t0 < 2000);
    assert_non_null(strstr(cp_last_error(), "barrier"));
    assert_non_null(strstr(cp_last_error(), "peer of communicator")); /* ncclGetLastError's text */
    assert_non_null(strstr(cp_last_error(), "was aborted"));
    assert_int_equal(fakenccl_get().aborted, 1);
    EXPECT_ERROR(cpi_barrier(g->p2p, &x), CP_ERROR_COMM, "failed earlier");
    fakenccl_set_stuck(0);
    t0 = now_ms();
    cp_group_destroy(g);
    printf("destroy with one aborted communicator: %.1f ms\n", now_ms() - t0);
    assert_true(now_ms() - t0 < 1000);
    fakenccl_stats st = fakenccl_get();
    assert_int_equal(st.aborted, 1);
    assert_int_equal(st.destroyed, 1); /* a2a, which had nothing pending */
    no_misuse();
    stream_is_free();
    cp_comm_destroy(comm);
    assert_int_equal(ncclCommDestroy(nc), ncclSuccess);
    fresh_group_works();
}

/* An asynchronous error on the caller's communicator in cp_group_create:
 * CP_ERROR_COMM naming the error, the communicator left to the caller. */
static void test_async_error_user(void **unused)
{
    (void)unused;
    fakenccl_reset();
    ncclComm_t nc;
    fakenccl_set_count(2); /* one rank would need no agreement */
    cp_comm *comm = user_comm(&nc);
    fakenccl_set_stuck(1);
    fakenccl_set_error_after(2);
    cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    cfg.timeout_ms = 20000;
    cp_group *g = NULL;
    double t0 = now_ms();
    EXPECT_ERROR(cp_group_create(ctx, comm, &cfg, &g), CP_ERROR_COMM, "ncclRemoteError");
    printf("CP_ERROR_COMM after %.1f ms: %s\n", now_ms() - t0, cp_last_error());
    assert_true(now_ms() - t0 < 2000);
    assert_non_null(strstr(cp_last_error(), "all_reduce"));
    assert_non_null(strstr(cp_last_error(), "not aborted"));
    assert_int_equal(fakenccl_get().aborted, 0);
    no_misuse();
    assert_int_equal(ncclCommAbort(nc), ncclSuccess);
    stream_is_free();
    cp_comm_destroy(comm);
    no_misuse();
    fresh_group_works();
}

/* A split whose other members never join: cp_group_create gives up after the
 * timeout and aborts the half-made communicator. */
static void test_split_never_finishes(void **unused)
{
    (void)unused;
    fakenccl_reset();
    ncclComm_t nc;
    cp_comm *comm = user_comm(&nc);
    fakenccl_set_split_hangs(1);
    cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    cfg.timeout_ms = TIMEOUT_MS;
    cp_group *g = NULL;
    double t0 = now_ms();
    EXPECT_ERROR(cp_group_create(ctx, comm, &cfg, &g), CP_ERROR_TIMEOUT, "ncclCommSplit");
    assert_waited_one_timeout(now_ms() - t0);
    fakenccl_stats st = fakenccl_get();
    assert_int_equal(st.created, 2);
    assert_int_equal(st.aborted, 1);
    assert_false(fakenccl_was_aborted(nc));
    no_misuse();
    cp_comm_destroy(comm);
    assert_int_equal(ncclCommDestroy(nc), ncclSuccess);
    fresh_group_works();
}

int main(void)
{
    void *st = gpu_open(NULL); /* only to skip without a module or GPU */
    if (!st)
        return GPU_SKIP;
    gpu_ops->close(st);
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        cp_context_create_cuda(0, stream, &ctx) != CP_SUCCESS) {
        printf("cannot make a CUDA context: %s\n", cp_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_comm_stuck),
        cmocka_unit_test(test_destroy_aborts_stuck_splits),
        cmocka_unit_test(test_async_error_owned),
        cmocka_unit_test(test_async_error_user),
        cmocka_unit_test(test_split_never_finishes),
    };
    int r = cmocka_run_group_tests_name("gpu-nccl-fault", tests, NULL, NULL);
    cp_context_destroy(ctx);
    cudaStreamDestroy(stream);
    return r;
}
