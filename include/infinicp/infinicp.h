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
#define CP_VERSION_MINOR 0
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
    CP_DTYPE_F64 = 3   /**< IEEE binary64 (communication and references) */
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
} cp_context_config;

/** Defaults: CPU device 0, no stream, one thread per processor. */
#define CP_CONTEXT_CONFIG_INIT { sizeof(cp_context_config), CP_DEVICE_CPU, 0, NULL, 0 }

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
    int tp, cp, dp, pp, cp_a2a, cp_p2p;
} cp_coords;

/* ------------------------------------------------------------------------ */
/* Sequence layouts                                                         */
/* ------------------------------------------------------------------------ */

/** How a sequence is split across the ranks of a CP group. */
typedef enum cp_layout {
    CP_LAYOUT_CONTIGUOUS = 0, /**< rank r holds [r*S/P, (r+1)*S/P) */
    CP_LAYOUT_ZIGZAG = 1      /**< rank r holds chunks r and 2P-1-r of 2P */
} cp_layout;

/* ------------------------------------------------------------------------ */
/* Communicators                                                            */
/* ------------------------------------------------------------------------ */

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
    cp_dtype dtype;       /**< storage type of q, k, v, out and gradients */
    cp_format format;     /**< memory order */
    int64_t batch;        /**< batch size */
    int64_t seq_len;      /**< GLOBAL sequence length (all ranks together) */
    int32_t num_heads;    /**< query heads */
    int32_t num_kv_heads; /**< key/value heads (divides num_heads; GQA when smaller) */
    int32_t head_dim;     /**< q/k head dimension */
    int32_t head_dim_v;   /**< v/out head dimension; 0 = head_dim */
    cp_mask mask;         /**< #CP_MASK_CAUSAL or #CP_MASK_NONE */
    double softmax_scale; /**< 0 = 1/sqrt(head_dim) */
    cp_layout layout;     /**< how the sequence is split */
    cp_mode mode;         /**< communication scheme */
} cp_attn_desc;

/** Defaults: F32, BSHD, no shape, causal, scale 1/sqrt(d), contiguous, p2p. */
#define CP_ATTN_DESC_INIT                                                          \
    { sizeof(cp_attn_desc), CP_DTYPE_F32, CP_FORMAT_BSHD, 0, 0, 0, 0, 0, 0,          \
      CP_MASK_CAUSAL, 0.0, CP_LAYOUT_CONTIGUOUS, CP_MODE_P2P }

/* ------------------------------------------------------------------------ */
/* Single-device kernels                                                    */
/* ------------------------------------------------------------------------ */

/**
 * Arguments of cp_kernel_attn_forward() and cp_kernel_attn_backward():
 * attention of one Q block (seq_q rows) against one K/V block (seq_k rows).
 *
 * Tensor element (b, s, h, d) of X lives at X + b*X_stride_b + s*X_stride_s
 * + h*X_stride_h + d (strides in elements of that tensor's type; the last
 * dimension is dense). If all three strides of a tensor are 0 they are
 * derived from @c format as a dense tensor of this block's shape.
 * LSE element (b, h, s) lives at lse + b*lse_stride_b + h*lse_stride_h + s;
 * all-zero LSE strides mean dense [batch, num_heads, seq_q].
 */
typedef struct cp_kernel_attn_args {
    size_t struct_size;    /**< sizeof(cp_kernel_attn_args) */
    cp_dtype dtype;        /**< storage type of q, k, v (and dout) */
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
    double softmax_scale;  /**< 0 = 1/sqrt(head_dim) */

    const void *q; int64_t q_stride_b, q_stride_s, q_stride_h;
    const void *k; int64_t k_stride_b, k_stride_s, k_stride_h;
    const void *v; int64_t v_stride_b, v_stride_s, v_stride_h;
    /** forward: output; backward: the final forward output. */
    void *o; int64_t o_stride_b, o_stride_s, o_stride_h;
    cp_dtype o_dtype;      /**< type of o: dtype or #CP_DTYPE_F32 */
    /** forward: output; backward: the final log-sum-exp (natural log). */
    float *lse; int64_t lse_stride_b, lse_stride_h;
    /**
     * forward only: 0 = overwrite (o, lse); 1 = (o, lse) hold a partial
     * result over other keys (o in F32) and this block is merged into it.
     */
    int accumulate;

    /* backward only */
    const void *dout; int64_t dout_stride_b, dout_stride_s, dout_stride_h; /**< dtype as o */
    void *dq; int64_t dq_stride_b, dq_stride_s, dq_stride_h;
    void *dk; int64_t dk_stride_b, dk_stride_s, dk_stride_h;
    void *dv; int64_t dv_stride_b, dv_stride_s, dv_stride_h;
    cp_dtype grad_dtype;   /**< type of dq, dk, dv: dtype or #CP_DTYPE_F32 */
    int grad_accumulate;   /**< 0 = overwrite dq, dk, dv; 1 = add into them */

    /** scratch on the context's device; NULL = the kernel allocates its own */
    void *workspace;
    size_t workspace_bytes; /**< bytes at @c workspace */
} cp_kernel_attn_args;

/* Zero every field but struct_size, without -Wmissing-field-initializers. */
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
    void *o; int64_t o_stride_b, o_stride_s, o_stride_h;
    cp_dtype o_dtype;    /**< type of o (F32 keeps full precision) */
    float *lse; int64_t lse_stride_b, lse_stride_h;
    const void *o_part; int64_t o_part_stride_b, o_part_stride_s, o_part_stride_h;
    cp_dtype o_part_dtype; /**< type of o_part */
    const float *lse_part; int64_t lse_part_stride_b, lse_part_stride_h;
} cp_kernel_merge_args;

/** Zero-initialises every field but struct_size. */
#define CP_KERNEL_MERGE_ARGS_INIT CP_INIT_SIZED_(cp_kernel_merge_args)

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

#ifdef __cplusplus
}
#endif

#endif /* INFINICP_INFINICP_H */
