/* SPDX-License-Identifier: MIT */
/*
 * What the p2p ring sends: the bytes of every sendrecv of a CP forward and
 * backward (counted by the faulty transport, which here never stops
 * anyone) against what the geometry of the layout says a hop must carry.
 * The model of that geometry below is written from the layouts alone; the
 * library's own geometry (lib/attn/ring.h, what its sender and receiver of
 * each hop agree on) is checked against the same model, hop by hop.
 *
 * Under the causal mask a key block's rows split into spans that whole
 * ranks see or do not see. With zigzag, rank j holds chunks j and 2R-1-j;
 * the early chunk is seen by every rank, the late one only by ranks i <= j.
 * The forward passes blocks to rank m-1: block j visits j-1, ..., 0 (who
 * need its late chunk) before R-1, ..., j+1 (who do not). The backward
 * passes them to m+1, own block last: keys and values visit j+1, ..., j-1
 * and the last of those, j-1, needs the late chunk unless j = 0; the dK / dV
 * sums carry the late chunk only once a rank i < j has added to it, i.e.
 * on the j hops that leave ranks 0, ..., j-1. With the contiguous layout a
 * block is seen whole by the ranks after it and not at all by those
 * before. Where a block's rows are not one byte range (BSHD, batch 2), hops
 * carry whole blocks. Without a mask every hop carries every row.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "attn/ring.h"
#include "faulty.h"
#include "world.h"

enum { S = 96, H = 4, HKV = 2, D = 8 };

typedef struct traffic_case {
    int P, batch;
    cp_layout layout;
    cp_format format;
    cp_mask mask;
} traffic_case;

/* What every rank of a case shares. */
typedef struct case_run {
    const traffic_case *c;
    pthread_barrier_t bar;
    faulty_plan *plan;
    long long fwd_bytes; /* counted by rank 0 between the forward and the backward */
} case_run;

static void run_rank(world_rank *r, void *arg)
{
    case_run *k = arg;
    const traffic_case *c = k->c;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = c->batch;
    d.seq_len = S;
    d.num_heads = H;
    d.num_kv_heads = HKV;
    d.head_dim = D;
    d.mask = c->mask;
    d.layout = c->layout;
    d.format = c->format;
    d.mode = CP_MODE_P2P;
    const size_t n = (size_t)c->batch * (size_t)(S / c->P);
    float *q = calloc(n * H * D, sizeof(float)), *kv = calloc(n * HKV * D, sizeof(float));
    float *o = calloc(n * H * D, sizeof(float)), *lse = calloc(n * H, sizeof(float));
    float *dq = calloc(n * H * D, sizeof(float)), *dk = calloc(n * HKV * D, sizeof(float));
    float *dv = calloc(n * HKV * D, sizeof(float));
    cp_status s = q && kv && o && lse && dq && dk && dv ? CP_SUCCESS
                                                         : world_fail(r, CP_ERROR_OUT_OF_MEMORY, "calloc");
    const fixture_cfg fc = { .context = &cc, .desc = &d };
    if (s == CP_SUCCESS)
        s = fixture_open(r, &fc);
    if (s == CP_SUCCESS)
        s = world_fail(r, cp_attn_forward(r->fx.plan, q, kv, kv, o, lse, NULL, 0), "cp_attn_forward");
    /* every forward's sends are counted once all ranks are here (the local
     * transport on the CPU returns when the copy is done) */
    pthread_barrier_wait(&k->bar);
    if (r->rank == 0)
        k->fwd_bytes = atomic_load(&k->plan->sendrecv_bytes);
    pthread_barrier_wait(&k->bar);
    if (s == CP_SUCCESS)
        world_fail(r, cp_attn_backward(r->fx.plan, q, kv, kv, o, lse, o, dq, dk, dv, NULL, 0), "cp_attn_backward");
    free(q), free(kv), free(o), free(lse), free(dq), free(dk), free(dv);
}

/* The three kinds of hop: keys and values in the forward and the backward,
 * and the backward's dK / dV sums. */
typedef enum { HOP_FWD_KV = 0, HOP_BWD_KV = 1, HOP_BWD_ACC = 2 } hop_kind;

/* The model: the half blocks (a block being one rank's keys, or values, or
 * F32 dK / dV sums) that hop h (0 .. R-2) of rank j's block carries, per
 * tensor, as the comment at the top derives them. */
static long long model_halves(const traffic_case *c, hop_kind kind, long long j, long long h)
{
    const long long R = c->P;
    const int rows_apart = c->batch > 1 && c->format == CP_FORMAT_BSHD;
    if (c->mask == CP_MASK_NONE)
        return 2;
    if (c->layout == CP_LAYOUT_ZIGZAG) {
        /* every hop carries some rows of the block: whole blocks if rows are apart */
        if (rows_apart)
            return 2;
        switch (kind) {
        case HOP_FWD_KV: return h < j ? 2 : 1;            /* late chunk while ranks < j are ahead */
        case HOP_BWD_KV: return j > 0 ? 2 : 1;            /* rank j-1 is ahead until the end */
        case HOP_BWD_ACC: return h >= R - 1 - j ? 2 : 1; /* late chunk once a rank < j added to it */
        }
    }
    /* contiguous: block R-1 is seen by no other rank, block j whole by ranks > j */
    switch (kind) {
    case HOP_FWD_KV: return j < R - 1 ? 2 : 0;
    case HOP_BWD_KV: return h <= R - 2 - j ? 2 : 0;
    case HOP_BWD_ACC: return j < R - 1 ? 2 : 0;
    }
    return -1;
}

/* Expected bytes of the forward and the backward, in half blocks per
 * tensor: the model summed over every block's R-1 hops. */
static void expect_halves(const traffic_case *c, long long *fwd, long long *bwd_kv, long long *bwd_acc)
{
    const long long R = c->P;
    *fwd = *bwd_kv = *bwd_acc = 0;
    for (long long j = 0; j < R; j++)
        for (long long h = 0; h < R - 1; h++) {
            *fwd += model_halves(c, HOP_FWD_KV, j, h);
            *bwd_kv += model_halves(c, HOP_BWD_KV, j, h);
            *bwd_acc += model_halves(c, HOP_BWD_ACC, j, h);
        }
}

static long long mod(long long a, long long R)
{
    return ((a % R) + R) % R;
}

/* One hop as the library's ring sees it from member m: the rows it sends
 * and receives, against the model for the blocks they belong to. */
static void check_hop(const traffic_case *c, const char *what, int m, hop_kind kind, long long h, cpi_rows out,
                      long long out_block, cpi_rows in, long long in_block)
{
    static const char *const names[] = { "forward keys", "backward keys", "backward sums" };
    const long long half = S / c->P / 2; /* rows */
    const long long want_out = model_halves(c, kind, out_block, h) * half;
    const long long want_in = model_halves(c, kind, in_block, h) * half;
    const long long got_out = cpi_rows_empty(out) ? 0 : out.hi - out.lo;
    const long long got_in = cpi_rows_empty(in) ? 0 : in.hi - in.lo;
    if (got_out != want_out || got_in != want_in)
        fail_msg("P=%d %s batch %d: member %d, %s hop %lld: sends %lld rows of block %lld (model: %lld), receives "
                 "%lld rows of block %lld (model: %lld)",
                 c->P, what, c->batch, m, names[kind], h, got_out, out_block, want_out, got_in, in_block, want_in);
}

/* The library's geometry of every member's every hop against the model:
 * the library's own answer (ring.h, over the library's token sets), not
 * the bytes it moved. */
static void check_geometry(const traffic_case *c, const char *what)
{
    const int R = c->P;
    cpi_tokset sub[8];
    for (int m = 0; m < R; m++)
        assert_int_equal(cpi_tokset_of_ranks(c->layout, R, S, m, 1, &sub[m]), CP_SUCCESS);
    for (int m = 0; m < R; m++) {
        const cpi_ring r = { .size = R,
                             .member = m,
                             .sub = sub,
                             .causal = c->mask == CP_MASK_CAUSAL,
                             .rows_contiguous = c->batch == 1 || c->format == CP_FORMAT_SBHD };
        for (int h = 0; h < R - 1; h++) {
            /* forward: the hop before step h+1 moves the blocks of step h */
            check_hop(c, what, m, HOP_FWD_KV, h, cpi_ring_fwd_kv_out(&r, h + 1), mod(m + h, R),
                      cpi_ring_fwd_kv_in(&r, h + 1), mod(m + 1 + h, R));
            assert_int_equal(cpi_ring_fwd_block(&r, h + 1), mod(m + 1 + h, R));
            /* backward: the hop before step h moves keys of the blocks
             * owned h ranks back; the one after it, the sums of the
             * blocks of step h */
            check_hop(c, what, m, HOP_BWD_KV, h, cpi_ring_bwd_kv_out(&r, h), mod(m - h, R), cpi_ring_bwd_kv_in(&r, h),
                      mod(m - 1 - h, R));
            assert_int_equal(cpi_ring_bwd_block(&r, h), mod(m - 1 - h, R));
            check_hop(c, what, m, HOP_BWD_ACC, h, cpi_ring_bwd_acc_want(&r, h), mod(m - 1 - h, R),
                      cpi_ring_bwd_acc_have(&r, h + 1), mod(m - 2 - h, R));
        }
        /* nothing has visited the first block's sums; the last step's
         * sums are at home, whole */
        assert_true(cpi_rows_empty(cpi_ring_bwd_acc_have(&r, 0)));
        const cpi_rows home = cpi_ring_bwd_acc_want(&r, R - 1);
        assert_true(home.lo == 0 && home.hi == S / R);
    }
    for (int m = 0; m < R; m++)
        cpi_tokset_free(&sub[m]);
}

static void check_case(const traffic_case *c)
{
    cp_comm *comms[WORLD_MAX_RANKS];
    assert_true(c->P <= WORLD_MAX_RANKS);
    assert_int_equal(cp_comm_create_local(c->P, comms), CP_SUCCESS);
    faulty_plan plan = { .rank = -1 };
    for (int i = 0; i < c->P; i++)
        assert_int_equal(faulty_wrap(&comms[i], &plan), CP_SUCCESS);
    case_run k = { .c = c, .plan = &plan };
    pthread_barrier_init(&k.bar, NULL, (unsigned)c->P);
    world w;
    cp_status st = world_run(&w, c->P, comms, run_rank, &k);
    pthread_barrier_destroy(&k.bar);
    const char *what = c->mask == CP_MASK_NONE ? "no mask" : c->layout == CP_LAYOUT_ZIGZAG ? "zigzag" : "contiguous";
    check_geometry(c, what);
    if (st != CP_SUCCESS)
        fail_msg("P=%d %s: %s", c->P, what, w.error);
    const long long fwd_bytes = k.fwd_bytes;
    const long long half = (long long)c->batch * (S / c->P / 2) * HKV * D * (long long)sizeof(float);
    long long fwd, bwd_kv, bwd_acc;
    expect_halves(c, &fwd, &bwd_kv, &bwd_acc);
    /* keys and values; dK and dV */
    const long long want_fwd = 2 * fwd * half, want_bwd = 2 * (bwd_kv + bwd_acc) * half;
    const long long got_bwd = atomic_load(&plan.sendrecv_bytes) - fwd_bytes;
    /* against whole blocks on every hop, the dK / dV sums taking R hops home */
    const long long P = c->P, whole_fwd = 2 * P * (P - 1) * 2 * half, whole_bwd = 2 * (P * (P - 1) + P * P) * 2 * half;
    print_message("P=%d %-10s batch %d %s: forward %lld bytes (%.3f of whole blocks), backward %lld (%.3f)\n", c->P,
                  what, c->batch, c->format == CP_FORMAT_SBHD ? "SBHD" : "BSHD", fwd_bytes,
                  (double)fwd_bytes / (double)whole_fwd, got_bwd, (double)got_bwd / (double)whole_bwd);
    if (fwd_bytes != want_fwd || got_bwd != want_bwd)
        fail_msg("P=%d %s batch %d: forward sent %lld bytes, expected %lld; backward %lld, expected %lld", c->P, what,
                 c->batch, fwd_bytes, want_fwd, got_bwd, want_bwd);
}

static void test_ring_traffic(void **state)
{
    (void)state;
    static const int sizes[] = { 2, 3, 4, 8 };
    for (int si = 0; si < 4; si++)
        for (int k = 0; k < 5; k++) {
            traffic_case c = { sizes[si], 1, CP_LAYOUT_ZIGZAG, CP_FORMAT_BSHD, CP_MASK_CAUSAL };
            switch (k) {
            case 1: c.layout = CP_LAYOUT_CONTIGUOUS; break;
            case 2: c.mask = CP_MASK_NONE; break;
            case 3: c.batch = 2, c.format = CP_FORMAT_SBHD; break; /* rows one byte range */
            case 4: c.batch = 2; break;                           /* rows apart: whole blocks */
            }
            check_case(&c);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_traffic),
    };
    return cmocka_run_group_tests_name("ring-traffic", tests, NULL, NULL);
}
