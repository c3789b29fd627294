// SPDX-License-Identifier: MIT
// The environment variables of the CUDA module, each declared once in
// CU_KNOBS: KNOB(field, variable, default, {word, value}, ...). When a
// context opens (cu_open), read_knobs() reads every variable once into
// state::knob.field: the value of the word the variable holds, or the
// default when it is unset or holds any other word. The kernels' code asks
// state::knob, never the environment.
//
// They are read per context, not once per process: the GPU tests and
// bench-gpu set them between the contexts they open, to reach each kernel
// on purpose. A context keeps its copy, so no call reads the environment
// after cu_open. man/infinicp.7 (ENVIRONMENT) documents every one; a tuning
// experiment that is over ends by deleting its line here, with the field's
// uses and its entry in the man page.
#ifndef INFINICP_KERNELS_CUDA_KNOBS_CUH
#define INFINICP_KERNELS_CUDA_KNOBS_CUH

// (C comments inside the list: a line comment would swallow the next entry.)
#define CU_KNOBS(KNOB)                                                                                                 \
    /* The attention path (attn_path, attn.cu): mma keeps mma.sync also on Hopper, wgmma takes the Hopper              \
     * kernels where they fit; tests and benchmarks reach each path with it. */                                        \
    KNOB(path, "INFINICP_CUDA_ATTN", PATH_AUTO, {"mma", PATH_MMA}, {"wgmma", PATH_WGMMA}, {"simt", PATH_SIMT},         \
         {"cublas", PATH_BLAS})                                                                                        \
    /* 1: the mma forward at D = 128 with one row tile per warp, not two (attn_mma_fwd.cu; the tests'                  \
     * "mma-mt1" path and bench-gpu's comparison). */                                                                  \
    KNOB(fwd_mt, "INFINICP_CUDA_FWD_MT", 0, {"1", 1})                                                                  \
    /* 8: the atomic mma backward's dK/dV blocks of 8 warps (128 keys), not 4, at D <= 128                             \
     * (attn_mma_bwd.cu; open experiment, bench-gpu BENCH_W8). */                                                      \
    KNOB(bwd_warps, "INFINICP_CUDA_BWD_WARPS", 0, {"8", 8})                                                            \
    /* 0: the Hopper kernels that load with cp.async, not the warp-specialised TMA ones                                \
     * (attn_wgmma_fwd.cu, attn_wgmma_bwd.cu; suite gpu-kernels-wgmma-cp). */                                          \
    KNOB(wgmma_ws, "INFINICP_CUDA_WGMMA_WS", 1, {"0", 0})                                                              \
    /* 0: the backward ignores cp_kernel_attn_args.drow and computes rowsum(dO * O) in every call                      \
     * (attn.cu; suite gpu-attn-drow-off). */                                                                          \
    KNOB(drow_reuse, "INFINICP_CUDA_DROW", 1, {"0", 0})                                                               \
    /* 0: the tensor-core kernels run without their non-finite guard (nonfinite.cu; for measuring its cost:        \
     * a NaN or inf then reaches rows that do not see it); scan: the guard's scans and patches run but the         \
     * kernels never clean a tile (to tell the kernels' part of the cost from the rest; wrong for non-finite      \
     * inputs). */                                                                                                     \
    KNOB(nf_guard, "INFINICP_CUDA_NF_GUARD", 1, {"0", 0}, {"scan", NF_SCAN_ONLY})

namespace cu {

struct knobs {
#define CU_KNOB_FIELD(field, variable, fallback, ...) int field;
    CU_KNOBS(CU_KNOB_FIELD)
#undef CU_KNOB_FIELD
};

// Every variable of CU_KNOBS, read from the environment now.
knobs read_knobs();

} // namespace cu

#endif
