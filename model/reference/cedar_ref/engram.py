"""Engram n-gram hashing of DeepSeek-V4.1 (token ids -> table row ids), derived from the HF
port's `DeepseekV41NgramHashState` / `EngramLayout` / `compute_hash_multipliers`.

Per engram layer e and position t:
  tok[s] = token_map[id at t-s] for s = 0..N-1 (N = engram_max_ngram_size); once a look-back
           crosses the sequence start or an unknown (DEAD) position, it and every later
           look-back become pad = token_map[engram_pad_id];
  prod[s] = tok[s] * mult[e][s]   (int64; mult from numpy PCG64 seeded 10007*layer_id, odd);
  rolling = prod[0]; for n = 2..N: rolling ^= prod[n-1];
           row[(n-2)*heads + h] = rolling % primes[e][n-2][h] + offsets[e][(n-2)*heads + h]
The primes are drawn in order above engram_vocab_size - 1, never reused across layers/n/heads;
offsets are the running sums of one layer's primes in flat (n, head) order.
"""

import numpy as np
import torch

DEAD = -1


def _is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0:
            return False
        i += 2
    return True


def engram_primes(cfg):
    """-> list[layer][n-1][head] of ints."""
    seen, out = set(), []
    for _ in cfg.engram_layer_ids:
        per_n = []
        for _ in range(cfg.engram_max_ngram_size - 1):
            sizes, cur = [], cfg.engram_vocab_size - 1
            for _ in range(cfg.engram_n_heads):
                cur += 1
                while not _is_prime(cur) or cur in seen:
                    cur += 1
                seen.add(cur)
                sizes.append(cur)
            per_n.append(sizes)
        out.append(per_n)
    return out


def engram_multipliers(cfg):
    """-> int64 array [n_layers, N]."""
    bound = max(1, (np.iinfo(np.int64).max // cfg.engram_compressed_vocab_size) // 2)
    rows = []
    for layer_id in cfg.engram_layer_ids:
        g = np.random.default_rng(10007 * layer_id)
        v = g.integers(low=0, high=bound, size=(cfg.engram_max_ngram_size,), dtype=np.int64)
        rows.append(v * 2 + 1)
    return np.stack(rows).astype(np.int64)


class NgramHasher:
    def __init__(self, cfg, token_map):
        self.cfg = cfg
        self.token_map = torch.as_tensor(np.asarray(token_map), dtype=torch.long)
        if int(self.token_map.max()) >= cfg.engram_compressed_vocab_size:
            raise ValueError("engram token_map has ids >= engram_compressed_vocab_size")
        self.pad_id = int(self.token_map[cfg.engram_pad_id])
        primes = engram_primes(cfg)
        self.primes = torch.tensor(primes, dtype=torch.long)  # [nL, N-1, heads]
        offs = []
        for layer in primes:
            row, total = [], 0
            for p in [p for per in layer for p in per]:
                row.append(total)
                total += p
            offs.append(row)
        self.offsets = torch.tensor(offs, dtype=torch.long)  # [nL, ncols]
        self.multipliers = torch.from_numpy(engram_multipliers(cfg))  # [nL, N]

    def compress(self, ids):
        return self.token_map.to(ids.device)[ids]

    def hash(self, history, positions):
        """history [B, cap] compressed ids (DEAD unknown), positions [T] -> [B, T, nL, ncols]."""
        N = self.cfg.engram_max_ngram_size
        B = history.shape[0]
        pos = positions.long()[None, :].expand(B, -1)
        toks, blocked = [], torch.zeros_like(pos, dtype=torch.bool)
        for s in range(N):
            src = history.gather(1, (pos - s).clamp_min(0))
            blocked = blocked | (pos < s) | (src == DEAD)
            toks.append(torch.where(blocked, torch.full_like(src, self.pad_id), src))
        toks = torch.stack(toks, -1)  # [B, T, N]
        prod = toks.unsqueeze(2) * self.multipliers.to(toks.device)  # [B, T, nL, N]
        rolling, out = prod[..., 0], []
        primes = self.primes.to(toks.device)
        for i in range(1, N):
            rolling = torch.bitwise_xor(rolling, prod[..., i])
            out.append(rolling.unsqueeze(-1) % primes[:, i - 1])
        return torch.cat(out, -1) + self.offsets.to(toks.device).unsqueeze(0)
