"""Tests of model/reference/indexer_check.py on the shipped model: per index layer the share of
the all-entries teacher's mass on the selection and of its top entries, against a random
selection; the trained indexers beat random on every layer; bad input is a clear error."""

import contextlib
import io
import json
import os
import unittest

import _paths  # noqa: F401  (sys.path)
import indexer_check as C
from cedar_ref.config import ModelConfig

MODEL = os.path.join(_paths.ROOT, "model", "weights", "cedar-agent-tiny")


class IndexerCheckTest(unittest.TestCase):
    def test_layers_of_the_shipped_model(self):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = C.main(["--model", MODEL, "--n", "1", "--recall-chars", "1500", "1600", "--json"])
        self.assertEqual(rc, 0, err.getvalue())
        res = json.loads(out.getvalue())
        cfg = ModelConfig.from_json(os.path.join(MODEL, "config.json"))
        self.assertEqual(sorted(int(l) for l in res["layers"]), sorted(cfg.index_source_layer_ids))
        self.assertEqual(res["teacher_topk"], cfg.index_topk)
        for l, c in res["layers"].items():
            self.assertGreater(c["rows"], 0, l)
            for key in ("captured", "recall", "random", "oracle", "pool"):
                self.assertTrue(0.0 <= c[key] <= 1.0 + 1e-6, (l, key, c[key]))
            if c["mode"] != "reindex":  # no candidate pool: every visible entry is in it
                self.assertEqual(c["pool"], 1.0, l)
            # teacher top-k = k: no selection of k entries holds more than the teacher's own top k
            self.assertLessEqual(c["captured"], c["oracle"] + 1e-5, l)
            # a trained indexer holds more of what the attention wants than k random entries
            self.assertGreater(c["captured"], c["random"], l)
            self.assertGreater(c["recall"], c["random"], l)
        self.assertEqual(len(res["samples"]), 1)
        self.assertIn("[1/1] recall sample 0", err.getvalue())

    def test_bad_input_is_a_clear_error(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = C.main(["--model", os.path.join(_paths.ROOT, "no-such-model")])
        self.assertEqual(rc, 2)
        self.assertIn("no-such-model", err.getvalue())
        for args, word in ((["--n", "0"], "--n 0"), (["--recall-chars", "900", "100"], "--recall-chars 900 100"),
                           (["--teacher-topk", "-1"], "--teacher-topk -1")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as cm:
                C.main(["--model", MODEL] + args)
            self.assertEqual(cm.exception.code, 2)
            self.assertIn(word, err.getvalue())


if __name__ == "__main__":
    unittest.main()
