"""Tests of model/reference/make_eval_tasks.py: the committed `cedar eval` task files are exactly
what the script writes, and every task is solvable with the real built-in tools from its own
state (files, seeded notes, fixed clock): replaying the generator's own transcript against the
task's state gives the generator's tool results (a directory listing may show files the generator
only added later in the session)."""

import json
import os
import tempfile
import unittest

import _paths  # noqa: F401  (sys.path)
import make_eval_tasks as M
from cedar_ref import data

CI = os.path.join(_paths.ROOT, "tests", "eval", "ci.jsonl")
HELDOUT = os.path.join(_paths.ROOT, "tests", "eval", "heldout.jsonl")
FIELDS = {"id", "family", "system", "tools", "files", "notes", "clock", "turns", "expect"}


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


class MakeEvalTasksTest(unittest.TestCase):
    def _regenerate(self, args):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "t.jsonl")
            self.assertEqual(M.main(args + ["--out", out]), 0)
            return _read(out)

    def test_committed_ci_set_is_reproducible(self):
        self.assertEqual(self._regenerate(["--per-family", "2", "--seed", "2002", "--recall-chars", "1500", "2500"]),
                         _read(CI))

    def test_committed_heldout_set_is_reproducible(self):
        self.assertEqual(self._regenerate(["--per-family", "50"]), _read(HELDOUT))

    def test_tasks_use_builtin_tools_and_known_fields(self):
        for path in (CI, HELDOUT):
            ids = set()
            for line in _read(path).splitlines():
                t = json.loads(line)
                self.assertLessEqual(set(t), FIELDS)
                self.assertNotIn(t["id"], ids)
                ids.add(t["id"])
                self.assertTrue(t["tools"])
                self.assertTrue(set(t["tools"]) <= set(data.BUILTIN_TOOLS), t["id"])
                self.assertTrue(t["turns"] and t["expect"])
                for p in t.get("files", {}):
                    self.assertFalse(p.startswith("/") or ".." in p.split("/"), p)

    def test_every_task_is_solvable_from_its_state(self):
        # The generator's transcript, replayed against the task's world, gives the same results:
        # the files, seeded notes and clock of the task are all its tools need.
        for fam in data.FAMILIES:
            for i in range(4):
                t = M.task_of(1001, i, "heldout", fam, (1500, 3000))
                if t is None:
                    continue
                s = data.make_sample(1001, i, "heldout", fam, (1500, 3000))
                world = {"files": dict(t.get("files", {})), "notes": dict(t.get("notes", {})), "now": t["clock"]}
                msgs = s["messages"]
                users = [m["content"] for m in msgs if m["role"] == "user"]
                self.assertEqual(users, t["turns"])
                for k, m in enumerate(msgs):
                    for c in m.get("tool_calls", []):
                        got, _ = data.run_tool(c["function"]["name"], c["function"]["arguments"], world)
                        want = next(x["content"] for x in msgs[k + 1:] if x.get("tool_call_id") == c["id"])
                        if c["function"]["name"] == "file_list":
                            # Files the generator adds mid-session exist from the start in a task:
                            # a listing may show more, never less.
                            self.assertLessEqual(set(want.split("\n")), set(got.split("\n")), t["id"])
                        else:
                            self.assertEqual(got, want, f"{t['id']}: {c['function']}")
                final = msgs[-1]["content"]
                self.assertIn(t["expect"], final, t["id"])


if __name__ == "__main__":
    unittest.main()
