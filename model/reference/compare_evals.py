#!/usr/bin/python3
"""Compare `cedar eval --json --details` results of several models on one task file, task by task.

Successes per family say how many tasks each model solves; they do not say whether a difference
is more than the churn between two nearby weights (a fine-tune that gains 17 tasks and loses 17
shows the same total). This prints, for every model after the first (the base), the tasks it
gained and lost against the base and the exact two-sided sign-test p-value of that split
(McNemar's test on the discordant tasks): a small p means the change is unlikely to be churn.

  build/bin/cedar eval tests/eval/heldout.jsonl --json --details --model A > a.json
  build/bin/cedar eval tests/eval/heldout.jsonl --json --details --model B > b.json
  /usr/bin/python3 model/reference/compare_evals.py shipped=a.json run31=b.json [--json]

Each argument is PATH or LABEL=PATH (the label defaults to the file name). Every file must hold
the per-task results (`--details`) of the same tasks (the same ids); anything else is an error
that names the file and what is wrong, with exit status 2. Stdlib only.
"""

import argparse
import json
import math
import os
import sys
from typing import Dict, List, Tuple


class CompareError(ValueError):
    pass


def sign_test_p(gained: int, lost: int) -> float:
    """Exact two-sided binomial test of gained vs lost discordant tasks under p = 1/2."""
    n = gained + lost
    if n == 0:
        return 1.0
    k = min(gained, lost)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def load_results(path: str) -> Tuple[Dict[str, bool], Dict[str, str], dict]:
    """(ok by task id, family by task id, the summary object) of one eval output."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise CompareError(f"cannot read {path}: {e.strerror or e}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CompareError(f"{path}: not a JSON document ({e})")
    if not isinstance(doc, dict):
        raise CompareError(f"{path}: not a cedar eval --json object")
    results = doc.get("results")
    if not isinstance(results, list):
        raise CompareError(f"{path}: no per-task results (run cedar eval with --json --details)")
    ok: Dict[str, bool] = {}
    family: Dict[str, str] = {}
    for i, r in enumerate(results):
        if not isinstance(r, dict) or not isinstance(r.get("id"), str) or not isinstance(r.get("ok"), bool):
            raise CompareError(f"{path}: results[{i}] lacks a string 'id' and a boolean 'ok'")
        if r["id"] in ok:
            raise CompareError(f"{path}: task id {r['id']!r} appears twice")
        ok[r["id"]] = r["ok"]
        family[r["id"]] = r.get("family") if isinstance(r.get("family"), str) else ""
    if not ok:
        raise CompareError(f"{path}: no tasks")
    return ok, family, doc


def _id_list(ids, limit=5) -> str:
    ids = sorted(ids)
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def compare(named: List[Tuple[str, str]]) -> dict:
    """named: (label, path), the base first. Returns the comparison as a JSON-ready dict."""
    if len(named) < 2:
        raise CompareError("give at least two eval outputs: the base, then the models to compare")
    loaded = [(label, path) + load_results(path) for label, path in named]
    _, base_path, base_ok, base_family, _ = loaded[0]
    ids = set(base_ok)
    families = sorted({f for f in base_family.values() if f})
    models = []
    for label, path, ok, family, doc in loaded:
        if set(ok) != ids:
            missing, extra = ids - set(ok), set(ok) - ids
            parts = []
            if missing:
                parts.append(f"missing {_id_list(missing)}")
            if extra:
                parts.append(f"extra {_id_list(extra)}")
            raise CompareError(f"{path}: not the tasks of {base_path} ({'; '.join(parts)})")
        m = {
            "label": label,
            "file": path,
            "ok": sum(ok.values()),
            "families": {f: sum(1 for t in ids if base_family[t] == f and ok[t]) for f in families},
            "valid_tool_call_rate": doc.get("valid_tool_call_rate"),
        }
        if models:
            gained = sorted(t for t in ids if ok[t] and not base_ok[t])
            lost = sorted(t for t in ids if base_ok[t] and not ok[t])
            m.update(gained=len(gained), lost=len(lost), p=sign_test_p(len(gained), len(lost)),
                     gained_ids=gained, lost_ids=lost)
        models.append(m)
    return {"tasks": len(ids), "families": families, "base": models[0]["label"], "models": models}


def render(c: dict) -> str:
    fam = c["families"]
    head = ["model", "all"] + fam + ["valid calls", f"vs {c['base']}: gained", "lost", "p"]
    rows = []
    for m in c["models"]:
        v = m["valid_tool_call_rate"]
        row = [m["label"], str(m["ok"])] + [str(m["families"][f]) for f in fam]
        row.append(f"{100.0 * v:.2f}%" if isinstance(v, (int, float)) else "-")
        if "gained" in m:
            row += [str(m["gained"]), str(m["lost"]), f"{m['p']:.3g}"]
        else:
            row += ["(base)", "", ""]
        rows.append(row)
    width = [max(len(r[k]) for r in [head] + rows) for k in range(len(head))]
    lines = [f"{c['tasks']} tasks, task by task against {c['base']} (p: exact two-sided sign test)"]
    for r in [head] + rows:
        lines.append("  ".join(x.rjust(w) if k else x.ljust(w) for k, (x, w) in enumerate(zip(r, width))))
    return "\n".join(lines)


def parse_named(args: List[str]) -> List[Tuple[str, str]]:
    out = []
    for a in args:
        label, sep, path = a.partition("=")
        if not sep:
            label, path = os.path.basename(a), a
        if not label or not path:
            raise CompareError(f"argument {a!r}: expected PATH or LABEL=PATH")
        out.append((label, path))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evals", nargs="+", metavar="[LABEL=]PATH",
                    help="cedar eval --json --details outputs; the first is the base")
    ap.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    args = ap.parse_args(argv)
    try:
        c = compare(parse_named(args.evals))
    except CompareError as e:
        print(f"compare_evals: {e}", file=sys.stderr)
        return 2
    print(json.dumps(c, indent=1) if args.json else render(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
