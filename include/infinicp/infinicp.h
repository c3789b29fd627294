/* SPDX-License-Identifier: MIT */
/**
 * @file infinicp.h
 * @brief libinfinicp: context-parallel (CP) attention for LLM training.
 *
 * One training sample's sequence is split across the ranks of a CP group;
 * attention comes out exactly as if one device held the whole sequence.
 *
 * Conventions used by every function in this header:
 *  - fallible functions return a ::cp_status, #CP_SUCCESS (0) on success;
 *  - outputs come last, through pointers;
 *  - handles are opaque; every `*_destroy(NULL)` is a no-op;
 *  - configuration structs start with `size_t struct_size` and have an
 *    `*_INIT` initialiser; the library reads `min(struct_size, sizeof)` bytes
 *    and gives newer fields their defaults;
 *  - on failure, cp_last_error() returns a message naming the argument and
 *    value that caused it.
 *
 * Nothing here needs CUDA, NCCL or MPI headers: streams and foreign
 * communicators cross as `void *`. See <infinicp/cuda.h> and <infinicp/mpi.h>
 * for typed wrappers.
 */
#ifndef INFINICP_INFINICP_H
#define INFINICP_INFINICP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Major version of the library this header belongs to. */
#define CP_VERSION_MAJOR 1
/** Minor version of the library this header belongs to. */
#define CP_VERSION_MINOR 2
/** Patch level of the library this header belongs to. */
#define CP_VERSION_PATCH 0
/** The header's version in the encoding of cp_version(). */
#define CP_VERSION (CP_VERSION_MAJOR * 10000 + CP_VERSION_MINOR * 100 + CP_VERSION_PATCH)

/* ------------------------------------------------------------------------ */
/* Status and version                                                       */
/* ------------------------------------------------------------------------ */

/** Result of every fallible call. Values are fixed and never renumbered. */
typedef enum cp_status {
    CP_SUCCESS = 0,                /**< the call did what it says */
    CP_ERROR_INVALID_ARGUMENT = 1, /**< an argument is NULL, out of range or inconsistent */
    CP_ERROR_UNSUPPORTED = 2,      /**< valid, but not supported by this build, backend or shape */
    CP_ERROR_OUT_OF_MEMORY = 3,    /**< host or device allocation failed */
    CP_ERROR_BACKEND = 4,          /**< the device backend reported an error */
    CP_ERROR_COMM = 5,             /**< the transport reported an error */
    CP_ERROR_TIMEOUT = 6,          /**< a peer did not arrive within the group's timeout */
    CP_ERROR_MISMATCH = 7,         /**< ranks disagree (sizes, dtypes, descriptors) */
    CP_ERROR_FORMAT = 8,           /**< malformed serialized data */
    CP_ERROR_IO = 9,               /**< a file operation failed */
    CP_ERROR_NOT_FOUND = 10,       /**< a module, key or file does not exist */
    CP_ERROR_INTERNAL = 11         /**< a bug in the library */
} cp_status;

/**
 * @brief Short English description of a status code.
 * @param s any value; unknown values give "unknown status".
 * @return a static string, never NULL.
 */
const char *cp_status_string(cp_status s);

/**
 * @brief Detail of the calling thread's most recent failure.
 *
 * Each thread has its own message. It is set by every call that fails and
 * left unchanged by calls that succeed.
 * @return a thread-local string, never NULL; empty if no call has failed on
 *         this thread. Valid until the next failing call on this thread.
 */
const char *cp_last_error(void);

/**
 * @brief Version of the loaded library.
 * @return major*10000 + minor*100 + patch, comparable with #CP_VERSION.
 */
unsigned cp_version(void);

/* ------------------------------------------------------------------------ */
/* Element types and devices                                                */
/* ------------------------------------------------------------------------ */

/** Storage type of tensors. */
typedef enum cp_dtype {
    CP_DTYPE_F32 = 0,  /**< IEEE binary32 */
    CP_DTYPE_F16 = 1,  /**< IEEE binary16 */
    CP_DTYPE_BF16 = 2, /**< bfloat16 */
    CP_DTYPE_F64 = 3,  /**< IEEE binary64 (communication and references) */
    /**
     * API 1.2: the OCP 8-bit floating-point format E4M3 ("e4m3fn",
     * PyTorch's torch.float8_e4m3fn): 1 sign bit, 4 exponent bits with bias
     * 7, 3 mantissa bits, subnormals, no infinities; S.1111.111 is NaN, the
     * largest finite value 448. An input type of the attention forward
     * (q, k, v; the output is BF16 or F32), with per-tensor or per-head
     * descales (::cp_attn_args, ::cp_kernel_attn_args); not a type of
     * outputs, gradients or reductions.
     */
    CP_DTYPE_FP8_E4M3 = 4
} cp_dtype;

/** Kind of device a context drives. */
typedef enum cp_device {
    CP_DEVICE_CPU = 0, /**< host memory, the built-in CPU backend */
    CP_DEVICE_CUDA = 1 /**< NVIDIA GPU, the backend-cuda module */
} cp_device;

/* ------------------------------------------------------------------------ */
/* Opaque handles                                                           */
/* ------------------------------------------------------------------------ */

typedef struct cp_context cp_context;     /**< a device (+ stream) kernels run on */
typedef struct cp_topology cp_topology;   /**< rank <-> parallel coordinates */
typedef struct cp_comm cp_comm;           /**< a communicator over some transport */
typedef struct cp_group cp_group;         /**< a context + a CP communicator */
typedef struct cp_attn_plan cp_attn_plan; /**< a planned CP attention */
typedef struct cp_ckpt_meta cp_ckpt_meta; /**< checkpoint CP metadata */

/* ------------------------------------------------------------------------ */
/* Context                                                                  */
/* ------------------------------------------------------------------------ */

/** Configuration of cp_context_create(). Initialise with #CP_CONTEXT_CONFIG_INIT. */
typedef struct cp_context_config {
    size_t struct_size; /**< sizeof(cp_context_config) */
    cp_device device;   /**< #CP_DEVICE_CPU (default) or #CP_DEVICE_CUDA */
    int device_index;   /**< device ordinal; must be 0 for the CPU */
    void *stream;       /**< CUDA: a cudaStream_t (NULL = default stream); CPU: must be NULL */
    int num_threads;    /**< CPU worker threads; 0 = one per online processor */
    /**
     * 1: every backward result (dq, dk, dv) is bitwise reproducible from run
     * to run for the same inputs, device and configuration; 0 (the default):
     * the backend's fastest kernels, which on CUDA add dq with floating-point
     * atomics (same accuracy, last bits vary between runs). The CPU backend
     * is deterministic either way. The environment variable
     * INFINICP_DETERMINISTIC=1 turns it on for every context. Added after
     * the first release: a caller whose struct_size ends before it gets 0.
     */
    int deterministic;
} cp_context_config;

/** Defaults: CPU device 0, no stream, one thread per processor, fastest backward. */
#define CP_CONTEXT_CONFIG_INIT { sizeof(cp_context_config), CP_DEVICE_CPU, 0, NULL, 0, 0 }

/**
 * @brief Create a context on a device.
 * @param cfg configuration; NULL means #CP_CONTEXT_CONFIG_INIT.
 * @param out receives the new context.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a NULL @p out, a bad
 *         struct_size, device, index, stream or thread count;
 *         #CP_ERROR_NOT_FOUND if the backend module for the device is not
 *         installed; #CP_ERROR_BACKEND if the device cannot be opened;
 *         #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_context_create(const cp_context_config *cfg, cp_context **out);

/**
 * @brief Set the stream later work of this context is ordered on.
 * @param ctx the context.
 * @param stream CUDA: a cudaStream_t or NULL for the default stream;
 *        CPU: must be NULL.
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_context_set_stream(cp_context *ctx, void *stream);

/**
 * @brief Wait until all work queued on the context's stream has finished.
 * @param ctx the context.
 * @return #CP_SUCCESS, #CP_ERROR_INVALID_ARGUMENT or #CP_ERROR_BACKEND.
 */
cp_status cp_context_synchronize(cp_context *ctx);

/**
 * @brief Destroy a context. Every group and plan using it must be gone.
 * @param ctx the context, or NULL (no-op).
 */
void cp_context_destroy(cp_context *ctx);

/* ------------------------------------------------------------------------ */
/* Topology                                                                 */
/* ------------------------------------------------------------------------ */

/** Axis bits for cp_topology_group() and cp_topology_color(). */
enum {
    CP_AXIS_TP = 1u << 0,     /**< tensor parallel */
    CP_AXIS_CP = 1u << 1,     /**< the whole CP axis (= CP_A2A | CP_P2P) */
    CP_AXIS_DP = 1u << 2,     /**< data parallel */
    CP_AXIS_PP = 1u << 3,     /**< pipeline parallel */
    CP_AXIS_CP_A2A = 1u << 4, /**< the a2a (inner, consecutive) part of CP */
    CP_AXIS_CP_P2P = 1u << 5  /**< the p2p (outer) part of CP */
};

/** Configuration of cp_topology_create(). Initialise with #CP_TOPOLOGY_CONFIG_INIT. */
typedef struct cp_topology_config {
    size_t struct_size; /**< sizeof(cp_topology_config) */
    int world_size;     /**< number of ranks in the world */
    int tp;             /**< tensor-parallel size */
    int cp;             /**< context-parallel size (= cp_a2a * cp_p2p) */
    int dp;             /**< data-parallel size; 0 = world_size / (tp*cp*pp) */
    int pp;             /**< pipeline-parallel size */
    int cp_a2a;         /**< a2a part of cp (consecutive cp ranks) */
    const char *order;  /**< axis order, fastest first; NULL = "tp-cp-dp-pp" */
} cp_topology_config;

/** Defaults: world 1, all sizes 1 (dp derived), order "tp-cp-dp-pp". */
#define CP_TOPOLOGY_CONFIG_INIT { sizeof(cp_topology_config), 1, 1, 1, 0, 1, 1, "tp-cp-dp-pp" }

/** Coordinates of a rank. cp = cp_a2a + cp_p2p * (a2a size). */
typedef struct cp_coords {
    /** Position along each axis, from 0 to that axis' size - 1. @{ */
    int tp, cp, dp, pp, cp_a2a, cp_p2p;
    /** @} */
} cp_coords;

/**
 * @brief Create a topology: the arithmetic between ranks and their
 *        (tp, cp, dp, pp, cp_a2a, cp_p2p) coordinates. No communication.
 *
 * With the default order "tp-cp-dp-pp", rank = tp + cp*TP + dp*TP*CP +
 * pp*TP*CP*DP (Megatron's layout). Inside CP, cp = cp_a2a + cp_p2p*cp_a2a_size.
 * @param cfg configuration; NULL means #CP_TOPOLOGY_CONFIG_INIT (world of 1).
 * @param out receives the new topology.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a NULL @p out, a bad
 *         struct_size, a size below 1 or not dividing world_size, a product
 *         tp*cp*dp*pp other than world_size, cp_a2a not dividing cp, or an
 *         order that is not a permutation of "tp", "cp", "dp", "pp";
 *         #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_topology_create(const cp_topology_config *cfg, cp_topology **out);

/**
 * @brief Coordinates of a rank.
 * @param t the topology.
 * @param rank a rank in [0, world_size).
 * @param out receives all six coordinates.
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_topology_coords(const cp_topology *t, int rank, cp_coords *out);

/**
 * @brief Rank of a coordinate tuple (the inverse of cp_topology_coords()).
 * @param t the topology.
 * @param c coordinates, each in range; c->cp must equal
 *        c->cp_a2a + c->cp_p2p * (the a2a size).
 * @param rank receives the rank; -1 on failure.
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_topology_rank(const cp_topology *t, const cp_coords *c, int *rank);

/**
 * @brief The ranks that differ from @p rank only along @p axes.
 *
 * The group is sorted ascending, which is the order of its coordinates
 * (the fastest axis varies fastest); a group along one axis is indexed by
 * that coordinate, e.g. a CP group's index is the cp coordinate.
 * @param t the topology.
 * @param rank a rank in [0, world_size).
 * @param axes a union of CP_AXIS_* bits; 0 gives the group {rank}.
 * @param ranks receives the group; may be NULL when @p capacity is 0, to
 *        ask for the size only.
 * @param capacity elements at @p ranks.
 * @param count receives the group size.
 * @param index receives the position of @p rank in the group; may be NULL.
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT (also when @p capacity
 *         is smaller than the group).
 */
cp_status cp_topology_group(const cp_topology *t, int rank, unsigned axes, int *ranks, int capacity,
                            int *count, int *index);

/**
 * @brief Color and key for splitting a world communicator into the groups
 *        of cp_topology_group().
 *
 * Ranks with equal color are exactly one group; key is the rank's index in
 * it, so cp_comm_split() (or MPI_Comm_split) ordered by key reproduces the
 * group's order. Colors are 0 .. (world_size / group size) - 1.
 * @param t the topology.
 * @param rank a rank in [0, world_size).
 * @param axes a union of CP_AXIS_* bits.
 * @param color receives the group number; -1 on failure.
 * @param key receives the index in the group; -1 on failure.
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_topology_color(const cp_topology *t, int rank, unsigned axes, int *color, int *key);

/**
 * @brief Destroy a topology.
 * @param t the topology, or NULL (no-op).
 */
void cp_topology_destroy(cp_topology *t);

/* ------------------------------------------------------------------------ */
/* Sequence layouts                                                         */
/* ------------------------------------------------------------------------ */

/** How a sequence is split across the ranks of a CP group. */
typedef enum cp_layout {
    CP_LAYOUT_CONTIGUOUS = 0, /**< rank r holds [r*S/P, (r+1)*S/P) */
    CP_LAYOUT_ZIGZAG = 1,     /**< rank r holds chunks r and 2P-1-r of 2P */
    CP_LAYOUT_PACKED = 2      /**< API 1.1: one packed row of documents (batch 1) split by a ::cp_pack */
} cp_layout;

/**
 * @brief Global positions of the tokens a CP rank holds, in local order.
 * @param l #CP_LAYOUT_CONTIGUOUS (seq_len % cp_size == 0) or
 *        #CP_LAYOUT_ZIGZAG (seq_len % (2*cp_size) == 0).
 * @param cp_size ranks in the CP group, >= 1.
 * @param cp_rank this rank's index in the CP group.
 * @param seq_len global sequence length, >= 1.
 * @param positions receives seq_len / cp_size positions (8-byte aligned).
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_layout_positions(cp_layout l, int cp_size, int cp_rank, int64_t seq_len, int64_t *positions);

/**
 * @brief Copy a CP rank's share of a [batch, seq_len, token_bytes] tensor.
 *
 * Works for anything per token (inputs, labels, position ids, activations).
 * The copy runs on the context's device; @p global and @p local are memory
 * of that device and must not overlap (#CP_ERROR_INVALID_ARGUMENT).
 * @param ctx the context whose device holds both buffers.
 * @param l the layout, as for cp_layout_positions().
 * @param cp_size ranks in the CP group.
 * @param cp_rank this rank's index in the CP group.
 * @param global the whole tensor, batch * seq_len * token_bytes bytes.
 * @param local receives batch * (seq_len / cp_size) * token_bytes bytes, the
 *        tokens in the order cp_layout_positions() lists them.
 * @param batch number of sequences, >= 1.
 * @param seq_len global sequence length.
 * @param token_bytes bytes per token, >= 1.
 * @return #CP_SUCCESS, #CP_ERROR_INVALID_ARGUMENT or #CP_ERROR_BACKEND.
 */
cp_status cp_layout_shard(cp_context *ctx, cp_layout l, int cp_size, int cp_rank, const void *global,
                          void *local, int64_t batch, int64_t seq_len, size_t token_bytes);

/**
 * @brief Reassemble a sequence from every rank's share (collective over @p g).
 *
 * Each rank passes its share @p local, a [batch, seq_len / P, token_bytes]
 * tensor in layout @p l (as cp_layout_shard() cuts it), and receives the
 * whole [batch, seq_len, token_bytes] tensor in @p global. Both live on the
 * group's context device. Every rank of the group calls it with the same
 * layout and sizes. A rank with a bad argument (but @p g) still takes part
 * before it fails, so the others fail at once with #CP_ERROR_MISMATCH.
 * @param g the CP group (P = its size).
 * @param l #CP_LAYOUT_CONTIGUOUS or #CP_LAYOUT_ZIGZAG.
 * @param local this rank's share, batch * seq_len / P * token_bytes bytes.
 * @param global receives batch * seq_len * token_bytes bytes; must not overlap @p local.
 * @param batch rows, >= 1.
 * @param seq_len GLOBAL sequence length; divisible by P (contiguous) or 2P (zigzag).
 * @param token_bytes bytes per token, >= 1.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a bad argument;
 *         #CP_ERROR_MISMATCH if ranks pass different sizes or another rank
 *         rejected its arguments (the message names it);
 *         #CP_ERROR_TIMEOUT if a rank does not join within the group's timeout;
 *         #CP_ERROR_OUT_OF_MEMORY; #CP_ERROR_BACKEND; #CP_ERROR_COMM.
 */
cp_status cp_layout_gather(cp_group *g, cp_layout l, const void *local, void *global, int64_t batch,
                           int64_t seq_len, size_t token_bytes);

/* ------------------------------------------------------------------------ */
/* Communicators                                                            */
/* ------------------------------------------------------------------------ */

/**
 * @brief Create an in-process world of @p nranks ranks.
 *
 * comms[i] is rank i. Each rank must be driven by its own thread: the
 * collectives of a rank block until every rank of the world has called them
 * (like ncclCommInitAll). Buffers may live in host memory or on any
 * context's device; data moves through that device's backend.
 * @param nranks ranks in the world, 1 to 4096.
 * @param comms array of @p nranks pointers; receives the communicators
 *        (all NULL on failure).
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a NULL @p comms or an
 *         out-of-range @p nranks; #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_comm_create_local(int nranks, cp_comm **comms);

/**
 * @brief Wrap an MPI communicator (collective over it).
 *
 * Loads the transport module `transport-mpi.so` on first use. The library
 * duplicates the communicator, so its traffic never mixes with the
 * caller's; the caller's communicator is not owned and may be freed after
 * this call. Destroy the result before MPI_Finalize. See <infinicp/mpi.h>
 * for the typed wrapper cp_comm_create_mpi_comm(). A rank with a NULL
 * @p out still duplicates, so the others fail at once with
 * #CP_ERROR_MISMATCH instead of waiting in MPI_Comm_dup.
 * @param mpi_comm a pointer to an MPI_Comm, read during the call only.
 * @param out receives the communicator.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for NULL arguments, a
 *         null communicator or MPI not initialised; #CP_ERROR_NOT_FOUND if
 *         the module is not installed; #CP_ERROR_UNSUPPORTED for a module
 *         of another ABI; #CP_ERROR_COMM if MPI fails; #CP_ERROR_MISMATCH if
 *         another rank passed a NULL @p out; #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_comm_create_mpi(void *mpi_comm, cp_comm **out);

/**
 * @brief Split a communicator (collective over @p c).
 *
 * Ranks passing the same non-negative @p color form a new communicator,
 * ordered by (@p key, old rank). A rank passing a negative color takes
 * part in the call but joins none (*out = NULL). Waits at most 5 minutes
 * for the other ranks. A rank with a NULL @p out still takes part before it
 * fails, so the others fail at once with #CP_ERROR_MISMATCH.
 * @param c the communicator.
 * @param color the new group; negative = none.
 * @param key the order inside the new group.
 * @param out receives the new communicator, or NULL.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a NULL argument;
 *         #CP_ERROR_MISMATCH if some rank makes another collective call or
 *         passes a NULL @p out (the message names it);
 *         #CP_ERROR_TIMEOUT; #CP_ERROR_COMM; #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_comm_split(cp_comm *c, int color, int key, cp_comm **out);

/**
 * @brief This rank's index in the communicator.
 * @param c the communicator.
 * @param rank receives the rank (-1 on failure).
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_comm_rank(const cp_comm *c, int *rank);

/**
 * @brief Number of ranks of the communicator.
 * @param c the communicator.
 * @param size receives the size (0 on failure).
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_comm_size(const cp_comm *c, int *size);

/**
 * @brief Destroy this rank's communicator (not collective).
 *
 * Every group using it must be gone. Peers of a local world that still
 * wait for this rank get #CP_ERROR_COMM.
 * @param c the communicator, or NULL (no-op).
 */
void cp_comm_destroy(cp_comm *c);

/**
 * @brief Wrap an NCCL communicator.
 *
 * Loads the CUDA backend module (which carries the NCCL transport) on first
 * use. The communicator is not owned: it must outlive the result, and the
 * library never destroys it (communicators that cp_comm_split() makes from
 * the result are the library's own and are destroyed with them). Buffers
 * passed to collectives on the result must live on a CUDA context; the
 * collectives are queued on that context's stream. See <infinicp/cuda.h>
 * for the typed wrapper cp_comm_create_nccl_comm().
 * @param nccl_comm an initialised ncclComm_t, cast to `void *`.
 * @param out receives the communicator.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for NULL arguments;
 *         #CP_ERROR_NOT_FOUND if the CUDA module or the driver is missing;
 *         #CP_ERROR_UNSUPPORTED if the module was built without NCCL;
 *         #CP_ERROR_COMM if NCCL fails; #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_comm_create_nccl(void *nccl_comm, cp_comm **out);

/** Bytes of an NCCL unique id (NCCL's ncclUniqueId), as cp_nccl_unique_id() makes it (API 1.1). */
#define CP_NCCL_UNIQUE_ID_BYTES 128

/**
 * @brief Make an NCCL unique id, for cp_comm_create_nccl_id() (API 1.1).
 *
 * One rank (rank 0, by convention) calls it and hands the bytes to every
 * rank of the communicator to be, by any means (MPI, a key-value store,
 * a file); each then calls cp_comm_create_nccl_id() with them. The bytes
 * are opaque (ncclGetUniqueId): they hold the address at which this process
 * waits for the ranks to meet. Needs no context and no NCCL headers; loads
 * the CUDA backend module (which carries NCCL) on first use.
 * @param id receives #CP_NCCL_UNIQUE_ID_BYTES bytes; left alone on failure.
 * @param id_bytes the size of @p id: #CP_NCCL_UNIQUE_ID_BYTES (128).
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a NULL @p id or
 *         another @p id_bytes; #CP_ERROR_UNSUPPORTED if the CUDA backend
 *         module is not available, is older than this call, or was built
 *         without NCCL (the message says which and why);
 *         #CP_ERROR_COMM if NCCL fails.
 */
cp_status cp_nccl_unique_id(void *id, size_t id_bytes);

/**
 * @brief Create an NCCL communicator that the library owns (collective
 *        over @p nranks ranks; API 1.1).
 *
 * Every rank passes the same id, made by cp_nccl_unique_id() on one of
 * them, the same @p nranks and its own @p rank; the call returns once all
 * of them have joined (ncclCommInitRank on @p ctx's CUDA device). With NCCL
 * 2.14 and newer it waits at most 5 minutes, then fails with
 * #CP_ERROR_TIMEOUT and aborts the communicator. Unlike
 * cp_comm_create_nccl()'s, the NCCL communicator belongs to the library:
 * cp_comm_destroy() destroys it (waiting at most 5 minutes for its queued
 * work, then aborting it). Otherwise the result is like
 * cp_comm_create_nccl()'s: buffers of its collectives live on a CUDA
 * context, the work is queued on that context's stream, and faults are
 * reported the same way. Needs no NCCL headers.
 * @param ctx a CUDA context: the device of this rank.
 * @param id the #CP_NCCL_UNIQUE_ID_BYTES bytes of cp_nccl_unique_id().
 * @param id_bytes #CP_NCCL_UNIQUE_ID_BYTES (128).
 * @param nranks ranks of the communicator, >= 1.
 * @param rank this rank, 0 to @p nranks - 1.
 * @param out receives the communicator (NULL on failure).
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for NULL arguments,
 *         another @p id_bytes, @p nranks < 1 or @p rank out of range;
 *         #CP_ERROR_UNSUPPORTED for a context that is not a CUDA one, or a
 *         CUDA module older than this call or built without NCCL;
 *         #CP_ERROR_TIMEOUT if the ranks do not all join in time;
 *         #CP_ERROR_COMM if NCCL fails; #CP_ERROR_BACKEND for a CUDA
 *         error; #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_comm_create_nccl_id(cp_context *ctx, const void *id, size_t id_bytes, int nranks, int rank,
                                 cp_comm **out);

/* ------------------------------------------------------------------------ */
/* CP groups                                                                */
/* ------------------------------------------------------------------------ */

/** Configuration of cp_group_create(). Initialise with #CP_GROUP_CONFIG_INIT. */
typedef struct cp_group_config {
    size_t struct_size; /**< sizeof(cp_group_config) */
    int a2a_size;       /**< a2a sub-group size for #CP_MODE_A2A_P2P (consecutive cp ranks) */
    int timeout_ms;     /**< longest wait for a peer before #CP_ERROR_TIMEOUT */
    int num_streams;    /**< compute streams used for overlap (device backends) */
} cp_group_config;

/** Defaults: a2a_size 1, timeout 5 minutes, 2 compute streams. */
#define CP_GROUP_CONFIG_INIT { sizeof(cp_group_config), 1, 300000, 2 }

/**
 * @brief Create a CP group: a context plus the CP communicator (collective
 *        over @p comm).
 *
 * Splits @p comm into the a2a sub-groups (cfg->a2a_size consecutive ranks)
 * and the p2p sub-groups (the ranks with equal rank % a2a_size) that the
 * hybrid mode needs, also when a2a_size is 1. Every rank passes the same
 * a2a_size. A rank with a bad argument (but @p comm) still takes part
 * before it fails, so the others fail at once with #CP_ERROR_MISMATCH.
 * @param ctx the device the group's work runs on; not owned, outlives the group.
 * @param comm the CP communicator; not owned, outlives the group.
 * @param cfg configuration; NULL means #CP_GROUP_CONFIG_INIT.
 * @param out receives the group.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for NULL arguments, a bad
 *         struct_size, an a2a_size that does not divide the communicator
 *         size, timeout_ms <= 0 or num_streams outside [1, 64];
 *         #CP_ERROR_MISMATCH if ranks pass different a2a sizes or another
 *         rank rejected its arguments (the message names it);
 *         #CP_ERROR_TIMEOUT; #CP_ERROR_COMM; #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_group_create(cp_context *ctx, cp_comm *comm, const cp_group_config *cfg, cp_group **out);

/**
 * @brief This rank's index in the group's CP communicator.
 * @param g the group.
 * @param rank receives the rank (-1 on failure).
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_group_rank(const cp_group *g, int *rank);

/**
 * @brief Number of ranks of the group (the CP size).
 * @param g the group.
 * @param size receives the size (0 on failure).
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_group_size(const cp_group *g, int *size);

/**
 * @brief Destroy this rank's group and its sub-communicators (not collective).
 *
 * Every plan using it must be gone. The context and CP communicator stay.
 * @param g the group, or NULL (no-op).
 */
void cp_group_destroy(cp_group *g);

/* ------------------------------------------------------------------------ */
/* CP attention                                                             */
/* ------------------------------------------------------------------------ */

/** How K/V (or Q/K/V) move between the ranks of the CP group. */
typedef enum cp_mode {
    CP_MODE_ALL_GATHER = 0, /**< all-gather K,V; reduce-scatter dK,dV */
    CP_MODE_P2P = 1,        /**< ring: K,V circulate, one hop per step */
    CP_MODE_A2A = 2,        /**< Ulysses: all-to-all sequence <-> heads */
    CP_MODE_A2A_P2P = 3     /**< a2a inside sub-groups, ring across them */
} cp_mode;

/** Attention mask. Causal is always on global positions. */
typedef enum cp_mask {
    CP_MASK_NONE = 0,  /**< every query sees every key */
    CP_MASK_CAUSAL = 1 /**< key j is visible to query i iff j <= i */
} cp_mask;

/** Memory order of q, k, v, out and their gradients. */
typedef enum cp_format {
    CP_FORMAT_BSHD = 0, /**< [batch, seq, heads, dim] */
    CP_FORMAT_SBHD = 1  /**< [seq, batch, heads, dim] */
} cp_format;

/** Describes one CP attention. Initialise with #CP_ATTN_DESC_INIT. */
typedef struct cp_attn_desc {
    size_t struct_size;   /**< sizeof(cp_attn_desc) */
    /**
     * Storage type of q, k, v, out and gradients. Since 1.2
     * #CP_DTYPE_FP8_E4M3 makes an FP8 plan: q, k, v are FP8 (scaled by the
     * descales of ::cp_attn_args), out is #CP_DTYPE_BF16, lse F32; such a
     * plan is forward only (its backward is #CP_ERROR_UNSUPPORTED).
     */
    cp_dtype dtype;
    cp_format format;     /**< memory order */
    int64_t batch;        /**< batch size */
    int64_t seq_len;      /**< GLOBAL sequence length (all ranks together) */
    int32_t num_heads;    /**< query heads */
    int32_t num_kv_heads; /**< key/value heads (divides num_heads; GQA when smaller) */
    int32_t head_dim;     /**< q/k head dimension */
    int32_t head_dim_v;   /**< v/out head dimension; 0 = head_dim */
    cp_mask mask;         /**< #CP_MASK_CAUSAL or #CP_MASK_NONE */
    double softmax_scale; /**< 0 = 1/sqrt(head_dim); |scale| <= 3e38 / log2(e) = 2.0794415416798361e+38 */
    cp_layout layout;     /**< how the sequence is split */
    cp_mode mode;         /**< communication scheme */
    /* API 1.1 (a 1.0 caller's smaller struct_size leaves each 0 = off) */
    /**
     * Sliding window: 0 = none; W >= 1: with #CP_MASK_CAUSAL key j is visible
     * to query i iff i - W < j <= i, with #CP_MASK_NONE iff |i - j| < W
     * (positions in the sequence, or in the packed row).
     */
    int64_t window;
    /** Logit softcap: 0 = none; c > 0: every score s becomes c * tanh(s / c) before the mask and softmax. */
    double softcap;
    /**
     * Attention sinks: 0 = none; 1 = one learned logit per query head
     * (::cp_attn_args.sinks) joins the softmax denominator of every row of
     * its head; it has no value, so it only scales the row's output down.
     * The LSE includes it: lse_i = log(sum_j exp(s_ij) + exp(sink_h)).
     */
    int sinks;
} cp_attn_desc;

/** Defaults: F32, BSHD, no shape, causal, scale 1/sqrt(d), contiguous, p2p, no window, softcap or sinks. */
#define CP_ATTN_DESC_INIT                                                          \
    { sizeof(cp_attn_desc), CP_DTYPE_F32, CP_FORMAT_BSHD, 0, 0, 0, 0, 0, 0,          \
      CP_MASK_CAUSAL, 0.0, CP_LAYOUT_CONTIGUOUS, CP_MODE_P2P, 0, 0.0, 0 }

/**
 * @brief Plan a CP attention on a group (collective).
 *
 * Every rank of @p g calls it with the same descriptor; ranks that disagree
 * all get #CP_ERROR_MISMATCH, and so do the others when one rank rejects
 * its own arguments (that rank gets its own error).
 * @param g the CP group; it and its context must outlive the plan.
 * @param desc the attention; see ::cp_attn_desc.
 * @param out receives the plan; NULL on failure.
 * @return #CP_SUCCESS, #CP_ERROR_INVALID_ARGUMENT, #CP_ERROR_UNSUPPORTED (F64,
 *         heads that an a2a mode cannot split, or FP8 on a backend without
 *         FP8 kernels), #CP_ERROR_MISMATCH, #CP_ERROR_TIMEOUT, #CP_ERROR_COMM
 *         or #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_attn_plan_create(cp_group *g, const cp_attn_desc *desc, cp_attn_plan **out);

/**
 * @brief Exact workspace bytes of cp_attn_forward() and cp_attn_backward().
 *
 * O(tokens per rank), never O(seq_len^2).
 * @param p the plan.
 * @param forward receives the forward size, or NULL.
 * @param backward receives the backward size, or NULL (not both NULL).
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_attn_workspace_size(const cp_attn_plan *p, size_t *forward, size_t *backward);

/**
 * @brief CP attention forward (collective over the plan's group).
 *
 * Tensors hold this rank's tokens (seq_len / P per sample, in the layout's
 * order), dense in the descriptor's format and dtype, on the plan's device,
 * each aligned to its elements; an FP8 plan's out is BF16 and its descales
 * are all 1 here (cp_attn_forward_ex() takes others). A rank with a bad argument (but @p p) still
 * takes part before it fails, so the others fail at once with
 * #CP_ERROR_MISMATCH naming it, and the next call pairs up as usual.
 * @param p the plan.
 * @param q queries [batch, T, num_heads, head_dim] (BSHD; SBHD swaps batch and T).
 * @param k keys [batch, T, num_kv_heads, head_dim].
 * @param v values [batch, T, num_kv_heads, head_dim_v].
 * @param out receives the output [batch, T, num_heads, head_dim_v].
 * @param lse receives the log-sum-exp, fp32 [batch, num_heads, T].
 * @param workspace device memory of at least the forward workspace size,
 *        aligned to 16 bytes, or NULL to let the plan allocate (and keep)
 *        its own, of the size this call needs (a later backward grows it).
 * @param workspace_bytes bytes at @p workspace.
 * @return #CP_SUCCESS, #CP_ERROR_INVALID_ARGUMENT, #CP_ERROR_MISMATCH
 *         (another rank rejected its arguments, or sizes differ),
 *         #CP_ERROR_TIMEOUT, #CP_ERROR_COMM, #CP_ERROR_BACKEND or
 *         #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_attn_forward(cp_attn_plan *p, const void *q, const void *k, const void *v, void *out,
                          float *lse, void *workspace, size_t workspace_bytes);

/**
 * @brief CP attention backward (collective over the plan's group).
 * @param p the plan.
 * @param q the forward's queries.
 * @param k the forward's keys.
 * @param v the forward's values.
 * @param out the forward's output.
 * @param lse the forward's log-sum-exp.
 * @param dout gradient of the loss with respect to @p out.
 * @param dq receives the gradient for @p q.
 * @param dk receives the gradient for @p k (summed over all ranks' queries).
 * @param dv receives the gradient for @p v.
 * @param workspace device memory of at least the backward workspace size,
 *        aligned to 16 bytes, or NULL.
 * @param workspace_bytes bytes at @p workspace.
 * @return as cp_attn_forward(); #CP_ERROR_UNSUPPORTED for an FP8 plan
 *         (forward only), after taking part in the call like any rank with
 *         a bad argument.
 */
cp_status cp_attn_backward(cp_attn_plan *p, const void *q, const void *k, const void *v,
                           const void *out, const float *lse, const void *dout,
                           void *dq, void *dk, void *dv, void *workspace, size_t workspace_bytes);

/* ------------------------------------------------------------------------ */
/* Packed documents (API 1.1)                                               */
/* ------------------------------------------------------------------------ */

/** How a ::cp_pack splits a packed row of documents across the CP group. */
typedef enum cp_balance {
    CP_BALANCE_AUTO = 0,       /**< the library's best for the config (GREEDY or CONTIGUOUS) */
    CP_BALANCE_DOC_ZIGZAG = 1, /**< each document cut in 2P chunks, rank r takes r and 2P-1-r (every length % 2P == 0) */
    CP_BALANCE_GREEDY = 2,     /**< chunks of `chunk` tokens assigned to even out the work, documents kept on few ranks */
    CP_BALANCE_CONTIGUOUS = 3  /**< rank r takes tokens [r T/P, (r+1) T/P) */
} cp_balance;

/** The split of one packed row: host only, no communication, deterministic. */
typedef struct cp_pack cp_pack;

/** Configuration of cp_pack_create(). Initialise with #CP_PACK_CONFIG_INIT. */
typedef struct cp_pack_config {
    size_t struct_size;         /**< sizeof(cp_pack_config) */
    int cp_size;                /**< P, the CP group size */
    const int64_t *cu_seqlens;  /**< num_seqs + 1 offsets: 0 = cu[0] < cu[1] < ... < cu[num_seqs] = T */
    int num_seqs;               /**< documents in the row (>= 1) */
    cp_mask mask;               /**< the attention the split balances for */
    int64_t window;             /**< its sliding window (0 = none) */
    cp_balance balance;         /**< the policy */
    int64_t chunk;              /**< GREEDY granularity in tokens; 0 = the library's choice */
} cp_pack_config;

/** Defaults: no documents, causal, no window, #CP_BALANCE_AUTO, chunk chosen by the library. */
#define CP_PACK_CONFIG_INIT { sizeof(cp_pack_config), 0, NULL, 0, CP_MASK_CAUSAL, 0, CP_BALANCE_AUTO, 0 }

/**
 * @brief Split a packed row of documents across a CP group (API 1.1).
 *
 * Every rank gets exactly T / P tokens (T % P == 0 is required). Its local
 * order (cp_pack_positions()) lists first the pieces of documents that
 * other ranks hold parts of, then the documents wholly on the rank, each
 * group along the row: the ring then never moves a document no other rank
 * needs. Equal configurations give equal splits on every rank and every
 * run. Host only; no communication.
 * @param cfg the documents and the policy; see ::cp_pack_config.
 * @param out receives the pack; NULL on failure.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT naming the field (NULL
 *         pointers, bad struct_size, cp_size < 1, cu_seqlens not strictly
 *         increasing from 0, T % P != 0, a chunk that does not divide T / P,
 *         DOC_ZIGZAG with a length that is not a multiple of 2P);
 *         #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_pack_create(const cp_pack_config *cfg, cp_pack **out);

/**
 * @brief Where a rank's tokens sit (API 1.1).
 * @param pk the pack.
 * @param cp_rank the rank, 0 <= cp_rank < P.
 * @param positions receives the T / P packed-row indices of the rank's
 *        tokens in local order, or NULL.
 * @param doc_positions receives each token's position inside its document
 *        (for RoPE), or NULL.
 * @param doc_ids receives each token's document index, or NULL (not all three NULL).
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_pack_positions(const cp_pack *pk, int cp_rank, int64_t *positions, int64_t *doc_positions,
                            int32_t *doc_ids);

/**
 * @brief The attention work of a rank's queries (API 1.1).
 *
 * The number of visible (query, key) pairs of the rank's queries under the
 * pack's mask and window, inside their documents: what the balance evens out.
 * @param pk the pack.
 * @param cp_rank the rank.
 * @param pairs receives the count (exact up to 2^53).
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_pack_work(const cp_pack *pk, int cp_rank, double *pairs);

/**
 * @brief Copy a rank's tokens out of the whole packed row (API 1.1).
 * @param ctx the context whose device holds both buffers.
 * @param pk the pack.
 * @param cp_rank the rank.
 * @param global the whole row, T tokens of @p token_bytes each.
 * @param local receives the rank's T / P tokens in local order.
 * @param token_bytes bytes per token (heads x dim x element size), > 0.
 * @return #CP_SUCCESS, #CP_ERROR_INVALID_ARGUMENT or #CP_ERROR_BACKEND.
 */
cp_status cp_pack_shard(cp_context *ctx, const cp_pack *pk, int cp_rank, const void *global, void *local,
                        size_t token_bytes);

/**
 * @brief Gather the whole packed row from every rank's share (collective, API 1.1).
 * @param g the CP group (its size is the pack's P).
 * @param pk the pack, the same on every rank.
 * @param local this rank's T / P tokens in local order.
 * @param global receives the whole row, T tokens.
 * @param token_bytes bytes per token, > 0, the same on every rank.
 * @return #CP_SUCCESS, #CP_ERROR_INVALID_ARGUMENT, #CP_ERROR_MISMATCH,
 *         #CP_ERROR_TIMEOUT, #CP_ERROR_COMM or #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_pack_gather(cp_group *g, const cp_pack *pk, const void *local, void *global, size_t token_bytes);

/**
 * @brief Destroy a pack.
 * @param pk the pack, or NULL (no-op).
 */
void cp_pack_destroy(cp_pack *pk);

/**
 * Extra arguments of cp_attn_forward_ex() and cp_attn_backward_ex().
 * Initialise with #CP_ATTN_ARGS_INIT.
 */
typedef struct cp_attn_args {
    size_t struct_size;     /**< sizeof(cp_attn_args) */
    const cp_pack *pack;    /**< required with #CP_LAYOUT_PACKED (its P and T those of the plan), else NULL */
    const float *sinks;     /**< desc.sinks = 1: [num_heads] logits on the plan's device; else NULL */
    float *dsinks;          /**< backward with sinks: receives this rank's [num_heads] share of the gradient */
    void *workspace;        /**< as in cp_attn_forward(); NULL = the plan's own */
    size_t workspace_bytes; /**< bytes at @c workspace */
    /* API 1.2 (a 1.1 caller's smaller struct_size leaves each NULL / 0) */
    /**
     * FP8 plans only (desc.dtype = #CP_DTYPE_FP8_E4M3), forward only: the
     * dequantisation scale of q; NULL = 1. The value of a stored element is
     * its decoded FP8 value times the descale. On the plan's device; one
     * float, or with @c descale_per_head = 1 one per query head. These are
     * the scales of the whole tensor (GLOBAL head indices, not a rank's
     * slice): every rank passes equal values. Set with any other dtype:
     * #CP_ERROR_INVALID_ARGUMENT.
     */
    const float *q_descale;
    /** As @c q_descale for k: one float, or one per kv head (num_kv_heads). */
    const float *k_descale;
    /** As @c q_descale for v: one float, or one per kv head (num_kv_heads). */
    const float *v_descale;
    /** 0: each descale points to one float (per tensor); 1: to one per head (q: num_heads, k, v: num_kv_heads). */
    int descale_per_head;
} cp_attn_args;

/** Zero-initialises every field but struct_size. */
#define CP_ATTN_ARGS_INIT { sizeof(cp_attn_args), NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0 }

/**
 * @brief CP attention forward with a pack and sinks (collective, API 1.1).
 *
 * As cp_attn_forward(); @p x carries what API 1.1 adds, and since 1.2 the
 * descales of an FP8 plan (q, k, v in #CP_DTYPE_FP8_E4M3, out in BF16).
 * Ranks passing different packs all get #CP_ERROR_MISMATCH.
 * @param p the plan.
 * @param q queries (see cp_attn_forward()).
 * @param k keys.
 * @param v values.
 * @param out receives the output.
 * @param lse receives the log-sum-exp (it includes the sink).
 * @param x the pack, sinks, descales and workspace; NULL = #CP_ATTN_ARGS_INIT.
 * @return as cp_attn_forward(); #CP_ERROR_INVALID_ARGUMENT also for descales
 *         with a plan that is not FP8.
 */
cp_status cp_attn_forward_ex(cp_attn_plan *p, const void *q, const void *k, const void *v, void *out,
                             float *lse, const cp_attn_args *x);

/**
 * @brief CP attention backward with a pack and sinks (collective, API 1.1).
 *
 * As cp_attn_backward(). With sinks, x->dsinks receives the gradient of the
 * sinks from this rank's queries; summing it over the group is
 * cp_grad_all_reduce()'s job, as for any replicated parameter. An FP8 plan
 * has no backward: #CP_ERROR_UNSUPPORTED naming the dtype (since 1.2), after
 * taking part in the call like any rank with a bad argument.
 * @param p the plan.
 * @param q the forward's queries.
 * @param k the forward's keys.
 * @param v the forward's values.
 * @param out the forward's output.
 * @param lse the forward's log-sum-exp.
 * @param dout gradient of the loss with respect to @p out.
 * @param dq receives the gradient for @p q.
 * @param dk receives the gradient for @p k.
 * @param dv receives the gradient for @p v.
 * @param x the pack, sinks, dsinks and workspace; NULL = #CP_ATTN_ARGS_INIT.
 * @return as cp_attn_forward().
 */
cp_status cp_attn_backward_ex(cp_attn_plan *p, const void *q, const void *k, const void *v,
                              const void *out, const float *lse, const void *dout,
                              void *dq, void *dk, void *dv, const cp_attn_args *x);

/**
 * @brief Destroy a plan and the workspace it allocated.
 * @param p the plan, or NULL (no-op).
 */
void cp_attn_plan_destroy(cp_attn_plan *p);

/* ------------------------------------------------------------------------ */
/* Single-device kernels                                                    */
/* ------------------------------------------------------------------------ */

/**
 * A rectangle of a block (API 1.1): query rows [q_row, q_row + q_len)
 * against key rows [k_row, k_row + k_len), whose first rows sit at
 * positions q_pos and k_pos (the mask and window compare positions).
 */
typedef struct cp_attn_rect {
    int64_t q_row; /**< first query row of the block */
    int64_t q_len; /**< query rows */
    int64_t k_row; /**< first key row of the block */
    int64_t k_len; /**< key rows */
    int64_t q_pos; /**< position of query row q_row */
    int64_t k_pos; /**< position of key row k_row */
} cp_attn_rect;

/**
 * Arguments of cp_kernel_attn_forward() and cp_kernel_attn_backward():
 * attention of one Q block (seq_q rows) against one K/V block (seq_k rows).
 *
 * Tensor element (b, s, h, d) of X lives at X + b*X_stride_b + s*X_stride_s
 * + h*X_stride_h + d (strides in elements of that tensor's type; the last
 * dimension is dense). If all three strides of a tensor are 0 they are
 * derived from @c format as a dense tensor of this block's shape.
 * LSE element (b, h, s) lives at lse + b*lse_stride_b + h*lse_stride_h + s;
 * all-zero LSE strides mean dense [batch, num_heads, seq_q]. An output may
 * not overlap itself: a zero stride along a dimension of more than one
 * element is #CP_ERROR_INVALID_ARGUMENT.
 */
typedef struct cp_kernel_attn_args {
    size_t struct_size;    /**< sizeof(cp_kernel_attn_args) */
    cp_dtype dtype;        /**< storage type of q, k, v (and dout); #CP_DTYPE_FP8_E4M3 forward only (since 1.2) */
    cp_format format;      /**< only used to derive zero strides */
    int64_t batch;         /**< batch size */
    int32_t num_heads;     /**< query heads */
    int32_t num_kv_heads;  /**< key/value heads; query head h uses kv head h / (num_heads/num_kv_heads) */
    int32_t head_dim;      /**< q/k head dimension */
    int32_t head_dim_v;    /**< v/o head dimension; 0 = head_dim */
    int64_t seq_q;         /**< query rows in this block */
    int64_t seq_k;         /**< key rows in this block */
    int64_t q_offset;      /**< global position of the first query row */
    int64_t k_offset;      /**< global position of the first key row */
    cp_mask mask;          /**< causal on global positions, or none */
    double softmax_scale;  /**< 0 = 1/sqrt(head_dim); |scale| <= 3e38 / log2(e) = 2.0794415416798361e+38 */

    /** Query block and its strides. @{ */
    const void *q; int64_t q_stride_b, q_stride_s, q_stride_h;
    /** @} */
    /** Key block and its strides. @{ */
    const void *k; int64_t k_stride_b, k_stride_s, k_stride_h;
    /** @} */
    /** Value block and its strides. @{ */
    const void *v; int64_t v_stride_b, v_stride_s, v_stride_h;
    /** @} */
    /** forward: output; backward: the final forward output; and its strides. @{ */
    void *o; int64_t o_stride_b, o_stride_s, o_stride_h;
    /** @} */
    cp_dtype o_dtype;      /**< type of o: dtype or #CP_DTYPE_F32; with FP8 q, k, v: #CP_DTYPE_BF16 or #CP_DTYPE_F32 */
    /** forward: output; backward: the final log-sum-exp (natural log); and its strides. @{ */
    float *lse; int64_t lse_stride_b, lse_stride_h;
    /** @} */
    /**
     * forward only: 0 = overwrite (o, lse); 1 = (o, lse) hold a partial
     * result over other keys (keep o in F32 for full precision; an empty
     * one is o = 0, lse = -inf) and this block is merged into it.
     */
    int accumulate;

    /* backward only */
    /** backward: gradient of the output (type as o) and its strides. @{ */
    const void *dout; int64_t dout_stride_b, dout_stride_s, dout_stride_h;
    /** @} */
    /** backward: gradient of q (output) and its strides. @{ */
    void *dq; int64_t dq_stride_b, dq_stride_s, dq_stride_h;
    /** @} */
    /** backward: gradient of k (output) and its strides. @{ */
    void *dk; int64_t dk_stride_b, dk_stride_s, dk_stride_h;
    /** @} */
    /** backward: gradient of v (output) and its strides. @{ */
    void *dv; int64_t dv_stride_b, dv_stride_s, dv_stride_h;
    /** @} */
    cp_dtype grad_dtype;   /**< type of dq, dk, dv: dtype or #CP_DTYPE_F32 */
    int grad_accumulate;   /**< 0 = overwrite dq, dk, dv; 1 = add into them */

    /** scratch on the context's device; NULL = the kernel allocates its own */
    void *workspace;
    size_t workspace_bytes; /**< bytes at @c workspace */

    /**
     * forward with @c accumulate only, optional: the low part of the running
     * log-sum-exp, laid out like @c lse. With it the running value is the
     * pair lse + lse_lo (lse stays the correctly rounded float, lse_lo the
     * rounding residual), so a chain of merges rounds once instead of once
     * per merge. Start it at 0 next to lse = -inf. NULL: plain float lse.
     */
    float *lse_lo;

    /**
     * backward only, optional: rowsum(dout * o) of every query row (F32,
     * laid out like @c lse, with lse's strides). The backward needs it for
     * every call and it depends on the query rows only, so a caller that
     * runs the same rows against several key blocks (a CP ring) computes it
     * once: with @c drow_ready = 0 the kernel stores the rowsums it
     * computes here; with 1 it reads them from here instead. NULL: computed
     * by every call. A backend may ignore both fields (it then always
     * computes, and with 0 may leave drow unwritten), so only pass 1 for
     * rows that an earlier call on the same context's backend stored.
     */
    float *drow;
    int drow_ready; /**< 0: store into @c drow; 1: read from it (needs drow) */

    /* API 1.1: a backend that does not understand these answers
     * #CP_ERROR_UNSUPPORTED naming the field when one is set. */
    /** Sliding window on positions, as ::cp_attn_desc.window (0 = none). */
    int64_t window;
    /** Logit softcap, as ::cp_attn_desc.softcap (0 = none). */
    double softcap;
    /**
     * Optional rectangles (NULL = none: q_offset / k_offset as above). With
     * them the call attends query rows [q_row, q_row + q_len) to key rows
     * [k_row, k_row + k_len) of each rectangle, mask and window applied to
     * positions q_pos + i and k_pos + j; a query row in several rectangles
     * gets the merged result of all of them, one in none O = 0 and
     * LSE = -inf (or is left as it was with accumulate); q_offset and
     * k_offset are not used. One call covers a whole packed block. Host
     * memory, read during the call: the caller may reuse it once the call
     * returns, even while the kernel is still queued.
     */
    const cp_attn_rect *rects;
    int64_t num_rects; /**< entries at @c rects (0 with rects = NULL) */

    /* API 1.2: a backend that does not understand these answers
     * #CP_ERROR_UNSUPPORTED naming the field when one is set or @c dtype is
     * #CP_DTYPE_FP8_E4M3. */
    /**
     * Forward with @c dtype = #CP_DTYPE_FP8_E4M3 only: the dequantisation
     * scale of q, NULL = 1 (a stored element's value is its decoded FP8
     * value times the descale); memory of the context's device (host memory
     * on a CPU context). One float, or with @c descale_per_head = 1 one per
     * query head of this call (num_heads). Set with another dtype:
     * #CP_ERROR_INVALID_ARGUMENT.
     */
    const float *q_descale;
    /** As @c q_descale for k: one float, or one per kv head (num_kv_heads). */
    const float *k_descale;
    /** As @c q_descale for v: one float, or one per kv head (num_kv_heads). */
    const float *v_descale;
    /**
     * 0: each descale points to one float; 1: q_descale to num_heads floats,
     * k_descale and v_descale to num_kv_heads.
     */
    int descale_per_head;
} cp_kernel_attn_args;

/** Zero every field but struct_size, without -Wmissing-field-initializers (helper of the *_INIT macros). */
#ifdef __cplusplus
#define CP_INIT_SIZED_(T) ([] { T x_ = T(); x_.struct_size = sizeof(T); return x_; }())
#else
#define CP_INIT_SIZED_(T) { .struct_size = sizeof(T) }
#endif

/** Zero-initialises every field but struct_size. */
#define CP_KERNEL_ATTN_ARGS_INIT CP_INIT_SIZED_(cp_kernel_attn_args)

/**
 * Arguments of cp_kernel_merge(): (o, lse) <- merge((o, lse), (o_part, lse_part))
 * for partial attention results over disjoint key sets. Layout as in
 * ::cp_kernel_attn_args (o and o_part may have different strides).
 */
typedef struct cp_kernel_merge_args {
    size_t struct_size;  /**< sizeof(cp_kernel_merge_args) */
    cp_format format;    /**< only used to derive zero strides */
    int64_t batch;       /**< batch size */
    int64_t seq;         /**< rows */
    int32_t num_heads;   /**< heads */
    int32_t head_dim_v;  /**< values per head */
    /** Partial result merged into (input and output) and its strides. @{ */
    void *o; int64_t o_stride_b, o_stride_s, o_stride_h;
    /** @} */
    cp_dtype o_dtype;    /**< type of o (F32 keeps full precision) */
    /** Log-sum-exp of o (input and output) and its strides. @{ */
    float *lse; int64_t lse_stride_b, lse_stride_h;
    /** @} */
    /** The other partial result and its strides. @{ */
    const void *o_part; int64_t o_part_stride_b, o_part_stride_s, o_part_stride_h;
    /** @} */
    cp_dtype o_part_dtype; /**< type of o_part */
    /** Log-sum-exp of o_part and its strides. @{ */
    const float *lse_part; int64_t lse_part_stride_b, lse_part_stride_h;
    /** @} */
} cp_kernel_merge_args;

/** Zero-initialises every field but struct_size. */
#define CP_KERNEL_MERGE_ARGS_INIT CP_INIT_SIZED_(cp_kernel_merge_args)

/**
 * @brief Attention of one Q block against one K/V block (forward).
 *
 * Writes O = softmax(scale * Q K^T + mask) V and the natural-log LSE of every
 * query row, or with @c a->accumulate = 1 merges this block into the partial
 * result already in (o, lse). The causal mask compares global positions
 * (key k_offset + j is visible to query q_offset + i iff k_offset + j <=
 * q_offset + i); GQA maps query head h to kv head h / (num_heads /
 * num_kv_heads). Storage types F32, F16, BF16, and since 1.2
 * #CP_DTYPE_FP8_E4M3 (o in BF16 or F32; scores scale * q_descale *
 * k_descale * Q K^T, O = v_descale * P V); all arithmetic in fp32. A row
 * that sees no key gets O = 0 and LSE = -inf and, when accumulating, leaves
 * (o, lse) exactly as they were.
 * @param ctx the context the tensors live on.
 * @param a the arguments; see ::cp_kernel_attn_args.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a NULL, out-of-range or
 *         inconsistent argument (including a workspace smaller than
 *         cp_kernel_attn_workspace_size() reports, descales with a dtype
 *         other than FP8, or an FP8 call's o_dtype other than BF16 or F32);
 *         #CP_ERROR_UNSUPPORTED for F64 storage, or a window, softcap,
 *         rectangle list, FP8 dtype or descale the context's backend does not
 *         understand (the message names the field);
 *         #CP_ERROR_OUT_OF_MEMORY; #CP_ERROR_BACKEND.
 */
cp_status cp_kernel_attn_forward(cp_context *ctx, const cp_kernel_attn_args *a);

/**
 * @brief Gradients of one block's attention (backward).
 *
 * From q, k, v, the final forward output o and LSE, and dout, recomputes the
 * probabilities and writes (or with @c a->grad_accumulate = 1 adds) dq, dk,
 * dv, in @c a->grad_dtype. D = rowsum(dout * o) is computed by the call.
 * Storage types F32, F16, BF16: #CP_DTYPE_FP8_E4M3 is forward only
 * (#CP_ERROR_UNSUPPORTED naming a->dtype, since 1.2).
 * @param ctx the context the tensors live on.
 * @param a the arguments; see ::cp_kernel_attn_args.
 * @return as cp_kernel_attn_forward().
 */
cp_status cp_kernel_attn_backward(cp_context *ctx, const cp_kernel_attn_args *a);

/**
 * @brief Exact scratch size of cp_kernel_attn_forward() or
 *        cp_kernel_attn_backward() for these arguments on this context.
 *
 * Only shapes, types and strides are read; data pointers may be NULL. The size
 * never grows with seq_q * seq_k.
 * @param ctx the context (the CPU backend's size depends on its threads).
 * @param a the arguments the kernel will be called with.
 * @param backward 0 for the forward, 1 for the backward.
 * @param bytes receives the size; 0 on failure.
 * @return #CP_SUCCESS, #CP_ERROR_INVALID_ARGUMENT, or #CP_ERROR_UNSUPPORTED
 *         for a window, softcap, rectangle list or FP8 dtype the backend
 *         does not understand, or an FP8 dtype with @p backward = 1.
 */
cp_status cp_kernel_attn_workspace_size(cp_context *ctx, const cp_kernel_attn_args *a, int backward,
                                        size_t *bytes);

/**
 * @brief (o, lse) <- merge((o, lse), (o_part, lse_part)) for partial results
 *        over disjoint key sets.
 *
 * lse = m + log(exp(lse - m) + exp(lse_part - m)) with m the larger of the
 * two, o = exp(lse_old - lse) o + exp(lse_part - lse) o_part, in fp32. A part
 * with LSE -inf leaves the row unchanged, bit for bit.
 * @param ctx the context the tensors live on.
 * @param a the arguments; see ::cp_kernel_merge_args.
 * @return #CP_SUCCESS, #CP_ERROR_INVALID_ARGUMENT (also for
 *         #CP_DTYPE_FP8_E4M3, which is no type of results),
 *         #CP_ERROR_UNSUPPORTED (F64), #CP_ERROR_OUT_OF_MEMORY or
 *         #CP_ERROR_BACKEND.
 */
cp_status cp_kernel_merge(cp_context *ctx, const cp_kernel_merge_args *a);

/* ------------------------------------------------------------------------ */
/* Training helpers                                                         */
/* ------------------------------------------------------------------------ */

/**
 * @brief Reduce a per-rank (loss sum, token count) pair to the global mean
 *        loss (collective over @p comm).
 *
 * Under CP each rank holds a slice of every sequence, so its own mean loss
 * is not the model's loss: the global mean is the sum of all ranks' loss
 * sums over the sum of their token counts. Pass the CP communicator for the
 * loss of one DP replica, or the DPxCP communicator (see
 * cp_topology_color()) for the loss of the whole global batch. Both numbers
 * are summed in double precision, so the result does not depend on how the
 * tokens are split. Every rank takes part even with a bad argument, so that
 * its peers fail at once instead of waiting for it.
 * @param ctx the context whose device the three-number exchange goes
 *        through; NULL = host memory (enough for the local and MPI
 *        transports; a transport that moves only device memory needs the
 *        device's context).
 * @param comm the communicator.
 * @param loss_sum this rank's summed (not averaged) loss; a NaN or infinity
 *        propagates to @p mean on every rank.
 * @param tokens the number of tokens @p loss_sum covers, in [0, 2^53].
 * @param mean receives the global mean loss: 0 when no rank has tokens.
 * @param total_tokens receives the global token count (the divisor the
 *        backward pass scales the loss gradient by); may be NULL.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a NULL @p comm or
 *         @p mean, a token count out of range or a total over 2^53;
 *         #CP_ERROR_MISMATCH on the ranks whose own arguments were valid
 *         when another rank's were not; #CP_ERROR_TIMEOUT, #CP_ERROR_COMM,
 *         #CP_ERROR_BACKEND or #CP_ERROR_OUT_OF_MEMORY. On failure
 *         @p *mean is NaN and @p *total_tokens is 0.
 */
cp_status cp_loss_reduce(cp_context *ctx, cp_comm *comm, double loss_sum, int64_t tokens, double *mean,
                         int64_t *total_tokens);

/** How cp_grad_all_reduce() combines the ranks' gradients. */
typedef enum cp_grad_reduce {
    CP_GRAD_SUM = 0,    /**< the sum over ranks */
    CP_GRAD_AVERAGE = 1 /**< the sum divided by the communicator size */
} cp_grad_reduce;

/** Bucket size cp_grad_all_reduce() uses when its bucket_bytes is 0: 4 MiB. */
#define CP_GRAD_BUCKET_BYTES_DEFAULT ((size_t)4 << 20)

/**
 * @brief All-reduce a gradient buffer in place, bucket by bucket
 *        (collective over @p comm).
 *
 * Parameters that are replicated over data and context parallelism get a
 * partial gradient on every rank of their DPxCP group (each rank saw other
 * tokens); the sum over that group is the full gradient. Make the group's
 * communicator with cp_topology_color(t, rank, CP_AXIS_DP | CP_AXIS_CP, ...)
 * and cp_comm_split() (or MPI_Comm_split()).
 *
 * The buffer is reduced in consecutive buckets of @p bucket_bytes, one
 * all-reduce each, so the only memory taken besides the buffer is
 * O(bucket): for F16 and BF16 a bucket is widened to F32, summed in F32
 * over the ranks and rounded back once, whatever the transport does with
 * 16-bit types; F32 and F64 buckets are summed in their own type, in place.
 * #CP_GRAD_AVERAGE divides the sum by the communicator size before that
 * rounding (on a device other than the CPU through a host copy of the
 * bucket). Every rank passes the same count, dtype, op and bucket size;
 * they are compared first, so ranks that disagree fail with
 * #CP_ERROR_MISMATCH instead of waiting for each other.
 * @param ctx the context whose device holds @p grad; NULL = host memory.
 * @param comm the communicator.
 * @param grad @p count elements of @p dtype, replaced by the reduction.
 * @param count elements; 0 still takes part in the comparison.
 * @param dtype #CP_DTYPE_F32, #CP_DTYPE_BF16, #CP_DTYPE_F16 or #CP_DTYPE_F64
 *        (#CP_DTYPE_FP8_E4M3 is no gradient type: #CP_ERROR_INVALID_ARGUMENT).
 * @param op #CP_GRAD_SUM or #CP_GRAD_AVERAGE.
 * @param bucket_bytes bytes of @p grad per all-reduce, at least one
 *        element; 0 = #CP_GRAD_BUCKET_BYTES_DEFAULT.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a NULL @p comm, a
 *         NULL @p grad with a non-zero count, a bad dtype or op, a bucket
 *         smaller than one element or a count whose bytes overflow;
 *         #CP_ERROR_MISMATCH when ranks pass different arguments (or
 *         another rank's were invalid); #CP_ERROR_TIMEOUT, #CP_ERROR_COMM,
 *         #CP_ERROR_BACKEND or #CP_ERROR_OUT_OF_MEMORY. After a failure
 *         during the reduction the buffer's content is unspecified.
 */
cp_status cp_grad_all_reduce(cp_context *ctx, cp_comm *comm, void *grad, size_t count, cp_dtype dtype,
                             cp_grad_reduce op, size_t bucket_bytes);

/** Flag of cp_stage_shape(): the sequence is split over TP too (Megatron's sequence parallelism). */
#define CP_STAGE_SEQUENCE_PARALLEL 1u

/**
 * @brief Tokens of one sequence that each rank holds under CP.
 *
 * seq_len / cp, where the layout requires seq_len to be a multiple of cp
 * (#CP_LAYOUT_CONTIGUOUS) or of 2*cp (#CP_LAYOUT_ZIGZAG). Pure arithmetic.
 * @param t the topology (its cp size is used).
 * @param d the attention descriptor (seq_len and layout are used; its
 *        struct_size is honoured).
 * @param local_seq_len receives the local length; 0 on failure.
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT (NULL pointer, bad
 *         struct_size, seq_len < 1, unknown layout, or seq_len not
 *         divisible as the layout requires).
 */
cp_status cp_seq_local_len(const cp_topology *t, const cp_attn_desc *d, int64_t *local_seq_len);

/**
 * @brief Shape and size of the activation a rank sends to the next pipeline
 *        stage under CP (the hidden states between two layers).
 *
 * The tensor holds batch sequences of local tokens of @p hidden values in
 * the descriptor's dtype (for an FP8 descriptor BF16, the type of its
 * attention's output and of the activations around it, since 1.2):
 * local = seq_len / cp, further divided by tp with
 * #CP_STAGE_SEQUENCE_PARALLEL. In #CP_FORMAT_BSHD order the shape is
 * [batch, local, hidden]; in #CP_FORMAT_SBHD order [local, batch, hidden].
 * Both pipeline neighbours compute the same shape, so they can post their
 * receives without exchanging it. Pure arithmetic.
 * @param t the topology (cp and tp sizes are used).
 * @param d the attention descriptor (batch, seq_len, layout, format and
 *        dtype are used; its struct_size is honoured).
 * @param hidden values per token, >= 1.
 * @param flags 0 or #CP_STAGE_SEQUENCE_PARALLEL.
 * @param shape receives the three dimensions (all 0 on failure).
 * @param bytes receives the tensor's size in bytes; may be NULL.
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT (as cp_seq_local_len(),
 *         and a batch or hidden below 1, a bad format or dtype, unknown
 *         flags, a local length that tp does not divide, or a size that
 *         overflows).
 */
cp_status cp_stage_shape(const cp_topology *t, const cp_attn_desc *d, int64_t hidden, unsigned flags,
                         int64_t shape[3], size_t *bytes);

/* ------------------------------------------------------------------------ */
/* Checkpoint metadata                                                      */
/* ------------------------------------------------------------------------ */

/** Whether a checkpoint can be resumed under the current setup. */
typedef enum cp_ckpt_verdict {
    CP_CKPT_IDENTICAL = 0,     /**< same CP setup */
    CP_CKPT_COMPATIBLE = 1,    /**< different CP setup, state loads as is */
    CP_CKPT_NEEDS_RESHARD = 2, /**< loads after resharding */
    CP_CKPT_INCOMPATIBLE = 3   /**< cannot be resumed */
} cp_ckpt_verdict;

/** Which kind of state a rank is about to write. */
typedef enum cp_ckpt_role {
    CP_CKPT_REPLICATED = 0, /**< replicated over DPxCP (parameters) */
    CP_CKPT_SHARDED = 1     /**< sharded over DPxCP (ZeRO optimizer state) */
} cp_ckpt_role;

/** Largest JSON document cp_ckpt_meta_from_json() and cp_ckpt_meta_load() accept: 1 MiB. */
#define CP_CKPT_META_MAX_BYTES (1u << 20)

/**
 * @brief Record the CP setup of a run, for its checkpoints.
 *
 * Records the format and library version, world size, tp / cp / dp / pp
 * sizes and their order, cp_a2a, and from @p d the CP mode, layout, global
 * sequence length, heads, kv heads, head dims and dtype.
 * @param t the run's topology.
 * @param d the run's attention descriptor (its struct_size is honoured).
 * @param out receives the new metadata.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for a NULL pointer, a bad
 *         struct_size or a descriptor field out of range or inconsistent
 *         with the topology (e.g. seq_len not divisible for the layout);
 *         #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_ckpt_meta_create(const cp_topology *t, const cp_attn_desc *d, cp_ckpt_meta **out);

/**
 * @brief Write metadata as JSON to a file, atomically.
 *
 * Writes a temporary file in the same directory, fsyncs it, renames it over
 * @p path and fsyncs the directory: after a crash at any point @p path holds
 * either its old content or the new one, never a mix.
 * @param m the metadata.
 * @param path the file to create or replace.
 * @return #CP_SUCCESS, #CP_ERROR_INVALID_ARGUMENT, #CP_ERROR_NOT_FOUND (the
 *         directory does not exist), #CP_ERROR_IO (message names the path
 *         and the system error; the old file is left as it was) or
 *         #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_ckpt_meta_save(const cp_ckpt_meta *m, const char *path);

/**
 * @brief Read metadata written by cp_ckpt_meta_save().
 * @param path the file.
 * @param out receives the metadata.
 * @return #CP_SUCCESS; #CP_ERROR_NOT_FOUND if @p path does not exist;
 *         #CP_ERROR_IO; #CP_ERROR_FORMAT for a file over
 *         #CP_CKPT_META_MAX_BYTES or a malformed document (as
 *         cp_ckpt_meta_from_json()); #CP_ERROR_UNSUPPORTED for a newer
 *         format_version; #CP_ERROR_INVALID_ARGUMENT; #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_ckpt_meta_load(const char *path, cp_ckpt_meta **out);

/**
 * @brief Serialise metadata as a JSON document.
 * @param m the metadata.
 * @param buf receives the document and a terminating NUL; may be NULL when
 *        @p cap is 0, to ask for the length only.
 * @param cap bytes at @p buf; at least the length + 1.
 * @param len receives the document's length in bytes, without the NUL.
 * @return #CP_SUCCESS; #CP_ERROR_INVALID_ARGUMENT for NULL pointers or a
 *         @p cap that is too small (@p len is still set);
 *         #CP_ERROR_FORMAT if kept unknown keys make the document larger
 *         than #CP_CKPT_META_MAX_BYTES; #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_ckpt_meta_to_json(const cp_ckpt_meta *m, char *buf, size_t cap, size_t *len);

/**
 * @brief Parse a JSON document written by cp_ckpt_meta_to_json().
 *
 * Keys this version does not know are kept (and written back by
 * cp_ckpt_meta_to_json()) but otherwise ignored.
 * @param json the document; need not be NUL-terminated.
 * @param len its length in bytes, at most #CP_CKPT_META_MAX_BYTES.
 * @param out receives the metadata.
 * @return #CP_SUCCESS; #CP_ERROR_FORMAT for anything malformed: not JSON,
 *         not UTF-8, over the size or nesting limit, a missing key (named),
 *         a wrong type, a value out of range or inconsistent, a bad
 *         checksum; #CP_ERROR_UNSUPPORTED for a newer format_version;
 *         #CP_ERROR_INVALID_ARGUMENT; #CP_ERROR_OUT_OF_MEMORY.
 */
cp_status cp_ckpt_meta_from_json(const char *json, size_t len, cp_ckpt_meta **out);

/**
 * @brief Read one integer field of metadata by its JSON key.
 *
 * Enumerations ("mode", "layout", "dtype") give their enum values. Integer
 * values of kept unknown keys are found too.
 * @param m the metadata.
 * @param key a key such as "cp", "seq_len" or "library_version".
 * @param value receives the value.
 * @return #CP_SUCCESS; #CP_ERROR_NOT_FOUND for a key the metadata lacks;
 *         #CP_ERROR_INVALID_ARGUMENT for NULL pointers or a key whose value
 *         is not an integer (such as "order").
 */
cp_status cp_ckpt_meta_get(const cp_ckpt_meta *m, const char *key, int64_t *value);

/**
 * @brief Whether a checkpoint saved under @p saved can be resumed under
 *        @p current.
 *
 * #CP_CKPT_IDENTICAL: the CP setup is the same (the library version and
 * unknown keys are not compared). #CP_CKPT_COMPATIBLE: only things that
 * leave every saved tensor valid changed (cp, dp or cp_a2a with the same
 * dp*cp, order, mode, layout, seq_len). #CP_CKPT_NEEDS_RESHARD: dp*cp
 * changed; replicated state loads as is, state sharded over DPxCP must be
 * resharded. #CP_CKPT_INCOMPATIBLE: tp, pp or the attention shape (heads,
 * kv heads, head dims, dtype) changed.
 * @param saved metadata of the checkpoint.
 * @param current metadata of the run that resumes.
 * @param verdict receives the verdict.
 * @param reason receives one line naming each changed field with its old
 *        and new value (truncated to fit, always NUL-terminated); may be
 *        NULL when @p reason_cap is 0.
 * @param reason_cap bytes at @p reason.
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_ckpt_meta_check(const cp_ckpt_meta *saved, const cp_ckpt_meta *current,
                             cp_ckpt_verdict *verdict, char *reason, size_t reason_cap);

/**
 * @brief Whether @p rank writes state of the given role to a checkpoint.
 *
 * #CP_CKPT_REPLICATED: one rank per (tp, pp) shard, the one with dp == 0 and
 * cp == 0. #CP_CKPT_SHARDED: every rank (each writes its shard).
 * @param t the topology.
 * @param rank a rank in [0, world_size).
 * @param role the kind of state.
 * @param is_writer receives 1 or 0.
 * @return #CP_SUCCESS or #CP_ERROR_INVALID_ARGUMENT.
 */
cp_status cp_ckpt_is_writer(const cp_topology *t, int rank, cp_ckpt_role role, int *is_writer);

/**
 * @brief Destroy metadata.
 * @param m the metadata, or NULL (no-op).
 */
void cp_ckpt_meta_destroy(cp_ckpt_meta *m);

#ifdef __cplusplus
}
#endif

#endif /* INFINICP_INFINICP_H */
