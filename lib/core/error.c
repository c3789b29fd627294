/* SPDX-License-Identifier: MIT */
/* Status strings and the thread-local error text behind cp_last_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "core/status.h"

static _Thread_local char last_error[512];

cp_status cpi_error(cp_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

CP_EXPORT const char *cp_last_error(void)
{
    return last_error;
}

CP_EXPORT const char *cp_status_string(cp_status s)
{
    return cpi_status_text(s);
}
