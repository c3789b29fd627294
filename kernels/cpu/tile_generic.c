/* SPDX-License-Identifier: MIT */
/* The portable tile primitives: 4-float GCC vectors (SSE2 on x86-64, NEON on
 * arm64, scalar code elsewhere), a 4 x 2-vector micro-kernel. Also what runs
 * under INFINICP_CPU_ISA=generic. */
#define CPI_TILE_TABLE cpi_tile_ops_generic
#define CPI_TILE_NAME "generic"
#define MK_ROWS 4
#define MK_VECS 2
#include "kernels/cpu/tile_impl.h"
