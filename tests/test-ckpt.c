/* SPDX-License-Identifier: MIT */
/*
 * Checkpoint CP metadata: the JSON document (read back with jansson here,
 * its checksum recomputed here), hostile documents, atomic saves under
 * SIGKILL, what a save does when fsync fails, names at the system's limit,
 * files that are not regular, the resume verdicts against rules written
 * out here, and which ranks write.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include <infinicp/infinicp.h>

#include "testutil.h"

/* ---- building metadata -------------------------------------------------- */

typedef struct setup {
    int world, tp, cp, dp, pp, a2a;
    const char *order;
    cp_mode mode;
    cp_layout layout;
    int64_t seq_len;
    int32_t heads, kv_heads, head_dim, head_dim_v;
    cp_dtype dtype;
} setup;

static const setup base = { 16, 2, 4, 2, 1, 2, "tp-cp-dp-pp", CP_MODE_P2P, CP_LAYOUT_ZIGZAG, 4096,
                            32, 8, 128, 64, CP_DTYPE_BF16 };

static cp_status create_meta(const setup *s, cp_ckpt_meta **out)
{
    cp_topology_config tc = CP_TOPOLOGY_CONFIG_INIT;
    tc.world_size = s->world;
    tc.tp = s->tp;
    tc.cp = s->cp;
    tc.dp = s->dp;
    tc.pp = s->pp;
    tc.cp_a2a = s->a2a;
    tc.order = s->order;
    cp_topology *t;
    assert_int_equal(cp_topology_create(&tc, &t), CP_SUCCESS);
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.dtype = s->dtype;
    d.batch = 3;
    d.seq_len = s->seq_len;
    d.num_heads = s->heads;
    d.num_kv_heads = s->kv_heads;
    d.head_dim = s->head_dim;
    d.head_dim_v = s->head_dim_v;
    d.layout = s->layout;
    d.mode = s->mode;
    cp_status st = cp_ckpt_meta_create(t, &d, out);
    cp_topology_destroy(t);
    return st;
}

static cp_ckpt_meta *make(const setup *s)
{
    cp_ckpt_meta *m = NULL;
    cp_status st = create_meta(s, &m);
    if (st != CP_SUCCESS)
        fail_msg("cp_ckpt_meta_create: %s", cp_last_error());
    return m;
}

static char *to_json(const cp_ckpt_meta *m, size_t *len)
{
    size_t n = 0;
    assert_int_equal(cp_ckpt_meta_to_json(m, NULL, 0, &n), CP_SUCCESS);
    char *buf = malloc(n + 1);
    assert_non_null(buf);
    assert_int_equal(cp_ckpt_meta_to_json(m, buf, n + 1, len), CP_SUCCESS);
    assert_int_equal(*len, n);
    assert_int_equal(strlen(buf), n);
    return buf;
}

/* ---- the document, independently --------------------------------------- */

/* FNV-1a 64 of the canonical form (compact, sorted keys, ASCII), as the
 * format documentation defines the checksum. */
static void expected_checksum(const json_t *doc_without_checksum, char out[32])
{
    char *canon = json_dumps(doc_without_checksum, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
    assert_non_null(canon);
    uint64_t h = 14695981039346656037ull;
    for (const unsigned char *p = (const unsigned char *)canon; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    free(canon);
    snprintf(out, 32, "fnv1a64:%016" PRIx64, h);
}

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *doc = json_loads(text, 0, &e);
    if (!doc)
        fail_msg("the library wrote invalid JSON: %s", e.text);
    return doc;
}

/* Serialise doc with a freshly computed checksum (replacing any). */
static char *reseal(json_t *doc)
{
    json_object_del(doc, "checksum");
    char sum[32];
    expected_checksum(doc, sum);
    json_object_set_new(doc, "checksum", json_string(sum));
    char *text = json_dumps(doc, JSON_INDENT(1));
    assert_non_null(text);
    return text;
}

static json_t *base_doc(void)
{
    cp_ckpt_meta *m = make(&base);
    size_t n;
    char *text = to_json(m, &n);
    json_t *doc = parse(text);
    free(text);
    cp_ckpt_meta_destroy(m);
    return doc;
}

static cp_status from_text(const char *text, cp_ckpt_meta **out)
{
    return cp_ckpt_meta_from_json(text, strlen(text), out);
}

/* Parse a document and expect `status` with `needle` in the message. */
#define EXPECT_DOC(text, status, needle)                                                          \
    do {                                                                                          \
        cp_ckpt_meta *doc_m_ = (cp_ckpt_meta *)1;                                                 \
        EXPECT_ERROR(from_text((text), &doc_m_), (status), (needle));                             \
        assert_null(doc_m_);                                                                      \
    } while (0)

static void test_document_records_the_setup(void **state)
{
    (void)state;
    cp_ckpt_meta *m = make(&base);
    size_t n;
    char *text = to_json(m, &n);
    assert_int_equal(text[n - 1], '\n');
    json_t *doc = parse(text);
    assert_true(json_is_object(doc));
    /* every value as the setup says, in the documented spelling */
    struct {
        const char *key;
        json_int_t v;
    } ints[] = { { "format_version", 1 }, { "library_version", CP_VERSION }, { "world_size", 16 }, { "tp", 2 },
                 { "cp", 4 }, { "dp", 2 }, { "pp", 1 }, { "cp_a2a", 2 }, { "seq_len", 4096 },
                 { "num_heads", 32 }, { "num_kv_heads", 8 }, { "head_dim", 128 }, { "head_dim_v", 64 } };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        json_t *v = json_object_get(doc, ints[i].key);
        assert_non_null(v);
        assert_true(json_is_integer(v));
        assert_int_equal(json_integer_value(v), ints[i].v);
        int64_t got;
        assert_int_equal(cp_ckpt_meta_get(m, ints[i].key, &got), CP_SUCCESS);
        assert_int_equal(got, ints[i].v);
    }
    struct {
        const char *key, *v;
        int64_t e;
    } strs[] = { { "format", "infinicp-checkpoint-cp", -1 }, { "order", "tp-cp-dp-pp", -1 },
                 { "mode", "p2p", CP_MODE_P2P }, { "layout", "zigzag", CP_LAYOUT_ZIGZAG },
                 { "dtype", "bf16", CP_DTYPE_BF16 } };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        json_t *v = json_object_get(doc, strs[i].key);
        assert_non_null(v);
        assert_string_equal(json_string_value(v), strs[i].v);
        int64_t got;
        if (strs[i].e >= 0) {
            assert_int_equal(cp_ckpt_meta_get(m, strs[i].key, &got), CP_SUCCESS);
            assert_int_equal(got, strs[i].e);
        }
    }
    /* nothing else but the checksum, and the checksum is right */
    assert_int_equal(json_object_size(doc), sizeof ints / sizeof ints[0] + sizeof strs / sizeof strs[0] + 1);
    char stored[64];
    snprintf(stored, sizeof stored, "%s", json_string_value(json_object_get(doc, "checksum")));
    json_object_del(doc, "checksum");
    char want[32];
    expected_checksum(doc, want);
    assert_string_equal(stored, want);
    json_decref(doc);

    /* head_dim_v 0 means head_dim */
    setup s = base;
    s.head_dim_v = 0;
    cp_ckpt_meta *m2 = make(&s);
    int64_t v;
    assert_int_equal(cp_ckpt_meta_get(m2, "head_dim_v", &v), CP_SUCCESS);
    assert_int_equal(v, 128);
    cp_ckpt_meta_destroy(m2);

    /* a round trip gives the same document */
    cp_ckpt_meta *back;
    assert_int_equal(cp_ckpt_meta_from_json(text, n, &back), CP_SUCCESS);
    size_t n2;
    char *again = to_json(back, &n2);
    assert_string_equal(again, text);
    free(again);
    cp_ckpt_meta_destroy(back);
    free(text);
    cp_ckpt_meta_destroy(m);
}

static void test_get_and_to_json_arguments(void **state)
{
    (void)state;
    cp_ckpt_meta *m = make(&base);
    int64_t v = 5;
    EXPECT_ERROR(cp_ckpt_meta_get(m, "nope", &v), CP_ERROR_NOT_FOUND, "\"nope\"");
    EXPECT_ERROR(cp_ckpt_meta_get(m, "order", &v), CP_ERROR_INVALID_ARGUMENT, "\"order\" is a string");
    EXPECT_ERROR(cp_ckpt_meta_get(m, NULL, &v), CP_ERROR_INVALID_ARGUMENT, "key is NULL");
    EXPECT_ERROR(cp_ckpt_meta_get(NULL, "cp", &v), CP_ERROR_INVALID_ARGUMENT, "m is NULL");
    EXPECT_ERROR(cp_ckpt_meta_get(m, "cp", NULL), CP_ERROR_INVALID_ARGUMENT, "value is NULL");
    size_t n, len;
    assert_int_equal(cp_ckpt_meta_to_json(m, NULL, 0, &n), CP_SUCCESS);
    char *small = malloc(n);
    EXPECT_ERROR(cp_ckpt_meta_to_json(m, small, n, &len), CP_ERROR_INVALID_ARGUMENT, "cap = ");
    assert_int_equal(len, n); /* the needed length is still reported */
    free(small);
    EXPECT_ERROR(cp_ckpt_meta_to_json(m, NULL, 10, &len), CP_ERROR_INVALID_ARGUMENT, "buf is NULL but cap = 10");
    EXPECT_ERROR(cp_ckpt_meta_to_json(m, NULL, 0, NULL), CP_ERROR_INVALID_ARGUMENT, "len is NULL");
    EXPECT_ERROR(cp_ckpt_meta_to_json(NULL, NULL, 0, &len), CP_ERROR_INVALID_ARGUMENT, "m is NULL");
    cp_ckpt_meta_destroy(m);
    cp_ckpt_meta_destroy(NULL);
}

static void test_create_rejects_bad_descriptors(void **state)
{
    (void)state;
    const cp_status E = CP_ERROR_INVALID_ARGUMENT;
    cp_ckpt_meta *m = (cp_ckpt_meta *)1;
    setup s = base;
    s.heads = 0;
    EXPECT_ERROR(create_meta(&s, &m), E, "d->num_heads = 0");
    assert_null(m);
    s = base;
    s.kv_heads = 5;
    EXPECT_ERROR(create_meta(&s, &m), E, "d->num_kv_heads = 5 does not divide d->num_heads = 32");
    s = base;
    s.seq_len = 4100; /* divisible by cp = 4, not by 2*cp */
    EXPECT_ERROR(create_meta(&s, &m), E, "d->seq_len = 4100 is not divisible by 8");
    s = base;
    s.mode = (cp_mode)9;
    EXPECT_ERROR(create_meta(&s, &m), E, "d->mode = 9");
    s = base;
    s.dtype = (cp_dtype)-1;
    EXPECT_ERROR(create_meta(&s, &m), E, "d->dtype = -1");
    s = base;
    s.head_dim = -3;
    EXPECT_ERROR(create_meta(&s, &m), E, "d->head_dim = -3");

    cp_topology *t;
    assert_int_equal(cp_topology_create(NULL, &t), CP_SUCCESS);
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    EXPECT_ERROR(cp_ckpt_meta_create(t, NULL, &m), E, "d is NULL");
    EXPECT_ERROR(cp_ckpt_meta_create(NULL, &d, &m), E, "t is NULL");
    EXPECT_ERROR(cp_ckpt_meta_create(t, &d, NULL), E, "out is NULL");
    d.struct_size = 4;
    EXPECT_ERROR(cp_ckpt_meta_create(t, &d, &m), E, "d->struct_size = 4");
    cp_topology_destroy(t);
}

/* ---- hostile documents -------------------------------------------------- */

static void test_unknown_keys_are_kept(void **state)
{
    (void)state;
    json_t *doc = base_doc();
    json_object_set_new(doc, "future_count", json_integer(42));
    json_object_set_new(doc, "future_note", json_string("caf\xc3\xa9"));
    json_object_set_new(doc, "future_tree", json_pack("{s:[i,f,{s:n}]}", "a", 1, 0.1, "b"));
    char *text = reseal(doc);
    json_decref(doc);
    cp_ckpt_meta *m;
    assert_int_equal(from_text(text, &m), CP_SUCCESS);
    int64_t v;
    assert_int_equal(cp_ckpt_meta_get(m, "future_count", &v), CP_SUCCESS);
    assert_int_equal(v, 42);
    EXPECT_ERROR(cp_ckpt_meta_get(m, "future_note", &v), CP_ERROR_INVALID_ARGUMENT, "does not hold an integer");
    /* written back, and still verifiable */
    size_t n;
    char *out = to_json(m, &n);
    json_t *back = parse(out);
    assert_int_equal(json_integer_value(json_object_get(back, "future_count")), 42);
    assert_string_equal(json_string_value(json_object_get(back, "future_note")), "caf\xc3\xa9");
    json_t *orig = parse(text);
    assert_true(json_equal(json_object_get(back, "future_tree"), json_object_get(orig, "future_tree")));
    json_decref(orig);
    json_decref(back);
    cp_ckpt_meta *again;
    assert_int_equal(from_text(out, &again), CP_SUCCESS);
    /* unknown keys do not make a setup differ */
    cp_ckpt_meta *plain = make(&base);
    cp_ckpt_verdict verdict;
    assert_int_equal(cp_ckpt_meta_check(plain, again, &verdict, NULL, 0), CP_SUCCESS);
    assert_int_equal(verdict, CP_CKPT_IDENTICAL);
    cp_ckpt_meta_destroy(plain);
    cp_ckpt_meta_destroy(again);
    cp_ckpt_meta_destroy(m);
    free(out);
    free(text);
}

static const char *const required_keys[] = {
    "format", "format_version", "library_version", "world_size", "tp", "cp", "dp", "pp", "cp_a2a", "order",
    "mode", "layout", "seq_len", "num_heads", "num_kv_heads", "head_dim", "head_dim_v", "dtype", "checksum",
};

static void test_missing_keys_are_named(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof required_keys / sizeof required_keys[0]; i++) {
        json_t *doc = base_doc();
        char *text;
        if (strcmp(required_keys[i], "checksum")) {
            json_object_del(doc, required_keys[i]);
            text = reseal(doc);
        } else {
            json_object_del(doc, "checksum");
            text = json_dumps(doc, 0);
        }
        char needle[64];
        snprintf(needle, sizeof needle, "missing required key \"%s\"", required_keys[i]);
        EXPECT_DOC(text, CP_ERROR_FORMAT, needle);
        free(text);
        json_decref(doc);
    }
}

/* Replace one key's value (given as JSON text) and reseal the checksum. */
static char *with_value(const char *key, const char *value_json)
{
    json_t *doc = base_doc();
    json_error_t e;
    json_t *v = json_loads(value_json, JSON_DECODE_ANY, &e);
    assert_non_null(v);
    json_object_set_new(doc, key, v);
    char *text = reseal(doc);
    json_decref(doc);
    return text;
}

/* Splice raw text in place of a key's value (for what jansson will not
 * produce: NaN, huge numbers, invalid UTF-8). No reseal: parsing fails
 * before the checksum is looked at. */
static char *with_raw(const char *key, const char *raw)
{
    json_t *doc = base_doc();
    json_object_set_new(doc, key, json_string("@@"));
    char *text = json_dumps(doc, 0);
    json_decref(doc);
    char *at = strstr(text, "\"@@\"");
    assert_non_null(at);
    size_t head = (size_t)(at - text), tail = strlen(at + 4);
    char *out = malloc(head + strlen(raw) + tail + 1);
    assert_non_null(out);
    memcpy(out, text, head);
    memcpy(out + head, raw, strlen(raw));
    memcpy(out + head + strlen(raw), at + 4, tail + 1);
    free(text);
    return out;
}

static void test_hostile_values(void **state)
{
    (void)state;
    const cp_status F = CP_ERROR_FORMAT;
    static const struct {
        const char *key, *value, *needle;
    } cases[] = {
        { "tp", "\"2\"", "key \"tp\" is a string, must be an integer" },
        { "tp", "2.0", "key \"tp\" is a real number" },
        { "cp", "true", "key \"cp\" is a boolean" },
        { "dp", "null", "key \"dp\" is null" },
        { "seq_len", "[4096]", "key \"seq_len\" is an array" },
        { "mode", "1", "key \"mode\" is an integer, must be a string" },
        { "mode", "\"ring\"", "key \"mode\" = \"ring\" is not one of all_gather, p2p, a2a, a2a_p2p" },
        { "dtype", "\"F32\"", "key \"dtype\" = \"F32\"" },
        { "format", "\"something-else\"", "key \"format\" = \"something-else\"" },
        { "order", "\"tp-cp-dp-xx\"", "unknown axis name \"xx\"" },
        { "order", "\"tp-cp-dp-pp-tp-cp-dp-pp\"", "key \"order\"" },
        { "order", "7", "key \"order\" is an integer, must be a string" },
        { "tp", "-2", "tp = -2 (must be in [1, 2147483647])" },
        { "num_heads", "0", "num_heads = 0" },
        { "world_size", "4294967296", "world_size = 4294967296 (must be in [1, 2147483647])" },
        { "seq_len", "-9223372036854775808", "seq_len = -9223372036854775808" },
        { "world_size", "32", "tp*cp*dp*pp = 2*4*2*1 != world_size = 32" },
        { "cp_a2a", "3", "cp_a2a = 3 does not divide cp = 4" },
        { "num_kv_heads", "7", "num_kv_heads = 7 does not divide num_heads = 32" },
        { "seq_len", "4100", "seq_len = 4100 is not divisible by 8" },
        { "format_version", "0", "format_version = 0" },
        { "checksum", "\"fnv1a64:0000000000000000\"", "does not match" },
        { "checksum", "5", "key \"checksum\" is an integer" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = with_value(cases[i].key, cases[i].value);
        if (!strcmp(cases[i].key, "checksum")) { /* reseal would fix it: splice instead */
            free(text);
            text = with_raw("checksum", cases[i].value);
        }
        EXPECT_DOC(text, F, cases[i].needle);
        free(text);
    }

    /* a newer format is refused as unsupported, not as malformed */
    char *text = with_value("format_version", "2");
    EXPECT_DOC(text, CP_ERROR_UNSUPPORTED, "format_version = 2 is newer");
    free(text);

    /* what jansson refuses to write, spliced in as raw text */
    static const struct {
        const char *key, *raw;
    } raw[] = {
        { "tp", "NaN" }, { "tp", "nan" }, { "seq_len", "Infinity" }, { "tp", "99999999999999999999" },
        { "seq_len", "1e999" }, { "mode", "\"p2\xff\"" }, { "format", "\"\xc3\x28\"" }, { "order", "\"tp\\u0000\"" },
        { "tp", "0x2" }, { "tp", "+2" }, { "tp", "02" },
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        text = with_raw(raw[i].key, raw[i].raw);
        EXPECT_DOC(text, F, "cp_ckpt_meta_from_json");
        free(text);
    }
    /* -0x1p63 parses as a real: a type error */
    text = with_raw("tp", "-1e2");
    EXPECT_DOC(text, F, "real number");
    free(text);
}

static void test_hostile_documents(void **state)
{
    (void)state;
    const cp_status F = CP_ERROR_FORMAT;
    json_t *doc = base_doc();
    char *good = reseal(doc);
    json_decref(doc);
    size_t n = strlen(good);
    cp_ckpt_meta *m;

    /* truncated anywhere: only dropping trailing white space keeps it valid */
    size_t last = n;
    while (last > 0 && (good[last - 1] == '\n' || good[last - 1] == ' '))
        last--;
    for (size_t cut = 0; cut < n; cut++) {
        cp_status s = cp_ckpt_meta_from_json(good, cut, &m);
        if (cut >= last) {
            assert_int_equal(s, CP_SUCCESS);
            cp_ckpt_meta_destroy(m);
        } else {
            assert_int_equal(s, F);
            assert_null(m);
        }
    }

    /* the size limit: padded to exactly 1 MiB is fine, one byte more is not */
    char *big = malloc(CP_CKPT_META_MAX_BYTES + 2);
    assert_non_null(big);
    memcpy(big, good, n);
    memset(big + n, ' ', CP_CKPT_META_MAX_BYTES + 1 - n);
    assert_int_equal(cp_ckpt_meta_from_json(big, CP_CKPT_META_MAX_BYTES, &m), CP_SUCCESS);
    cp_ckpt_meta_destroy(m);
    EXPECT_ERROR(cp_ckpt_meta_from_json(big, CP_CKPT_META_MAX_BYTES + 1, &m), F, "over the 1048576-byte limit");
    EXPECT_ERROR(cp_ckpt_meta_from_json(big, SIZE_MAX, &m), F, "limit");
    free(big);

    /* nesting: a little is kept, deep is refused, very deep does not crash */
    static const int depths[] = { 6, 8, 200, 100000 };
    for (int i = 0; i < 4; i++) {
        int d = depths[i];
        json_t *nested = base_doc();
        json_object_set_new(nested, "nest", json_string("@@"));
        char *text = reseal(nested);
        json_decref(nested);
        char *at = strstr(text, "\"@@\"");
        size_t head = (size_t)(at - text);
        char *deep = malloc(strlen(text) + 2 * (size_t)d + 1);
        assert_non_null(deep);
        memcpy(deep, text, head);
        memset(deep + head, '[', (size_t)d);
        memset(deep + head + d, ']', (size_t)d);
        strcpy(deep + head + 2 * d, at + 4);
        cp_status s = cp_ckpt_meta_from_json(deep, strlen(deep), &m);
        if (d <= 6) {
            /* parses (the checksum is of the "@@" doc, so: bad checksum) */
            assert_int_equal(s, F);
            assert_non_null(strstr(cp_last_error(), "checksum"));
        } else {
            assert_int_equal(s, F);
            assert_null(strstr(cp_last_error(), "checksum"));
        }
        free(deep);
        free(text);
    }

    /* not an object; duplicate keys; garbage after the document; NUL */
    EXPECT_DOC("[]", F, "is an array, not an object");
    EXPECT_DOC("42", F, "not valid JSON");
    EXPECT_DOC("", F, "not valid JSON");
    char *dup = malloc(n + 32);
    assert_non_null(dup);
    strcpy(dup, "{\"tp\": 2, ");
    strcat(dup, good + 1);
    EXPECT_DOC(dup, F, "duplicate");
    strcpy(dup, good);
    strcat(dup, "{}");
    EXPECT_DOC(dup, F, "not valid JSON");
    free(dup);
    char with_nul[] = "{\"format\"\0: 1}";
    EXPECT_ERROR(cp_ckpt_meta_from_json(with_nul, sizeof with_nul - 1, &m), F, "not valid JSON");
    EXPECT_ERROR(cp_ckpt_meta_from_json(NULL, 3, &m), CP_ERROR_INVALID_ARGUMENT, "json is NULL");
    EXPECT_ERROR(cp_ckpt_meta_from_json(good, n, NULL), CP_ERROR_INVALID_ARGUMENT, "out is NULL");

    /* a value changed without its checksum */
    char *edited = strdup(good);
    char *tp = strstr(edited, "\"num_heads\": 32");
    assert_non_null(tp);
    memcpy(tp + strlen("\"num_heads\": "), "16", 2);
    EXPECT_DOC(edited, F, "checksum");
    free(edited);

    /* random byte edits: always a clean answer, never a crash (ASan) */
    srand(12345);
    char *mut = malloc(n + 1);
    assert_non_null(mut);
    for (int round = 0; round < 3000; round++) {
        memcpy(mut, good, n + 1);
        int edits = 1 + rand() % 4;
        for (int e = 0; e < edits; e++)
            mut[(size_t)rand() % n] = (char)(rand() % 256);
        m = NULL;
        cp_status s = cp_ckpt_meta_from_json(mut, n, &m);
        assert_true(s == CP_SUCCESS || s == F || s == CP_ERROR_UNSUPPORTED);
        assert_true((s == CP_SUCCESS) == (m != NULL));
        cp_ckpt_meta_destroy(m);
    }
    free(mut);
    free(good);
}

/* ---- files -------------------------------------------------------------- */

static char tmpdir[64];

static int setup_dir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/infinicp-ckpt-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

/* Remove dir and the files in it (one level: the tests make no deeper). */
static int remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                if (unlink(p) != 0)
                    rmdir(p);
            }
        closedir(d);
    }
    return rmdir(dir);
}

static int teardown_dir(void **state)
{
    (void)state;
    return remove_dir(tmpdir);
}

/* Names in dir other than `keep`. */
static int files_besides(const char *dir, const char *keep)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, keep);
    closedir(d);
    return n;
}

static int stray_files(const char *keep)
{
    return files_besides(tmpdir, keep);
}

/* A fresh folder tmpdir/name into out, for a test that counts its files. */
static void make_subdir(char out[128], const char *name)
{
    snprintf(out, 128, "%s/%s", tmpdir, name);
    assert_int_equal(mkdir(out, 0700), 0);
}

/* Whether the file at path holds exactly m's document. */
static bool holds(const char *path, const cp_ckpt_meta *m)
{
    size_t n;
    char *text = to_json(m, &n), buf[8192];
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t got = fread(buf, 1, sizeof buf, f);
    fclose(f);
    bool same = got == n && !memcmp(buf, text, n);
    free(text);
    return same;
}

static void test_save_and_load(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/meta.json", tmpdir);
    cp_ckpt_meta *m = make(&base);
    mode_t old_mask = umask(022);
    assert_int_equal(cp_ckpt_meta_save(m, path), CP_SUCCESS);
    umask(old_mask);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    assert_int_equal(stray_files("meta.json"), 0);
    /* the file is exactly the JSON text */
    size_t n;
    char *text = to_json(m, &n);
    assert_int_equal((size_t)st.st_size, n);
    cp_ckpt_meta *back;
    assert_int_equal(cp_ckpt_meta_load(path, &back), CP_SUCCESS);
    cp_ckpt_verdict v;
    assert_int_equal(cp_ckpt_meta_check(m, back, &v, NULL, 0), CP_SUCCESS);
    assert_int_equal(v, CP_CKPT_IDENTICAL);
    cp_ckpt_meta_destroy(back);
    /* replacing works too */
    assert_int_equal(cp_ckpt_meta_save(m, path), CP_SUCCESS);
    assert_int_equal(stray_files("meta.json"), 0);

    char other[160];
    snprintf(other, sizeof other, "%s/absent.json", tmpdir);
    back = (cp_ckpt_meta *)1;
    EXPECT_ERROR(cp_ckpt_meta_load(other, &back), CP_ERROR_NOT_FOUND, "absent.json");
    assert_null(back);
    EXPECT_ERROR(cp_ckpt_meta_load(tmpdir, &back), CP_ERROR_IO, tmpdir);
    snprintf(other, sizeof other, "%s/no/such/dir/meta.json", tmpdir);
    EXPECT_ERROR(cp_ckpt_meta_save(m, other), CP_ERROR_NOT_FOUND, "no/such/dir");
    EXPECT_ERROR(cp_ckpt_meta_save(m, tmpdir), CP_ERROR_IO, tmpdir); /* a directory is in the way */
    EXPECT_ERROR(cp_ckpt_meta_save(m, ""), CP_ERROR_INVALID_ARGUMENT, "path = \"\"");
    EXPECT_ERROR(cp_ckpt_meta_save(m, NULL), CP_ERROR_INVALID_ARGUMENT, "path is NULL");
    EXPECT_ERROR(cp_ckpt_meta_save(NULL, path), CP_ERROR_INVALID_ARGUMENT, "m is NULL");
    EXPECT_ERROR(cp_ckpt_meta_load(NULL, &back), CP_ERROR_INVALID_ARGUMENT, "path is NULL");
    EXPECT_ERROR(cp_ckpt_meta_load(path, NULL), CP_ERROR_INVALID_ARGUMENT, "out is NULL");
    assert_int_equal(stray_files("meta.json"), 0);

    /* an oversized or broken file is a format error naming the file */
    snprintf(other, sizeof other, "%s/big.json", tmpdir);
    FILE *f = fopen(other, "w");
    assert_non_null(f);
    fputs(text, f);
    for (size_t i = n; i <= CP_CKPT_META_MAX_BYTES; i++)
        fputc(' ', f);
    fclose(f);
    EXPECT_ERROR(cp_ckpt_meta_load(other, &back), CP_ERROR_FORMAT, "limit");
    f = fopen(other, "w");
    assert_non_null(f);
    fwrite(text, 1, n / 2, f);
    fclose(f);
    EXPECT_ERROR(cp_ckpt_meta_load(other, &back), CP_ERROR_FORMAT, "big.json");
    unlink(other);
    free(text);
    cp_ckpt_meta_destroy(m);
}

/* A metadata file that is not a regular file is refused at once: loading a
 * FIFO nobody writes to used to wait for a writer forever. */
static void test_load_refuses_what_is_not_a_regular_file(void **state)
{
    (void)state;
    char fifo[160];
    snprintf(fifo, sizeof fifo, "%s/meta.fifo", tmpdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    /* a regression blocks in open(): SIGALRM then ends the test program
     * (a failure) instead of leaving it hanging */
    alarm(60);
    cp_ckpt_meta *back = (cp_ckpt_meta *)1;
    EXPECT_ERROR(cp_ckpt_meta_load(fifo, &back), CP_ERROR_IO, "not a regular file (it is a FIFO)");
    assert_non_null(strstr(cp_last_error(), fifo));
    assert_null(back);
    EXPECT_ERROR(cp_ckpt_meta_load("/dev/null", &back), CP_ERROR_IO, "it is a character device");
    /* saving replaces the FIFO with a file, without opening it */
    cp_ckpt_meta *m = make(&base);
    assert_int_equal(cp_ckpt_meta_save(m, fifo), CP_SUCCESS);
    alarm(0);
    assert_true(holds(fifo, m));
    assert_int_equal(unlink(fifo), 0);
    cp_ckpt_meta_destroy(m);
}

/* A save keeps the permissions of the file it replaces; a new file gets
 * 0666 less the umask. */
static void test_save_keeps_the_mode(void **state)
{
    (void)state;
    char path[160];
    snprintf(path, sizeof path, "%s/mode.json", tmpdir);
    cp_ckpt_meta *m = make(&base);
    struct stat st;
    mode_t old_mask = umask(077);
    assert_int_equal(cp_ckpt_meta_save(m, path), CP_SUCCESS);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(chmod(path, 0640), 0); /* wider than the umask lets a new file be */
    assert_int_equal(cp_ckpt_meta_save(m, path), CP_SUCCESS);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    umask(022);
    assert_int_equal(chmod(path, 0600), 0); /* narrower */
    assert_int_equal(cp_ckpt_meta_save(m, path), CP_SUCCESS);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    umask(old_mask);
    assert_int_equal(unlink(path), 0);
    cp_ckpt_meta_destroy(m);
}

/* Names are limited by the file system alone: 250 bytes is a legal name
 * (the temporary name next to it must fit too), 300 fails with the
 * system's own error text. */
static void test_long_names(void **state)
{
    (void)state;
    char dir[128], name[301], path[512];
    make_subdir(dir, "long");
    cp_ckpt_meta *m = make(&base), *back = NULL;
    memset(name, 'n', 295);
    strcpy(name + 295, ".json");
    assert_int_equal(strlen(name), 300);
    snprintf(path, sizeof path, "%s/%s", dir, name + 50); /* 250 bytes */
    assert_int_equal(cp_ckpt_meta_save(m, path), CP_SUCCESS);
    assert_int_equal(cp_ckpt_meta_load(path, &back), CP_SUCCESS);
    cp_ckpt_meta_destroy(back);
    assert_int_equal(files_besides(dir, name + 50), 0);
    assert_int_equal(unlink(path), 0);

    snprintf(path, sizeof path, "%s/%s", dir, name);
    EXPECT_ERROR(cp_ckpt_meta_save(m, path), CP_ERROR_IO, strerror(ENAMETOOLONG));
    EXPECT_ERROR(cp_ckpt_meta_load(path, &back), CP_ERROR_IO, strerror(ENAMETOOLONG));
    assert_int_equal(files_besides(dir, ""), 0);
    assert_int_equal(remove_dir(dir), 0);
    cp_ckpt_meta_destroy(m);
}

/* Files under the temporary names the library once used ("<path>.tmp.<pid>.
 * <counter>", the counter counting this process's saves from 0) must not
 * block a save: temporary names are random now. 300 of them cover the
 * saves this program made before, in any test order. */
static void test_planted_temporary_names(void **state)
{
    (void)state;
    char dir[128], path[160], planted[200];
    make_subdir(dir, "planted");
    snprintf(path, sizeof path, "%s/meta.json", dir);
    for (int n = 0; n < 300; n++) {
        snprintf(planted, sizeof planted, "%s.tmp.%ld.%d", path, (long)getpid(), n);
        FILE *f = fopen(planted, "w");
        assert_non_null(f);
        fclose(f);
    }
    cp_ckpt_meta *m = make(&base);
    assert_int_equal(cp_ckpt_meta_save(m, path), CP_SUCCESS);
    assert_true(holds(path, m));
    assert_int_equal(files_besides(dir, "meta.json"), 300);
    assert_int_equal(remove_dir(dir), 0);
    cp_ckpt_meta_destroy(m);
}

/* The library's fsync() calls come here (a definition in the executable
 * comes first in symbol lookup), so that a test can make them fail: on
 * directories or on regular files, with EIO. */
enum { FSYNC_REAL, FSYNC_FAIL_DIRS, FSYNC_FAIL_FILES };
static int fsync_mode = FSYNC_REAL;

int fsync(int fd)
{
    struct stat st;
    if (fsync_mode != FSYNC_REAL && fstat(fd, &st) == 0 &&
        (fsync_mode == FSYNC_FAIL_DIRS ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode))) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fsync, fd);
}

/* A failed fsync of the new file leaves the old one and no temporary file;
 * a failed fsync of the directory comes after the rename: the new document
 * is in place, and the error says that it may not survive a crash. */
static void test_fsync_failures(void **state)
{
    (void)state;
    char dir[128], path[160];
    make_subdir(dir, "fsync");
    snprintf(path, sizeof path, "%s/meta.json", dir);
    setup s2 = base;
    s2.cp = 2;
    s2.dp = 4;
    s2.a2a = 1;
    cp_ckpt_meta *a = make(&base), *b = make(&s2);
    assert_int_equal(cp_ckpt_meta_save(a, path), CP_SUCCESS);

    fsync_mode = FSYNC_FAIL_FILES;
    cp_status s = cp_ckpt_meta_save(b, path);
    fsync_mode = FSYNC_REAL;
    EXPECT_ERROR(s, CP_ERROR_IO, strerror(EIO));
    assert_non_null(strstr(cp_last_error(), "cannot fsync"));
    assert_true(holds(path, a));
    assert_int_equal(files_besides(dir, "meta.json"), 0);

    fsync_mode = FSYNC_FAIL_DIRS;
    s = cp_ckpt_meta_save(b, path);
    fsync_mode = FSYNC_REAL;
    EXPECT_ERROR(s, CP_ERROR_IO, "holds the new document");
    assert_non_null(strstr(cp_last_error(), strerror(EIO)));
    assert_non_null(strstr(cp_last_error(), path));
    assert_true(holds(path, b));
    assert_int_equal(files_besides(dir, "meta.json"), 0);

    assert_int_equal(remove_dir(dir), 0);
    cp_ckpt_meta_destroy(a);
    cp_ckpt_meta_destroy(b);
}

/* A writer process saves two documents in turn as fast as it can and is
 * killed at a random moment; the file must always be one of the two, whole.
 * Stray temporary files are allowed (the writer died before its rename). */
static void test_kill_during_save(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/meta.json", tmpdir);
    setup s2 = base;
    s2.cp = 2;
    s2.dp = 4;
    s2.a2a = 1;
    s2.mode = CP_MODE_A2A;
    cp_ckpt_meta *a = make(&base), *b = make(&s2);
    assert_int_equal(cp_ckpt_meta_save(a, path), CP_SUCCESS);
    size_t na, nb;
    char *ta = to_json(a, &na), *tb = to_json(b, &nb);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    unsigned seed = (unsigned)now.tv_nsec;
    int saw_a = 0, saw_b = 0;
    for (int round = 0; round < 150; round++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            for (;;) {
                cp_ckpt_meta_save(b, path);
                cp_ckpt_meta_save(a, path);
            }
        }
        /* mostly 0-3 ms, sometimes 30 ms so that slow disks see B too */
        long us = round % 10 == 9 ? 30000 : (long)(rand_r(&seed) % 3000);
        struct timespec nap = { 0, us * 1000 };
        nanosleep(&nap, NULL);
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status));

        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        char buf[8192];
        size_t got = fread(buf, 1, sizeof buf, f);
        fclose(f);
        int is_a = got == na && !memcmp(buf, ta, na), is_b = got == nb && !memcmp(buf, tb, nb);
        if (!is_a && !is_b)
            fail_msg("round %d: the file is neither document (%zu bytes)", round, got);
        saw_a += is_a;
        saw_b += is_b;
        cp_ckpt_meta *m;
        assert_int_equal(cp_ckpt_meta_load(path, &m), CP_SUCCESS);
        cp_ckpt_meta_destroy(m);
    }
    /* some kills came after the writer's first rename, so the check saw
     * both documents (some kills also land inside a save) */
    assert_true(saw_a > 0 && saw_b > 0);
    free(ta);
    free(tb);
    cp_ckpt_meta_destroy(a);
    cp_ckpt_meta_destroy(b);
}

/* ---- verdicts ----------------------------------------------------------- */

/* The rules, written from the issue: tp, pp or the attention shape (heads,
 * kv heads, head dims, dtype) changed -> incompatible; else dp*cp changed ->
 * needs resharding; else anything of the CP setup changed -> compatible. */
static cp_ckpt_verdict expected_verdict(const setup *a, const setup *b)
{
    if (a->tp != b->tp || a->pp != b->pp || a->heads != b->heads || a->kv_heads != b->kv_heads ||
        a->head_dim != b->head_dim || (a->head_dim_v ? a->head_dim_v : a->head_dim) !=
        (b->head_dim_v ? b->head_dim_v : b->head_dim) || a->dtype != b->dtype)
        return CP_CKPT_INCOMPATIBLE;
    if (a->dp * a->cp != b->dp * b->cp)
        return CP_CKPT_NEEDS_RESHARD;
    if (a->cp != b->cp || a->dp != b->dp || a->a2a != b->a2a || strcmp(a->order, b->order) ||
        a->mode != b->mode || a->layout != b->layout || a->seq_len != b->seq_len)
        return CP_CKPT_COMPATIBLE;
    return CP_CKPT_IDENTICAL;
}

/* One change each of: sizes (keeping world = tp*cp*dp*pp), order, mode,
 * layout, seq_len, shape, dtype. */
static setup variant(int i)
{
    setup s = base;
    switch (i) {
    case 0: break;
    case 1: s.cp = 8, s.dp = 1, s.a2a = 2; break;                    /* cp up, dp down: same dp*cp */
    case 2: s.cp = 2, s.dp = 4, s.a2a = 1; break;
    case 3: s.a2a = 4; break;
    case 4: s.a2a = 1; break;
    case 5: s.order = "cp-tp-pp-dp"; break;
    case 6: s.mode = CP_MODE_A2A_P2P; break;
    case 7: s.layout = CP_LAYOUT_CONTIGUOUS; break;
    case 8: s.seq_len = 8192; break;
    case 9: s.world = 32, s.dp = 4; break;                            /* dp*cp 8 -> 16 */
    case 10: s.world = 8, s.cp = 2, s.a2a = 1; break;                 /* dp*cp 8 -> 4 */
    case 11: s.world = 32, s.cp = 8; break;
    case 12: s.tp = 4, s.dp = 1; break;                               /* tp 2 -> 4 */
    case 13: s.pp = 2, s.dp = 1; break;
    case 14: s.heads = 16; break;
    case 15: s.kv_heads = 32; break;
    case 16: s.head_dim = 64; break;
    case 17: s.head_dim_v = 128; break;
    case 18: s.dtype = CP_DTYPE_F32; break;
    case 19: s.head_dim_v = 0, s.head_dim = 64; break;                 /* v dim stays 64 */
    case 20: s.mode = CP_MODE_ALL_GATHER, s.layout = CP_LAYOUT_CONTIGUOUS, s.seq_len = 1024; break;
    case 21: s.world = 64, s.dp = 8, s.tp = 2, s.mode = CP_MODE_A2A; break;
    case 22: s.layout = CP_LAYOUT_PACKED; break;                        /* API 1.1: packed documents */
    }
    return s;
}
#define NUM_VARIANTS 23

static void test_verdicts(void **state)
{
    (void)state;
    static const char *const words[] = { "identical", "compatible", "needs resharding", "incompatible" };
    int seen[4] = { 0 };
    for (int i = 0; i < NUM_VARIANTS; i++)
        for (int j = 0; j < NUM_VARIANTS; j++) {
            setup a = variant(i), b = variant(j);
            cp_ckpt_meta *ma = make(&a), *mb = make(&b);
            cp_ckpt_verdict v = (cp_ckpt_verdict)-1;
            char reason[512];
            assert_int_equal(cp_ckpt_meta_check(ma, mb, &v, reason, sizeof reason), CP_SUCCESS);
            cp_ckpt_verdict want = expected_verdict(&a, &b);
            if (v != want)
                fail_msg("variants %d -> %d: verdict %d, expected %d (%s)", i, j, v, want, reason);
            seen[v]++;
            assert_non_null(strstr(reason, words[v]));
            assert_null(strchr(reason, '\n'));
            /* the reason names what changed, old and new */
            char needle[64];
            if (a.tp != b.tp) {
                snprintf(needle, sizeof needle, "tp %d -> %d", a.tp, b.tp);
                assert_non_null(strstr(reason, needle));
            }
            if (a.dp * a.cp != b.dp * b.cp) {
                snprintf(needle, sizeof needle, "dp*cp %d -> %d", a.dp * a.cp, b.dp * b.cp);
                assert_non_null(strstr(reason, needle));
            }
            if (a.heads != b.heads) {
                snprintf(needle, sizeof needle, "num_heads %d -> %d", a.heads, b.heads);
                assert_non_null(strstr(reason, needle));
            }
            if (a.mode != b.mode)
                assert_non_null(strstr(reason, "mode "));
            if (strcmp(a.order, b.order)) {
                snprintf(needle, sizeof needle, "order %s -> %s", a.order, b.order);
                assert_non_null(strstr(reason, needle));
            }
            if (a.dtype != b.dtype)
                assert_non_null(strstr(reason, a.dtype == CP_DTYPE_BF16 ? "dtype bf16 -> f32" : "dtype f32 -> bf16"));
            /* the reason is cut to fit, never overrun */
            char tiny[8];
            memset(tiny, 'x', sizeof tiny);
            assert_int_equal(cp_ckpt_meta_check(ma, mb, &v, tiny, 5), CP_SUCCESS);
            assert_int_equal(tiny[4], '\0');
            assert_int_equal(tiny[5], 'x');
            cp_ckpt_meta_destroy(ma);
            cp_ckpt_meta_destroy(mb);
        }
    for (int k = 0; k < 4; k++)
        assert_true(seen[k] > 0);

    /* the library version is not part of the setup */
    json_t *doc = base_doc();
    json_object_set_new(doc, "library_version", json_integer(CP_VERSION + 1));
    char *text = reseal(doc);
    json_decref(doc);
    cp_ckpt_meta *newer, *ours = make(&base);
    assert_int_equal(from_text(text, &newer), CP_SUCCESS);
    cp_ckpt_verdict v;
    char reason[128];
    assert_int_equal(cp_ckpt_meta_check(newer, ours, &v, reason, sizeof reason), CP_SUCCESS);
    assert_int_equal(v, CP_CKPT_IDENTICAL);
    free(text);

    EXPECT_ERROR(cp_ckpt_meta_check(NULL, ours, &v, NULL, 0), CP_ERROR_INVALID_ARGUMENT, "saved is NULL");
    EXPECT_ERROR(cp_ckpt_meta_check(ours, NULL, &v, NULL, 0), CP_ERROR_INVALID_ARGUMENT, "current is NULL");
    EXPECT_ERROR(cp_ckpt_meta_check(ours, ours, NULL, NULL, 0), CP_ERROR_INVALID_ARGUMENT, "verdict is NULL");
    EXPECT_ERROR(cp_ckpt_meta_check(ours, ours, &v, NULL, 4), CP_ERROR_INVALID_ARGUMENT, "reason_cap = 4");
    cp_ckpt_meta_destroy(newer);
    cp_ckpt_meta_destroy(ours);
}

/* ---- writers ------------------------------------------------------------ */

/* For every topology of worlds 1..24 (all factorizations, cp_a2a, and two
 * orders): replicated state has exactly one writer in every DPxCP group,
 * the group's first rank, which has dp == cp == 0; so tp*pp writers in
 * all. Sharded state: every rank writes. */
static void test_writers(void **state)
{
    (void)state;
    const char *orders[] = { "tp-cp-dp-pp", "dp-pp-cp-tp" };
    for (int o = 0; o < 2; o++)
        for (int world = 1; world <= 24; world++)
            for (int tp = 1; tp <= world; tp++)
                for (int cp = 1; cp <= world; cp++)
                    for (int dp = 1; dp <= world; dp++) {
                        if (world % (tp * cp * dp))
                            continue;
                        int pp = world / (tp * cp * dp);
                        for (int a2a = 1; a2a <= cp; a2a++) {
                            if (cp % a2a)
                                continue;
                            cp_topology_config tc = CP_TOPOLOGY_CONFIG_INIT;
                            tc.world_size = world, tc.tp = tp, tc.cp = cp, tc.dp = dp, tc.pp = pp;
                            tc.cp_a2a = a2a, tc.order = orders[o];
                            cp_topology *t;
                            assert_int_equal(cp_topology_create(&tc, &t), CP_SUCCESS);
                            int writers = 0;
                            for (int r = 0; r < world; r++) {
                                int w = -1, sharded = -1, group[64], n, idx;
                                cp_coords c;
                                assert_int_equal(cp_ckpt_is_writer(t, r, CP_CKPT_REPLICATED, &w), CP_SUCCESS);
                                assert_int_equal(cp_ckpt_is_writer(t, r, CP_CKPT_SHARDED, &sharded), CP_SUCCESS);
                                assert_int_equal(sharded, 1);
                                assert_int_equal(cp_topology_coords(t, r, &c), CP_SUCCESS);
                                assert_int_equal(w, c.dp == 0 && c.cp == 0);
                                assert_int_equal(cp_topology_group(t, r, CP_AXIS_DP | CP_AXIS_CP, group, 64, &n, &idx),
                                                 CP_SUCCESS);
                                int in_group = 0;
                                for (int k = 0; k < n; k++) {
                                    int wk;
                                    assert_int_equal(cp_ckpt_is_writer(t, group[k], CP_CKPT_REPLICATED, &wk),
                                                     CP_SUCCESS);
                                    in_group += wk;
                                    if (wk)
                                        assert_int_equal(k, 0);
                                }
                                assert_int_equal(in_group, 1);
                                writers += w;
                            }
                            assert_int_equal(writers, tp * pp);
                            cp_topology_destroy(t);
                        }
                    }
    cp_topology *t;
    assert_int_equal(cp_topology_create(NULL, &t), CP_SUCCESS);
    int w = 7;
    EXPECT_ERROR(cp_ckpt_is_writer(t, 1, CP_CKPT_SHARDED, &w), CP_ERROR_INVALID_ARGUMENT, "rank = 1");
    assert_int_equal(w, 0);
    EXPECT_ERROR(cp_ckpt_is_writer(t, 0, (cp_ckpt_role)2, &w), CP_ERROR_INVALID_ARGUMENT, "role = 2");
    EXPECT_ERROR(cp_ckpt_is_writer(NULL, 0, CP_CKPT_SHARDED, &w), CP_ERROR_INVALID_ARGUMENT, "t is NULL");
    EXPECT_ERROR(cp_ckpt_is_writer(t, 0, CP_CKPT_SHARDED, NULL), CP_ERROR_INVALID_ARGUMENT, "is_writer is NULL");
    cp_topology_destroy(t);
}

/* ---- documents of this format version stay readable --------------------- */

static const char *corpus_dir; /* the fuzz seed corpus, argv[1] */

/* The seed corpus holds documents written by libinfinicp 1.0: the valid-*
 * ones must keep loading (so the checksum's definition cannot drift), the
 * newer-format one is unsupported, every other one malformed. */
static void test_seed_corpus(void **state)
{
    (void)state;
    if (!corpus_dir)
        skip();
    DIR *d = opendir(corpus_dir);
    assert_non_null(d);
    struct dirent *e;
    int valid = 0, files = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", corpus_dir, e->d_name);
        cp_ckpt_meta *m = NULL;
        cp_status s = cp_ckpt_meta_load(path, &m);
        cp_status want = !strncmp(e->d_name, "valid-", 6)       ? CP_SUCCESS
                         : !strncmp(e->d_name, "newer-format", 12) ? CP_ERROR_UNSUPPORTED
                                                                 : CP_ERROR_FORMAT;
        if (s != want)
            fail_msg("%s: status %d, expected %d (%s)", e->d_name, s, want, cp_last_error());
        valid += s == CP_SUCCESS;
        files++;
        cp_ckpt_meta_destroy(m);
    }
    closedir(d);
    assert_true(valid >= 3);
    assert_true(files > valid);
}

static void test_enum_values_are_fixed(void **state)
{
    (void)state;
    assert_int_equal(CP_CKPT_IDENTICAL, 0);
    assert_int_equal(CP_CKPT_COMPATIBLE, 1);
    assert_int_equal(CP_CKPT_NEEDS_RESHARD, 2);
    assert_int_equal(CP_CKPT_INCOMPATIBLE, 3);
    assert_int_equal(CP_CKPT_REPLICATED, 0);
    assert_int_equal(CP_CKPT_SHARDED, 1);
}

int main(int argc, char **argv)
{
    corpus_dir = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enum_values_are_fixed),
        cmocka_unit_test(test_document_records_the_setup),
        cmocka_unit_test(test_get_and_to_json_arguments),
        cmocka_unit_test(test_create_rejects_bad_descriptors),
        cmocka_unit_test(test_unknown_keys_are_kept),
        cmocka_unit_test(test_missing_keys_are_named),
        cmocka_unit_test(test_hostile_values),
        cmocka_unit_test(test_hostile_documents),
        cmocka_unit_test(test_save_and_load),
        cmocka_unit_test(test_kill_during_save),
        cmocka_unit_test(test_load_refuses_what_is_not_a_regular_file),
        cmocka_unit_test(test_save_keeps_the_mode),
        cmocka_unit_test(test_long_names),
        cmocka_unit_test(test_planted_temporary_names),
        cmocka_unit_test(test_fsync_failures),
        cmocka_unit_test(test_verdicts),
        cmocka_unit_test(test_writers),
        cmocka_unit_test(test_seed_corpus),
    };
    return cmocka_run_group_tests_name("ckpt", tests, setup_dir, teardown_dir);
}
