/* SPDX-License-Identifier: MIT */
/*
 * The agreement of a collective call. Every rank of a public call that
 * communicates takes part in it, also one whose own arguments are bad, so
 * that its peers fail at once instead of waiting out the group's timeout,
 * and every rank makes the same exchanges (the next call pairs up as it
 * should). The rank that failed returns its own status and message; the
 * others return CP_ERROR_MISMATCH naming it (CP_ERROR_COMM when it failed
 * for another reason than its arguments, e.g. out of memory).
 *
 * The verdict travels the cheapest way the transport allows:
 *  - folded: where the transport can stand a rejection in for a call
 *    (cpi_transport_caps in comm.h: the local transport), in the descriptor
 *    of the call's first exchange on each communicator it uses
 *    (cpi_call.status), so a good call pays nothing. A failed rank stands
 *    in for those exchanges with a CPI_CALL_REJECT descriptor; so does a
 *    rank that learns of a failure at its first exchange on one
 *    communicator, for those it has not used yet (the hybrid mode's ring
 *    after its a2a), and so does a rank that fails later but before them.
 *  - voted: where fields must be compared, or on transports without that
 *    capability (MPI, NCCL, wrappers), one MAX all-reduce of a few numbers
 *    through the context's device, before the call's own exchanges; except
 *    in a stream_only call on a device context, which holds no vote (see
 *    stream_only).
 *  - summed (cpi_agree_sum): a call whose one exchange is a SUM all-reduce
 *    of host numbers carries the verdict in it, on every transport.
 *
 * A call without fields (whose verdict may fold) goes:
 *
 *     cpi_agreement ag;
 *     CPI_TRY(cpi_agree_open(&ag, &call, local));
 *     return cpi_agree_close(&ag, <the call's exchanges>);
 *
 * Only ranks that go on (open returned CP_SUCCESS) close; after a vote
 * (fields given) there is nothing to close.
 */
#ifndef INFINICP_AGREE_H
#define INFINICP_AGREE_H

#include "comm/comm.h"
#include "core/context.h"

/* A value every rank must pass alike; real: it holds the bits of a double. */
typedef struct cpi_agree_field {
    const char *name; /* as the caller spells the argument, e.g. "cfg->a2a_size" */
    uint64_t value;
    bool real;
} cpi_agree_field;

#define CPI_AGREE_MAX_FIELDS 16
#define CPI_AGREE_MAX_FIRST 2
#define CPI_AGREE_MAX_SUM 8

/* What a call agrees on, and where. */
typedef struct cpi_agree_call {
    const char *func;     /* the public function, for messages */
    cp_context *ctx;      /* a vote's numbers travel through its device; NULL: host memory */
    cp_comm *comm;        /* every rank of the call; messages number ranks as here */
    int timeout_ms;
    const cpi_agree_field *fields; /* none: the call compares nothing beyond the verdict */
    int nfields;
    const char *what;     /* what the fields make up, for messages ("descriptors"); may be NULL */
    /* The communicators of the call's exchanges in the order of their first
     * use (none: comm alone). Every rank must exchange on each of them
     * before it returns CP_SUCCESS. */
    cp_comm *first[CPI_AGREE_MAX_FIRST];
    int nfirst;
    /* The call only queues work on the context's stream (the forward and the
     * backward): on a device context a vote would make the host wait for
     * that stream in every training step, so where the verdict cannot fold
     * (NCCL, MPI) none is held, and a rank's bad arguments leave its peers
     * to the transport's timeout, as before agreements. */
    bool stream_only;
} cpi_agree_call;

/* One rank's side of an agreement in progress (on its stack). */
typedef struct cpi_agreement {
    cpi_agree_call call;
    bool pending[CPI_AGREE_MAX_FIRST]; /* folded: call.first[i] has not exchanged yet */
    int origin;              /* the rank of call.comm that failed first; -1: none known */
    cp_status origin_status; /* its status */
} cpi_agreement;

/*
 * Collective: start the call's agreement with this rank's verdict on its own
 * arguments (`local`; its message is the thread's last error). Returns
 * `local` (with its message) when that failed, after taking part; the error
 * of the vote when one was held and failed; else CP_SUCCESS, and the call
 * goes on and ends with cpi_agree_close.
 */
cp_status cpi_agree_open(cpi_agreement *a, const cpi_agree_call *call, cp_status local);

/*
 * End the call with status s. On failure, stands in for the exchanges of
 * the call's communicators that this rank did not make, and words the
 * message: a peer's failure learned from a folded verdict becomes
 * CP_ERROR_MISMATCH (or CP_ERROR_COMM) naming that peer. Returns the
 * call's status.
 */
cp_status cpi_agree_close(cpi_agreement *a, cp_status s);

/* For the checked collectives: c's transport finished an exchange with
 * status s. Only called while c->agreement is set. */
void cpi_agree_exchanged(cp_comm *c, cp_status s);

/*
 * Collective: v[0..n) = their sum over the ranks of call->comm (n at most
 * CPI_AGREE_MAX_SUM; call->fields and call->first unused), with the
 * verdicts of all ranks in the same all-reduce. A rank whose `local` failed
 * sends zeros and gets `local` back; its peers get the peer's failure as
 * from cpi_agree_open.
 */
cp_status cpi_agree_sum(const cpi_agree_call *call, cp_status local, double *v, size_t n);

#endif
