"""Tests of model/reference/make_eval_tasks.py: the committed `cedar eval` task files are exactly
what the script writes, and every task is solvable with the real built-in tools from its own
state (files, seeded notes, fixed clock): replaying the generator's own transcript against the
task's state gives the generator's tool results (a directory listing may show files the generator
only added later in the session), and `expect` finds the generator's own final answer but never a
value inside a longer token (a bare "1" must not pass for "1274")."""

import json
import os
import re
import tempfile
import unittest

import _paths  # noqa: F401  (sys.path)
import make_eval_tasks as M
from cedar_ref import data

CI = os.path.join(_paths.ROOT, "tests", "eval", "ci.jsonl")
HELDOUT = os.path.join(_paths.ROOT, "tests", "eval", "heldout.jsonl")
RECALL8K = os.path.join(_paths.ROOT, "tests", "eval", "recall8k.jsonl")
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

    def test_committed_recall8k_set_is_reproducible(self):
        self.assertEqual(self._regenerate(["--family", "recall", "--per-family", "20", "--seed", "3004",
                                           "--recall-chars", "32000", "38000"]), _read(RECALL8K))

    def test_tasks_use_builtin_tools_and_known_fields(self):
        for path in (CI, HELDOUT, RECALL8K):
            ids = set()
            for line in _read(path).splitlines():
                t = json.loads(line)
                self.assertLessEqual(set(t), FIELDS)
                self.assertNotIn(t["id"], ids)
                ids.add(t["id"])
                self.assertTrue(t["tools"])
                self.assertTrue(set(t["tools"]) <= set(data.BUILTIN_TOOLS), t["id"])
                self.assertTrue(t["turns"])
                self.assertEqual(set(t["expect"]), {"regex"}, t["id"])
                self.assertLessEqual(len(t["expect"]["regex"]), 512, t["id"])  # the reader's bound
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
                self.assertEqual(t["expect"], M.expect_of(str(s["expect"])), t["id"])
                self.assertRegex(final, t["expect"]["regex"], t["id"])

    def test_python_evaluator_judges_as_the_task_files(self):
        """train_eval.answer_ok (the trainer's generation eval) uses the task files' expects."""
        from cedar_ref import train_eval
        for value, answer, want in [("1", "It is 1274.", False), ("1", "It is 1.", True),
                                    ("1234", "= 1,234", True), ("1", "-1", False), ("1", "1.5", False),
                                    ("HH-4035", "token HH-4035.", True), ("vamna", "vamnas", False)]:
            self.assertEqual(train_eval.answer_ok(answer, value), want, (value, answer))
            self.assertEqual(train_eval.answer_ok(answer, value),
                             re.search(M.expect_of(value)["regex"], answer) is not None)

    def test_expect_finds_whole_numbers_only(self):
        def ok(value, answer):
            return re.search(M.expect_of(value)["regex"], answer) is not None

        for answer in ["1", "The value is 1.", "= 1", "(1)", "1, then 2", "it is 1\n"]:
            self.assertTrue(ok("1", answer), answer)
        for answer in ["1274", "21", "0.1", "1.5", "-1", "HH-1", "1,234", "5,1", "2028-01-17", "1k", "x1"]:
            self.assertFalse(ok("1", answer), answer)
        # four digits or more: also with thousands separators, all groups or none
        for answer in ["1234", "1,234", "total = 1234.", "is 1,234, as", "(1,234)"]:
            self.assertTrue(ok("1234", answer), answer)
        for answer in ["11234", "12345", "1,2345", "12,345", "1234.5", "1,234.5", "1234,567", "-1234", "HH-1234"]:
            self.assertFalse(ok("1234", answer), answer)
        self.assertTrue(ok("1083964154", "1,083,964,154"))
        self.assertFalse(ok("1083964154", "1,083964,154"))
        self.assertTrue(ok("-794", "x = -794."))
        self.assertFalse(ok("-794", "x = 794"))
        self.assertFalse(ok("-794", "5-794"))
        self.assertTrue(ok("12.5", "12.5 kg"))
        self.assertFalse(ok("12.5", "12.55"))
        self.assertFalse(ok("12.5", "112.5"))
        self.assertFalse(ok("2", "2.5"))  # data.format_number writes integers exactly

    def test_expect_finds_whole_codes_and_words_only(self):
        def ok(value, answer):
            return re.search(M.expect_of(value)["regex"], answer) is not None

        self.assertTrue(ok("HH-4035", "The code is HH-4035."))
        for answer in ["HH-40351", "XHH-4035", "HH-4035.5", "HH-40"]:
            self.assertFalse(ok("HH-4035", answer), answer)
        self.assertTrue(ok("vamna", "It was vamna, I think."))
        self.assertFalse(ok("vamna", "vamnas"))
        self.assertFalse(ok("emma", "Gemma"))
        self.assertFalse(ok("kenji", "Kenji"))  # case-sensitive, as a plain expect always was
        self.assertTrue(ok("howekgrait.conf", "see howekgrait.conf."))
        self.assertFalse(ok("howekgrait.conf", "howekgraitxconf"))  # the '.' is literal
        self.assertTrue(ok("limit = 130", "limit = 130\n"))
        self.assertFalse(ok("limit = 130", "limit = 1300"))
        self.assertTrue(ok("2029-11-17 10:21", "2029-11-17 10:21 (Saturday)"))
        # only ECMAScript syntax characters are escaped (std::regex and Python's re read it alike)
        self.assertEqual(M.expect_of("a (b) = c+d")["regex"], "(?:^|[^A-Za-z0-9])a \\(b\\) = c\\+d(?![A-Za-z0-9])")


if __name__ == "__main__":
    unittest.main()
