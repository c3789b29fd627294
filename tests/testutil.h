/* SPDX-License-Identifier: MIT */
/* Helpers shared by the test programs. EXPECT_ERROR needs <cmocka.h> included before this header; the rest does
 * not, so programs without CMocka (test-mpi-fault) can use them too. */
#ifndef INFINICP_TESTUTIL_H
#define INFINICP_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <infinicp/infinicp.h>

/* Assert that `call` fails with `status` and that cp_last_error() is set and
 * contains `needle` (the argument name or value the message must carry). */
#define EXPECT_ERROR(call, status, needle)                                               \
    do {                                                                                 \
        cp_status expect_s_ = (call);                                                    \
        if (expect_s_ != (status))                                                       \
            fail_msg("%s returned %d (%s), expected %d; last error: %s", #call,          \
                     (int)expect_s_, cp_status_string(expect_s_), (int)(status),         \
                     cp_last_error());                                                   \
        const char *expect_e_ = cp_last_error();                                         \
        if (!expect_e_ || !*expect_e_)                                                   \
            fail_msg("%s failed without a cp_last_error() message", #call);              \
        if (!strstr(expect_e_, (needle)))                                                \
            fail_msg("%s: message \"%s\" does not name \"%s\"", #call, expect_e_, (needle)); \
    } while (0)

/* Milliseconds on the monotonic clock, for timing waits and deadlines (the wall clock may jump). */
static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Sleep for ms milliseconds (a late or stalled rank in the transport tests). */
static inline void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* A valid F32 call of the single-device kernels on the given shape and buffers: dense BSHD (zero strides, so the
 * kernels derive them from the shape), causal mask from offset 0, the default softmax scale, head_dim_v = head_dim,
 * o and the gradients in F32, nothing accumulated, no workspace. Pass NULL for dout, dq, dk and dv where only the
 * forward runs. Suites change single fields of the result to build the cases they test, so everything not set here
 * stays as CP_KERNEL_ATTN_ARGS_INIT leaves it. */
static inline cp_kernel_attn_args f32_kernel_attn_args(int64_t batch, int32_t num_heads, int32_t num_kv_heads,
                                                       int32_t head_dim, int64_t seq_q, int64_t seq_k, const float *q,
                                                       const float *k, const float *v, float *o, float *lse,
                                                       const float *dout, float *dq, float *dk, float *dv)
{
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = CP_DTYPE_F32;
    a.format = CP_FORMAT_BSHD;
    a.batch = batch;
    a.num_heads = num_heads;
    a.num_kv_heads = num_kv_heads;
    a.head_dim = head_dim;
    a.seq_q = seq_q;
    a.seq_k = seq_k;
    a.mask = CP_MASK_CAUSAL;
    a.q = q, a.k = k, a.v = v, a.o = o, a.o_dtype = CP_DTYPE_F32, a.lse = lse;
    a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv, a.grad_dtype = CP_DTYPE_F32;
    return a;
}

/* Strides (elements) of a [B, S, heads, dim] tensor in format fmt (BSHD or
 * SBHD), each head row padded by pad elements, and its element count. */
typedef struct test_lay {
    int64_t sb, ss, sh;
    size_t elems;
} test_lay;

static inline test_lay test_lay_of(cp_format fmt, int64_t B, int pad, int64_t S, int heads, int dim)
{
    test_lay l;
    l.sh = dim + pad;
    if (fmt == CP_FORMAT_SBHD) {
        l.sb = heads * l.sh;
        l.ss = B * l.sb;
    } else {
        l.ss = heads * l.sh;
        l.sb = S * l.ss;
    }
    l.elems = (size_t)B * (size_t)S * (size_t)heads * (size_t)l.sh;
    return l;
}

/* Element offset of head row (b, s, h) in layout l. */
static inline size_t test_lay_at(const test_lay *l, int64_t b, int64_t s, int h)
{
    return (size_t)(b * l->sb + s * l->ss + h * l->sh);
}

#endif
