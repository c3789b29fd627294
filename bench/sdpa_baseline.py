#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""PyTorch scaled_dot_product_attention baselines for bench/bench.sh.

Times the flash (FlashAttention-2) and cuDNN backends of SDPA on the shapes
of `bench-gpu --csv` (bf16, head_dim 64 and 128 and those BENCH_DIMS adds,
2048 / Dv heads, seq 1k to 32k at 16k tokens per batch, causal and not) and prints one CSV line
per backend and shape, in bench-gpu's columns:
impl,head_dim,seq,batch,heads,causal,fwd_tflops,bwd_tflops
FLOPs as FlashAttention counts them: 2 B H S^2 (D + Dv) forward, halved
when causal; backward 2.5x. Each time is the median of the repetitions after a
warm-up, measured with the host clock around torch.cuda.synchronize().
With a second argument "fwd" only the forward is timed (bwd_tflops 0).
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_time(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def dims():
    """Head dims (q / k, v): 64 and 128, then those BENCH_DIMS adds (as
    bench-gpu reads it: "256,192/128")."""
    out = [(64, 64), (128, 128)]
    for e in os.environ.get("BENCH_DIMS", "").split(","):
        if e.strip():
            d, _, dv = e.strip().partition("/")
            out.append((int(d), int(dv) if dv else int(d)))
    return out


def shapes():
    only = [e.strip() for e in os.environ.get("BENCH_SHAPES", "").split(",") if e.strip()]
    for d, dv in dims():
        s = 1024
        while s <= 32768:
            for causal in (0, 1):
                if not only or f"{d}:{s}:{causal}" in only:  # BENCH_SHAPES as bench-gpu reads it
                    yield d, dv, s, max(16384 // s, 1), 2048 // dv, causal
            s *= 2


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    fwd_only = len(sys.argv) > 2 and sys.argv[2] == "fwd"
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for d, dv, s, b, h, causal in shapes():
        gen = torch.Generator(device="cuda").manual_seed(s + d)

        def rand(dim):
            return (torch.rand(b, h, s, dim, device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)

        q, k, v, dout = rand(d), rand(d), rand(dv), rand(dv)
        for t in (q, k, v):
            t.requires_grad_(True)
        flops = 2.0 * b * h * s * s * (d + dv) * (0.5 if causal else 1.0)
        dims = f"{d}" if dv == d else f"{d}/{dv}"
        for name, backend in backends.items():
            try:
                with sdpa_kernel([backend]):
                    def fwd():
                        with torch.no_grad():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))

                    tf = median_time(fwd, reps)
                    tb = float("inf")
                    if not fwd_only:
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))

                        def bwd():
                            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

                        tb = median_time(bwd, reps)
                        del out
                print(f"{name},{dims},{s},{b},{h},{causal},{flops / tf * 1e-12:.2f},{2.5 * flops / tb * 1e-12:.2f}",
                      flush=True)
            except RuntimeError as e:  # a backend that rejects the shape
                print(f"# {name} D={dims} S={s} causal={causal}: {str(e).splitlines()[0]}", file=sys.stderr)


if __name__ == "__main__":
    main()
