"""Tests of model/reference/stage_ablation.py on the shipped model: every setting is measured on the
same samples, a pool that holds every entry equals no pool at all (the shipped config's 2,048
candidates cover these short samples), and a bad model directory, a truncated checkpoint or a bad --pools list is a clear error, not
a trace."""

import contextlib
import io
import json
import os
import shutil
import tempfile
import unittest

import _paths  # noqa: F401  (sys.path)
import stage_ablation as A

MODEL = os.path.join(_paths.ROOT, "model", "weights", "cedar-agent-tiny")


class StageAblationTest(unittest.TestCase):
    def test_rows_on_the_shipped_model(self):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = A.main(["--model", MODEL, "--n", "4", "--max-len", "1400", "--pools", "4,128", "--json"])
        self.assertEqual(rc, 0, err.getvalue())
        res = json.loads(out.getvalue())
        self.assertGreater(res["samples"], 0)
        rows = {r["setting"]: r for r in res["rows"]}
        self.assertEqual(list(rows), ["B", "C", "C without pool", "C without FP4 KV", "C without FP4 index",
                                      "B with pool", "C, pool 4 blocks", "C, pool 128 blocks"])
        for r in rows.values():
            self.assertTrue(0.0 < r["loss"] < 20.0, r)
            self.assertTrue(r["families"], r)
        # <= 1400 tokens: 128 blocks x 16 entries hold every decoder entry, so the pool selects all
        self.assertEqual(rows["C, pool 128 blocks"]["loss"], rows["C without pool"]["loss"])
        self.assertEqual(rows["C"]["loss"], rows["C, pool 128 blocks"]["loss"])  # the shipped config: 128
        self.assertIn("train samples", err.getvalue())

    def test_missing_model_is_a_clear_error(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = A.main(["--model", os.path.join(_paths.ROOT, "no-such-model")])
        self.assertEqual(rc, 2)
        self.assertIn("no-such-model", err.getvalue())
        self.assertIn("config.json", err.getvalue())

    def test_truncated_checkpoint_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            for f in ("config.json", "tokenizer.json"):
                shutil.copy(os.path.join(MODEL, f), d)
            with open(os.path.join(MODEL, "model.safetensors"), "rb") as f:
                head = f.read(1000)
            with open(os.path.join(d, "model.safetensors"), "wb") as f:
                f.write(head)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = A.main(["--model", d])
            self.assertEqual(rc, 2)
            self.assertIn("model.safetensors", err.getvalue())

    def test_bad_pool_list_is_a_usage_error(self):
        for bad, why in (("abc", "not a comma-separated list"), ("8,0", "at least 1")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as cm:
                A.main(["--model", MODEL, "--pools", bad])
            self.assertEqual(cm.exception.code, 2)
            self.assertIn(why, err.getvalue())


if __name__ == "__main__":
    unittest.main()
