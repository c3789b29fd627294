/* SPDX-License-Identifier: MIT */
/* Loading the CUDA backend module, with a stand-in module
 * (testmod-backend.c, built as backend-cuda.so in this folder): a table
 * with a NULL required slot is refused with the slot's name and the file's,
 * a failed load is tried again (never answered with an earlier message),
 * and a table whose optional slots are NULL is accepted. cp_nccl_unique_id
 * answers CP_ERROR_UNSUPPORTED, saying why, without a module, with a refused
 * one and with one that lacks its slot; once the stand-in fills its NCCL
 * slots, cp_nccl_unique_id and cp_comm_create_nccl_id reach them.
 *
 * The tests run in this order in one process: a table the core accepts is
 * kept for the life of the process, so the accepting one comes last.
 * argv[1] is the folder of the stand-in module, argv[2] the installed
 * module's path (a module installed there would answer instead of the
 * missing folders the tests name, so those tests skip then). */
#include <dlfcn.h>
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

/* cp_nccl_unique_id fails with CP_ERROR_UNSUPPORTED, its message naming
 * needle, and leaves the id alone. */
static void expect_no_unique_id(const char *needle)
{
    unsigned char id[CP_NCCL_UNIQUE_ID_BYTES];
    memset(id, 0xa5, sizeof id);
    EXPECT_ERROR(cp_nccl_unique_id(id, sizeof id), CP_ERROR_UNSUPPORTED, needle);
    assert_non_null(strstr(cp_last_error(), "cp_nccl_unique_id: "));
    for (size_t i = 0; i < sizeof id; i++)
        assert_int_equal(id[i], 0xa5);
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
        /* the NCCL id needs the module too, and says why it is not there */
        expect_no_unique_id("the CUDA backend module is not available: ");
        assert_non_null(strstr(cp_last_error(), needle));
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
        expect_no_unique_id("the CUDA backend module is not available: ");
        assert_non_null(strstr(cp_last_error(), folders[i]));
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

/* What the stand-in module's NCCL slots were given (testmod-backend.c). */
typedef struct testmod_nccl_log {
    int ids;
    int created, destroyed;
    void *state;
    unsigned char id[128];
    size_t bytes;
    int nranks, rank;
} testmod_nccl_log;

/* After the table is kept: the NCCL calls refuse a table without their
 * slots, and reach the slots once the stand-in fills them. */
static void test_nccl_slots(void **state)
{
    (void)state;
    cp_context *ctx;
    assert_int_equal(create_cuda(&ctx), CP_SUCCESS);
    unsigned char id[CP_NCCL_UNIQUE_ID_BYTES];
    cp_comm *comm = (cp_comm *)1;

    /* the kept table leaves its optional slots NULL */
    expect_no_unique_id("has no nccl_unique_id slot");
    memset(id, 0, sizeof id);
    EXPECT_ERROR(cp_comm_create_nccl_id(ctx, id, sizeof id, 1, 0, &comm), CP_ERROR_UNSUPPORTED,
                 "has no nccl_comm_create slot");
    assert_null(comm);

    char path[4096];
    snprintf(path, sizeof path, "%s/backend-cuda.so", module_dir);
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        fail_msg("the stand-in module %s is not loaded: %s", path, dlerror());
    void (*set_nccl)(int) = (void (*)(int))dlsym(h, "testmod_nccl");
    testmod_nccl_log *(*stats)(void) = (testmod_nccl_log * (*)(void)) dlsym(h, "testmod_nccl_stats");
    assert_non_null(set_nccl);
    assert_non_null(stats);
    set_nccl(1);
    const testmod_nccl_log *log = stats();

    /* the id comes from the module, all of its bytes */
    memset(id, 0, sizeof id);
    assert_int_equal(cp_nccl_unique_id(id, sizeof id), CP_SUCCESS);
    assert_int_equal(log->ids, 1);
    for (size_t i = 0; i < sizeof id; i++)
        assert_int_equal(id[i], (unsigned char)(i * 7 + 3));

    /* the communicator: the id, the world and the context's state reach the
     * module, and cp_comm_destroy reaches the transport's destroy */
    assert_int_equal(cp_comm_create_nccl_id(ctx, id, sizeof id, 4, 2, &comm), CP_SUCCESS);
    assert_non_null(comm);
    assert_int_equal(log->created, 1);
    assert_int_equal(log->bytes, CP_NCCL_UNIQUE_ID_BYTES);
    assert_memory_equal(log->id, id, sizeof id);
    assert_int_equal(log->nranks, 4);
    assert_int_equal(log->rank, 2);
    assert_non_null(log->state);
    int rank = -1, size = 0;
    assert_int_equal(cp_comm_rank(comm, &rank), CP_SUCCESS);
    assert_int_equal(cp_comm_size(comm, &size), CP_SUCCESS);
    assert_int_equal(rank, 2);
    assert_int_equal(size, 4);
    assert_int_equal(log->destroyed, 0);
    cp_comm_destroy(comm);
    assert_int_equal(log->destroyed, 1);

    /* hostile arguments never reach the module */
    EXPECT_ERROR(cp_comm_create_nccl_id(ctx, id, sizeof id, 4, 4, &comm), CP_ERROR_INVALID_ARGUMENT, "rank = 4");
    EXPECT_ERROR(cp_nccl_unique_id(id, sizeof id - 1), CP_ERROR_INVALID_ARGUMENT, "id_bytes = 127");
    assert_int_equal(log->created, 1);
    assert_int_equal(log->ids, 1);

    set_nccl(0);
    dlclose(h);
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
        cmocka_unit_test(test_nccl_slots),
    };
    return cmocka_run_group_tests_name("module", tests, NULL, NULL);
}
