/* SPDX-License-Identifier: MIT */
/* Loading the CUDA backend module, with a stand-in module
 * (testmod-backend.c, built as backend-cuda.so in this folder): a table
 * with a NULL required slot is refused with the slot's name and the file's,
 * a failed load is tried again (never answered with an earlier message),
 * and a table whose optional slots are NULL is accepted.
 *
 * The tests run in this order in one process: a table the core accepts is
 * kept for the life of the process, so the accepting one comes last.
 * argv[1] is the folder of the stand-in module, argv[2] the installed
 * module's path (a module installed there would answer instead of the
 * missing folders the tests name, so those tests skip then). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "testutil.h"

static const char *module_dir, *installed_module;

/* The slots backend.h calls required, in table order. */
static const char *const required[] = {
    "open",    "close",   "set_stream", "synchronize",         "alloc",        "free",          "copy_2d",
    "memset",  "convert", "reduce",     "attn_workspace_size", "attn_forward", "attn_backward", "merge",
};

static cp_status create_cuda(cp_context **ctx)
{
    cp_context_config c = CP_CONTEXT_CONFIG_INIT;
    c.device = CP_DEVICE_CUDA;
    *ctx = (cp_context *)1; /* must come back NULL on failure */
    return cp_context_create(&c, ctx);
}

static void test_null_required_slot_is_refused(void **state)
{
    (void)state;
    assert_int_equal(setenv("INFINICP_MODULE_PATH", module_dir, 1), 0);
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        assert_int_equal(setenv("TESTMOD_NULL_SLOT", required[i], 1), 0);
        char needle[64];
        snprintf(needle, sizeof needle, "NULL: %s (", required[i]);
        cp_context *ctx;
        EXPECT_ERROR(create_cuda(&ctx), CP_ERROR_UNSUPPORTED, needle);
        assert_null(ctx);
        /* the file dlopen found, so that its author knows which one to fix */
        assert_non_null(strstr(cp_last_error(), module_dir));
        assert_non_null(strstr(cp_last_error(), "/backend-cuda.so"));
    }
}

static void test_failed_load_is_tried_again(void **state)
{
    (void)state;
    if (access(installed_module, F_OK) == 0)
        skip();
    const char *folders[] = { "/nonexistent-infinicp-modules-a", "/nonexistent-infinicp-modules-b" };
    for (int i = 0; i < 2; i++) {
        assert_int_equal(setenv("INFINICP_MODULE_PATH", folders[i], 1), 0);
        cp_context *ctx;
        EXPECT_ERROR(create_cuda(&ctx), CP_ERROR_NOT_FOUND, folders[i]);
        assert_null(ctx);
    }
    /* a path that no longer holds the module reports the path it has now */
    assert_int_equal(unsetenv("INFINICP_MODULE_PATH"), 0);
    cp_context *ctx;
    EXPECT_ERROR(create_cuda(&ctx), CP_ERROR_NOT_FOUND, "INFINICP_MODULE_PATH=(unset)");
}

/* Last: the core keeps the table it accepts. */
static void test_optional_slots_may_be_null(void **state)
{
    (void)state;
    assert_int_equal(setenv("INFINICP_MODULE_PATH", module_dir, 1), 0);
    assert_int_equal(unsetenv("TESTMOD_NULL_SLOT"), 0);
    cp_context *ctx;
    assert_int_equal(create_cuda(&ctx), CP_SUCCESS);
    assert_non_null(ctx);
    assert_int_equal(cp_context_set_stream(ctx, (void *)0x10), CP_SUCCESS);
    assert_int_equal(cp_context_synchronize(ctx), CP_SUCCESS);
    cp_context_destroy(ctx);
    /* later contexts use the kept table, whatever the path says now */
    assert_int_equal(setenv("INFINICP_MODULE_PATH", "/nonexistent-infinicp-modules-c", 1), 0);
    assert_int_equal(create_cuda(&ctx), CP_SUCCESS);
    cp_context_destroy(ctx);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODULE-FOLDER INSTALLED-MODULE\n", argv[0]);
        return 2;
    }
    module_dir = argv[1];
    installed_module = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_required_slot_is_refused),
        cmocka_unit_test(test_failed_load_is_tried_again),
        cmocka_unit_test(test_optional_slots_may_be_null),
    };
    return cmocka_run_group_tests_name("module", tests, NULL, NULL);
}
