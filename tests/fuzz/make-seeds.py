#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the binary seed corpora of fuzz-attn-desc, fuzz-topology, fuzz-pack and fuzz-kernel-rects.

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


AUTO, DOC_ZIGZAG, GREEDY, CONTIG = 0, 1, 2, 3
RAW, LENGTHS, SMALL = 0, 1, 2


def pack(cp=4, docs=(64, 128, 64), how=SMALL, fix=0, mask=CAUSAL, window=0, balance=GREEDY, chunk=0,
         num=None, struct_size=0):
    # docs: offsets (RAW), lengths (LENGTHS) or lengths - 1 (SMALL, u16)
    num = len(docs) - (how == RAW) if num is None else num
    out = struct.pack("<HiiBBiqiq", struct_size, cp, num, how, fix, mask, window, balance, chunk)
    return out + b"".join(struct.pack("<H" if how == SMALL else "<q", d) for d in docs)


def kernel_rects(dtype=F32, causal=1, fmt=BSHD, f32_out=0, acc=0, gacc=0, old=0, batch=1, kv=1, heads=2, dim=8,
                 dim_v=0, sq=300, sk=300, q_off=0, k_off=0, scale=0.0, window=0, softcap=0.0, rect_list=0, rects=()):
    # rect_list: 0 the rects, 1 rects = NULL with num_rects = len(rects), 2 num_rects = -1 - len(rects)
    flags = dtype | causal << 2 | (fmt == SBHD) << 3 | f32_out << 4 | acc << 5 | gacc << 6 | old << 7
    out = struct.pack("<BBBBBBHHqqdqdBB", flags, batch - 1, kv - 1, heads // kv - 1, dim - 1, dim_v, sq, sk, q_off,
                      k_off, scale, window, softcap, rect_list, len(rects))
    for r in rects:
        wide = any(not -2**15 <= x < 2**15 for x in r)
        out += struct.pack("<B", wide) + struct.pack("<6q" if wide else "<6h", *r)
    return out


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

PACK = {
    "greedy-causal": pack(docs=(300, 20, 511, 4, 700, 100, 1000, 99), fix=2),
    "greedy-chunk-8": pack(cp=8, docs=(1023, 1023, 2047, 1023), fix=2, chunk=8),
    "greedy-window": pack(cp=4, docs=(511, 255, 127, 63, 31, 15, 7, 3), fix=2, window=100),
    "greedy-no-mask-window": pack(cp=2, docs=(99, 4000, 37), fix=2, mask=NONE, window=7),
    "auto-one-document": pack(cp=8, docs=(4095,), balance=AUTO),
    "auto-no-mask": pack(cp=4, docs=(15,) * 64, balance=AUTO, mask=NONE),
    "contiguous-odd-size": pack(cp=3, docs=(10, 20, 30), how=LENGTHS, balance=CONTIG),
    "doc-zigzag": pack(cp=4, docs=(8, 16, 24, 800), how=LENGTHS, balance=DOC_ZIGZAG),
    "doc-zigzag-rounded": pack(cp=8, docs=(5, 60, 700), fix=1, balance=DOC_ZIGZAG),
    "doc-zigzag-uneven": pack(cp=4, docs=(8, 12, 24), how=LENGTHS, balance=DOC_ZIGZAG),
    "one-token-documents": pack(cp=16, docs=(0,) * 512, balance=GREEDY, chunk=1),
    "raw-offsets": pack(cp=2, docs=(0, 5, 9, 20), how=RAW),
    "cu-not-increasing": pack(cp=2, docs=(0, 16, 16, 32), how=RAW),
    "cu-not-from-0": pack(cp=2, docs=(4, 16, 32), how=RAW),
    "negative-length": pack(cp=2, docs=(16, -8, 24), how=LENGTHS),
    "lengths-wrap": pack(cp=1, docs=(2**62, 2**62, 2**62, 2**62), how=LENGTHS),
    "huge-row": pack(cp=1, docs=(2**62,), how=LENGTHS, balance=CONTIG),
    "huge-chunk-count": pack(cp=4, docs=(2**40,), how=LENGTHS, chunk=1),
    "odd-cp-size": pack(cp=3, docs=(64, 64), how=LENGTHS),
    "chunk-not-dividing": pack(cp=4, docs=(64, 64), how=LENGTHS, chunk=24),
    "negative-chunk": pack(docs=(64, 64), how=LENGTHS, chunk=-1),
    "bad-mask": pack(mask=7),
    "negative-window": pack(window=-5),
    "bad-balance": pack(balance=9),
    "zero-cp-size": pack(cp=0),
    "int-max-cp-size": pack(cp=2**31 - 1, docs=(2**31 - 2,), how=LENGTHS, balance=CONTIG),
    "negative-num-seqs": pack(num=-1),
    "old-struct-size": pack(struct_size=16),
}

POS_MAX = 2**63 // 4
KERNEL_RECTS = {
    "packed-causal-window": kernel_rects(dtype=BF16, window=64, rects=(
        (0, 100, 0, 100, 0, 0), (100, 150, 100, 150, 100, 100), (250, 50, 250, 50, 250, 250))),
    "two-rects-per-row-softcap": kernel_rects(softcap=30.0, sq=200, sk=200, rects=(
        (0, 100, 0, 100, 0, 0), (100, 100, 0, 100, 300, 0), (100, 100, 100, 100, 300, 300))),
    "rows-in-no-rect-accumulate": kernel_rects(dtype=F16, fmt=SBHD, f32_out=1, acc=1, gacc=1, sq=150, sk=120,
                                               rects=((10, 40, 0, 120, 50, 0), (90, 30, 60, 60, 200, 100))),
    "empty-list": kernel_rects(sq=40, sk=40),
    "tile-edges": kernel_rects(causal=0, window=100, sq=300, sk=300, rects=(
        (0, 95, 0, 97, 0, 0), (95, 49, 97, 47, 95, 97), (144, 112, 144, 113, 144, 144),
        (256, 1, 257, 43, 256, 257), (257, 43, 0, 300, 1000, 700))),
    "one-row-and-empty-rects": kernel_rects(sq=20, sk=20, rects=(
        (0, 1, 0, 20, 5, 0), (20, 0, 3, 4, 0, 0), (7, 5, 20, 0, 0, 0), (1, 19, 0, 20, 6, 1))),
    "gqa-dv-softcap-window": kernel_rects(dtype=BF16, batch=2, kv=2, heads=4, dim=16, dim_v=12, sq=97, sk=145,
                                          window=20, softcap=2.5, rects=((0, 97, 0, 145, 60, 0),)),
    "huge-window-far-positions": kernel_rects(window=2**63 - 1, sq=64, sk=64, rects=(
        (0, 64, 0, 64, POS_MAX - 64, POS_MAX - 64), (0, 32, 0, 32, 0, POS_MAX - 32))),
    "dense-none-mask-window": kernel_rects(causal=0, window=5, sq=130, sk=70, q_off=30, rect_list=1),
    "old-struct-size": kernel_rects(old=1, window=-5, softcap=-1.0, rect_list=2, rects=((0, 1, 0, 1, 0, 0),)),
    "negative-window": kernel_rects(window=-1),
    "nan-softcap": kernel_rects(softcap=math.nan),
    "tiny-softcap": kernel_rects(softcap=1e-300),
    "rects-null-with-count": kernel_rects(rect_list=1, rects=((0, 1, 0, 1, 0, 0), (0, 1, 0, 1, 0, 0))),
    "negative-num-rects": kernel_rects(rect_list=2, rects=((0, 1, 0, 1, 0, 0),)),
    "rect-past-seq": kernel_rects(sq=10, sk=10, rects=((5, 6, 0, 10, 0, 0),)),
    "rect-negative-len": kernel_rects(rects=((0, 4, 3, -1, 0, 0),)),
    "rect-position-overflow": kernel_rects(rects=((0, 4, 0, 4, 2**62, 0),)),
    "rect-int64-extremes": kernel_rects(rects=((-2**63, 2**63 - 1, 2**63 - 1, -2**63, 2**63 - 1, 2**63 - 1),)),
    # found by the fuzzer: a softcap that rounds to 0 in fp32 turned the kernels' softcap off
    "softcap-below-fp32": kernel_rects(dtype=F16, fmt=SBHD, f32_out=1, acc=1, gacc=1, dim=8, sq=150, sk=1,
                                       q_off=16384, scale=8.179103587778735e-227, window=14074264231608321,
                                       softcap=1.5244092869938126e-261, rect_list=1),
    # found by the fuzzer: scale and softcap of 1e16, scores of that size; the backward's recomputed
    # score passed the forward's LSE by far more than 1 and 2^that overflowed the gradients
    "huge-scale-and-softcap": kernel_rects(dim=8, sq=300, sk=300, q_off=1407649761459968,
                                           scale=1.0843961455707782e16, window=4846791580151137024,
                                           softcap=1.0843961455707782e16, rect_list=1),
    # found by the fuzzer: the same scale in F16; dK of ~1e16 is past F16's 65504 and rightly inf,
    # which the target took for a failure. Beside it the same call with F32 gradients, finite
    "huge-scale-f16-gradients": kernel_rects(dtype=F16, causal=0, heads=1, dim=5, dim_v=1, sq=1792, sk=300,
                                             q_off=1407649761459968, k_off=35, scale=1.0857155595302022e16,
                                             window=4846791580151137024, softcap=1.0843959207560838e16,
                                             rect_list=1),
    "huge-scale-f32-gradients": kernel_rects(dtype=F16, causal=0, f32_out=1, heads=1, dim=5, dim_v=1, sq=1792,
                                             sk=300, q_off=1407649761459968, k_off=35,
                                             scale=1.0857155595302022e16, window=4846791580151137024,
                                             softcap=1.0843959207560838e16, rect_list=1),
}

for name, data in ATTN.items():
    write("attn-desc", name, data)
for name, data in TOPOLOGY.items():
    write("topology", name, data)
for name, data in PACK.items():
    write("pack", name, data)
for name, data in KERNEL_RECTS.items():
    write("kernel-rects", name, data)
