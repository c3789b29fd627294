/* SPDX-License-Identifier: MIT */
/* A world of ranks for the tests (see world.h). */
#include "world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cp_status world_fail(world_rank *r, cp_status s, const char *what)
{
    if (s == CP_SUCCESS)
        return s;
    const char *msg = cp_last_error();
    world *w = r->w;
    pthread_mutex_lock(&w->lock);
    if (r->status == CP_SUCCESS) {
        r->status = s;
        snprintf(r->error, sizeof r->error, "rank %d: %s: %s", r->rank, what, msg ? msg : "");
    }
    if (w->status == CP_SUCCESS) {
        w->status = s;
        snprintf(w->error, sizeof w->error, "%s", r->error);
    }
    pthread_mutex_unlock(&w->lock);
    return s;
}

cp_status world_status(world *w)
{
    pthread_mutex_lock(&w->lock);
    cp_status s = w->status;
    pthread_mutex_unlock(&w->lock);
    return s;
}

cp_status fixture_open(world_rank *r, const fixture_cfg *cfg)
{
    fixture *f = &r->fx;
    fixture_close(f);
    f->device = cfg->device;
    cp_status s = cfg->device ? cfg->device->open(r, cfg->context, cfg->device->arg, &f->ctx)
                              : cp_context_create(cfg->context, &f->ctx);
    if (s != CP_SUCCESS) {
        f->ctx = NULL;
        return world_fail(r, s, cfg->device ? "opening the device" : "cp_context_create");
    }
    f->comm = r->comm;
    if (cfg->split) {
        if ((s = cp_comm_split(r->comm, cfg->color, cfg->key, &f->split)) != CP_SUCCESS)
            return world_fail(r, s, "cp_comm_split");
        f->comm = f->split;
    }
    if ((s = cp_group_create(f->ctx, f->comm, cfg->group, &f->group)) != CP_SUCCESS)
        return world_fail(r, s, "cp_group_create");
    cp_group_rank(f->group, &f->rank);
    cp_group_size(f->group, &f->size);
    if (cfg->desc && (s = cp_attn_plan_create(f->group, cfg->desc, &f->plan)) != CP_SUCCESS)
        return world_fail(r, s, "cp_attn_plan_create");
    return CP_SUCCESS;
}

void fixture_close(fixture *f)
{
    cp_attn_plan_destroy(f->plan);
    cp_group_destroy(f->group);
    cp_comm_destroy(f->split);
    if (f->device && f->ctx)
        f->device->close(f->ctx, f->device->arg);
    else
        cp_context_destroy(f->ctx);
    memset(f, 0, sizeof *f);
}

/* A rank's thread. A rank whose thread exits from inside a call (a fault
 * the suite plants) skips the end of this; world_join closes its fixture. */
static void *rank_thread(void *p)
{
    world_rank *r = p;
    r->w->main(r, r->w->arg);
    fixture_close(&r->fx);
    atomic_fetch_add(&r->w->returned, 1);
    return NULL;
}

cp_status world_start(world *w, int n, cp_comm **comms, world_main fn, void *arg)
{
    memset(w, 0, sizeof *w);
    cp_comm *local[WORLD_MAX_RANKS];
    if (n < 1 || n > WORLD_MAX_RANKS) {
        for (int i = 0; comms && i < n; i++)
            cp_comm_destroy(comms[i]);
        w->status = CP_ERROR_INVALID_ARGUMENT;
        snprintf(w->error, sizeof w->error, "world_start: %d ranks (1 to %d)", n, WORLD_MAX_RANKS);
        return w->status;
    }
    if (!comms && (w->status = cp_comm_create_local(n, local)) != CP_SUCCESS) {
        snprintf(w->error, sizeof w->error, "cp_comm_create_local(%d): %s", n, cp_last_error());
        return w->status;
    }
    pthread_mutex_init(&w->lock, NULL);
    w->size = n;
    w->main = fn;
    w->arg = arg;
    for (int i = 0; i < n; i++)
        w->ranks[i] = (world_rank){ .w = w, .rank = i, .size = n, .comm = comms ? comms[i] : local[i] };
    for (int i = 0; i < n; i++)
        if (pthread_create(&w->threads[i], NULL, rank_thread, &w->ranks[i]) != 0) {
            /* the ranks started would wait for this one: nothing to do but stop */
            fprintf(stderr, "world_start: pthread_create failed for rank %d of %d\n", i, n);
            abort();
        }
    return CP_SUCCESS;
}

cp_status world_join(world *w)
{
    for (int i = 0; i < w->size; i++)
        pthread_join(w->threads[i], NULL);
    for (int i = 0; i < w->size; i++)
        fixture_close(&w->ranks[i].fx);
    for (int i = 0; i < w->size; i++) {
        cp_comm_destroy(w->ranks[i].comm);
        w->ranks[i].comm = NULL;
    }
    pthread_mutex_destroy(&w->lock);
    return w->status;
}

cp_status world_run(world *w, int n, cp_comm **comms, world_main fn, void *arg)
{
    cp_status s = world_start(w, n, comms, fn, arg);
    return s != CP_SUCCESS ? s : world_join(w);
}
