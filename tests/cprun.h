/* SPDX-License-Identifier: MIT */
/* One CP rank's part of a test run: the library side of the CP tests. */
#ifndef INFINICP_TESTS_CPRUN_H
#define INFINICP_TESTS_CPRUN_H

#include "cpref.h"

/* The descriptor of a cpref shape. */
cp_attn_desc cprun_desc(const cpref_shape *sh, cp_dtype dtype, cp_format format, cp_layout layout, cp_mode mode);

/*
 * Shard d's inputs for rank `rank` of P, move them to the device of ctx (the
 * plan's context), run forward and backward on plan p
 * (with the plan's own workspace when own_workspace, else a caller-side
 * buffer of exactly the reported size), and, when `into` is not NULL,
 * write this rank's results into the global tensors there. On failure,
 * *what names the failing call (cp_last_error() has the detail).
 */
cp_status cprun_rank(cp_context *ctx, cp_attn_plan *p, const cpref_data *d, const cp_attn_desc *desc, int P,
                     int rank, int own_workspace, cpref_result *into, const char **what);

#endif
