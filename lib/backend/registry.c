/* SPDX-License-Identifier: MIT */
/* Which backend drives which device: the CPU one is built in, the others are
 * modules loaded on first use. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"

static const char *module_file(cp_device d)
{
    return d == CP_DEVICE_CUDA ? "backend-cuda.so" : NULL;
}

/* The slots every backend must fill (backend.h: all slots up to merge). The
 * core calls them without looking, so a NULL one would crash a later call;
 * the optional slots after merge are looked at before each use. */
#define REQUIRED_SLOTS(X)                                                                  \
    X(open) X(close) X(set_stream) X(synchronize) X(alloc) X(free) X(copy_2d) X(memset)    \
    X(convert) X(reduce) X(attn_workspace_size) X(attn_forward) X(attn_backward) X(merge)

/* Names of the required slots that ops leaves NULL, comma-separated, into
 * buf; returns whether there was one. */
static bool missing_slots(const cp_backend_ops *ops, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    REQUIRED_SLOTS(CPI_LIST_NULL_SLOT)
    return used > 0;
}

/* Accept the table a module returned, or say what is wrong with it. The
 * message names the file dlopen found, so that a user with several module
 * folders knows which one to fix. */
static cp_status check_table(cp_device d, const cp_backend_ops *ops, void *fn)
{
    Dl_info info;
    const char *file = dladdr(fn, &info) && info.dli_fname ? info.dli_fname : module_file(d);
    char missing[256];
    if (!ops)
        return cpi_error(CP_ERROR_BACKEND, "%s: the module returned no backend table", file);
    if (ops->abi_version != CP_MODULE_ABI_VERSION ||
        ops->struct_size < offsetof(cp_backend_ops, merge) + sizeof(ops->merge))
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: module ABI version %u, table size %zu (this library needs ABI %u)", file,
                         ops->abi_version, ops->struct_size, CP_MODULE_ABI_VERSION);
    if (missing_slots(ops, missing, sizeof missing))
        return cpi_error(CP_ERROR_UNSUPPORTED,
                         "%s: the backend table leaves required slots NULL: %s (only the slots after "
                         "merge are optional)",
                         file, missing);
    if (ops->device != d)
        return cpi_error(CP_ERROR_UNSUPPORTED, "%s: the backend table is for device %d, not %d", file,
                         (int)ops->device, (int)d);
    return CP_SUCCESS;
}

/* A loaded module is kept for the life of the process. A failed load is not
 * remembered: the next context tries again, so a caller that fixes
 * INFINICP_MODULE_PATH (or installs the module) gets the module, or the
 * reason of this attempt, never the message of an earlier one. */
static _Atomic(const cp_backend_ops *) loaded_cuda;
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static cp_status load(cp_device d, const cp_backend_ops **out)
{
    pthread_mutex_lock(&load_lock);
    const cp_backend_ops *ops = atomic_load(&loaded_cuda);
    cp_status s = CP_SUCCESS;
    if (!ops) {
        void *fn = NULL;
        s = cpi_module_symbol(module_file(d), "cp_backend_module_v1", &fn);
        if (s == CP_SUCCESS) {
            ops = ((cp_backend_module_fn)fn)(&cpi_module_host);
            s = check_table(d, ops, fn);
        }
        if (s == CP_SUCCESS)
            atomic_store(&loaded_cuda, ops);
    }
    pthread_mutex_unlock(&load_lock);
    *out = s == CP_SUCCESS ? ops : NULL;
    return s;
}

cp_status cpi_backend_for(cp_device device, const cp_backend_ops **ops)
{
    if (device == CP_DEVICE_CPU) {
        *ops = cpi_cpu_backend();
        return CP_SUCCESS;
    }
    /* Contexts after the first skip the lock. */
    if ((*ops = atomic_load(&loaded_cuda)))
        return CP_SUCCESS;
    return load(device, ops);
}
