#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Join the CSV lines of bench-gpu --csv and sdpa_baseline.py into one table.

Usage: table.py RESULTS.csv [PLOT.png]
Prints a Markdown table: shape, causal, fwd and bwd TFLOP/s of infinicp,
flash and cuDNN, and infinicp's ratio to each baseline. With PLOT.png and
matplotlib present, also plots TFLOP/s against sequence length.
"""
import sys


def main():
    rows = {}
    for line in open(sys.argv[1]):
        if not line.strip() or line.startswith("#"):
            continue
        impl, d, s, b, h, causal, f, bw = line.strip().split(",")
        # head dims "D" or "D/Dv" (MLA's 192/128), sorted by D then Dv
        dd = tuple(int(x) for x in d.split("/"))
        rows.setdefault((dd, int(causal), int(s), int(b), int(h)), {})[impl] = (float(f), float(bw))
    impls = ("infinicp", "flash", "cudnn")

    # a value of 0 is one not measured (a forward-only run's backward)
    def cell(r, impl, i):
        return f"{r[impl][i]:.0f}" if impl in r and r[impl][i] > 0 else "-"

    def ratio(r, other, i):
        ok = "infinicp" in r and other in r and r["infinicp"][i] > 0 and r[other][i] > 0
        return f"{r['infinicp'][i] / r[other][i]:.2f}" if ok else "-"

    print("| D | S | B x H | causal | fwd ours | fwd flash | fwd cudnn | bwd ours | bwd flash | bwd cudnn |"
          " fwd/flash | fwd/cudnn | bwd/flash | bwd/cudnn |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(rows):
        d, causal, s, b, h = key
        r = rows[key]
        print(f"| {'/'.join(map(str, d))} | {s} | {b}x{h} | {'yes' if causal else 'no'} | "
              + " | ".join(cell(r, i, 0) for i in impls) + " | "
              + " | ".join(cell(r, i, 1) for i in impls) + " | "
              + " | ".join(ratio(r, o, i) for i in (0, 1) for o in ("flash", "cudnn")) + " |")
    print("\nTFLOP/s, bf16, FLOPs as FlashAttention counts them (2 B H S^2 (D + Dv) forward, halved "
          "when causal; backward 2.5x)")
    det = [k for k in sorted(rows) if "infinicp" in rows[k] and "infinicp-det" in rows[k]]
    if det:
        print("\n| D | S | causal | bwd default | bwd deterministic | cost of determinism |")
        print("|---|---|---|---|---|---|")
        for key in det:
            a, dt = rows[key]["infinicp"][1], rows[key]["infinicp-det"][1]
            print(f"| {'/'.join(map(str, key[0]))} | {key[2]} | {'yes' if key[1] else 'no'} | {a:.0f} | {dt:.0f} | "
                  f"{(a / dt - 1) * 100:+.0f} % |")
        print("\nbackward TFLOP/s; the cost is the deterministic backward's extra time over the default's")
    if len(sys.argv) < 3:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for row, d in enumerate((64, 128)):
        for col, pas in enumerate(("fwd", "bwd")):
            ax = axes[row][col]
            for impl in impls:
                for causal, style in ((0, "-"), (1, "--")):
                    pts = sorted((k[2], v[impl][col]) for k, v in rows.items()
                                 if k[0] == (d,) and k[1] == causal and impl in v)
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o",
                                label=f"{impl}{' causal' if causal else ''}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{pas}, head_dim {d}")
            ax.set_ylabel("TFLOP/s")
            ax.grid(True, alpha=0.3)
    axes[1][0].set_xlabel("sequence length")
    axes[1][1].set_xlabel("sequence length")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)


if __name__ == "__main__":
    main()
