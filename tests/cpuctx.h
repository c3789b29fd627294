/* SPDX-License-Identifier: MIT */
/* The CPU contexts the kernel tests run their cases on: every ISA this
 * machine has (INFINICP_CPU_ISA), several thread counts. */
#ifndef INFINICP_TESTS_CPUCTX_H
#define INFINICP_TESTS_CPUCTX_H

#include <infinicp/infinicp.h>

#define CPUCTX_MAX 8

typedef struct cpuctx {
    cp_context *ctx;
    char name[32]; /* "avx2/2t", "default/1t", ... */
} cpuctx;

typedef struct cpuctx_set {
    cpuctx c[CPUCTX_MAX];
    int n;
} cpuctx_set;

/* Add a CPU context with that ISA (NULL: the library's choice) and thread
 * count to s, named "isa/Nt"; nothing when this processor lacks the ISA.
 * Any other failure fails the test. */
void cpuctx_add(cpuctx_set *s, const char *isa, int threads);

/* Destroy every context of s; s is empty again. */
void cpuctx_close_all(cpuctx_set *s);

#endif
