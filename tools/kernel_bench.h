/* SPDX-License-Identifier: MIT */
#ifndef INFINICP_TOOLS_KERNEL_BENCH_H
#define INFINICP_TOOLS_KERNEL_BENCH_H

#include <stdio.h>

/* infinicp-bench --kernel: argv holds the options after --kernel. */
int kernel_bench_main(int argc, char **argv, void (*usage)(FILE *));

#endif
