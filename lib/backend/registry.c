/* SPDX-License-Identifier: MIT */
/* Which backend drives which device: the CPU one is built in, the others are
 * modules loaded on first use. */
#include <pthread.h>
#include <string.h>

#include "core/context.h"

static const char *module_file(cp_device d)
{
    return d == CP_DEVICE_CUDA ? "backend-cuda.so" : NULL;
}

static const cp_backend_ops *loaded[2];
static cp_status load_status[2];
static char load_error[2][512];
static pthread_once_t once_cuda = PTHREAD_ONCE_INIT;

static void load_cuda(void)
{
    const cp_device d = CP_DEVICE_CUDA;
    void *fn = NULL;
    cp_status s = cpi_module_symbol(module_file(d), "cp_backend_module_v1", &fn);
    if (s == CP_SUCCESS) {
        const cp_backend_ops *ops = ((cp_backend_module_fn)fn)(&cpi_module_host);
        if (!ops)
            s = cpi_error(CP_ERROR_BACKEND, "%s: the module returned no backend table", module_file(d));
        else if (ops->abi_version != CP_MODULE_ABI_VERSION ||
                 ops->struct_size < offsetof(cp_backend_ops, merge) + sizeof(ops->merge))
            s = cpi_error(CP_ERROR_UNSUPPORTED,
                          "%s: module ABI version %u, table size %zu (this library needs ABI %u)",
                          module_file(d), ops->abi_version, ops->struct_size, CP_MODULE_ABI_VERSION);
        else
            loaded[d] = ops;
    }
    load_status[d] = s;
    if (s != CP_SUCCESS)
        strncpy(load_error[d], cp_last_error(), sizeof load_error[d] - 1);
}

cp_status cpi_backend_for(cp_device device, const cp_backend_ops **ops)
{
    if (device == CP_DEVICE_CPU) {
        *ops = cpi_cpu_backend();
        return CP_SUCCESS;
    }
    pthread_once(&once_cuda, load_cuda);
    if (load_status[device] != CP_SUCCESS)
        return cpi_error(load_status[device], "%s", load_error[device]);
    *ops = loaded[device];
    return CP_SUCCESS;
}
