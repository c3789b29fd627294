/* SPDX-License-Identifier: MIT */
/*
 * CP attention over MPI: run under mpirun with 4 processes, each one a rank.
 * A subset of test-attn's matrix (every mode and layout, both masks, MHA
 * and GQA, F32 and BF16, and the FP8 forward (API 1.2: out and LSE; its
 * q, k, v cross the processes as FP8 bytes), hybrid 2x2, and CP groups of
 * strided world ranks from a tp = 2 topology): every process computes the
 * same FP64 reference and a single-rank run of its own, the CP run's shares
 * are summed into global tensors with MPI, and the CP error must stay within
 * 1.25x of the single-rank error.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <mpi.h>

#include <infinicp/mpi.h>

#include "cpref.h"
#include "cprun.h"

#define TIMEOUT_MS 60000

/* Open MPI unloads its plugins at MPI_Finalize, which hides the origin of
 * its own leaks from LeakSanitizer (see test-mpi.c). */
int dlclose(void *handle);
int dlclose(void *handle)
{
    (void)handle;
    return 0;
}

static int mpi_rank, mpi_size;
static cp_comm *world_comm;
static cp_context *ctx;

typedef struct cfg {
    cp_mode mode;
    cp_layout layout;
    cp_dtype dtype;
    int a2a;
} cfg;

static size_t n_of(const cpref_shape *sh, int64_t tokens, int heads, int dim)
{
    return (size_t)sh->B * (size_t)tokens * (size_t)heads * (size_t)dim;
}

/* Run on group g and write this process's share into r (zeros elsewhere).
 * Returns the status; the error text stays in cp_last_error(). */
static cp_status run(cp_group *g, const cpref_data *d, const cfg *c, cpref_result *r)
{
    int rank, P;
    cp_group_rank(g, &rank);
    cp_group_size(g, &P);
    cp_attn_desc desc = cprun_desc(&d->sh, c->dtype, CP_FORMAT_BSHD, c->layout, c->mode);
    cp_attn_plan *p = NULL;
    cp_status s = cp_attn_plan_create(g, &desc, &p);
    const char *what = "cp_attn_plan_create";
    if (s == CP_SUCCESS)
        s = cprun_rank(ctx, p, d, &desc, P, rank, 1, r, &what);
    cp_attn_plan_destroy(p);
    return s;
}

/* Sum every process's share into whole tensors, within one CP group. */
static void sum_shares(cpref_result *r, const cpref_shape *sh, MPI_Comm group)
{
    double *bufs[5] = { r->out, r->lse, r->dq, r->dk, r->dv };
    const size_t n[5] = { n_of(sh, sh->S, sh->H, sh->Dv), n_of(sh, sh->S, sh->H, 1), n_of(sh, sh->S, sh->H, sh->D),
                          n_of(sh, sh->S, sh->Hkv, sh->D), n_of(sh, sh->S, sh->Hkv, sh->Dv) };
    for (int i = 0; i < 5; i++)
        assert_int_equal(MPI_Allreduce(MPI_IN_PLACE, bufs[i], (int)n[i], MPI_DOUBLE, MPI_SUM, group), MPI_SUCCESS);
}

/* The single-rank result on this process alone. */
static void single_rank(const cpref_data *d, const cfg *c, double e1[5])
{
    cp_comm *one;
    cp_group *g;
    assert_int_equal(cp_comm_create_local(1, &one), CP_SUCCESS);
    assert_int_equal(cp_group_create(ctx, one, NULL, &g), CP_SUCCESS);
    cfg c1 = *c;
    c1.mode = CP_MODE_P2P;
    cpref_result r;
    cpref_result_alloc(&r, &d->sh);
    if (run(g, d, &c1, &r) != CP_SUCCESS)
        fail_msg("single-rank run: %s", cp_last_error());
    cpref_errors(d, &r, e1);
    cpref_result_free(&r);
    cp_group_destroy(g);
    cp_comm_destroy(one);
}

/* One configuration on the CP communicator cpc (MPI twin: mpi_group). */
static void check(cp_comm *cpc, MPI_Comm mpi_group, const cpref_data *d, const cfg *c)
{
    double e1[5], eP[5];
    single_rank(d, c, e1);
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.a2a_size = c->a2a;
    gc.timeout_ms = TIMEOUT_MS;
    cp_group *g;
    if (cp_group_create(ctx, cpc, &gc, &g) != CP_SUCCESS)
        fail_msg("cp_group_create: %s", cp_last_error());
    cpref_result r;
    cpref_result_alloc(&r, &d->sh);
    cp_status s = run(g, d, c, &r);
    if (s != CP_SUCCESS)
        fail_msg("mode %d layout %d dtype %d: %s", (int)c->mode, (int)c->layout, (int)c->dtype, cp_last_error());
    sum_shares(&r, &d->sh, mpi_group);
    cpref_errors(d, &r, eP);
    for (int i = 0; i < (c->dtype == CP_DTYPE_FP8_E4M3 ? 2 : 5); i++) /* FP8: forward only */
        if (!(eP[i] <= 1.25 * e1[i] + 1e-9))
            fail_msg("mode %d layout %d dtype %d a2a %d: %s error %.4g vs %.4g at CP=1", (int)c->mode, (int)c->layout,
                     (int)c->dtype, c->a2a, cpref_error_names[i], eP[i], e1[i]);
    cpref_result_free(&r);
    cp_group_destroy(g);
}

static void matrix(cp_comm *cpc, MPI_Comm mpi_group, int P)
{
    static const cp_dtype dtypes[] = { CP_DTYPE_F32, CP_DTYPE_BF16, CP_DTYPE_FP8_E4M3 };
    int idx = 0;
    for (int causal = 0; causal < 2; causal++)
        for (int gqa = 0; gqa < 2; gqa++)
            for (int ti = 0; ti < 3; ti++, idx++) {
                cpref_shape sh = { .B = 2, .S = 48, .H = 8, .Hkv = gqa ? 2 : 8, .D = 16, .Dv = 16, .causal = causal };
                sh.scale = 0.25;
                cpref_data d;
                cpref_make(&d, &sh, dtypes[ti], 500 + (uint64_t)idx, 2.0);
                for (int mode = 0; mode < 4; mode++)
                    for (int layout = 0; layout < 2; layout++) {
                        cfg c = { (cp_mode)mode, (cp_layout)layout, dtypes[ti], mode == CP_MODE_A2A_P2P && P % 2 == 0 ? 2 : 1 };
                        check(cpc, mpi_group, &d, &c);
                    }
                cpref_free(&d);
            }
}

static void test_world_group(void **state)
{
    (void)state;
    matrix(world_comm, MPI_COMM_WORLD, mpi_size);
}

/* tp = 2, cp = world / 2: the CP groups are the strided world ranks
 * {t, t + 2, ...}, split with the topology's color and key. */
static void test_strided_groups(void **state)
{
    (void)state;
    cp_topology_config tc = CP_TOPOLOGY_CONFIG_INIT;
    tc.world_size = mpi_size;
    tc.tp = 2;
    tc.cp = mpi_size / 2;
    cp_topology *t;
    assert_int_equal(cp_topology_create(&tc, &t), CP_SUCCESS);
    int color, key;
    assert_int_equal(cp_topology_color(t, mpi_rank, CP_AXIS_CP, &color, &key), CP_SUCCESS);
    cp_topology_destroy(t);
    cp_comm *cpc;
    if (cp_comm_split(world_comm, color, key, &cpc) != CP_SUCCESS)
        fail_msg("cp_comm_split: %s", cp_last_error());
    MPI_Comm mg;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &mg);
    matrix(cpc, mg, mpi_size / 2);
    MPI_Comm_free(&mg);
    cp_comm_destroy(cpc);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    int rc = 1;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    if (mpi_size % 2 || cp_context_create(&cc, &ctx) != CP_SUCCESS ||
        cp_comm_create_mpi_comm(MPI_COMM_WORLD, &world_comm) != CP_SUCCESS) {
        fprintf(stderr, "setup failed (world size %d must be even): %s\n", mpi_size, cp_last_error());
    } else {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_world_group),
            cmocka_unit_test(test_strided_groups),
        };
        char name[48];
        snprintf(name, sizeof name, "mpi-attn rank %d", mpi_rank);
        rc = cmocka_run_group_tests_name(name, tests, NULL, NULL) ? 1 : 0;
    }
    cp_comm_destroy(world_comm);
    cp_context_destroy(ctx);
    MPI_Finalize();
    return rc;
}
