/* SPDX-License-Identifier: MIT */
/* Helpers shared by the test programs. EXPECT_ERROR needs <cmocka.h> included before this header; the rest does
 * not, so programs without CMocka (test-mpi-fault) can use them too. */
#ifndef INFINICP_TESTUTIL_H
#define INFINICP_TESTUTIL_H

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <infinicp/infinicp.h>

/* Assert that `call` fails with `status` and that cp_last_error() is set and
 * contains `needle` (the argument name or value the message must carry). */
#define EXPECT_ERROR(call, status, needle)                                               \
    do {                                                                                 \
        cp_status expect_s_ = (call);                                                    \
        if (expect_s_ != (status))                                                       \
            fail_msg("%s returned %d (%s), expected %d; last error: %s", #call,          \
                     (int)expect_s_, cp_status_string(expect_s_), (int)(status),         \
                     cp_last_error());                                                   \
        const char *expect_e_ = cp_last_error();                                         \
        if (!expect_e_ || !*expect_e_)                                                   \
            fail_msg("%s failed without a cp_last_error() message", #call);              \
        if (!strstr(expect_e_, (needle)))                                                \
            fail_msg("%s: message \"%s\" does not name \"%s\"", #call, expect_e_, (needle)); \
    } while (0)

/* Milliseconds on the monotonic clock, for timing waits and deadlines (the wall clock may jump). */
static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#endif
