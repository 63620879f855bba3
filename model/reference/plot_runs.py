#!/usr/bin/env python3
"""Joins the train_log.json files of consecutive training runs (each continued from the last with
--init-from) into one history: a CSV (run, step, global step, stage, lr, LM loss, indexer KL) and
a loss-curve PNG with the run boundaries marked.

    /usr/bin/python3 model/reference/plot_runs.py --out-csv H.csv --out-png loss.png RUN1/train_log.json ...

The shipped model's history (model/weights/cedar-agent-tiny/train_history.csv) can be re-plotted
with --from-csv.
"""
import argparse
import csv
import json
import sys


def load_runs(paths):
    rows, g = [], 0
    for run, p in enumerate(paths, 1):
        with open(p) as f:
            hist = json.load(f)["history"]
        for h in hist:
            rows.append({"run": run, "step": h["step"], "global_step": g + h["step"], "stage": h["stage"],
                         "lr": f'{h["lr"]:.3g}', "lm": f'{h["lm"]:.5f}', "kl": f'{h["kl"]:.5f}'})
        g += len(hist)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="*", help="train_log.json files in training order")
    ap.add_argument("--from-csv", help="re-plot a history CSV written by this script")
    ap.add_argument("--out-csv")
    ap.add_argument("--out-png", required=True)
    ap.add_argument("--title", default="cedar-agent-tiny")
    a = ap.parse_args(argv)
    if a.from_csv:
        with open(a.from_csv) as f:
            rows = list(csv.DictReader(f))
    elif a.logs:
        rows = load_runs(a.logs)
    else:
        ap.error("give train_log.json files or --from-csv")
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
        if r["stage"] == "C" and (prev is None or r["run"] != prev or True):
            pass
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
