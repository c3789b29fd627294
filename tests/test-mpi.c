/* SPDX-License-Identifier: MIT */
/* The collective suite over MPI: run under mpirun with 4 processes, each one
 * a rank, through the transport-mpi module ($INFINICP_MODULE_PATH). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <mpi.h>

#include <infinicp/mpi.h>

#include "comm/group.h"
#include "commsuite.h"
#include "fakedev.h"
#include "testutil.h"

/* Long enough for an oversubscribed, sanitized run; short enough that a
 * rank lost to a failed assertion makes the others fail instead of hang. */
#define TIMEOUT_MS 20000

/*
 * Open MPI unloads its plugins in MPI_Finalize. LeakSanitizer, reporting at
 * exit, then cannot tell which library allocated what Open MPI keeps, and
 * the suppressions in lsan-openmpi.supp (by library name) cannot match.
 * Keeping every library loaded keeps the reports attributable, so that only
 * Open MPI's own allocations are suppressed. (The executable's definition
 * takes precedence over libc's for every library of the process.)
 */
int dlclose(void *handle);
int dlclose(void *handle)
{
    (void)handle;
    return 0;
}

static cp_comm *world;
static int world_rank, world_size;

static const suite_mem host_mem = { NULL, NULL };
static suite_mem device_mem;

static void test_create(void **state)
{
    /* the typed wrapper of <infinicp/mpi.h> */
    assert_int_equal(cp_comm_create_mpi_comm(MPI_COMM_WORLD, &world), CP_SUCCESS);
    int r = -1, s = -1;
    assert_int_equal(cp_comm_rank(world, &r), CP_SUCCESS);
    assert_int_equal(cp_comm_size(world, &s), CP_SUCCESS);
    assert_int_equal(r, world_rank);
    assert_int_equal(s, world_size);
}

static void test_collectives(void **state)
{
    assert_int_equal(suite_collectives(world, &host_mem, TIMEOUT_MS), 0);
    assert_int_equal(suite_collectives(world, &device_mem, TIMEOUT_MS), 0);
}

static void test_mismatch(void **state)
{
    assert_int_equal(suite_mismatch(world, &host_mem, TIMEOUT_MS), 0);
    assert_int_equal(suite_mismatch(world, &device_mem, TIMEOUT_MS), 0);
}

static void test_groups(void **state)
{
    for (int a = 1; a <= world_size; a++)
        if (world_size % a == 0)
            assert_int_equal(suite_group(world, a, TIMEOUT_MS), 0);
}

static void test_layout_gather(void **state)
{
    for (int l = CP_LAYOUT_CONTIGUOUS; l <= CP_LAYOUT_ZIGZAG; l++)
        for (int64_t batch = 1; batch <= 3; batch += 2) {
            assert_int_equal(suite_layout_gather(world, &host_mem, (cp_layout)l, batch, 6 * world_size, TIMEOUT_MS), 0);
            assert_int_equal(suite_layout_gather(world, &device_mem, (cp_layout)l, batch, 6 * world_size, TIMEOUT_MS),
                             0);
        }
}

/* Library traffic runs on a duplicate: the caller's own messages on the
 * same communicator are not disturbed by collectives in between. */
static void test_private_traffic(void **state)
{
    int peer = (world_rank + 1) % world_size, from = (world_rank - 1 + world_size) % world_size;
    int mine = 1000 + world_rank, theirs = -1;
    MPI_Request req;
    assert_int_equal(MPI_Irecv(&theirs, 1, MPI_INT, from, 0, MPI_COMM_WORLD, &req), MPI_SUCCESS);
    cp_xfer x = { NULL, NULL, TIMEOUT_MS };
    int v = world_rank, all[64];
    assert_int_equal(cpi_all_gather(world, &x, &v, all, sizeof v), CP_SUCCESS);
    assert_int_equal(MPI_Send(&mine, 1, MPI_INT, peer, 0, MPI_COMM_WORLD), MPI_SUCCESS);
    assert_int_equal(MPI_Wait(&req, MPI_STATUS_IGNORE), MPI_SUCCESS);
    assert_int_equal(theirs, 1000 + from);
    for (int j = 0; j < world_size; j++)
        assert_int_equal(all[j], j);
}

static void test_bad_arguments(void **state)
{
    cp_comm *c = (cp_comm *)1;
    EXPECT_ERROR(cp_comm_create_mpi_comm(MPI_COMM_NULL, &c), CP_ERROR_INVALID_ARGUMENT, "MPI_COMM_NULL");
    assert_null(c);
}

static void test_destroy(void **state)
{
    cp_comm_destroy(world);
    world = NULL;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    device_mem.ops = fakedev_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_layout_gather),
        cmocka_unit_test(test_private_traffic),
        cmocka_unit_test(test_destroy),
    };
    char name[32];
    snprintf(name, sizeof name, "mpi rank %d", world_rank);
    int failed = cmocka_run_group_tests_name(name, tests, NULL, NULL);
    MPI_Finalize();
    return failed ? 1 : 0;
}
