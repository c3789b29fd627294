/* SPDX-License-Identifier: MIT */
/* The pretend asynchronous device of fakeasync.h: streams are FIFOs run by
 * worker threads, events are (stream, position) pairs, kernels are the CPU
 * backend's. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/context.h"
#include "fakeasync.h"

#define DEFAULT_MAX_DELAY_US 200

typedef struct stream stream;

typedef enum op_kind {
    OP_COPY,
    OP_MEMSET,
    OP_CONVERT,
    OP_REDUCE,
    OP_ATTN_FORWARD,
    OP_ATTN_BACKWARD,
    OP_MERGE,
    OP_ROW_DOT,
    OP_SINK_GRAD,
    OP_WAIT
} op_kind;

/* One queued operation; only the fields of its kind are set. The kernels'
 * arguments are copied when they are queued, as a launch copies its
 * parameters: the caller's struct may be gone or reused (the core fills one
 * struct for all the calls of a block) by the time the worker runs them. */
typedef struct op {
    struct op *next;
    op_kind kind;
    void *dst;
    const void *src;
    size_t dpitch, spitch, width, height; /* copy; memset: width bytes */
    int value;                            /* memset */
    cp_dtype dtype, src_dtype;            /* convert: dst and src; reduce: dtype */
    size_t count;
    cp_reduce_op rop;
    stream *on;      /* wait: the stream waited for (a reference held) ... */
    uint64_t target; /* ... until it has run this many operations */
    union {
        cp_kernel_attn_args attn;   /* attention forward and backward */
        cp_kernel_merge_args merge; /* merge */
        struct {
            const void *y;
            int64_t batch, seq, sb, ss, sh;
            int32_t heads, dim;
        } dot; /* row_dot: d = dst, x = src, type dtype */
        struct {
            const float *lse, *rows;
            int64_t batch, seq;
            int32_t heads;
        } sink; /* sink_grad: g = dst, sinks = src */
    } k;
} op;

/*
 * A stream outlives its state while events recorded on it or waits queued
 * for it still name it (a peer's stream may wait for this one after this
 * rank's state is gone): it is reference counted, and its count of
 * operations run stays readable until the last reference goes.
 */
struct stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* work queued, an operation done, or stop */
    op *head, *tail;
    uint64_t queued, done; /* operations queued and run so far */
    cp_status error;       /* first failure of an operation, for the next drain */
    bool stop;
    atomic_int refs;       /* the state, events recorded on it, waits queued for it */
    pthread_t worker;
    uint64_t rng;          /* the worker's only */
    atomic_int max_delay_us; /* set by the state's owner (fakeasync_set_delay), read by the worker */
    /* The CPU backend's state the kernels of this stream run on: one thread
     * (the worker), used by the worker only, so streams of one state may run
     * kernels at the same time without sharing anything. The scratch sizes
     * answered by attn_workspace_size are those of one thread too. */
    void *cpu;
};

typedef struct state {
    stream *streams[CP_BACKEND_MAX_STREAMS]; /* made on first use, but 0 */
    int current;
    unsigned seed;
    int max_delay_us[CP_BACKEND_MAX_STREAMS]; /* of each stream, made or not yet */
    fakeasync_waits waits; /* what made the host wait so far (fakeasync_host_waits) */
    fakeasync_queued queued; /* what was queued so far (fakeasync_queued_ops) */
} state;

typedef struct event {
    pthread_mutex_t mu; /* recorded by one rank's thread, waited for by others */
    stream *on;         /* NULL until recorded */
    uint64_t target;
} event;

/* ---- streams --------------------------------------------------------------- */

static void stream_retain(stream *s)
{
    atomic_fetch_add(&s->refs, 1);
}

static void stream_release(stream *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* xorshift64*: cheap, and the same delays for the same seed. */
static unsigned next_random(uint64_t *rng)
{
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    return (unsigned)((*rng * 0x2545F4914F6CDD1DULL) >> 33);
}

static unsigned next_delay_us(stream *s)
{
    const int max = atomic_load(&s->max_delay_us);
    if (max <= 0)
        return 0;
    return next_random(&s->rng) % ((unsigned)max + 1);
}

static void pause_us(unsigned us)
{
    if (!us)
        return;
    struct timespec ts = { 0, (long)us * 1000L };
    nanosleep(&ts, NULL);
}

static void copy_rows(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height)
{
    for (size_t r = 0; r < height; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

static cp_status run_op(const stream *s, const op *o)
{
    const cp_backend_ops *cpu = cpi_cpu_backend();
    switch (o->kind) {
    case OP_COPY:
        copy_rows(o->dst, o->dpitch, o->src, o->spitch, o->width, o->height);
        return CP_SUCCESS;
    case OP_MEMSET:
        memset(o->dst, o->value, o->width);
        return CP_SUCCESS;
    case OP_CONVERT:
        return cpu->convert(NULL, o->dst, o->dtype, o->src, o->src_dtype, o->count);
    case OP_REDUCE:
        return cpu->reduce(NULL, o->dst, o->src, o->dtype, o->count, o->rop);
    case OP_ATTN_FORWARD:
        return cpu->attn_forward(s->cpu, &o->k.attn);
    case OP_ATTN_BACKWARD:
        return cpu->attn_backward(s->cpu, &o->k.attn);
    case OP_MERGE:
        return cpu->merge(s->cpu, &o->k.merge);
    case OP_SINK_GRAD:
        return cpu->sink_grad(NULL, o->dst, o->src, o->k.sink.lse, o->k.sink.rows, o->k.sink.batch, o->k.sink.seq,
                              o->k.sink.heads);
    case OP_ROW_DOT:
        return cpu->row_dot(NULL, o->dst, o->src, o->k.dot.y, o->dtype, o->k.dot.batch, o->k.dot.seq,
                            o->k.dot.heads, o->k.dot.dim, o->k.dot.sb, o->k.dot.ss, o->k.dot.sh);
    case OP_WAIT: {
        /* Never this worker's own stream ahead of itself: the target was
         * queued before this wait, so it has run already then. */
        stream *t = o->on;
        pthread_mutex_lock(&t->mu);
        while (t->done < o->target)
            pthread_cond_wait(&t->cv, &t->mu);
        pthread_mutex_unlock(&t->mu);
        stream_release(t);
        return CP_SUCCESS;
    }
    }
    return CP_ERROR_INTERNAL;
}

static void *worker_main(void *p)
{
    stream *s = p;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head)
            break;
        op *o = s->head;
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        pause_us(next_delay_us(s));
        cp_status st = run_op(s, o);
        free(o);
        pthread_mutex_lock(&s->mu);
        if (st != CP_SUCCESS && s->error == CP_SUCCESS)
            s->error = st;
        s->done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static cp_status stream_create(state *st, int index, stream **out)
{
    stream *s = calloc(1, sizeof *s);
    if (!s)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "fakeasync: out of memory for stream %d", index);
    atomic_init(&s->refs, 1);
    /* never 0, or xorshift would stay there */
    s->rng = ((uint64_t)st->seed << 8 | (uint64_t)index) * 0x9E3779B97F4A7C15ULL + 1;
    atomic_init(&s->max_delay_us, st->max_delay_us[index]);
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return cpi_error(CP_ERROR_INTERNAL, "fakeasync: cannot make the lock of stream %d", index);
    }
    if (pthread_cond_init(&s->cv, NULL) != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return cpi_error(CP_ERROR_INTERNAL, "fakeasync: cannot make the condition of stream %d", index);
    }
    cp_status e = cpi_cpu_backend()->open(0, NULL, 1, &s->cpu);
    if (e != CP_SUCCESS) {
        stream_release(s);
        return e;
    }
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        cpi_cpu_backend()->close(s->cpu);
        stream_release(s);
        return cpi_error(CP_ERROR_INTERNAL, "fakeasync: cannot start the worker of stream %d", index);
    }
    *out = s;
    return CP_SUCCESS;
}

/* Wait until s has run everything queued on it so far; report (once) an
 * operation that failed meanwhile. */
static cp_status drain(stream *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->queued;
    while (s->done < target)
        pthread_cond_wait(&s->cv, &s->mu);
    cp_status e = s->error;
    s->error = CP_SUCCESS;
    pthread_mutex_unlock(&s->mu);
    if (e != CP_SUCCESS)
        return cpi_error(e, "fakeasync: an operation queued on the stream failed (%s)", cp_status_string(e));
    return CP_SUCCESS;
}

static void stream_stop(stream *s)
{
    drain(s);
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->worker, NULL);
    /* nothing runs on the stream any more, though events may still name it */
    cpi_cpu_backend()->close(s->cpu);
    s->cpu = NULL;
    stream_release(s);
}

static cp_status enqueue(state *st, const op *tmpl)
{
    /* An attention call's rectangle list is host memory the caller may
     * reuse once the call returns (a GPU backend stages it at the launch):
     * it travels with the operation. */
    const bool rects = (tmpl->kind == OP_ATTN_FORWARD || tmpl->kind == OP_ATTN_BACKWARD) && tmpl->k.attn.rects;
    const size_t extra = rects ? (size_t)tmpl->k.attn.num_rects * sizeof(cp_attn_rect) : 0;
    op *o = malloc(sizeof *o + extra);
    if (!o)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "fakeasync: out of memory queueing an operation");
    *o = *tmpl;
    o->next = NULL;
    if (rects) {
        cp_attn_rect *copy = (cp_attn_rect *)(o + 1);
        memcpy(copy, tmpl->k.attn.rects, extra);
        o->k.attn.rects = copy;
    }
    switch (tmpl->kind) {
    case OP_COPY: st->queued.copy++; break;
    case OP_MEMSET: st->queued.memset++; break;
    case OP_CONVERT: st->queued.convert++; break;
    case OP_REDUCE: st->queued.reduce++; break;
    case OP_ATTN_FORWARD: st->queued.attn_forward++; break;
    case OP_ATTN_BACKWARD: st->queued.attn_backward++; break;
    case OP_MERGE: st->queued.merge++; break;
    default: break;
    }
    stream *s = st->streams[st->current];
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    s->queued++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return CP_SUCCESS;
}

/* ---- the table ----------------------------------------------------------- */

cp_status fakeasync_open(unsigned seed, int max_delay_us, void **out)
{
    *out = NULL;
    state *st = calloc(1, sizeof *st);
    if (!st)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "fakeasync: out of memory for a state");
    st->seed = seed;
    for (int i = 0; i < CP_BACKEND_MAX_STREAMS; i++)
        st->max_delay_us[i] = max_delay_us;
    cp_status s = stream_create(st, 0, &st->streams[0]);
    if (s != CP_SUCCESS) {
        free(st);
        return s;
    }
    *out = st;
    return CP_SUCCESS;
}

cp_status fakeasync_context(unsigned seed, int max_delay_us, int device_index, cp_context **out)
{
    *out = NULL;
    void *fake = NULL;
    CPI_TRY(fakeasync_open(seed, max_delay_us, &fake));
    cp_context *dev = calloc(1, sizeof *dev);
    if (!dev) {
        fakeasync_ops()->close(fake);
        return CP_ERROR_OUT_OF_MEMORY;
    }
    dev->device = CP_DEVICE_CUDA;
    dev->device_index = device_index;
    dev->num_threads = 1;
    dev->deterministic = 1;
    dev->ops = fakeasync_ops();
    dev->state = fake;
    *out = dev;
    return CP_SUCCESS;
}

void fakeasync_context_destroy(cp_context *ctx)
{
    if (!ctx)
        return;
    fakeasync_ops()->close(ctx->state);
    free(ctx);
}

fakeasync_waits fakeasync_host_waits(const void *p)
{
    return ((const state *)p)->waits;
}

fakeasync_queued fakeasync_queued_ops(const void *p)
{
    return ((const state *)p)->queued;
}

cp_status fakeasync_set_delay(void *p, int index, int max_delay_us)
{
    state *st = p;
    if (index < 0 || index >= CP_BACKEND_MAX_STREAMS)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "fakeasync_set_delay: index = %d (must be in [0, %d))", index,
                         CP_BACKEND_MAX_STREAMS);
    st->max_delay_us[index] = max_delay_us;
    if (st->streams[index])
        atomic_store(&st->streams[index]->max_delay_us, max_delay_us);
    return CP_SUCCESS;
}

static cp_status fa_open(int device_index, void *foreign, int num_threads, void **out)
{
    (void)foreign;
    (void)num_threads;
    return fakeasync_open((unsigned)device_index, DEFAULT_MAX_DELAY_US, out);
}

static void fa_close(void *p)
{
    state *st = p;
    if (!st)
        return;
    for (int i = 0; i < CP_BACKEND_MAX_STREAMS; i++)
        if (st->streams[i])
            stream_stop(st->streams[i]);
    free(st);
}

static cp_status fa_set_stream(void *p, void *foreign)
{
    (void)p;
    (void)foreign;
    return CP_SUCCESS;
}

static cp_status fa_synchronize(void *p)
{
    state *st = p;
    st->waits.synchronize++;
    return drain(st->streams[st->current]);
}

static cp_status fa_alloc(void *p, size_t bytes, void **ptr)
{
    ((state *)p)->waits.alloc++;
    *ptr = malloc(bytes ? bytes : 1);
    if (!*ptr)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "fakeasync: out of memory allocating %zu bytes", bytes);
    /* Garbage, but the same garbage each time: a read before any write is
     * wrong data, not an uninitialised read under valgrind. */
    memset(*ptr, 0xCD, bytes);
    return CP_SUCCESS;
}

/* Like cudaFree: queued work may still use the memory, so wait for it. */
static void fa_free(void *p, void *ptr)
{
    state *st = p;
    if (!ptr)
        return;
    st->waits.free++;
    for (int i = 0; i < CP_BACKEND_MAX_STREAMS; i++)
        if (st->streams[i])
            drain(st->streams[i]);
    free(ptr);
}

static cp_status fa_copy_2d(void *p, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t height, cp_copy_kind kind)
{
    state *st = p;
    if (kind < CP_COPY_HOST_TO_HOST || kind > CP_COPY_DEVICE_TO_DEVICE)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "fakeasync copy_2d: kind = %d", (int)kind);
    if (width > dpitch && height > 1)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "fakeasync copy_2d: width %zu > dpitch %zu", width, dpitch);
    if (kind == CP_COPY_DEVICE_TO_DEVICE) {
        op o = { .kind = OP_COPY, .dst = dst, .src = src, .dpitch = dpitch, .spitch = spitch, .width = width,
                 .height = height };
        return enqueue(st, &o);
    }
    /* Pageable host memory: after the stream's earlier work, before returning. */
    st->waits.host_copy++;
    CPI_TRY(drain(st->streams[st->current]));
    copy_rows(dst, dpitch, src, spitch, width, height);
    return CP_SUCCESS;
}

static cp_status fa_memset(void *p, void *dst, int value, size_t bytes)
{
    op o = { .kind = OP_MEMSET, .dst = dst, .value = value, .width = bytes };
    return enqueue(p, &o);
}

static cp_status fa_convert(void *p, void *dst, cp_dtype dst_type, const void *src, cp_dtype src_type, size_t count)
{
    if (!cpi_dtype_valid(dst_type) || !cpi_dtype_valid(src_type))
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "fakeasync convert: dtypes %d <- %d", (int)dst_type,
                         (int)src_type);
    op o = { .kind = OP_CONVERT, .dst = dst, .src = src, .dtype = dst_type, .src_dtype = src_type, .count = count };
    return enqueue(p, &o);
}

static cp_status fa_reduce(void *p, void *acc, const void *x, cp_dtype dtype, size_t count, cp_reduce_op op_)
{
    if (!cpi_dtype_valid(dtype) || (op_ != CP_REDUCE_SUM && op_ != CP_REDUCE_MAX))
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "fakeasync reduce: dtype %d, op %d", (int)dtype, (int)op_);
    op o = { .kind = OP_REDUCE, .dst = acc, .src = x, .dtype = dtype, .count = count, .rop = op_ };
    return enqueue(p, &o);
}

/* Scratch sizes need not wait for the stream: they depend on the shape and
 * on the thread count of the streams' CPU states (one, all alike). */
static atomic_int dq_sums; /* fakeasync_set_dq_sums */

void fakeasync_set_dq_sums(int on)
{
    atomic_store(&dq_sums, on != 0);
}

static cp_status fa_attn_workspace_size(void *p, const cp_kernel_attn_args *a, int backward, size_t *bytes)
{
    state *st = p;
    CPI_TRY(cpi_cpu_backend()->attn_workspace_size(st->streams[0]->cpu, a, backward, bytes));
    if (backward && !a->grad_accumulate && atomic_load(&dq_sums))
        *bytes += (size_t)a->batch * (size_t)a->seq_q * (size_t)a->num_heads * (size_t)a->head_dim * 4;
    return CP_SUCCESS;
}

/* A workspace too small is an argument error, reported when the kernel is
 * queued (as a launch would), not by the worker at the next drain. */
static cp_status check_workspace(state *st, const cp_kernel_attn_args *a, int backward, const char *func)
{
    if (!a->workspace)
        return CP_SUCCESS; /* the CPU kernel allocates its own */
    size_t need = 0;
    CPI_TRY(fa_attn_workspace_size(st, a, backward, &need));
    if (a->workspace_bytes < need)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "fakeasync %s: workspace_bytes = %zu (the call needs %zu)", func,
                         a->workspace_bytes, need);
    return CP_SUCCESS;
}

static cp_status fa_attn_forward(void *p, const cp_kernel_attn_args *a)
{
    CPI_TRY(check_workspace(p, a, 0, "attn_forward"));
    op o = { .kind = OP_ATTN_FORWARD, .k.attn = *a };
    return enqueue(p, &o);
}

static cp_status fa_attn_backward(void *p, const cp_kernel_attn_args *a)
{
    CPI_TRY(check_workspace(p, a, 1, "attn_backward"));
    op o = { .kind = OP_ATTN_BACKWARD, .k.attn = *a };
    return enqueue(p, &o);
}

static cp_status fa_merge(void *p, const cp_kernel_merge_args *a)
{
    op o = { .kind = OP_MERGE, .k.merge = *a };
    return enqueue(p, &o);
}

static cp_status fa_row_dot(void *p, float *d, const void *x, const void *y, cp_dtype t, int64_t batch,
                            int64_t seq, int32_t heads, int32_t dim, int64_t sb, int64_t ss, int64_t sh)
{
    op o = { .kind = OP_ROW_DOT, .dst = d, .src = x, .dtype = t };
    o.k.dot.y = y;
    o.k.dot.batch = batch;
    o.k.dot.seq = seq;
    o.k.dot.heads = heads;
    o.k.dot.dim = dim;
    o.k.dot.sb = sb;
    o.k.dot.ss = ss;
    o.k.dot.sh = sh;
    return enqueue(p, &o);
}

static cp_status fa_sink_grad(void *p, float *g, const float *sinks, const float *lse, const float *rows,
                              int64_t batch, int64_t seq, int32_t heads)
{
    op o = { .kind = OP_SINK_GRAD, .dst = g, .src = sinks };
    o.k.sink.lse = lse;
    o.k.sink.rows = rows;
    o.k.sink.batch = batch;
    o.k.sink.seq = seq;
    o.k.sink.heads = heads;
    return enqueue(p, &o);
}

static cp_status fa_stream_select(void *p, int index)
{
    state *st = p;
    if (index < 0 || index >= CP_BACKEND_MAX_STREAMS)
        return cpi_error(CP_ERROR_INVALID_ARGUMENT, "fakeasync stream_select: index = %d (must be in [0, %d))",
                         index, CP_BACKEND_MAX_STREAMS);
    if (!st->streams[index])
        CPI_TRY(stream_create(st, index, &st->streams[index]));
    st->current = index;
    return CP_SUCCESS;
}

static cp_status fa_event_create(void *p, void **out)
{
    (void)p;
    *out = NULL;
    event *e = calloc(1, sizeof *e);
    if (!e)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "fakeasync: out of memory for an event");
    if (pthread_mutex_init(&e->mu, NULL) != 0) {
        free(e);
        return cpi_error(CP_ERROR_INTERNAL, "fakeasync: cannot make the lock of an event");
    }
    *out = e;
    return CP_SUCCESS;
}

static void fa_event_destroy(void *p, void *ev)
{
    (void)p;
    event *e = ev;
    if (!e)
        return;
    if (e->on)
        stream_release(e->on);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static cp_status fa_event_record(void *p, void *ev)
{
    state *st = p;
    event *e = ev;
    stream *s = st->streams[st->current];
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->queued;
    pthread_mutex_unlock(&s->mu);
    stream_retain(s);
    pthread_mutex_lock(&e->mu);
    stream *old = e->on;
    e->on = s;
    e->target = target;
    pthread_mutex_unlock(&e->mu);
    if (old)
        stream_release(old);
    return CP_SUCCESS;
}

static cp_status fa_event_wait(void *p, void *ev)
{
    event *e = ev;
    pthread_mutex_lock(&e->mu);
    op o = { .kind = OP_WAIT, .on = e->on, .target = e->target };
    if (o.on)
        stream_retain(o.on);
    pthread_mutex_unlock(&e->mu);
    if (!o.on)
        return CP_SUCCESS; /* never recorded */
    cp_status s = enqueue(p, &o);
    if (s != CP_SUCCESS)
        stream_release(o.on);
    return s;
}

static const cp_backend_ops ops = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_backend_ops),
    .name = "fakeasync",
    .device = CP_DEVICE_CUDA,
    .open = fa_open,
    .close = fa_close,
    .set_stream = fa_set_stream,
    .synchronize = fa_synchronize,
    .alloc = fa_alloc,
    .free = fa_free,
    .copy_2d = fa_copy_2d,
    .memset = fa_memset,
    .convert = fa_convert,
    .reduce = fa_reduce,
    .attn_workspace_size = fa_attn_workspace_size,
    .attn_forward = fa_attn_forward,
    .attn_backward = fa_attn_backward,
    .merge = fa_merge,
    .stream_select = fa_stream_select,
    .event_create = fa_event_create,
    .event_destroy = fa_event_destroy,
    .event_record = fa_event_record,
    .event_wait = fa_event_wait,
    .kernel_args_size = sizeof(cp_kernel_attn_args), /* the CPU kernels: windows, softcaps, rectangles, FP8 */
    .row_dot = fa_row_dot,
    .sink_grad = fa_sink_grad,
};

const cp_backend_ops *fakeasync_ops(void)
{
    return &ops;
}
