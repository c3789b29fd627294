/* SPDX-License-Identifier: MIT */
/* Resuming a checkpoint under another setup: which changes keep the saved
 * state loadable, and which ranks write what.
 *
 * Parameters (and non-sharded optimizer state) are replicated over DP x CP:
 * every rank of a DPxCP group holds the same copy, so a change of cp, dp,
 * cp_a2a, order, mode, layout or sequence length leaves them valid. State
 * sharded over DP x CP (ZeRO) is cut into dp*cp pieces: a change of that
 * product needs resharding. tp and pp cut the parameters themselves, and
 * the attention shape and dtype define them: a change there is not a resume. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/meta.h"

/* What a change of each compared field means; unlisted fields
 * (format_version, library_version, world_size, unknown keys) are not
 * compared: world_size follows from the others. */
static const struct {
    const char *key;
    cp_ckpt_verdict verdict;
} rules[] = {
    { "tp", CP_CKPT_INCOMPATIBLE },           { "pp", CP_CKPT_INCOMPATIBLE },
    { "num_heads", CP_CKPT_INCOMPATIBLE },    { "num_kv_heads", CP_CKPT_INCOMPATIBLE },
    { "head_dim", CP_CKPT_INCOMPATIBLE },     { "head_dim_v", CP_CKPT_INCOMPATIBLE },
    { "dtype", CP_CKPT_INCOMPATIBLE },        { "dp*cp", CP_CKPT_NEEDS_RESHARD },
    { "cp", CP_CKPT_COMPATIBLE },             { "dp", CP_CKPT_COMPATIBLE },
    { "cp_a2a", CP_CKPT_COMPATIBLE },         { "order", CP_CKPT_COMPATIBLE },
    { "mode", CP_CKPT_COMPATIBLE },           { "layout", CP_CKPT_COMPATIBLE },
    { "seq_len", CP_CKPT_COMPATIBLE },
};
#define NUM_RULES (sizeof rules / sizeof rules[0])

static const char *const verdict_words[] = { "identical", "compatible", "needs resharding", "incompatible" };

/* Bounded appends to the reason line; truncation is silent. */
typedef struct line {
    char *buf;
    size_t cap, len;
} line;

static void append(line *l, const char *fmt, ...) CP_PRINTF(2, 3);
static void append(line *l, const char *fmt, ...)
{
    if (l->len + 1 >= l->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->buf + l->len, l->cap - l->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        l->len = l->len + (size_t)n < l->cap ? l->len + (size_t)n : l->cap - 1;
}

/* Appends "key old -> new" if the field differs; returns whether it did. */
static int describe(line *l, const char *key, const cp_ckpt_meta *a, const cp_ckpt_meta *b, int first)
{
    const char *sep = first ? "" : ", ";
    if (!strcmp(key, "order")) {
        if (!strcmp(a->order, b->order))
            return 0;
        append(l, "%sorder %s -> %s", sep, a->order, b->order);
        return 1;
    }
    if (!strcmp(key, "dp*cp")) {
        int64_t x = a->dp * a->cp, y = b->dp * b->cp; /* both are divisors of an int world */
        if (x == y)
            return 0;
        append(l, "%sdp*cp %lld -> %lld", sep, (long long)x, (long long)y);
        return 1;
    }
    const cpi_ckpt_field *f = cpi_ckpt_field_by_key(key);
    int64_t x = cpi_ckpt_value(a, f), y = cpi_ckpt_value(b, f);
    if (x == y)
        return 0;
    if (f->names)
        append(l, "%s%s %s -> %s", sep, key, f->names[x], f->names[y]);
    else
        append(l, "%s%s %lld -> %lld", sep, key, (long long)x, (long long)y);
    return 1;
}

CP_EXPORT cp_status cp_ckpt_meta_check(const cp_ckpt_meta *saved, const cp_ckpt_meta *current,
                                       cp_ckpt_verdict *verdict, char *reason, size_t reason_cap)
{
    CPI_CHECK_PTR(saved);
    CPI_CHECK_PTR(current);
    CPI_CHECK_PTR(verdict);
    CPI_CHECK(reason != NULL || reason_cap == 0, "%s: reason is NULL but reason_cap = %zu", __func__,
              reason_cap);
    /* The verdict is the most severe rule among the changed fields. */
    cp_ckpt_verdict v = CP_CKPT_IDENTICAL;
    line scratch = { NULL, 0, 0 };
    for (size_t i = 0; i < NUM_RULES; i++)
        if (rules[i].verdict > v && describe(&scratch, rules[i].key, saved, current, 1))
            v = rules[i].verdict;
    *verdict = v;
    if (reason_cap == 0)
        return CP_SUCCESS;

    line l = { reason, reason_cap, 0 };
    reason[0] = '\0';
    append(&l, "%s: ", verdict_words[v]);
    int first = 1;
    for (int sev = CP_CKPT_INCOMPATIBLE; sev > CP_CKPT_IDENTICAL; sev--)
        for (size_t i = 0; i < NUM_RULES; i++)
            if ((int)rules[i].verdict == sev && describe(&l, rules[i].key, saved, current, first))
                first = 0;
    if (first)
        append(&l, "same CP setup");
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_ckpt_is_writer(const cp_topology *t, int rank, cp_ckpt_role role, int *is_writer)
{
    CPI_CHECK_PTR(is_writer);
    *is_writer = 0;
    CPI_CHECK_PTR(t);
    CPI_CHECK(rank >= 0 && rank < t->world_size, "%s: rank = %d (must be in [0, world_size = %d))", __func__,
              rank, t->world_size);
    CPI_CHECK(role == CP_CKPT_REPLICATED || role == CP_CKPT_SHARDED,
              "%s: role = %d (must be CP_CKPT_REPLICATED (0) or CP_CKPT_SHARDED (1))", __func__, (int)role);
    if (role == CP_CKPT_SHARDED) {
        *is_writer = 1; /* each rank owns one shard of the DPxCP group */
        return CP_SUCCESS;
    }
    cp_coords c;
    CPI_TRY(cp_topology_coords(t, rank, &c));
    *is_writer = c.dp == 0 && c.cp == 0;
    return CP_SUCCESS;
}
