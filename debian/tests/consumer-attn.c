/* SPDX-License-Identifier: MIT */
/*
 * Context-parallel attention the way a user runs it, built against the
 * installed packages: two in-process ranks (one thread each) with a CPU
 * context, a CP group and a plan (F32, BSHD, causal, contiguous layout, p2p
 * ring) compute attention on their halves of a sequence; the result and the
 * log-sum-exp are compared with attention over the whole sequence computed
 * here, directly, in double precision.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infinicp/infinicp.h>

enum { P = 2, B = 2, S = 32, H = 4, KVH = 2, D = 16, SL = S / P };

static float q[B][S][H][D], k[B][S][KVH][D], v[B][S][KVH][D];

struct rank {
    cp_comm *comm;
    float q[B][SL][H][D], k[B][SL][KVH][D], v[B][SL][KVH][D], out[B][SL][H][D];
    float lse[B][H][SL];
    cp_status status;
    char what[64];
    char error[512];
};

/* The same inputs on every run: a small linear congruential generator. */
static float uniform(unsigned *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (float)((*state >> 8) / 16777216.0 * 2.0 - 1.0);
}

static cp_status fail(struct rank *rk, const char *what, cp_status s)
{
    rk->status = s;
    snprintf(rk->what, sizeof rk->what, "%s", what);
    snprintf(rk->error, sizeof rk->error, "%s", cp_last_error());
    return s;
}

static void *run_rank(void *arg)
{
    struct rank *rk = arg;
    cp_context *ctx = NULL;
    cp_group *group = NULL;
    cp_attn_plan *plan = NULL;

    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.timeout_ms = 60000;
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.dtype = CP_DTYPE_F32;
    d.format = CP_FORMAT_BSHD;
    d.batch = B;
    d.seq_len = S;
    d.num_heads = H;
    d.num_kv_heads = KVH;
    d.head_dim = D;
    d.mask = CP_MASK_CAUSAL;
    d.layout = CP_LAYOUT_CONTIGUOUS;
    d.mode = CP_MODE_P2P;

    cp_status s;
    if ((s = cp_context_create(&cc, &ctx)) != CP_SUCCESS)
        fail(rk, "cp_context_create", s);
    else if ((s = cp_group_create(ctx, rk->comm, &gc, &group)) != CP_SUCCESS)
        fail(rk, "cp_group_create", s);
    else if ((s = cp_attn_plan_create(group, &d, &plan)) != CP_SUCCESS)
        fail(rk, "cp_attn_plan_create", s);
    else if ((s = cp_attn_forward(plan, rk->q, rk->k, rk->v, rk->out, &rk->lse[0][0][0], NULL, 0)) !=
             CP_SUCCESS)
        fail(rk, "cp_attn_forward", s);
    cp_attn_plan_destroy(plan);
    cp_group_destroy(group);
    cp_context_destroy(ctx);
    return NULL;
}

/* Attention of query i (global position) of head h, batch b, over keys 0..i. */
static void reference(int b, int i, int h, double out[D], double *lse)
{
    int kvh = h / (H / KVH);
    double scale = 1.0 / sqrt((double)D), score[S], max = -INFINITY, sum = 0;
    for (int j = 0; j <= i; j++) {
        score[j] = 0;
        for (int e = 0; e < D; e++)
            score[j] += (double)q[b][i][h][e] * k[b][j][kvh][e];
        score[j] *= scale;
        if (score[j] > max)
            max = score[j];
    }
    memset(out, 0, D * sizeof out[0]);
    for (int j = 0; j <= i; j++) {
        double w = exp(score[j] - max);
        sum += w;
        for (int e = 0; e < D; e++)
            out[e] += w * v[b][j][kvh][e];
    }
    for (int e = 0; e < D; e++)
        out[e] /= sum;
    *lse = max + log(sum);
}

int main(void)
{
    static struct rank ranks[P];
    unsigned seed = 12345;
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            for (int h = 0; h < H; h++)
                for (int e = 0; e < D; e++)
                    q[b][s][h][e] = uniform(&seed);
            for (int h = 0; h < KVH; h++)
                for (int e = 0; e < D; e++) {
                    k[b][s][h][e] = uniform(&seed);
                    v[b][s][h][e] = uniform(&seed);
                }
        }

    cp_comm *comms[P] = {NULL};
    cp_status s = cp_comm_create_local(P, comms);
    if (s != CP_SUCCESS) {
        printf("cp_comm_create_local: %s: %s\n", cp_status_string(s), cp_last_error());
        return 1;
    }

    /* Contiguous layout: rank r holds global tokens [r*S/P, (r+1)*S/P). */
    pthread_t threads[P];
    for (int r = 0; r < P; r++) {
        struct rank *rk = &ranks[r];
        rk->comm = comms[r];
        for (int b = 0; b < B; b++) {
            memcpy(rk->q[b], q[b][r * SL], sizeof rk->q[b]);
            memcpy(rk->k[b], k[b][r * SL], sizeof rk->k[b]);
            memcpy(rk->v[b], v[b][r * SL], sizeof rk->v[b]);
        }
        if (pthread_create(&threads[r], NULL, run_rank, rk) != 0) {
            printf("pthread_create failed\n");
            return 1;
        }
    }
    for (int r = 0; r < P; r++)
        pthread_join(threads[r], NULL);
    for (int r = 0; r < P; r++)
        cp_comm_destroy(comms[r]);

    int failures = 0;
    double max_err_out = 0, max_err_lse = 0;
    for (int r = 0; r < P; r++) {
        struct rank *rk = &ranks[r];
        if (rk->status != CP_SUCCESS) {
            printf("rank %d: %s: %s: %s\n", r, rk->what, cp_status_string(rk->status), rk->error);
            failures++;
            continue;
        }
        for (int b = 0; b < B; b++)
            for (int t = 0; t < SL; t++)
                for (int h = 0; h < H; h++) {
                    double ref[D], ref_lse;
                    reference(b, r * SL + t, h, ref, &ref_lse);
                    for (int e = 0; e < D; e++) {
                        double err = fabs(rk->out[b][t][h][e] - ref[e]);
                        max_err_out = err > max_err_out ? err : max_err_out;
                    }
                    double err = fabs(rk->lse[b][h][t] - ref_lse);
                    max_err_lse = err > max_err_lse ? err : max_err_lse;
                }
    }
    /* F32 storage, FP32 accumulation over at most S terms of size ~1. */
    const double tol = 1e-4;
    if (!failures) {
        printf("CP=%d p2p causal attention, B=%d S=%d H=%d KVH=%d D=%d: max |out - ref| = %.3g, "
               "max |lse - ref| = %.3g (tolerance %g)\n",
               P, B, S, H, KVH, D, max_err_out, max_err_lse, tol);
        if (!(max_err_out <= tol) || !(max_err_lse <= tol))
            failures++;
    }
    printf("consumer-attn: %s\n", failures ? "failed" : "passed");
    return failures != 0;
}
