/* SPDX-License-Identifier: MIT */
/* Shared pieces of infinicp-bench. */
#ifndef INFINICP_BENCH_H
#define INFINICP_BENCH_H

#include <stdint.h>

#include <infinicp/infinicp.h>

typedef struct bench_opts {
    int64_t batch, seq;
    int heads, kv_heads, dim;
    cp_dtype dtype;
    cp_mask mask;
    int cp;
} bench_opts;

/* Demo: every CP mode and layout on in-process ranks, checked against one rank. */
int bench_demo(const bench_opts *o);

/* 16-bit storage conversions (round to nearest even). */
float bench_f16_to_f32(uint16_t h);
uint16_t bench_f32_to_half(float f, cp_dtype t);

#endif
