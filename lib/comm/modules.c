/* SPDX-License-Identifier: MIT */
/* Communicators over foreign handles come from transport modules, loaded
 * the first time one is asked for and kept for the life of the process. */
#include <pthread.h>
#include <string.h>

#include "comm/comm.h"

typedef struct transport_module {
    const char *file;
    pthread_once_t once;
    const cp_transport_module *table;
    cp_status status;
    char error[512];
} transport_module;

static transport_module mpi_module = { "transport-mpi.so", PTHREAD_ONCE_INIT, NULL, CP_SUCCESS, "" };

static void load(transport_module *m)
{
    void *fn = NULL;
    cp_status s = cpi_module_symbol(m->file, "cp_transport_module_v1", &fn);
    if (s == CP_SUCCESS) {
        const cp_transport_module *t = ((cp_transport_module_fn)fn)(&cpi_module_host);
        if (!t)
            s = cpi_error(CP_ERROR_COMM, "%s: the module returned no transport table", m->file);
        else if (t->abi_version != CP_MODULE_ABI_VERSION ||
                 t->struct_size < offsetof(cp_transport_module, create) + sizeof(t->create) || !t->create)
            s = cpi_error(CP_ERROR_UNSUPPORTED,
                          "%s: module ABI version %u, table size %zu (this library needs ABI %u)", m->file,
                          t->abi_version, t->struct_size, CP_MODULE_ABI_VERSION);
        else
            m->table = t;
    }
    m->status = s;
    if (s != CP_SUCCESS)
        strncpy(m->error, cp_last_error(), sizeof m->error - 1);
}

static void load_mpi(void)
{
    load(&mpi_module);
}

CP_EXPORT cp_status cp_comm_create_mpi(void *mpi_comm, cp_comm **out)
{
    CPI_CHECK_PTR(out);
    *out = NULL;
    CPI_CHECK_PTR(mpi_comm);
    pthread_once(&mpi_module.once, load_mpi);
    if (mpi_module.status != CP_SUCCESS)
        return cpi_error(mpi_module.status, "%s: %s", __func__, mpi_module.error);
    cp_status s = mpi_module.table->create(&cpi_module_host, mpi_comm, out);
    if (s == CP_SUCCESS && !*out)
        return cpi_error(CP_ERROR_INTERNAL, "%s: %s returned no communicator", __func__, mpi_module.file);
    return s;
}
