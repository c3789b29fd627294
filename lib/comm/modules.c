/* SPDX-License-Identifier: MIT */
/* Communicators over foreign handles come from transport modules, loaded
 * the first time one is asked for and kept for the life of the process. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "comm/agree.h"

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
    if (out)
        *out = NULL;
    CPI_CHECK_PTR(mpi_comm);
    /* The module duplicates the MPI communicator, which is collective and
     * cannot time out: a rank without out still does, and then tells its
     * peers (one small all-reduce), so that none of them goes on with a
     * communicator this rank does not have. Where it cannot take part, its
     * own reason comes first. */
    char why[512] = "";
    cp_status local = CP_SUCCESS;
    if (!out) {
        local = cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: out is NULL", __func__);
        snprintf(why, sizeof why, "%s", cp_last_error());
    }
    pthread_once(&mpi_module.once, load_mpi);
    cp_status s = mpi_module.status;
    if (s != CP_SUCCESS)
        s = cpi_error(s, "%s: %s", __func__, mpi_module.error);
    cp_comm *c = NULL;
    if (s == CP_SUCCESS && (s = mpi_module.table->create(&cpi_module_host, mpi_comm, &c)) == CP_SUCCESS && !c)
        s = cpi_error(CP_ERROR_INTERNAL, "%s: %s returned no communicator", __func__, mpi_module.file);
    if (s != CP_SUCCESS)
        return local != CP_SUCCESS ? cpi_error(local, "%s", why) : s;
    const cpi_agree_call call = { .func = __func__, .comm = c, .timeout_ms = CPI_DEFAULT_TIMEOUT_MS };
    cpi_agreement ag;
    if ((s = cpi_agree_open(&ag, &call, local)) == CP_SUCCESS)
        s = cpi_agree_close(&ag, CP_SUCCESS);
    if (s != CP_SUCCESS) {
        cp_comm_destroy(c);
        return s;
    }
    *out = c;
    return CP_SUCCESS;
}
