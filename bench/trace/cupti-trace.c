/* SPDX-License-Identifier: MIT */
/*
 * A timeline of what a CUDA process runs on the GPU: kernels, copies and
 * memsets with their start and end (GPU clock, ns) and stream, one CSV line
 * each, from the CUPTI activity API. Preloaded into any program:
 *
 *   INFINICP_TRACE_OUT=trace.csv LD_PRELOAD=./cupti-trace.so program ...
 *
 * Lines: kind,start_ns,end_ns,stream,bytes,name (kind K kernel, C copy with
 * its direction as name, S memset). bench/trace.sh builds it and
 * bench/trace_sum.py reads the file. A benchmarking aid, not part of the
 * library. The record structures are versioned by CUPTI; the build passes
 * the newest of the installed header as KREC, MREC and SREC.
 */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef KREC
#define KREC CUpti_ActivityKernel9
#endif
#ifndef MREC
#define MREC CUpti_ActivityMemcpy5
#endif
#ifndef SREC
#define SREC CUpti_ActivityMemset4
#endif

static FILE *out;

static void CUPTIAPI want_buffer(uint8_t **buf, size_t *size, size_t *max_records)
{
    *size = (size_t)8 << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0;
}

static const char *copy_kind(unsigned k)
{
    switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
        return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
        return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
        return "DtoD";
    default:
        return "other";
    }
}

static void CUPTIAPI buffer_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const KREC *k = (const KREC *)r;
            fprintf(out, "K,%llu,%llu,%u,0,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                    (unsigned)k->streamId, k->name ? k->name : "?");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const MREC *m = (const MREC *)r;
            fprintf(out, "C,%llu,%llu,%u,%llu,%s\n", (unsigned long long)m->start, (unsigned long long)m->end,
                    (unsigned)m->streamId, (unsigned long long)m->bytes, copy_kind(m->copyKind));
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const SREC *m = (const SREC *)r;
            fprintf(out, "S,%llu,%llu,%u,%llu,memset\n", (unsigned long long)m->start, (unsigned long long)m->end,
                    (unsigned)m->streamId, (unsigned long long)m->bytes);
        }
    }
    free(buf);
}

__attribute__((constructor)) static void trace_start(void)
{
    const char *path = getenv("INFINICP_TRACE_OUT");
    out = fopen(path ? path : "trace.csv", "w");
    if (!out) {
        perror("cupti-trace");
        return;
    }
    if (cuptiActivityRegisterCallbacks(want_buffer, buffer_done) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS)
        fprintf(stderr, "cupti-trace: CUPTI activity setup failed\n");
}

__attribute__((destructor)) static void trace_stop(void)
{
    cuptiActivityFlushAll(1);
    if (out)
        fclose(out);
    out = NULL;
}
