#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the binary seed corpora of fuzz-attn-desc and fuzz-topology.

Each seed spells out, little-endian, the fields its target reads (see the
comment at the top of each target and input.h): a struct_size of 0 means
"sizeof the struct". Run from anywhere; the files go to corpus/<target>/
next to this script, named for what they hold. The seeds are committed;
run this again only to change them.
"""
import math
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

F32, F16, BF16, F64 = 0, 1, 2, 3
BSHD, SBHD = 0, 1
NONE, CAUSAL = 0, 1
CONTIGUOUS, ZIGZAG = 0, 1
ALL_GATHER, P2P, A2A, A2A_P2P = 0, 1, 2, 3


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def desc(dtype=F32, fmt=BSHD, batch=1, seq=16, heads=2, kv=1, dim=4, dim_v=0, mask=CAUSAL, scale=0.0,
         layout=CONTIGUOUS, mode=P2P, struct_size=0):
    return struct.pack("<BHiiqqiiiiidii", 0, struct_size, dtype, fmt, batch, seq, heads, kv, dim, dim_v, mask,
                       scale, layout, mode)


def kernel(backward=0, dtype=F32, fmt=BSHD, batch=1, heads=2, kv=1, dim=4, dim_v=0, sq=5, sk=7, q_off=0,
           k_off=0, mask=CAUSAL, scale=0.0, strides=None, o_dtype=F32, accumulate=0, grad_dtype=F32,
           grad_accumulate=0, struct_size=0, drow_ready=None):
    # strides: name -> tuple, for q k v o lse dout dq dk dv (all zero = dense)
    s = {n: (0, 0, 0) for n in ("q", "k", "v", "o", "dout", "dq", "dk", "dv")}
    s["lse"] = (0, 0)
    s.update(strides or {})
    out = struct.pack("<BHiiqiiiiqqqqid", 1 + backward, struct_size, dtype, fmt, batch, heads, kv, dim, dim_v, sq,
                      sk, q_off, k_off, mask, scale)
    for n in ("q", "k", "v", "o"):
        out += struct.pack("<qqq", *s[n])
    out += struct.pack("<i", o_dtype) + struct.pack("<qq", *s["lse"]) + struct.pack("<i", accumulate)
    for n in ("dout", "dq", "dk", "dv"):
        out += struct.pack("<qqq", *s[n])
    out += struct.pack("<ii", grad_dtype, grad_accumulate)
    # drow_ready came later: seeds without it read 0
    return out if drow_ready is None else out + struct.pack("<i", drow_ready)


def merge(fmt=BSHD, batch=1, seq=4, heads=2, dim_v=4, o=(0, 0, 0), o_dtype=F32, lse=(0, 0), part=(0, 0, 0),
          part_dtype=F32, lse_part=(0, 0), struct_size=0):
    return (struct.pack("<BHiqqii", 3, struct_size, fmt, batch, seq, heads, dim_v) + struct.pack("<qqq", *o) +
            struct.pack("<i", o_dtype) + struct.pack("<qq", *lse) + struct.pack("<qqq", *part) +
            struct.pack("<i", part_dtype) + struct.pack("<qq", *lse_part))


def topology(world=8, tp=2, cp=2, dp=0, pp=1, a2a=1, order=b"tp-cp-dp-pp", struct_size=0):
    head = struct.pack("<Hiiiiii", struct_size, world, tp, cp, dp, pp, a2a)
    return head + (b"\x00" if order is None else b"\x01" + order)


ATTN = {
    "p2p-f32-causal": desc(),
    "all-gather-bf16-sbhd-zigzag": desc(dtype=BF16, fmt=SBHD, batch=2, seq=8, heads=4, kv=2, dim=8, dim_v=4,
                                        mask=NONE, layout=ZIGZAG, mode=ALL_GATHER),
    "a2a-f16-scale": desc(dtype=F16, heads=4, kv=4, dim=8, scale=0.5, mode=A2A),
    "hybrid-gqa": desc(batch=3, seq=12, heads=6, kv=2, dim=3, dim_v=5, mode=A2A_P2P),
    "f64-unsupported": desc(dtype=F64),
    "huge-seq-overflows": desc(seq=1 << 62),
    "workspace-overflows": desc(seq=3 << 56, heads=1, kv=1, dim=1, mode=ALL_GATHER),
    "old-struct-size": desc(struct_size=8),
    # found by the fuzzer: the kernels' scratch overflowed, and the message named the kernel only
    "kernel-scratch-overflows": desc(seq=(1 << 56) - (1 << 40), heads=16, kv=1, dim=1, mask=NONE, mode=ALL_GATHER),
    "nan-scale": desc(scale=math.nan),
    "kernel-forward-f32": kernel(),
    "kernel-forward-bf16-strided": kernel(dtype=BF16, o_dtype=F32, strides={"q": (0, 16, 8), "o": (64, 8, 4)}),
    "kernel-forward-accumulate-offsets": kernel(q_off=10, k_off=3, accumulate=1),
    "kernel-forward-no-visible-key": kernel(q_off=0, k_off=100),
    "kernel-forward-sbhd-f16": kernel(dtype=F16, fmt=SBHD, batch=2, o_dtype=F16, mask=NONE),
    "kernel-backward-f32": kernel(backward=1),
    "kernel-backward-gqa-f16": kernel(backward=1, dtype=F16, heads=4, kv=2, dim=8, dim_v=6, o_dtype=F16,
                                      grad_dtype=F32, grad_accumulate=1),
    "kernel-backward-overlapping-rows": kernel(backward=1, strides={"k": (0, 0, 4), "dk": (1, 1, 1)}),
    "kernel-size-overflow": kernel(batch=1 << 62),
    "kernel-backward-drow-reuse": kernel(backward=1, dtype=BF16, heads=4, kv=2, dim=8, o_dtype=BF16, mask=NONE,
                                         strides={"lse": (40, 9)}, grad_accumulate=1, drow_ready=1),
    "kernel-backward-drow-bad-flag": kernel(backward=1, drow_ready=2),
    # found by the fuzzer: a struct_size that ends before drow_ready leaves it 0, whatever the caller's field holds
    "kernel-backward-drow-past-struct-size": kernel(backward=1, struct_size=409, drow_ready=2),
    # found by the fuzzer: the last element's offset was INT64_MAX, and one past it overflowed
    "kernel-extent-int64-max": kernel(backward=1, batch=1 << 31, sq=1 << 28, heads=1, kv=1, dim=16),
    "merge-f32": merge(),
    "merge-mixed-strided": merge(batch=2, o_dtype=BF16, lse=(16, 4), part=(64, 16, 4)),
    "merge-bad-dtype": merge(o_dtype=F64),
}

TOPOLOGY = {
    "default-order": topology(),
    "null-order": topology(order=None),
    "every-axis": topology(world=48, tp=2, cp=6, dp=2, pp=2, a2a=3, order=b"pp-dp-cp-tp"),
    "cp-a2a-p2p": topology(world=16, tp=1, cp=8, dp=0, pp=2, a2a=2, order=b"cp-tp-pp-dp"),
    "world-of-one": topology(world=1, tp=1, cp=1, dp=1, pp=1),
    "large-world": topology(world=1 << 20, tp=8, cp=16, dp=0, pp=4, a2a=4),
    "int-max-sizes": topology(world=2**31 - 1, tp=2**31 - 1, cp=2**31 - 1, dp=2**31 - 1, pp=2**31 - 1),
    "repeated-axis": topology(order=b"tp-tp-dp-pp"),
    "short-order": topology(order=b"tp-cp-dp"),
    "trailing-dash": topology(order=b"tp-cp-dp-pp-"),
    "nul-inside-order": topology(order=b"tp-cp\x00-dp-pp"),
    "a2a-not-dividing": topology(a2a=3),
    "old-struct-size": topology(struct_size=16),
    # found by the fuzzer: listing a group stepped past INT_MAX after its last member
    "group-past-int-max": topology(world=1888354304, tp=8, cp=16, dp=0, pp=4, a2a=4, order=None),
}

for name, data in ATTN.items():
    write("attn-desc", name, data)
for name, data in TOPOLOGY.items():
    write("topology", name, data)
