/* SPDX-License-Identifier: MIT */
#include "core/internal.h"

#ifndef CP_BUILD_VERSION_NUMBER
#error "the build defines CP_BUILD_VERSION_NUMBER from meson's project version"
#endif

CP_EXPORT unsigned cp_version(void)
{
    return CP_BUILD_VERSION_NUMBER;
}
