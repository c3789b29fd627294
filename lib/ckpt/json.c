/* SPDX-License-Identifier: MIT */
/* The JSON form of cp_ckpt_meta, through jansson. The document is a flat
 * object (jq .cp meta.json); its "checksum" is FNV-1a 64 over the canonical
 * form of every other key: jansson's compact dump with sorted keys and
 * ASCII escapes. Unknown keys are kept, written back and covered by the
 * checksum, so a document from a newer version survives a round trip. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/meta.h"

/* Deeper documents are refused; ours are one level deep. */
#define MAX_DEPTH 8

#define CHECKSUM_PREFIX "fnv1a64:"
#define CHECKSUM_LEN (sizeof CHECKSUM_PREFIX - 1 + 16)

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* The checksum of a document object that has no "checksum" key. */
static cp_status checksum_of(const json_t *doc, char out[CHECKSUM_LEN + 1])
{
    char *canon = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
    if (!canon)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "out of host memory serialising checkpoint metadata");
    snprintf(out, CHECKSUM_LEN + 1, CHECKSUM_PREFIX "%016" PRIx64, fnv1a64(canon));
    free(canon);
    return CP_SUCCESS;
}

/* ---- writing ------------------------------------------------------------ */

static json_t *build_document(const cp_ckpt_meta *m)
{
    json_t *doc = json_object();
    int bad = !doc || json_object_set_new(doc, "format", json_string(CPI_CKPT_FORMAT_NAME));
    for (size_t i = 0; !bad && i < cpi_ckpt_num_fields; i++) {
        const cpi_ckpt_field *f = &cpi_ckpt_fields[i];
        int64_t v = cpi_ckpt_value(m, f);
        bad |= json_object_set_new(doc, f->key, f->names ? json_string(f->names[v]) : json_integer(v));
        if (f->offset == offsetof(cp_ckpt_meta, cp_a2a)) /* the axis order goes with the sizes */
            bad |= json_object_set_new(doc, "order", json_string(m->order));
    }
    if (!bad && m->unknown) {
        const char *key;
        json_t *value;
        json_object_foreach(m->unknown, key, value) {
            bad |= json_object_set(doc, key, value);
        }
    }
    if (bad) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

cp_status cpi_ckpt_dump(const cp_ckpt_meta *m, const char *func, char **text, size_t *len)
{
    *text = NULL;
    json_t *doc = build_document(m);
    if (!doc)
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory building the JSON document", func);
    char sum[CHECKSUM_LEN + 1];
    cp_status s = checksum_of(doc, sum);
    if (s == CP_SUCCESS && json_object_set_new(doc, "checksum", json_string(sum)))
        s = cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory building the JSON document", func);
    char *out = NULL;
    if (s == CP_SUCCESS) {
        out = json_dumps(doc, JSON_INDENT(2));
        if (!out)
            s = cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory serialising the document", func);
    }
    json_decref(doc);
    if (s != CP_SUCCESS)
        return s;
    size_t n = strlen(out);
    if (n + 1 > CP_CKPT_META_MAX_BYTES) {
        free(out);
        return cpi_error(CP_ERROR_FORMAT, "%s: the document would be %zu bytes, over the %u-byte limit readers accept",
                         func, n + 1, CP_CKPT_META_MAX_BYTES);
    }
    /* A text file ends with a newline; json_dumps leaves room for none. */
    char *grown = realloc(out, n + 2);
    if (!grown) {
        free(out);
        return cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory", func);
    }
    grown[n] = '\n';
    grown[n + 1] = '\0';
    *text = grown;
    *len = n + 1;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_ckpt_meta_to_json(const cp_ckpt_meta *m, char *buf, size_t cap, size_t *len)
{
    CPI_CHECK_PTR(len);
    *len = 0;
    CPI_CHECK_PTR(m);
    CPI_CHECK(buf != NULL || cap == 0, "%s: buf is NULL but cap = %zu", __func__, cap);
    char *text;
    size_t n;
    CPI_TRY(cpi_ckpt_dump(m, __func__, &text, &n));
    *len = n;
    cp_status s = CP_SUCCESS;
    if (buf) {
        if (cap < n + 1)
            s = cpi_error(CP_ERROR_INVALID_ARGUMENT, "%s: cap = %zu is too small for the %zu-byte document and its NUL",
                          __func__, cap, n);
        else
            memcpy(buf, text, n + 1);
    }
    free(text);
    return s;
}

/* ---- reading ------------------------------------------------------------ */

/* "a string", "an integer", ...: what a value is, for messages. */
static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

/* Whether v nests no deeper than `left` levels. */
static int depth_ok(const json_t *v, int left)
{
    if (left <= 0)
        return 0;
    if (json_is_object(v)) {
        const char *key;
        json_t *child;
        json_object_foreach((json_t *)v, key, child) {
            if (!depth_ok(child, left - 1))
                return 0;
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *child;
        json_array_foreach(v, i, child) {
            if (!depth_ok(child, left - 1))
                return 0;
        }
    }
    return 1;
}

#define FORMAT_ERROR(...) cpi_error(CP_ERROR_FORMAT, __VA_ARGS__)

static const char *const FN = "cp_ckpt_meta_from_json";

static cp_status required(const json_t *doc, const char *key, json_t **v)
{
    *v = json_object_get(doc, key);
    if (!*v)
        return FORMAT_ERROR("%s: missing required key \"%s\"", FN, key);
    return CP_SUCCESS;
}

static cp_status read_string(const json_t *doc, const char *key, const char **s)
{
    json_t *v;
    CPI_TRY(required(doc, key, &v));
    if (!json_is_string(v))
        return FORMAT_ERROR("%s: key \"%s\" is %s, must be a string", FN, key, type_name(v));
    *s = json_string_value(v);
    return CP_SUCCESS;
}

static cp_status read_field(const json_t *doc, const cpi_ckpt_field *f, int64_t *out)
{
    json_t *v;
    CPI_TRY(required(doc, f->key, &v));
    if (!f->names) {
        if (!json_is_integer(v))
            return FORMAT_ERROR("%s: key \"%s\" is %s, must be an integer", FN, f->key, type_name(v));
        *out = json_integer_value(v);
        return CP_SUCCESS;
    }
    if (!json_is_string(v))
        return FORMAT_ERROR("%s: key \"%s\" is %s, must be a string", FN, f->key, type_name(v));
    for (int64_t i = 0; i <= f->max; i++)
        if (!strcmp(json_string_value(v), f->names[i])) {
            *out = i;
            return CP_SUCCESS;
        }
    char allowed[128] = "";
    for (int64_t i = 0; i <= f->max; i++)
        snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s", i ? ", " : "", f->names[i]);
    return FORMAT_ERROR("%s: key \"%s\" = \"%.32s\" is not one of %s", FN, f->key, json_string_value(v), allowed);
}

static int is_known_key(const char *key)
{
    return cpi_ckpt_field_by_key(key) || !strcmp(key, "format") || !strcmp(key, "order") ||
           !strcmp(key, "checksum");
}

/* Fill m from a parsed document object; checks everything but the checksum. */
static cp_status read_document(const json_t *doc, cp_ckpt_meta *m)
{
    if (!depth_ok(doc, MAX_DEPTH))
        return FORMAT_ERROR("%s: the document nests deeper than %d levels", FN, MAX_DEPTH);
    const char *s;
    CPI_TRY(read_string(doc, "format", &s));
    if (strcmp(s, CPI_CKPT_FORMAT_NAME))
        return FORMAT_ERROR("%s: key \"format\" = \"%.40s\" (expected \"%s\")", FN, s, CPI_CKPT_FORMAT_NAME);
    /* The version first: a newer format may differ in anything else. */
    CPI_TRY(read_field(doc, cpi_ckpt_field_by_key("format_version"), &m->format_version));
    if (m->format_version > CPI_CKPT_FORMAT_VERSION)
        return cpi_error(CP_ERROR_UNSUPPORTED, "%s: format_version = %lld is newer than this library reads (%d)",
                         FN, (long long)m->format_version, CPI_CKPT_FORMAT_VERSION);
    for (size_t i = 0; i < cpi_ckpt_num_fields; i++)
        CPI_TRY(read_field(doc, &cpi_ckpt_fields[i], cpi_ckpt_slot(m, &cpi_ckpt_fields[i])));
    CPI_TRY(read_string(doc, "order", &s));
    if (strlen(s) > CPI_ORDER_LEN)
        return FORMAT_ERROR("%s: key \"order\" = \"%.40s\" is not a permutation of tp, cp, dp, pp", FN, s);
    strcpy(m->order, s);
    CPI_TRY(read_string(doc, "checksum", &s));
    CPI_TRY(cpi_ckpt_validate(m, CP_ERROR_FORMAT, FN, ""));

    const char *key;
    json_t *value;
    json_object_foreach((json_t *)doc, key, value) {
        if (is_known_key(key))
            continue;
        if (!m->unknown && !(m->unknown = json_object()))
            return cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory", FN);
        if (json_object_set(m->unknown, key, value))
            return cpi_error(CP_ERROR_OUT_OF_MEMORY, "%s: out of host memory", FN);
    }
    return CP_SUCCESS;
}

/* The checksum must match the document minus its "checksum" key. */
static cp_status verify_checksum(json_t *doc)
{
    /* A copy: deleting the key below frees the string. */
    char stored[CHECKSUM_LEN + 2];
    snprintf(stored, sizeof stored, "%s", json_string_value(json_object_get(doc, "checksum")));
    json_object_del(doc, "checksum");
    char want[CHECKSUM_LEN + 1];
    CPI_TRY(checksum_of(doc, want));
    if (strcmp(stored, want)) /* a longer stored value differs in its extra byte */
        return FORMAT_ERROR("%s: checksum = \"%.*s\" does not match the content (%s)", FN, (int)CHECKSUM_LEN,
                            stored, want);
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_ckpt_meta_from_json(const char *json, size_t len, cp_ckpt_meta **out)
{
    CPI_CHECK_PTR(out);
    *out = NULL;
    CPI_CHECK_PTR(json);
    if (len > CP_CKPT_META_MAX_BYTES)
        return FORMAT_ERROR("%s: len = %zu bytes is over the %u-byte limit", __func__, len, CP_CKPT_META_MAX_BYTES);
    json_error_t err;
    json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!doc)
        return FORMAT_ERROR("%s: not valid JSON at line %d, column %d: %s", __func__, err.line, err.column,
                            err.text);
    if (!json_is_object(doc)) {
        cp_status s = FORMAT_ERROR("%s: the document is %s, not an object", __func__, type_name(doc));
        json_decref(doc);
        return s;
    }
    cp_ckpt_meta *m = cpi_calloc(1, sizeof *m);
    cp_status s = m ? read_document(doc, m) : CP_ERROR_OUT_OF_MEMORY;
    if (s == CP_SUCCESS)
        s = verify_checksum(doc);
    json_decref(doc);
    if (s != CP_SUCCESS) {
        cp_ckpt_meta_destroy(m);
        return s;
    }
    *out = m;
    return CP_SUCCESS;
}
