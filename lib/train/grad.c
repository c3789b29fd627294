/* SPDX-License-Identifier: MIT */
/*
 * cp_grad_all_reduce: gradients of replicated parameters summed (or
 * averaged) over a communicator, in place, one fixed-size bucket at a time.
 *
 * Buckets bound the memory: the transport's all-reduce stages what it
 * reduces (the local transport keeps an accumulator of the whole call), so
 * one call over a whole model's gradients would need a second model-sized
 * buffer. 16-bit gradients are widened to F32 per bucket first, so the sum
 * is formed in F32 and rounded once, whatever the transport does with
 * 16-bit types.
 */
#include <stdlib.h>

#include "comm/agree.h"
#include "train/exchange.h"

typedef struct bucket_run {
    const cp_backend_ops *b;
    void *bs;
    cp_comm *comm;
    cp_xfer x;
    cp_dtype dtype, wide;  /* storage and reduction types */
    cp_grad_reduce op;
    void *stage;           /* F32 bucket for 16-bit dtypes, else NULL */
    void *host;            /* host copy for averaging on a device, else NULL */
} bucket_run;

static cp_status check_args(const void *grad, size_t count, cp_dtype dtype, cp_grad_reduce op,
                            size_t bucket_bytes, size_t *per_bucket)
{
    static const char f[] = "cp_grad_all_reduce";
    CPI_CHECK(cpi_dtype_valid(dtype), "%s: dtype = %d (must be a cp_dtype)", f, (int)dtype);
    CPI_CHECK(dtype != CP_DTYPE_FP8_E4M3,
              "%s: dtype = CP_DTYPE_FP8_E4M3 (FP8 is an input type of the attention forward, not a gradient type: "
              "must be CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16 or CP_DTYPE_F64)",
              f);
    CPI_CHECK(op == CP_GRAD_SUM || op == CP_GRAD_AVERAGE,
              "%s: op = %d (must be CP_GRAD_SUM (0) or CP_GRAD_AVERAGE (1))", f, (int)op);
    const size_t es = cpi_dtype_size(dtype);
    size_t bytes;
    CPI_CHECK(cpi_mul(count, es, &bytes) && bytes <= PTRDIFF_MAX,
              "%s: count = %zu elements of %s overflows the address space", f, count, cpi_dtype_name(dtype));
    CPI_CHECK(grad != NULL || count == 0, "%s: grad is NULL for count = %zu", f, count);
    if (bucket_bytes == 0)
        bucket_bytes = CP_GRAD_BUCKET_BYTES_DEFAULT;
    CPI_CHECK(bucket_bytes >= es, "%s: bucket_bytes = %zu is smaller than one %s element (%zu bytes)", f,
              bucket_bytes, cpi_dtype_name(dtype), es);
    *per_bucket = bucket_bytes / es;
    return CP_SUCCESS;
}

/* x[i] /= size on the host, in the reduction type. */
static void divide(void *x, cp_dtype wide, size_t n, int size)
{
    if (wide == CP_DTYPE_F64) {
        double *d = x;
        for (size_t i = 0; i < n; i++)
            d[i] /= (double)size;
    } else {
        float *f = x;
        for (size_t i = 0; i < n; i++)
            f[i] /= (float)size;
    }
}

/* Divide a reduced bucket by the communicator size where it lives. */
static cp_status average(const bucket_run *r, void *buf, size_t n)
{
    if (r->b->device == CP_DEVICE_CPU) {
        divide(buf, r->wide, n, r->comm->size);
        return CP_SUCCESS;
    }
    /* Backends have no scaling kernel: the bucket takes a trip to the host. */
    const size_t bytes = n * cpi_dtype_size(r->wide);
    /* Bounded by the timeout, unlike the copy to pageable host memory, which
     * blocks until the stream reaches it. */
    CPI_TRY(cpi_comm_wait(r->comm, &r->x));
    CPI_TRY(r->b->copy_2d(r->bs, r->host, bytes, buf, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST));
    CPI_TRY(r->b->synchronize(r->bs));
    divide(r->host, r->wide, n, r->comm->size);
    CPI_TRY(r->b->copy_2d(r->bs, buf, bytes, r->host, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE));
    return r->b->synchronize(r->bs); /* the host copy is reused by the next bucket */
}

static cp_status reduce_bucket(const bucket_run *r, void *p, size_t n)
{
    void *buf = r->stage ? r->stage : p;
    if (r->stage)
        CPI_TRY(r->b->convert(r->bs, r->stage, r->wide, p, r->dtype, n));
    CPI_TRY(cpi_all_reduce(r->comm, &r->x, buf, buf, n, r->wide, CP_REDUCE_SUM));
    if (r->op == CP_GRAD_AVERAGE && r->comm->size > 1)
        CPI_TRY(average(r, buf, n));
    if (r->stage)
        CPI_TRY(r->b->convert(r->bs, p, r->dtype, r->stage, r->wide, n));
    return CP_SUCCESS;
}

/* The bucket-sized buffers, taken before the ranks compare notes so that a
 * failed allocation fails every rank at once. */
static cp_status alloc_buffers(bucket_run *r, size_t n0)
{
    const size_t ws = cpi_dtype_size(r->wide);
    if (n0 && r->wide != r->dtype)
        CPI_TRY(r->b->alloc(r->bs, n0 * ws, &r->stage));
    if (n0 && r->op == CP_GRAD_AVERAGE && r->b->device != CP_DEVICE_CPU && !(r->host = cpi_calloc(n0, ws)))
        return CP_ERROR_OUT_OF_MEMORY;
    return CP_SUCCESS;
}

static void free_buffers(bucket_run *r)
{
    if (r->stage) {
        r->b->synchronize(r->bs); /* queued conversions may still use it */
        r->b->free(r->bs, r->stage);
    }
    free(r->host);
}

CP_EXPORT cp_status cp_grad_all_reduce(cp_context *ctx, cp_comm *comm, void *grad, size_t count, cp_dtype dtype,
                                       cp_grad_reduce op, size_t bucket_bytes)
{
    CPI_CHECK_PTR(comm);
    size_t per = 0;
    bucket_run r = { .comm = comm, .x = cpi_train_xfer(ctx), .dtype = dtype, .op = op };
    r.b = cpi_train_ops(ctx, &r.bs);
    r.wide = dtype == CP_DTYPE_F16 || dtype == CP_DTYPE_BF16 ? CP_DTYPE_F32 : dtype;
    cp_status local = check_args(grad, count, dtype, op, bucket_bytes, &per);
    if (local == CP_SUCCESS)
        local = alloc_buffers(&r, count < per ? count : per);

    /* Ranks cut the buffer alike only if these agree; compare them before
     * the first bucket, so a disagreement never leaves a rank waiting. A
     * rank with bad arguments still takes part. */
    const cpi_agree_field fields[] = { { "count", count, false },
                                       { "dtype", (uint64_t)dtype, false },
                                       { "op", (uint64_t)op, false },
                                       { "bucket_bytes / element size", per, false } };
    const cpi_agree_call call = {
        .func = __func__, .ctx = ctx, .comm = comm, .timeout_ms = CPI_TRAIN_TIMEOUT_MS, .fields = fields, .nfields = 4
    };
    cpi_agreement ag;
    cp_status s = cpi_agree_open(&ag, &call, local);
    const size_t es = cpi_dtype_size(dtype);
    for (size_t i = 0; s == CP_SUCCESS && i < count; i += per) {
        const size_t n = count - i < per ? count - i : per;
        s = reduce_bucket(&r, (char *)grad + i * es, n);
    }
    free_buffers(&r);
    return s;
}
