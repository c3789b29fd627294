/* SPDX-License-Identifier: MIT */
#include "launch.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* NCCL's C interface as far as used here: ncclResult_t is an int (0 =
 * success) and ncclUniqueId a 128-byte struct passed by value. */
typedef struct nccl_id {
    char internal[128];
} nccl_id;

static struct {
    int (*get_unique_id)(nccl_id *);
    int (*init_rank)(void **, int, nccl_id, int);
    int (*init_all)(void **, int, const int *);
    int (*destroy)(void *);
    const char *(*error_string)(int);
    int (*cuda_set_device)(int);
} nc;

static int load_nccl(char *err, size_t cap)
{
    /* NVLink multicast stays off unless the user asked otherwise. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        h = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    void *rt = dlopen("libcudart.so", RTLD_NOW | RTLD_GLOBAL);
    if (!rt)
        rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_GLOBAL);
    if (!h || !rt) {
        snprintf(err, cap, "NCCL (libnccl.so.2) or the CUDA runtime cannot be loaded: %s", dlerror());
        return -1;
    }
    *(void **)&nc.get_unique_id = dlsym(h, "ncclGetUniqueId");
    *(void **)&nc.init_rank = dlsym(h, "ncclCommInitRank");
    *(void **)&nc.init_all = dlsym(h, "ncclCommInitAll");
    *(void **)&nc.destroy = dlsym(h, "ncclCommDestroy");
    *(void **)&nc.error_string = dlsym(h, "ncclGetErrorString");
    *(void **)&nc.cuda_set_device = dlsym(rt, "cudaSetDevice");
    if (!nc.get_unique_id || !nc.init_rank || !nc.init_all || !nc.destroy || !nc.error_string ||
        !nc.cuda_set_device) {
        snprintf(err, cap, "NCCL lacks an entry point infinicp-bench uses");
        return -1;
    }
    return 0;
}

/* Rank 0 writes the id to a temporary name and renames it, so a reader
 * never sees half a file; the others poll for it (two minutes at most). */
static int exchange_id(const char *path, int rank, nccl_id *id, char *err, size_t cap)
{
    if (rank == 0) {
        int e = nc.get_unique_id(id);
        if (e) {
            snprintf(err, cap, "ncclGetUniqueId: %s", nc.error_string(e));
            return -1;
        }
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
            snprintf(err, cap, "cannot write the NCCL id to %s", path);
            return -1;
        }
        return 0;
    }
    for (int tries = 0; tries < 1200; tries++) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1)
                return 0;
        }
        nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
    }
    snprintf(err, cap, "no NCCL id appeared in %s within 120 s (is rank 0 running?)", path);
    return -1;
}

int launch_init(launch *l, const bench_opts *o, int devices, char *err, size_t cap)
{
    memset(l, 0, sizeof *l);
    l->transport = o->transport;
    l->devices = devices;
    l->world = o->cp;
    l->count = o->cp;
    if (o->transport == BENCH_LOCAL)
        return 0;
    if (!o->cuda) {
        snprintf(err, cap, "the NCCL transports need --device cuda");
        return -1;
    }
    if (load_nccl(err, cap))
        return -1;
    int e;
    if (o->transport == BENCH_NCCL_THREADS) {
        if (o->cp > devices) {
            snprintf(err, cap, "nccl-threads: --cp %d needs %d GPUs, %d visible", o->cp, o->cp, devices);
            return -1;
        }
        int devs[64];
        for (int i = 0; i < o->cp; i++)
            devs[i] = i;
        e = nc.init_all(l->nccl, o->cp, devs);
        if (e) {
            snprintf(err, cap, "ncclCommInitAll: %s", nc.error_string(e));
            return -1;
        }
        return 0;
    }
    l->world = o->size;
    l->first = o->rank;
    l->count = 1;
    if (!o->nccl_id_file) {
        snprintf(err, cap, "nccl-file needs --nccl-id-file PATH (on storage every rank sees)");
        return -1;
    }
    nccl_id id;
    if (exchange_id(o->nccl_id_file, o->rank, &id, err, cap))
        return -1;
    nc.cuda_set_device(launch_device(l, 0));
    e = nc.init_rank(&l->nccl[0], o->size, id, o->rank);
    if (e) {
        snprintf(err, cap, "ncclCommInitRank (rank %d of %d): %s", o->rank, o->size, nc.error_string(e));
        return -1;
    }
    /* every rank has joined: the id is spent */
    if (o->rank == 0)
        unlink(o->nccl_id_file);
    return 0;
}

int launch_device(const launch *l, int i)
{
    switch (l->transport) {
    case BENCH_NCCL_THREADS:
        return i;
    case BENCH_NCCL_FILE:
        return l->devices > 0 ? (l->first + i) % l->devices : 0;
    default:
        return 0; /* every local rank shares device 0 */
    }
}

cp_status launch_comms(const launch *l, cp_comm **out)
{
    if (l->transport == BENCH_LOCAL)
        return cp_comm_create_local(l->world, out);
    for (int i = 0; i < l->count; i++) {
        cp_status s = cp_comm_create_nccl(l->nccl[i], &out[i]);
        if (s != CP_SUCCESS) {
            while (i-- > 0)
                cp_comm_destroy(out[i]);
            return s;
        }
    }
    return CP_SUCCESS;
}

void launch_fini(launch *l)
{
    for (int i = 0; i < 64; i++)
        if (l->nccl[i])
            nc.destroy(l->nccl[i]);
    memset(l->nccl, 0, sizeof l->nccl);
}
