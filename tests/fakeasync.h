/* SPDX-License-Identifier: MIT */
/*
 * A pretend asynchronous device for tests: memory is host memory, but work
 * runs later, on other threads, as on a GPU. It calls itself CP_DEVICE_CUDA
 * and has events, so transports treat its buffers as device buffers and may
 * order them on streams instead of waiting on the host.
 *
 * What it models:
 *  - Streams: each state owns stream 0 (the default) and, through
 *    stream_select, auxiliary streams 1 .. CP_BACKEND_MAX_STREAMS - 1 made on
 *    first use. A stream is a FIFO of operations run by a worker thread of
 *    its own, in order, each after a random delay (0 .. max_delay_us,
 *    from a generator seeded per state and stream; a stream's maximum may
 *    be set apart, see fakeasync_set_delay), so that work a caller forgot
 *    to order runs in a different order from one run to the next and shows
 *    up as wrong data.
 *  - Queued on the current stream: device-to-device copy_2d, memset,
 *    convert, reduce, and the attention kernels attn_forward, attn_backward
 *    and merge: the CPU backend's kernels, run by the worker on a CPU state
 *    of one thread that each stream owns, with the arguments as they were
 *    when queued (pointers included: the data they point to is read when
 *    the kernel runs). attn_workspace_size answers at once (one thread's
 *    scratch), and a workspace smaller than that fails when queued.
 *  - Host <-> device copy_2d (and host-to-host) behave like cudaMemcpyAsync
 *    on pageable host memory: the stream is drained, then the copy is done
 *    on the calling thread before it returns.
 *  - synchronize waits until the current stream has run everything queued
 *    on it so far (other streams are not waited for).
 *  - alloc is immediate; free (like cudaFree) first drains every stream of
 *    the state, then frees at once. Fresh memory holds 0xCD bytes.
 *  - Events: a record notes "stream S has run N operations" (S the current
 *    stream, N what was queued on it so far); event_wait queues on the
 *    current stream an operation that blocks its worker until S has run N.
 *    The event may belong to another state (another rank's), and may be
 *    recorded again or destroyed while waits on it are pending: a wait keeps
 *    what the event marked when it was queued. Waiting for an event never
 *    recorded is a no-op, as in CUDA.
 *
 * What it does not model: separate address spaces (the host may read device
 * memory without a copy, so code that does that is not caught here; see
 * fakedev.h for that), pinned host memory and truly asynchronous host
 * copies, one device shared by several states (free drains only its own
 * state's streams), asynchronous error reporting (arguments are checked
 * when an operation is queued; one that fails later, on the worker, is
 * reported without its message by the next host wait for the stream:
 * synchronize or a host copy), and set_stream (foreign streams are
 * ignored).
 */
#ifndef INFINICP_TEST_FAKEASYNC_H
#define INFINICP_TEST_FAKEASYNC_H

#include <infinicp/backend.h>

/* The table. Its open() makes a state whose seed is the device index and
 * whose delays are up to 200 us. */
const cp_backend_ops *fakeasync_ops(void);

/* A state with delays of up to max_delay_us before each operation (0: none),
 * drawn from a generator seeded with seed; close with fakeasync_ops()->close. */
cp_status fakeasync_open(unsigned seed, int max_delay_us, void **state);

/* Delays of up to max_delay_us on stream `index` of the state from now on
 * (made already or not), for a stream faster or slower than the others:
 * with equal delays a stream rarely gets several operations ahead of
 * another, so work that forgot to wait for a reader on a slow stream is
 * seldom run early enough to overwrite what the reader still needs. Called
 * by the thread that drives the state. */
cp_status fakeasync_set_delay(void *state, int index, int max_delay_us);

/* A context by hand on a new pretend device (seed, delays as for
 * fakeasync_open), calling itself CUDA device `device_index`, one thread,
 * deterministic: the library reaches a device through ctx->ops and
 * ctx->state only, and no backend that cp_context_create opens is this
 * one. Destroy with fakeasync_context_destroy. */
struct cp_context;
cp_status fakeasync_context(unsigned seed, int max_delay_us, int device_index, struct cp_context **out);
void fakeasync_context_destroy(struct cp_context *ctx);

/* The calls of a state that made (or, for alloc, would make on a GPU, where
 * cudaMalloc waits for the device) its caller's thread wait for the device,
 * counted since fakeasync_open: what a call that must not hold the host
 * (the transports' stream-ordered path) may be checked against. */
typedef struct fakeasync_waits {
    unsigned long synchronize, alloc, free, host_copy;
} fakeasync_waits;
fakeasync_waits fakeasync_host_waits(const void *state);

/* The operations a state queued since fakeasync_open, by kind (its own
 * thread's view: read by the thread that drives the state). */
typedef struct fakeasync_queued {
    unsigned long copy, memset, convert, reduce, attn_forward, attn_backward, merge;
} fakeasync_queued;
fakeasync_queued fakeasync_queued_ops(const void *state);

/* on != 0: every state's attn_workspace_size asks, like the CUDA module's
 * backward with 16-bit gradients, for fp32 dQ sums in the scratch of a
 * backward that overwrites its gradients (grad_accumulate = 0): batch *
 * seq_q * num_heads * head_dim * 4 bytes more than the CPU kernels need
 * (which they do not use). Process-wide; 0 at start. */
void fakeasync_set_dq_sums(int on);

#endif
