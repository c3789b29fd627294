/* SPDX-License-Identifier: MIT */
/**
 * @file backend.h
 * @brief The module ABI of libinfinicp, for authors of device backends and
 *        transports.
 *
 * A backend module (for example `backend-cuda.so`) is a shared object that
 * exports one function, `cp_backend_module_v1`, returning a pointer to a
 * static ::cp_backend_ops table. A transport module (for example
 * `transport-mpi.so`) exports `cp_transport_module_v1`, returning a
 * ::cp_transport_module table. Both tables start with `uint32_t abi_version;
 * size_t struct_size;` so that the core can accept older and newer modules:
 * it reads only the fields that both sides know.
 *
 * Frameworks that only use CP attention never need this header.
 */
#ifndef INFINICP_BACKEND_H
#define INFINICP_BACKEND_H

#include <infinicp/infinicp.h>

#ifdef __cplusplus
extern "C" {
#endif

/** ABI version of the tables in this header. */
#define CP_MODULE_ABI_VERSION 1u

/** Direction of a copy between host and device memory. */
typedef enum cp_copy_kind {
    CP_COPY_HOST_TO_HOST = 0,
    CP_COPY_HOST_TO_DEVICE = 1,
    CP_COPY_DEVICE_TO_HOST = 2,
    CP_COPY_DEVICE_TO_DEVICE = 3
} cp_copy_kind;

/** Reduction operator of collectives and of ::cp_backend_ops.reduce. */
typedef enum cp_reduce_op {
    CP_REDUCE_SUM = 0,
    CP_REDUCE_MAX = 1
} cp_reduce_op;

/**
 * A device backend: memory, copies, and the kernels CP attention is built of.
 * Every function gets the @c state its @c open returned. Work is queued on
 * the state's current stream; @c synchronize waits for it. Functions return
 * ::cp_status and set the thread's error text through the core (modules call
 * their own message helper, see ::cp_module_host).
 *
 * Every function slot up to and including @c merge is required: the core
 * refuses a table that leaves one of them NULL (cp_context_create() returns
 * #CP_ERROR_UNSUPPORTED naming the slot and the module file). The slots after
 * @c merge are optional and may be NULL.
 */
typedef struct cp_backend_ops {
    uint32_t abi_version; /**< #CP_MODULE_ABI_VERSION */
    size_t struct_size;   /**< sizeof(cp_backend_ops) as the module saw it */
    const char *name;     /**< "cpu", "cuda", ... */
    cp_device device;     /**< the device kind this backend drives */

    /** Open device @p device_index on @p stream; *state receives the backend's state. */
    cp_status (*open)(int device_index, void *stream, int num_threads, void **state);
    /** Release what open() acquired. */
    void (*close)(void *state);
    /** Order later work on @p stream. */
    cp_status (*set_stream)(void *state, void *stream);
    /** Wait until queued work has finished. */
    cp_status (*synchronize)(void *state);

    /** Allocate @p bytes of device memory. */
    cp_status (*alloc)(void *state, size_t bytes, void **ptr);
    /** Free memory from alloc(); NULL is a no-op. */
    void (*free)(void *state, void *ptr);
    /** height rows of width bytes, with pitches in bytes. */
    cp_status (*copy_2d)(void *state, void *dst, size_t dpitch, const void *src, size_t spitch,
                         size_t width, size_t height, cp_copy_kind kind);
    /** Set @p bytes of device memory at @p dst to @p value. */
    cp_status (*memset)(void *state, void *dst, int value, size_t bytes);
    /** dst[i] = (dst_type) src[i] for i < count, through fp32 (or fp64). */
    cp_status (*convert)(void *state, void *dst, cp_dtype dst_type, const void *src,
                         cp_dtype src_type, size_t count);
    /** acc[i] = op(acc[i], x[i]) for i < count, both of type @p dtype, computed in fp32 or wider. */
    cp_status (*reduce)(void *state, void *acc, const void *x, cp_dtype dtype, size_t count,
                        cp_reduce_op op);

    /*
     * The attention kernels get arguments the core has validated and
     * normalised: struct_size = sizeof(cp_kernel_attn_args), head_dim_v and
     * softmax_scale filled in, every all-zero stride set replaced by the
     * dense strides of the format (likewise for merge). In
     * attn_workspace_size the data pointers may be NULL.
     */
    /** Scratch bytes attn_forward (backward = 0) or attn_backward (1) needs for @p a. */
    cp_status (*attn_workspace_size)(void *state, const cp_kernel_attn_args *a, int backward,
                                     size_t *bytes);
    /** The kernel behind cp_kernel_attn_forward(). */
    cp_status (*attn_forward)(void *state, const cp_kernel_attn_args *a);
    /** The kernel behind cp_kernel_attn_backward(). */
    cp_status (*attn_backward)(void *state, const cp_kernel_attn_args *a);
    /** The kernel behind cp_kernel_merge(). */
    cp_status (*merge)(void *state, const cp_kernel_merge_args *a);

    /*
     * Optional slots, added after the first ABI 1 table. A caller uses one
     * only if struct_size covers it (see #CP_BACKEND_HAS) and it is not NULL;
     * a backend without them runs everything in order on one stream.
     *
     * Overlap: besides the context's stream (index 0) a state offers
     * auxiliary streams 1 .. #CP_BACKEND_MAX_STREAMS - 1, created on first
     * use. Every function of the table, and every transport handed this state
     * in a ::cp_xfer, queues its work on the state's current stream; events
     * order work between streams on the device, without blocking the host.
     * A caller that spreads work over streams first makes them wait for an
     * event recorded on stream 0, and at the end makes stream 0 wait for an
     * event recorded on each stream it used, then selects stream 0 again, so
     * that to the context's user everything happened on its stream.
     * synchronize waits for the current stream only.
     */
    /** Make later work of this state go to stream @p index (0 = the context's). */
    cp_status (*stream_select)(void *state, int index);
    /** Create an event; *event = NULL on failure. */
    cp_status (*event_create)(void *state, void **event);
    /** Destroy an event (NULL is a no-op); work it marks may still be pending. */
    void (*event_destroy)(void *state, void *event);
    /** Mark the current end of the current stream's work with @p event. */
    cp_status (*event_record)(void *state, void *event);
    /** Make later work of the current stream wait for @p event's work. */
    cp_status (*event_wait)(void *state, void *event);

    /**
     * Wrap a foreign communicator of a transport this module carries: kind
     * "nccl" with an ncclComm_t (not owned). Returns #CP_ERROR_UNSUPPORTED
     * for a kind it does not know.
     */
    cp_status (*comm_create)(const char *kind, void *foreign, cp_comm **out);

    /**
     * Choose between bitwise reproducible kernels (@p on = 1) and the
     * fastest ones (0) for later work of this state; the core calls it right
     * after open() with cp_context_config.deterministic. A backend without
     * this slot must be deterministic always (the CPU backend is).
     */
    cp_status (*set_deterministic)(void *state, int on);

    /**
     * The size of ::cp_kernel_attn_args whose fields the attention kernels
     * understand (API 1.1). 0, or a table too old to have this field: the
     * 1.0 arguments, which end at drow_ready. The core answers
     * #CP_ERROR_UNSUPPORTED, naming the field, for a window, softcap or
     * rectangle list a backend does not understand, instead of handing it over.
     */
    size_t kernel_args_size;

    /**
     * Make an NCCL unique id (ncclGetUniqueId): @p bytes (always
     * #CP_NCCL_UNIQUE_ID_BYTES, checked by the core) opaque bytes into
     * @p id, which is left alone on failure. No context is needed: the core
     * calls it with the module loaded but maybe no state open
     * (cp_nccl_unique_id(), API 1.1). #CP_ERROR_UNSUPPORTED, naming why, for
     * a module built without NCCL.
     */
    cp_status (*nccl_unique_id)(void *id, size_t bytes);

    /**
     * Create a communicator of @p nranks ranks, this one @p rank, on the
     * device of @p state (ncclCommInitRank with the id of @p bytes bytes;
     * collective over the nranks ranks) and wrap it into a ::cp_comm through
     * ::cp_module_host.comm_wrap. Unlike comm_create's, the communicator is
     * the library's: the transport's destroy destroys it
     * (cp_comm_create_nccl_id(), API 1.1). The core has checked the
     * arguments; *out = NULL on failure.
     */
    cp_status (*nccl_comm_create)(void *state, const void *id, size_t bytes, int nranks, int rank,
                                  cp_comm **out);

    /**
     * Row dot products (API 1.2; the rowsums dO . O of the attention sinks'
     * gradient on a device): for b < batch, h < heads, i < seq,
     * d[(b * heads + h) * seq + i] = sum over e < dim of x(b, i, h, e) *
     * y(b, i, h, e), accumulated in fp32, where element (b, i, h, e) of x
     * and of y (both of type @p t: F32, F16 or BF16) is at element offset
     * b * sb + i * ss + h * sh + e. d is dense fp32 device memory. The
     * core refuses plans with sinks on a device backend without this slot.
     */
    cp_status (*row_dot)(void *state, float *d, const void *x, const void *y, cp_dtype t, int64_t batch,
                         int64_t seq, int32_t heads, int32_t dim, int64_t sb, int64_t ss, int64_t sh);

    /**
     * The attention sinks' gradient, summed on the device (API 1.2,
     * optional): for h < heads,
     * g[h] = -sum over b < batch, i < seq of exp(sinks[h] - lse[j]) *
     * rows[j], j = (b * heads + h) * seq + i, leaving out the rows whose
     * lse is -inf (they saw no key and no sink); the sum in at least fp32,
     * in an order that does not change from call to call, NaN staying NaN.
     * g, sinks (heads floats) and lse, rows (dense, batch x heads x seq)
     * are device memory; g is written, not added to. Ordered on the
     * current stream like every kernel: the host does not wait. Without
     * this slot the core copies rows and lse to the host and sums there
     * (one wait for the device per backward with sinks).
     */
    cp_status (*sink_grad)(void *state, float *g, const float *sinks, const float *lse, const float *rows,
                           int64_t batch, int64_t seq, int32_t heads);
} cp_backend_ops;

/** Streams a device backend offers through cp_backend_ops.stream_select. */
#define CP_BACKEND_MAX_STREAMS 8

/** Whether backend table @p ops (as the module filled it) has slot @p slot. */
#define CP_BACKEND_HAS(ops, slot)                                                          \
    ((ops)->struct_size >= offsetof(cp_backend_ops, slot) + sizeof((ops)->slot) && (ops)->slot)

/** Where the buffers of one transport call live, and how long it may wait. */
typedef struct cp_xfer {
    const cp_backend_ops *backend; /**< where the buffers live; NULL = host memory */
    void *backend_state;           /**< that backend's state */
    int timeout_ms;                /**< longest wait for a peer; <= 0 = forever */
} cp_xfer;

/**
 * A communication transport. Collectives are blocking for the calling rank
 * (on device backends: ordered on the stream of @c x->backend_state) and must
 * be called by every rank of the communicator in the same order.
 *
 * Every function slot up to and including @c destroy is required: the core
 * refuses a table that leaves one of them NULL (::cp_module_host.comm_wrap
 * returns #CP_ERROR_UNSUPPORTED naming the slot). The slots after
 * @c destroy are optional and may be NULL.
 */
typedef struct cp_transport_ops {
    uint32_t abi_version; /**< #CP_MODULE_ABI_VERSION */
    size_t struct_size;   /**< sizeof(cp_transport_ops) as the module saw it */
    const char *name;     /**< "local", "mpi", "nccl", ... */

    /** recv = concatenation of every rank's @p bytes of send, in rank order. */
    cp_status (*all_gather)(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes);
    /** recv (count elements) = op over ranks of block [rank*count, (rank+1)*count) of send. */
    cp_status (*reduce_scatter)(void *impl, const cp_xfer *x, const void *send, void *recv,
                                size_t count, cp_dtype dtype, cp_reduce_op op);
    /** block j (@p bytes) of send goes to rank j; block i of recv comes from rank i. */
    cp_status (*all_to_all)(void *impl, const cp_xfer *x, const void *send, void *recv, size_t bytes);
    /** send to @p dst and receive from @p src at once (a ring shift when all ranks call it). */
    cp_status (*sendrecv)(void *impl, const cp_xfer *x, const void *send, size_t send_bytes, int dst,
                          void *recv, size_t recv_bytes, int src);
    /** recv = op over ranks of send (count elements); send == recv allowed. */
    cp_status (*all_reduce)(void *impl, const cp_xfer *x, const void *send, void *recv, size_t count,
                            cp_dtype dtype, cp_reduce_op op);
    /** Return once every rank has called it. */
    cp_status (*barrier)(void *impl, const cp_xfer *x);
    /**
     * Collective: ranks with equal color form a new communicator ordered by
     * (key, old rank). A negative color leaves the rank out (*out_impl = NULL).
     */
    cp_status (*split)(void *impl, int color, int key, int timeout_ms, void **out_impl, int *out_rank,
                       int *out_size);
    /** Release this rank's instance. */
    void (*destroy)(void *impl);

    /*
     * Optional slots, added after the first ABI 1 table: a caller uses one
     * only if struct_size covers it and it is not NULL.
     */
    /**
     * Wait on the host, at most @c x->timeout_ms (<= 0: forever), until the
     * work this rank queued on the communicator has finished and, when
     * @c x->backend_state is set, that state's current stream is idle.
     * Transports whose collectives run asynchronously (NCCL) poll their
     * asynchronous errors meanwhile: #CP_ERROR_COMM for one, #CP_ERROR_TIMEOUT
     * at the deadline; either way they abort the communicators they own.
     * Without this slot a transport's collectives return with their work done
     * or ordered on the stream, and the caller synchronizes the backend.
     */
    cp_status (*wait)(void *impl, const cp_xfer *x);
    /**
     * all_to_all of strided blocks, without packing them: block j of this
     * rank's send, for rank j, is @p rows rows of @p width bytes, the first
     * row at send + j * @p send_step and the others @p send_pitch bytes
     * apart; the block from rank i lands at recv + i * @p recv_step, rows
     * @p recv_pitch apart. A step may be negative (blocks in reverse rank
     * order); the bytes between rows and between blocks are left alone on
     * both sides. Every rank passes the same @p width and @p rows, but its
     * own steps and pitches: a transport that reads its peers' memory in
     * place (the local one) reads each sender's block with the sender's.
     * The core has checked that the pitches hold a row and that send and
     * recv, as the blocks span them, do not overlap. Without this slot the
     * core packs the blocks and calls @c all_to_all.
     */
    cp_status (*all_to_all_2d)(void *impl, const cp_xfer *x, const void *send, ptrdiff_t send_step,
                               size_t send_pitch, void *recv, ptrdiff_t recv_step, size_t recv_pitch, size_t width,
                               size_t rows);
} cp_transport_ops;

/** Whether transport table @p ops has the optional slot @p slot. */
#define CP_TRANSPORT_HAS(ops, slot)                                                        \
    ((ops)->struct_size >= offsetof(cp_transport_ops, slot) + sizeof((ops)->slot) && (ops)->slot)

/** What a module gets from the core when it is loaded. */
typedef struct cp_module_host {
    uint32_t abi_version; /**< #CP_MODULE_ABI_VERSION */
    size_t struct_size;   /**< sizeof(cp_module_host) */
    /** Set the calling thread's cp_last_error() text; returns @p s. */
    cp_status (*set_error)(cp_status s, const char *message);
    /**
     * Wrap a transport instance into a ::cp_comm the core owns (destroy calls
     * ops->destroy). #CP_ERROR_UNSUPPORTED, naming what is wrong, for a
     * table of another ABI version, too small, or with a required slot NULL.
     */
    cp_status (*comm_wrap)(const cp_transport_ops *ops, void *impl, int rank, int size, cp_comm **out);
} cp_module_host;

/** The table a transport module returns. */
typedef struct cp_transport_module {
    uint32_t abi_version; /**< #CP_MODULE_ABI_VERSION */
    size_t struct_size;   /**< sizeof(cp_transport_module) */
    const char *name;     /**< "mpi", ... */
    /** Wrap a foreign communicator handle (e.g. a pointer to an MPI_Comm). */
    cp_status (*create)(const cp_module_host *host, void *foreign, cp_comm **out);
} cp_transport_module;

/** Signature of `cp_backend_module_v1` exported by a backend module. */
typedef const cp_backend_ops *(*cp_backend_module_fn)(const cp_module_host *host);
/** Signature of `cp_transport_module_v1` exported by a transport module. */
typedef const cp_transport_module *(*cp_transport_module_fn)(const cp_module_host *host);

#ifdef __cplusplus
}
#endif

#endif /* INFINICP_BACKEND_H */
