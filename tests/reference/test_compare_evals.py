"""compare_evals.py on real `cedar eval` outputs: the shipped model on the first tasks of
tests/eval/ci.jsonl, served (FP4 KV, bounded replay) and as the bf16 + exact-resume diagnostic."""

import io
import json
import os
import subprocess
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

from _paths import ROOT

import compare_evals

CEDAR = os.path.join(os.environ.get("CEDAR_BINARY_DIR") or os.path.join(ROOT, "build"), "bin", "cedar")
TASKS = os.path.join(ROOT, "tests", "eval", "ci.jsonl")
N = 6


def load_json(path):
    with open(path) as f:
        return json.load(f)


def run_eval(out_path, *extra):
    if not os.path.exists(CEDAR):
        raise AssertionError(f"{CEDAR} is not built (cmake --build build --target cedar)")
    with open(out_path, "w") as f:
        r = subprocess.run([CEDAR, "eval", TASKS, "--json", "--limit", str(N), *extra], stdout=f,
                           stderr=subprocess.PIPE, text=True, timeout=300,
                           env=dict(os.environ, CEDAR_THREADS="1"))
    if r.returncode != 0:
        raise AssertionError(f"cedar eval {' '.join(extra)} failed ({r.returncode}): {r.stderr[-2000:]}")


class CompareEvalsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.fp4 = os.path.join(d, "fp4.json")
        cls.bf16 = os.path.join(d, "bf16.json")
        cls.summary = os.path.join(d, "summary.json")
        cls.short = os.path.join(d, "short.json")
        run_eval(cls.fp4, "--details")
        run_eval(cls.bf16, "--details", "--kv", "bf16")
        run_eval(cls.summary)  # no --details: no per-task results

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_sign_test_p_values(self):
        self.assertEqual(compare_evals.sign_test_p(0, 0), 1.0)
        self.assertEqual(compare_evals.sign_test_p(17, 17), 1.0)
        self.assertAlmostEqual(compare_evals.sign_test_p(0, 6), 2 / 64)
        self.assertAlmostEqual(compare_evals.sign_test_p(10, 2), 2 * (1 + 12 + 66) / 4096)
        self.assertAlmostEqual(compare_evals.sign_test_p(2, 10), compare_evals.sign_test_p(10, 2))

    def test_counts_agree_with_the_eval_outputs(self):
        c = compare_evals.compare([("fp4", self.fp4), ("bf16", self.bf16)])
        docs = [load_json(p) for p in (self.fp4, self.bf16)]
        self.assertEqual(c["tasks"], N)
        self.assertEqual(c["base"], "fp4")
        base, other = c["models"]
        self.assertEqual(base["ok"], docs[0]["ok"])
        self.assertEqual(other["ok"], docs[1]["ok"])
        self.assertEqual(sum(base["families"].values()), base["ok"])
        self.assertEqual(other["gained"] - other["lost"], other["ok"] - base["ok"])
        ok0 = {r["id"]: r["ok"] for r in docs[0]["results"]}
        ok1 = {r["id"]: r["ok"] for r in docs[1]["results"]}
        self.assertEqual(other["gained_ids"], sorted(t for t in ok0 if ok1[t] and not ok0[t]))
        self.assertEqual(other["lost_ids"], sorted(t for t in ok0 if ok0[t] and not ok1[t]))
        self.assertEqual(other["p"], compare_evals.sign_test_p(other["gained"], other["lost"]))

    def test_a_model_against_itself_changes_nothing(self):
        c = compare_evals.compare([("a", self.fp4), ("b", self.fp4)])
        m = c["models"][1]
        self.assertEqual((m["gained"], m["lost"], m["p"]), (0, 0, 1.0))

    def test_cli_table_and_json(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(compare_evals.main([f"served={self.fp4}", f"exact={self.bf16}"]), 0)
        text = out.getvalue()
        self.assertIn(f"{N} tasks, task by task against served", text)
        self.assertIn("exact", text)
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(compare_evals.main([self.fp4, self.bf16, "--json"]), 0)
        j = json.loads(out.getvalue())
        self.assertEqual([m["label"] for m in j["models"]], ["fp4.json", "bf16.json"])

    def test_bad_inputs_name_the_file_and_the_fault(self):
        d = self.tmp.name
        truncated = os.path.join(d, "truncated.json")
        with open(self.fp4) as f, open(truncated, "w") as g:
            g.write(f.read()[:100])
        other_tasks = os.path.join(d, "other_tasks.json")
        doc = load_json(self.fp4)
        doc["results"] = doc["results"][1:]
        with open(other_tasks, "w") as g:
            json.dump(doc, g)
        def write(name, obj):
            path = os.path.join(d, name)
            with open(path, "w") as g:
                json.dump(obj, g)
            return path

        array = write("array.json", [doc])
        no_ok = write("no_ok.json", dict(doc, results=[{"id": "x"}]))
        twice = write("twice.json", dict(doc, results=doc["results"] + doc["results"][:1]))
        cases = [
            ([self.fp4, array], "array.json: not a cedar eval --json object"),
            ([self.fp4, no_ok], "no_ok.json: results[0] lacks a string 'id' and a boolean 'ok'"),
            ([self.fp4, twice], "twice.json: task id"),
            ([self.fp4, self.summary], "summary.json: no per-task results (run cedar eval with --json --details)"),
            ([self.fp4, truncated], "truncated.json: not a JSON document"),
            ([self.fp4, os.path.join(d, "absent.json")], "cannot read"),
            ([self.fp4, other_tasks], f"other_tasks.json: not the tasks of {self.fp4} (missing "),
            ([self.fp4], "give at least two eval outputs"),
            ([self.fp4, "=x.json"], "expected PATH or LABEL=PATH"),
        ]
        for args, want in cases:
            err = io.StringIO()
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                self.assertEqual(compare_evals.main(args), 2, args)
            self.assertIn(want, err.getvalue(), args)


if __name__ == "__main__":
    unittest.main()
