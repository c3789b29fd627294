/* SPDX-License-Identifier: MIT */
/*
 * The NCCL transport of the CUDA module over a one-rank NCCL communicator
 * (one GPU; several ranks need several GPUs and are tested elsewhere): every
 * collective moves or reduces exactly what the transport contract says,
 * split works, and misuse is refused; a communicator the library creates
 * from an NCCL unique id (cp_nccl_unique_id, cp_comm_create_nccl_id) works
 * and is destroyed with its handle. Skips (exit 77) without a GPU.
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

/* cp_nccl_unique_id + cp_comm_create_nccl_id: a library-owned communicator
 * on a CUDA context, whose collectives, splits and groups work, and which
 * cp_comm_destroy destroys (ncclCommFinalize + ncclCommDestroy): twice, with
 * a fresh id each time. */
static void test_library_owned_from_id(void **unused)
{
    (void)unused;
    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.device = CP_DEVICE_CUDA;
    cp_context *ctx;
    assert_int_equal(cp_context_create(&cfg, &ctx), CP_SUCCESS);
    for (int round = 0; round < 2; round++) {
        unsigned char id[CP_NCCL_UNIQUE_ID_BYTES], zero[CP_NCCL_UNIQUE_ID_BYTES] = {0};
        memset(id, 0, sizeof id);
        if (cp_nccl_unique_id(id, sizeof id) != CP_SUCCESS)
            fail_msg("cp_nccl_unique_id: %s", cp_last_error());
        assert_memory_not_equal(id, zero, sizeof id);
        cp_comm *c = NULL;
        if (cp_comm_create_nccl_id(ctx, id, sizeof id, 1, 0, &c) != CP_SUCCESS)
            fail_msg("cp_comm_create_nccl_id: %s", cp_last_error());
        assert_non_null(c);
        assert_string_equal(c->ops->name, "nccl");
        assert_int_equal(c->rank, 0);
        assert_int_equal(c->size, 1);
        /* a collective on the context's stream */
        const size_t n = 1000;
        float *h = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            h[i] = (float)i * 0.5f - 7.0f;
        void *send = dev_alloc(ctx->state, n * sizeof(float)), *recv = dev_alloc(ctx->state, n * sizeof(float));
        upload(ctx->state, send, h, n * sizeof(float));
        cp_xfer xf = cpi_xfer(ctx, 0);
        if (c->ops->all_reduce(c->impl, &xf, send, recv, n, CP_DTYPE_F32, CP_REDUCE_SUM) != CP_SUCCESS)
            fail_msg("all_reduce: %s", cp_last_error());
        download(ctx->state, got, recv, n * sizeof(float));
        assert_memory_equal(got, h, n * sizeof(float));
        assert_int_equal(c->ops->barrier(c->impl, &xf), CP_SUCCESS);
        ctx->ops->free(ctx->state, send), ctx->ops->free(ctx->state, recv);
        free(h), free(got);
        /* splits of it (ncclCommSplit of a non-blocking parent, which
         * splits in the background), of the split, and with no color; a CP
         * group over it */
        cp_comm *sub = NULL, *subsub = NULL, *none = (cp_comm *)&sub;
        if (cp_comm_split(c, 3, 0, &sub) != CP_SUCCESS)
            fail_msg("cp_comm_split: %s", cp_last_error());
        assert_non_null(sub);
        assert_int_equal(sub->size, 1);
        if (cp_comm_split(sub, 0, 0, &subsub) != CP_SUCCESS)
            fail_msg("cp_comm_split of a split: %s", cp_last_error());
        assert_non_null(subsub);
        assert_int_equal(c->ops->barrier(subsub->impl, &xf), CP_SUCCESS);
        if (cp_comm_split(c, -1, 0, &none) != CP_SUCCESS)
            fail_msg("cp_comm_split with no color: %s", cp_last_error());
        assert_null(none);
        cp_comm_destroy(subsub);
        cp_comm_destroy(sub);
        cp_group *g = NULL;
        if (cp_group_create(ctx, c, NULL, &g) != CP_SUCCESS)
            fail_msg("cp_group_create: %s", cp_last_error());
        cp_group_destroy(g);
        cp_comm_destroy(c);
    }
    cp_context_destroy(ctx);
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
        cmocka_unit_test(test_library_owned_from_id),
    };
    int r = cmocka_run_group_tests_name("gpu-nccl", tests, NULL, NULL);
    ncclCommDestroy(nccl);
    gpu_ops->close(st);
    return r;
}
