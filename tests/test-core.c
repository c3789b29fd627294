/* SPDX-License-Identifier: MIT */
/* Status codes, error text, version, and the CPU context. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "testutil.h"

static void test_status_strings(void **state)
{
    (void)state;
    const char *seen[12];
    for (int s = CP_SUCCESS; s <= CP_ERROR_INTERNAL; s++) {
        const char *t = cp_status_string((cp_status)s);
        assert_non_null(t);
        assert_true(strlen(t) > 0);
        assert_string_not_equal(t, "unknown status");
        for (int j = 0; j < s; j++)
            assert_string_not_equal(t, seen[j]); /* each code has its own text */
        seen[s] = t;
    }
    assert_string_equal(cp_status_string((cp_status)12), "unknown status");
    assert_string_equal(cp_status_string((cp_status)-1), "unknown status");
    assert_string_equal(cp_status_string(CP_SUCCESS), "success");
}

static void test_status_values_are_fixed(void **state)
{
    (void)state;
    /* The ABI: these numbers never change. */
    assert_int_equal(CP_SUCCESS, 0);
    assert_int_equal(CP_ERROR_INVALID_ARGUMENT, 1);
    assert_int_equal(CP_ERROR_UNSUPPORTED, 2);
    assert_int_equal(CP_ERROR_OUT_OF_MEMORY, 3);
    assert_int_equal(CP_ERROR_BACKEND, 4);
    assert_int_equal(CP_ERROR_COMM, 5);
    assert_int_equal(CP_ERROR_TIMEOUT, 6);
    assert_int_equal(CP_ERROR_MISMATCH, 7);
    assert_int_equal(CP_ERROR_FORMAT, 8);
    assert_int_equal(CP_ERROR_IO, 9);
    assert_int_equal(CP_ERROR_NOT_FOUND, 10);
    assert_int_equal(CP_ERROR_INTERNAL, 11);
    assert_int_equal(CP_DTYPE_F32, 0);
    assert_int_equal(CP_DTYPE_F16, 1);
    assert_int_equal(CP_DTYPE_BF16, 2);
    assert_int_equal(CP_DTYPE_F64, 3);
    assert_int_equal(CP_DEVICE_CPU, 0);
    assert_int_equal(CP_DEVICE_CUDA, 1);
}

static void test_version(void **state)
{
    (void)state;
    /* The library's run-time version is meson's project version, and this
     * header belongs to it. */
    unsigned v = cp_version();
    unsigned want = 0, a, b, c;
    assert_int_equal(sscanf(TEST_PROJECT_VERSION, "%u.%u.%u", &a, &b, &c), 3);
    want = a * 10000 + b * 100 + c;
    assert_int_equal(v, want);
    assert_int_equal(v, CP_VERSION);
}

static void test_context_cpu_lifecycle(void **state)
{
    (void)state;
    cp_context *ctx = NULL;
    assert_int_equal(cp_context_create(NULL, &ctx), CP_SUCCESS);
    assert_non_null(ctx);
    assert_int_equal(cp_context_set_stream(ctx, NULL), CP_SUCCESS);
    assert_int_equal(cp_context_synchronize(ctx), CP_SUCCESS);
    cp_context_destroy(ctx);

    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.num_threads = 3;
    assert_int_equal(cp_context_create(&cfg, &ctx), CP_SUCCESS);
    cp_context_destroy(ctx);
    cp_context_destroy(NULL); /* a no-op */
}

/* A caller compiled against an older header that had only the first fields,
 * and one compiled against a newer, larger struct. */
static void test_context_config_struct_size(void **state)
{
    (void)state;
    struct {
        cp_context_config cfg;
        int future_field;
    } newer;
    memset(&newer, 0, sizeof newer);
    newer.cfg.struct_size = sizeof newer;
    newer.cfg.device = CP_DEVICE_CPU;
    newer.future_field = 12345;
    cp_context *ctx = NULL;
    assert_int_equal(cp_context_create(&newer.cfg, &ctx), CP_SUCCESS);
    cp_context_destroy(ctx);

    /* A caller built before `deterministic` existed: its struct ends at
     * num_threads, and whatever lies after it must not be read (99 would be
     * rejected); the field then has its default. */
    cp_context_config older = CP_CONTEXT_CONFIG_INIT;
    older.struct_size = offsetof(cp_context_config, num_threads) + sizeof(int);
    older.deterministic = 99;
    assert_int_equal(cp_context_create(&older, &ctx), CP_SUCCESS);
    cp_context_destroy(ctx);
    /* The same bytes with the full size are read, and rejected. */
    older.struct_size = sizeof older;
    EXPECT_ERROR(cp_context_create(&older, &ctx), CP_ERROR_INVALID_ARGUMENT, "cfg->deterministic = 99");

    /* Both settings open a CPU context (deterministic always). */
    for (int d = 0; d <= 1; d++) {
        cp_context_config c1 = CP_CONTEXT_CONFIG_INIT;
        c1.deterministic = d;
        assert_int_equal(cp_context_create(&c1, &ctx), CP_SUCCESS);
        cp_context_destroy(ctx);
    }

    cp_context_config c = CP_CONTEXT_CONFIG_INIT;
    c.struct_size = 0;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "struct_size");
    assert_null(ctx);
    c.struct_size = sizeof(size_t) + 1;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "struct_size");
}

static void test_context_bad_arguments(void **state)
{
    (void)state;
    cp_context *ctx = (cp_context *)(uintptr_t)0x1;
    cp_context_config c = CP_CONTEXT_CONFIG_INIT;

    EXPECT_ERROR(cp_context_create(&c, NULL), CP_ERROR_INVALID_ARGUMENT, "out");

    c.device = (cp_device)7;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "device = 7");
    assert_null(ctx); /* *out is cleared on failure */

    c = (cp_context_config)CP_CONTEXT_CONFIG_INIT;
    c.device_index = -2;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "device_index = -2");
    c.device_index = 1;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "device_index = 1");

    c = (cp_context_config)CP_CONTEXT_CONFIG_INIT;
    c.stream = &c;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "stream");

    c = (cp_context_config)CP_CONTEXT_CONFIG_INIT;
    c.num_threads = -1;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "num_threads = -1");
    c.num_threads = 1 << 30;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "num_threads");

    c = (cp_context_config)CP_CONTEXT_CONFIG_INIT;
    c.deterministic = 2;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "cfg->deterministic = 2");
    assert_null(ctx);
    c.deterministic = -1;
    EXPECT_ERROR(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT, "cfg->deterministic = -1");

    EXPECT_ERROR(cp_context_set_stream(NULL, NULL), CP_ERROR_INVALID_ARGUMENT, "ctx");
    EXPECT_ERROR(cp_context_synchronize(NULL), CP_ERROR_INVALID_ARGUMENT, "ctx");

    assert_int_equal(cp_context_create(NULL, &ctx), CP_SUCCESS);
    EXPECT_ERROR(cp_context_set_stream(ctx, &c), CP_ERROR_INVALID_ARGUMENT, "stream");
    cp_context_destroy(ctx);
}

/* Without the CUDA module installed or loadable, a CUDA context fails
 * cleanly with NOT_FOUND or BACKEND, never a crash. With it on a GPU
 * machine it opens device 0. */
static void test_context_cuda_absent_or_working(void **state)
{
    (void)state;
    cp_context_config c = CP_CONTEXT_CONFIG_INIT;
    c.device = CP_DEVICE_CUDA;
    cp_context *ctx = NULL;
    cp_status s = cp_context_create(&c, &ctx);
    if (s == CP_SUCCESS) {
        assert_int_equal(cp_context_synchronize(ctx), CP_SUCCESS);
        cp_context_destroy(ctx);
        return;
    }
    assert_true(s == CP_ERROR_NOT_FOUND || s == CP_ERROR_BACKEND);
    assert_true(strlen(cp_last_error()) > 0);
    assert_null(ctx);
}

/* Error text is per thread: a failure on one thread does not touch another's. */
static void *fail_in_thread(void *arg)
{
    (void)arg;
    cp_context_config c = CP_CONTEXT_CONFIG_INIT;
    c.num_threads = -77;
    cp_context *ctx;
    cp_context_create(&c, &ctx);
    return strstr(cp_last_error(), "-77") ? (void *)1 : NULL;
}

static void test_last_error_is_thread_local(void **state)
{
    (void)state;
    cp_context_config c = CP_CONTEXT_CONFIG_INIT;
    c.num_threads = -55;
    cp_context *ctx;
    assert_int_equal(cp_context_create(&c, &ctx), CP_ERROR_INVALID_ARGUMENT);
    pthread_t t;
    void *ret = NULL;
    assert_int_equal(pthread_create(&t, NULL, fail_in_thread, NULL), 0);
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_non_null(ret);
    assert_non_null(strstr(cp_last_error(), "-55"));
    /* success leaves the text alone */
    assert_int_equal(cp_context_create(NULL, &ctx), CP_SUCCESS);
    cp_context_destroy(ctx);
    assert_non_null(strstr(cp_last_error(), "-55"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_status_values_are_fixed),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_context_cpu_lifecycle),
        cmocka_unit_test(test_context_config_struct_size),
        cmocka_unit_test(test_context_bad_arguments),
        cmocka_unit_test(test_context_cuda_absent_or_working),
        cmocka_unit_test(test_last_error_is_thread_local),
    };
    return cmocka_run_group_tests_name("core", tests, NULL, NULL);
}
