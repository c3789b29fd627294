/* SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/group.h"
#include "commsuite.h"

/* ---- checks that count instead of aborting ------------------------------ */

typedef struct run {
    cp_comm *c;
    const suite_mem *m;
    cp_xfer x;
    int rank, size;
    int failures;
} run;

static void failf(run *r, const char *fmt, ...)
{
    if (r->failures++ < 20) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "[rank %d of %d, %s] ", r->rank, r->size, r->m->ops ? r->m->ops->name : "host");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
    }
}

#define CHECK_OK(r, call)                                                                      \
    do {                                                                                       \
        cp_status check_s_ = (call);                                                           \
        if (check_s_ != CP_SUCCESS)                                                            \
            failf((r), "%s:%d: %s -> %s: %s", __FILE__, __LINE__, #call,                        \
                  cp_status_string(check_s_), cp_last_error());                                \
    } while (0)

/* ---- reference formats -------------------------------------------------- */

typedef struct small_format {
    int mant, bias, expbits;
} small_format;

static small_format format_of(cp_dtype t)
{
    return t == CP_DTYPE_F16 ? (small_format){ 10, 15, 5 } : (small_format){ 7, 127, 8 };
}

/* v rounded to p significant bits, ties to even (default rounding mode). */
static double round_sig(double v, int p)
{
    if (v == 0 || !isfinite(v))
        return v;
    int e;
    frexp(v, &e);
    return ldexp(nearbyint(ldexp(v, p - e)), e - p);
}

double suite_round(cp_dtype t, double v)
{
    switch (t) {
    case CP_DTYPE_F16: return round_sig(v, 11);
    case CP_DTYPE_BF16: return round_sig(v, 8);
    case CP_DTYPE_F32: return round_sig(v, 24);
    case CP_DTYPE_F64: return v;
    case CP_DTYPE_FP8_E4M3: break; /* no type of reductions */
    }
    return NAN;
}

/* Encode a value that is representable and normal (or zero). */
void suite_encode(cp_dtype t, void *buf, size_t i, double v)
{
    if (t == CP_DTYPE_F32) {
        ((float *)buf)[i] = (float)v;
    } else if (t == CP_DTYPE_F64) {
        ((double *)buf)[i] = v;
    } else {
        small_format f = format_of(t);
        uint16_t h = 0;
        if (v != 0) {
            int e;
            double m = frexp(fabs(v), &e); /* |v| = (2m) * 2^(e-1), 2m in [1, 2) */
            h = (uint16_t)(((unsigned)(e - 1 + f.bias) << f.mant) | (unsigned)ldexp(2 * m - 1, f.mant));
            if (v < 0)
                h |= 0x8000u;
        }
        ((uint16_t *)buf)[i] = h;
    }
}

double suite_decode(cp_dtype t, const void *buf, size_t i)
{
    if (t == CP_DTYPE_F32)
        return ((const float *)buf)[i];
    if (t == CP_DTYPE_F64)
        return ((const double *)buf)[i];
    small_format f = format_of(t);
    uint16_t h = ((const uint16_t *)buf)[i];
    int e = (h >> f.mant) & ((1 << f.expbits) - 1);
    double frac = h & ((1u << f.mant) - 1);
    double v;
    if (e == 0)
        v = ldexp(frac, 1 - f.bias - f.mant);
    else if (e == (1 << f.expbits) - 1)
        v = frac != 0 ? NAN : INFINITY;
    else
        v = ldexp(1 + ldexp(frac, -f.mant), e - f.bias);
    return h & 0x8000u ? -v : v;
}

/* ---- contributions ------------------------------------------------------ */

static uint32_t mix(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ c * 0xC2B2AE3Du;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    return h;
}

static unsigned char byte_of(int rank, int peer, size_t i, uint32_t salt)
{
    return (unsigned char)mix((uint32_t)rank * 131u + (uint32_t)peer, (uint32_t)i, salt);
}

/*
 * Element i of rank's reduction input. Exactly representable, and small
 * enough that F32 sums of up to 8 ranks are exact, so only the final
 * rounding matters. Element 0 of F16/BF16 is one large value on rank 0 and
 * small ones elsewhere: summed in F16/BF16 step by step, each small value
 * would round away; accumulated in F32 and rounded once, they count.
 */
static double value_of(cp_dtype t, int rank, size_t i, uint32_t salt)
{
    bool half = t == CP_DTYPE_F16 || t == CP_DTYPE_BF16;
    if (half && i == 0)
        return rank == 0 ? (t == CP_DTYPE_F16 ? 1024.0 : 256.0) : (t == CP_DTYPE_F16 ? 0.5 : 1.0);
    uint32_t h = mix((uint32_t)rank, (uint32_t)i, salt);
    if (half)
        return ((int)(h % 257u) - 128) / 16.0;
    return ((int)(h % 2097153u) - 1048576) / 1024.0;
}

/* ---- buffers where the suite's memory lives ----------------------------- */

static void *dev_alloc(run *r, size_t bytes)
{
    if (!r->m->ops)
        return calloc(1, bytes ? bytes : 1);
    void *p = NULL;
    if (r->m->ops->alloc(r->m->state, bytes ? bytes : 1, &p) != CP_SUCCESS)
        return NULL;
    return p;
}

static void dev_free(run *r, void *p)
{
    if (!r->m->ops)
        free(p);
    else if (p)
        r->m->ops->free(r->m->state, p);
}

static void put(run *r, void *dev, const void *host, size_t bytes)
{
    if (!r->m->ops)
        memcpy(dev, host, bytes);
    else
        CHECK_OK(r, r->m->ops->copy_2d(r->m->state, dev, bytes, host, bytes, bytes, 1, CP_COPY_HOST_TO_DEVICE));
}

static void get(run *r, void *host, const void *dev, size_t bytes)
{
    if (!r->m->ops)
        memcpy(host, dev, bytes);
    else
        CHECK_OK(r, r->m->ops->copy_2d(r->m->state, host, bytes, dev, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST));
}

/* A host buffer and its device twin. */
typedef struct twin {
    unsigned char *host;
    void *dev;
    size_t bytes;
} twin;

static twin twin_make(run *r, size_t bytes)
{
    twin t = { calloc(1, bytes ? bytes : 1), dev_alloc(r, bytes), bytes };
    if (!t.host || !t.dev) {
        fprintf(stderr, "out of memory in the test\n");
        abort();
    }
    return t;
}

static void twin_free(run *r, twin *t)
{
    free(t->host);
    dev_free(r, t->dev);
}

/* Fill the device buffer with a sentinel so stale results cannot pass. */
static void poison(run *r, twin *t)
{
    memset(t->host, 0x5C, t->bytes);
    put(r, t->dev, t->host, t->bytes);
}

/* ---- byte-moving collectives -------------------------------------------- */

static void check_all_gather(run *r, size_t bytes, bool in_place, uint32_t salt)
{
    size_t total = bytes * (size_t)r->size;
    twin send = twin_make(r, bytes), recv = twin_make(r, total);
    for (size_t i = 0; i < bytes; i++)
        send.host[i] = byte_of(r->rank, 0, i, salt);
    poison(r, &recv);
    void *src = send.dev;
    if (in_place) {
        src = (char *)recv.dev + (size_t)r->rank * bytes;
        put(r, src, send.host, bytes);
    } else {
        put(r, send.dev, send.host, bytes);
    }
    CHECK_OK(r, cpi_all_gather(r->c, &r->x, src, recv.dev, bytes));
    get(r, recv.host, recv.dev, total);
    for (int j = 0; j < r->size; j++)
        for (size_t i = 0; i < bytes; i++)
            if (recv.host[(size_t)j * bytes + i] != byte_of(j, 0, i, salt)) {
                failf(r, "all_gather(%zu bytes%s): byte %zu of rank %d's block is wrong", bytes,
                      in_place ? ", in place" : "", i, j);
                j = r->size;
                break;
            }
    twin_free(r, &send);
    twin_free(r, &recv);
}

static void check_all_to_all(run *r, size_t bytes, uint32_t salt)
{
    size_t total = bytes * (size_t)r->size;
    twin send = twin_make(r, total), recv = twin_make(r, total);
    for (int j = 0; j < r->size; j++)
        for (size_t i = 0; i < bytes; i++)
            send.host[(size_t)j * bytes + i] = byte_of(r->rank, j, i, salt);
    put(r, send.dev, send.host, total);
    poison(r, &recv);
    CHECK_OK(r, cpi_all_to_all(r->c, &r->x, send.dev, recv.dev, bytes));
    get(r, recv.host, recv.dev, total);
    for (int j = 0; j < r->size; j++)
        for (size_t i = 0; i < bytes; i++)
            if (recv.host[(size_t)j * bytes + i] != byte_of(j, r->rank, i, salt)) {
                failf(r, "all_to_all(%zu bytes): byte %zu of the block from rank %d is wrong", bytes, i, j);
                j = r->size;
                break;
            }
    twin_free(r, &send);
    twin_free(r, &recv);
}

/* Ring shift by `shift`: send to rank + shift, receive from rank - shift.
 * Sizes differ per rank (each rank's send is 3 * rank + base bytes). */
static void check_sendrecv(run *r, int shift, size_t base, uint32_t salt)
{
    int n = r->size, dst = (r->rank + shift) % n, src = ((r->rank - shift) % n + n) % n;
    size_t send_bytes = base + 3 * (size_t)r->rank, recv_bytes = base + 3 * (size_t)src;
    twin send = twin_make(r, send_bytes), recv = twin_make(r, recv_bytes);
    for (size_t i = 0; i < send_bytes; i++)
        send.host[i] = byte_of(r->rank, dst, i, salt);
    put(r, send.dev, send.host, send_bytes);
    poison(r, &recv);
    CHECK_OK(r, cpi_sendrecv(r->c, &r->x, send.dev, send_bytes, dst, recv.dev, recv_bytes, src));
    get(r, recv.host, recv.dev, recv_bytes);
    for (size_t i = 0; i < recv_bytes; i++)
        if (recv.host[i] != byte_of(src, r->rank, i, salt)) {
            failf(r, "sendrecv(shift %d): byte %zu from rank %d is wrong", shift, i, src);
            break;
        }
    twin_free(r, &send);
    twin_free(r, &recv);
}

/* ---- reductions --------------------------------------------------------- */

static double reference(cp_dtype t, cp_reduce_op op, int size, size_t i, uint32_t salt)
{
    double acc = value_of(t, 0, i, salt);
    for (int j = 1; j < size; j++) {
        double v = value_of(t, j, i, salt);
        acc = op == CP_REDUCE_SUM ? acc + v : fmax(acc, v);
    }
    return suite_round(t, acc);
}

static const char *dtype_str(cp_dtype t)
{
    static const char *const names[] = { "F32", "F16", "BF16", "F64" };
    return names[t];
}

static void check_all_reduce(run *r, cp_dtype t, cp_reduce_op op, size_t count, bool in_place, uint32_t salt)
{
    size_t es = cpi_dtype_size(t), bytes = count * es;
    twin send = twin_make(r, bytes), recv = twin_make(r, bytes);
    for (size_t i = 0; i < count; i++)
        suite_encode(t, send.host, i, value_of(t, r->rank, i, salt));
    put(r, send.dev, send.host, bytes);
    void *out = in_place ? send.dev : recv.dev;
    if (!in_place)
        poison(r, &recv);
    CHECK_OK(r, cpi_all_reduce(r->c, &r->x, send.dev, out, count, t, op));
    get(r, recv.host, out, bytes);
    for (size_t i = 0; i < count; i++) {
        double want = reference(t, op, r->size, i, salt), got = suite_decode(t, recv.host, i);
        if (got != want) {
            failf(r, "all_reduce(%s, %s, count %zu%s): element %zu = %.17g, want %.17g", dtype_str(t),
                  op == CP_REDUCE_SUM ? "sum" : "max", count, in_place ? ", in place" : "", i, got, want);
            break;
        }
    }
    twin_free(r, &send);
    twin_free(r, &recv);
}

static void check_reduce_scatter(run *r, cp_dtype t, cp_reduce_op op, size_t count, uint32_t salt)
{
    size_t es = cpi_dtype_size(t), total = count * (size_t)r->size;
    twin send = twin_make(r, total * es), recv = twin_make(r, count * es);
    for (size_t i = 0; i < total; i++)
        suite_encode(t, send.host, i, value_of(t, r->rank, i, salt));
    put(r, send.dev, send.host, total * es);
    poison(r, &recv);
    CHECK_OK(r, cpi_reduce_scatter(r->c, &r->x, send.dev, recv.dev, count, t, op));
    get(r, recv.host, recv.dev, count * es);
    size_t first = (size_t)r->rank * count;
    for (size_t i = 0; i < count; i++) {
        double want = reference(t, op, r->size, first + i, salt), got = suite_decode(t, recv.host, i);
        if (got != want) {
            failf(r, "reduce_scatter(%s, %s, count %zu): element %zu = %.17g, want %.17g", dtype_str(t),
                  op == CP_REDUCE_SUM ? "sum" : "max", count, i, got, want);
            break;
        }
    }
    twin_free(r, &send);
    twin_free(r, &recv);
}

/* reduce_scatter staged in the caller's scratch (cpi_reduce_scatter_ws):
 * how 0: scratch of the size cpi_reduce_scratch_bytes asks for (the
 * in-process transport then allocates nothing; F32 sums straight into
 * recv, F16 / BF16 widen in the scratch); 1: one byte short (it stages on
 * its own); 2: in place, recv this rank's block of send (the sums cannot
 * go into recv). Transports without the capability ignore the scratch. */
static void check_reduce_scatter_ws(run *r, cp_dtype t, size_t count, int how, uint32_t salt)
{
    const bool in_place = how == 2;
    size_t es = cpi_dtype_size(t), total = count * (size_t)r->size, first = (size_t)r->rank * count;
    const size_t need = cpi_reduce_scratch_bytes(count, t, !in_place), have = how == 1 ? need - 1 : need;
    twin send = twin_make(r, total * es), recv = twin_make(r, count * es), scratch = twin_make(r, need);
    for (size_t i = 0; i < total; i++)
        suite_encode(t, send.host, i, value_of(t, r->rank, i, salt));
    put(r, send.dev, send.host, total * es);
    poison(r, &recv);
    poison(r, &scratch);
    void *out = in_place ? (char *)send.dev + first * es : recv.dev;
    CHECK_OK(r, cpi_reduce_scatter_ws(r->c, &r->x, send.dev, out, count, t, CP_REDUCE_SUM, scratch.dev, have));
    get(r, recv.host, out, count * es);
    for (size_t i = 0; i < count; i++) {
        double want = reference(t, CP_REDUCE_SUM, r->size, first + i, salt), got = suite_decode(t, recv.host, i);
        if (got != want) {
            failf(r, "reduce_scatter_ws(%s, count %zu, %s): element %zu = %.17g, want %.17g", dtype_str(t), count,
                  how == 0 ? "scratch" : how == 1 ? "scratch 1 byte short" : "in place", i, got, want);
            break;
        }
    }
    twin_free(r, &send);
    twin_free(r, &recv);
    twin_free(r, &scratch);
}

/* ---- the suite ---------------------------------------------------------- */

/* False (and one failure counted) when c gives no rank and size, e.g. a
 * NULL communicator after a failed setup: the checks size their buffers by
 * the group size and must not run then. */
static bool run_init(run *r, cp_comm *c, const suite_mem *m, int timeout_ms)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    r->m = m;
    r->x = (cp_xfer){ m->ops, m->state, timeout_ms };
    if (cp_comm_rank(c, &r->rank) != CP_SUCCESS || cp_comm_size(c, &r->size) != CP_SUCCESS || r->size < 1) {
        fprintf(stderr, "commsuite: no usable communicator: %s\n", cp_last_error());
        r->failures = 1;
        return false;
    }
    return true;
}

/* Every collective; `big` adds reductions that the local transport stages
 * in several chunks (a quarter of the block each, the last one short) on
 * both the widened and the plain path. */
static void collectives(run *r, uint32_t salt, bool big)
{
    static const size_t byte_sizes[] = { 0, 1, 37, 4099 };
    for (size_t k = 0; k < sizeof byte_sizes / sizeof *byte_sizes; k++) {
        size_t b = byte_sizes[k];
        check_all_gather(r, b, false, salt + (uint32_t)k);
        check_all_gather(r, b, true, salt + 10 + (uint32_t)k);
        check_all_to_all(r, b, salt + 20 + (uint32_t)k);
    }
    for (int shift = 0; shift <= r->size && shift < 4; shift++)
        check_sendrecv(r, shift, shift == 2 ? 0 : 29, salt + 30 + (uint32_t)shift);

    static const size_t counts[] = { 1, 333 };
    for (int t = CP_DTYPE_F32; t <= CP_DTYPE_F64; t++)
        for (int op = CP_REDUCE_SUM; op <= CP_REDUCE_MAX; op++)
            for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
                uint32_t s = salt + 100 + (uint32_t)(t * 16 + op * 4) + (uint32_t)k;
                check_all_reduce(r, (cp_dtype)t, (cp_reduce_op)op, counts[k], k == 1, s);
                check_reduce_scatter(r, (cp_dtype)t, (cp_reduce_op)op, counts[k] + 2, s + 1000);
            }
    check_all_reduce(r, CP_DTYPE_BF16, CP_REDUCE_SUM, 0, false, salt);
    for (int t = CP_DTYPE_F32; t <= CP_DTYPE_BF16; t++)
        for (int how = 0; how < 3; how++)
            check_reduce_scatter_ws(r, (cp_dtype)t, big ? 20001 : 333, how, salt + 300 + (uint32_t)(t * 4 + how));
    if (big) {
        check_all_reduce(r, CP_DTYPE_F16, CP_REDUCE_SUM, 70001, false, salt + 200);
        check_all_reduce(r, CP_DTYPE_F32, CP_REDUCE_MAX, 70001, true, salt + 201);
        check_reduce_scatter(r, CP_DTYPE_BF16, CP_REDUCE_SUM, 65537, salt + 202);
    }
    CHECK_OK(r, cpi_barrier(r->c, &r->x));
}

/* The split under test: color rank % k, the last rank left out when k = 3,
 * keys with ties (broken by old rank). */
static int split_color(int rank, int k, int n)
{
    return k == 3 && rank == n - 1 && n > 1 ? -1 : rank % k;
}

static int split_key(int rank)
{
    return (rank * 5 + 3) % 4;
}

/* The new rank of old rank i: members of its color before it in (key, rank). */
static int split_rank(int i, int k, int n)
{
    int rank = 0;
    for (int j = 0; j < n; j++)
        if (split_color(j, k, n) == split_color(i, k, n) &&
            (split_key(j) < split_key(i) || (split_key(j) == split_key(i) && j < i)))
            rank++;
    return rank;
}

/* Split by color = rank % k and key = a permutation; the new rank and size
 * must match a serial computation, and the collectives must work inside. */
static void split_and_check(run *r, int k, uint32_t salt)
{
    int n = r->size;
    bool left_out = split_color(r->rank, k, n) < 0;
    int color = split_color(r->rank, k, n), key = split_key(r->rank);
    cp_comm *sub = NULL;
    CHECK_OK(r, cp_comm_split(r->c, color, key, &sub));
    if (left_out) {
        if (sub)
            failf(r, "split(k=%d): a rank with color -1 got a communicator", k);
        cp_comm_destroy(sub);
        return;
    }
    int want_rank = split_rank(r->rank, k, n), want_size = 0;
    for (int j = 0; j < n; j++)
        want_size += split_color(j, k, n) == color;
    int got_rank = -1, got_size = -1;
    CHECK_OK(r, cp_comm_rank(sub, &got_rank));
    CHECK_OK(r, cp_comm_size(sub, &got_size));
    if (got_rank != want_rank || got_size != want_size) {
        failf(r, "split(k=%d): rank %d size %d, want rank %d size %d", k, got_rank, got_size, want_rank,
              want_size);
    } else if (sub) {
        run sr;
        run_init(&sr, sub, r->m, r->x.timeout_ms);
        collectives(&sr, salt, false);
        /* the members' old ranks, in new-rank order */
        int *members = calloc((size_t)want_size, sizeof *members);
        cp_xfer host = { NULL, NULL, r->x.timeout_ms };
        CHECK_OK(r, cpi_all_gather(sub, &host, &r->rank, members, sizeof(int)));
        for (int i = 0; i < want_size; i++)
            if (split_rank(members[i], k, n) != i)
                failf(r, "split(k=%d): new rank %d is old rank %d", k, i, members[i]);
        free(members);
        r->failures += sr.failures;
    }
    cp_comm_destroy(sub);
}

int suite_collectives(cp_comm *c, const suite_mem *m, int timeout_ms)
{
    run r;
    if (!run_init(&r, c, m, timeout_ms))
        return r.failures;
    collectives(&r, 1, true);
    split_and_check(&r, 2, 5000);
    split_and_check(&r, 3, 9000);
    return r.failures;
}

/* ---- disagreement ------------------------------------------------------- */

/* One collective where rank 0 (or rank `odd`) calls differently. */
typedef enum { BYTES, DTYPE, OP, KIND, PAIRS, COUNT } disagreement;

static void expect_mismatch(run *r, disagreement d)
{
    int odd = r->size - 1, me = r->rank;
    size_t bytes = 64, total = bytes * (size_t)r->size;
    twin send = twin_make(r, total), recv = twin_make(r, total);
    memset(send.host, 0x11, total);
    put(r, send.dev, send.host, total);
    poison(r, &recv);
    cp_status s = CP_SUCCESS;
    switch (d) {
    case BYTES:
        s = cpi_all_gather(r->c, &r->x, send.dev, recv.dev, me == odd ? bytes / 2 : bytes);
        break;
    case DTYPE:
        s = cpi_all_reduce(r->c, &r->x, send.dev, recv.dev, 8, me == odd ? CP_DTYPE_F16 : CP_DTYPE_F32,
                           CP_REDUCE_SUM);
        break;
    case OP:
        s = cpi_reduce_scatter(r->c, &r->x, send.dev, recv.dev, 4, CP_DTYPE_F32,
                               me == odd ? CP_REDUCE_MAX : CP_REDUCE_SUM);
        break;
    case COUNT:
        s = cpi_all_reduce(r->c, &r->x, send.dev, recv.dev, me == odd ? 7 : 8, CP_DTYPE_F64, CP_REDUCE_SUM);
        break;
    case KIND:
        s = me == odd ? cpi_barrier(r->c, &r->x) : cpi_all_to_all(r->c, &r->x, send.dev, recv.dev, bytes / 8);
        break;
    case PAIRS: {
        /* a ring shift by one, except that the last rank sends to itself */
        int n = r->size, dst = me == odd ? me : (me + 1) % n, src = (me - 1 + n) % n;
        s = cpi_sendrecv(r->c, &r->x, send.dev, bytes, dst, recv.dev, bytes, src);
        break;
    }
    }
    if (s != CP_ERROR_MISMATCH)
        failf(r, "disagreement %d: got %s (%s), want CP_ERROR_MISMATCH", (int)d, cp_status_string(s),
              cp_last_error());
    else if (!strstr(cp_last_error(), "rank"))
        failf(r, "disagreement %d: the message \"%s\" names no rank", (int)d, cp_last_error());
    unsigned char *seen = malloc(total);
    get(r, seen, recv.dev, total);
    for (size_t i = 0; i < total; i++)
        if (seen[i] != 0x5C) {
            failf(r, "disagreement %d: recv byte %zu was written", (int)d, i);
            break;
        }
    free(seen);
    twin_free(r, &send);
    twin_free(r, &recv);
}

int suite_mismatch(cp_comm *c, const suite_mem *m, int timeout_ms)
{
    run r;
    if (!run_init(&r, c, m, timeout_ms))
        return r.failures;
    for (int d = BYTES; d <= COUNT; d++)
        expect_mismatch(&r, (disagreement)d);
    /* Disagreement is detected before any byte moves: the world still works. */
    check_all_gather(&r, 16, false, 77);
    check_all_reduce(&r, CP_DTYPE_F16, CP_REDUCE_SUM, 9, false, 78);
    return r.failures;
}

/* ---- groups --------------------------------------------------------------- */

/* The old ranks of sub's members in sub's rank order must be want[]. */
static void check_members(run *r, cp_comm *sub, const char *what, const int *want, int n)
{
    int *got = calloc((size_t)n, sizeof *got);
    cp_xfer host = { NULL, NULL, r->x.timeout_ms };
    CHECK_OK(r, cpi_all_gather(sub, &host, &r->rank, got, sizeof(int)));
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) {
            failf(r, "%s: member %d is rank %d, want %d", what, i, got[i], want[i]);
            break;
        }
    free(got);
}

int suite_group(cp_comm *c, int a2a_size, int timeout_ms)
{
    static const suite_mem host = { NULL, NULL };
    run r;
    if (!run_init(&r, c, &host, timeout_ms))
        return r.failures;
    int A = a2a_size, n = r.size, me = r.rank;
    cp_context *ctx = NULL;
    cp_group *g = NULL;
    cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    cfg.a2a_size = A;
    cfg.timeout_ms = timeout_ms;
    CHECK_OK(&r, cp_context_create(NULL, &ctx));
    CHECK_OK(&r, cp_group_create(ctx, c, &cfg, &g));
    if (g) {
        int gr = -1, gs = -1, ar = -1, as = -1, pr = -1, ps = -1;
        CHECK_OK(&r, cp_group_rank(g, &gr));
        CHECK_OK(&r, cp_group_size(g, &gs));
        CHECK_OK(&r, cp_comm_rank(g->a2a, &ar));
        CHECK_OK(&r, cp_comm_size(g->a2a, &as));
        CHECK_OK(&r, cp_comm_rank(g->p2p, &pr));
        CHECK_OK(&r, cp_comm_size(g->p2p, &ps));
        /* a2a: consecutive blocks of A ranks; p2p: every A-th rank */
        if (gr != me || gs != n || ar != me % A || as != A || pr != me / A || ps != n / A)
            failf(&r, "group(a2a %d): rank %d size %d, a2a %d/%d, p2p %d/%d", A, gr, gs, ar, as, pr, ps);
        int *want = calloc((size_t)n, sizeof *want);
        for (int i = 0; i < A; i++)
            want[i] = (me / A) * A + i;
        check_members(&r, g->a2a, "a2a sub-group", want, A);
        for (int i = 0; i < n / A; i++)
            want[i] = me % A + i * A;
        check_members(&r, g->p2p, "p2p sub-group", want, n / A);
        free(want);
    }
    cp_group_destroy(g);
    cp_context_destroy(ctx);
    return r.failures;
}

/* ---- layout gather -------------------------------------------------------- */

#define TOKEN_BYTES 5

static unsigned char token_byte(int64_t b, int64_t pos, size_t k)
{
    return (unsigned char)(b * 131 + pos * 7 + (int64_t)k * 31 + 1);
}

/* Global position of local token t of rank r: the layouts of docs/ARCHITECTURE.md,
 * written out independently of the library's span code. */
static int64_t global_pos(cp_layout l, int P, int r, int64_t S, int64_t t)
{
    if (l == CP_LAYOUT_CONTIGUOUS)
        return r * (S / P) + t;
    int64_t c = S / (2 * P);
    return t < c ? r * c + t : (2 * P - 1 - r) * c + (t - c);
}

int suite_layout_gather(cp_comm *c, const suite_mem *m, cp_layout l, int64_t batch, int64_t seq_len,
                        int timeout_ms)
{
    run r;
    if (!run_init(&r, c, m, timeout_ms))
        return r.failures;
    /* a context on m's device, built by hand for a pretend device */
    cp_context dev = { .device = CP_DEVICE_CUDA, .num_threads = 1, .ops = m->ops, .state = m->state };
    cp_context *ctx = m->ops ? &dev : NULL;
    cp_group *g = NULL;
    cp_group_config cfg = CP_GROUP_CONFIG_INIT;
    cfg.timeout_ms = timeout_ms;
    if (!m->ops)
        CHECK_OK(&r, cp_context_create(NULL, &ctx));
    CHECK_OK(&r, cp_group_create(ctx, c, &cfg, &g));
    if (g) {
        int64_t B = batch, S = seq_len, L = S / r.size;
        size_t tb = TOKEN_BYTES, local_bytes = (size_t)(B * L) * tb, global_bytes = (size_t)(B * S) * tb;
        twin local = twin_make(&r, local_bytes), global = twin_make(&r, global_bytes);
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < L; t++)
                for (size_t k = 0; k < tb; k++)
                    local.host[(size_t)(b * L + t) * tb + k] = token_byte(b, global_pos(l, r.size, r.rank, S, t), k);
        put(&r, local.dev, local.host, local_bytes);
        poison(&r, &global);
        CHECK_OK(&r, cp_layout_gather(g, l, local.dev, global.dev, B, S, tb));
        get(&r, global.host, global.dev, global_bytes);
        for (int64_t b = 0; b < B; b++)
            for (int64_t pos = 0; pos < S; pos++)
                for (size_t k = 0; k < tb; k++)
                    if (global.host[(size_t)(b * S + pos) * tb + k] != token_byte(b, pos, k)) {
                        failf(&r, "layout_gather(layout %d, batch %lld, seq %lld): token %lld of row %lld is wrong",
                              (int)l, (long long)B, (long long)S, (long long)pos, (long long)b);
                        b = B;
                        pos = S;
                        break;
                    }
        twin_free(&r, &local);
        twin_free(&r, &global);
    }
    cp_group_destroy(g);
    if (!m->ops)
        cp_context_destroy(ctx);
    return r.failures;
}
