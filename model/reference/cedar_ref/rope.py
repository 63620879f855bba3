"""Rotary embeddings of DeepSeek-V4.1: two tables and the interleaved-pair rotation.

`main`: plain RoPE, theta = rope_theta, used by ratio-0 (SWA-only) layers.
`compress`: theta = compress_rope_theta with YaRN frequency blending (no mscale: the
attention factor is 1), used by every ratio > 0 layer for everything (its SWA branch, its
compressed entries at position j*m, and the indexer Q/K).
RoPE covers the LAST `qk_rope_head_dim` channels; channel pairs (2i, 2i+1) of that slice
rotate as one complex number by angle pos * inv_freq[i]. All math in fp32.
"""

import math

import torch


def inv_freq_plain(theta, dim):
    """[dim/2] fp32: 1 / theta^(2i/dim), computed like the HF port (fp32 pow)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def inv_freq_yarn(theta, dim, factor, original_max, beta_fast, beta_slow):
    """[dim/2] fp32: YaRN blend of extrapolated and interpolated frequencies."""
    if factor <= 1.0:
        return inv_freq_plain(theta, dim)

    def correction_dim(n_rot):
        return (dim * math.log(original_max / (n_rot * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrap_factor = 1 - ramp
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrap = 1.0 / pos_freqs
    interp = 1.0 / (factor * pos_freqs)
    return interp * (1 - extrap_factor) + extrap * extrap_factor


class RopeTables:
    def __init__(self, cfg):
        d = cfg.qk_rope_head_dim
        self.inv_freq = {
            "main": inv_freq_plain(float(cfg.rope_theta), d),
            "compress": inv_freq_yarn(float(cfg.compress_rope_theta), d, cfg.yarn_factor,
                                      cfg.yarn_original_max_position, cfg.yarn_beta_fast,
                                      cfg.yarn_beta_slow),
        }

    def cos_sin(self, kind, positions):
        """positions [T] long -> (cos, sin) [T, rope_dim/2] fp32."""
        f = self.inv_freq[kind].to(positions.device)
        ang = positions.float()[:, None] * f[None, :]
        return ang.cos(), ang.sin()


def apply_rope(x, cos, sin, inverse=False):
    """Rotate the last 2*cos.shape[-1] channels of x [B, T, D] or [B, T, H, D] (pairs 2i,2i+1)."""
    if inverse:
        sin = -sin
    rd = cos.shape[-1] * 2
    nope, rope = x[..., :-rd], x[..., -rd:]
    if x.dim() == 4:
        cos, sin = cos[:, None, :], sin[:, None, :]
    even, odd = rope[..., 0::2].float(), rope[..., 1::2].float()
    rot = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return torch.cat([nope, rot.to(x.dtype)], dim=-1)
