/* SPDX-License-Identifier: MIT */
/* cp_ckpt_meta internals: the recorded fields, one table that describes
 * them (JSON key, type, valid range), and the checks every way of making a
 * metadata object (create, parse) shares. */
#ifndef INFINICP_CKPT_META_H
#define INFINICP_CKPT_META_H

#include <jansson.h>

#include "core/internal.h"
#include "topology/topology.h"

/* Bumped only for changes old readers must refuse; new keys do not bump it
 * (old readers keep and ignore them). */
#define CPI_CKPT_FORMAT_VERSION 1
/* Value of the "format" key: says what the document is. */
#define CPI_CKPT_FORMAT_NAME "infinicp-checkpoint-cp"

struct cp_ckpt_meta {
    int64_t format_version, library_version;
    int64_t world_size, tp, cp, dp, pp, cp_a2a;
    int64_t mode, layout, seq_len; /* mode, layout: enum values */
    int64_t num_heads, num_kv_heads, head_dim, head_dim_v, dtype;
    char order[CPI_ORDER_LEN + 1];
    json_t *unknown; /* keys of newer versions, kept for writing back; NULL if none */
};

/* One integer (or enumeration) field of the metadata. */
typedef struct cpi_ckpt_field {
    const char *key;           /* JSON key, also the name in messages */
    size_t offset;             /* of its int64_t in struct cp_ckpt_meta */
    int64_t min, max;          /* valid values */
    const char *const *names;  /* enumerations: JSON spelling of 0..max; else NULL */
} cpi_ckpt_field;

extern const cpi_ckpt_field cpi_ckpt_fields[];
extern const size_t cpi_ckpt_num_fields;

static inline int64_t cpi_ckpt_value(const cp_ckpt_meta *m, const cpi_ckpt_field *f)
{
    return *(const int64_t *)(const void *)((const char *)m + f->offset);
}

static inline int64_t *cpi_ckpt_slot(cp_ckpt_meta *m, const cpi_ckpt_field *f)
{
    return (int64_t *)(void *)((char *)m + f->offset);
}

/* The field with this JSON key, or NULL. */
const cpi_ckpt_field *cpi_ckpt_field_by_key(const char *key);

/* Range and consistency checks of a filled-in metadata object. Failures
 * return `status` with a message "<func>: <prefix><key> = <value> ...". */
cp_status cpi_ckpt_validate(const cp_ckpt_meta *m, cp_status status, const char *func, const char *prefix);

/* JSON text of m (no NUL) in a malloc'ed buffer. */
cp_status cpi_ckpt_dump(const cp_ckpt_meta *m, const char *func, char **text, size_t *len);

#endif
