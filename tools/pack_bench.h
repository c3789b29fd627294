/* SPDX-License-Identifier: MIT */
#ifndef INFINICP_TOOLS_PACK_BENCH_H
#define INFINICP_TOOLS_PACK_BENCH_H

#include <stdint.h>
#include <stdio.h>

/* infinicp-bench --pack: argv holds the options after --pack. */
int pack_bench_main(int argc, char **argv, void (*usage)(FILE *));

/* The document mix called name (as --pack --mix takes) over T tokens:
 * *cu (malloc'd, *n + 1 offsets). Returns 0, -1 for an unknown name, -2 out
 * of memory. */
int pack_bench_docs(const char *name, int64_t T, int64_t **cu, int *n);

#endif
