/* SPDX-License-Identifier: MIT */
#ifndef INFINICP_TOOLS_PACK_BENCH_H
#define INFINICP_TOOLS_PACK_BENCH_H

#include <stdio.h>

/* infinicp-bench --pack: argv holds the options after --pack. */
int pack_bench_main(int argc, char **argv, void (*usage)(FILE *));

#endif
