/* SPDX-License-Identifier: MIT */
/*
 * Per-context CPU state: the tile primitives chosen for this processor and a
 * pool of worker threads, created with the context and reused by every
 * kernel call on it.
 *
 * A parallel job runs fn(arg, t, n) for t = 0 .. n-1: the calling thread is
 * t = 0, workers 1 .. n-1 take the rest. Jobs on one context are serialised
 * (a context is a queue, like a device stream), so two threads that share a
 * context get correct results, one call after the other.
 *
 * fork(): the child of a process that holds a context gets a copy of the
 * state but none of the workers (and possibly a lock some other thread held
 * at the fork). There the state runs every job on the calling thread, task
 * by task, without touching the pool: the results are the same, only
 * slower, and destroying the context frees memory without waiting for
 * threads that do not exist.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

struct cpi_cpu_state {
    int num_threads; /* workers + the caller */
    const cpi_tile_ops *tiles;

    pthread_mutex_t job_lock; /* one job at a time */
    pthread_mutex_t lock;     /* guards the fields below */
    pthread_cond_t wake;      /* a new job or shutdown */
    pthread_cond_t done;      /* a worker finished its part */
    unsigned long generation; /* bumped for every job */
    int job_threads;          /* n of the current job */
    int pending;              /* workers still running it */
    int stop;
    cpi_task_fn fn;
    void *arg;

    int num_workers; /* started workers */
    pthread_t *workers;
    pid_t owner;     /* the process the workers run in */
};

/* Whether this is a forked child of the process that made the state. */
static int orphaned(const cpi_cpu_state *s)
{
    return getpid() != s->owner;
}

typedef struct {
    cpi_cpu_state *s;
    int index; /* 1 .. num_threads-1 */
} worker_arg;

static void *worker_main(void *p)
{
    worker_arg *w = p;
    cpi_cpu_state *s = w->s;
    int me = w->index;
    free(w);
    unsigned long seen = 0;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->stop && s->generation == seen)
            pthread_cond_wait(&s->wake, &s->lock);
        if (s->stop)
            break;
        seen = s->generation;
        if (me >= s->job_threads)
            continue; /* not needed for this job */
        cpi_task_fn fn = s->fn;
        void *arg = s->arg;
        int n = s->job_threads;
        pthread_mutex_unlock(&s->lock);
        fn(arg, me, n);
        pthread_mutex_lock(&s->lock);
        if (--s->pending == 0)
            pthread_cond_signal(&s->done);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void stop_workers(cpi_cpu_state *s)
{
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < s->num_workers; i++)
        pthread_join(s->workers[i], NULL);
    s->num_workers = 0;
}

cp_status cpi_cpu_state_create(int num_threads, cpi_cpu_state **out)
{
    *out = NULL;
    const cpi_tile_ops *tiles;
    CPI_TRY(cpi_tile_ops_select(&tiles));
    cpi_cpu_state *s = cpi_calloc(1, sizeof *s);
    if (!s)
        return CP_ERROR_OUT_OF_MEMORY;
    s->num_threads = num_threads > 0 ? num_threads : 1;
    s->tiles = tiles;
    s->owner = getpid();
    pthread_mutex_init(&s->job_lock, NULL);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->done, NULL);
    if (s->num_threads > 1) {
        s->workers = cpi_calloc((size_t)s->num_threads - 1, sizeof *s->workers);
        if (!s->workers) {
            cpi_cpu_state_destroy(s);
            return CP_ERROR_OUT_OF_MEMORY;
        }
    }
    for (int i = 1; i < s->num_threads; i++) {
        worker_arg *w = cpi_calloc(1, sizeof *w);
        if (!w) {
            cpi_cpu_state_destroy(s);
            return CP_ERROR_OUT_OF_MEMORY;
        }
        w->s = s;
        w->index = i;
        int rc = pthread_create(&s->workers[s->num_workers], NULL, worker_main, w);
        if (rc != 0) {
            free(w);
            cpi_cpu_state_destroy(s);
            return cpi_error(CP_ERROR_BACKEND, "cp_context_create: cannot start CPU worker thread %d of %d: %s", i,
                             num_threads, strerror(rc));
        }
        s->num_workers++;
    }
    *out = s;
    return CP_SUCCESS;
}

void cpi_cpu_state_destroy(void *state)
{
    cpi_cpu_state *s = state;
    if (!s)
        return;
    if (!orphaned(s)) {
        stop_workers(s);
        pthread_cond_destroy(&s->done);
        pthread_cond_destroy(&s->wake);
        pthread_mutex_destroy(&s->lock);
        pthread_mutex_destroy(&s->job_lock);
    }
    free(s->workers);
    free(s);
}

/* A NULL state is plain host memory without a context (the transports use
 * the CPU backend that way for their staging): one thread, the selected ISA. */
int cpi_cpu_state_threads(const cpi_cpu_state *s)
{
    return s ? s->num_threads : 1;
}

const cpi_tile_ops *cpi_cpu_state_tiles(const cpi_cpu_state *s)
{
    if (s)
        return s->tiles;
    const cpi_tile_ops *tiles;
    return cpi_tile_ops_select(&tiles) == CP_SUCCESS ? tiles : &cpi_tile_ops_generic;
}

void cpi_cpu_parallel(cpi_cpu_state *s, int n, cpi_task_fn fn, void *arg)
{
    if (!s) {
        fn(arg, 0, 1);
        return;
    }
    if (n > s->num_threads)
        n = s->num_threads;
    if (orphaned(s)) {
        for (int t = 0; t < n; t++)
            fn(arg, t, n);
        return;
    }
    if (n <= 1) {
        pthread_mutex_lock(&s->job_lock);
        fn(arg, 0, 1);
        pthread_mutex_unlock(&s->job_lock);
        return;
    }
    pthread_mutex_lock(&s->job_lock);
    pthread_mutex_lock(&s->lock);
    s->fn = fn;
    s->arg = arg;
    s->job_threads = n;
    s->pending = n - 1;
    s->generation++;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);

    fn(arg, 0, n);

    pthread_mutex_lock(&s->lock);
    while (s->pending > 0)
        pthread_cond_wait(&s->done, &s->lock);
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_unlock(&s->job_lock);
}
