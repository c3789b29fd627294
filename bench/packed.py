#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Packed rows of documents on one GPU: infinicp against PyTorch.

One packed row of T tokens (default 32768) holds the documents of one of the
mixes of `infinicp-bench --pack` (tools/pack_bench.c: the same generators,
seeds and parameters, reproduced below; --selfcheck compares them), bf16,
16 heads of dim 128, causal attention inside each document. Rows, each
forward and backward:

  infinicp            infinicp.torch.attention on a one-rank CUDA plan,
                      layout="packed", with infinicp.Pack(1, cu_seqlens)
  infinicp-window     the same with a sliding window (--window, 4096)
  flex                FlexAttention (torch.compile) with a document-causal
                      BlockMask
  flex-window         FlexAttention with documents and the sliding window
  infinicp-softcap    the infinicp row with a logit softcap (--softcap, 30)
  flex-softcap        FlexAttention with the same softcap as a score_mod
  flash-varlen        PyTorch's FlashAttention-2 varlen kernel
                      (torch.ops.aten._flash_attention_forward / _backward
                      with cu_seqlens), where this PyTorch has it
  flash-varlen-window the same with window_size_left = W - 1
  sdpa-cudnn-dense    reference: cuDNN SDPA, causal over the whole row, as
                      if it were one document
  sdpa-flash-dense    reference: the same with SDPA's flash backend

Times are CUDA-event times of one call (forward; backward alone, from a
kept graph), the median of --reps after --warmup calls. TFLOP/s count
useful work only: 4 * pairs * D * H for the forward, 2.5 times that for
the backward, with pairs the (query, key) pairs the row's mask lets through
(for the dense references, the whole causal triangle). Rows with the same
mask are compared with each other (max |out difference| against the first
such row that ran). A row that fails prints its error and the others run.

Output: one markdown table on stdout; --json FILE for the numbers; --png
FILE for a plot (needs matplotlib). --selfcheck runs without PyTorch or a
GPU: it checks the mix generators against digests of pack_bench.c's mixes
and, with --bench-bin PATH, against that infinicp-bench's --pack output.

The infinicp rows need the library and its CUDA module: the package from
python/ on PYTHONPATH (or installed), INFINICP_LIBRARY naming libinfinicp.so.1
where it is not installed, and INFINICP_MODULE_PATH the folder of
backend-cuda.so where that is not installed either.
"""

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import traceback

# ---------------------------------------------------------------------------
# Document mixes: tools/pack_bench.c's make_mix, value for value
# ---------------------------------------------------------------------------

MIXES = ["lognormal-2k", "lognormal-512", "uniform", "one-long", "web+books"]
MIX_WHAT = {
    "lognormal-2k": "lognormal lengths, mean 2048, sigma 1",
    "lognormal-512": "lognormal lengths, mean 512, sigma 1",
    "uniform": "lengths uniform in [1, 4096]",
    "one-long": "one document of T/2, the rest uniform in [16, 512]",
    "web+books": "web pages (lognormal, mean 600, sigma 0.8) and 3/8 of T in 7 books and code files",
}
_M64 = (1 << 64) - 1


class _SplitMix64:
    """pack_bench.c's generator (splitmix64) and its three draws."""

    def __init__(self, seed):
        self.s = seed & _M64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & _M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return z ^ (z >> 31)

    def uniform01(self):  # in (0, 1], exact in a double
        return ((self.next() >> 11) + 1) * 2.0 ** -53

    def uniform(self, lo, hi):
        return lo + self.next() % (hi - lo + 1)

    def lognormal(self, mean, sigma):
        # The C expression sqrt(-2 log(u1)) * cos(2 pi u2) draws u1 first
        # with GCC and Clang (what --selfcheck checks); the same libm
        # functions, in the same order of operations.
        u1 = self.uniform01()
        u2 = self.uniform01()
        z = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
        x = math.exp(math.log(mean) - sigma * sigma / 2 + sigma * z)
        f = math.floor(x)
        return int(f) + (1 if x - f >= 0.5 else 0)  # llround: halves away from zero (x > 0)


def mix_lengths(name, T):
    """The document lengths of mix `name` over T tokens, in row order."""
    k = MIXES.index(name)
    r = _SplitMix64(0x5EED0000 + k)
    lens = []
    if name == "one-long":
        lens.append(T // 2)
    if name == "web+books":
        lens += [b for b in (T // 8, T // 16, T // 16, T // 32, T // 32, T // 32, T // 32) if b > 0]
    total = sum(lens)
    while total < T:
        if name == "lognormal-2k":
            n = r.lognormal(2048, 1)
        elif name == "lognormal-512":
            n = r.lognormal(512, 1)
        elif name == "uniform":
            n = r.uniform(1, 4096)
        elif name == "one-long":
            n = r.uniform(16, 512)
        else:
            n = r.lognormal(600, 0.8)
        n = 1 if n < 1 else min(n, T - total)
        lens.append(n)
        total += n
    for i in range(len(lens) - 1, 0, -1):  # Fisher-Yates
        j = r.next() % (i + 1)
        lens[i], lens[j] = lens[j], lens[i]
    return lens


def cu_seqlens(lens):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu


def visible_pairs(lens, window=0):
    """(query, key) pairs of causal attention inside each document, with a
    sliding window W (key j visible to query i iff i - W < j <= i) if W > 0."""
    pairs = 0
    for n in lens:
        if window <= 0 or n <= window:
            pairs += n * (n + 1) // 2
        else:
            pairs += window * (window + 1) // 2 + (n - window) * window
    return pairs


def _digest(lens):
    return hashlib.sha256(",".join(str(n) for n in lens).encode()).hexdigest()[:16]


# (T, mix) -> (documents, longest, sha256 of the comma-separated lengths,
# first 16 hex digits), from pack_bench.c's pack_bench_docs (built with GCC
# -O2 and Clang -O2: the same).
_MIX_DIGESTS = {
    (32768, "lognormal-2k"): (12, 19134, "99506550e2c6cb52"),
    (32768, "lognormal-512"): (66, 4118, "1a2b9ab0895c8455"),
    (32768, "uniform"): (15, 4061, "bacdc932955dd32c"),
    (32768, "one-long"): (69, 16384, "037e928a779e1d17"),
    (32768, "web+books"): (56, 4096, "556f922393d624fe"),
}


def selfcheck(args):
    """The generators against pack_bench.c: the digests above, and with
    --bench-bin an infinicp-bench's own summary line of every mix at
    --tokens. Needs neither PyTorch nor a GPU."""
    bad = 0
    for (T, name), (n, longest, dig) in sorted(_MIX_DIGESTS.items()):
        lens = mix_lengths(name, T)
        got = (len(lens), max(lens), _digest(lens))
        ok = got == (n, longest, dig) and sum(lens) == T and min(lens) >= 1
        bad += not ok
        print("%-14s T=%-7d %3d documents, longest %6d, digest %s  %s" % (
            name, T, got[0], got[1], got[2], "ok" if ok else "MISMATCH (pack_bench.c: %d, %d, %s)" % (n, longest, dig)))
    if args.bench_bin:
        for name in MIXES:
            cmd = [args.bench_bin, "--pack", "--mix", name, "--tokens", str(args.tokens), "--cp", "2"]
            try:
                text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            except (OSError, subprocess.CalledProcessError) as e:
                print("%s: %s" % (" ".join(cmd), e))
                bad += 1
                continue
            lens = mix_lengths(name, args.tokens)
            want = "%d documents, mean %.0f, longest %d" % (len(lens), args.tokens / len(lens), max(lens))
            ok = want in text
            bad += not ok
            print("%-14s T=%-7d infinicp-bench --pack: %s" % (name, args.tokens, "ok" if ok else
                                                             "MISMATCH: expected '%s' in\n%s" % (want, text)))
    print("selfcheck: %s" % ("ok" if not bad else "%d MISMATCHES" % bad))
    return 1 if bad else 0


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


def _median_ms(torch, fn, warmup, reps):
    """Median CUDA-event time of fn() in ms, after warmup calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


class Inputs:
    """q, k, v, dout of one row: [1, T, H, D] (bshd), bf16, on the GPU."""

    def __init__(self, torch, args):
        g = torch.Generator(device="cuda").manual_seed(args.seed)
        T, H, Hkv, D = args.tokens, args.heads, args.kv_heads, args.head_dim
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]

        def rand(heads):
            return torch.randn(1, T, heads, D, device="cuda", generator=g, dtype=torch.float32).to(dt)

        self.q, self.k, self.v, self.dout = rand(H), rand(Hkv), rand(Hkv), rand(H)


def _leaves(torch, xs, layout):
    """Fresh leaves requiring grad from bshd tensors, in `layout`: "bshd",
    "bhsd" ([1, H, T, D], contiguous) or "thd" ([T, H, D])."""
    out = []
    for x in xs:
        if layout == "bhsd":
            y = x.transpose(1, 2).contiguous()
        elif layout == "thd":
            y = x[0].contiguous()
        else:
            y = x.contiguous()
        out.append(y.detach().requires_grad_(True))
    return out


def _to_bshd(x, layout):
    if layout == "bhsd":
        return x.transpose(1, 2)
    if layout == "thd":
        return x.unsqueeze(0)
    return x


def time_autograd(torch, fwd, leaves, dout, args):
    """(forward ms, backward ms, output) of out = fwd(*leaves): the forward
    under no_grad, the backward as autograd.grad of a kept graph."""

    def f():
        with torch.no_grad():
            return fwd(*leaves)

    tf = _median_ms(torch, f, args.warmup, args.reps)
    tb = None
    out = fwd(*leaves)
    if not args.fwd_only:
        def b():
            torch.autograd.grad(out, leaves, dout, retain_graph=True)

        tb = _median_ms(torch, b, args.warmup, args.reps)
    return tf, tb, out.detach()


# ---------------------------------------------------------------------------
# The rows
# ---------------------------------------------------------------------------


def row_infinicp(torch, x, lens, args, window, softcap=0.0):
    import infinicp
    import infinicp.torch as ict

    T = args.tokens
    cu = cu_seqlens(lens)
    dev = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    comm = infinicp.local_world(1)[0]
    ctx = infinicp.Context("cuda", dev, stream=stream)
    group = infinicp.Group(ctx, comm)
    plan = infinicp.AttnPlan(group, {"bf16": "bfloat16", "fp16": "float16"}[args.dtype], batch=1, seq_len=T,
                             num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.head_dim, causal=True,
                             layout="packed", mode="p2p", window=window, softcap=softcap)
    pack = infinicp.Pack(1, cu, causal=True, window=window)
    try:
        # the one rank's tokens in the pack's order (all of them)
        xs = [ict.shard(t, pack, 0, dim=1) for t in (x.q, x.k, x.v, x.dout)]
        leaves = _leaves(torch, xs[:3], "bshd")
        pos = torch.as_tensor(pack.positions(0), device="cuda")

        def fwd(q, k, v):
            return ict.attention(q, k, v, plan, pack)

        tf, tb, out = time_autograd(torch, fwd, leaves, xs[3], args)
        full = torch.empty_like(out)
        full[:, pos] = out  # back to row order, for the comparison
        return tf, tb, full
    finally:
        for h in (pack, plan, group, ctx, comm):
            h.close()


def _flex_fns(torch):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if not hasattr(_flex_fns, "compiled"):
        try:  # a mask function per mix and mask: room for their compilations
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        except AttributeError:
            pass
        _flex_fns.compiled = torch.compile(flex_attention, dynamic=False)
    return create_block_mask, _flex_fns.compiled


def row_flex(torch, x, lens, args, window, softcap=0.0):
    create_block_mask, flex = _flex_fns(torch)
    T = args.tokens
    doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda", dtype=torch.int32),
                                  torch.as_tensor(lens, device="cuda"))

    def doc_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    def doc_causal_window(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    mod = doc_causal_window if window else doc_causal
    try:
        mask = create_block_mask(mod, None, None, T, T, device="cuda", _compile=True)
    except TypeError:  # a PyTorch without _compile
        mask = create_block_mask(mod, None, None, T, T, device="cuda")
    gqa = args.kv_heads != args.heads
    leaves = _leaves(torch, (x.q, x.k, x.v), "bhsd")
    dout = x.dout.transpose(1, 2).contiguous()

    kw = dict(block_mask=mask)
    if gqa:
        kw["enable_gqa"] = True
    if softcap:
        def cap(score, b, h, q_idx, kv_idx):
            return softcap * torch.tanh(score / softcap)

        kw["score_mod"] = cap

    def fwd(q, k, v):
        return flex(q, k, v, **kw)

    tf, tb, out = time_autograd(torch, fwd, leaves, dout, args)
    return tf, tb, _to_bshd(out, "bhsd")


def row_flash_varlen(torch, x, lens, args, window):
    ops = torch.ops.aten
    if not hasattr(ops, "_flash_attention_forward") or not hasattr(ops, "_flash_attention_backward"):
        raise RuntimeError("this PyTorch has no aten::_flash_attention_forward / _backward")
    cu = torch.as_tensor(cu_seqlens(lens), device="cuda", dtype=torch.int32)
    longest = max(lens)
    scale = args.head_dim ** -0.5
    win = dict(window_size_left=window - 1, window_size_right=0) if window else {}
    q, k, v = (t[0].contiguous() for t in (x.q, x.k, x.v))
    dout = x.dout[0].contiguous()

    def fwd():
        return ops._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, True, False, scale=scale,
                                            **win)

    out, lse, rng, unused, _ = fwd()

    def bwd():
        return ops._flash_attention_backward(dout, q, k, v, out, lse, cu, cu, longest, longest, 0.0, True, rng,
                                             unused, scale=scale, **win)

    tf = _median_ms(torch, fwd, args.warmup, args.reps)
    tb = None if args.fwd_only else _median_ms(torch, bwd, args.warmup, args.reps)
    return tf, tb, out.unsqueeze(0)


def row_sdpa_dense(torch, x, lens, args, backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend_name]
    F = torch.nn.functional
    gqa = args.kv_heads != args.heads
    leaves = _leaves(torch, (x.q, x.k, x.v), "bhsd")
    dout = x.dout.transpose(1, 2).contiguous()

    def fwd(q, k, v):
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with sdpa_kernel([backend]):
        tf, tb, out = time_autograd(torch, fwd, leaves, dout, args)
    return tf, tb, _to_bshd(out, "bhsd")


# name -> (run(torch, inputs, lens, args), window?, mask for comparisons)
ROWS = {
    "infinicp": (lambda t, x, l, a: row_infinicp(t, x, l, a, 0), False, "doc"),
    "infinicp-window": (lambda t, x, l, a: row_infinicp(t, x, l, a, a.window), True, "doc-window"),
    "flex": (lambda t, x, l, a: row_flex(t, x, l, a, 0), False, "doc"),
    "flex-window": (lambda t, x, l, a: row_flex(t, x, l, a, a.window), True, "doc-window"),
    "infinicp-softcap": (lambda t, x, l, a: row_infinicp(t, x, l, a, 0, a.softcap), False, "doc-softcap"),
    "flex-softcap": (lambda t, x, l, a: row_flex(t, x, l, a, 0, a.softcap), False, "doc-softcap"),
    "flash-varlen": (lambda t, x, l, a: row_flash_varlen(t, x, l, a, 0), False, "doc"),
    "flash-varlen-window": (lambda t, x, l, a: row_flash_varlen(t, x, l, a, a.window), True, "doc-window"),
    "sdpa-cudnn-dense": (lambda t, x, l, a: row_sdpa_dense(t, x, l, a, "cudnn"), False, "dense"),
    "sdpa-flash-dense": (lambda t, x, l, a: row_sdpa_dense(t, x, l, a, "flash"), False, "dense"),
}


def run(args):
    import torch

    if not torch.cuda.is_available():
        print("bench/packed.py: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    rows = args.rows.split(",") if args.rows else list(ROWS)
    for r in rows:
        if r not in ROWS:
            print("bench/packed.py: unknown row %r (rows: %s)" % (r, ", ".join(ROWS)), file=sys.stderr)
            return 2
    mixes = args.mix.split(",") if args.mix else MIXES
    for m in mixes:
        if m not in MIXES:
            print("bench/packed.py: unknown mix %r (mixes: %s)" % (m, ", ".join(MIXES)), file=sys.stderr)
            return 2
    x = Inputs(torch, args)
    H, D = args.heads, args.head_dim
    results = []
    for m in mixes:
        lens = mix_lengths(m, args.tokens)
        refs = {}  # mask -> (row, out) of the first row of that mask that ran
        for r in rows:
            fn, windowed, mask = ROWS[r]
            dense = mask == "dense"
            pairs = args.tokens * (args.tokens + 1) // 2 if dense else visible_pairs(lens, args.window if windowed else 0)
            res = dict(mix=m, docs=len(lens), longest=max(lens), row=r, pairs=pairs, fwd_ms=None, bwd_ms=None,
                       fwd_tflops=None, bwd_tflops=None, max_diff=None, diff_vs=None, error=None)
            try:
                tf, tb, out = fn(torch, x, lens, args)
                res["fwd_ms"], res["bwd_ms"] = tf, tb
                flops = 4.0 * pairs * D * H
                res["fwd_tflops"] = flops / (tf * 1e-3) * 1e-12
                if tb:
                    res["bwd_tflops"] = 2.5 * flops / (tb * 1e-3) * 1e-12
                if mask in refs:
                    res["diff_vs"] = refs[mask][0]
                    res["max_diff"] = (out.float() - refs[mask][1].float()).abs().max().item()
                else:
                    refs[mask] = (r, out)
            except Exception as e:  # noqa: BLE001 - a failing backend must not stop the others
                res["error"] = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
                print("%s / %s failed: %s" % (m, r, res["error"]), file=sys.stderr)
                if args.verbose:
                    traceback.print_exc()
            finally:
                torch.cuda.synchronize()
            results.append(res)
            print("%s / %s: %s" % (m, r, _brief(res)), file=sys.stderr, flush=True)
        del refs
        torch.cuda.empty_cache()
    print(table(results, args))
    if args.json:
        meta = dict(tokens=args.tokens, heads=H, kv_heads=args.kv_heads, head_dim=D, dtype=args.dtype,
                    window=args.window, softcap=args.softcap, reps=args.reps, warmup=args.warmup, torch=torch.__version__,
                    device=torch.cuda.get_device_name(), cuda=torch.version.cuda)
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)
    if args.png:
        plot(results, args)
    return 0


def _brief(r):
    if r["error"]:
        return "error"
    return "fwd %.3f ms%s" % (r["fwd_ms"], ", bwd %.3f ms" % r["bwd_ms"] if r["bwd_ms"] else "")


def _fmt(v, f):
    return "-" if v is None else f % v


def table(results, args):
    lines = ["T = %d packed tokens, %s, %d heads (%d kv), head_dim %d, causal; window rows W = %d; "
             "median of %d reps; TFLOP/s of visible pairs only (backward 2.5x the forward's FLOPs)" % (
                 args.tokens, args.dtype, args.heads, args.kv_heads, args.head_dim, args.window, args.reps),
             "",
             "| mix | docs | row | visible pairs | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | max abs diff | note |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        note = r["error"] or ("vs %s" % r["diff_vs"] if r["diff_vs"] else "")
        lines.append("| %s | %d | %s | %d | %s | %s | %s | %s | %s | %s |" % (
            r["mix"], r["docs"], r["row"], r["pairs"], _fmt(r["fwd_ms"], "%.3f"), _fmt(r["bwd_ms"], "%.3f"),
            _fmt(r["fwd_tflops"], "%.1f"), _fmt(r["bwd_tflops"], "%.1f"), _fmt(r["max_diff"], "%.3g"),
            note.replace("|", "/")))
    return "\n".join(lines)


def plot(results, args):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print("--png: no matplotlib (%s); no plot" % e, file=sys.stderr)
        return
    mixes = list(dict.fromkeys(r["mix"] for r in results))
    rows = list(dict.fromkeys(r["row"] for r in results))
    fig, axes = plt.subplots(1, 1 if args.fwd_only else 2, figsize=(14, 5), squeeze=False)
    width = 0.8 / max(len(rows), 1)
    for ai, key in enumerate(["fwd_tflops"] + ([] if args.fwd_only else ["bwd_tflops"])):
        ax = axes[0][ai]
        for ri, row in enumerate(rows):
            vals = []
            for m in mixes:
                v = [r[key] for r in results if r["mix"] == m and r["row"] == row]
                vals.append(v[0] if v and v[0] else 0.0)
            ax.bar([i + ri * width for i in range(len(mixes))], vals, width, label=row)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(mixes))])
        ax.set_xticklabels(mixes, rotation=20)
        ax.set_ylabel("TFLOP/s (visible pairs)")
        ax.set_title("%s, T = %d, H = %d, D = %d" % ("forward" if key == "fwd_tflops" else "backward", args.tokens,
                                                     args.heads, args.head_dim))
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print("plot: %s" % args.png, file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32768, help="T, the packed row's tokens (default 32768)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--window", type=int, default=4096, help="the window rows' W (default 4096)")
    p.add_argument("--softcap", type=float, default=30.0, help="the softcap rows' cap (default 30)")
    p.add_argument("--mix", default=None, help="comma-separated mixes (default all: %s)" % ", ".join(MIXES))
    p.add_argument("--rows", default=None, help="comma-separated rows (default all: %s)" % ", ".join(ROWS))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--fwd-only", action="store_true", help="time the forward only")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    p.add_argument("--png", default=None, help="plot TFLOP/s here (needs matplotlib)")
    p.add_argument("--verbose", action="store_true", help="tracebacks of failing rows")
    p.add_argument("--selfcheck", action="store_true",
                   help="check the mix generators against pack_bench.c (no PyTorch or GPU needed)")
    p.add_argument("--bench-bin", default=None,
                   help="with --selfcheck: an infinicp-bench to compare the mixes with at --tokens")
    args = p.parse_args(argv)
    if args.kv_heads is None:
        args.kv_heads = args.heads
    if args.selfcheck:
        return selfcheck(args)
    if args.tokens < 1 or args.heads < 1 or args.kv_heads < 1 or args.heads % args.kv_heads or args.head_dim < 1:
        p.error("sizes must be positive and --kv-heads must divide --heads")
    if args.window < 1:
        p.error("--window must be >= 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
