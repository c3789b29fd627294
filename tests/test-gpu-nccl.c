/* SPDX-License-Identifier: MIT */
/*
 * The NCCL transport of the CUDA module over a one-rank NCCL communicator
 * (one GPU; several ranks need several GPUs and are tested elsewhere): every
 * collective moves or reduces exactly what the transport contract says,
 * split works, and misuse is refused. Skips (exit 77) without a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <nccl.h>
#include <infinicp/cuda.h>

#include "comm/comm.h"
#include "cpref.h"
#include "gpuenv.h"
#include "testutil.h"

static void *st;
static ncclComm_t nccl;

static void release(cp_comm *c)
{
    if (!c)
        return;
    c->ops->destroy(c->impl);
    free(c);
}

static cp_xfer xfer(void)
{
    cp_xfer x = {gpu_ops, st, 0};
    return x;
}

static void test_wraps_with_rank_and_size(void **unused)
{
    (void)unused;
    cp_comm *c = NULL;
    assert_int_equal(cp_comm_create_nccl_comm(nccl, &c), CP_SUCCESS);
    assert_non_null(c);
    assert_string_equal(c->ops->name, "nccl");
    assert_int_equal(c->rank, 0);
    assert_int_equal(c->size, 1);
    release(c);
    c = (cp_comm *)&c;
    EXPECT_ERROR(cp_comm_create_nccl(NULL, &c), CP_ERROR_INVALID_ARGUMENT, "nccl_comm");
    assert_null(c);
    EXPECT_ERROR(cp_comm_create_nccl(nccl, NULL), CP_ERROR_INVALID_ARGUMENT, "out");
}

/* With one rank every collective is a copy of its input. */
static void test_collectives_move_data(void **unused)
{
    (void)unused;
    cp_comm *c;
    assert_int_equal(cp_comm_create_nccl(nccl, &c), CP_SUCCESS);
    const size_t n = 4099;
    double *x = malloc(n * sizeof(double)), *got = malloc(n * sizeof(double));
    unsigned char *h = malloc(n * 8);
    void *send = dev_alloc(st, n * 8), *recv = dev_alloc(st, n * 8);
    cp_xfer xf = xfer();
    const cp_dtype types[] = {CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16, CP_DTYPE_F64};
    for (int ti = 0; ti < 4; ti++) {
        const cp_dtype t = types[ti];
        const size_t es = cpref_dtype_size(t);
        for (size_t i = 0; i < n; i++)
            x[i] = cpref_round((double)i * 0.37 - 500.0, t);
        cpref_store(h, t, x, n);
        upload(st, send, h, n * es);
        for (int k = 0; k < 6; k++) {
            assert_int_equal(gpu_ops->memset(st, recv, 0, n * es), CP_SUCCESS);
            cp_status s;
            switch (k) {
            case 0: s = c->ops->all_gather(c->impl, &xf, send, recv, n * es); break;
            case 1: s = c->ops->all_to_all(c->impl, &xf, send, recv, n * es); break;
            case 2: s = c->ops->sendrecv(c->impl, &xf, send, n * es, 0, recv, n * es, 0); break;
            case 3: s = c->ops->all_reduce(c->impl, &xf, send, recv, n, t, CP_REDUCE_SUM); break;
            case 4: s = c->ops->all_reduce(c->impl, &xf, send, recv, n, t, CP_REDUCE_MAX); break;
            default: s = c->ops->reduce_scatter(c->impl, &xf, send, recv, n, t, CP_REDUCE_SUM); break;
            }
            if (s != CP_SUCCESS)
                fail_msg("collective %d, dtype %d: %s", k, (int)t, cp_last_error());
            download(st, h, recv, n * es);
            cpref_load(got, h, t, n);
            assert_memory_equal(got, x, n * sizeof(double));
        }
    }
    assert_int_equal(c->ops->barrier(c->impl, &xf), CP_SUCCESS);
    gpu_ops->free(st, send), gpu_ops->free(st, recv);
    free(x), free(got), free(h);
    release(c);
}

static void test_split(void **unused)
{
    (void)unused;
    cp_comm *c;
    assert_int_equal(cp_comm_create_nccl(nccl, &c), CP_SUCCESS);
    void *impl = NULL;
    int rank = -1, size = 0;
    assert_int_equal(c->ops->split(c->impl, 5, 0, 1000, &impl, &rank, &size), CP_SUCCESS);
    assert_non_null(impl);
    assert_int_equal(rank, 0);
    assert_int_equal(size, 1);
    cp_xfer xf = xfer();
    assert_int_equal(c->ops->barrier(impl, &xf), CP_SUCCESS);
    c->ops->destroy(impl);
    impl = (void *)&impl;
    assert_int_equal(c->ops->split(c->impl, -1, 0, 1000, &impl, &rank, &size), CP_SUCCESS);
    assert_null(impl);
    release(c);
}

static void test_refuses_host_buffers(void **unused)
{
    (void)unused;
    cp_comm *c;
    assert_int_equal(cp_comm_create_nccl(nccl, &c), CP_SUCCESS);
    char a[8] = {0}, b[8];
    cp_xfer host = {NULL, NULL, 0};
    EXPECT_ERROR(c->ops->all_gather(c->impl, &host, a, b, 8), CP_ERROR_INVALID_ARGUMENT, "device memory only");
    cp_xfer xf = xfer();
    EXPECT_ERROR(c->ops->sendrecv(c->impl, &xf, a, 8, 1, b, 8, 0), CP_ERROR_INVALID_ARGUMENT, "dst = 1");
    EXPECT_ERROR(c->ops->all_reduce(c->impl, &xf, a, b, 2, (cp_dtype)9, CP_REDUCE_SUM), CP_ERROR_INVALID_ARGUMENT,
                 "dtype = 9");
    release(c);
}

int main(void)
{
    st = gpu_open(NULL);
    if (!st)
        return GPU_SKIP;
    int dev = 0;
    ncclResult_t e = ncclCommInitAll(&nccl, 1, &dev);
    if (e != ncclSuccess) {
        printf("ncclCommInitAll: %s\n", ncclGetErrorString(e));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wraps_with_rank_and_size),
        cmocka_unit_test(test_collectives_move_data),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_refuses_host_buffers),
    };
    int r = cmocka_run_group_tests_name("gpu-nccl", tests, NULL, NULL);
    ncclCommDestroy(nccl);
    gpu_ops->close(st);
    return r;
}
