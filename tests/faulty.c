/* SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "faulty.h"

typedef struct faulty {
    cp_comm *inner; /* owned */
    faulty_plan *plan;
    int world_rank; /* in the world the plan numbers; children keep their parent's */
} faulty;

static const cp_transport_ops faulty_ops;

/* Is this call the one where the rank stops? Then stop (or return the
 * status a stalled call fails with). */
static cp_status check(faulty *f, const char *what)
{
    faulty_plan *p = f->plan;
    if (f->world_rank != p->rank || !atomic_load(&p->armed) || atomic_fetch_add(&p->calls, 1) < p->after)
        return CP_SUCCESS;
    p->stopped_in = what;
    atomic_store(&p->stopped, 1);
    switch (p->how) {
    case FAULTY_EXIT_PROCESS:
        _exit(0);
    case FAULTY_EXIT_THREAD:
        pthread_exit(NULL);
    case FAULTY_STALL:
        while (!atomic_load(&p->released)) {
            struct timespec ts = { 0, 1000000 };
            nanosleep(&ts, NULL);
        }
        break;
    }
    return cpi_error(CP_ERROR_COMM, "faulty transport: rank %d stopped in %s", f->world_rank, what);
}

#define PASS(what, call)                                                                               \
    do {                                                                                               \
        faulty *f_ = impl;                                                                             \
        cp_status s_ = check(f_, what);                                                                \
        if (s_ != CP_SUCCESS)                                                                          \
            return s_;                                                                                 \
        return f_->inner->ops->call;                                                                   \
    } while (0)

static cp_status f_all_gather(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    PASS("all_gather", all_gather(f_->inner->impl, x, send, recv, bytes));
}

static cp_status f_reduce_scatter(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                                  cp_dtype dtype, cp_reduce_op op)
{
    PASS("reduce_scatter", reduce_scatter(f_->inner->impl, x, send, recv, count, dtype, op));
}

static cp_status f_all_to_all(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    PASS("all_to_all", all_to_all(f_->inner->impl, x, send, recv, bytes));
}

static cp_status f_sendrecv(void *impl, const cp_xfer *x, const void *send, size_t send_bytes, int dst,
                            void *recv, size_t recv_bytes, int src)
{
    atomic_fetch_add(&((faulty *)impl)->plan->sendrecv_bytes, (long long)send_bytes);
    PASS("sendrecv", sendrecv(f_->inner->impl, x, send, send_bytes, dst, recv, recv_bytes, src));
}

static cp_status f_all_reduce(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                              cp_dtype dtype, cp_reduce_op op)
{
    PASS("all_reduce", all_reduce(f_->inner->impl, x, send, recv, count, dtype, op));
}

static cp_status f_barrier(void *impl, const cp_xfer *x)
{
    PASS("barrier", barrier(f_->inner->impl, x));
}

static void f_destroy(void *impl)
{
    faulty *f = impl;
    cp_comm_destroy(f->inner);
    free(f);
}

static faulty *make(cp_comm *inner, faulty_plan *plan, int world_rank)
{
    faulty *f = calloc(1, sizeof *f);
    if (f) {
        f->inner = inner;
        f->plan = plan;
        f->world_rank = world_rank;
    }
    return f;
}

static cp_status f_split(void *impl, int color, int key, int timeout_ms, void **out_impl, int *out_rank,
                         int *out_size)
{
    faulty *f = impl;
    cp_status s = check(f, "split");
    cp_comm *child = NULL;
    if (s == CP_SUCCESS)
        s = cpi_comm_split(f->inner, color, key, timeout_ms, &child);
    if (s != CP_SUCCESS || !child)
        return s;
    faulty *g = make(child, f->plan, f->world_rank);
    if (!g) {
        cp_comm_destroy(child);
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "faulty transport: out of memory");
    }
    *out_impl = g;
    *out_rank = child->rank;
    *out_size = child->size;
    return CP_SUCCESS;
}

static const cp_transport_ops faulty_ops = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_transport_ops),
    .name = "faulty",
    .all_gather = f_all_gather,
    .reduce_scatter = f_reduce_scatter,
    .all_to_all = f_all_to_all,
    .sendrecv = f_sendrecv,
    .all_reduce = f_all_reduce,
    .barrier = f_barrier,
    .split = f_split,
    .destroy = f_destroy,
};

cp_status faulty_wrap(cp_comm **c, faulty_plan *plan)
{
    cp_comm *inner = *c;
    faulty *f = make(inner, plan, inner->rank);
    if (!f)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "faulty transport: out of memory");
    cp_status s = cpi_comm_wrap(&faulty_ops, f, inner->rank, inner->size, c);
    if (s != CP_SUCCESS) {
        free(f);
        *c = inner;
    }
    return s;
}

void faulty_arm(faulty_plan *plan)
{
    atomic_store(&plan->armed, 1);
}

void faulty_release(faulty_plan *plan)
{
    atomic_store(&plan->released, 1);
}
