/* SPDX-License-Identifier: MIT */
/*
 * CP attention, forward and backward, on the asynchronous pretend device of
 * fakeasync.c: every rank a thread with a state of its own, whose streams
 * run their work later, on threads of their own, each operation after a
 * random delay.
 *
 * Why: on a device with streams the p2p ring moves keys, values and
 * gradient accumulators on a comm stream while the attention kernels run on
 * a compute stream, and only events order the two (a transfer into a buffer
 * after the kernel that last read it, a kernel after the transfer that
 * filled its inputs, an accumulator's hop after the kernel that added to
 * it). The CPU backend has no streams, so there every step runs in order
 * and a missing or misplaced event wait goes unseen; here it lets a kernel
 * read a buffer before its data arrives, or a transfer overwrite one a
 * kernel still reads, and the results come out wrong.
 *
 * What: modes all_gather and p2p (P = 2, 3, 4), a2a_p2p with a2a size 2
 * (P = 2, 4) and a2a (P = 2, 4); contiguous and zigzag layouts; causal and no mask; batch
 * 1 in BSHD and batch 2 in SBHD (the ring sends partial row ranges of a
 * block only where its rows are one byte range, which both are); F32; each
 * configuration with three device seeds, one per speed profile of the
 * ring's streams (even, slow transfers, slow kernels: see profiles below),
 * so with different interleavings. Every output (out, lse, dq, dk, dv) must
 * be bit for bit that of the same configuration on CPU contexts of one
 * thread (the pretend device runs the CPU kernels, one thread per stream,
 * and a ring that waits where it should computes exactly what it computes
 * in order), and both must be close to the FP64 reference of cpref.c.
 * And on ranks that pass their own workspace, the forward and backward
 * never make the host wait for the device (no synchronize, alloc, free or
 * copy from host memory): on a GPU such a wait holds every rank that
 * shares it (docs/PERFORMANCE.md, all_gather on one GPU). And a rank whose
 * attention is one kernel call each way (CP = 1, a2a) clears and converts
 * nothing (docs/ARCHITECTURE.md, Direct).
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

#include "core/context.h"
#include "cpref.h"
#include "cprun.h"
#include "fakeasync.h"

#define SEQ 48 /* zigzag needs S % (2P) == 0 for P = 2, 3, 4 */
#define MAX_DELAY_US 200

/* Relative RMS error against the FP64 reference that an F32 run stays
 * under (fp32 accumulation over at most 48 keys; test-attn bounds CP=1 by
 * 1e-5 on like shapes). A run that reads stale or unwritten data is off by
 * far more, or NaN. */
#define REF_BOUND 1e-5

typedef struct run_cfg {
    cp_mode mode;
    int A; /* a2a size of a2a_p2p */
    int P;
    cp_layout layout;
    int causal;
    int batch; /* 1: BSHD; 2: SBHD */
} run_cfg;

static const char *const mode_names[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };

/*
 * The speeds of the ring's streams (ring.c: transfers on stream 1, kernels
 * on stream 2; every other stream MAX_DELAY_US), one per device seed of a
 * configuration. With slow transfers a kernel that does not wait for its
 * keys and values reads them before they arrive; with slow kernels a
 * transfer that does not wait for the kernel still reading its target
 * buffer overwrites it. The slow stream must be much slower: with equal
 * delays a stream is seldom several operations ahead of another, and the
 * hosts queue the ring's steps no faster than the transport's rendezvous
 * let them, so the transfer of a later step often is not even queued
 * before the kernel of an earlier one has run.
 */
typedef struct speeds {
    const char *name;
    int comm_us, compute_us; /* the streams' maximum delays */
} speeds;

static const speeds profiles[] = {
    { "even streams", MAX_DELAY_US, MAX_DELAY_US },
    { "slow transfers", MAX_DELAY_US * 5, MAX_DELAY_US / 10 },
    { "slow kernels", MAX_DELAY_US / 10, MAX_DELAY_US * 5 },
};
#define SEEDS ((int)(sizeof profiles / sizeof profiles[0]))

static void describe(const run_cfg *c, char *buf, size_t n)
{
    snprintf(buf, n, "%s P=%d A=%d %s %s B=%d %s", mode_names[c->mode], c->P, c->A,
             c->layout == CP_LAYOUT_ZIGZAG ? "zigzag" : "contiguous", c->causal ? "causal" : "nomask", c->batch,
             c->batch == 1 ? "BSHD" : "SBHD");
}

/* ---- one CP run: P ranks, each a thread ------------------------------------ */

/* The pretend device of a run: its seed and its streams' speeds. */
typedef struct fake_cfg {
    unsigned seed;
    const speeds *speed;
} fake_cfg;

/* A context by hand: the library reaches the device through ctx->ops and
 * ctx->state only, and the pretend device is no backend that
 * cp_context_create could open. */
static cp_status open_fake(const world_rank *r, const cp_context_config *cc, void *arg, cp_context **out)
{
    const fake_cfg *f = arg;
    (void)cc;
    cp_status s = fakeasync_context(f->seed * 16 + (unsigned)r->rank, MAX_DELAY_US, r->rank, out);
    if (s == CP_SUCCESS && (s = fakeasync_set_delay((*out)->state, 1, f->speed->comm_us)) == CP_SUCCESS)
        s = fakeasync_set_delay((*out)->state, 2, f->speed->compute_us);
    if (s != CP_SUCCESS) {
        fakeasync_context_destroy(*out);
        *out = NULL;
    }
    return s;
}

static void close_fake(cp_context *ctx, void *arg)
{
    (void)arg;
    fakeasync_context_destroy(ctx);
}

/*
 * Run configuration c on d's inputs, on the pretend device with the given
 * seed and speeds or (speed NULL) on CPU contexts of one thread, as every
 * stream of the pretend device has: the CPU backward splits its keys by the
 * thread count, which changes how dQ is summed. The plan's own workspace on
 * some ranks, the caller's (0xff bytes before each call) on the others,
 * changing with the seed. The caller frees o->g.
 */
/* What made each rank's host wait for the pretend device during its forward
 * and backward (the world rank is the context's device index). */
#define MAX_P 8
typedef struct waits_seen {
    fakeasync_waits before[MAX_P], during[MAX_P];
    fakeasync_queued qbefore[MAX_P], queued[MAX_P]; /* operations queued during them */
    int own_workspace[MAX_P];
} waits_seen;

static void count_waits(cp_context *ctx, int after, int own_workspace, void *arg)
{
    waits_seen *w = arg;
    const int r = ctx->device_index;
    if (ctx->ops != fakeasync_ops() || r < 0 || r >= MAX_P)
        return;
    const fakeasync_waits now = fakeasync_host_waits(ctx->state);
    const fakeasync_queued qn = fakeasync_queued_ops(ctx->state);
    if (!after) {
        w->before[r] = now;
        w->qbefore[r] = qn;
        return;
    }
    const fakeasync_waits b = w->before[r];
    w->during[r] = (fakeasync_waits){ now.synchronize - b.synchronize, now.alloc - b.alloc, now.free - b.free,
                                      now.host_copy - b.host_copy };
    const fakeasync_queued qb = w->qbefore[r];
    w->queued[r] = (fakeasync_queued){ qn.copy - qb.copy,
                                       qn.memset - qb.memset,
                                       qn.convert - qb.convert,
                                       qn.reduce - qb.reduce,
                                       qn.attn_forward - qb.attn_forward,
                                       qn.attn_backward - qb.attn_backward,
                                       qn.merge - qb.merge };
    w->own_workspace[r] = own_workspace;
}

static cp_status run_world(const cpref_data *d, const run_cfg *c, unsigned seed, const speeds *speed, cprun_out *o,
                           waits_seen *waits)
{
    fake_cfg f = { seed, speed };
    const fixture_device fake = { open_fake, close_fake, &f };
    const cprun_cfg rc = { .mode = c->mode,
                           .layout = c->layout,
                           .dtype = CP_DTYPE_F32,
                           .format = c->batch == 1 ? CP_FORMAT_BSHD : CP_FORMAT_SBHD,
                           .P = c->P,
                           .A = c->A,
                           .device = speed ? &fake : NULL,
                           /* rank + seed decides, whatever the mode */
                           .ws_salt = seed + (unsigned)c->mode,
                           .calls = waits ? count_waits : NULL,
                           .calls_arg = waits };
    return cprun_world(d, &rc, o);
}

/* ---- comparing ------------------------------------------------------------ */

static const char *const tensor_names[5] = { "out", "lse", "dq", "dk", "dv" };

static void tensors(const cpref_result *r, const cpref_shape *sh, const double *t[5], size_t n[5])
{
    const size_t bs = (size_t)sh->B * (size_t)sh->S;
    t[0] = r->out;
    n[0] = bs * (size_t)sh->H * (size_t)sh->Dv;
    t[1] = r->lse;
    n[1] = bs * (size_t)sh->H;
    t[2] = r->dq;
    n[2] = bs * (size_t)sh->H * (size_t)sh->D;
    t[3] = r->dk;
    n[3] = bs * (size_t)sh->Hkv * (size_t)sh->D;
    t[4] = r->dv;
    n[4] = bs * (size_t)sh->Hkv * (size_t)sh->Dv;
}

/* Every result within REF_BOUND of the FP64 reference (NaN is not). */
static void check_reference(const cpref_data *d, const cpref_result *r, const char *who, const char *cfg)
{
    double e[5];
    cpref_errors(d, r, e);
    for (int i = 0; i < 5; i++)
        if (!(e[i] <= REF_BOUND))
            fail_msg("%s %s: %s relative RMS error %.3g against the FP64 reference (bound %.0e); errors out %.3g "
                     "lse %.3g dq %.3g dk %.3g dv %.3g",
                     cfg, who, tensor_names[i], e[i], REF_BOUND, e[0], e[1], e[2], e[3], e[4]);
}

/* The pretend device's results bit for bit those of the CPU contexts. */
static void check_identical(const cpref_shape *sh, const cpref_result *fake, const cpref_result *cpu,
                            const char *who, const char *cfg)
{
    const double *a[5], *b[5];
    size_t n[5];
    tensors(fake, sh, a, n);
    tensors(cpu, sh, b, n);
    for (int i = 0; i < 5; i++) {
        if (!memcmp(a[i], b[i], n[i] * sizeof(double)))
            continue;
        size_t first = 0, count = 0;
        for (size_t k = n[i]; k-- > 0;)
            if (memcmp(&a[i][k], &b[i][k], sizeof(double))) {
                first = k;
                count++;
            }
        fail_msg("%s %s: %s differs from the CPU contexts' in %zu of %zu values, the first at %zu: %.9g (CPU %.9g)",
                 cfg, who, tensor_names[i], count, n[i], first, a[i][first], b[i][first]);
    }
}

/* With the caller's workspace, a rank's forward and backward never make the
 * host wait for the device: every exchange, reduction included, goes in
 * stream order, so ranks queue their work and return, as on a GPU. (With
 * the plan's own workspace its first calls allocate it.) */
static void check_no_waits(const waits_seen *w, int P, const char *who, const char *cfg)
{
    for (int r = 0; r < P && r < MAX_P; r++) {
        const fakeasync_waits *x = &w->during[r];
        if (w->own_workspace[r])
            continue;
        if (x->synchronize || x->alloc || x->free || x->host_copy)
            fail_msg("%s %s: rank %d's forward and backward made the host wait for the device: %lu synchronize, "
                     "%lu alloc, %lu free, %lu host copies",
                     cfg, who, r, x->synchronize, x->alloc, x->free, x->host_copy);
    }
}

/* ---- the configurations ------------------------------------------------- */

static unsigned next_seed = 1;

/* One configuration: the CPU contexts once, then the pretend device with
 * a seed for each speed profile. */
static void check_config(const cpref_data *d, const run_cfg *c)
{
    char cfg[128];
    describe(c, cfg, sizeof cfg);
    cprun_out cpu;
    if (run_world(d, c, 0, NULL, &cpu, NULL) != CP_SUCCESS)
        fail_msg("%s on CPU contexts: %s", cfg, cpu.error);
    check_reference(d, &cpu.g, "on CPU contexts", cfg);
    for (int k = 0; k < SEEDS; k++) {
        const unsigned seed = next_seed++;
        cprun_out fake;
        char who[96];
        snprintf(who, sizeof who, "on the pretend device (seed %u, %s)", seed, profiles[k].name);
        waits_seen waits;
        memset(&waits, 0, sizeof waits);
        if (run_world(d, c, seed, &profiles[k], &fake, &waits) != CP_SUCCESS)
            fail_msg("%s %s: %s", cfg, who, fake.error);
        check_reference(d, &fake.g, who, cfg);
        check_identical(&d->sh, &fake.g, &cpu.g, who, cfg);
        check_no_waits(&waits, c->P, who, cfg);
        cprun_out_free(&fake);
    }
    cprun_out_free(&cpu);
}

/* Every layout, mask and batch / format of one mode (a2a size A) on the
 * given CP sizes. */
static void matrix(cp_mode mode, int A, const int *sizes, int nsizes)
{
    int runs = 0;
    for (int batch = 1; batch <= 2; batch++)
        for (int causal = 0; causal < 2; causal++) {
            /* MHA would do; GQA (2 query heads per kv head) also has the
             * a2a at P = 4 replicate kv heads */
            cpref_shape sh = { .B = batch, .S = SEQ, .H = 4, .Hkv = 2, .D = 8, .Dv = 8, .causal = causal };
            sh.scale = 1.0 / sqrt((double)sh.D);
            cpref_data d;
            assert_int_equal(cpref_make(&d, &sh, CP_DTYPE_F32, 9000 + (uint64_t)(batch * 2 + causal), 2.0), 0);
            for (int layout = 0; layout < 2; layout++)
                for (int si = 0; si < nsizes; si++) {
                    const run_cfg c = { mode, A, sizes[si], (cp_layout)layout, causal, batch };
                    assert_true(sh.S % (2 * c.P) == 0);
                    check_config(&d, &c);
                    runs++;
                }
            cpref_free(&d);
        }
    print_message("%s: %d configurations, each on CPU contexts and on the pretend device with %d seeds\n",
                  mode_names[mode], runs, SEEDS);
}

/* K / V all-gathered, dK / dV reduce-scattered (their staging in the
 * plan's workspace). */
static void test_all_gather(void **state)
{
    (void)state;
    static const int sizes[] = { 2, 3, 4 };
    matrix(CP_MODE_ALL_GATHER, 1, sizes, 3);
}

static void test_p2p(void **state)
{
    (void)state;
    static const int sizes[] = { 2, 3, 4 };
    matrix(CP_MODE_P2P, 1, sizes, 3);
}

/* a2a inside pairs, the ring across them (P = 4: a ring of 2; P = 2: a2a
 * only, with no ring). */
static void test_a2a_p2p(void **state)
{
    (void)state;
    static const int sizes[] = { 2, 4 };
    matrix(CP_MODE_A2A_P2P, 2, sizes, 2);
}

/* No ring: the exchanges and the kernels on stream 0, ordered by the
 * transport's events. */
static void test_a2a(void **state)
{
    (void)state;
    static const int sizes[] = { 2, 4 };
    matrix(CP_MODE_A2A, 1, sizes, 2);
}

/*
 * Where a rank's whole attention is one kernel call (CP = 1, or a2a with
 * every kv head on one member, over a block of one span pair or a causal
 * block of back-to-back spans), the forward stores the output and the
 * backward the gradients straight into their tensors: no fp32 partial or
 * sums to clear, merge into and convert. Checked as a property of every
 * run of the configurations below: a rank (with its own workspace) that
 * made one forward and one backward kernel call queued no memset and no
 * conversion; and some ranks did. (No configuration here shares a kv head
 * between a2a members.) The results are checked as everywhere in this
 * file.
 */
static void test_one_call_direct(void **state)
{
    (void)state;
    static const struct {
        cp_mode mode;
        int P;
    } runs[] = { { CP_MODE_P2P, 1 }, { CP_MODE_A2A, 2 } };
    int direct = 0, ranks = 0;
    /* dq_sums: the direct backward needs more scratch than the regular one
     * (as on CUDA with 16-bit gradients), which the partials it skips make
     * room for */
    for (int run = 0; run < 4; run++) {
        const int dq_sums = run / 2, causal = run % 2;
        fakeasync_set_dq_sums(dq_sums);
        /* H / Hkv = 2: a2a at P = 2 puts one kv head on each member */
        cpref_shape sh = { .B = 1, .S = SEQ, .H = 4, .Hkv = 2, .D = 8, .Dv = 8, .causal = causal };
        sh.scale = 1.0 / sqrt((double)sh.D);
        cpref_data d;
        assert_int_equal(cpref_make(&d, &sh, CP_DTYPE_F32, 9100 + (uint64_t)causal, 2.0), 0);
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
            for (int layout = 0; layout < 2; layout++) {
                const run_cfg c = { runs[i].mode, 1, runs[i].P, (cp_layout)layout, causal, 1 };
                char cfg[128];
                describe(&c, cfg, sizeof cfg);
                if (dq_sums)
                    strncat(cfg, ", dQ sums in the scratch", sizeof cfg - strlen(cfg) - 1);
                cprun_out fake;
                waits_seen w;
                memset(&w, 0, sizeof w);
                if (run_world(&d, &c, next_seed++, &profiles[0], &fake, &w) != CP_SUCCESS)
                    fail_msg("%s on the pretend device: %s", cfg, fake.error);
                check_reference(&d, &fake.g, "on the pretend device", cfg);
                for (int r = 0; r < c.P; r++) {
                    const fakeasync_queued *q = &w.queued[r];
                    /* (with the caller's workspace the harness clears it
                     * before each call: memsets of its own) */
                    if (!w.own_workspace[r])
                        continue;
                    ranks++;
                    if (q->attn_forward != 1 || q->attn_backward != 1)
                        continue;
                    direct++;
                    /* (F32 here: a conversion to the output type is a copy;
                     * P = 1 has no exchange, so it would show as one) */
                    if (q->memset || q->convert || (c.P == 1 && q->copy))
                        fail_msg("%s: rank %d made one forward and one backward kernel call, but queued %lu "
                                 "memsets, %lu conversions and %lu copies",
                                 cfg, r, q->memset, q->convert, q->copy);
                }
                cprun_out_free(&fake);
            }
        cpref_free(&d);
    }
    fakeasync_set_dq_sums(0);
    print_message("one kernel call each way on %d of %d ranks, none clearing or converting\n", direct, ranks);
    assert_true(direct > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_gather),
        cmocka_unit_test(test_p2p),
        cmocka_unit_test(test_a2a_p2p),
        cmocka_unit_test(test_a2a),
        cmocka_unit_test(test_one_call_direct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
