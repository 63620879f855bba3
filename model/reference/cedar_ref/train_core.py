"""Trainer of cedar's default model on cedar_ref.model (TRAINING_NOTES.md recipe, issue 6).

What this owns
  * init_model(): the TRAINING_NOTES initialisation (linears and router N(0, 0.02), mHC fn
    N(0, 0.02) / base 0 / scale 0.01, Engram tables N(0, 0.02) with the value half of wkv zeroed
    for an inert start, router bias 0 and outside autograd).
  * param_groups(): AdamW groups — matrices (wd 0.1), no-decay (norms, sinks, mHC base/scale,
    Engram q/k weights), Engram tables (lr x5, wd 0), indexer (own group, own clipping). The
    router bias, the unused bias_vl and the Engram per-32 scales are not trained.
  * Stage schedule (fractions of the steps): A dense global branch (top-k and candidate pool
    cover everything) + FP8-SWA STE; B sparse top-k; C + FP4 STE of the compressed KV and the
    indexer Q/K, the candidate pool, decoder bounded-replay simulation on ~half the rows and an
    LR decay to 0.1x; the MoE bias is frozen for the last 5%.
  * train_step(): full-sequence forward (cedar_ref.model internals, no edits to it), loss on
    assistant tokens only, sequence-wise MoE balance loss (alpha 1e-4, counted over real tokens),
    indexer KL per index source (teacher = its own layer's head-summed attention mass on the
    compressed entries it selected, renormalised, detached; student = log-softmax of the index
    scores over the same support; in stage A the support is every visible entry). The LM loss
    backpropagates into everything but the indexer (top-k is integer: it cannot reach it); the
    KL backpropagates ONLY into indexer parameters (autograd `inputs=`, equivalent to detaching
    the indexer's inputs x, qr and the compressor latent). MoE bias update after each step:
    b_i += gamma * sign(mean(load) - load_i) with loads over the whole batch per layer.
  * Bounded-replay simulation (stage C): for up to `replay_rows` rows of a batch, the decoder
    layers [fd, L) re-run on rows [P - W, T_b) of that row's encoder output with their SWA limited
    to positions >= P - W and the global KV / index keys read from the full pass (exactly what
    the runtime's CED prefill + decode computes for the last assistant turn starting at P);
    that tail's assistant tokens add a second LM term.
  * Quantisation-gap distillation (stage C, `quant_distill` W > 0): the same weights' forward
    with every cache part unquantised (no gradients) is the teacher of the quantised forward:
    W * KL(unquantised || quantised) over the assistant targets joins the backbone loss.
  * Batching: one sample per row, right-padded (pads are never attended by real tokens: causal),
    rows grouped by length under a token budget and a T^2 budget (the reference attention is
    dense in memory). No packing: the reference shares positions across a batch, so per-document
    resets would need its internals changed.
  * init_from(): continue from an exported checkpoint (bf16 safetensors widened into the fp32
    masters, MoE router biases included); every tensor must be present with the model's shape.
  * export(): bf16 safetensors under the official tensor names + config.json + token_map.npy.
  * write_png(): matplotlib when importable, else a tiny numpy/zlib line-plot PNG writer.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F

from .config import ModelConfig
from .model import DeepseekV41, QuantFlags, _Ctx
from .safetensors_io import load_file
from .state import SequenceState, SourceState

BIG = 1 << 30


# =============================================================================================
# model setup
# =============================================================================================

def build_model(cfg: ModelConfig, seed=0, device="cpu"):
    """Fresh model with the TRAINING_NOTES init; identity Engram token map (C++ default when
    engram_compressed_vocab_size >= vocab_size)."""
    if cfg.engram_layer_ids and cfg.engram_compressed_vocab_size < cfg.vocab_size:
        raise ValueError("cedar's trained configs use an identity Engram token map: "
                         "engram_compressed_vocab_size must be >= vocab_size")
    torch.manual_seed(seed)
    m = DeepseekV41(cfg, QuantFlags(fp8_swa=True, fp4_kv=False, fp4_index_k=False,
                                    fp4_index_q=False, ste=True),
                    token_map=np.arange(cfg.vocab_size))
    init_model(m)
    return m.to(device)


@torch.no_grad()
def init_model(m: DeepseekV41):
    for name, p in m.named_parameters():
        if name.endswith("hc_attn_fn") or name.endswith("hc_ffn_fn"):
            p.normal_(0, 0.02)
        elif name.endswith("_base"):
            p.zero_()
        elif name.endswith("_scale") and "hc_" in name:
            p.fill_(0.01)
        elif name.endswith("gate.weight"):
            p.normal_(0, 0.02)
        elif name.endswith("gate.bias") or name.endswith("gate.bias_vl"):
            p.zero_()
        elif ".engram.embed.weight" in name:
            p.normal_(0, 0.02)
        elif name == "embed.weight":
            p.normal_(0, 1.0)
        elif p.dim() == 2:
            p.normal_(0, 0.02)
    for blk in m.layers:
        if blk.engram is not None:
            d, hc = m.cfg.hidden_size, m.cfg.hc_mult
            blk.engram.wkv.weight[hc * d:].zero_()
    for name, p in m.named_parameters():
        if not trainable(name):
            p.requires_grad_(False)


@torch.no_grad()
def load_trained(model_dir, device="cpu"):
    """An exported model directory for measuring tools: config.json, tokenizer.json and
    model.safetensors into a fresh model (init_from's checks), in eval mode. Raises OSError /
    ValueError / KeyError naming what is wrong. -> (cfg, tokenizer, model)."""
    from . import bpe
    cfg = ModelConfig.from_json(os.path.join(model_dir, "config.json"))
    tok = bpe.Tokenizer.load(os.path.join(model_dir, "tokenizer.json"))
    m = build_model(cfg, 0, device)
    init_from(m, model_dir)
    m.eval()
    return cfg, tok, m


def init_from(m: DeepseekV41, model_dir):
    """Loads model_dir/model.safetensors (official names, bf16 or fp32) into m's parameters and
    buffers in place (fp32 masters; the router biases come from the checkpoint too). Strict:
    raises ValueError naming missing, unexpected or wrongly shaped tensors. -> tensor count."""
    path = os.path.join(model_dir, "model.safetensors")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--init-from: no model.safetensors in {model_dir}")
    tensors = load_file(path)
    sd = m.state_dict()
    missing = [k for k in sd if k not in tensors]
    unexpected = [k for k in tensors if k not in sd]
    bad = [f"{k} {tuple(tensors[k].shape)} != model {tuple(sd[k].shape)}"
           for k in sd if k in tensors and tuple(tensors[k].shape) != tuple(sd[k].shape)]
    if missing or unexpected or bad:
        raise ValueError(f"{path} does not match the model config: "
                         f"{len(missing)} missing {missing[:6]}, {len(unexpected)} unexpected "
                         f"{unexpected[:6]}, {len(bad)} wrong shapes {bad[:6]}")
    tm = os.path.join(model_dir, "token_map.npy")
    if os.path.isfile(tm):
        got = np.load(tm)
        if not np.array_equal(got, np.arange(len(got))) or len(got) != m.cfg.vocab_size:
            raise ValueError(f"{tm}: cedar's trainer uses an identity Engram token map of "
                             f"{m.cfg.vocab_size} ids")
    for k, v in sd.items():
        v.copy_(torch.from_numpy(tensors[k]).to(device=v.device, dtype=v.dtype))
    return len(sd)


def trainable(name):
    return not (name.endswith("gate.bias") or name.endswith("gate.bias_vl")
                or name.endswith("engram.embed.scale"))


def is_indexer(name):
    return ".attn.indexer." in name


def freeze_all_but_indexers(m: DeepseekV41):
    """Indexer-only training (train.py --indexer-only): every parameter outside the indexers
    stops taking gradients, so a step moves the indexers alone against their KL (TRAINING_NOTES
    §1's warm-up, on weights whose attention is already trained). Call before param_groups();
    returns (trainable, frozen) parameter counts."""
    n_train = n_frozen = 0
    for name, p in m.named_parameters():
        keep = is_indexer(name)
        p.requires_grad_(keep)
        if keep:
            n_train += p.numel()
        else:
            n_frozen += p.numel()
    return n_train, n_frozen


def param_groups(m: DeepseekV41, lr, wd=0.1, engram_lr_mult=5.0):
    groups = {"matrix": [], "nodecay": [], "engram_table": [], "indexer": []}
    for name, p in m.named_parameters():
        if not p.requires_grad:
            continue
        if is_indexer(name):
            groups["indexer"].append(p)
        elif ".engram.embed.weight" in name:
            groups["engram_table"].append(p)
        elif p.dim() >= 2 and not (name.endswith("q_weight") or name.endswith("k_weight")):
            groups["matrix"].append(p)
        else:
            groups["nodecay"].append(p)
    return [
        {"params": groups["matrix"], "weight_decay": wd, "lr_mult": 1.0, "name": "matrix"},
        {"params": groups["nodecay"], "weight_decay": 0.0, "lr_mult": 1.0, "name": "nodecay"},
        {"params": groups["engram_table"], "weight_decay": 0.0, "lr_mult": engram_lr_mult,
         "name": "engram_table"},
        {"params": groups["indexer"], "weight_decay": 0.0, "lr_mult": 1.0, "name": "indexer"},
    ]


def _moe_forward_dense(self, x):
    """Same function as model.MoE.forward without its per-expert host syncs (`rows.numel()`):
    every expert runs on every token with a per-token weight that is 0 where it was not
    selected (Expert is linear in that weight). ~E/K x the expert FLOPs, no data-dependent
    shapes: the GPU queue never drains inside the forward."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    w, idx = self.gate(flat)
    E = len(self.experts)
    dense_w = torch.zeros(flat.shape[0], E, device=flat.device, dtype=w.dtype)
    dense_w.scatter_add_(1, idx, w)
    y = self.shared_experts(flat).float()
    for e, expert in enumerate(self.experts):
        y = y + expert(flat, dense_w[:, e:e + 1]).float()
    return y.view(shape)


def use_dense_moe(m: DeepseekV41):
    """Training speed-up: bind the sync-free MoE forward on this model's MoE instances only."""
    import types
    for blk in m.layers:
        blk.ffn.forward = types.MethodType(_moe_forward_dense, blk.ffn)


# =============================================================================================
# schedule
# =============================================================================================

@dataclass
class Schedule:
    steps: int
    dense_frac: float = 0.12
    stage_c_frac: float = 0.70
    warmup_frac: float = 0.03
    bias_freeze_frac: float = 0.95
    final_lr_mult: float = 0.1

    def stage(self, step):
        f = step / max(1, self.steps)
        return "A" if f < self.dense_frac else ("B" if f < self.stage_c_frac else "C")

    def lr_mult(self, step):
        f = step / max(1, self.steps)
        if f < self.warmup_frac:
            return (step + 1) / max(1, int(self.warmup_frac * self.steps) + 1)
        if f < self.stage_c_frac:
            return 1.0
        t = (f - self.stage_c_frac) / max(1e-9, 1 - self.stage_c_frac)
        return self.final_lr_mult + (1 - self.final_lr_mult) * 0.5 * (1 + math.cos(math.pi * t))

    def bias_frozen(self, step):
        return step / max(1, self.steps) >= self.bias_freeze_frac


def apply_stage(m: DeepseekV41, stage: str, base_cfg: Dict[str, int], sparse: bool = True):
    """Mutates the shared config / quant flags the modules read at every forward. `sparse`:
    stages B and C run the model's sparse training path (same function, no [T, T] or [T, E]
    tensors on the gradient path); stage A (every entry selected) stays dense."""
    cfg, q = m.cfg, m.quant
    m.sparse_train = sparse and stage != "A"
    q.ste = True
    q.fp8_swa = True
    if stage == "A":
        cfg.index_topk = BIG
        cfg.candidate_topk_blocks = BIG
    else:
        cfg.index_topk = base_cfg["index_topk"]
        cfg.candidate_topk_blocks = base_cfg["candidate_topk_blocks"] if stage == "C" else BIG
    fp4 = stage == "C"
    q.fp4_kv = q.fp4_index_k = q.fp4_index_q = fp4


def serving_mode(m: DeepseekV41, base_cfg: Dict[str, int], quant=True):
    cfg = m.cfg
    m.sparse_train = False
    cfg.index_topk = base_cfg["index_topk"]
    cfg.candidate_topk_blocks = base_cfg["candidate_topk_blocks"]
    m.quant.fp8_swa = m.quant.fp4_kv = m.quant.fp4_index_k = m.quant.fp4_index_q = quant
    m.quant.ste = False


# =============================================================================================
# MoE load tracking (forward hooks on the gates)
# =============================================================================================

class MoETracker:
    """Counts per-layer expert loads over real tokens and builds the sequence-wise balance
    loss; hooks fire on every Gate forward while `active`."""

    def __init__(self, m: DeepseekV41, alpha=1e-4):
        self.m = m
        self.alpha = alpha
        self.active = False
        self.valid = None  # bool [B*T] of the current forward
        self.B = 1
        E = m.cfg.n_routed_experts
        self.loads = torch.zeros(len(m.layers), E, device=m.head.weight.device)
        self.aux = []
        for l, blk in enumerate(m.layers):
            blk.ffn.gate.register_forward_hook(self._hook(l))

    def _hook(self, l):
        def hook(gate, inputs, output):
            if not self.active:
                return
            cfg = gate.cfg
            flat = inputs[0]
            _, idx = output
            E, K = cfg.n_routed_experts, cfg.num_experts_per_tok
            valid = self.valid
            onehot = F.one_hot(idx, E).sum(1).float()  # [N, E]
            if valid is not None:
                onehot = onehot * valid[:, None]
            with torch.no_grad():
                self.loads[l] += onehot.sum(0)
            if self.alpha > 0:
                s = torch.sqrt(F.softplus(F.linear(flat.float(), gate.weight.float()) / cfg.gate_temp))
                s = s / (s.sum(-1, keepdim=True) + 1e-20)
                B = self.B
                v = valid.view(B, -1).float() if valid is not None else torch.ones(B, flat.shape[0] // B, device=flat.device)
                n = v.sum(1).clamp_min(1)  # [B]
                P = (s.view(B, -1, E) * v[..., None]).sum(1) / n[:, None]
                f = (onehot.view(B, -1, E).sum(1) * E / (K * n[:, None])).detach()
                self.aux.append(self.alpha * (f * P).sum(-1).mean())
        return hook

    def reset(self):
        self.loads.zero_()
        self.aux = []

    @torch.no_grad()
    def update_bias(self, gamma):
        """b_i += gamma * sign(mean(load) - load_i); returns per-layer MaxVio."""
        vio = []
        for l, blk in enumerate(self.m.layers):
            load = self.loads[l]
            if load.sum() == 0:
                continue
            blk.ffn.gate.bias += gamma * torch.sign(load.mean() - load)
            vio.append(float(load.max() / load.mean().clamp_min(1e-9) - 1))
        return vio


# =============================================================================================
# forward + losses
# =============================================================================================

def full_forward(m: DeepseekV41, ids, trace):
    """Full-sequence training forward; also returns the decoder-entry residual and pre-mix for
    the bounded-replay tail. -> logits [B, T, V], state, X_fd, pre_fd."""
    cfg = m.cfg
    B, T = ids.shape
    fd, L = cfg.first_decoder_layer, cfg.num_hidden_layers
    state = m.new_state(B)
    pos = m._positions(state, T)
    ctx = _Ctx(m, state, pos, True, trace, None)
    X, pre, h = m._embed(ids, pos, state)
    X, pre = m._run(X, pre, h, ctx, 0, fd)
    Xd, pred = X, pre
    X, pre = m._run(X, pre, h, ctx, fd, L)
    state.n_past += T
    return m._head(X, pre), state, Xd, pred


def replay_tail(m: DeepseekV41, state, Xd, pred, b, start, end):
    """Decoder layers over rows [start, end) of row b, SWA limited to >= start, global KV from
    the full pass (CED prefill tail + decode). -> logits [1, end-start, V]."""
    cfg = m.cfg
    fd, L = cfg.first_decoder_layer, cfg.num_hidden_layers
    st = SequenceState(cfg, 1, Xd.device)
    for s, src in state.sources.items():
        st.sources[s] = SourceState(src.ratio, src.kv[b:b + 1], src.index_k[b:b + 1],
                                    src.pending_kv[b:b + 1],
                                    None if src.pending_gate is None else src.pending_gate[b:b + 1])
    pos = torch.arange(start, end, device=Xd.device)
    ctx = _Ctx(m, st, pos, False, None, torch.full_like(pos, start))
    Xt, pret = m._run(Xd[b:b + 1, start:end], pred[b:b + 1, start:end], None, ctx, fd, L)
    return m._head(Xt, pret)


def unquantised_logits(m: DeepseekV41, ids):
    """The same model's full forward with every cache part kept unquantised (no FP8 window, no
    FP4 global KV, index keys or indexer queries: what `cedar eval --kv bf16` runs with exact
    resumes), without gradients, the quant flags restored afterwards. -> logits [B, T, V]."""
    q = m.quant
    saved = (q.fp8_swa, q.fp4_kv, q.fp4_index_k, q.fp4_index_q)
    q.fp8_swa = q.fp4_kv = q.fp4_index_k = q.fp4_index_q = False
    try:
        with torch.no_grad():
            logits, _, _, _ = full_forward(m, ids, None)
    finally:
        q.fp8_swa, q.fp4_kv, q.fp4_index_k, q.fp4_index_q = saved
    return logits


def quant_gap_kl(logits, teacher_logits, mask):
    """KL(teacher || student) per target position, averaged over the positions whose TARGET is
    an assistant token (mask > 0, unweighted): the quantised-cache forward (student, with
    gradients) pulled toward the same weights' unquantised-cache forward (teacher, detached).
    logits / teacher_logits [B, T, V], mask [B, T]. -> scalar (0 when there is no target)."""
    sel = mask[:, 1:] > 0
    if not bool(sel.any()):
        return logits.sum() * 0.0
    s = F.log_softmax(logits[:, :-1][sel].float(), -1)
    t = F.log_softmax(teacher_logits[:, :-1][sel].float(), -1).detach()
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def lm_loss(logits, ids, mask):
    """Weighted mean CE over positions whose TARGET is an assistant token. logits [B,T,V],
    ids/mask [B,T]; mask holds each token's loss weight (0: no loss, 1: an assistant token,
    more: a copied value, copy_weights()). -> (loss, number of assistant targets)."""
    loss, n, _ = lm_loss_and_plain(logits, ids, mask)
    return loss, n


def lm_loss_and_plain(logits, ids, mask):
    """lm_loss() and, detached, the unweighted mean over the same targets (what the logs show,
    comparable across runs with and without copy weights). -> (loss, n, plain)."""
    tgt = ids[:, 1:]
    w = mask[:, 1:].float()
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1),
                         reduction="none").view_as(w)
    on = (w > 0).float()
    n = on.sum()
    plain = (ce.detach() * on).sum() / n.clamp_min(1)
    return (ce * w).sum() / w.sum().clamp_min(1), n, plain


def frequent_tokens(token_lists, threshold):
    """Ids present in more than `threshold` (a fraction) of the token lists: the template's
    words, punctuation, chat and DSML markers. -> set of ids."""
    df = {}
    for ids in token_lists:
        for t in set(int(x) for x in ids):
            df[t] = df.get(t, 0) + 1
    n = max(len(token_lists), 1)
    return {t for t, c in df.items() if c / n > threshold}


def copy_frequent_ids(tok, token_lists, threshold):
    """frequent_tokens() without the numbers: the ids copy_weights() never counts as copies.
    A number in an answer is always a copy when the context showed it."""
    numbers = {i for i in range(tok.vocab_size) if tok.decode([i]).strip().isdigit()}
    return frequent_tokens(token_lists, threshold) - numbers


def copy_weights(ids, mask, frequent, weight, n_special=17):
    """The copy-focused objective: an assistant token that copies a value gets loss weight
    `weight` (an int 1..255), any other assistant token 1. A copy: its id appeared earlier in a
    non-assistant message (system prompt, user message, tool result) and is not one of the
    `frequent` ids (template words, punctuation; numbers never count as frequent:
    copy_frequent_ids()), or it is next to such a token and the pair appeared
    earlier in that order (the common pieces inside a copied name: `/gr` `ar` `cas`).
    Special ids (< n_special: chat and DSML markers) never are. The shipped model's misses are
    single wrong tokens in copied values; these tokens carry ~2.5x the mean loss of the others.
    ids, mask: 1-D int arrays (mask 0/1). -> uint8 array of weights."""
    if weight <= 1:
        return np.asarray(mask, np.uint8)
    if weight > 255:
        raise ValueError(f"copy weight {weight} is above 255")
    ids = [int(x) for x in ids]
    m = np.asarray(mask, np.uint8)
    out = m.copy()
    seen, pair_at = set(), {}  # pair_at: where each non-assistant pair first ended
    core = [False] * len(ids)
    for t, tok in enumerate(ids):
        if m[t]:
            core[t] = tok >= n_special and tok in seen and tok not in frequent
        else:
            seen.add(tok)
            if t > 0 and not m[t - 1]:
                pair_at.setdefault((ids[t - 1], tok), t)

    def earlier(a, b, t):
        return pair_at.get((a, b), len(ids)) < t

    for t, tok in enumerate(ids):
        if not m[t] or tok < n_special:
            continue
        if (core[t] or (t > 0 and core[t - 1] and earlier(ids[t - 1], tok, t - 1))
                or (t + 1 < len(ids) and core[t + 1] and earlier(tok, ids[t + 1], t))):
            out[t] = weight
    return out


def indexer_kl(trace, valid_rows):
    """Sum over index sources of the mean-over-rows KL(teacher || student). valid_rows [B, T]."""
    total, stats = 0.0, {}
    for l, score in trace.get("index_scores", {}).items():
        cp = trace.get("compressed_probs", {}).get(l)
        if cp is None:
            continue
        # dense trace: [B, T, E] scores and mass, `topk` masks; sparse trace (model.sparse_train):
        # [B, T, k] aligned with topk_idx, `topk_valid` masks. Both supports are the selection,
        # unless the model's kl_teacher_topk widened it ("kl_support": selection ∪ teacher top-k).
        sel = trace.get("kl_support", {}).get(l)
        if sel is None:
            sel = trace["topk_valid"][l] if "topk_valid" in trace else trace["topk"][l]
        with torch.no_grad():
            mass = cp.detach().float() * sel
            z = mass.sum(-1, keepdim=True)
            p = mass / z.clamp_min(1e-20)
            rows = (z.squeeze(-1) > 1e-12) & valid_rows
        s = score.float().masked_fill(~sel, float("-inf"))
        logq = torch.log_softmax(s, -1)
        logq = torch.where(p > 0, logq, torch.zeros_like(logq))
        plogp = torch.where(p > 0, p * torch.log(p.clamp_min(1e-30)), torch.zeros_like(p))
        kl = (plogp - p * logq).sum(-1)  # [B, T]
        n = rows.sum().clamp_min(1)
        kl_l = (kl * rows).sum() / n
        total = total + kl_l
        stats[l] = float(kl_l.detach())
    return total, stats


def teacher_check(trace, rows, k):
    """TRAINING_NOTES §1's indexer check from a trace with kl_teacher_stats (model.kl_teacher_topk
    > 0), over the rows bool [B, T]: per index layer, the share of the teacher's mass on the
    selection ("captured"), the share of the teacher's top entries in the selection ("recall"),
    what a random selection of k entries would hold ("random": mean of min(k, N) / N), and the
    share the teacher's own top K entries hold ("oracle": the most a selection of K can capture;
    K = model.kl_teacher_topk, so with K = k it bounds "captured"); with model.pool_check, on a
    layer restricted to the candidate pool, "pool": the share of its attention over EVERY visible
    entry (the restriction lifted) that lies in the pool — the teacher sees only the pool, so a
    line the pool misses is invisible to it and to "captured" (1.0 on layers without a pool).
    -> {layer: {"captured", "recall", "random", "oracle", "rows"[, "pool"]}} (means over rows
    with teacher mass)."""
    stats = sorted(trace.get("kl_teacher_stats", {}).items())
    if not stats:
        return {}
    sums = []
    for _, st in stats:  # per layer: [n, Σ captured, Σ recall, Σ random, Σ oracle, Σ pool, n pool]
        st = st.detach().float()
        use = (rows & (st[..., 0] > 1e-12) & (st[..., 3] > 0)).float()
        vis = st[..., 4].clamp_min(1)
        sums.append(torch.stack([use.sum(), (use * st[..., 1] / st[..., 0].clamp_min(1e-30)).sum(),
                                 (use * st[..., 2] / st[..., 3].clamp_min(1)).sum(),
                                 (use * vis.clamp_max(k) / vis).sum(),
                                 (use * st[..., 5] / st[..., 0].clamp_min(1e-30)).sum(),
                                 (use * st[..., 6].clamp_min(0)).sum(), (use * (st[..., 6] >= 0)).sum()]))
    out = {}
    for (l, _), (n, cap, rec, rnd, orc, pool, npool) in zip(stats, torch.stack(sums).tolist()):
        if n > 0:
            out[l] = {"captured": cap / n, "recall": rec / n, "random": rnd / n, "oracle": orc / n,
                      "rows": int(n)}
            if npool > 0:
                out[l]["pool"] = pool / npool
    return out


@dataclass
class StepOut:
    loss: float
    lm: float  # unweighted mean CE over the assistant targets (comparable with and without copy weights)
    kl: float
    aux: float
    replay_lm: float
    tokens: int
    maxvio: float
    kl_layers: Dict[int, float] = field(default_factory=dict)
    teacher: Dict[int, Dict[str, float]] = field(default_factory=dict)  # teacher_check, rows predicting assistant tokens
    quant_gap: float = 0.0  # quant_gap_kl() of the step (0 outside stage C or without --quant-distill)


class DataParallel:
    """Data-parallel glue for train_step over torch.distributed (NCCL on GPUs, gloo on CPU).

    Every rank holds the same parameters (same init / --init-from) and trains on its own
    batches; after the backward passes the gradients are averaged over the ranks and the MoE
    loads summed, so clipping, AdamW and the bias rule compute the same update on every rank and
    the replicas never drift. Collectives per step, in this order on every rank:
      agree(frac)   rank 0's schedule position (time budgets differ per rank otherwise)
      step_ok(ok)   MIN over ranks: a step that failed anywhere (out of memory) is skipped
                    everywhere, so no rank waits in a collective the others never enter
      average_grads one flat all-reduce of every trainable gradient (absent ones count as 0)
      sum_loads     the MoE loads [L, E]
    """

    def __init__(self, rank, world, device):
        import torch.distributed as dist
        self.dist, self.rank, self.world, self.device = dist, rank, world, device

    def agree(self, frac):
        t = torch.tensor([float(frac)], device=self.device, dtype=torch.float64)
        self.dist.broadcast(t, 0)
        return float(t)

    def step_ok(self, ok):
        t = torch.tensor([1 if ok else 0], device=self.device, dtype=torch.int32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)
        return bool(int(t))

    def average_grads(self, params):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        self.dist.all_reduce(flat)
        flat /= self.world
        off = 0
        for p in params:
            n = p.numel()
            p.grad = flat[off:off + n].view_as(p).to(p.dtype)
            off += n

    def sum_loads(self, tracker):
        self.dist.all_reduce(tracker.loads)

    def sum(self, values):
        """Sums a list of floats over the ranks (logging)."""
        t = torch.tensor(values, device=self.device, dtype=torch.float64)
        self.dist.all_reduce(t)
        return t.tolist()


def train_step(m, opt, tracker, batch, stage, gamma, clip=1.0, replay_rows=0, autocast=None,
               rng=None, update_bias=True, parallel=None, quant_distill=0.0):
    """One optimizer step on batch = (ids [B,T] long, mask [B,T] uint8, lens [B], starts [B]).
    starts[b] = position of the first token of row b's last assistant turn. `parallel`: a
    DataParallel; the step returns None when some rank failed it (nothing was updated).
    `quant_distill` W > 0: in stage C (the quantised caches) the backbone loss also gets
    W * quant_gap_kl() against the same weights' unquantised forward (one more forward, no
    gradients)."""
    ids, mask, lens, starts = batch
    dev = ids.device
    B, T = ids.shape
    W = m.cfg.sliding_window
    valid = torch.arange(T, device=dev)[None, :] < lens[:, None]
    tracker.reset()
    tracker.active = True
    tracker.valid = valid.reshape(-1)
    tracker.B = B
    trace = {"compressed_probs": {}}
    ctxmgr = autocast() if autocast else _nullctx()
    with ctxmgr:
        logits, state, Xd, pred = full_forward(m, ids, trace)
        lm, ntok, lm_plain = lm_loss_and_plain(logits, ids, mask)
        aux = sum(tracker.aux) if tracker.aux else torch.zeros((), device=dev)
        tracker.active = False
        qgap = torch.zeros((), device=dev)
        if stage == "C" and quant_distill > 0:
            teacher = unquantised_logits(m, ids)
            qgap = quant_gap_kl(logits, teacher, mask)
            del teacher
        replay_lm = torch.zeros((), device=dev)
        n_rep = 0
        if stage == "C" and replay_rows > 0:
            rows = [b for b in range(B) if int(starts[b]) >= W and rng.random() < 0.5][:replay_rows]
            for b in rows:
                s, e = int(starts[b]) - W, int(lens[b])
                lt = replay_tail(m, state, Xd, pred, b, s, e)
                rl, _ = lm_loss(lt, ids[b:b + 1, s:e], mask[b:b + 1, s:e])
                replay_lm = replay_lm + rl
                n_rep += 1
            if n_rep:
                replay_lm = replay_lm / n_rep
        kl, kl_stats = indexer_kl(trace, valid)
    backbone_loss = lm + aux + replay_lm + quant_distill * qgap
    opt.zero_grad(set_to_none=True)
    idx_params = [p for g in opt.param_groups if g["name"] == "indexer" for p in g["params"]]
    other = [p for g in opt.param_groups if g["name"] != "indexer" for p in g["params"]]
    if backbone_loss.requires_grad:  # False when only the indexers train (freeze_all_but_indexers)
        backbone_loss.backward(retain_graph=torch.is_tensor(kl))
    if torch.is_tensor(kl) and kl.requires_grad:
        kl.backward(inputs=idx_params)
    if parallel is not None:
        if not parallel.step_ok(True):
            opt.zero_grad(set_to_none=True)
            return None
        parallel.average_grads(other + idx_params)
        parallel.sum_loads(tracker)
    torch.nn.utils.clip_grad_norm_(other, clip)
    torch.nn.utils.clip_grad_norm_(idx_params, clip)
    opt.step()
    vio = tracker.update_bias(gamma if update_bias else 0.0)
    return StepOut(float(backbone_loss.detach()), float(lm_plain), float(kl.detach()) if torch.is_tensor(kl) else 0.0,
                   float(aux.detach()) if torch.is_tensor(aux) else 0.0, float(replay_lm.detach()),
                   int(ntok), max(vio) if vio else 0.0, kl_stats,
                   teacher_check(trace, valid & F.pad(mask[:, 1:], (0, 1)).bool(), m.cfg.index_topk),
                   float(qgap.detach()))


class WeightEMA:
    """Exponential moving average of the trainable parameters, kept as fp32 copies on their
    device: after every optimiser step ema += (1 - d) * (p - ema), with the usual warm-up
    d = min(decay, (1 + n) / (10 + n)) so the first steps do not pin the average to the initial
    weights. Buffers (router biases, Engram scales) are not averaged: the exported EMA model
    takes them from the live model. `swapped()` puts the averages into the model for an export
    or an evaluation and restores the live weights afterwards."""

    def __init__(self, m, decay):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must lie in (0, 1), got {decay}")
        self.decay = decay
        self.params = [p for p in m.parameters() if p.requires_grad]
        self.shadow = [p.detach().float().clone() for p in self.params]
        self.n = 0

    @torch.no_grad()
    def update(self):
        d = min(self.decay, (1.0 + self.n) / (10.0 + self.n))
        self.n += 1
        live = [p.detach().float() for p in self.params]
        if hasattr(torch, "_foreach_lerp_"):
            torch._foreach_lerp_(self.shadow, live, 1.0 - d)
        else:  # older torch (Debian's)
            for s, p in zip(self.shadow, live):
                s.lerp_(p, 1.0 - d)

    def swapped(self):
        ema = self

        class _Swap:
            def __enter__(self):
                with torch.no_grad():
                    self.live = [p.detach().clone() for p in ema.params]
                    for p, s in zip(ema.params, ema.shadow):
                        p.copy_(s.to(p.dtype))

            def __exit__(self, *a):
                with torch.no_grad():
                    for p, v in zip(ema.params, self.live):
                        p.copy_(v)
                return False

        return _Swap()


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# =============================================================================================
# batching
# =============================================================================================

def make_batches(items, max_tokens, max_sq, pad_to=64, rng=None):
    """items: list of (ids, mask, start). Groups by length under B*Tpad <= max_tokens and
    B*Tpad^2 <= max_sq. -> list of lists of items (order shuffled by rng)."""
    items = sorted(items, key=lambda it: len(it[0]))
    out, cur = [], []
    for it in items:
        Tp = -(-len(it[0]) // pad_to) * pad_to
        n = len(cur) + 1
        if cur and (n * Tp > max_tokens or n * Tp * Tp > max_sq):
            out.append(cur)
            cur = []
        cur.append(it)
    if cur:
        out.append(cur)
    if rng is not None:
        rng.shuffle(out)
    return out


def collate(group, pad_id, device, pad_to=64):
    T = -(-max(len(it[0]) for it in group) // pad_to) * pad_to
    B = len(group)
    ids = np.full((B, T), pad_id, np.int64)
    mask = np.zeros((B, T), np.uint8)
    lens = np.zeros(B, np.int64)
    starts = np.zeros(B, np.int64)
    for b, (i, mk, st) in enumerate(group):
        ids[b, :len(i)] = i
        mask[b, :len(mk)] = mk
        lens[b] = len(i)
        starts[b] = st
    t = lambda a: torch.from_numpy(a).to(device)
    return t(ids), t(mask), t(lens), t(starts)


def last_turn_start(mask):
    """First position of the last contiguous run of assistant tokens."""
    k = len(mask) - 1
    while k > 0 and not mask[k]:
        k -= 1
    while k > 0 and mask[k - 1]:
        k -= 1
    return k


# =============================================================================================
# export
# =============================================================================================

def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round to nearest even."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u >> 16) & 1) + 0x7FFF
    return ((u + r) >> 16).astype(np.uint16)


def save_bf16_safetensors(tensors: Dict[str, np.ndarray], path, metadata=None):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        blob = _bf16_bits(tensors[name]).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def export(m: DeepseekV41, config_path, out_dir, base_cfg, metadata=None):
    """Writes out_dir/{config.json, model.safetensors (bf16), token_map.npy}."""
    os.makedirs(out_dir, exist_ok=True)
    with open(config_path) as f:
        conf = json.load(f)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
        f.write("\n")
    sd = {k: v.detach().float().cpu().numpy() for k, v in m.state_dict().items()}
    save_bf16_safetensors(sd, os.path.join(out_dir, "model.safetensors"), metadata)
    np.save(os.path.join(out_dir, "token_map.npy"), np.arange(m.cfg.vocab_size, dtype=np.int64))


# =============================================================================================
# loss-curve PNG
# =============================================================================================

def write_png(path, series: Dict[str, List[float]], xs: List[float], title="", ylabel="loss"):
    """Line plot of each series against xs (log y; NaN values are left out). matplotlib when
    available, else a plain PNG."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for k, ys in series.items():
            ax.plot(xs[:len(ys)], ys, label=k, linewidth=1.2)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return "matplotlib"
    except ImportError:
        pass
    W, H, pad = 800, 450, 40
    img = np.full((H, W, 3), 255, np.uint8)
    img[H - pad, pad:W - pad] = 0
    img[pad:H - pad, pad] = 0
    colors = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
    allv = [math.log10(max(y, 1e-6)) for ys in series.values() for y in ys if y == y]  # NaN: no point
    if allv and xs:
        lo, hi = min(allv), max(allv)
        hi = hi if hi > lo else lo + 1
        x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
        for ci, ys in enumerate(series.values()):
            pts = [(pad + (x - x0) / (x1 - x0) * (W - 2 * pad),
                    H - pad - (math.log10(max(y, 1e-6)) - lo) / (hi - lo) * (H - 2 * pad))
                   for x, y in zip(xs, ys) if y == y]
            for (ax_, ay), (bx, by) in zip(pts, pts[1:]):
                n = int(max(abs(bx - ax_), abs(by - ay))) + 1
                for t in np.linspace(0, 1, n):
                    px, py = int(ax_ + t * (bx - ax_)), int(ay + t * (by - ay))
                    img[max(py - 1, 0):py + 1, max(px - 1, 0):px + 1] = colors[ci % 4]
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(H))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) \
        + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)
    return "png-writer"
