// SPDX-License-Identifier: MIT
// The fake NCCL of tests/fakenccl.h: the functions the CUDA module calls,
// over communicators of one rank. Not thread-safe (the fault test is not
// threaded). Communicators live in a fixed table and are never freed, so
// that a call on a dead one is seen and counted instead of crashing.
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include <cuda_runtime_api.h>

#include "fakenccl.h"

#define FAKE_API extern "C" __attribute__((visibility("default")))

struct ncclComm {
    int id;
    bool dead;        // aborted or destroyed
    bool nonblocking; // made by a split with config->blocking = 0
    int busy;         // polls of ncclCommGetAsyncError left in progress; -1 = for ever
    bool stuck;       // a spinning kernel of this communicator was launched
    int polls;        // ncclCommGetAsyncError calls while stuck
    bool aborted;
    ncclResult_t error; // asynchronous error, once reported
    volatile int *release; // mapped host memory the spinning kernels watch
    int *release_dev;
    char last[128];
};

namespace {

constexpr int MAX_COMMS = 256;
ncclComm g_comms[MAX_COMMS];
int g_ncomms;
fakenccl_stats g_stats;
bool g_stuck, g_split_hangs;
int g_error_after;
int g_count = 1; // what ncclCommCount reports (the rank is always 0)
char g_misuse[256];

// group state: the send of a grouped send/recv pair, and the communicators used
int g_depth;
const void *g_send;
size_t g_send_bytes;
ncclComm_t g_group_comm;

void misuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_misuse, sizeof g_misuse, fmt, ap);
    va_end(ap);
    g_stats.misuse++;
    fprintf(stderr, "fakenccl: misuse: %s\n", g_misuse);
}

__global__ void spin(const volatile int *release)
{
    while (!*release)
        __nanosleep(1000);
}

ncclComm_t make(bool nonblocking, int busy)
{
    if (g_ncomms == MAX_COMMS)
        return nullptr;
    ncclComm_t c = &g_comms[g_ncomms];
    memset(c, 0, sizeof *c);
    c->id = g_ncomms++;
    c->nonblocking = nonblocking;
    c->busy = busy;
    void *p = nullptr;
    if (cudaHostAlloc(&p, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
        cudaHostGetDevicePointer(reinterpret_cast<void **>(&c->release_dev), p, 0) != cudaSuccess) {
        g_ncomms--;
        return nullptr;
    }
    c->release = static_cast<volatile int *>(p);
    *c->release = 0;
    g_stats.created++;
    return c;
}

// Whether c may take a new call (counts misuse otherwise).
bool usable(ncclComm_t c, const char *fn)
{
    if (!c || c < g_comms || c >= g_comms + g_ncomms) {
        misuse("%s on an unknown communicator %p", fn, (void *)c);
        return false;
    }
    if (c->dead) {
        misuse("%s on communicator %d after it was %s", fn, c->id, c->aborted ? "aborted" : "destroyed");
        return false;
    }
    if (c->busy) {
        misuse("%s on communicator %d while its last call is still in progress", fn, c->id);
        return false;
    }
    return true;
}

void unstick(ncclComm_t c)
{
    *c->release = 1;
    __sync_synchronize();
}

// One rank's collective: (stuck: wait for abort first, like a missing peer)
// then the copy that one rank's result is.
ncclResult_t enqueue(ncclComm_t c, const char *fn, const void *src, void *dst, size_t bytes, cudaStream_t s)
{
    if (!usable(c, fn))
        return ncclInvalidUsage;
    if (g_stuck) {
        spin<<<1, 1, 0, s>>>(c->release_dev);
        c->stuck = true;
    }
    if (bytes && src != dst && cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return ncclUnhandledCudaError;
    if (cudaGetLastError() != cudaSuccess)
        return ncclUnhandledCudaError;
    if (g_depth) {
        g_group_comm = c;
        return ncclSuccess;
    }
    if (c->nonblocking) {
        c->busy = 1;
        return ncclInProgress;
    }
    return ncclSuccess;
}

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

} // namespace

FAKE_API void fakenccl_reset(void)
{
    g_stuck = g_split_hangs = false;
    g_error_after = 0;
    g_count = 1;
    memset(&g_stats, 0, sizeof g_stats);
    g_misuse[0] = 0;
}

FAKE_API void fakenccl_set_stuck(int on) { g_stuck = on != 0; }
FAKE_API void fakenccl_set_error_after(int polls) { g_error_after = polls; }
FAKE_API void fakenccl_set_split_hangs(int on) { g_split_hangs = on != 0; }
FAKE_API void fakenccl_set_count(int n) { g_count = n > 0 ? n : 1; }
FAKE_API fakenccl_stats fakenccl_get(void) { return g_stats; }
FAKE_API const char *fakenccl_last_misuse(void) { return g_misuse; }
FAKE_API int fakenccl_was_aborted(ncclComm_t c) { return c && c->aborted; }

FAKE_API const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error (fake ncclRemoteError)";
    case ncclInProgress: return "operation in progress";
    default: return "other fake NCCL error";
    }
}

FAKE_API const char *ncclGetLastError(ncclComm_t c)
{
    if (!c || c < g_comms || c >= g_comms + g_ncomms) // NCCL allows NULL
        return "";
    if (c->dead)
        misuse("ncclGetLastError on communicator %d after it was %s", c->id, c->aborted ? "aborted" : "destroyed");
    return c->last;
}

FAKE_API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *)
{
    if (ndev != 1)
        return ncclInvalidArgument;
    *comms = make(false, 0);
    return *comms ? ncclSuccess : ncclSystemError;
}

FAKE_API ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank)
{
    if (!usable(c, "ncclCommUserRank"))
        return ncclInvalidUsage;
    *rank = 0;
    return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommCount(const ncclComm_t c, int *count)
{
    if (!usable(c, "ncclCommCount"))
        return ncclInvalidUsage;
    *count = g_count;
    return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err)
{
    if (!c || c < g_comms || c >= g_comms + g_ncomms || c->dead) {
        misuse("ncclCommGetAsyncError on a dead or unknown communicator");
        return ncclInvalidArgument;
    }
    if (c->error == ncclSuccess && g_error_after > 0 && c->stuck && !*c->release && ++c->polls >= g_error_after) {
        c->error = ncclRemoteError;
        snprintf(c->last, sizeof c->last, "fake: the peer of communicator %d is gone", c->id);
    }
    if (c->error != ncclSuccess)
        *err = c->error;
    else if (c->busy) {
        if (c->busy > 0)
            c->busy--;
        *err = ncclInProgress;
    } else
        *err = ncclSuccess;
    return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommSplit(ncclComm_t c, int color, int, ncclComm_t *out, ncclConfig_t *config)
{
    *out = nullptr;
    if (!usable(c, "ncclCommSplit"))
        return ncclInvalidUsage;
    if (color == NCCL_SPLIT_NOCOLOR)
        return ncclSuccess;
    const bool nb = config && config->blocking == 0;
    if (g_split_hangs && !nb)
        misuse("ncclCommSplit: a hanging split of a blocking communicator cannot be given up on");
    *out = make(nb, g_split_hangs ? -1 : nb ? 2 : 0);
    if (!*out)
        return ncclSystemError;
    return nb ? ncclInProgress : ncclSuccess;
}

FAKE_API ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    if (!usable(c, "ncclCommFinalize"))
        return ncclInvalidUsage;
    if (c->stuck && !*c->release)
        misuse("ncclCommFinalize on communicator %d with stuck work (NCCL would not finish)", c->id);
    if (!c->nonblocking)
        return ncclSuccess;
    c->busy = 2;
    return ncclInProgress;
}

FAKE_API ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!usable(c, "ncclCommDestroy"))
        return ncclInvalidUsage;
    if (c->stuck && !*c->release) {
        misuse("ncclCommDestroy on communicator %d with stuck work (NCCL would hang)", c->id);
        unstick(c);
    }
    c->dead = true;
    g_stats.destroyed++;
    return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommAbort(ncclComm_t c)
{
    if (!c || c < g_comms || c >= g_comms + g_ncomms || c->dead) {
        misuse("ncclCommAbort on a dead or unknown communicator");
        return ncclInvalidArgument;
    }
    unstick(c); // NCCL's kernels watch an abort flag the same way
    c->dead = c->aborted = true;
    c->busy = 0;
    g_stats.aborted++;
    return ncclSuccess;
}

FAKE_API ncclResult_t ncclGroupStart()
{
    g_depth++;
    return ncclSuccess;
}

FAKE_API ncclResult_t ncclGroupEnd()
{
    if (g_depth == 0)
        return ncclInvalidUsage;
    if (--g_depth)
        return ncclSuccess;
    ncclComm_t c = g_group_comm;
    g_group_comm = nullptr;
    if (g_send)
        misuse("ncclGroupEnd: a send without its receive");
    g_send = nullptr;
    if (c && c->nonblocking) {
        c->busy = 1;
        return ncclInProgress;
    }
    return ncclSuccess;
}

FAKE_API ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                               cudaStream_t s)
{
    if (peer != 0 || !g_depth)
        return ncclInvalidArgument;
    if (!usable(c, "ncclSend"))
        return ncclInvalidUsage;
    g_send = buf;
    g_send_bytes = count * type_size(t);
    g_group_comm = c;
    (void)s;
    return ncclSuccess;
}

FAKE_API ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    if (peer != 0 || !g_depth || !g_send || g_send_bytes != count * type_size(t))
        return ncclInvalidArgument;
    const void *src = g_send;
    g_send = nullptr;
    return enqueue(c, "ncclRecv", src, buf, g_send_bytes, s);
}

FAKE_API ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c,
                                    cudaStream_t s)
{
    return enqueue(c, "ncclAllGather", send, recv, count * type_size(t), s);
}

FAKE_API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t,
                                    ncclComm_t c, cudaStream_t s)
{
    return enqueue(c, "ncclAllReduce", send, recv, count * type_size(t), s);
}

FAKE_API ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t,
                                        ncclComm_t c, cudaStream_t s)
{
    return enqueue(c, "ncclReduceScatter", send, recv, count * type_size(t), s);
}
