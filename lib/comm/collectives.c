/* SPDX-License-Identifier: MIT */
/* The checked entry points to a communicator's collectives. Everything in
 * the library moves data through these: they validate what one rank can
 * validate alone (the transports compare ranks with each other), then
 * dispatch to the transport. */
#include <stddef.h>
#include <stdint.h>

#include "comm/agree.h"
#include "comm/group.h"

cp_xfer cpi_xfer_resolve(const cp_xfer *x)
{
    cp_xfer r = *x;
    if (!r.backend) {
        r.backend = cpi_cpu_backend();
        r.backend_state = NULL;
    }
    return r;
}

/* The transport is done with an exchange on c: the first of a call whose
 * verdict rides it (agree.h) settles the agreement on c. */
static cp_status exchanged(cp_comm *c, cp_status s)
{
    if (c->agreement)
        cpi_agree_exchanged(c, s);
    return s;
}

static cp_status check_comm(const char *name, const cp_comm *c, const cp_xfer *x)
{
    CPI_CHECK(c != NULL, "%s: comm is NULL", name);
    CPI_CHECK(x != NULL, "%s: xfer is NULL", name);
    return CP_SUCCESS;
}

static cp_status check_buffer(const char *name, const char *what, const void *p, size_t bytes)
{
    CPI_CHECK(p != NULL || bytes == 0, "%s: %s is NULL for %zu bytes", name, what, bytes);
    return CP_SUCCESS;
}

/* bytes * factor, or an error naming the argument. */
static cp_status checked_mul(const char *name, const char *what, size_t bytes, size_t factor, size_t *out)
{
    CPI_CHECK(cpi_mul(bytes, factor, out), "%s: %s = %zu times %zu overflows size_t", name, what, bytes,
              factor);
    return CP_SUCCESS;
}

static cp_status check_reduction(const char *name, cp_dtype dtype, cp_reduce_op op)
{
    CPI_CHECK(cpi_dtype_valid(dtype), "%s: dtype = %d (not a cp_dtype)", name, (int)dtype);
    CPI_CHECK(dtype != CP_DTYPE_FP8_E4M3, "%s: dtype = CP_DTYPE_FP8_E4M3 (no type of reductions)", name);
    CPI_CHECK(op == CP_REDUCE_SUM || op == CP_REDUCE_MAX,
              "%s: op = %d (must be CP_REDUCE_SUM (0) or CP_REDUCE_MAX (1))", name, (int)op);
    return CP_SUCCESS;
}

cp_status cpi_all_gather(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    static const char name[] = "all_gather";
    size_t total;
    CPI_TRY(check_comm(name, c, x));
    CPI_TRY(checked_mul(name, "bytes", bytes, (size_t)c->size, &total));
    CPI_TRY(check_buffer(name, "send", send, bytes));
    CPI_TRY(check_buffer(name, "recv", recv, bytes));
    /* In place means send is this rank's own block of recv. */
    const char *own = (const char *)recv + (size_t)c->rank * bytes;
    CPI_CHECK(send == own || !cpi_overlap(send, bytes, recv, total),
              "%s: send %p overlaps recv %p but is not its block %d (in place is send == recv + rank*bytes)",
              name, send, recv, c->rank);
    cp_xfer r = cpi_xfer_resolve(x);
    return exchanged(c, c->ops->all_gather(c->impl, &r, send, recv, bytes));
}

cp_status cpi_reduce_scatter(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t count,
                             cp_dtype dtype, cp_reduce_op op)
{
    return cpi_reduce_scatter_ws(c, x, send, recv, count, dtype, op, NULL, 0);
}

cp_status cpi_reduce_scatter_ws(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t count,
                                cp_dtype dtype, cp_reduce_op op, void *scratch, size_t scratch_bytes)
{
    static const char name[] = "reduce_scatter";
    size_t block, total;
    CPI_TRY(check_comm(name, c, x));
    CPI_TRY(check_reduction(name, dtype, op));
    CPI_TRY(checked_mul(name, "count", count, cpi_dtype_size(dtype), &block));
    CPI_TRY(checked_mul(name, "count", block, (size_t)c->size, &total));
    CPI_TRY(check_buffer(name, "send", send, total));
    CPI_TRY(check_buffer(name, "recv", recv, block));
    cp_xfer r = cpi_xfer_resolve(x);
    if (scratch && c->caps && c->caps->reduce_scatter_ws)
        return exchanged(c, c->caps->reduce_scatter_ws(c->impl, &r, send, recv, count, dtype, op, scratch,
                                                       scratch_bytes));
    return exchanged(c, c->ops->reduce_scatter(c->impl, &r, send, recv, count, dtype, op));
}

cp_status cpi_all_to_all(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t bytes)
{
    static const char name[] = "all_to_all";
    size_t total;
    CPI_TRY(check_comm(name, c, x));
    CPI_TRY(checked_mul(name, "bytes", bytes, (size_t)c->size, &total));
    CPI_TRY(check_buffer(name, "send", send, bytes));
    CPI_TRY(check_buffer(name, "recv", recv, bytes));
    CPI_CHECK(!cpi_overlap(send, total, recv, total), "%s: send %p and recv %p overlap (%zu bytes each)", name,
              send, recv, total);
    cp_xfer r = cpi_xfer_resolve(x);
    return exchanged(c, c->ops->all_to_all(c->impl, &r, send, recv, bytes));
}

bool cpi_comm_has_all_to_all_2d(const cp_comm *c)
{
    return c && CP_TRANSPORT_HAS(c->ops, all_to_all_2d);
}

/* The bytes that n blocks of rows rows span: the lowest block starts lo
 * bytes from the base (lo <= 0), and len bytes follow from there; false
 * on overflow. */
static bool strided_extent(int n, ptrdiff_t step, size_t pitch, size_t width, size_t rows, ptrdiff_t *lo,
                           size_t *len)
{
    *lo = 0;
    *len = 0;
    if (!width || !rows)
        return true;
    const size_t mag = step < 0 ? (size_t)0 - (size_t)step : (size_t)step;
    size_t span, body;
    if (!cpi_mul((size_t)(n - 1), mag, &span) || span > (size_t)PTRDIFF_MAX || !cpi_mul(rows - 1, pitch, &body) ||
        body > SIZE_MAX - width || span > SIZE_MAX - (body + width))
        return false;
    *lo = step < 0 ? -(ptrdiff_t)span : 0;
    *len = span + body + width;
    return true;
}

cp_status cpi_all_to_all_2d(cp_comm *c, const cp_xfer *x, const void *send, ptrdiff_t send_step, size_t send_pitch,
                            void *recv, ptrdiff_t recv_step, size_t recv_pitch, size_t width, size_t rows)
{
    static const char name[] = "all_to_all_2d";
    ptrdiff_t slo, rlo;
    size_t slen, rlen;
    CPI_TRY(check_comm(name, c, x));
    if (!cpi_comm_has_all_to_all_2d(c))
        return cpi_error(CP_ERROR_UNSUPPORTED, "%s: transport %s does not read strided blocks in place", name,
                         c->ops->name);
    CPI_CHECK(rows <= 1 || send_pitch >= width, "%s: send_pitch = %zu is less than width = %zu", name, send_pitch,
              width);
    CPI_CHECK(rows <= 1 || recv_pitch >= width, "%s: recv_pitch = %zu is less than width = %zu", name, recv_pitch,
              width);
    CPI_CHECK(strided_extent(c->size, send_step, send_pitch, width, rows, &slo, &slen) &&
                  strided_extent(c->size, recv_step, recv_pitch, width, rows, &rlo, &rlen),
              "%s: %d blocks of %zu rows of %zu bytes overflow size_t", name, c->size, rows, width);
    CPI_TRY(check_buffer(name, "send", send, slen));
    CPI_TRY(check_buffer(name, "recv", recv, rlen));
    const char *s0 = slen ? (const char *)send + slo : NULL, *r0 = rlen ? (const char *)recv + rlo : NULL;
    CPI_CHECK(!cpi_overlap(s0, slen, r0, rlen),
              "%s: send %p (%zu bytes from %p) and recv %p (%zu bytes from %p) overlap", name, send, slen,
              (const void *)s0, recv, rlen, (const void *)r0);
    cp_xfer r = cpi_xfer_resolve(x);
    return exchanged(c, c->ops->all_to_all_2d(c->impl, &r, send, send_step, send_pitch, recv, recv_step,
                                              recv_pitch, width, rows));
}

cp_status cpi_sendrecv(cp_comm *c, const cp_xfer *x, const void *send, size_t send_bytes, int dst,
                       void *recv, size_t recv_bytes, int src)
{
    static const char name[] = "sendrecv";
    CPI_TRY(check_comm(name, c, x));
    CPI_CHECK(dst >= 0 && dst < c->size, "%s: dst = %d (must be in [0, %d))", name, dst, c->size);
    CPI_CHECK(src >= 0 && src < c->size, "%s: src = %d (must be in [0, %d))", name, src, c->size);
    CPI_TRY(check_buffer(name, "send", send, send_bytes));
    CPI_TRY(check_buffer(name, "recv", recv, recv_bytes));
    CPI_CHECK(!cpi_overlap(send, send_bytes, recv, recv_bytes),
              "%s: send %p (%zu bytes) and recv %p (%zu bytes) overlap", name, send, send_bytes, recv, recv_bytes);
    cp_xfer r = cpi_xfer_resolve(x);
    return exchanged(c, c->ops->sendrecv(c->impl, &r, send, send_bytes, dst, recv, recv_bytes, src));
}

cp_status cpi_all_reduce(cp_comm *c, const cp_xfer *x, const void *send, void *recv, size_t count,
                         cp_dtype dtype, cp_reduce_op op)
{
    static const char name[] = "all_reduce";
    size_t bytes;
    CPI_TRY(check_comm(name, c, x));
    CPI_TRY(check_reduction(name, dtype, op));
    CPI_TRY(checked_mul(name, "count", count, cpi_dtype_size(dtype), &bytes));
    CPI_TRY(check_buffer(name, "send", send, bytes));
    CPI_TRY(check_buffer(name, "recv", recv, bytes));
    CPI_CHECK(send == recv || !cpi_overlap(send, bytes, recv, bytes),
              "%s: send %p and recv %p overlap without being equal", name, send, (void *)recv);
    cp_xfer r = cpi_xfer_resolve(x);
    return exchanged(c, c->ops->all_reduce(c->impl, &r, send, recv, count, dtype, op));
}

cp_status cpi_barrier(cp_comm *c, const cp_xfer *x)
{
    CPI_TRY(check_comm("barrier", c, x));
    cp_xfer r = cpi_xfer_resolve(x);
    return exchanged(c, c->ops->barrier(c->impl, &r));
}

cp_status cpi_comm_wait(cp_comm *c, const cp_xfer *x)
{
    if (!CP_TRANSPORT_HAS(c->ops, wait))
        return CP_SUCCESS;
    cp_xfer r = cpi_xfer_resolve(x);
    return c->ops->wait(c->impl, &r);
}

cp_status cpi_all_reduce_host(cp_context *ctx, cp_comm *comm, int timeout_ms, double *v, size_t n,
                              cp_reduce_op op)
{
    cp_xfer host = { NULL, NULL, timeout_ms };
    cp_xfer x = ctx ? cpi_xfer(ctx, timeout_ms) : host;
    if (!ctx || ctx->device == CP_DEVICE_CPU)
        return cpi_all_reduce(comm, &x, v, v, n, CP_DTYPE_F64, op);

    const size_t bytes = n * sizeof *v;
    void *dev = NULL;
    CPI_TRY(ctx->ops->alloc(ctx->state, bytes, &dev));
    cp_status s = ctx->ops->copy_2d(ctx->state, dev, bytes, v, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE);
    if (s == CP_SUCCESS)
        s = cpi_all_reduce(comm, &x, dev, dev, n, CP_DTYPE_F64, op);
    /* The transport waits with the timeout, watching for its own errors,
     * before the copy to v: a copy to pageable memory blocks the host until
     * the stream reaches it. A stream the transport gave up on may stay
     * stuck, and synchronizing or freeing dev (which synchronizes) would
     * hang: dev is left behind then. */
    cp_status w = cpi_comm_wait(comm, &x);
    if (w != CP_SUCCESS)
        return s != CP_SUCCESS ? s : w;
    if (s == CP_SUCCESS)
        s = ctx->ops->copy_2d(ctx->state, v, bytes, dev, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST);
    cp_status sync = ctx->ops->synchronize(ctx->state); /* queued work may still use dev */
    ctx->ops->free(ctx->state, dev);
    return s != CP_SUCCESS ? s : sync;
}
