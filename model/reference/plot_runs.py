#!/usr/bin/env python3
"""Joins the train_log.json files of consecutive training runs (each continued from the last with
--init-from) into one history: a CSV (run, step, global step, stage, lr, LM loss, indexer KL) and
a loss-curve PNG with the run boundaries marked.

    /usr/bin/python3 model/reference/plot_runs.py --out-csv H.csv --out-png loss.png RUN1/train_log.json ...

The shipped model's history (model/weights/cedar-agent-tiny/train_history.csv) can be re-plotted
with --from-csv, and a new run appended to it:

    ... --from-csv H.csv --out-csv H.csv --out-png loss.png 8:RUN8/train_log.json
"""
import argparse
import csv
import json
import sys


def load_runs(paths, rows=None):
    """paths: train_log.json files, or RUN:PATH to number a run explicitly (a run whose log was
    not kept leaves a gap in the numbering). Appended after `rows` (a history already loaded)."""
    rows = list(rows or [])
    g = int(rows[-1]["global_step"]) if rows else 0
    run = int(rows[-1]["run"]) if rows else 0
    for p in paths:
        head, sep, tail = p.partition(":")
        run = int(head) if sep and head.isdigit() else run + 1
        with open(tail if sep and head.isdigit() else p) as f:
            hist = json.load(f)["history"]
        for h in hist:
            rows.append({"run": run, "step": h["step"], "global_step": g + h["step"], "stage": h["stage"],
                         "lr": f'{h["lr"]:.3g}', "lm": f'{h["lm"]:.5f}', "kl": f'{h["kl"]:.5f}'})
        g += len(hist)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="*", help="train_log.json files in training order (RUN:PATH numbers a run)")
    ap.add_argument("--from-csv", help="start from a history CSV written by this script (the logs are appended)")
    ap.add_argument("--out-csv")
    ap.add_argument("--out-png", required=True)
    ap.add_argument("--title", default="cedar-agent-tiny")
    a = ap.parse_args(argv)
    if not a.from_csv and not a.logs:
        ap.error("give train_log.json files or --from-csv")
    rows = []
    if a.from_csv:
        with open(a.from_csv) as f:
            rows = list(csv.DictReader(f))
    rows = load_runs(a.logs, rows)
    if a.out_csv:
        with open(a.out_csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [int(r["global_step"]) for r in rows]
    lm = [float(r["lm"]) for r in rows]
    kl = [max(float(r["kl"]), 1e-6) for r in rows]
    k = 25
    smooth = [sum(lm[max(0, i - k + 1):i + 1]) / len(lm[max(0, i - k + 1):i + 1]) for i in range(len(lm))]
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    ax.plot(xs, lm, color="#9ecae1", linewidth=0.6, label="LM loss (assistant tokens), per step")
    ax.plot(xs, smooth, color="#08519c", linewidth=1.6, label=f"LM loss, mean of {k} steps")
    ax.plot(xs, kl, color="#fd8d3c", linewidth=0.8, label="indexer KL")
    prev = None
    for r, x in zip(rows, xs):
        if prev is not None and r["run"] != prev:
            ax.axvline(x, color="gray", linestyle="--", linewidth=0.8)
        prev = r["run"]
    # shade stage C (FP4 KV + candidate pool + replay tails) of each run
    start = None
    for i, r in enumerate(rows):
        c = r["stage"] == "C"
        if c and start is None:
            start = xs[i]
        if start is not None and (not c or i == len(rows) - 1 or rows[i + 1]["run"] != r["run"]):
            ax.axvspan(start, xs[i], color="#fee6ce", alpha=0.5, linewidth=0)
            start = None
    ax.set_yscale("log")
    ax.set_xlabel("step (runs separated by dashed lines; stage C shaded)")
    ax.set_ylabel("loss")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out_png)
    print(f"plot_runs: {len(rows)} steps from {len(set(r['run'] for r in rows))} runs -> {a.out_png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
