/* SPDX-License-Identifier: MIT */
/*
 * The CPU backend's convert and reduce (internal) against independent
 * rounding written in the tests (storage.c), on every ISA the processor
 * has, with random bit patterns: normals, subnormals, infinities and NaNs.
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

#include "kernels/cpu/cpu.h"
#include "storage.h"

static const cp_dtype types[] = {CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16, CP_DTYPE_F64};
static const char *isas[] = {"avx512", "avx2", "generic"};
static const size_t counts[] = {1, 15, 17, 2049, 140001}; /* the last uses 2 threads */

/* A state for ISA isa with 2 threads, or NULL if the processor lacks it. */
static cpi_cpu_state *open_state(const char *isa)
{
    setenv("INFINICP_CPU_ISA", isa, 1);
    cpi_cpu_state *s = NULL;
    cp_status st = cpi_cpu_state_create(2, &s);
    unsetenv("INFINICP_CPU_ISA");
    if (st == CP_ERROR_UNSUPPORTED)
        return NULL;
    assert_int_equal(st, CP_SUCCESS);
    return s;
}

/* Random raw bits of type t; some whole-range patterns, mostly moderate values. */
static void *random_bits(ref_rng *r, cp_dtype t, size_t n)
{
    size_t es = ref_dtype_size(t);
    unsigned char *p = malloc(n * es);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        uint64_t u = ref_rng_next(r);
        if (i % 4 != 0) /* a value of moderate size: any type can hold it */
            ref_store(p, t, i, ref_round(ref_rng_uniform(r, -1000, 1000), t));
        else
            memcpy(p + i * es, &u, es);
    }
    return p;
}

static int same_value(double got, double want)
{
    return (isnan(got) && isnan(want)) || (got == want && signbit(got) == signbit(want));
}

/* What the backend documents: F16/BF16 results go through fp32. */
static double expected(double x, cp_dtype dst)
{
    return dst == CP_DTYPE_F64 ? x : ref_round(ref_round(x, CP_DTYPE_F32), dst);
}

static void test_convert(void **state)
{
    (void)state;
    ref_rng r = {2024};
    for (size_t ii = 0; ii < 3; ii++) {
        cpi_cpu_state *s = open_state(isas[ii]);
        if (!s)
            continue;
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 4; b++)
                for (size_t ci = 0; ci < 5; ci++) {
                    cp_dtype st = types[a], dt = types[b];
                    size_t n = counts[ci];
                    void *src = random_bits(&r, st, n), *dst = malloc(n * ref_dtype_size(dt));
                    assert_int_equal(cpi_cpu_convert(s, dst, dt, src, st, n), CP_SUCCESS);
                    for (size_t i = 0; i < n; i++) {
                        double x = ref_load(src, st, i), want = expected(x, dt), got = ref_load(dst, dt, i);
                        if (!same_value(got, want))
                            fail_msg("%s: convert %d -> %d of %.17g: got %.17g, expected %.17g", isas[ii],
                                     (int)st, (int)dt, x, got, want);
                    }
                    free(src), free(dst);
                }
        cpi_cpu_state_destroy(s);
    }
}

static void test_reduce(void **state)
{
    (void)state;
    ref_rng r = {77};
    for (size_t ii = 0; ii < 3; ii++) {
        cpi_cpu_state *s = open_state(isas[ii]);
        if (!s)
            continue;
        for (size_t a = 0; a < 4; a++)
            for (int op = 0; op < 2; op++)
                for (size_t ci = 0; ci < 5; ci++) {
                    cp_dtype t = types[a];
                    size_t n = counts[ci], es = ref_dtype_size(t);
                    void *acc = random_bits(&r, t, n), *x = random_bits(&r, t, n), *before = malloc(n * es);
                    memcpy(before, acc, n * es);
                    assert_int_equal(cpi_cpu_reduce(s, acc, x, t, n, (cp_reduce_op)op), CP_SUCCESS);
                    for (size_t i = 0; i < n; i++) {
                        double u = ref_load(before, t, i), v = ref_load(x, t, i), want;
                        if (op == CP_REDUCE_SUM)
                            /* formed in fp32: the double sum rounded once to fp32 is the
                             * correctly rounded fp32 sum (53 >= 2 * 24 + 2 bits) */
                            want = t == CP_DTYPE_F64 ? u + v : ref_round(ref_round(u + v, CP_DTYPE_F32), t);
                        else
                            want = isnan(u) || isnan(v) ? NAN : fmax(u, v);
                        double got = ref_load(acc, t, i);
                        if (!same_value(got, want) && !(op == 1 && u == v && got == u))
                            fail_msg("%s: reduce %s type %d of %.17g, %.17g: got %.17g, expected %.17g",
                                     isas[ii], op ? "max" : "sum", (int)t, u, v, got, want);
                    }
                    free(acc), free(x), free(before);
                }
        cpi_cpu_state_destroy(s);
    }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    cpi_cpu_state *s = NULL;
    assert_int_equal(cpi_cpu_state_create(1, &s), CP_SUCCESS);
    float a = 1, b = 2;
    assert_int_equal(cpi_cpu_convert(s, &a, (cp_dtype)7, &b, CP_DTYPE_F32, 1), CP_ERROR_INVALID_ARGUMENT);
    assert_int_equal(cpi_cpu_reduce(s, &a, &b, (cp_dtype)-1, 1, CP_REDUCE_SUM), CP_ERROR_INVALID_ARGUMENT);
    assert_int_equal(cpi_cpu_reduce(s, &a, &b, CP_DTYPE_F32, 1, (cp_reduce_op)5), CP_ERROR_INVALID_ARGUMENT);
    setenv("INFINICP_CPU_ISA", "sse9", 1);
    cpi_cpu_state *bad = NULL;
    assert_int_equal(cpi_cpu_state_create(1, &bad), CP_ERROR_INVALID_ARGUMENT);
    unsetenv("INFINICP_CPU_ISA");
    assert_null(bad);
    cpi_cpu_state_destroy(s);
    cpi_cpu_state_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
