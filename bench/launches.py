#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What one packed attention call launches on the GPU, and for how long.

One packed row of documents (the mixes of bench/packed.py) through
infinicp.torch.attention on a one-rank CUDA plan; after warm-up calls,
torch.profiler records --calls forwards and --calls backwards. For each
phase it prints, per call:

- every GPU operation by name (kernels, memsets, copies): count and time,
  then the first call's timeline (start offset and duration), which shows
  where the GPU waits for the host between launches;
- the CUDA runtime calls the host made (cudaLaunchKernel,
  cudaMemcpyAsync, cudaMallocAsync, ...) with their host time.

The profiler sees the library's kernels like PyTorch's own (it records the
whole process). Run from the repository root like packed.py:

    INFINICP_LIBRARY=build/lib/libinfinicp.so.1 \\
    INFINICP_MODULE_PATH=build/kernels/cuda \\
    PYTHONPATH=python python3 bench/launches.py --mix uniform
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def profile_phase(torch, fn, calls):
    """(GPU events, host runtime-API events) of `calls` calls of fn()."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    gpu, api = [], []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            gpu.append(e)
        elif e.name.startswith("cuda"):
            api.append(e)
    gpu.sort(key=lambda e: e.time_range.start)
    return gpu, api


def by_name(events, calls):
    """[(name, count a call, us an event, us a call)], most time first."""
    agg = {}
    for e in events:
        a = agg.setdefault(e.name, [0, 0.0])
        a[0] += 1
        a[1] += e.time_range.end - e.time_range.start
    rows = [(k, n / calls, t / n, t / calls) for k, (n, t) in agg.items()]
    return sorted(rows, key=lambda r: -r[3])


def report(title, gpu, api, calls, width):
    if not gpu:
        print("== %s: no GPU operation recorded" % title)
        return
    t0 = gpu[0].time_range.start
    t1 = max(e.time_range.end for e in gpu)
    busy = sum(e.time_range.end - e.time_range.start for e in gpu)
    print("== %s: first op to last %.0f us a call, GPU busy %.0f us a call, %.0f ops a call"
          % (title, (t1 - t0) / calls, busy / calls, len(gpu) / calls))
    print("   GPU operations:  count  us each  us/call")
    for name, n, each, per in by_name(gpu, calls):
        print("   %-*s %5.1f %8.1f %8.1f" % (width, name[:width], n, each, per))
    print("   the first call's timeline (us from its first op, duration):")
    for e in gpu[:len(gpu) // calls]:
        print("   %9.1f %8.1f  %s" % (e.time_range.start - t0, e.time_range.end - e.time_range.start, e.name[:width]))
    print("   CUDA runtime calls (host):  count  us each  us/call")
    for name, n, each, per in by_name(api, calls)[:15]:
        print("   %-*s %5.1f %8.1f %8.1f" % (width, name[:width], n, each, per))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mix", default="uniform", help="comma-separated mixes of packed.py (default uniform)")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--window", type=int, default=0, help="a sliding window (0: none)")
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--calls", type=int, default=3, help="calls recorded per phase")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--width", type=int, default=60, help="characters of an operation's name")
    args = ap.parse_args(argv)
    if args.kv_heads is None:
        args.kv_heads = args.heads

    import torch

    import infinicp
    import infinicp.torch as ict
    import packed

    x = packed.Inputs(torch, args)
    dt = {"bf16": "bfloat16", "fp16": "float16"}[args.dtype]
    for mix in args.mix.split(","):
        lens = packed.mix_lengths(mix, args.tokens)
        dev = torch.cuda.current_device()
        comm = infinicp.local_world(1)[0]
        ctx = infinicp.Context("cuda", dev, stream=torch.cuda.current_stream().cuda_stream)
        group = infinicp.Group(ctx, comm)
        plan = infinicp.AttnPlan(group, dt, batch=1, seq_len=args.tokens, num_heads=args.heads,
                                 num_kv_heads=args.kv_heads, head_dim=args.head_dim, causal=True,
                                 layout="packed", mode="p2p", window=args.window, softcap=args.softcap)
        pack = infinicp.Pack(1, packed.cu_seqlens(lens), causal=True, window=args.window)
        try:
            xs = [ict.shard(t, pack, 0, dim=1) for t in (x.q, x.k, x.v, x.dout)]
            leaves = [t.detach().contiguous().requires_grad_(True) for t in xs[:3]]

            def fwd():
                with torch.no_grad():
                    ict.attention(*leaves, plan, pack)

            out = ict.attention(*leaves, plan, pack)

            def bwd():
                torch.autograd.grad(out, leaves, xs[3], retain_graph=True)

            for _ in range(args.warmup):
                fwd()
                bwd()
            what = "%s (%d documents, %d tokens, %d heads, dim %d)" % (mix, len(lens), args.tokens, args.heads,
                                                                       args.head_dim)
            for phase, fn in (("forward", fwd), ("backward", bwd)):
                gpu, api = profile_phase(torch, fn, args.calls)
                report("%s %s" % (what, phase), gpu, api, args.calls, args.width)
        finally:
            for h in (pack, plan, group, ctx, comm):
                h.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
