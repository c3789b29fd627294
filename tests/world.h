/* SPDX-License-Identifier: MIT */
/*
 * A world of ranks for the tests: one thread per rank, each with its
 * communicator and, when it asks, its fixture (context, CP group and plan),
 * and the first failure of any rank collected for the main thread. A suite
 * writes what one rank does; the world runs it on every rank:
 *
 *     static void rank_main(world_rank *r, void *arg)
 *     {
 *         if (fixture_open(r, &cfg) != CP_SUCCESS)
 *             return;
 *         world_fail(r, cp_attn_forward(r->fx.plan, ...), "cp_attn_forward");
 *     }
 *
 *     world w;
 *     if (world_run(&w, 4, NULL, rank_main, &arg) != CP_SUCCESS)
 *         fail_msg("%s", w.error);
 *
 * (fixture_open and world_fail note the rank, the call that failed and
 * cp_last_error() in w.error.)
 *
 * Teardown is the world's: a rank's fixture is closed on its own thread
 * when its function returns (by the main thread when the thread exited
 * from inside a call instead), and the communicators are destroyed once
 * every rank is done, so that a rank that returns early leaves its peers
 * waiting for it, as a rank that never arrives would, instead of failing
 * them at once (the local transport fails the peers of a destroyed
 * communicator).
 */
#ifndef INFINICP_TESTS_WORLD_H
#define INFINICP_TESTS_WORLD_H

#include <pthread.h>
#include <stdatomic.h>

#include <infinicp/infinicp.h>

#define WORLD_MAX_RANKS 16
#define WORLD_ERROR_MAX 600

typedef struct world world;
typedef struct world_rank world_rank;

/* A context that cp_context_create cannot make (a pretend device): open
 * gets the fixture's context configuration (may be NULL); close gets what
 * open made. */
typedef struct fixture_device {
    cp_status (*open)(const world_rank *r, const cp_context_config *cc, void *arg, cp_context **ctx);
    void (*close)(cp_context *ctx, void *arg);
    void *arg;
} fixture_device;

/* What a rank's fixture is made of; NULL pointers take the library's
 * defaults. */
typedef struct fixture_cfg {
    const cp_context_config *context;
    const fixture_device *device; /* NULL: cp_context_create(context) */
    /* The group's communicator split from the rank's with color and key
     * (a CP group inside a larger world), instead of the rank's own. */
    int split, color, key;
    const cp_group_config *group;
    const cp_attn_desc *desc; /* NULL: no plan */
} fixture_cfg;

/* One rank's context, CP group and plan. */
typedef struct fixture {
    cp_context *ctx;
    cp_comm *comm; /* the group's: the rank's own, or `split` */
    cp_group *group;
    cp_attn_plan *plan;
    int rank, size; /* in the group */
    cp_comm *split;
    const fixture_device *device;
} fixture;

struct world_rank {
    world *w;
    int rank, size; /* in the world */
    cp_comm *comm;  /* the world's, destroyed when every rank is done */
    fixture fx;     /* fixture_open's; closed after the rank's function */
    cp_status status; /* this rank's first failure (world_fail) */
    char error[WORLD_ERROR_MAX];
};

typedef void (*world_main)(world_rank *r, void *arg);

struct world {
    int size;
    world_main main;
    void *arg;
    world_rank ranks[WORLD_MAX_RANKS];
    pthread_t threads[WORLD_MAX_RANKS];
    pthread_mutex_t lock;
    atomic_int returned; /* ranks whose function returned and whose fixture is closed */
    cp_status status;    /* the first failure of any rank */
    char error[WORLD_ERROR_MAX];
};

/*
 * Start n ranks (1 to WORLD_MAX_RANKS), each running fn(rank, arg) on a
 * thread of its own, on the communicators comms[0 .. n-1] (the world takes
 * them over: wrapped, or made with settings of the suite's own) or, where
 * comms is NULL, on a new local world. The ranks run on until world_join.
 * Returns a failure to start (w->error says which), after which there is
 * nothing to join.
 */
cp_status world_start(world *w, int n, cp_comm **comms, world_main fn, void *arg);

/* Wait for every rank, close what they left open, destroy the
 * communicators; returns w->status, the first failure (w->error: which
 * rank, the call, and its message). */
cp_status world_join(world *w);

/* world_start, then world_join. */
cp_status world_run(world *w, int n, cp_comm **comms, world_main fn, void *arg);

/* Record that `what` failed on rank r with status s (nothing if s is
 * CP_SUCCESS), with cp_last_error(): the rank's first failure in r->error,
 * the world's first in w->error (later ones add nothing). Returns s. */
cp_status world_fail(world_rank *r, cp_status s, const char *what);

/* The first failure of the world so far, for ranks that stop when a peer
 * failed (after world_join: w->status). */
cp_status world_status(world *w);

/*
 * Make rank r's context, group (and plan, with cfg->desc) into r->fx, in
 * that order (a fixture opened before is closed first), and note a failure
 * with world_fail naming the call; what was made is closed with the rest
 * when the rank is done.
 */
cp_status fixture_open(world_rank *r, const fixture_cfg *cfg);

/* Free what a fixture holds, plan first; a closed fixture is all NULL. */
void fixture_close(fixture *f);

#endif
