/* SPDX-License-Identifier: MIT */
/*
 * Storage types modelled exactly, for the kernel suites: rounding a double
 * to F32 / F16 / BF16 in one step, their bit patterns written from the IEEE
 * formats (not by the compiler's conversions), and a small deterministic
 * generator for reproducible inputs. The attention itself is attn_model.h's.
 */
#ifndef INFINICP_TESTS_STORAGE_H
#define INFINICP_TESTS_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include <infinicp/infinicp.h>

/* Round x to the nearest value of type t (ties to even), as a double.
 * F32 / F16 / BF16 / F64 / FP8_E4M3; F16 and BF16 saturate to +-inf on
 * overflow; FP8 E4M3, which has no infinity, gives NaN above 464 (halfway
 * from its largest value 448 to the 480 its NaN code takes the place of). */
double ref_round(double x, cp_dtype t);

/* Store x (already representable in t, or NaN) into element i of buf; read
 * it back. */
void ref_store(void *buf, cp_dtype t, size_t i, double x);
double ref_load(const void *buf, cp_dtype t, size_t i);

/* Element (b, s, h, d) of a [B][S][H][D] tensor laid out in format f
 * (SBHD: s before b). */
size_t ref_at(cp_format f, int64_t B, int64_t S, int64_t H, int64_t D, int64_t b, int64_t s, int64_t h, int64_t d);
/* The BSHD values v (NULL: NaN everywhere) into buf as a tensor of type t
 * in format f; and such a tensor back into BSHD values. */
void ref_store_tensor(void *buf, cp_dtype t, cp_format f, int64_t B, int64_t S, int64_t H, int64_t D,
                      const double *v);
void ref_load_tensor(const void *buf, cp_dtype t, cp_format f, int64_t B, int64_t S, int64_t H, int64_t D,
                     double *v);

size_t ref_dtype_size(cp_dtype t);

/* The value of an FP8 E4M3 code, from the format's definition (1 sign, 4
 * exponent bits of bias 7, 3 mantissa bits, subnormals, S.1111.111 NaN, no
 * infinities), written apart from the library's decoder. */
double ref_fp8_e4m3_decode(uint8_t code);

/* A small deterministic generator (xorshift64*) for reproducible inputs. */
typedef struct {
    uint64_t s;
} ref_rng;
uint64_t ref_rng_next(ref_rng *r);
double ref_rng_uniform(ref_rng *r, double lo, double hi); /* [lo, hi) */
int64_t ref_rng_int(ref_rng *r, int64_t lo, int64_t hi);  /* [lo, hi] */

#endif
