"""Tests of the trainer (cedar_ref/train_core.py) on a micro config keeping every layer mode:
a few steps reduce the loss, the gradient audit of TRAINING_NOTES §0, the bounded-replay tail
equals the reference's CED prefill, the bf16 export loads back, the PNG writer, data-parallel
steps over two gloo ranks equal one process averaging the two ranks' gradients."""

import json
import os
import random
import tempfile
import unittest

import numpy as np
import torch

import _paths  # noqa: F401
from cedar_ref import train_core as TC
from cedar_ref.config import ModelConfig
from cedar_ref.engram import engram_primes
from cedar_ref.model import QuantFlags, load_model

VOCAB = 97


def micro_cfg():
    with open(os.path.join(_paths.ROOT, "config", "cedar-agent-tiny.json")) as f:
        c = json.load(f)
    t = c["text_config"]
    t.update(vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=16, head_dim=32,
             qk_rope_head_dim=8, q_lora_rank=16, o_lora_rank=8, o_groups=2,
             num_attention_heads=2, sliding_window=8, index_n_heads=2, index_head_dim=32,
             index_topk=4, candidate_topk_blocks=2, candidate_block_size=4,
             engram_vocab_size=31, engram_head_dim=32, engram_compressed_vocab_size=VOCAB)
    cfg = ModelConfig.from_dict(c)
    t["engram_num_embeddings"] = [sum(p for per in l for p in per) for l in engram_primes(cfg)]
    return c


def batch(B=2, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.uint8)
    mask[:, T // 2:] = 1  # "assistant" half
    lens = torch.tensor([T - 8 * (b % 2) for b in range(B)])
    starts = torch.full((B,), T // 2)
    for b in range(B):
        mask[b, int(lens[b]):] = 0
    return ids, mask, lens, starts


def _dp_rank(rank, world, conf, port, out_dir):
    """One data-parallel rank (gloo on the CPU): two stage-B steps on its own batch."""
    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    m = TC.build_model(ModelConfig.from_dict(conf), 0)
    opt = torch.optim.AdamW(TC.param_groups(m, 3e-3), lr=3e-3, betas=(0.9, 0.95))
    tr = TC.MoETracker(m)
    base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
    TC.apply_stage(m, "B", base)
    dp = TC.DataParallel(rank, world, torch.device("cpu"))
    for step in range(2):
        out = TC.train_step(m, opt, tr, batch(seed=10 * step + rank), "B", 1e-3,
                            rng=random.Random(rank), parallel=dp)
        assert out is not None
    torch.save({k: v.clone() for k, v in m.state_dict().items()}, os.path.join(out_dir, f"r{rank}.pt"))
    dist.destroy_process_group()


class TrainTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.conf = micro_cfg()
        cls.cfg = lambda self=None: ModelConfig.from_dict(cls.conf)

    def fresh(self, seed=0):
        m = TC.build_model(ModelConfig.from_dict(self.conf), seed)
        opt = torch.optim.AdamW(TC.param_groups(m, 3e-3), lr=3e-3, betas=(0.9, 0.95))
        for g in opt.param_groups:
            g["lr"] = 3e-3 * g["lr_mult"]
        return m, opt, TC.MoETracker(m)

    def test_layer_modes_of_the_shipped_config(self):
        cfg = ModelConfig.from_json(os.path.join(_paths.ROOT, "config", "cedar-agent-tiny.json"))
        modes = [cfg.layer_mode(l) for l in range(cfg.num_hidden_layers)]
        self.assertEqual(set(modes), {"swa", "full", "reuse", "reindex"})
        fd = cfg.first_decoder_layer
        self.assertEqual({cfg.compress_ratios[l] for l in range(fd)} - {0}, {2})
        self.assertEqual({cfg.compress_ratios[l] for l in range(fd, cfg.num_hidden_layers)}, {1})
        self.assertTrue(any(cfg.layer_mode(l) == "reindex" for l in range(fd, cfg.num_hidden_layers)))
        self.assertTrue(all(l < fd for l in cfg.engram_layer_ids))
        self.assertIn("swa", [cfg.layer_mode(l) for l in cfg.engram_layer_ids])
        self.assertGreaterEqual(cfg.candidate_source_layer_id, fd)
        self.assertEqual(cfg.hc_mult, 4)
        self.assertEqual(cfg.n_shared_experts, 1)

    def test_steps_reduce_loss_in_every_stage(self):
        m, opt, tr = self.fresh()
        base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
        b = batch()
        rng = random.Random(0)
        losses = []
        for step, stage in enumerate(["A"] * 4 + ["B"] * 4 + ["C"] * 4):
            TC.apply_stage(m, stage, base)
            out = TC.train_step(m, opt, tr, b, stage, 1e-3, replay_rows=2, rng=rng)
            self.assertTrue(np.isfinite(out.loss))
            losses.append(out.lm)
            if stage == "C":
                self.assertTrue(m.quant.fp4_kv and m.quant.fp4_index_q)
        self.assertLess(losses[-1], losses[0] - 0.2)
        self.assertGreater(out.kl, 0.0)

    def test_quant_distill_pulls_the_quantised_forward_toward_the_unquantised(self):
        base = {"index_topk": 4, "candidate_topk_blocks": 2}
        b = batch(B=2, T=48, seed=3)
        ids, mask = b[0], b[1]
        m, opt, tr = self.fresh(seed=5)
        TC.apply_stage(m, "C", base)
        # the teacher: the stage-C model's forward with every cache part unquantised, flags kept
        teacher = TC.unquantised_logits(m, ids)
        self.assertTrue(m.quant.fp8_swa and m.quant.fp4_kv and m.quant.fp4_index_k and m.quant.fp4_index_q)
        saved = m.quant
        m.quant = QuantFlags.off()
        try:
            with torch.no_grad():
                plain, _, _, _ = TC.full_forward(m, ids, None)
        finally:
            m.quant = saved
        self.assertTrue(torch.equal(teacher, plain))
        with torch.no_grad():
            quant, _, _, _ = TC.full_forward(m, ids, None)
        self.assertGreater(float((quant - teacher).abs().max()), 1e-4)
        # the loss: KL(teacher || student) over the assistant targets, 0 against itself
        gap = TC.quant_gap_kl(quant, teacher, mask)
        sel = mask[:, 1:] > 0
        lt = torch.log_softmax(teacher[:, :-1][sel], -1)
        ls = torch.log_softmax(quant[:, :-1][sel], -1)
        manual = float((lt.exp() * (lt - ls)).sum(-1).mean())
        self.assertGreater(manual, 0.0)
        self.assertAlmostEqual(float(gap), manual, places=5)
        self.assertEqual(float(TC.quant_gap_kl(teacher, teacher, mask)), 0.0)
        self.assertEqual(float(TC.quant_gap_kl(quant, teacher, torch.zeros_like(mask))), 0.0)
        # a step logs the gap it trained on; stage B and W = 0 leave it out
        out = TC.train_step(m, opt, tr, b, "C", 1e-3, rng=random.Random(0), quant_distill=1.0)
        self.assertAlmostEqual(out.quant_gap, manual, places=4)
        self.assertEqual(TC.train_step(m, opt, tr, b, "C", 1e-3, rng=random.Random(0)).quant_gap, 0.0)
        TC.apply_stage(m, "B", base)
        self.assertEqual(TC.train_step(m, opt, tr, b, "B", 1e-3, rng=random.Random(0),
                                       quant_distill=1.0).quant_gap, 0.0)

        # the same steps from the same weights with and without the term: it closes the gap
        def gap_after(w):
            m, opt, tr = self.fresh(seed=5)
            TC.apply_stage(m, "C", base)
            for _ in range(8):
                TC.train_step(m, opt, tr, b, "C", 1e-3, rng=random.Random(0), quant_distill=w)
            with torch.no_grad():
                q, _, _, _ = TC.full_forward(m, ids, None)
            return float(TC.quant_gap_kl(q, TC.unquantised_logits(m, ids), mask))
        # the micro model's gap is ~1e-6 nats: W must outweigh its LM term to show the direction
        without, with_ = gap_after(0.0), gap_after(1e5)
        self.assertLess(with_, 0.5 * without, (with_, without))

    def test_sparse_training_path_computes_the_dense_function(self):
        """model.sparse_train (banded window, gathered top-k entries, selection under no_grad)
        gives the dense path's logits, LM loss, indexer KL and gradients, in stage B and C, for
        the full forward and the bounded-replay tail."""
        for stage in ("B", "C"):
            m, _, _ = self.fresh(3)
            base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
            ids, mask, lens, starts = batch(2, 40, seed=5)
            valid = torch.arange(ids.shape[1])[None] < lens[:, None]
            W = m.cfg.sliding_window
            out = {}
            for sparse in (False, True):
                TC.apply_stage(m, stage, base, sparse=sparse)
                self.assertEqual(m.sparse_train, sparse)
                m.zero_grad(set_to_none=True)
                trace = {"compressed_probs": {}}
                logits, state, Xd, pred = TC.full_forward(m, ids, trace)
                lm, _ = TC.lm_loss(logits, ids, mask)
                kl, _ = TC.indexer_kl(trace, valid)
                tail = TC.replay_tail(m, state, Xd, pred, 1, int(starts[1]) - W, int(lens[1]))
                (lm + kl + tail.square().mean() * 1e-3).backward()
                grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
                out[sparse] = (logits.detach(), float(kl), tail.detach(), grads)
            (l0, kl0, t0, g0), (l1, kl1, t1, g1) = out[False], out[True]
            self.assertGreater(kl0, 0.0)
            torch.testing.assert_close(l1, l0, rtol=1e-4, atol=1e-4, msg=f"stage {stage} logits")
            torch.testing.assert_close(t1, t0, rtol=1e-4, atol=1e-4, msg=f"stage {stage} replay tail")
            self.assertAlmostEqual(kl1, kl0, places=4, msg=f"stage {stage} indexer KL")
            self.assertEqual(set(g1), set(g0))
            for n in g0:
                torch.testing.assert_close(g1[n], g0[n], rtol=1e-3, atol=1e-5, msg=f"stage {stage} grad {n}")

    def test_kl_teacher_over_all_visible_entries(self):
        """model.kl_teacher_topk widens the indexer-KL support from the selection to the
        selection ∪ the teacher's top entries, the teacher being this layer's attention over
        EVERY visible entry: (1) on layer 2 (its input does not depend on any selection) with the
        widest support the KL equals the dense KL of a forward that selects every entry; (2) the
        sparse path gives the dense path's KL and indexer gradients, in stage B and C; (3) the
        support holds entries the selection missed, and the KL reaches only indexer parameters."""
        BIG = 1 << 30
        m, _, _ = self.fresh(4)
        base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
        ids, mask, lens, starts = batch(2, 40, seed=6)
        valid = torch.arange(ids.shape[1])[None] < lens[:, None]

        def run(stage, sparse, kt):
            TC.apply_stage(m, stage, base, sparse=sparse)
            m.kl_teacher_topk = kt
            m.zero_grad(set_to_none=True)
            trace = {"compressed_probs": {}}
            TC.full_forward(m, ids, trace)
            kl, stats = TC.indexer_kl(trace, valid)
            return kl, stats, trace

        # (1) every entry selected (stage A's config, dense) vs the teacher's widest support
        _, stats_all, _ = run("A", False, 0)
        for sparse in (False, True):
            _, stats_t, _ = run("B", sparse, BIG)
            self.assertGreater(stats_all[2], 0.0)
            self.assertAlmostEqual(stats_t[2], stats_all[2], places=5, msg=f"sparse {sparse}")
        _, stats_sel, _ = run("B", True, 0)
        self.assertGreater(abs(stats_sel[2] - stats_all[2]), 0.05 * stats_all[2])  # selection alone: another KL

        named = dict(m.named_parameters())
        idx_params = [p for n, p in named.items() if TC.is_indexer(n)]
        for stage in ("B", "C"):
            out = {}
            for sparse in (False, True):
                kl, stats, trace = run(stage, sparse, 3)
                kl.backward(inputs=idx_params)
                out[sparse] = (float(kl), {n: p.grad.clone() for n, p in named.items()
                                           if TC.is_indexer(n) and p.grad is not None}, trace)
            (kl0, g0, tr0), (kl1, g1, tr1) = out[False], out[True]
            self.assertGreater(kl0, 0.0)
            self.assertAlmostEqual(kl1, kl0, places=4, msg=f"stage {stage} KL")  # (2)
            self.assertEqual(set(g1), set(g0))
            self.assertTrue(g0)
            for n in g0:
                torch.testing.assert_close(g1[n], g0[n], rtol=1e-3, atol=1e-6, msg=f"stage {stage} grad {n}")
            # (3) entries outside the selection in the support, on some layer and row
            wider = [int((tr0["kl_support"][l] & ~tr0["topk"][l]).sum()) for l in tr0["kl_support"]]
            self.assertGreater(sum(wider), 0, stage)
            for l in tr1["kl_support"]:  # the sparse support: selection first, then new entries
                k = tr1["topk_idx"][l].shape[-1]
                self.assertTrue(torch.equal(tr1["kl_support"][l][..., :k], tr1["topk_valid"][l]))
        # the indexer check (TRAINING_NOTES §1): all of the teacher's mass when every entry is
        # selected; the same figures on both paths; within [0, 1] and below 1 with a selection
        _, _, tr_all = run("A", False, 3)
        chk = TC.teacher_check(tr_all, valid, BIG)
        self.assertTrue(chk)
        for l, c in chk.items():
            self.assertAlmostEqual(c["captured"], 1.0, places=5)
            self.assertAlmostEqual(c["recall"], 1.0, places=5)
            self.assertAlmostEqual(c["random"], 1.0, places=5)
            self.assertGreater(c["oracle"], 0.0)  # the teacher's top 3 entries of many
        k = m.cfg.index_topk
        checks = [TC.teacher_check(run("B", sparse, 3)[2], valid, k) for sparse in (False, True)]
        self.assertEqual(set(checks[0]), set(checks[1]))
        for l in checks[0]:
            for key in ("captured", "recall", "random", "oracle"):
                self.assertAlmostEqual(checks[0][l][key], checks[1][l][key], places=5, msg=f"{l} {key}")
            self.assertEqual(checks[0][l]["rows"], checks[1][l]["rows"])
            self.assertTrue(0.0 < checks[0][l]["captured"] <= 1.0 + 1e-6)
            self.assertTrue(0.0 <= checks[0][l]["random"] <= 1.0)
        self.assertTrue(any(c["captured"] < 0.999 for c in checks[0].values()))
        # the pool's share of the unrestricted attention (pool_check; stage C, the first with a
        # candidate pool): 1 on layers without a pool; on the Reindex layers within [0, 1] and
        # below 1 somewhere (a pool of a few blocks at 40 tokens); the same on both paths;
        # without pool_check not reported there
        self.assertLess(base["candidate_topk_blocks"] * m.cfg.candidate_block_size, 40)
        checks = [TC.teacher_check(run("C", False, 3)[2], valid, k)]
        m.pool_check = True
        pools = [TC.teacher_check(run("C", sparse, 3)[2], valid, k) for sparse in (False, True)]
        m.pool_check = False
        reindex = [l for l in pools[0] if m.cfg.layer_mode(l) == "reindex"]
        self.assertTrue(reindex)
        for l, c in pools[0].items():
            if l in reindex:
                self.assertTrue(0.0 <= c["pool"] <= 1.0 + 1e-6, (l, c["pool"]))
                self.assertNotIn("pool", checks[0][l])
            else:
                self.assertEqual(c["pool"], 1.0, l)
            self.assertAlmostEqual(c["pool"], pools[1][l]["pool"], places=5, msg=f"{l} pool")
        self.assertTrue(any(pools[0][l]["pool"] < 0.999 for l in reindex))

        # one train_step from the same weights with and without the teacher: the backbone takes
        # the same update (the teacher only changes the KL, which reaches only the indexer)
        after = {}
        for kt in (0, 3):
            m, opt, tr = self.fresh(4)
            TC.apply_stage(m, "B", base)
            m.kl_teacher_topk = kt
            TC.train_step(m, opt, tr, (ids, mask, lens, starts), "B", 1e-3, rng=random.Random(0))
            after[kt] = {n: p.detach().clone() for n, p in m.named_parameters()}
        moved = [n for n in after[0] if TC.is_indexer(n) and not torch.equal(after[0][n], after[3][n])]
        self.assertTrue(moved)
        for n in after[0]:
            if not TC.is_indexer(n):
                self.assertTrue(torch.equal(after[0][n], after[3][n]), n)

    def test_indexer_only_moves_the_indexers_alone(self):
        """train.py --indexer-only: after freeze_all_but_indexers a train_step (stage B and C,
        the teacher on, router biases not updated) leaves every other parameter and buffer
        bit-identical and moves the indexers; the LM loss is still computed and reported."""
        base = None
        for stage in ("B", "C"):
            m, _, tr = self.fresh(5)
            base = base or {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
            n_train, n_frozen = TC.freeze_all_but_indexers(m)
            self.assertGreater(n_train, 0)
            self.assertGreater(n_frozen, n_train)
            opt = torch.optim.AdamW(TC.param_groups(m, 3e-3), lr=3e-3, betas=(0.9, 0.95))
            self.assertEqual([g["name"] for g in opt.param_groups if g["params"]], ["indexer"])
            TC.apply_stage(m, stage, base)
            m.kl_teacher_topk = 3
            before = {n: t.detach().clone() for n, t in list(m.named_parameters()) + list(m.named_buffers())}
            out = TC.train_step(m, opt, tr, batch(2, 40, seed=8), stage, 1e-3, rng=random.Random(0),
                                replay_rows=1, update_bias=False)
            self.assertGreater(out.lm, 0.0)
            self.assertGreater(out.kl, 0.0)
            moved = [n for n, p in m.named_parameters() if not torch.equal(p, before[n])]
            self.assertTrue(moved, stage)
            self.assertTrue(all(TC.is_indexer(n) for n in moved), moved)
            for n, b in m.named_buffers():
                self.assertTrue(torch.equal(b, before[n]), f"{stage} buffer {n}")

    def test_fast_topk_breaks_ties_like_the_stable_sort(self):
        from cedar_ref.model import fast_topk_indices, stable_topk_indices
        g = torch.Generator().manual_seed(4)
        x = torch.randint(-3, 4, (6, 50, 97), generator=g).float() * 0.5   # many exact ties
        x[x == 0.5] = -0.0
        x[:, :, ::7] = float("-inf")
        x[0, 0, 3] = float("inf")
        x[1] = torch.randn(50, 97, generator=g) * 1e-30                     # subnormal range
        for k in (1, 4, 64, 97):
            self.assertTrue(torch.equal(fast_topk_indices(x, k), stable_topk_indices(x, k)), k)

    def test_gradient_audit(self):
        m, opt, tr = self.fresh(1)
        base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
        TC.apply_stage(m, "B", base)
        b = batch()
        bias0 = [blk.ffn.gate.bias.clone() for blk in m.layers]
        TC.train_step(m, opt, tr, b, "B", 1e-3, rng=random.Random(0))  # one step off the init
        ids, mask, lens, starts = b
        trace = {"compressed_probs": {}}
        logits, *_ = TC.full_forward(m, ids, trace)
        lm, _ = TC.lm_loss(logits, ids, mask)
        valid = torch.arange(ids.shape[1])[None] < lens[:, None]
        kl, _ = TC.indexer_kl(trace, valid)
        named = dict(m.named_parameters())
        m.zero_grad(set_to_none=True)
        lm.backward(retain_graph=True)
        for n, p in named.items():
            if TC.is_indexer(n) or not TC.trainable(n):
                self.assertTrue(p.grad is None or float(p.grad.abs().max()) == 0.0, n)
            else:
                self.assertIsNotNone(p.grad, n)
                self.assertTrue(bool(torch.isfinite(p.grad).all()), n)
                self.assertGreater(float(p.grad.abs().max()), 0.0, n)
        m.zero_grad(set_to_none=True)
        idx = [p for n, p in named.items() if TC.is_indexer(n)]
        kl.backward(inputs=idx)
        for n, p in named.items():
            if TC.is_indexer(n):
                self.assertIsNotNone(p.grad, n)
                self.assertGreater(float(p.grad.abs().max()), 0.0, n)
            else:
                self.assertIsNone(p.grad, n)
        # the router bias moves only by the sign rule, outside autograd
        self.assertFalse(any(blk.ffn.gate.bias.requires_grad for blk in m.layers))
        self.assertTrue(any(float((blk.ffn.gate.bias - b0).abs().max()) > 0
                            for blk, b0 in zip(m.layers, bias0)))

    def test_replay_tail_matches_ced_prefill(self):
        m, _, _ = self.fresh(2)
        base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
        TC.serving_mode(m, base, quant=True)
        m.eval()
        ids, *_ = batch(1, 36)
        W = m.cfg.sliding_window
        P = 30
        with torch.no_grad():
            full, state, Xd, pred = TC.full_forward(m, ids[:, :P], None)
            tail = TC.replay_tail(m, state, Xd, pred, 0, P - W, P)
            st = m.new_state(1)
            ced = m.prefill_ced(ids[:, :P], st)
            self.assertLess(float((tail - ced).abs().max()), 1e-4)
            # no truncation (start 0): the tail pass is the full pass
            t0 = TC.replay_tail(m, state, Xd, pred, 0, 0, P)
            self.assertLess(float((t0 - full).abs().max()), 1e-4)
            # truncation changes the answer far from the start
            self.assertGreater(float((tail[0, -1] - full[0, -1]).abs().max()), 0.0)

    def test_export_loads_back_and_png(self):
        m, _, _ = self.fresh(3)
        base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
        with tempfile.TemporaryDirectory() as d:
            cpath = os.path.join(d, "in.json")
            with open(cpath, "w") as f:
                json.dump(self.conf, f)
            TC.serving_mode(m, base, quant=False)
            TC.export(m, cpath, os.path.join(d, "model"), base)
            m2 = load_model(os.path.join(d, "model"), QuantFlags.off())
            for (n, p), (n2, p2) in zip(m.state_dict().items(), m2.state_dict().items()):
                self.assertEqual(n, n2)
                err = float((p.float() - p2.float()).abs().max())
                self.assertLessEqual(err, float(p.float().abs().max()) * 2 ** -8 + 1e-12, n)
            ids, *_ = batch(1, 24)
            m.eval()
            with torch.no_grad():
                a, b = m(ids), m2(ids)
            self.assertLess(float((a - b).abs().max() / a.abs().max()), 0.05)
            png = os.path.join(d, "c.png")
            # a series with NaN (the --quant-distill curve outside stage C) is drawn where it has values
            series = {"a": [3.0, 2.0, 1.0], "b": [0.5, 0.4, 0.2], "c": [float("nan"), 0.3, 0.1]}
            TC.write_png(png, series, [1, 2, 3], "t")
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            import builtins  # the plain writer, as on a machine without matplotlib
            real_import = builtins.__import__

            def no_mpl(name, *a, **k):
                if name.startswith("matplotlib"):
                    raise ImportError(name)
                return real_import(name, *a, **k)
            builtins.__import__ = no_mpl
            try:
                self.assertEqual(TC.write_png(png, series, [1, 2, 3], "t"), "png-writer")
            finally:
                builtins.__import__ = real_import
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_init_from_checkpoint(self):
        m, _, _ = self.fresh(5)
        with torch.no_grad():  # non-zero router biases: they must come from the checkpoint too
            for blk in m.layers:
                if hasattr(blk.ffn, "gate") and blk.ffn.gate.bias is not None:
                    blk.ffn.gate.bias.uniform_(-0.5, 0.5)
        base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
        with tempfile.TemporaryDirectory() as d:
            cpath = os.path.join(d, "in.json")
            with open(cpath, "w") as f:
                json.dump(self.conf, f)
            TC.export(m, cpath, os.path.join(d, "model"), base)
            m2, _, _ = self.fresh(6)
            self.assertGreater(TC.init_from(m2, os.path.join(d, "model")), 0)
            sd2 = m2.state_dict()
            for n, p in m.state_dict().items():
                bits = TC._bf16_bits(p.float().numpy()).astype(np.uint32) << 16
                want = torch.from_numpy(bits.view(np.float32).reshape(p.shape))
                self.assertTrue(torch.equal(sd2[n].float(), want), n)
            self.assertTrue(all(p.dtype == torch.float32 for p in m2.parameters()))
            # a model of another width is refused with the offending tensor named
            conf = json.loads(json.dumps(self.conf))
            conf["text_config"]["moe_intermediate_size"] = 8
            m3 = TC.build_model(ModelConfig.from_dict(conf), 0)
            with self.assertRaisesRegex(ValueError, "wrong shapes .*experts"):
                TC.init_from(m3, os.path.join(d, "model"))
            with self.assertRaises(FileNotFoundError):
                TC.init_from(m3, d)

    def test_dense_moe_is_the_same_function(self):
        m, _, _ = self.fresh(4)
        x = torch.randn(2, 7, m.cfg.hidden_size)
        with torch.no_grad():
            ref = [blk.ffn(x) for blk in m.layers[:3]]
            TC.use_dense_moe(m)
            got = [blk.ffn(x) for blk in m.layers[:3]]
        for a, b in zip(ref, got):
            self.assertLess(float((a - b).abs().max()), 1e-5 * float(a.abs().max()) + 1e-7)

    def test_sinkhorn_backward_is_the_eager_gradient(self):
        """The custom Sinkhorn Function gives sinkhorn_eager's values bit for bit and its
        gradient (float64, against autograd through the eager loop; gradcheck too), so the
        trainer's cheaper backward changes no forward value and no gradient."""
        from cedar_ref.model import sinkhorn, sinkhorn_eager
        g = torch.Generator().manual_seed(5)
        for dtype, iters in ((torch.float32, 20), (torch.float64, 20), (torch.float64, 1), (torch.float64, 3)):
            x = (torch.softmax(torch.randn(3, 5, 4, 4, generator=g, dtype=dtype) * 2, -1) + 1e-6).requires_grad_()
            up = torch.randn(3, 5, 4, 4, generator=g, dtype=dtype)
            y = sinkhorn(x, iters, 1e-6)
            self.assertIsNot(y.grad_fn, None)
            self.assertIn("Sinkhorn", type(y.grad_fn).__name__)
            self.assertTrue(torch.equal(y.detach(), sinkhorn_eager(x.detach(), iters, 1e-6)))
            (gx,) = torch.autograd.grad((y * up).sum(), x)
            x2 = x.detach().clone().requires_grad_()
            (gref,) = torch.autograd.grad((sinkhorn_eager(x2, iters, 1e-6) * up).sum(), x2)
            tol = 1e-12 if dtype == torch.float64 else 1e-5
            self.assertLess(float((gx - gref).abs().max()), tol * (1 + float(gref.abs().max())), (dtype, iters))
            self.assertGreater(float(gref.abs().max()), 1e-3)
        x = (torch.softmax(torch.randn(2, 4, 4, generator=g, dtype=torch.float64), -1) + 1e-6).requires_grad_()
        self.assertTrue(torch.autograd.gradcheck(lambda t: sinkhorn(t, 20, 1e-6), (x,)))
        with torch.no_grad():  # no graph wanted: the eager loop, same values
            self.assertTrue(torch.equal(sinkhorn(x, 20, 1e-6), sinkhorn_eager(x, 20, 1e-6)))

    def test_batching_budget(self):
        items = [(np.zeros(n, np.int32), np.ones(n, np.uint8), 0) for n in (10, 70, 130, 300, 700)]
        groups = TC.make_batches(items, max_tokens=1024, max_sq=1e6)
        self.assertEqual(sum(len(g) for g in groups), len(items))
        for g in groups:
            T = -(-max(len(it[0]) for it in g) // 64) * 64
            self.assertTrue(len(g) == 1 or (len(g) * T <= 1024 and len(g) * T * T <= 1e6))
        ids, mask, lens, starts = TC.collate(groups[0], 2, "cpu")
        self.assertEqual(ids.shape[1] % 64, 0)
        self.assertEqual(TC.last_turn_start([0, 1, 1, 0, 0, 1, 1, 1, 0]), 5)


    def test_long_recall_samples_in_the_stream(self):
        """--long-recall-frac: the chosen share of the stream is recall samples at the long
        distance, kept up to --long-max-len; the choice does not depend on the chunking."""
        import train
        tok = os.path.join(_paths.ROOT, "model", "weights", "cedar-agent-tiny", "tokenizer.json")
        n = 4000
        share = sum(train.is_long_recall(5, i, 0.3) for i in range(n)) / n
        self.assertLess(abs(share - 0.3), 0.03)
        self.assertFalse(any(train.is_long_recall(5, i, 0.0) for i in range(200)))
        train._init_worker(tok, (1500, 2000), 3072, 0.3, (12000, 14000), 12288)
        try:
            whole = train._gen_chunk((5, 0, 12))
            parts = train._gen_chunk((5, 0, 5)) + train._gen_chunk((5, 5, 7))
            longs = [i for i in range(12) if train.is_long_recall(5, i, 0.3)]
            self.assertTrue(longs)
            self.assertEqual(len(whole), len(parts))
            for a, b in zip(whole, parts):
                self.assertTrue(np.array_equal(a[0], b[0]))
            long_rows = [w for w in whole if len(w[0]) > 3072]
            self.assertEqual(len(long_rows), len(longs))  # 12000+ characters > 3072 tokens
            self.assertTrue(all(w[3] == "recall" and len(w[0]) <= 12288 for w in long_rows))
            train._init_worker(tok, (1500, 2000), 3072, 0.0, (12000, 14000), 12288)
            self.assertTrue(all(len(w[0]) <= 3072 for w in train._gen_chunk((5, 0, 12))))
        finally:
            train._init_worker(tok, (1500, 9000), 3072)

    def test_copy_weights_mark_copied_values(self):
        """--copy-weight: assistant tokens whose id the context showed (not a frequent id, not a
        special id) get the weight, as do their neighbours when the pair appeared in that order;
        other assistant tokens keep 1, non-assistant tokens 0; the loss is the weighted mean and
        the plain mean is reported beside it."""
        #        user: 20 21 30 31 5 40      assistant: 30 31 21 20 3 40 41 3
        ids = np.array([20, 21, 30, 31, 5, 40, 30, 31, 21, 20, 3, 40, 41, 3])
        mask = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1], np.uint8)
        frequent = {21, 31}
        w = TC.copy_weights(ids, mask, frequent, 5)
        # 30: seen, rare -> 5; 31: frequent but (30, 31) appeared -> 5; 21: frequent, (31, 21)
        # never appeared -> 1; 20: seen, rare -> 5; 3: special (< 17) -> 1; 40 seen -> 5;
        # 41 never seen -> 1; the last 3 -> 1
        self.assertEqual(w.tolist(), [0, 0, 0, 0, 0, 0, 5, 5, 1, 5, 1, 5, 1, 1])
        self.assertEqual(TC.copy_weights(ids, mask, frequent, 1).tolist(), mask.tolist())
        with self.assertRaises(ValueError):
            TC.copy_weights(ids, mask, frequent, 256)
        self.assertEqual(TC.frequent_tokens([[1, 2, 2], [2, 3], [2, 4]], 0.5), {2})
        # the loss: weighted mean over the weighted targets, the plain mean beside it
        V = 50
        logits = torch.randn(1, len(ids), V)
        x = torch.tensor(ids)[None]
        loss, n, plain = TC.lm_loss_and_plain(logits, x, torch.tensor(w)[None])
        ce = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:], reduction="none")
        wt = torch.tensor(w[1:], dtype=torch.float32)
        self.assertAlmostEqual(float(loss), float((ce * wt).sum() / wt.sum()), places=5)
        self.assertAlmostEqual(float(plain), float(ce[wt > 0].mean()), places=5)
        self.assertEqual(int(n), 8)
        base, n1 = TC.lm_loss(logits, x, torch.tensor(mask)[None])
        self.assertAlmostEqual(float(base), float(plain), places=5)
        self.assertEqual(int(n1), 8)

    def test_copy_weights_in_the_stream(self):
        """train.py --copy-weight: the workers weight the copied values of real train samples
        (a number the tool result showed, in the answer), and numbers are never frequent."""
        import types
        import train
        from cedar_ref import bpe
        tokp = os.path.join(_paths.ROOT, "model", "weights", "cedar-agent-tiny", "tokenizer.json")
        tok = bpe.Tokenizer.load(tokp)
        args = types.SimpleNamespace(seed=5, recall_chars=[1500, 2000], copy_frequent=0.1, real_names=0.0)
        old = train.COPY_DF_SAMPLES
        train.COPY_DF_SAMPLES = 60
        try:
            freq = train.frequent_ids(tok, args)
        finally:
            train.COPY_DF_SAMPLES = old
        self.assertTrue(freq)
        self.assertFalse(any(tok.decode([i]).strip().isdigit() for i in freq))
        train._init_worker(tokp, (1500, 2000), 3072, 0.0, (12000, 14000), 12288, 4, tuple(freq))
        try:
            got = train._gen_chunk((5, 0, 24))
        finally:
            train._init_worker(tokp, (1500, 9000), 3072)
        copied = sum(int((w == 4).sum()) for _, w, _, _ in got)
        assistant = sum(int((w > 0).sum()) for _, w, _, _ in got)
        self.assertGreater(copied, 0.05 * assistant)
        self.assertLess(copied, 0.6 * assistant)
        for ids, w, _, _ in got:
            self.assertTrue(set(np.unique(w).tolist()) <= {0, 1, 4})
            for t in np.nonzero(w == 4)[0]:
                self.assertIn(int(ids[t]), set(ids[:t][w[:t] == 0].tolist()))  # the context showed it

    def test_teacher_forced_eval_splits_copies_from_other_tokens(self):
        """tf_eval on the shipped model: the graded turn's tokens split into copied values and
        the rest (--copy-weight's split), each with its loss and token accuracy, and the two
        together are the graded-turn loss."""
        from cedar_ref import data
        from cedar_ref import train_eval as TE
        cfg, tok, m = TC.load_trained(os.path.join(_paths.ROOT, "model", "weights", "cedar-agent-tiny"))
        samples = [data.make_sample(77, i, "train", fam, (1500, 2000))
                   for i, fam in enumerate(["single", "chain", "multi"])]
        r = TE.tf_eval(m, tok, samples, "cpu", copy_frequent=0.5)
        self.assertEqual(r["n"], 3)
        self.assertGreater(r["copy_tokens"], 0)
        self.assertGreater(r["other_tokens"], r["copy_tokens"])
        for k in ("copy", "other"):
            self.assertTrue(0.0 <= r[f"{k}_token_acc"] <= 1.0)
            self.assertTrue(0.0 <= r[f"{k}_loss"] < 20.0)
        n = r["copy_tokens"] + r["other_tokens"]
        mixed = (r["copy_loss"] * r["copy_tokens"] + r["other_loss"] * r["other_tokens"]) / n
        self.assertAlmostEqual(mixed, r["graded_loss"], places=6)
        # the trained model gets most graded tokens right
        self.assertGreater(r["other_token_acc"], 0.5)

    def test_weight_ema(self):
        """WeightEMA follows ema += (1 - d)(p - ema) with the warm-up d = min(decay, (1+n)/(10+n)),
        swaps the averages in for an export and restores the live weights bit for bit."""
        m, opt, tr = self.fresh(7)
        base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
        TC.apply_stage(m, "B", base)
        ema = TC.WeightEMA(m, 0.9)
        params = [p for p in m.parameters() if p.requires_grad]
        want = [p.detach().clone() for p in params]
        for step in range(4):
            TC.train_step(m, opt, tr, batch(seed=step), "B", 1e-3, rng=random.Random(0))
            ema.update()
            d = min(0.9, (1.0 + step) / (10.0 + step))
            want = [w + (1 - d) * (p.detach() - w) for w, p in zip(want, params)]
        for s, w in zip(ema.shadow, want):
            torch.testing.assert_close(s, w, rtol=1e-6, atol=1e-7)
        live = [p.detach().clone() for p in params]
        self.assertTrue(any(not torch.equal(a, b) for a, b in zip(live, want)))
        with ema.swapped():
            for p, w in zip(params, ema.shadow):
                self.assertTrue(torch.equal(p.detach(), w))
        for p, v in zip(params, live):
            self.assertTrue(torch.equal(p.detach(), v))
        with self.assertRaisesRegex(ValueError, "decay"):
            TC.WeightEMA(m, 1.0)
        # the trainer refuses such a decay as a usage error naming the flag
        import subprocess
        import sys
        r = subprocess.run([sys.executable, os.path.join(_paths.ROOT, "model", "reference", "train.py"),
                            "--config", "c.json", "--tokenizer", "t.json", "--out", "o", "--steps", "1",
                            "--ema", "1.5"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--ema 1.5", r.stderr)

    def test_checkpoints_during_training(self):
        """train.py --checkpoint-minutes: OUT/checkpoint holds the live and the EMA weights of the
        last step it saw (here every step, so the final step's), in transport parts that join to
        the same tensors as the final export, and checkpoint.json names the step."""
        import subprocess
        import sys
        from cedar_ref.safetensors_io import load_file
        tiny = os.path.join(_paths.ROOT, "model", "weights", "cedar-agent-tiny")

        def train_py(out, steps, *extra):  # a real CPU run of train.py on the shipped config
            return subprocess.run(
                [sys.executable, os.path.join(_paths.REF_DIR, "train.py"),
                 "--config", os.path.join(_paths.ROOT, "config", "cedar-agent-tiny.json"),
                 "--tokenizer", os.path.join(tiny, "tokenizer.json"), "--device", "cpu",
                 "--steps", str(steps), "--workers", "0", "--max-tokens", "768", "--max-len", "700",
                 "--dense-frac", "0", "--tf-eval-n", "0", "--gen-eval-n", "0", "--long-recall-n", "0",
                 "--checkpoint-minutes", "1e-6", "--out", out, *extra],
                capture_output=True, text=True, timeout=600)

        with tempfile.TemporaryDirectory() as d:
            r = train_py(d, 2, "--stage-c-frac", "0.5", "--ema", "0.9", "--transport-parts")
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            self.assertIn("checkpoint of step 2", r.stderr)
            with open(os.path.join(d, "checkpoint", "checkpoint.json")) as f:
                info = json.load(f)
            self.assertEqual(info["step"], 2)
            self.assertTrue(info["ema"])
            self.assertGreater(info["tokens"], 0)
            self.assertFalse(os.path.exists(os.path.join(d, "checkpoint.tmp")))

            def joined(mdir):
                parts = sorted((f for f in os.listdir(mdir) if ".part" in f), key=lambda f: int(f.rsplit("part", 1)[1]))
                self.assertGreaterEqual(len(parts), 1)
                path = os.path.join(d, "joined.safetensors")
                with open(path, "wb") as g:
                    for f in parts:
                        with open(os.path.join(mdir, f), "rb") as h:
                            g.write(h.read())
                return load_file(path)

            for sub in ("model", "model_ema"):
                got, want = joined(os.path.join(d, "checkpoint", sub)), joined(os.path.join(d, sub))
                self.assertEqual(sorted(got), sorted(want))
                for k in want:
                    self.assertTrue(np.array_equal(got[k], want[k]), f"{sub}: {k}")
            live, avg = joined(os.path.join(d, "model")), joined(os.path.join(d, "model_ema"))
            self.assertTrue(any(not np.array_equal(live[k], avg[k]) for k in live))
        # a checkpoint that cannot be written is logged and the run goes on to its final export
        # (this run also trains with the all-entries indexer-KL teacher on the shipped config)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "checkpoint.tmp"), "w") as f:  # a file where a folder must go
                f.write("in the way")
            r = train_py(d, 1, "--kl-teacher-topk", "16", "--copy-weight", "4", "--real-names", "0.5")
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            self.assertIn("checkpoint of step 1 failed", r.stderr)
            self.assertRegex(r.stderr, r"copy weight 4: \d+ frequent ids")  # the copy-focused loss
            self.assertRegex(r.stderr, r"real names: 50% of the train data's drawn words .* \(\d+ stems\)")
            self.assertRegex(r.stderr, r"sel-mass 2:[01]\.\d\d 4:")  # the teacher's check, logged
            with open(os.path.join(d, "indexer.png"), "rb") as f:  # ... and drawn
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            with open(os.path.join(d, "train_log.json")) as f:
                rec = json.load(f)["history"][0]
            self.assertEqual(sorted(rec["teacher"], key=int), ["2", "4", "6", "8", "10"])
            self.assertFalse(os.path.exists(os.path.join(d, "checkpoint")))
            self.assertTrue(os.path.exists(os.path.join(d, "model", "model.safetensors")))
        # bad copy-weight, real-names and quant-distill options: a usage error naming the option, before any work
        with tempfile.TemporaryDirectory() as d:
            for extra, msg in ((("--copy-weight", "300"), "--copy-weight 300"),
                               (("--copy-weight", "2", "--copy-frequent", "0"), "--copy-frequent 0.0"),
                               (("--real-names", "1.5"), "--real-names 1.5"),
                               (("--quant-distill", "-1"), "--quant-distill -1.0"),
                               (("--quant-distill", "nan"), "--quant-distill nan")):
                r = train_py(d, 1, *extra)
                self.assertEqual(r.returncode, 2, r.stderr[-2000:])
                self.assertIn(msg, r.stderr)
        # --indexer-only from the shipped weights: the export differs from them in indexer tensors only
        with tempfile.TemporaryDirectory() as d:
            r = train_py(d, 1, "--init-from", tiny, "--indexer-only", "--indexer-lr-mult", "10",
                         "--kl-teacher-topk", "16", "--stage-c-frac", "1", "--checkpoint-minutes", "0")
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            self.assertIn("indexer only:", r.stderr)
            got = load_file(os.path.join(d, "model", "model.safetensors"))
            want = load_file(os.path.join(tiny, "model.safetensors"))
            self.assertEqual(sorted(got), sorted(want))
            changed = [k for k in want if not np.array_equal(got[k], want[k])]
            self.assertTrue(changed)
            self.assertTrue(all(".indexer." in k for k in changed), changed[:5])
        r = subprocess.run([sys.executable, os.path.join(_paths.REF_DIR, "train.py"), "--config", "c.json",
                            "--tokenizer", "t.json", "--out", "o", "--steps", "1", "--checkpoint-minutes", "-1"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--checkpoint-minutes -1", r.stderr)
        r = subprocess.run([sys.executable, os.path.join(_paths.REF_DIR, "train.py"), "--config", "c.json",
                            "--tokenizer", "t.json", "--out", "o", "--steps", "1", "--kl-teacher-topk", "-4"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--kl-teacher-topk -4", r.stderr)
        r = subprocess.run([sys.executable, os.path.join(_paths.REF_DIR, "train.py"), "--config", "c.json",
                            "--tokenizer", "t.json", "--out", "o", "--steps", "1", "--indexer-lr-mult", "0"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--indexer-lr-mult 0", r.stderr)

    def test_average_models(self):
        """average_models.py: the mean of two exports, written as bf16, loads back; mismatched
        models are refused with the model and the tensor named."""
        import subprocess
        import sys
        from cedar_ref.safetensors_io import load_file
        tool = os.path.join(_paths.ROOT, "model", "reference", "average_models.py")
        base = None
        with tempfile.TemporaryDirectory() as d:
            cpath = os.path.join(d, "in.json")
            with open(cpath, "w") as f:
                json.dump(self.conf, f)
            dirs = []
            for seed in (1, 2):
                m, _, _ = self.fresh(seed)
                base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
                dirs.append(os.path.join(d, f"m{seed}"))
                TC.export(m, cpath, dirs[-1], base)
            out = os.path.join(d, "soup")
            r = subprocess.run([sys.executable, tool, *dirs, "--out", out], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            a, b = (load_file(os.path.join(x, "model.safetensors")) for x in dirs)
            got = load_file(os.path.join(out, "model.safetensors"))
            self.assertEqual(set(got), set(a))
            for k in a:
                mean = (a[k].astype(np.float64) + b[k]) / 2
                tol = np.abs(mean) * 2 ** -8 + 1e-30
                self.assertTrue(np.all(np.abs(got[k] - mean) <= tol), k)
            m2 = load_model(out, QuantFlags.off())  # loads as a model of the config
            self.assertEqual(m2.cfg.hidden_size, 32)
            # weighted: all weight on the first model gives it back exactly
            out1 = os.path.join(d, "w")
            r = subprocess.run([sys.executable, tool, *dirs, "--weights", "1", "0", "--out", out1],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            got1 = load_file(os.path.join(out1, "model.safetensors"))
            for k in a:
                self.assertTrue(np.array_equal(got1[k], a[k]), k)
            # a model of another width is refused, naming it and the tensor
            conf = json.loads(json.dumps(self.conf))
            conf["text_config"]["moe_intermediate_size"] = 8
            with open(cpath, "w") as f:
                json.dump(conf, f)
            m3 = TC.build_model(ModelConfig.from_dict(conf), 0)
            TC.export(m3, cpath, os.path.join(d, "other"), base)
            r = subprocess.run([sys.executable, tool, dirs[0], os.path.join(d, "other"), "--out", out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("other", r.stderr)
            self.assertIn("config.json", r.stderr)


class DataParallelTest(unittest.TestCase):
    def test_two_ranks_equal_one_process_averaging_their_gradients(self):
        import torch.multiprocessing as tmp
        conf = micro_cfg()
        with tempfile.TemporaryDirectory() as d:
            port = 20000 + os.getpid() % 20000
            tmp.spawn(_dp_rank, args=(2, conf, port, d), nprocs=2, join=True)
            got = [torch.load(os.path.join(d, f"r{r}.pt")) for r in range(2)]
        # the replicas never drift: bit-identical parameters and MoE biases
        for k in got[0]:
            self.assertTrue(torch.equal(got[0][k], got[1][k]), k)
        # one process: the same two steps, each rank's gradients computed in turn and averaged
        m = TC.build_model(ModelConfig.from_dict(conf), 0)
        init = {k: v.clone() for k, v in m.state_dict().items()}
        opt = torch.optim.AdamW(TC.param_groups(m, 3e-3), lr=3e-3, betas=(0.9, 0.95))
        tr = TC.MoETracker(m)
        base = {"index_topk": m.cfg.index_topk, "candidate_topk_blocks": m.cfg.candidate_topk_blocks}
        TC.apply_stage(m, "B", base)

        class Local:  # DataParallel's contract, the two ranks simulated in one process
            def __init__(self):
                self.grads, self.loads = [], []

            def step_ok(self, ok):
                return ok

            def average_grads(self, params):
                self.grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                                   for p in params])

            def sum_loads(self, tracker):
                self.loads.append(tracker.loads.clone())

        params = None
        for step in range(2):
            loc = Local()
            for rank in range(2):  # gradients of each rank's batch from the same parameters
                opt.step = lambda *a, **k: None  # gradients only (gamma 0: no bias change)
                TC.train_step(m, opt, tr, batch(seed=10 * step + rank), "B", 0.0,
                              rng=random.Random(rank), parallel=loc)
                del opt.step
            params = [p for g in opt.param_groups if g["name"] != "indexer" for p in g["params"]] + \
                     [p for g in opt.param_groups if g["name"] == "indexer" for p in g["params"]]
            for i, p in enumerate(params):
                p.grad = (loc.grads[0][i] + loc.grads[1][i]) / 2
            other = [p for g in opt.param_groups if g["name"] != "indexer" for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(other, 1.0)
            torch.nn.utils.clip_grad_norm_(params[len(other):], 1.0)
            opt.step()
            tr.loads.copy_(loc.loads[0] + loc.loads[1])
            tr.update_bias(1e-3)
        want = m.state_dict()
        changed = 0
        for k, v in want.items():
            torch.testing.assert_close(got[0][k], v, rtol=1e-5, atol=1e-6, msg=k)
            changed += int(not torch.equal(v, init[k]))
        self.assertGreater(changed, len(want) // 2)


if __name__ == "__main__":
    unittest.main()
