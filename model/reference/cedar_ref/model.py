"""PyTorch reference of the DeepSeek-V4.1 architecture (MODEL_SPEC.md; HF port semantics).

Owns: the layer modules (loaded under the official checkpoint tensor names), the forward
pass over a SequenceState, and the serving variants built on it:
  forward(ids, state)           full-stack rows at positions n_past.. (prefill, chunked
                                prefill, decode and training are all this one call)
  prefill_ced(ids, state)       CED prefill: every row through layers [0, fd) plus the decoder
                                KV source's compressor + index keys; only the last W rows
                                through layers [fd, L), their SWA limited to the tail
  resume_encoder_replay(p, ids) rebuild SWA windows from persisted global KV by re-running the
                                last W prefix rows with write_global=False
Does not own: codecs (quant.py), RoPE tables (rope.py), hashing (engram.py), state (state.py).

Shapes: B batch, T rows, hc streams, d hidden, H heads, D head_dim, E compressed entries,
Hi x Di indexer heads x dim. The residual X is [B, T, hc, d] fp32.

Per-forward context (`_Ctx`): positions [T] (absolute, shared by the batch), the state, the
`shared` dict (top-k mask and candidate pool of the latest index / candidate source in this
forward), write_global (False = replayed rows: the compressor is skipped and global KV is only
read), swa_min_pos (optional [T]: a row's SWA keys must have position >= it; bounded replay),
trace (optional dict, filled when given: "topk" {layer: bool [B,T,E]}, "candidates"
{layer: bool [B,T,E]}, "index_scores" {layer: [B,T,E] with -inf on invisible entries};
"layer_out" {layer: X} and "compressed_probs" {layer: head-summed attention mass on the
compressed entries [B,T,E]} only when those keys are present, e.g. trace={"layer_out": {}}).

Training: `model(ids)` with a fresh state runs the whole sequence causally (batch B); set
QuantFlags(ste=True) so the fake-quantisers pass gradients straight through; `swa_min_pos`
simulates bounded replay. The LM loss reaches no indexer parameter (top-k is integer): a
trainer adds the indexer KL from trace["index_scores"] vs trace["compressed_probs"].

`model.sparse_train = True` (the trainer's fast path) computes the same function without any
[T, T] or [T, E] tensor on the gradient path: sliding-window attention over a band of W keys
per row (fresh state, T > W), compressed attention over the k selected entries gathered per
row, index scores for selection under no_grad (torch.topk on a tie-breaking key) and
recomputed with gradients for the selected entries only. Its trace holds the sparse forms:
"topk_idx" {layer: long [B,T,k]}, "topk_valid" {layer: bool [B,T,k]}, "index_scores" and
"compressed_probs" {layer: [B,T,k]} aligned with topk_idx. Serving paths never set it.

`model.kl_teacher_topk = K > 0` (training, either path): the KL teacher becomes each index
layer's attention over every visible entry and the KL support the selection ∪ the teacher's top
K (Attention._kl_teacher); the trace then also holds "kl_support" {layer: bool} aligned with
"index_scores" (and "kl_idx" on the sparse path). The forward's values do not change.
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import quant as Q
from .config import ModelConfig
from .engram import NgramHasher
from .rope import RopeTables, apply_rope
from .state import SequenceState


@dataclass
class QuantFlags:
    fp8_swa: bool = True       # SWA KV: E4M3, UE8M0/32
    fp4_kv: bool = True        # compressed KV: E2M1, E4M3/16
    fp4_index_k: bool = True   # indexer keys: E2M1, UE8M0/32
    fp4_index_q: bool = True   # indexer queries: E2M1, UE8M0/32
    ste: bool = False          # straight-through gradients (training)

    @classmethod
    def off(cls):
        return cls(False, False, False, False)


_FQ = {"fp8_swa": Q.fake_quant_fp8_swa, "fp4_kv": Q.fake_quant_fp4_kv,
       "fp4_index_k": Q.fake_quant_fp4_index, "fp4_index_q": Q.fake_quant_fp4_index}


def stable_topk_indices(x, k):
    """Indices of the k largest along the last axis; exact ties go to the LOWER index."""
    return torch.sort(x, dim=-1, descending=True, stable=True)[1][..., :k]


def fast_topk_indices(x, k):
    """stable_topk_indices(x, k) (same indices, same order) through torch.topk on an int64 key:
    the fp32 value mapped to an order-preserving integer in the high half, E-1-index in the low
    half, so exact ties (±0 included) go to the lower index. x fp32 [..., E] without NaN."""
    E = x.shape[-1]
    bits = (x.float() + 0.0).contiguous().view(torch.int32).long()  # + 0.0: -0 -> +0
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = ordered * (1 << 32) + (E - 1 - torch.arange(E, device=x.device))
    return torch.topk(key, k, dim=-1)[1]


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _Ctx:
    def __init__(self, model, state, positions, write_global, trace, swa_min_pos):
        self.model = model
        self.state = state
        self.positions = positions
        self.write_global = write_global
        self.trace = trace
        self.swa_min_pos = swa_min_pos
        self.shared = {}
        self._rope = {}

    def rope(self, kind, positions=None):
        if positions is None:
            if kind not in self._rope:
                self._rope[kind] = self.model.rope.cos_sin(kind, self.positions)
            return self._rope[kind]
        return self.model.rope.cos_sin(kind, positions)

    def fq(self, x, which):
        flags = self.model.quant
        if not getattr(flags, which):
            return x
        if flags.ste:
            return Q.ste(x, _FQ[which])
        return _FQ[which](x)


# =============================================================================================
# CSA2: compressor and indexer
# =============================================================================================

class Compressor(nn.Module):
    """KV-source layers only. Ratio 2: gated pooling of aligned pairs; ratio 1: projection."""

    def __init__(self, cfg, layer):
        super().__init__()
        self.ratio = cfg.compress_ratios[layer]
        D = cfg.head_dim
        self.wkv = nn.Linear(cfg.hidden_size, D, bias=False)
        if self.ratio > 1:
            self.wgate = nn.Linear(cfg.hidden_size, D, bias=False)
        self.norm = RMSNorm(D, cfg.rms_norm_eps)

    def forward(self, x, src):
        """x [B, T, d] -> (latent [B, G, D] pre-RoPE or None, position of group 0)."""
        m = self.ratio
        first = src.n_entries * m
        if m == 1:
            return self.norm(self.wkv(x)), first
        kv = F.linear(x.float(), self.wkv.weight.float())
        gate = F.linear(x.float(), self.wgate.weight.float())
        kv = torch.cat([src.pending_kv, kv], 1)
        gate = torch.cat([src.pending_gate, gate], 1)
        usable = (kv.shape[1] // m) * m
        src.pending_kv, src.pending_gate = kv[:, usable:], gate[:, usable:]
        if usable == 0:
            return None, first
        B, D = kv.shape[0], kv.shape[-1]
        kv = kv[:, :usable].view(B, usable // m, m, D)
        gate = gate[:, :usable].view(B, usable // m, m, D)
        latent = (kv * gate.softmax(dim=2)).sum(2)
        return self.norm(latent), first


class Indexer(nn.Module):
    """Index-source layers. Owns keys (wk, k_norm) only on KV sources (Full mode)."""

    def __init__(self, cfg, layer):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.ratio = cfg.compress_ratios[layer]
        self.owns_k = layer in cfg.kv_source_layer_ids
        self.is_candidate_source = layer == cfg.candidate_source_layer_id
        self.uses_candidates = 0 <= cfg.candidate_source_layer_id < layer
        Hi, Di = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b = nn.Linear(cfg.q_lora_rank, Hi * Di, bias=False)
        self.weights_proj = nn.Linear(cfg.hidden_size, Hi, bias=False)
        if self.owns_k:
            self.wk = nn.Linear(cfg.head_dim, Di, bias=False)
            self.k_norm = RMSNorm(Di, cfg.rms_norm_eps)

    def write_keys(self, latent, first, src, ctx):
        """Append the keys of freshly completed groups: FP4(RoPE_c(k_norm(wk latent)), j*m)."""
        k = self.k_norm(self.wk(latent))
        pos = first + self.ratio * torch.arange(latent.shape[1], device=latent.device)
        cos, sin = ctx.rope("compress", pos)
        k = ctx.fq(apply_rope(k, cos, sin), "fp4_index_k")
        src.index_k = torch.cat([src.index_k, k], 1)

    def forward(self, x, qr, src, ctx):
        """Publishes ctx.shared['topk'] = bool [B, T, E] (None when no entries exist yet)."""
        cfg = self.cfg
        E = src.index_k.shape[1]
        if E == 0:
            ctx.shared["topk"] = None
            ctx.shared["topk_idx"] = None
            return
        if ctx.model.sparse_train:
            return self._forward_sparse(x, qr, src, ctx)
        B, T, _ = x.shape
        Hi, Di = cfg.index_n_heads, cfg.index_head_dim
        cos, sin = ctx.rope("compress")
        q = apply_rope(self.wq_b(qr).view(B, T, Hi, Di), cos, sin)
        q = ctx.fq(q, "fp4_index_q")
        s = torch.einsum("bthd,bed->bthe", q.float(), src.index_k.float()).relu() * Di ** -0.5
        w = self.weights_proj(x).float() * Hi ** -0.5
        score = (s * w.unsqueeze(-1)).sum(2)  # [B, T, E]
        lens = (ctx.positions.long() + 1) // self.ratio  # [T]: entries visible to each row
        visible = torch.arange(E, device=x.device)[None, :] < lens[:, None]
        score = score.masked_fill(~visible, float("-inf"))
        if ctx.trace is not None:  # indexer scores over visible entries (trainer KL student)
            ctx.trace.setdefault("index_scores", {})[self.layer] = score
        if self.is_candidate_source:
            cand = select_candidate_blocks(score, lens, cfg.candidate_topk_blocks,
                                           cfg.candidate_block_size)
            ctx.shared["candidates"] = cand
            if ctx.trace is not None:
                ctx.trace.setdefault("candidates", {})[self.layer] = cand
        elif self.uses_candidates and ctx.shared.get("candidates") is not None:
            score = score.masked_fill(~ctx.shared["candidates"], float("-inf"))
        k = min(cfg.index_topk, E)
        idx = stable_topk_indices(score, k)
        valid = score.gather(-1, idx) > float("-inf")
        sel = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, idx, valid)
        ctx.shared["topk"] = sel
        if ctx.trace is not None:
            ctx.trace.setdefault("topk", {})[self.layer] = sel


    def _forward_sparse(self, x, qr, src, ctx):
        """Training path: selection without gradients over [B, T, E], then the selected
        entries' scores recomputed with gradients ([B, T, k]) for the indexer KL."""
        cfg = self.cfg
        E = src.index_k.shape[1]
        B, T, _ = x.shape
        Hi, Di = cfg.index_n_heads, cfg.index_head_dim
        cos, sin = ctx.rope("compress")
        q = ctx.fq(apply_rope(self.wq_b(qr).view(B, T, Hi, Di), cos, sin), "fp4_index_q")
        w = self.weights_proj(x).float() * Hi ** -0.5                    # [B, T, Hi]
        lens = (ctx.positions.long() + 1) // self.ratio
        k = min(cfg.index_topk, E)
        with torch.no_grad():
            score = torch.einsum("bthd,bed->bthe", q.to(src.index_k.dtype), src.index_k).float()
            score = (score.relu_() * (w.unsqueeze(-1) * Di ** -0.5)).sum(2)  # [B, T, E]
            visible = torch.arange(E, device=x.device)[None, :] < lens[:, None]
            score.masked_fill_(~visible, float("-inf"))
            if self.is_candidate_source:
                ctx.shared["candidates"] = select_candidate_blocks(
                    score, lens, cfg.candidate_topk_blocks, cfg.candidate_block_size)
            elif self.uses_candidates and ctx.shared.get("candidates") is not None:
                score.masked_fill_(~ctx.shared["candidates"], float("-inf"))
            idx = fast_topk_indices(score, k)
            valid = score.gather(-1, idx) > float("-inf")
            del score
        ctx.shared["topk"] = None
        ctx.shared["topk_idx"], ctx.shared["topk_valid"] = idx, valid
        if ctx.trace is not None:
            ctx.shared["index_qw"] = (q, w)  # for scores_at on a wider KL support (teacher top-k)
            ctx.trace.setdefault("index_scores", {})[self.layer] = self.scores_at(q, w, src, idx, valid)
            ctx.trace.setdefault("topk_idx", {})[self.layer] = idx
            ctx.trace.setdefault("topk_valid", {})[self.layer] = valid

    def scores_at(self, q, w, src, idx, valid):
        """Index scores, with gradients, of the entries idx [B, T, n] (-inf where not valid),
        from the rotated queries q [B, T, Hi, Di] and head weights w [B, T, Hi]."""
        B, Di = q.shape[0], self.cfg.index_head_dim
        kg = src.index_k[torch.arange(B, device=q.device)[:, None, None], idx]   # [B, T, n, Di]
        s = torch.einsum("bthd,btkd->bthk", q.float(), kg.float()).relu() * Di ** -0.5
        return (s * w.unsqueeze(-1)).sum(2).masked_fill(~valid, float("-inf"))


def select_candidate_blocks(score, lens, topk_blocks, block):
    """Candidate pool: blocks of `block` entries scored by their max, the block holding the
    row's newest visible entry forced in, top `topk_blocks` kept (-inf picks dropped).
    score [B, T, E], lens [T] -> bool [B, T, E]."""
    E = score.shape[-1]
    padded = F.pad(score, (0, -E % block), value=float("-inf"))
    bs = padded.unflatten(-1, (-1, block)).amax(-1)  # [B, T, nb]
    nb = bs.shape[-1]
    last = (lens - 1).div(block, rounding_mode="floor")  # [T]
    force = torch.arange(nb, device=score.device)[None, :] == last[:, None]
    bs = bs.masked_fill(force.unsqueeze(0), float("inf"))
    idx = stable_topk_indices(bs, min(topk_blocks, nb))
    keep = torch.zeros_like(bs, dtype=torch.bool).scatter_(-1, idx, bs.gather(-1, idx) > float("-inf"))
    return keep.repeat_interleave(block, dim=-1)[..., :E]


# =============================================================================================
# attention
# =============================================================================================

class Attention(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.ratio = cfg.compress_ratios[layer]
        self.rope_kind = "compress" if self.ratio else "main"
        H, D, d = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
        self.wq_a = nn.Linear(d, cfg.q_lora_rank, bias=False)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.wq_b = nn.Linear(cfg.q_lora_rank, H * D, bias=False)
        self.wkv = nn.Linear(d, D, bias=False)
        self.kv_norm = RMSNorm(D, cfg.rms_norm_eps)
        # block-diagonal: group g maps its H*D/G slice to o_lora_rank; weight [G*r, H*D/G]
        self.wo_a = nn.Linear(H * D // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank, bias=False)
        self.wo_b = nn.Linear(cfg.o_groups * cfg.o_lora_rank, d, bias=False)
        self.attn_sink = nn.Parameter(torch.zeros(H))
        self.compressor = Compressor(cfg, layer) if layer in cfg.kv_source_layer_ids else None
        self.indexer = Indexer(cfg, layer) if layer in cfg.index_source_layer_ids else None

    def write_global(self, x, src, ctx):
        """KV-source layers: run the compressor over x [B, T, d], append index keys and
        FP4(RoPE_c(latent)) main entries for every group completed by these rows."""
        latent, first = self.compressor(x, src)
        if latent is None:
            return
        self.indexer.write_keys(latent, first, src, ctx)
        pos = first + self.ratio * torch.arange(latent.shape[1], device=x.device)
        cos, sin = ctx.rope("compress", pos)
        src.kv = torch.cat([src.kv, ctx.fq(apply_rope(latent, cos, sin), "fp4_kv")], 1)

    def _kl_teacher(self, qf, s_win, src, ctx):
        """The indexer-KL teacher over EVERY visible compressed entry (TRAINING_NOTES §1; MG
        CSA2): this layer's queries against all visible entries (the candidate pool on Reindex
        layers) in one softmax with the window logits s_win [B, H, T, n] (masked) and the sink,
        head-summed mass on the compressed entries. The KL support becomes the selection ∪ the
        teacher's top `model.kl_teacher_topk` entries, so the indexer also learns of entries the
        attention would weigh but the selection missed (with the selection alone as support it
        only re-ranks what it already picks). No gradients; chunked over rows. Sets this layer's
        trace "compressed_probs" (the teacher's mass), "kl_support" and, on the sparse path,
        "index_scores" re-scored over the wider support (aligned with "kl_idx")."""
        l = self.layer
        B, T, H, D = qf.shape
        kv = src.kv.float()                                                 # [B, E, D]
        E = kv.shape[1]
        kt = min(ctx.model.kl_teacher_topk, E)
        lens = (ctx.positions.long() + 1) // self.ratio
        visible = torch.arange(E, device=qf.device)[None, :] < lens[:, None]    # [T, E]
        cand = ctx.shared.get("candidates") if self.indexer.uses_candidates else None
        pool_check = cand is not None and ctx.model.pool_check
        sparse = ctx.shared.get("topk_idx") is not None and ctx.model.sparse_train
        neg = float("-inf")
        with torch.no_grad():
            lse_win = torch.logsumexp(s_win.float(), -1)                    # [B, H, T]
            sink = self.attn_sink.float().view(1, H, 1, 1)
            step = max(1, (1 << 25) // max(1, B * H * E))
            out_p, out_i, out_v, out_s = [], [], [], []
            for t0 in range(0, T, step):
                t1 = min(T, t0 + step)
                s = torch.einsum("bthd,bed->bhte", qf[:, t0:t1], kv) * D ** -0.5
                keep = visible[None, t0:t1] if cand is None else visible[None, t0:t1] & cand[:, t0:t1]
                pool = torch.full((B, t1 - t0), -1.0, device=qf.device)  # -1: not measured
                if cand is None:
                    pool.fill_(1.0)  # no pool: every visible entry is a candidate
                elif pool_check:  # the same softmax with the pool restriction lifted
                    sa = s.masked_fill(~visible[None, None, t0:t1], neg)
                    da = torch.logsumexp(torch.stack([lse_win[:, :, t0:t1], torch.logsumexp(sa, -1),
                                                      sink[..., 0].expand(B, H, t1 - t0)], -1), -1)
                    ma = torch.exp(sa - da[..., None]).sum(1)                  # [B, tc, E]
                    pool = (ma * cand[:, t0:t1]).sum(-1) / ma.sum(-1).clamp_min(1e-30)
                s = s.masked_fill(~keep[:, None], neg)
                den = torch.logsumexp(torch.stack([lse_win[:, :, t0:t1], torch.logsumexp(s, -1),
                                                   sink[..., 0].expand(B, H, t1 - t0)], -1), -1)
                mass = torch.exp(s - den[..., None]).sum(1)                  # [B, tc, E]
                tidx = fast_topk_indices(mass, kt)
                tval = mass.gather(-1, tidx) > 0
                if sparse:
                    idx = ctx.shared["topk_idx"][:, t0:t1]
                    val = ctx.shared["topk_valid"][:, t0:t1]
                    dup = ((tidx[..., :, None] == idx[..., None, :]) & val[..., None, :]).any(-1)
                    uidx = torch.cat([idx, tidx], -1)
                    uval = torch.cat([val, tval & ~dup], -1)
                    out_p.append(mass.gather(-1, uidx) * uval)
                    out_i.append(uidx)
                    out_v.append(uval)
                    captured = (mass.gather(-1, idx) * val).sum(-1)
                    top_in_sel = (tval & dup).sum(-1)
                else:
                    sel = ctx.shared["topk"][:, t0:t1]
                    tsel = torch.zeros_like(sel).scatter_(-1, tidx, tval)
                    out_p.append(mass)
                    out_v.append(sel | tsel)
                    captured = (mass * sel).sum(-1)
                    top_in_sel = (tsel & sel).sum(-1)
                # the check of TRAINING_NOTES §1 per row: teacher mass the selection holds, and
                # how many of the teacher's top entries it holds (random: k / visible)
                out_s.append(torch.stack([mass.sum(-1), captured, top_in_sel.float(), tval.sum(-1).float(),
                                          keep.sum(-1).float().expand(B, t1 - t0),
                                          (mass.gather(-1, tidx) * tval).sum(-1), pool], -1))
            p, support = torch.cat(out_p, 1), torch.cat(out_v, 1)
        ctx.trace["compressed_probs"][l] = p
        ctx.trace.setdefault("kl_support", {})[l] = support
        # [B, T, 7]: teacher mass on all visible entries, on the selection, teacher top-K entries
        # in the selection, teacher top-K entries (mass > 0), visible entries, mass on the top K,
        # the pool's share of the unrestricted attention (1: no pool; -1: not measured)
        ctx.trace.setdefault("kl_teacher_stats", {})[l] = torch.cat(out_s, 1)
        if sparse:
            uidx = torch.cat(out_i, 1)
            q, w = ctx.shared["index_qw"]
            ctx.trace["index_scores"][l] = self.indexer.scores_at(q, w, src, uidx, support)
            ctx.trace.setdefault("kl_idx", {})[l] = uidx

    def forward(self, x, ctx):
        cfg, l = self.cfg, self.layer
        B, T, _ = x.shape
        H, D, W = cfg.num_attention_heads, cfg.head_dim, cfg.sliding_window
        pos = ctx.positions
        cos, sin = ctx.rope(self.rope_kind)

        qr = self.q_norm(self.wq_a(x))                                     # [B, T, q_lora]
        q = apply_rope(self.wq_b(qr).view(B, T, H, D), cos, sin)          # [B, T, H, D]
        kv = ctx.fq(apply_rope(self.kv_norm(self.wkv(x)), cos, sin), "fp8_swa")  # [B, T, D]

        # ---- sliding window: past rows of this layer + these rows ----
        st = ctx.state
        keys = torch.cat([st.swa_kv[l], kv], 1)                            # [B, P+T, D]
        kpos = torch.cat([st.swa_pos[l], pos])
        keep = max(W - 1, 0)
        st.swa_kv[l] = keys[:, keys.shape[1] - keep:] if keep else keys[:, :0]
        st.swa_pos[l] = kpos[kpos.shape[0] - keep:] if keep else kpos[:0]
        banded = ctx.model.sparse_train and keys.shape[1] == T and T > W
        if not banded:
            win = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - W)
            if ctx.swa_min_pos is not None:
                win = win & (kpos[None, :] >= ctx.swa_min_pos[:, None])

        # ---- global branch ----
        ckv, sel, gathered = None, None, False
        if self.ratio:
            src = st.sources[cfg.kv_source_of(l)]
            if self.compressor is not None and ctx.write_global:
                self.write_global(x, src, ctx)
            if self.indexer is not None:
                self.indexer(x, qr, src, ctx)
            if ctx.model.sparse_train and ctx.shared.get("topk_idx") is not None:
                # the k selected entries of every row, gathered: [B, T, k, D]
                idx, sel = ctx.shared["topk_idx"], ctx.shared["topk_valid"]
                ckv = src.kv[torch.arange(B, device=x.device)[:, None, None], idx]
                gathered = True
            else:
                sel = ctx.shared.get("topk")
                if sel is not None:
                    if sel.shape[-1] != src.n_entries:
                        raise RuntimeError(f"layer {l}: top-k covers {sel.shape[-1]} entries, its KV "
                                           f"source has {src.n_entries}")
                    ckv = src.kv

        # ---- one softmax over window + selected entries + per-head sink ----
        scale = D ** -0.5
        qf = q.float()
        if banded:  # row t's window = keys t-W+1 .. t: [B, T, D, W], missing keys masked
            kw = F.pad(keys, (0, 0, W - 1, 0)).unfold(1, W, 1).float()
            wpos = pos[:, None] - (W - 1) + torch.arange(W, device=pos.device)[None, :]
            win = wpos >= pos[0]
            if ctx.swa_min_pos is not None:
                win = win & (wpos >= ctx.swa_min_pos[:, None])
            s_win = torch.einsum("bthd,btdw->bhtw", qf, kw) * scale
        else:
            s_win = torch.einsum("bthd,bsd->bhts", qf, keys.float()) * scale
        s_win = s_win.masked_fill(~win[None, None], float("-inf"))
        teach = (self.indexer is not None and ckv is not None and ctx.trace is not None
                 and "compressed_probs" in ctx.trace and ctx.model.kl_teacher_topk > 0)
        if teach:
            self._kl_teacher(qf, s_win, src, ctx)
        parts = [s_win]
        if ckv is not None:
            if gathered:
                s_c = torch.einsum("bthd,btkd->bhtk", qf, ckv.float()) * scale
            else:
                s_c = torch.einsum("bthd,bed->bhte", qf, ckv.float()) * scale
            parts.append(s_c.masked_fill(~sel[:, None], float("-inf")))
        parts.append(self.attn_sink.float().view(1, H, 1, 1).expand(B, H, T, 1))
        logits = torch.cat(parts, -1)
        probs = torch.softmax(logits - logits.amax(-1, keepdim=True), -1)
        n_win = s_win.shape[-1]
        if banded:
            o = torch.einsum("bhtw,btdw->bthd", probs[..., :n_win], kw)
        else:
            o = torch.einsum("bhts,bsd->bthd", probs[..., :n_win], keys.float())
        if ckv is not None:
            eq = "bhtk,btkd->bthd" if gathered else "bhte,bed->bthd"
            o = o + torch.einsum(eq, probs[..., n_win:-1], ckv.float())

        # ---- inverse RoPE at the query position, grouped output projection ----
        if ckv is not None and ctx.trace is not None and "compressed_probs" in ctx.trace and not teach:
            # head-summed attention mass on the compressed entries (indexer KL teacher)
            ctx.trace["compressed_probs"][l] = probs[..., n_win:-1].sum(1)  # [B, T, E]
        o = apply_rope(o, cos, sin, inverse=True)
        G = cfg.o_groups
        og = o.reshape(B, T, G, -1)                                         # [B, T, G, H*D/G]
        wa = self.wo_a.weight.view(G, cfg.o_lora_rank, -1)                  # [G, r, H*D/G]
        y = torch.einsum("btgi,gri->btgr", og, wa).reshape(B, T, -1)        # [B, T, G*r]
        return self.wo_b(y)


# =============================================================================================
# MoE, Engram, block
# =============================================================================================

class Expert(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, f = cfg.hidden_size, cfg.moe_intermediate_size
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)
        self.limit = cfg.swiglu_limit

    def forward(self, x, weight=None):
        gate = self.w1(x).float()
        up = self.w3(x).float()
        if self.limit > 0:
            up = up.clamp(-self.limit, self.limit)
            gate = gate.clamp(max=self.limit)
        y = F.silu(gate) * up
        if weight is not None:
            y = weight * y
        return self.w2(y.to(x.dtype))


class Gate(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        E = cfg.n_routed_experts
        self.cfg = cfg
        self.weight = nn.Parameter(torch.zeros(E, cfg.hidden_size))
        self.bias = nn.Parameter(torch.zeros(E))
        self.bias_vl = nn.Parameter(torch.zeros(E))

    def forward(self, flat):
        cfg = self.cfg
        scores = torch.sqrt(F.softplus(F.linear(flat.float(), self.weight.float()) / cfg.gate_temp))
        idx = stable_topk_indices(scores + self.bias.float(), cfg.num_experts_per_tok)
        w = scores.gather(1, idx)
        if cfg.norm_topk_prob and cfg.num_experts_per_tok > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return w * cfg.routed_scaling_factor, idx


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList([Expert(cfg) for _ in range(cfg.n_routed_experts)])
        self.shared_experts = Expert(cfg)

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        w, idx = self.gate(flat)
        y = torch.zeros_like(flat, dtype=torch.float32)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(idx == e)
            if rows.numel():
                y.index_add_(0, rows, expert(flat[rows], w[rows, slot, None]).float())
        y = y + self.shared_experts(flat).float()
        return y.view(shape)


class EngramEmbed(nn.Module):
    def __init__(self, n, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n, dim))
        self.scale = nn.Parameter(torch.ones(n, dim // 32))  # per-32 E8M0 scales; unused in fp32


class Engram(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.cfg = cfg
        self.index = cfg.engram_layer_ids.index(layer)
        ncols = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads
        self.embed = EngramEmbed(cfg.engram_num_embeddings[self.index], cfg.engram_head_dim)
        self.wkv = nn.Linear(ncols * cfg.engram_head_dim, cfg.hidden_size * (cfg.hc_mult + 1),
                             bias=False)
        self.q_weight = nn.Parameter(torch.ones(cfg.hc_mult, cfg.hidden_size))
        self.k_weight = nn.Parameter(torch.ones(cfg.hc_mult, cfg.hidden_size))

    def forward(self, X, hash_ids):
        """X [B, T, hc, d], hash_ids [B, T, ncols] -> X + gate * value."""
        cfg = self.cfg
        d, hc = cfg.hidden_size, cfg.hc_mult
        rows = F.embedding(hash_ids, self.embed.weight).flatten(-2)        # [B, T, ncols*hd]
        kv = self.wkv(rows)
        key, value = kv.split([hc * d, d], -1)
        key = key.float().unflatten(-1, (hc, d))
        wt = self.q_weight.float() * self.k_weight.float()
        h = X.float()
        eps = cfg.rms_norm_eps
        rstd = torch.rsqrt(h.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
        dot = (h * wt * key).sum(-1) * rstd * d ** -0.5
        gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
        return h + gate.unsqueeze(-1) * value.float().unsqueeze(-2)


def sinkhorn_eager(comb, iters, eps):
    """mHC's Sinkhorn normalisation of comb [..., hc, hc]: columns, then (rows, columns) x
    (iters - 1), each x / (sum + eps). The definition; `sinkhorn` computes the same values."""
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return comb


class _Sinkhorn(torch.autograd.Function):
    """sinkhorn_eager's ops in the same order (bit-identical values) without recording 2*iters-1
    autograd nodes; the backward applies each normalisation's vector-Jacobian product in reverse:
    y = x / (sum_a x + eps)  =>  dx = (dy - sum_a(dy * y)) / (sum_a x + eps): 4 ops per
    normalisation where autograd ran ~8. With 20 iterations on every block's two mixes, Sinkhorn
    was about a third of a training step's ops (~10 K of 31.8 K, counted on the CPU)."""

    @staticmethod
    def forward(ctx, comb, iters, eps):
        axes = [-2] + [-1, -2] * (iters - 1)
        saved = []
        for a in axes:
            den = comb.sum(a, keepdim=True) + eps
            comb = comb / den
            saved += [comb, den]
        ctx.axes = axes
        ctx.save_for_backward(*saved)
        return comb

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        for i in range(len(ctx.axes) - 1, -1, -1):
            y, den = saved[2 * i], saved[2 * i + 1]
            g = (g - (g * y).sum(ctx.axes[i], keepdim=True)) / den
        return g, None, None


def sinkhorn(comb, iters, eps):
    """Sinkhorn for the model: the custom backward when a gradient is wanted."""
    if torch.is_grad_enabled() and comb.requires_grad:
        return _Sinkhorn.apply(comb, iters, eps)
    return sinkhorn_eager(comb, iters, eps)


class Block(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        d, hc = cfg.hidden_size, cfg.hc_mult
        self.attn = Attention(cfg, layer)
        self.ffn = MoE(cfg)
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.engram = Engram(cfg, layer) if layer in cfg.engram_layer_ids else None
        mix = (2 + hc) * hc
        self.hc_attn_fn = nn.Parameter(torch.zeros(mix, hc * d))
        self.hc_attn_base = nn.Parameter(torch.zeros(mix))
        self.hc_attn_scale = nn.Parameter(torch.ones(3))
        self.hc_ffn_fn = nn.Parameter(torch.zeros(mix, hc * d))
        self.hc_ffn_base = nn.Parameter(torch.zeros(mix))
        self.hc_ffn_scale = nn.Parameter(torch.ones(3))

    def hc_mixes(self, X, fn, scale, base):
        """X [B, T, hc, d] -> pre [B,T,hc], post [B,T,hc], comb [B,T,hc,hc] (Sinkhorn)."""
        cfg, hc = self.cfg, self.cfg.hc_mult
        flat = X.flatten(2).float()
        flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + cfg.rms_norm_eps)
        m = F.linear(flat, fn.float())
        pre = torch.sigmoid(m[..., :hc] * scale[0] + base[:hc]) + cfg.hc_eps
        post = 2 * torch.sigmoid(m[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
        logits = (m[..., 2 * hc:] * scale[2] + base[2 * hc:]).view(*m.shape[:-1], hc, hc)
        comb = sinkhorn(torch.softmax(logits, -1) + cfg.hc_eps, cfg.hc_sinkhorn_iters, cfg.hc_eps)
        return pre, post, comb

    @staticmethod
    def collapse(X, pre):
        return (pre.unsqueeze(-1) * X.float()).sum(2)

    @staticmethod
    def expand(y, X, post, comb):
        mixed = torch.einsum("btjk,btjd->btkd", comb.float(), X.float())
        return post.unsqueeze(-1) * y.float().unsqueeze(-2) + mixed

    def attn_input(self, X, pre_prev):
        return self.attn_norm(self.collapse(X, pre_prev))

    def forward(self, X, pre_prev, hash_ids, ctx):
        if self.engram is not None:
            X = self.engram(X, hash_ids[:, :, self.engram.index])
        a_pre, a_post, a_comb = self.hc_mixes(X, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base)
        y = self.attn(self.attn_input(X, pre_prev), ctx)
        X = self.expand(y, X, a_post, a_comb)
        f_pre, f_post, f_comb = self.hc_mixes(X, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base)
        y = self.ffn(self.ffn_norm(self.collapse(X, a_pre)))
        X = self.expand(y, X, f_post, f_comb)
        return X, f_pre


# =============================================================================================
# the model
# =============================================================================================

class DeepseekV41(nn.Module):
    def __init__(self, cfg: ModelConfig, quant: QuantFlags = None, token_map=None):
        super().__init__()
        self.cfg = cfg
        self.quant = quant or QuantFlags()
        self.sparse_train = False  # the trainer's fast path (see the module docstring)
        self.kl_teacher_topk = 0   # > 0: indexer-KL teacher over all visible entries (Attention._kl_teacher)
        self.pool_check = False    # with the teacher: also the pool's share of a Reindex layer's
        #                            attention over every visible entry, pool or not (diagnostics)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Block(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = RopeTables(cfg)
        self.hasher = None
        if cfg.engram_layer_ids:
            if token_map is None:
                raise ValueError("engram layers need a token_map (token id -> compressed id)")
            self.hasher = NgramHasher(cfg, token_map)

    # ---- loading --------------------------------------------------------------------------
    def load_official(self, tensors):
        """tensors: dict official name -> numpy/torch array. Strict: every name must match."""
        sd = {k: torch.as_tensor(np.asarray(v)) for k, v in tensors.items()}
        missing, unexpected = self.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise ValueError(f"checkpoint mismatch: missing {missing[:8]}, unexpected {unexpected[:8]}")
        return self

    def new_state(self, batch=1):
        return SequenceState(self.cfg, batch, self.head.weight.device)

    # ---- pieces ---------------------------------------------------------------------------
    def _embed(self, ids, positions, state):
        """-> X [B, T, hc, d] (hc copies), pre one-hot [B, T, hc], hash ids or None."""
        e = self.embed(ids).float()
        X = e.unsqueeze(2).expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        pre = torch.zeros(*X.shape[:-1], device=X.device)
        pre[..., 0] = 1.0
        hash_ids = None
        if self.hasher is not None:
            state.write_engram(positions, self.hasher.compress(ids))
            hash_ids = self.hasher.hash(state.engram_hist, positions)
        return X, pre, hash_ids

    def _run(self, X, pre, hash_ids, ctx, lo, hi):
        for l in range(lo, hi):
            X, pre = self.layers[l](X, pre, hash_ids, ctx)
            if ctx.trace is not None and "layer_out" in ctx.trace:
                ctx.trace["layer_out"][l] = X
        return X, pre

    def _head(self, X, pre):
        return self.head(self.norm(Block.collapse(X, pre))).float()

    def _positions(self, state, T, start=None):
        s = state.n_past if start is None else start
        return torch.arange(s, s + T, device=self.head.weight.device)

    # ---- public paths -----------------------------------------------------------------------
    def forward(self, ids, state=None, trace=None, swa_min_pos=None):
        """Full-stack rows ids [B, T] at positions state.n_past.. -> logits [B, T, V].
        With state=None a fresh state is used (training / one-shot scoring)."""
        state = state if state is not None else self.new_state(ids.shape[0])
        pos = self._positions(state, ids.shape[1])
        ctx = _Ctx(self, state, pos, True, trace, swa_min_pos)
        X, pre, h = self._embed(ids, pos, state)
        X, pre = self._run(X, pre, h, ctx, 0, self.cfg.num_hidden_layers)
        state.n_past += ids.shape[1]
        return self._head(X, pre)

    def check_ced(self):
        fd = self.cfg.first_decoder_layer
        late = [l for l in self.cfg.engram_layer_ids if l >= fd]
        if late:
            raise ValueError(f"CED prefill impossible: Engram layers {late} sit at or after the "
                             f"decoder KV source {fd}")
        if fd + 1 > self.cfg.num_hidden_layers:
            raise ValueError("CED prefill impossible: no layer follows the decoder KV source")

    def prefill_ced(self, ids, state, trace=None, n_tail=None):
        """CED prefill of ids [B, T] -> logits of the last n_tail rows [B, n_tail, V]
        (n_tail defaults to sliding_window). Global KV and encoder state are exact; the decoder
        layers see only the tail rows (decoder bounded replay)."""
        self.check_ced()
        cfg = self.cfg
        fd, L = cfg.first_decoder_layer, cfg.num_hidden_layers
        T = ids.shape[1]
        n = min(n_tail or cfg.sliding_window, T)
        pos = self._positions(state, T)
        ctx = _Ctx(self, state, pos, True, trace, None)
        X, pre, h = self._embed(ids, pos, state)
        X, pre = self._run(X, pre, h, ctx, 0, fd)
        # the decoder KV source's compressor + index-key projection over every row
        attn = self.layers[fd].attn
        attn.write_global(self.layers[fd].attn_input(X, pre), state.sources[fd], ctx)
        tail_pos = pos[T - n:]
        tctx = _Ctx(self, state, tail_pos, False, trace,
                    torch.full_like(tail_pos, int(tail_pos[0])))
        Xt, pret = self._run(X[:, T - n:], pre[:, T - n:], None, tctx, fd, L)
        state.n_past += T
        return self._head(Xt, pret)

    def replay(self, ids, state, start, swa_min=None):
        """Re-run rows ids [B, R] at positions start.. through every layer without writing
        global KV (their SWA sees only rows >= swa_min, default start). Rebuilds SWA windows."""
        pos = self._positions(state, ids.shape[1], start)
        lo = start if swa_min is None else swa_min
        ctx = _Ctx(self, state, pos, False, None, torch.full_like(pos, lo))
        X, pre, h = self._embed(ids, pos, state)
        self._run(X, pre, h, ctx, 0, self.cfg.num_hidden_layers)

    def resume_encoder_replay(self, persisted, prefix_ids):
        """Encoder SWA bounded replay: new state from persisted global KV; the last W prefix
        tokens (prefix_ids [B, N], N == persisted.n_past) are replayed to rebuild every
        layer's SWA window. Their Engram look-back comes from prefix_ids."""
        cfg = self.cfg
        N = prefix_ids.shape[1]
        if N != persisted.n_past:
            raise ValueError(f"prefix has {N} tokens, persisted KV covers {persisted.n_past}")
        state = SequenceState.from_persisted(cfg, persisted, self.head.weight.device)
        start = max(0, N - cfg.sliding_window)
        if self.hasher is not None:
            back = max(0, start - (cfg.engram_max_ngram_size - 1))
            p = torch.arange(back, start, device=state.device)
            if p.numel():
                state.write_engram(p, self.hasher.compress(prefix_ids[:, back:start]))
        if N > start:
            self.replay(prefix_ids[:, start:], state, start)
        return state


def load_model(model_dir, quant=None, token_map=None):
    """Load config.json + model.safetensors (+ engram/token_map.npy or token_map.npy)."""
    import os
    from .safetensors_io import load_file
    cfg = ModelConfig.from_json(os.path.join(model_dir, "config.json"))
    if token_map is None and cfg.engram_layer_ids:
        for rel in ("engram/token_map.npy", "token_map.npy"):
            p = os.path.join(model_dir, rel)
            if os.path.exists(p):
                token_map = np.load(p)
                break
    model = DeepseekV41(cfg, quant, token_map)
    model.load_official(load_file(os.path.join(model_dir, "model.safetensors")))
    return model.eval()
