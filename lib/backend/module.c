/* SPDX-License-Identifier: MIT */
/* Modules: finding and opening them - $INFINICP_MODULE_PATH (a
 * colon-separated list of folders) first, then the installed module folder -
 * and the host table the core hands each of them. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "comm/comm.h"

#ifndef CP_MODULE_DIR
#error "the build defines CP_MODULE_DIR"
#endif

static void *try_open(const char *dir, size_t dirlen, const char *file, char *why, size_t whycap)
{
    char path[4096];
    int n = snprintf(path, sizeof path, "%.*s/%s", (int)dirlen, dir, file);
    if (n < 0 || (size_t)n >= sizeof path)
        return NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        size_t used = strlen(why);
        snprintf(why + used, whycap - used, "%s%s", used ? "; " : "", e ? e : path);
    }
    return h;
}

cp_status cpi_module_symbol(const char *file, const char *symbol, void **fn)
{
    char why[2048] = "";
    void *h = NULL;
    const char *env = getenv("INFINICP_MODULE_PATH");
    for (const char *p = env; p && *p && !h;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        if (len)
            h = try_open(p, len, file, why, sizeof why);
        p = colon ? colon + 1 : NULL;
    }
    if (!h)
        h = try_open(CP_MODULE_DIR, strlen(CP_MODULE_DIR), file, why, sizeof why);
    if (!h)
        return cpi_error(CP_ERROR_NOT_FOUND, "module %s not found (INFINICP_MODULE_PATH=%s): %s", file,
                         env ? env : "(unset)", why);
    dlerror();
    void *f = dlsym(h, symbol);
    if (!f) {
        const char *e = dlerror();
        cp_status s = cpi_error(CP_ERROR_NOT_FOUND, "module %s has no symbol %s: %s", file, symbol,
                                e ? e : "(null)");
        dlclose(h);
        return s;
    }
    /* A found module stays loaded for the life of the process. */
    *fn = f;
    return CP_SUCCESS;
}

/* Messages of modules (which do not link the core) land in the caller's
 * cp_last_error(), like the core's own. */
static cp_status module_set_error(cp_status s, const char *message)
{
    return cpi_error(s, "%s", message ? message : "(no message)");
}

const cp_module_host cpi_module_host = {
    .abi_version = CP_MODULE_ABI_VERSION,
    .struct_size = sizeof(cp_module_host),
    .set_error = module_set_error,
    .comm_wrap = cpi_comm_wrap,
};
