/* SPDX-License-Identifier: MIT */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cpuctx.h"

void cpuctx_add(cpuctx_set *s, const char *isa, int threads)
{
    assert_true(s->n < CPUCTX_MAX);
    if (isa)
        setenv("INFINICP_CPU_ISA", isa, 1);
    else
        unsetenv("INFINICP_CPU_ISA");
    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.num_threads = threads;
    cp_context *ctx = NULL;
    cp_status st = cp_context_create(&cfg, &ctx);
    unsetenv("INFINICP_CPU_ISA");
    if (st == CP_ERROR_UNSUPPORTED && isa)
        return; /* this processor lacks the ISA */
    if (st != CP_SUCCESS)
        fail_msg("cp_context_create (ISA %s, %d threads): %s", isa ? isa : "default", threads, cp_last_error());
    s->c[s->n].ctx = ctx;
    snprintf(s->c[s->n].name, sizeof s->c[s->n].name, "%s/%dt", isa ? isa : "default", threads);
    s->n++;
}

void cpuctx_close_all(cpuctx_set *s)
{
    for (int i = 0; i < s->n; i++)
        cp_context_destroy(s->c[i].ctx);
    s->n = 0;
}
