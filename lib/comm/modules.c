/* SPDX-License-Identifier: MIT */
/* Communicators over foreign handles come from transport modules, loaded
 * the first time one is asked for and kept for the life of the process. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "backend/backend.h"
#include "comm/agree.h"

/* A loaded module is kept for the life of the process. A failed load is not
 * remembered: the next call tries again, so a caller that fixes
 * INFINICP_MODULE_PATH (or installs the module) gets the module, or the
 * reason of this attempt, never the message of an earlier one. */
typedef struct transport_module {
    const char *file;
    pthread_mutex_t lock;
    _Atomic(const cp_transport_module *) table;
} transport_module;

static transport_module mpi_module = { "transport-mpi.so", PTHREAD_MUTEX_INITIALIZER, NULL };

static cp_status check_table(const transport_module *m, const cp_transport_module *t)
{
    if (!t)
        return cpi_error(CP_ERROR_COMM, "%s: the module returned no transport table", m->file);
    if (t->abi_version != CP_MODULE_ABI_VERSION ||
        t->struct_size < offsetof(cp_transport_module, create) + sizeof(t->create) || !t->create)
        return cpi_error(CP_ERROR_UNSUPPORTED, "%s: module ABI version %u, table size %zu (this library needs ABI %u)",
                         m->file, t->abi_version, t->struct_size, CP_MODULE_ABI_VERSION);
    return CP_SUCCESS;
}

static cp_status load(transport_module *m, const cp_transport_module **out)
{
    /* Calls after the first load skip the lock. */
    if ((*out = atomic_load(&m->table)))
        return CP_SUCCESS;
    pthread_mutex_lock(&m->lock);
    const cp_transport_module *t = atomic_load(&m->table);
    cp_status s = CP_SUCCESS;
    if (!t) {
        void *fn = NULL;
        s = cpi_module_symbol(m->file, "cp_transport_module_v1", &fn);
        if (s == CP_SUCCESS) {
            t = ((cp_transport_module_fn)fn)(&cpi_module_host);
            s = check_table(m, t);
        }
        if (s == CP_SUCCESS)
            atomic_store(&m->table, t);
    }
    pthread_mutex_unlock(&m->lock);
    *out = s == CP_SUCCESS ? t : NULL;
    return s;
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
    const cp_transport_module *t;
    cp_status s = load(&mpi_module, &t);
    if (s != CP_SUCCESS) {
        char reason[512];
        snprintf(reason, sizeof reason, "%s", cp_last_error());
        s = cpi_error(s, "%s: %s", __func__, reason);
    }
    cp_comm *c = NULL;
    if (s == CP_SUCCESS && (s = t->create(&cpi_module_host, mpi_comm, &c)) == CP_SUCCESS && !c)
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
