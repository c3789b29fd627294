#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Summarise a GPU timeline written by bench/trace/cupti-trace.so.

The run is cut into segments wherever nothing runs on the GPU for more than
--gap microseconds (the benchmark synchronises the host between forward and
backward and between repetitions, so each segment is one forward or one
backward of one repetition). Per segment: wall time, the time anything runs
(union), the time an attention kernel runs, the time nothing runs, and the
summed durations of each kind of work. --detail N lists segment N's
activities per stream.

    python3 bench/trace_sum.py trace.csv [--gap 40] [--min-ms 1] [--detail N]
"""
import argparse
import csv


def category(kind, name):
    if kind == "C":
        return "copy " + name
    if kind == "S":
        return "memset"
    n = name.lower()
    for key, cat in (("copy_2d", "copy kernel"), ("bwd_wgmma", "attn bwd"), ("fwd_wgmma", "attn fwd"), ("bwd", "attn bwd"),
                     ("fwd", "attn fwd"), ("convert", "convert"), ("reduce", "reduce"), ("merge", "merge"),
                     ("drow", "rowsum"), ("fill", "fill"), ("init", "init")):
        if key in n:
            return cat
    return "other " + name[:40]


def union(iv):
    tot, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        tot += cur_e - cur_s
    return tot


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--gap", type=float, default=40.0, help="idle microseconds that end a segment")
    ap.add_argument("--min-ms", type=float, default=1.0, help="segments shorter than this are not shown")
    ap.add_argument("--detail", default="", help="segment number, or 'last' (the last one shown)")
    a = ap.parse_args()
    recs = []
    with open(a.trace) as f:
        for row in csv.reader(f):
            if len(row) < 6:
                continue
            kind, s, e, st, nbytes = row[0], int(row[1]), int(row[2]), int(row[3]), int(row[4])
            recs.append((s, e, kind, st, nbytes, ",".join(row[5:])))
    recs.sort()
    if not recs:
        print("empty trace")
        return
    t0 = recs[0][0]
    segs, cur, end = [], [], None
    for r in recs:
        if cur and r[0] > end + a.gap * 1e3:
            segs.append(cur)
            cur = []
        if not cur:
            end = r[1]
        cur.append(r)
        end = max(end, r[1])
    if cur:
        segs.append(cur)
    shown = []
    print(f"{'seg':>4} {'at ms':>9} {'wall ms':>8} {'busy':>7} {'attn':>7} {'idle':>6} {'streams':>7}  summed ms by kind")
    for i, sg in enumerate(segs):
        s0, s1 = sg[0][0], max(r[1] for r in sg)
        wall = (s1 - s0) / 1e6
        if wall < a.min_ms:
            continue
        shown.append(i)
        busy = union([(r[0], r[1]) for r in sg]) / 1e6
        attn = union([(r[0], r[1]) for r in sg if category(r[2], r[5]).startswith("attn")]) / 1e6
        by = {}
        for r in sg:
            c = category(r[2], r[5])
            by[c] = by.get(c, 0) + (r[1] - r[0]) / 1e6
        kinds = "  ".join(f"{k} {v:.2f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))
        nst = len({r[3] for r in sg})
        print(f"{i:>4} {(s0 - t0) / 1e6:9.2f} {wall:8.2f} {busy:7.2f} {attn:7.2f} {wall - busy:6.2f} {nst:>7}  {kinds}")
    det = shown[-1] if a.detail == "last" and shown else int(a.detail) if a.detail.isdigit() else -1
    if 0 <= det < len(segs):
        sg = segs[det]
        s0 = sg[0][0]
        print(f"\nsegment {det}, per stream: start us, duration us, what (bytes)")
        for st in sorted({r[3] for r in sg}):
            print(f"stream {st}:")
            for r in sg:
                if r[3] == st:
                    what = category(r[2], r[5])
                    extra = f" ({r[4]})" if r[4] else ""
                    print(f"  {(r[0] - s0) / 1e3:9.1f} {(r[1] - r[0]) / 1e3:8.1f}  {what}{extra}")


if __name__ == "__main__":
    main()
