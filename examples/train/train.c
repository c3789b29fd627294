/* SPDX-License-Identifier: MIT */
/*
 * Training a transformer with context parallelism: a guide in code.
 *
 * This program trains the small decoder-only transformer of model.c on a
 * synthetic corpus, once on a single rank (CP = 1) and then with the same
 * seed and data under CP = 2 and 4 in every CP mode and sequence layout, and
 * under DP = 2 x CP = 2. Ranks are threads of this process, talking through
 * the library's in-process transport; a real trainer has one process per
 * GPU and wraps its MPI or NCCL communicator instead (cp_comm_create_mpi).
 * Every run must reproduce the single-rank losses: CP changes where tokens
 * are computed, never what is computed.
 *
 * What a framework does to adopt CP, in the order this file does it (look
 * for "CP step"):
 *   1. cut the world into CP and DPxCP groups with the topology;
 *   2. plan the attention once: a context, a group, a plan;
 *   3. shard each batch: token ids AND labels (shifted globally, before
 *      sharding), and learn each local token's global position;
 *   4. give RoPE the global positions;
 *   5. run attention through the plan, forward and backward;
 *   6. reduce the loss over the ranks (a sum of sums over a sum of counts);
 *   7. scale the loss gradient by the global token count;
 *   8. sum the gradients of replicated parameters over DPxCP;
 *   9. step the optimizer, identically on every replica.
 * Everything else (embedding, norms, MLP, LM head, optimizer) is the
 * single-device code, unchanged: those layers work token by token.
 *
 * With --packed every sample is one packed row of several documents (API
 * 1.1), as trainers that pack short documents into long rows do. Then
 * step 3 makes a cp_pack of each row (the documents' offsets, the same on
 * every rank of the CP group) and shards with it, step 4 gives RoPE each
 * token's position inside its document (cp_pack_positions), and step 5
 * passes the pack to cp_attn_forward_ex / cp_attn_backward_ex, so that no
 * token attends across a document boundary. The reference is the same
 * packed rows on one rank (a pack of one rank: the same document mask).
 * Look for "packed".
 *
 * Usage: train-example [--steps N] [--dtype f32|bf16|all] [--tiny] [--packed]
 *                      [--device cpu|cuda] [--bf16-bound X] [--verbose]
 * Build against an installed library:
 *   cc -O2 train.c model.c devmem.c $(pkg-config --cflags --libs infinicp) \
 *      -lpthread -lm -ldl -o train-example
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinicp/infinicp.h>

#include "devmem.h"
#include "model.h"

/* ---- what to run ------------------------------------------------------------ */

typedef struct opts {
    model_cfg model;
    int64_t batch, seq; /* the GLOBAL batch: sequences x tokens per step */
    int steps;
    int cuda, verbose;
    int packed; /* each sequence is a packed row of documents */
    double f32_bound, bf16_bound;
    adamw opt;
    uint64_t seed;
} opts;

typedef struct run_cfg {
    int cp, dp;
    cp_mode mode;
    cp_layout layout; /* CP_LAYOUT_PACKED with --packed */
    int a2a; /* a2a part of CP for CP_MODE_A2A_P2P */
    cp_dtype dtype;
    cp_balance balance; /* packed: how each row is split */
} run_cfg;

/* What a run leaves behind. */
typedef struct run_out {
    double *loss;    /* per step, from world rank 0 */
    uint64_t *hash;  /* per world rank: a fingerprint of its final parameters */
    int failed;
    char error[512];
    pthread_mutex_t lock;
} run_out;

static const char *mode_name(cp_mode m)
{
    static const char *n[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };
    return n[m];
}

/* ---- the data --------------------------------------------------------------- */

static uint64_t next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* The successors of every token in the corpus' Markov chain (below). */
static int32_t *successors(const opts *o)
{
    const int V = o->model.vocab;
    uint64_t s = o->seed ^ 0x9e3779b97f4a7c15ull;
    int32_t *succ = malloc((size_t)V * 4 * sizeof *succ);
    for (int i = 0; succ && i < V * 4; i++)
        succ[i] = (int32_t)(next(&s) % (uint64_t)V);
    return succ;
}

/* A synthetic corpus with something to learn: a fixed random Markov chain in
 * which each token has four equally likely successors (the best possible
 * loss is ln 4 = 1.386). Every rank builds the same global batch of step
 * `step`, as if all read one data loader, and keeps its own share of it.
 * seqs: batch rows of seq + 1 tokens (inputs and the token after each). */
static void make_batch(const opts *o, int step, int32_t *seqs)
{
    const int V = o->model.vocab;
    int32_t *succ = successors(o);
    uint64_t s = o->seed + 7919u * (uint64_t)(step + 1);
    for (int64_t b = 0; b < o->batch; b++) {
        int32_t t = (int32_t)(next(&s) % (uint64_t)V);
        for (int64_t p = 0; p <= o->seq; p++) {
            seqs[b * (o->seq + 1) + p] = t;
            t = succ[t * 4 + (int)(next(&s) % 4)];
        }
    }
    free(succ);
}

/* Documents per packed row, at most. */
#define MAX_DOCS 64

/* packed: the same corpus cut into documents, several to a row. Each row of
 * seq tokens holds documents of random lengths (1 to seq / 2 tokens, the
 * last one what is left), each its own chain from a random first token, as
 * a data loader that packs short documents into rows delivers them. in and
 * lab: batch rows of seq tokens, the inputs and the next token of each IN
 * ITS DOCUMENT (the last token of a document is not asked to predict the
 * first of the next); cu: per row MAX_DOCS + 1 document offsets; docs: per
 * row the number of documents. */
static void make_packed_batch(const opts *o, int step, int32_t *in, int32_t *lab, int64_t *cu, int *docs)
{
    const int V = o->model.vocab;
    const int64_t S = o->seq, longest = S / 2 > 0 ? S / 2 : 1;
    int32_t *succ = successors(o);
    uint64_t s = (o->seed ^ 0x5bd1e995u) + 104729u * (uint64_t)(step + 1);
    for (int64_t b = 0; b < o->batch; b++) {
        int64_t *c = cu + b * (MAX_DOCS + 1);
        int n = 0;
        c[0] = 0;
        while (c[n] < S) {
            const int64_t left = S - c[n];
            int64_t len = 1 + (int64_t)(next(&s) % (uint64_t)(left < longest ? left : longest));
            if (n == MAX_DOCS - 1)
                len = left;
            int32_t t = (int32_t)(next(&s) % (uint64_t)V);
            for (int64_t p = c[n]; p < c[n] + len; p++) {
                in[b * S + p] = t;
                t = succ[t * 4 + (int)(next(&s) % 4)];
                lab[b * S + p] = t;
            }
            c[n + 1] = c[n] + len;
            n++;
        }
        docs[b] = n;
    }
    free(succ);
}

/* ---- 16-bit storage ---------------------------------------------------------- */

static uint16_t to_bf16(float f) /* round to nearest even */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* dst (dtype) = src (float), or back; in host memory. */
static void pack(void *dst, cp_dtype t, const float *src, size_t n)
{
    if (t == CP_DTYPE_F32)
        memcpy(dst, src, n * sizeof *src);
    else
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = to_bf16(src[i]);
}

static void unpack_add(float *dst, const void *src, cp_dtype t, size_t n, int add)
{
    for (size_t i = 0; i < n; i++) {
        float v = t == CP_DTYPE_F32 ? ((const float *)src)[i] : from_bf16(((const uint16_t *)src)[i]);
        dst[i] = add ? dst[i] + v : v;
    }
}

/* ---- one rank ----------------------------------------------------------------- */

typedef struct rank {
    const opts *o;
    const run_cfg *r;
    const devmem *dev;
    run_out *out;
    cp_comm *world;
    int world_rank;

    cp_topology *topo;
    cp_context *ctx;      /* the device attention runs on */
    cp_context *host;     /* the CPU, for sharding host-side token ids */
    cp_comm *cp_comm, *dpxcp;
    cp_group *group;
    cp_attn_plan *plan;
    int cp_rank, dp_rank;

    int64_t local_batch, local_seq, n; /* n = local_batch * local_seq tokens */
    int64_t *pos;                      /* global position of each local token (packed: in its document) */
    int32_t *seqs, *tokens, *labels, *global_in, *global_lab;
    /* packed: every global row's document offsets and count, and the split
     * of each of this replica's rows (one pack per row, remade every step) */
    int64_t *cu;
    int *docs;
    cp_pack **packs;

    model m;
    float *params, *grads, *m1, *m2;
    uint16_t *grads16;
    acts a;

    /* attention tensors on the device, in the CP dtype: per layer what the
     * backward needs, and the gradients */
    void *q[MODEL_MAX_LAYERS], *k[MODEL_MAX_LAYERS], *v[MODEL_MAX_LAYERS], *att[MODEL_MAX_LAYERS];
    float *lse[MODEL_MAX_LAYERS];
    void *dout, *dq, *dk, *dv, *ws;
    size_t ws_bytes;
    void *stage; /* host staging in the CP dtype */
} rank;

static void record(rank *r, const char *what, cp_status s)
{
    pthread_mutex_lock(&r->out->lock);
    if (!r->out->failed) {
        r->out->failed = 1;
        snprintf(r->out->error, sizeof r->out->error, "world rank %d: %s: %s", r->world_rank, what,
                 s == CP_SUCCESS ? "failed" : cp_last_error());
    }
    pthread_mutex_unlock(&r->out->lock);
}

#define TRY(call)                                                                                          \
    do {                                                                                                   \
        cp_status s_ = (call);                                                                             \
        if (s_ != CP_SUCCESS) {                                                                            \
            record(r, #call, s_);                                                                          \
            return -1;                                                                                     \
        }                                                                                                  \
    } while (0)

#define NEED(cond)                                                                                         \
    do {                                                                                                   \
        if (!(cond)) {                                                                                     \
            record(r, #cond, CP_SUCCESS);                                                                  \
            return -1;                                                                                     \
        }                                                                                                  \
    } while (0)

static size_t dsize(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? 4 : 2;
}

/*
 * CP step 1: the groups. A topology is pure arithmetic from the parallel
 * sizes: it tells each rank its coordinates and which ranks share its
 * sequence (the CP group) or hold replicas of its parameters (the DPxCP
 * group). cp_topology_color turns a group into the (color, key) that
 * cp_comm_split (or MPI_Comm_split) takes.
 */
static int setup_groups(rank *r)
{
    cp_topology_config tc = CP_TOPOLOGY_CONFIG_INIT;
    tc.world_size = r->r->cp * r->r->dp;
    tc.cp = r->r->cp;
    tc.dp = r->r->dp;
    tc.cp_a2a = r->r->mode == CP_MODE_A2A_P2P ? r->r->a2a : 1;
    TRY(cp_topology_create(&tc, &r->topo));
    cp_coords me;
    TRY(cp_topology_coords(r->topo, r->world_rank, &me));
    r->cp_rank = me.cp;
    r->dp_rank = me.dp;

    int color, key;
    TRY(cp_topology_color(r->topo, r->world_rank, CP_AXIS_CP, &color, &key));
    TRY(cp_comm_split(r->world, color, key, &r->cp_comm));
    TRY(cp_topology_color(r->topo, r->world_rank, CP_AXIS_DP | CP_AXIS_CP, &color, &key));
    TRY(cp_comm_split(r->world, color, key, &r->dpxcp));
    /* The key is the index in the group, so the CP communicator's rank is
     * the cp coordinate: the rank that cp_layout_* calls "cp_rank". */
    int cr;
    TRY(cp_comm_rank(r->cp_comm, &cr));
    NEED(cr == r->cp_rank);
    return 0;
}

/*
 * CP step 2: plan the attention once. The descriptor gives the GLOBAL
 * sequence length and this rank's batch (DP has already split the batch);
 * the plan checks that every rank of the group agrees and sizes the
 * workspace, which is O(tokens per rank).
 */
static int setup_attention(rank *r)
{
    const model_cfg *c = &r->o->model;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1; /* the ranks already share the cores */
    if (r->dev->cuda) {
        cc.device = CP_DEVICE_CUDA;
        cc.device_index = r->world_rank % r->dev->device_count;
        NEED(devmem_use(r->dev, cc.device_index) == 0);
    }
    TRY(cp_context_create(&cc, &r->ctx));
    cp_context_config hc = CP_CONTEXT_CONFIG_INIT;
    hc.num_threads = 1;
    TRY(cp_context_create(&hc, &r->host));

    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.a2a_size = r->r->mode == CP_MODE_A2A_P2P ? r->r->a2a : 1;
    gc.timeout_ms = 60000;
    TRY(cp_group_create(r->ctx, r->cp_comm, &gc, &r->group));

    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.dtype = r->r->dtype;
    d.format = CP_FORMAT_BSHD; /* rows [batch][token], as the model stores them */
    d.batch = r->o->batch / r->r->dp;
    /* packed: a packed row is one sample with documents of its own, so
     * the plan is for one row and each of the replica's rows is a call
     * with that row's pack (one plan serves every pack of its length) */
    if (r->o->packed)
        d.batch = 1;
    d.seq_len = r->o->seq; /* GLOBAL */
    d.num_heads = c->heads;
    d.num_kv_heads = c->kv_heads; /* GQA: no repeated K/V copies needed */
    d.head_dim = c->head_dim;
    d.mask = CP_MASK_CAUSAL;      /* on global positions (packed: and inside each document) */
    d.layout = r->r->layout;
    d.mode = r->r->mode;
    TRY(cp_attn_plan_create(r->group, &d, &r->plan));

    /* The sizes of everything outside attention follow from the layout.
     * A packed row's share is T / P tokens, like a contiguous one's. */
    cp_attn_desc shares = d;
    if (r->o->packed) {
        shares.layout = CP_LAYOUT_CONTIGUOUS;
        shares.batch = r->o->batch / r->r->dp;
    }
    r->local_batch = shares.batch;
    TRY(cp_seq_local_len(r->topo, &shares, &r->local_seq));
    r->n = r->local_batch * r->local_seq;
    /* With pipeline parallelism this is the tensor a stage would send to
     * the next; here it is the residual stream's size. */
    int64_t shape[3];
    TRY(cp_stage_shape(r->topo, &shares, c->dim, 0, shape, NULL));
    NEED(shape[0] * shape[1] == r->n && shape[2] == c->dim);

    size_t wf, wb;
    TRY(cp_attn_workspace_size(r->plan, &wf, &wb));
    r->ws_bytes = wf > wb ? wf : wb;
    NEED((r->ws = devmem_alloc(r->dev, r->ws_bytes)) != NULL);
    return 0;
}

/* CP step 3 (positions): which global positions this rank holds, in the
 * order of its local tokens. With zigzag they are two separate chunks. */
static int setup_positions(rank *r)
{
    if (r->o->packed)
        return 0; /* they change with the documents: load_batch */
    int64_t *p = malloc((size_t)r->local_seq * sizeof *p);
    NEED(p != NULL);
    cp_status s = cp_layout_positions(r->r->layout, r->r->cp, r->cp_rank, r->o->seq, p);
    if (s == CP_SUCCESS)
        for (int64_t b = 0; b < r->local_batch; b++)
            memcpy(r->pos + b * r->local_seq, p, (size_t)r->local_seq * sizeof *p);
    free(p);
    TRY(s);
    return 0;
}

static int setup_buffers(rank *r)
{
    const model_cfg *c = &r->o->model;
    const size_t n = (size_t)r->n, es = dsize(r->r->dtype);
    const size_t nq = n * (size_t)c->dim, nkv = n * (size_t)(c->kv_heads * c->head_dim);
    NEED(model_init(&r->m, c) == 0);
    const size_t P = r->m.count;
    r->params = calloc(P, sizeof(float));
    r->grads = calloc(P, sizeof(float));
    r->m1 = calloc(P, sizeof(float));
    r->m2 = calloc(P, sizeof(float));
    r->grads16 = calloc(P, sizeof(uint16_t));
    r->pos = calloc(n, sizeof *r->pos);
    r->tokens = calloc(n, sizeof *r->tokens);
    r->labels = calloc(n, sizeof *r->labels);
    const size_t global = (size_t)(r->o->batch * r->o->seq);
    r->seqs = calloc(global + (size_t)r->o->batch, sizeof *r->seqs);
    r->global_in = calloc(global, sizeof *r->global_in);
    r->global_lab = calloc(global, sizeof *r->global_lab);
    r->stage = calloc(nq, es);
    NEED(r->params && r->grads && r->m1 && r->m2 && r->grads16 && r->pos && r->tokens && r->labels &&
         r->seqs && r->global_in && r->global_lab && r->stage);
    if (r->o->packed) {
        r->cu = calloc((size_t)r->o->batch * (MAX_DOCS + 1), sizeof *r->cu);
        r->docs = calloc((size_t)r->o->batch, sizeof *r->docs);
        r->packs = calloc((size_t)r->local_batch, sizeof *r->packs);
        NEED(r->cu && r->docs && r->packs);
    }
    NEED(acts_alloc(&r->a, &r->m, r->n) == 0);
    for (int l = 0; l < c->layers; l++) {
        NEED((r->q[l] = devmem_alloc(r->dev, nq * es)) && (r->k[l] = devmem_alloc(r->dev, nkv * es)) &&
             (r->v[l] = devmem_alloc(r->dev, nkv * es)) && (r->att[l] = devmem_alloc(r->dev, nq * es)) &&
             (r->lse[l] = devmem_alloc(r->dev, n * (size_t)c->heads * sizeof(float))));
    }
    NEED((r->dout = devmem_alloc(r->dev, nq * es)) && (r->dq = devmem_alloc(r->dev, nq * es)) &&
         (r->dk = devmem_alloc(r->dev, nkv * es)) && (r->dv = devmem_alloc(r->dev, nkv * es)));
    /* Every replica starts from the same parameters: same seed everywhere. */
    model_init_params(&r->m, r->params, r->o->seed);
    return 0;
}

/* Host floats -> device tensor in the CP dtype, and back. */
static int upload(rank *r, void *dst, const float *src, size_t count)
{
    pack(r->stage, r->r->dtype, src, count);
    return devmem_to_device(r->dev, dst, r->stage, count * dsize(r->r->dtype));
}

static int download(rank *r, float *dst, const void *src, size_t count, int add)
{
    /* the library queues work on the context's stream: wait for it */
    if (cp_context_synchronize(r->ctx) != CP_SUCCESS ||
        devmem_to_host(r->dev, r->stage, src, count * dsize(r->r->dtype)))
        return -1;
    unpack_add(dst, r->stage, r->r->dtype, count, add);
    return 0;
}

/* packed: tensor X's local row b (the plan is for one row), of per_token
 * elements per token in the CP dtype. */
static void *row_of(const rank *r, const void *x, int64_t b, size_t per_token)
{
    return (char *)x + (size_t)(b * r->local_seq) * per_token * dsize(r->r->dtype);
}

/* packed: row b's lse, [heads, local_seq] floats. */
static float *lse_row(const rank *r, float *lse, int64_t b)
{
    return lse + (size_t)(b * r->local_seq) * (size_t)r->o->model.heads;
}

/*
 * CP step 5: attention through the plan. q, k, v hold this rank's tokens
 * only; the plan moves K/V (or Q/K/V) between the ranks of the group as its
 * mode says, and the causal mask is applied on global positions. The
 * backward returns dK, dV for this rank's keys summed over every rank's
 * queries, so the layers below see ordinary local gradients.
 */
static int attn_forward(void *self, int l, const float *q, const float *k, const float *v, float *out)
{
    rank *r = self;
    const size_t nq = (size_t)r->n * (size_t)r->o->model.dim;
    const size_t nkv = (size_t)r->n * (size_t)(r->o->model.kv_heads * r->o->model.head_dim);
    if (upload(r, r->q[l], q, nq) || upload(r, r->k[l], k, nkv) || upload(r, r->v[l], v, nkv))
        return -1;
    if (!r->o->packed) {
        TRY(cp_attn_forward(r->plan, r->q[l], r->k[l], r->v[l], r->att[l], r->lse[l], r->ws, r->ws_bytes));
        return download(r, out, r->att[l], nq, 0);
    }
    /* packed: one call per row, with the row's pack: attention stays
     * inside each document */
    const size_t tq = (size_t)r->o->model.dim, tkv = (size_t)(r->o->model.kv_heads * r->o->model.head_dim);
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    x.workspace = r->ws;
    x.workspace_bytes = r->ws_bytes;
    for (int64_t b = 0; b < r->local_batch; b++) {
        x.pack = r->packs[b];
        TRY(cp_attn_forward_ex(r->plan, row_of(r, r->q[l], b, tq), row_of(r, r->k[l], b, tkv),
                               row_of(r, r->v[l], b, tkv), row_of(r, r->att[l], b, tq), lse_row(r, r->lse[l], b),
                               &x));
    }
    return download(r, out, r->att[l], nq, 0);
}

static int attn_backward(void *self, int l, const float *dout, float *dq, float *dk, float *dv)
{
    rank *r = self;
    const size_t nq = (size_t)r->n * (size_t)r->o->model.dim;
    const size_t nkv = (size_t)r->n * (size_t)(r->o->model.kv_heads * r->o->model.head_dim);
    if (upload(r, r->dout, dout, nq))
        return -1;
    if (!r->o->packed) {
        TRY(cp_attn_backward(r->plan, r->q[l], r->k[l], r->v[l], r->att[l], r->lse[l], r->dout, r->dq, r->dk,
                             r->dv, r->ws, r->ws_bytes));
    } else {
        const size_t tq = (size_t)r->o->model.dim, tkv = (size_t)(r->o->model.kv_heads * r->o->model.head_dim);
        cp_attn_args x = CP_ATTN_ARGS_INIT;
        x.workspace = r->ws;
        x.workspace_bytes = r->ws_bytes;
        for (int64_t b = 0; b < r->local_batch; b++) {
            x.pack = r->packs[b];
            TRY(cp_attn_backward_ex(r->plan, row_of(r, r->q[l], b, tq), row_of(r, r->k[l], b, tkv),
                                    row_of(r, r->v[l], b, tkv), row_of(r, r->att[l], b, tq),
                                    lse_row(r, r->lse[l], b), row_of(r, r->dout, b, tq), row_of(r, r->dq, b, tq),
                                    row_of(r, r->dk, b, tkv), row_of(r, r->dv, b, tkv), &x));
        }
    }
    if (download(r, dq, r->dq, nq, 1) || download(r, dk, r->dk, nkv, 1) || download(r, dv, r->dv, nkv, 1))
        return -1;
    return 0;
}

/*
 * CP steps 3 and 4, packed: every rank reads the same rows and their
 * document offsets (cu_seqlens); each CP group makes the same cp_pack of
 * each of its replica's rows (deterministic, no communication), shards
 * tokens and labels with it, and takes each token's position inside its
 * document for RoPE. Labels are already per document (make_packed_batch),
 * so nothing is shifted across a document boundary.
 */
static int load_packed_batch(rank *r, int step)
{
    const int64_t S = r->o->seq, L = r->local_seq;
    make_packed_batch(r->o, step, r->global_in, r->global_lab, r->cu, r->docs);
    for (int64_t b = 0; b < r->local_batch; b++) {
        const int64_t row = (int64_t)r->dp_rank * r->local_batch + b; /* this replica's rows */
        cp_pack_destroy(r->packs[b]);
        r->packs[b] = NULL;
        cp_pack_config pc = CP_PACK_CONFIG_INIT;
        pc.cp_size = r->r->cp;
        pc.cu_seqlens = r->cu + row * (MAX_DOCS + 1);
        pc.num_seqs = r->docs[row];
        pc.mask = CP_MASK_CAUSAL;
        pc.balance = r->r->balance;
        TRY(cp_pack_create(&pc, &r->packs[b]));
        TRY(cp_pack_shard(r->host, r->packs[b], r->cp_rank, r->global_in + row * S, r->tokens + b * L,
                          sizeof(int32_t)));
        TRY(cp_pack_shard(r->host, r->packs[b], r->cp_rank, r->global_lab + row * S, r->labels + b * L,
                          sizeof(int32_t)));
        TRY(cp_pack_positions(r->packs[b], r->cp_rank, NULL, r->pos + b * L, NULL));
    }
    return 0;
}

/*
 * CP step 3: shard the batch. DP picks this replica's sequences; CP cuts
 * each sequence by the layout. Labels are the NEXT token in the GLOBAL
 * sequence: shift first, then shard. (Shifting a shard locally would pair a
 * rank's last token with the wrong label, and zigzag shards are not even
 * contiguous.) The token ids live on the host here (the embedding runs on
 * the CPU), so they are cut with a CPU context.
 */
static int load_batch(rank *r, int step)
{
    const int64_t S = r->o->seq, B = r->o->batch;
    if (r->o->packed)
        return load_packed_batch(r, step);
    make_batch(r->o, step, r->seqs);
    for (int64_t b = 0; b < B; b++)
        for (int64_t p = 0; p < S; p++) {
            r->global_in[b * S + p] = r->seqs[b * (S + 1) + p];
            r->global_lab[b * S + p] = r->seqs[b * (S + 1) + p + 1];
        }
    const int64_t first = (int64_t)r->dp_rank * r->local_batch; /* this replica's rows */
    TRY(cp_layout_shard(r->host, r->r->layout, r->r->cp, r->cp_rank, r->global_in + first * S, r->tokens,
                        r->local_batch, S, sizeof(int32_t)));
    TRY(cp_layout_shard(r->host, r->r->layout, r->r->cp, r->cp_rank, r->global_lab + first * S, r->labels,
                        r->local_batch, S, sizeof(int32_t)));
    return 0;
}

static int train_step(rank *r, int step)
{
    const attn_iface attn = { r, attn_forward, attn_backward };
    if (load_batch(r, step))
        return -1;
    /* CP step 4 happens inside: RoPE rotates by r->pos, the global positions
     * (packed: the positions inside each token's document). */
    if (model_forward(&r->m, r->params, r->tokens, r->pos, r->n, &attn, &r->a))
        return -1;

    /* CP step 6: the loss. Each rank has the loss of its own tokens; the
     * model's loss is the sum over all ranks over the number of all tokens.
     * Over the DPxCP group this is the loss of the whole global batch. */
    double mean;
    int64_t total;
    TRY(cp_loss_reduce(NULL, r->dpxcp, model_loss_sum(&r->m, &r->a, r->labels), r->n, &mean, &total));
    if (r->world_rank == 0)
        r->out->loss[step] = mean;

    /* CP step 7: d(mean loss)/d(logits) = (softmax - onehot) / total tokens,
     * with the GLOBAL count: then the ranks' gradients simply add up. */
    memset(r->grads, 0, r->m.count * sizeof *r->grads);
    if (model_backward(&r->m, r->params, r->tokens, r->labels, r->pos, (float)(1.0 / (double)total), &attn,
                       &r->a, r->grads))
        return -1;

    /* CP step 8: every parameter here is replicated over DP and CP, and each
     * rank holds the gradient of its own tokens only: sum over DPxCP (a sum,
     * not an average, because the loss was already divided by the global
     * count). In a BF16 run the gradients travel in BF16, as in mixed-
     * precision trainers; the library sums them in F32. */
    if (r->r->dtype == CP_DTYPE_BF16) {
        pack(r->grads16, CP_DTYPE_BF16, r->grads, r->m.count);
        TRY(cp_grad_all_reduce(NULL, r->dpxcp, r->grads16, r->m.count, CP_DTYPE_BF16, CP_GRAD_SUM, 64 << 10));
        unpack_add(r->grads, r->grads16, CP_DTYPE_BF16, r->m.count, 0);
    } else {
        TRY(cp_grad_all_reduce(NULL, r->dpxcp, r->grads, r->m.count, CP_DTYPE_F32, CP_GRAD_SUM, 64 << 10));
    }

    /* CP step 9: the same gradients and the same optimizer on every rank
     * keep the replicas identical, with no broadcast of parameters. */
    adamw_step(&r->o->opt, step + 1, r->params, r->grads, r->m1, r->m2, r->m.count);
    return 0;
}

static uint64_t fingerprint(const float *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n * sizeof *p; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void teardown(rank *r)
{
    for (int l = 0; l < MODEL_MAX_LAYERS; l++) {
        devmem_free(r->dev, r->q[l]);
        devmem_free(r->dev, r->k[l]);
        devmem_free(r->dev, r->v[l]);
        devmem_free(r->dev, r->att[l]);
        devmem_free(r->dev, r->lse[l]);
    }
    devmem_free(r->dev, r->dout);
    devmem_free(r->dev, r->dq);
    devmem_free(r->dev, r->dk);
    devmem_free(r->dev, r->dv);
    devmem_free(r->dev, r->ws);
    acts_free(&r->a);
    free(r->params);
    free(r->grads);
    free(r->m1);
    free(r->m2);
    free(r->grads16);
    free(r->pos);
    free(r->tokens);
    free(r->labels);
    free(r->seqs);
    free(r->global_in);
    free(r->global_lab);
    free(r->stage);
    for (int64_t b = 0; r->packs && b < r->local_batch; b++)
        cp_pack_destroy(r->packs[b]);
    free(r->packs);
    free(r->cu);
    free(r->docs);
    /* plans before groups, groups before their context and communicator */
    cp_attn_plan_destroy(r->plan);
    cp_group_destroy(r->group);
    cp_context_destroy(r->ctx);
    cp_context_destroy(r->host);
    cp_comm_destroy(r->cp_comm);
    cp_comm_destroy(r->dpxcp);
    cp_topology_destroy(r->topo);
    /* the world last: a peer still waiting for this rank then gets an error */
    cp_comm_destroy(r->world);
}

static void *rank_main(void *arg)
{
    rank *r = arg;
    int ok = setup_groups(r) == 0 && setup_attention(r) == 0 && setup_buffers(r) == 0 && setup_positions(r) == 0;
    for (int step = 0; ok && step < r->o->steps; step++)
        ok = train_step(r, step) == 0;
    if (ok)
        r->out->hash[r->world_rank] = fingerprint(r->params, r->m.count);
    teardown(r);
    return NULL;
}

/* ---- runs and their comparison --------------------------------------------- */

static int run(const opts *o, const devmem *dev, const run_cfg *c, run_out *out)
{
    const int world = c->cp * c->dp;
    cp_comm **comms = calloc((size_t)world, sizeof *comms);
    rank *ranks = calloc((size_t)world, sizeof *ranks);
    pthread_t *th = calloc((size_t)world, sizeof *th);
    memset(out->loss, 0, (size_t)o->steps * sizeof *out->loss);
    out->failed = 0;
    out->error[0] = 0;
    if (!comms || !ranks || !th || cp_comm_create_local(world, comms) != CP_SUCCESS) {
        snprintf(out->error, sizeof out->error, "cannot create %d in-process ranks: %s", world, cp_last_error());
        free(comms);
        free(ranks);
        free(th);
        return -1;
    }
    for (int i = 0; i < world; i++) {
        ranks[i] = (rank){ .o = o, .r = c, .dev = dev, .out = out, .world = comms[i], .world_rank = i };
        pthread_create(&th[i], NULL, rank_main, &ranks[i]);
    }
    for (int i = 0; i < world; i++)
        pthread_join(th[i], NULL);
    for (int i = 1; i < world && !out->failed; i++)
        if (out->hash[i] != out->hash[0]) {
            out->failed = 1;
            snprintf(out->error, sizeof out->error, "world rank %d's parameters differ from rank 0's", i);
        }
    free(comms);
    free(ranks);
    free(th);
    return out->failed ? -1 : 0;
}

static double max_rel_dev(const double *a, const double *ref, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs(a[i] - ref[i]) / fabs(ref[i]);
        m = d > m || d != d ? d : m;
    }
    return m;
}

static void print_losses(const char *label, const double *l, int n)
{
    printf("  %-32s", label);
    for (int i = 0; i < n; i++)
        printf("%s%.6f", i && i % 10 == 0 ? "\n" "                                   " : " ", l[i]);
    printf("\n");
}

/* packed: the documents of the first step's rows (each step draws others). */
static void print_docs(const opts *o)
{
    const size_t rows = (size_t)o->batch, S = (size_t)o->seq;
    int32_t *in = malloc(rows * S * sizeof *in), *lab = malloc(rows * S * sizeof *lab);
    int64_t *cu = malloc(rows * (MAX_DOCS + 1) * sizeof *cu);
    int *docs = malloc(rows * sizeof *docs);
    if (in && lab && cu && docs) {
        make_packed_batch(o, 0, in, lab, cu, docs);
        for (size_t b = 0; b < rows; b++) {
            printf("  step 0, row %zu: %d documents of", b, docs[b]);
            for (int d = 0; d < docs[b]; d++)
                printf(" %" PRId64, cu[b * (MAX_DOCS + 1) + (size_t)d + 1] - cu[b * (MAX_DOCS + 1) + (size_t)d]);
            printf(" tokens\n");
        }
    }
    free(in);
    free(lab);
    free(cu);
    free(docs);
}

/* Train the baseline and every CP configuration in one dtype; returns the
 * number of runs that failed or deviated beyond the bound. */
static int compare(const opts *o, const devmem *dev, cp_dtype dtype)
{
    const double bound = dtype == CP_DTYPE_F32 ? o->f32_bound : o->bf16_bound;
    run_cfg runs[32];
    int nr = 0;
    /* packed: the baseline is the same rows on one rank (a pack of one
     * rank, the same document mask), and the two "layouts" are two ways of
     * splitting a row: GREEDY (even work) and CONTIGUOUS (T / P each) */
    const cp_layout packed = CP_LAYOUT_PACKED;
    static const cp_balance splits[2] = { CP_BALANCE_GREEDY, CP_BALANCE_CONTIGUOUS };
    runs[nr++] = o->packed ? (run_cfg){ 1, 1, CP_MODE_P2P, packed, 1, dtype, CP_BALANCE_GREEDY }
                           : (run_cfg){ 1, 1, CP_MODE_P2P, CP_LAYOUT_CONTIGUOUS, 1, dtype, CP_BALANCE_AUTO };
    const int cps[] = { 2, 4 };
    for (int i = 0; i < 2; i++)
        for (int m = 0; m < 4; m++)
            for (int l = 0; l < 2; l++)
                runs[nr++] = o->packed ? (run_cfg){ cps[i], 1, (cp_mode)m, packed, 2, dtype, splits[l] }
                                       : (run_cfg){ cps[i], 1, (cp_mode)m, (cp_layout)l, 2, dtype, CP_BALANCE_AUTO };
    for (int m = 0; m < 4; m++)
        for (int l = 0; l < 2; l++)
            runs[nr++] = o->packed ? (run_cfg){ 2, 2, (cp_mode)m, packed, 2, dtype, splits[l] }
                                   : (run_cfg){ 2, 2, (cp_mode)m, (cp_layout)l, 2, dtype, CP_BALANCE_AUTO };

    run_out out = { 0 };
    pthread_mutex_init(&out.lock, NULL);
    out.hash = calloc(8, sizeof *out.hash);
    double *base = calloc((size_t)o->steps, sizeof *base);
    out.loss = calloc((size_t)o->steps, sizeof *out.loss);
    int bad = 0;
    double worst = 0;
    printf("%s: %d steps, global batch %" PRId64 " x %" PRId64 " tokens%s, bound %.1e\n",
           dtype == CP_DTYPE_F32 ? "F32" : "BF16", o->steps, o->batch, o->seq,
           o->packed ? " (packed rows of documents)" : "", bound);
    if (o->packed)
        print_docs(o);
    for (int i = 0; i < nr; i++) {
        const run_cfg *c = &runs[i];
        char label[64];
        snprintf(label, sizeof label, "cp=%d dp=%d %s %s", c->cp, c->dp, mode_name(c->mode),
                 c->layout == CP_LAYOUT_PACKED ? (c->balance == CP_BALANCE_GREEDY ? "greedy" : "contiguous")
                 : c->layout == CP_LAYOUT_ZIGZAG ? "zigzag" : "contiguous");
        if (run(o, dev, c, &out)) {
            printf("  %-32s FAILED: %s\n", label, out.error);
            bad++;
            if (i == 0)
                break; /* nothing to compare with */
            continue;
        }
        if (i == 0) {
            memcpy(base, out.loss, (size_t)o->steps * sizeof *base);
            print_losses("cp=1 (baseline), per step:", base, o->steps);
            printf("  %-32s %10s %10s %12s\n", "run", "first", "last", "max rel dev");
            continue;
        }
        const double dev_ = max_rel_dev(out.loss, base, o->steps);
        worst = dev_ > worst || dev_ != dev_ ? dev_ : worst;
        const int ok = dev_ <= bound;
        bad += !ok;
        printf("  %-32s %10.6f %10.6f %12.2e %s\n", label, out.loss[0], out.loss[o->steps - 1], dev_,
               ok ? "ok" : "EXCEEDS BOUND");
        if (o->verbose)
            print_losses("  per step:", out.loss, o->steps);
    }
    if (nr > 1 && !(bad && base[0] == 0))
        printf("  largest deviation from CP=1 over %d runs: %.2e (bound %.1e)\n", nr - 1, worst, bound);
    free(base);
    free(out.loss);
    free(out.hash);
    pthread_mutex_destroy(&out.lock);
    return bad;
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--steps N] [--dtype f32|bf16|all] [--tiny] [--packed] [--device cpu|cuda]\n"
            "          [--bf16-bound X] [--verbose]\n",
            argv0);
    return 2;
}

int main(int argc, char **argv)
{
    opts o = {
        .model = { .vocab = 64, .dim = 64, .heads = 4, .kv_heads = 2, .head_dim = 16, .ffn = 128, .layers = 2,
                   .rope_base = 10000.0, .norm_eps = 1e-5f },
        .batch = 2,
        .seq = 64,
        .steps = 20,
        .f32_bound = 1e-5,
        /* BF16 keeps 8 significant bits: half an ulp is 2^-9 relative.
         * Rounding in different places (attention merges, gradient sums of
         * other partitions) must not move the loss by more than that. */
        .bf16_bound = 0x1.0p-9,
        .opt = { .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f },
        .seed = 1234,
    };
    int f32 = 1, bf16 = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--steps") && v) {
            o.steps = atoi(v);
            i++;
        } else if (!strcmp(a, "--dtype") && v) {
            f32 = !strcmp(v, "f32") || !strcmp(v, "all");
            bf16 = !strcmp(v, "bf16") || !strcmp(v, "all");
            i++;
        } else if (!strcmp(a, "--device") && v) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda"))
                return usage(argv[0]);
            o.cuda = !strcmp(v, "cuda");
            i++;
        } else if (!strcmp(a, "--bf16-bound") && v) {
            o.bf16_bound = atof(v);
            i++;
        } else if (!strcmp(a, "--tiny")) {
            o.model = (model_cfg){ .vocab = 32, .dim = 32, .heads = 4, .kv_heads = 2, .head_dim = 8, .ffn = 64,
                                   .layers = 1, .rope_base = 10000.0, .norm_eps = 1e-5f };
            o.seq = 16;
        } else if (!strcmp(a, "--verbose")) {
            o.verbose = 1;
        } else if (!strcmp(a, "--packed")) {
            o.packed = 1;
        } else {
            return usage(argv[0]);
        }
    }
    if (o.steps < 1 || (!f32 && !bf16))
        return usage(argv[0]);

    devmem dev;
    char why[256];
    if (devmem_init(&dev, o.cuda, why, sizeof why)) {
        fprintf(stderr, "--device cuda: %s\n", why);
        return 1;
    }
    printf("model: vocab %d, dim %d, %d heads (%d kv), %d layers; device %s\n", o.model.vocab, o.model.dim,
           o.model.heads, o.model.kv_heads, o.model.layers, o.cuda ? "cuda" : "cpu");
    int bad = 0;
    if (f32)
        bad += compare(&o, &dev, CP_DTYPE_F32);
    if (bf16)
        bad += compare(&o, &dev, CP_DTYPE_BF16);
    printf("%s\n", bad ? "FAILED" : o.packed ? "every CP run reproduces the CP=1 losses of the packed rows"
                                           : "every CP run reproduces the CP=1 losses");
    return bad ? 1 : 0;
}
