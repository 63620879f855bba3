"""FP4 / FP8 codecs of the DeepSeek-V4.1 KV cache: fake-quant (quantise then dequantise)
and the packed byte layouts the C++ executor stores. Bit-exact with MODEL_SPEC §3 and with
the HF port's `_fake_quant_fp4_block` / `_fake_quant_fp8_block`.

Owns: the value formats, the rounding rules, the scale rules, and the byte packing.
Does not own: where the quantisers sit in the forward pass (model.py) or the cache (state.py).

VALUE FORMATS
  E2M1 (FP4) code c in 0..15: bit 3 = sign, bits 0..2 = magnitude index into
      {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Code 8 is -0: a negative value that rounds to zero
      gets code 8 (never code 0) and decodes to -0.0, as in the C++ codec
      (kernels/cpu/quant.cpp); the HF port's lookup table has +0.0 there, the same value.
  E4M3 (float8_e4m3fn) byte b: bit 7 sign, bits 6..3 exponent e (bias 7), bits 2..0
      mantissa m. e == 0: value = m/8 * 2^-6 (subnormal; 2^-9 is the smallest);
      otherwise value = (1 + m/8) * 2^(e-7). 0x7F / 0xFF are NaN and never produced;
      largest finite is 448 (0x7E). Rounding to E4M3 is round-to-nearest-even on the
      fp32 value; magnitudes above 448 saturate to 448 (no caller produces them).
  UE8M0 byte b: the power of two 2^(b-127) (unsigned exponent, no mantissa).

SCALE AND CODE RULES (all arithmetic in fp32, per block of the last axis)
  pow2_ceil(t) = 2^(E - 127 + (M != 0)) where E, M are the fp32 exponent and mantissa
      fields of t > 0 (i.e. 2^ceil(log2 t) for normal t).
  e2m1 code of q (q already clamped to [-6, 6]): sign = signbit(q) (so -0.1 -> code 8);
      magnitude index = number of thresholds t with |q| >= t, thresholds
      {0.25+, 0.75, 1.25+, 1.75, 2.5+, 3.5, 5.0+} where "x+" means nextafter(x, +inf):
      ties at 0.25, 1.25, 2.5, 5 round DOWN, ties at 0.75, 1.75, 3.5 round UP (RNE).
  FP4 main / compressed KV, block 16:
      amax = max|x| over the block
      scale = e4m3_round(max(amax, 6 * 2^-9) / 6)            (fp32 division, then RNE)
      code  = e2m1(clamp(x / scale, -6, 6))                   (fp32 division)
      value = e2m1_value(code) * scale
  FP4 indexer Q / K, block 32:
      scale = pow2_ceil(max(amax, 6 * 2^-126) * fp32(1/6))    (fp32 multiply)
      code  = e2m1(clamp(x / scale, -6, 6)); value = e2m1_value(code) * scale
  FP8 SWA KV, block 32:
      scale = pow2_ceil(max(amax, 1e-4) * fp32(1/448))
      byte  = e4m3(clamp(x / scale, -448, 448));  value = e4m3_value(byte) * scale

PACKED BYTE LAYOUTS (one cache entry = one token / one compressed group, n channels)
  FP4 main KV entry   (n = head_dim, 288 B at 512):
      [n/2 bytes: E2M1 codes, element 2i in the LOW nibble of byte i, element 2i+1 in the
       HIGH nibble][n/16 bytes: E4M3 scale bytes, block j covers elements 16j..16j+15]
  FP4 index key entry (n = index_head_dim, 68 B at 128):
      [n/2 bytes: E2M1 codes, same nibble order][n/32 bytes: UE8M0 exponent bytes,
       biased 127, scale = 2^(b-127), block j covers elements 32j..32j+31]
  FP8 SWA entry       (n = head_dim, 528 B at 512):
      [n bytes: E4M3 bytes of x/scale][n/32 bytes: UE8M0 exponent bytes]
  Every entry is the fake-quantised vector exactly: unpack(pack(x)) == fake_quant(x) bit
  for bit (tests/reference/test_quant.py checks it).
  pack(x) takes the RAW vector x, like the HF port's quantisers and the C++ codec: the
  packed bytes are a function of x, not of fake_quant(x).

PACKING FROM A STATE (PackLedger)
  The reference's state keeps fake-quantised rows. Re-packing such a row gives the same
  values but not always the same bytes: a UE8M0 block (FP4 index, FP8 SWA) whose largest
  code is 3 (FP4) or whose largest E4M3 magnitude is 224 (FP8) re-packs one power of two
  lower with doubled codes, and the values cannot tell which scale the raw row had
  ([3.2, 0, ..] and [2.9, 0, ..] both fake-quantise to [3, 0, ..]; their FP4 index scales
  are 2^0 and 2^-1). While a PackLedger is open, every fake-quant call also records, per
  row, the entry packed from its raw input, keyed by the bit pattern of the fake-quantised
  row; `ledger.pack(fmt, rows)` returns the raw-input bytes of rows read back from a state
  (make_goldens.py uses it for the packed KV goldens).

STE (training): `ste(x, fq)` returns x + (fq(x) - x).detach() so gradients pass straight
through; inference paths call the fake-quant functions directly (bit-exact values).
"""

import torch

FP4_MAX = 6.0
FP8_MAX = 448.0
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# scalar formats
# ---------------------------------------------------------------------------------------------

def e4m3_byte_value(b):
    """Value of one E4M3 byte as a python float (NaN for 0x7F / 0xFF)."""
    sign = -1.0 if b & 0x80 else 1.0
    e = (b >> 3) & 0xF
    m = b & 0x7
    if e == 0xF and m == 0x7:
        return float("nan")
    if e == 0:
        return sign * (m / 8.0) * 2.0 ** -6
    return sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)


def _e4m3_table():
    vals = [e4m3_byte_value(b) for b in range(256)]
    vals = [0.0 if v != v else v for v in vals]  # NaN slots never produced by the encoder
    return torch.tensor(vals, dtype=torch.float32)


E4M3_VALUES = _e4m3_table()


def _floor_log2(a):
    """floor(log2 a) for fp32 a > 0, exactly (frexp: a = m * 2^e, m in [0.5, 1))."""
    _, e = torch.frexp(a)
    return e.to(torch.int32) - 1


def e4m3_round(x):
    """fp32 -> nearest E4M3 value (RNE), as fp32; saturates at +-448."""
    x = x.float()
    a = x.abs().clamp(max=FP8_MAX)
    e = torch.where(a > 0, _floor_log2(torch.where(a > 0, a, torch.ones_like(a))),
                    torch.full_like(a, -6, dtype=torch.int32)).clamp(min=-6)
    quantum = torch.exp2((e - 3).float())
    r = torch.round(a / quantum) * quantum  # torch.round is half-to-even
    return torch.copysign(r.clamp(max=FP8_MAX), x)


def e4m3_encode(v):
    """E4M3-representable fp32 values -> uint8 bytes (sign kept for -0)."""
    v = v.float()
    a = v.abs()
    sign = torch.signbit(v).to(torch.int32)
    normal = a >= 2.0 ** -6
    e = _floor_log2(torch.where(normal, a, torch.ones_like(a)))
    mant_n = torch.round(a / torch.exp2(e.float()) * 8.0 - 8.0).to(torch.int32)
    mant_s = torch.round(a / 2.0 ** -9).to(torch.int32)
    exp_field = torch.where(normal, e + 7, torch.zeros_like(e))
    mant = torch.where(normal, mant_n, mant_s)
    return ((sign << 7) | (exp_field << 3) | mant).to(torch.uint8)


def e4m3_decode(b):
    return E4M3_VALUES.to(b.device)[b.long()]


def pow2_ceil_exponent(t):
    """k with 2^k = pow2_ceil(t), from the fp32 bit fields (t > 0, fp32)."""
    bits = t.float().contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    return exponent - 127 + (mantissa != 0).to(torch.int32)


def e2m1_codes(q):
    """Pre-clamped fp32 -> uint8 E2M1 codes (sign in bit 3), RNE as described above."""
    magnitude = q.abs()
    negative = torch.signbit(q)
    boundaries = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32,
                              device=q.device)
    ties_up = torch.tensor([False, True, False, True, False, True, False], device=q.device)
    up = torch.nextafter(boundaries, torch.full_like(boundaries, float("inf")))
    thresholds = torch.where(ties_up, boundaries, up)
    codes = (magnitude.unsqueeze(-1) >= thresholds).sum(-1).to(torch.uint8)
    return codes | (negative.to(torch.uint8) << 3)


def e2m1_decode(codes):
    return E2M1_VALUES.to(codes.device)[codes.long()]


# ---------------------------------------------------------------------------------------------
# block quantisers: each returns (codes, scale_bytes, dequantised values)
# ---------------------------------------------------------------------------------------------

def _blocks(x, block):
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"last axis {n} is not a multiple of the quant block {block}")
    return x.float().reshape(*x.shape[:-1], n // block, block)


def quantize_fp4_e4m3(x, block=16):
    """FP4 main/compressed KV. codes [..., n] uint8, scale bytes [..., n/block] uint8, values."""
    b = _blocks(x, block)
    amax = b.abs().amax(-1)
    scale = e4m3_round(amax.clamp_min(6.0 * 2.0 ** -9) / FP4_MAX)
    q = (b / scale.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX)
    codes = e2m1_codes(q)
    values = e2m1_decode(codes) * scale.unsqueeze(-1)
    return codes.reshape(x.shape), e4m3_encode(scale), values.reshape(x.shape)


def quantize_fp4_ue8m0(x, block=32):
    """FP4 indexer Q/K. codes [..., n], UE8M0 bytes [..., n/block], values."""
    b = _blocks(x, block)
    amax = b.abs().amax(-1)
    k = pow2_ceil_exponent(amax.clamp_min(6.0 * 2.0 ** -126) * (1.0 / FP4_MAX))
    scale = torch.exp2(k.float())
    q = (b / scale.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX)
    codes = e2m1_codes(q)
    values = e2m1_decode(codes) * scale.unsqueeze(-1)
    return codes.reshape(x.shape), (k + 127).to(torch.uint8), values.reshape(x.shape)


def quantize_fp8_ue8m0(x, block=32):
    """FP8 SWA KV. E4M3 bytes [..., n], UE8M0 bytes [..., n/block], values."""
    b = _blocks(x, block)
    amax = b.abs().amax(-1).clamp_min(1e-4)
    k = pow2_ceil_exponent(amax * (1.0 / FP8_MAX))
    scale = torch.exp2(k.float())
    q = e4m3_round((b / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX))
    values = q * scale.unsqueeze(-1)
    return e4m3_encode(q).reshape(x.shape), (k + 127).to(torch.uint8), values.reshape(x.shape)


def fake_quant_fp4_kv(x):
    codes, sbytes, values = quantize_fp4_e4m3(x, 16)
    values = values.to(x.dtype)
    _record("fp4_kv", values, lambda: torch.cat([pack_nibbles(codes), sbytes], dim=-1))
    return values


def fake_quant_fp4_index(x):
    codes, kbytes, values = quantize_fp4_ue8m0(x, 32)
    values = values.to(x.dtype)
    _record("fp4_index", values, lambda: torch.cat([pack_nibbles(codes), kbytes], dim=-1))
    return values


def fake_quant_fp8_swa(x):
    e4, kbytes, values = quantize_fp8_ue8m0(x, 32)
    values = values.to(x.dtype)
    _record("fp8_swa", values, lambda: torch.cat([e4, kbytes], dim=-1))
    return values


def ste(x, fq):
    """Straight-through estimator around a fake-quantiser (training only)."""
    return x + (fq(x.detach()) - x.detach())


# ---------------------------------------------------------------------------------------------
# packed entries
# ---------------------------------------------------------------------------------------------

def pack_nibbles(codes):
    """[..., n] uint8 codes -> [..., n/2] bytes, element 2i low nibble, 2i+1 high nibble."""
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed):
    lo = packed & 0x0F
    hi = (packed >> 4) & 0x0F
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def pack_fp4_kv(x):
    """[..., n] fp32 -> [..., n/2 + n/16] uint8 FP4 main KV entries."""
    codes, sbytes, _ = quantize_fp4_e4m3(x, 16)
    return torch.cat([pack_nibbles(codes), sbytes], dim=-1)


def unpack_fp4_kv(entries, n):
    codes = unpack_nibbles(entries[..., : n // 2])
    scale = e4m3_decode(entries[..., n // 2: n // 2 + n // 16])
    vals = e2m1_decode(codes).reshape(*codes.shape[:-1], n // 16, 16) * scale.unsqueeze(-1)
    return vals.reshape(*codes.shape[:-1], n)


def pack_fp4_index(x):
    """[..., n] fp32 -> [..., n/2 + n/32] uint8 FP4 index-key entries."""
    codes, kbytes, _ = quantize_fp4_ue8m0(x, 32)
    return torch.cat([pack_nibbles(codes), kbytes], dim=-1)


def unpack_fp4_index(entries, n):
    codes = unpack_nibbles(entries[..., : n // 2])
    scale = torch.exp2(entries[..., n // 2: n // 2 + n // 32].float() - 127.0)
    vals = e2m1_decode(codes).reshape(*codes.shape[:-1], n // 32, 32) * scale.unsqueeze(-1)
    return vals.reshape(*codes.shape[:-1], n)


def pack_fp8_swa(x):
    """[..., n] fp32 -> [..., n + n/32] uint8 FP8 SWA entries."""
    e4, kbytes, _ = quantize_fp8_ue8m0(x, 32)
    return torch.cat([e4, kbytes], dim=-1)


def unpack_fp8_swa(entries, n):
    vals = e4m3_decode(entries[..., :n])
    scale = torch.exp2(entries[..., n: n + n // 32].float() - 127.0)
    vals = vals.reshape(*vals.shape[:-1], n // 32, 32) * scale.unsqueeze(-1)
    return vals.reshape(*entries.shape[:-1], n)


# ---------------------------------------------------------------------------------------------
# packing ledger (see PACKING FROM A STATE above)
# ---------------------------------------------------------------------------------------------

_OPEN_LEDGERS = []

_UNPACK = {"fp4_kv": unpack_fp4_kv, "fp4_index": unpack_fp4_index, "fp8_swa": unpack_fp8_swa}


def _record(fmt, values, entries_fn):
    """Called by the fake-quantisers: hands (values, raw-input entries) to every open ledger."""
    if _OPEN_LEDGERS:
        entries = entries_fn()
        for ledger in _OPEN_LEDGERS:
            ledger.add(fmt, values, entries)


class PackLedger:
    """Context manager. Rows: the last axis; fmt: "fp4_kv", "fp4_index" or "fp8_swa".

    add(fmt, values [..., n], entries [..., bytes]) keeps entries[i] under the fp32 bit
    pattern of values[i] (two raw rows with the same fake-quantised bits but different bytes
    mark that key ambiguous). pack(fmt, values [..., n]) -> uint8 [..., bytes]; a row never
    recorded, or recorded ambiguously, raises ValueError; every returned entry is checked to
    unpack to `values` bit for bit."""

    def __init__(self):
        self._rows = {fmt: {} for fmt in _UNPACK}
        self._ambiguous = {fmt: set() for fmt in _UNPACK}

    def __enter__(self):
        _OPEN_LEDGERS.append(self)
        return self

    def __exit__(self, *exc):
        _OPEN_LEDGERS.remove(self)
        return False

    @staticmethod
    def _keys(values):
        v = values.detach().float().contiguous().cpu()
        return v.reshape(-1, v.shape[-1]).view(torch.int32).numpy()

    def add(self, fmt, values, entries):
        rows, ambiguous = self._rows[fmt], self._ambiguous[fmt]
        e = entries.detach().cpu().reshape(-1, entries.shape[-1]).numpy()
        for key, entry in zip(self._keys(values), e):
            k, b = key.tobytes(), entry.tobytes()
            if rows.setdefault(k, b) != b:
                ambiguous.add(k)

    def pack(self, fmt, values):
        if fmt not in self._rows:
            raise ValueError(f"PackLedger.pack: unknown format {fmt!r} (expected one of {sorted(self._rows)})")
        rows, ambiguous = self._rows[fmt], self._ambiguous[fmt]
        n = values.shape[-1]
        out = []
        for i, key in enumerate(self._keys(values)):
            k = key.tobytes()
            if k not in rows:
                raise ValueError(f"PackLedger.pack({fmt}): row {i} was not produced by a "
                                 f"fake-quantiser while this ledger was open")
            if k in ambiguous:
                raise ValueError(f"PackLedger.pack({fmt}): row {i} came from raw rows that "
                                 f"pack to different bytes")
            out.append(torch.frombuffer(bytearray(rows[k]), dtype=torch.uint8))
        width = entry_bytes(fmt, n)
        packed = (torch.stack(out) if out else torch.zeros(0, width, dtype=torch.uint8))
        packed = packed.reshape(*values.shape[:-1], width)
        back = _UNPACK[fmt](packed, n).float().contiguous()
        if not torch.equal(back.view(torch.int32), values.detach().float().contiguous().cpu().view(torch.int32)):
            raise ValueError(f"PackLedger.pack({fmt}): recorded entries do not unpack to the rows")
        return packed


def entry_bytes(fmt, n):
    """Bytes of one packed entry of n channels (layouts above)."""
    return {"fp4_kv": n // 2 + n // 16, "fp4_index": n // 2 + n // 32, "fp8_swa": n + n // 32}[fmt]
