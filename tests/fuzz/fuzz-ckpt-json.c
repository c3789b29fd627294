/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for cp_ckpt_meta_from_json(): any input must give a clean
 * status, never a crash, leak or sanitizer report; and whatever parses must
 * survive a round trip (to_json, from_json) as the identical setup.
 */
#include <stdint.h>
#include <stdlib.h>

#include <infinicp/infinicp.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_ckpt_meta *m = NULL;
    cp_status s = cp_ckpt_meta_from_json(data ? (const char *)data : "", size, &m);
    if (s != CP_SUCCESS) {
        if (m || (s != CP_ERROR_FORMAT && s != CP_ERROR_UNSUPPORTED && s != CP_ERROR_OUT_OF_MEMORY))
            abort();
        return 0;
    }
    size_t len = 0;
    if (cp_ckpt_meta_to_json(m, NULL, 0, &len) != CP_SUCCESS) {
        /* only a document grown past the size limit may fail to serialise */
        cp_ckpt_meta_destroy(m);
        return 0;
    }
    char *text = malloc(len + 1);
    cp_ckpt_meta *back = NULL;
    cp_ckpt_verdict v = CP_CKPT_INCOMPATIBLE;
    if (!text || cp_ckpt_meta_to_json(m, text, len + 1, &len) != CP_SUCCESS ||
        cp_ckpt_meta_from_json(text, len, &back) != CP_SUCCESS ||
        cp_ckpt_meta_check(m, back, &v, NULL, 0) != CP_SUCCESS || v != CP_CKPT_IDENTICAL)
        abort();
    free(text);
    cp_ckpt_meta_destroy(back);
    cp_ckpt_meta_destroy(m);
    return 0;
}
