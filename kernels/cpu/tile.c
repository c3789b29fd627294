/* SPDX-License-Identifier: MIT */
/* Run-time choice of the tile primitives' instruction set. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tile.h"

#ifdef CPI_HAVE_X86_TILES
#include <cpuid.h>
#endif

typedef struct {
    const cpi_tile_ops *ops;
    bool (*usable)(void);
} isa_entry;

#ifdef CPI_HAVE_X86_TILES
/* clang before 15 knows no "f16c" for __builtin_cpu_supports: ask cpuid. */
static bool have_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
static bool have_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma") && have_f16c();
}
static bool have_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && have_f16c();
}
#endif
static bool always(void)
{
    return true;
}

/* Best first. */
static const isa_entry isas[] = {
#ifdef CPI_HAVE_X86_TILES
    {&cpi_tile_ops_avx512, have_avx512},
    {&cpi_tile_ops_avx2, have_avx2},
#endif
    {&cpi_tile_ops_generic, always},
};

cp_status cpi_tile_ops_select(const cpi_tile_ops **out)
{
    const char *want = getenv("INFINICP_CPU_ISA");
    size_t n = sizeof isas / sizeof isas[0];
    for (size_t i = 0; i < n; i++) {
        if (want && *want && strcmp(want, isas[i].ops->name))
            continue;
        if (!isas[i].usable()) {
            if (want && *want)
                return cpi_error(CP_ERROR_UNSUPPORTED,
                                 "INFINICP_CPU_ISA = \"%s\": this processor lacks that instruction set",
                                 want);
            continue;
        }
        *out = isas[i].ops;
        return CP_SUCCESS;
    }
    return cpi_error(CP_ERROR_INVALID_ARGUMENT,
                     "INFINICP_CPU_ISA = \"%s\" (must be avx512, avx2 or generic, or unset)",
                     want ? want : "");
}
