/* SPDX-License-Identifier: MIT */
/* cp_ckpt_meta: what a checkpoint records about the CP setup of its run. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/meta.h"

static const char *const mode_names[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };
static const char *const layout_names[] = { "contiguous", "zigzag", "packed" };
static const char *const dtype_names[] = { "f32", "f16", "bf16", "f64", "fp8_e4m3" };

#define INT_FIELD(name, lo, hi) { #name, offsetof(cp_ckpt_meta, name), lo, hi, NULL }
#define ENUM_FIELD(name, names)                                                                   \
    { #name, offsetof(cp_ckpt_meta, name), 0, (int64_t)(sizeof names / sizeof names[0]) - 1, names }

/* In the order the JSON document lists them. */
const cpi_ckpt_field cpi_ckpt_fields[] = {
    INT_FIELD(format_version, 1, CPI_CKPT_FORMAT_VERSION),
    INT_FIELD(library_version, 0, UINT32_MAX),
    INT_FIELD(world_size, 1, INT_MAX),
    INT_FIELD(tp, 1, INT_MAX),
    INT_FIELD(cp, 1, INT_MAX),
    INT_FIELD(dp, 1, INT_MAX),
    INT_FIELD(pp, 1, INT_MAX),
    INT_FIELD(cp_a2a, 1, INT_MAX),
    ENUM_FIELD(mode, mode_names),
    ENUM_FIELD(layout, layout_names),
    INT_FIELD(seq_len, 1, INT64_MAX),
    INT_FIELD(num_heads, 1, INT32_MAX),
    INT_FIELD(num_kv_heads, 1, INT32_MAX),
    INT_FIELD(head_dim, 1, INT32_MAX),
    INT_FIELD(head_dim_v, 1, INT32_MAX),
    ENUM_FIELD(dtype, dtype_names),
};
const size_t cpi_ckpt_num_fields = sizeof cpi_ckpt_fields / sizeof cpi_ckpt_fields[0];

const cpi_ckpt_field *cpi_ckpt_field_by_key(const char *key)
{
    for (size_t i = 0; i < cpi_ckpt_num_fields; i++)
        if (!strcmp(cpi_ckpt_fields[i].key, key))
            return &cpi_ckpt_fields[i];
    return NULL;
}

static int64_t sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

cp_status cpi_ckpt_validate(const cp_ckpt_meta *m, cp_status status, const char *func, const char *prefix)
{
    for (size_t i = 0; i < cpi_ckpt_num_fields; i++) {
        const cpi_ckpt_field *f = &cpi_ckpt_fields[i];
        int64_t v = cpi_ckpt_value(m, f);
        if (v < f->min || v > f->max)
            return cpi_error(status, "%s: %s%s = %lld (must be in [%lld, %lld])", func, prefix, f->key,
                             (long long)v, (long long)f->min, (long long)f->max);
    }
    int64_t product = sat_mul(sat_mul(sat_mul(m->tp, m->cp), m->dp), m->pp);
    if (product != m->world_size)
        return cpi_error(status, "%s: %stp*cp*dp*pp = %lld*%lld*%lld*%lld != %sworld_size = %lld", func, prefix,
                         (long long)m->tp, (long long)m->cp, (long long)m->dp, (long long)m->pp, prefix,
                         (long long)m->world_size);
    if (m->cp % m->cp_a2a)
        return cpi_error(status, "%s: %scp_a2a = %lld does not divide %scp = %lld", func, prefix,
                         (long long)m->cp_a2a, prefix, (long long)m->cp);
    if (m->num_heads % m->num_kv_heads)
        return cpi_error(status, "%s: %snum_kv_heads = %lld does not divide %snum_heads = %lld", func, prefix,
                         (long long)m->num_kv_heads, prefix, (long long)m->num_heads);
    int64_t parts = m->layout == CP_LAYOUT_ZIGZAG ? 2 * m->cp : m->cp;
    if (m->seq_len % parts)
        return cpi_error(status, "%s: %sseq_len = %lld is not divisible by %lld (cp = %lld, layout %s)", func,
                         prefix, (long long)m->seq_len, (long long)parts, (long long)m->cp,
                         layout_names[m->layout]);
    int order[CPI_NUM_AXES];
    if (cpi_topology_parse_order(func, "order", m->order, order) != CP_SUCCESS)
        return status; /* keeps the parser's message, with our status */
    return CP_SUCCESS;
}

/* First published cp_attn_desc: everything up to mode. */
#define ATTN_DESC_V1_SIZE (offsetof(cp_attn_desc, mode) + sizeof(cp_mode))

CP_EXPORT cp_status cp_ckpt_meta_create(const cp_topology *t, const cp_attn_desc *d, cp_ckpt_meta **out)
{
    CPI_CHECK_PTR(out);
    *out = NULL;
    CPI_CHECK_PTR(t);
    CPI_CHECK_PTR(d);
    static const cp_attn_desc defaults = CP_ATTN_DESC_INIT;
    cp_attn_desc a;
    CPI_TRY(cpi_copy_config(&a, sizeof a, &defaults, d, ATTN_DESC_V1_SIZE, __func__, "d"));
    /* Not recorded, but a descriptor with them out of range describes no run. */
    CPI_CHECK(a.format == CP_FORMAT_BSHD || a.format == CP_FORMAT_SBHD,
              "%s: d->format = %d (must be CP_FORMAT_BSHD (0) or CP_FORMAT_SBHD (1))", __func__, (int)a.format);
    CPI_CHECK(a.mask == CP_MASK_NONE || a.mask == CP_MASK_CAUSAL,
              "%s: d->mask = %d (must be CP_MASK_NONE (0) or CP_MASK_CAUSAL (1))", __func__, (int)a.mask);

    cp_ckpt_meta *m = cpi_calloc(1, sizeof *m);
    if (!m)
        return CP_ERROR_OUT_OF_MEMORY;
    m->format_version = CPI_CKPT_FORMAT_VERSION;
    m->library_version = cp_version();
    m->world_size = t->world_size;
    m->tp = t->size[CPI_AXIS_TP];
    m->cp = t->size[CPI_AXIS_CP];
    m->dp = t->size[CPI_AXIS_DP];
    m->pp = t->size[CPI_AXIS_PP];
    m->cp_a2a = t->cp_a2a;
    memcpy(m->order, t->order_name, sizeof m->order);
    m->mode = (int)a.mode; /* through int: an enum may be unsigned */
    m->layout = (int)a.layout;
    m->seq_len = a.seq_len;
    m->num_heads = a.num_heads;
    m->num_kv_heads = a.num_kv_heads;
    m->head_dim = a.head_dim;
    m->head_dim_v = a.head_dim_v ? a.head_dim_v : a.head_dim;
    m->dtype = (int)a.dtype;
    /* The topology's fields are valid by construction, so every failure
     * names a field of the descriptor. */
    cp_status s = cpi_ckpt_validate(m, CP_ERROR_INVALID_ARGUMENT, __func__, "d->");
    if (s != CP_SUCCESS) {
        cp_ckpt_meta_destroy(m);
        return s;
    }
    *out = m;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_ckpt_meta_get(const cp_ckpt_meta *m, const char *key, int64_t *value)
{
    CPI_CHECK_PTR(m);
    CPI_CHECK_PTR(key);
    CPI_CHECK_PTR(value);
    const cpi_ckpt_field *f = cpi_ckpt_field_by_key(key);
    if (f) {
        *value = cpi_ckpt_value(m, f);
        return CP_SUCCESS;
    }
    CPI_CHECK(strcmp(key, "order") && strcmp(key, "format") && strcmp(key, "checksum"),
              "%s: key = \"%s\" is a string, not an integer", __func__, key);
    json_t *v = m->unknown ? json_object_get(m->unknown, key) : NULL;
    if (!v)
        return cpi_error(CP_ERROR_NOT_FOUND, "%s: key = \"%.64s\" is not in the metadata", __func__, key);
    CPI_CHECK(json_is_integer(v), "%s: key = \"%.64s\" does not hold an integer", __func__, key);
    *value = json_integer_value(v);
    return CP_SUCCESS;
}

CP_EXPORT void cp_ckpt_meta_destroy(cp_ckpt_meta *m)
{
    if (!m)
        return;
    json_decref(m->unknown);
    free(m);
}
