"""Codecs bit-exact against the format definitions (MODEL_SPEC §3, cedar_ref/quant.py):
every E2M1 code, every E4M3 byte, rounding ties, UE8M0 scales, nibble order, and
pack -> unpack == fake-quant. The scalar references here are independent python-float code."""

import math
import struct
import unittest

import numpy as np
import torch

import _paths  # noqa: F401
from cedar_ref import quant as Q


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def e4m3_positive_values():
    """All finite non-negative E4M3 values by byte, from the bit definition."""
    out = []
    for b in range(0x7F):
        e, m = b >> 3, b & 7
        out.append((m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return out


def e4m3_rne_scalar(x):
    """Nearest E4M3 value of a python float, ties to the even mantissa, saturating at 448."""
    vals = e4m3_positive_values()
    a = min(abs(x), 448.0)
    best = min(range(len(vals)), key=lambda i: (abs(vals[i] - a), i & 1))  # byte LSB = mantissa LSB
    return math.copysign(vals[best], x)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_code_scalar(q):
    a = abs(q)
    best = min(range(8), key=lambda i: (abs(E2M1[i] - a), i & 1))  # ties to even code
    return best | (8 if math.copysign(1.0, q) < 0 else 0)


class TestScalarFormats(unittest.TestCase):
    def test_every_e2m1_code(self):
        for c in range(16):
            v = Q.e2m1_decode(torch.tensor([c], dtype=torch.uint8)).item()
            self.assertEqual(v, (-1 if c & 8 else 1) * E2M1[c & 7] if (c & 7) else 0.0)
            q = torch.tensor([(-1.0 if c & 8 else 1.0) * E2M1[c & 7]])
            if c == 8:
                q = torch.tensor([-0.0])
            self.assertEqual(int(Q.e2m1_codes(q)[0]), c)

    def test_e2m1_ties_and_grid(self):
        ties = {0.25: 0, 0.75: 2, 1.25: 2, 1.75: 4, 2.5: 4, 3.5: 6, 5.0: 6}
        for x, code in ties.items():
            self.assertEqual(int(Q.e2m1_codes(torch.tensor([x]))[0]), code, x)
            self.assertEqual(int(Q.e2m1_codes(torch.tensor([-x]))[0]), code | 8, -x)
        xs = torch.linspace(-6, 6, 4801)
        got = Q.e2m1_codes(xs).tolist()
        self.assertEqual(got, [e2m1_code_scalar(float(x)) for x in xs])
        self.assertEqual(int(Q.e2m1_codes(torch.tensor([-0.1]))[0]), 8)  # small negative -> -0

    def test_every_e4m3_byte(self):
        finite = [b for b in range(256) if b not in (0x7F, 0xFF)]
        bt = torch.tensor(finite, dtype=torch.uint8)
        vals = Q.e4m3_decode(bt)
        pos = e4m3_positive_values()
        for b, v in zip(finite, vals.tolist()):
            ref = pos[b & 0x7F] * (-1 if b & 0x80 else 1)
            self.assertEqual(v, ref, hex(b))
        np.testing.assert_array_equal(Q.e4m3_encode(vals).numpy(), bt.numpy())
        np.testing.assert_array_equal(Q.e4m3_round(vals).numpy(), vals.numpy())
        self.assertTrue(math.isnan(Q.e4m3_byte_value(0x7F)) and math.isnan(Q.e4m3_byte_value(0xFF)))
        self.assertEqual(Q.e4m3_byte_value(0x7E), 448.0)
        self.assertEqual(Q.e4m3_byte_value(0x01), 2.0 ** -9)

    def test_e4m3_rounding_ties_and_midpoints(self):
        pos = e4m3_positive_values()
        mids = [f32((pos[i] + pos[i + 1]) / 2) for i in range(len(pos) - 1)]
        xs = mids + [f32(m * (1 + 2 ** -20)) for m in mids[1:]] + [f32(m * (1 - 2 ** -20)) for m in mids[1:]]
        xs += [500.0, 448.5, 1e-5, 3e-3]
        t = torch.tensor(xs + [-x for x in xs], dtype=torch.float32)
        got = Q.e4m3_round(t).tolist()
        for x, g in zip(t.tolist(), got):
            self.assertEqual(g, e4m3_rne_scalar(x), x)
        if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1: the port's own cast
            small = t.clamp(-448, 448)
            np.testing.assert_array_equal(Q.e4m3_round(small).numpy(),
                                          small.to(torch.float8_e4m3fn).float().numpy())

    def test_ue8m0_pow2_ceil(self):
        xs = [2.0 ** -126, 1e-30, 0.3, 0.5, 1.0, 1.0000001, 3.0, 4.0, 5.9, 448.0, 1e10]
        k = Q.pow2_ceil_exponent(torch.tensor(xs, dtype=torch.float32)).tolist()
        for x, kk in zip(xs, k):
            m, e = math.frexp(f32(x))  # x = m * 2^e, m in [0.5, 1): ceil(log2 x) = e - (m == 0.5)
            self.assertEqual(kk, e - 1 if m == 0.5 else e, x)


class TestBlockCodecs(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(6, 64, generator=g) * torch.tensor([0.01, 1.0, 5.0, 30.0, 1e-6, 2.0]).view(6, 1)

    def test_fp4_kv_scalar_reference(self):
        codes, sbytes, vals = Q.quantize_fp4_e4m3(self.x, 16)
        for r in range(self.x.shape[0]):
            for blk in range(4):
                xs = [float(v) for v in self.x[r, 16 * blk:16 * blk + 16]]
                amax = max(abs(v) for v in xs)
                scale = e4m3_rne_scalar(f32(max(amax, 6 * 2.0 ** -9) / 6.0))
                self.assertEqual(Q.e4m3_byte_value(int(sbytes[r, blk])), scale)
                for i, v in enumerate(xs):
                    q = max(-6.0, min(6.0, f32(v / scale)))
                    c = e2m1_code_scalar(q)
                    self.assertEqual(int(codes[r, 16 * blk + i]), c)
                    self.assertEqual(float(vals[r, 16 * blk + i]),
                                     (-1 if c & 8 else 1) * E2M1[c & 7] * scale)

    def test_fp4_index_scalar_reference(self):
        codes, kbytes, vals = Q.quantize_fp4_ue8m0(self.x, 32)
        for r in range(self.x.shape[0]):
            for blk in range(2):
                xs = [float(v) for v in self.x[r, 32 * blk:32 * blk + 32]]
                t = f32(f32(max(max(abs(v) for v in xs), 6 * 2.0 ** -126)) * f32(1 / 6.0))
                m, e = math.frexp(t)
                k = e - 1 if m == 0.5 else e
                self.assertEqual(int(kbytes[r, blk]), k + 127)
                for i, v in enumerate(xs):
                    c = e2m1_code_scalar(max(-6.0, min(6.0, v / 2.0 ** k)))
                    self.assertEqual(int(codes[r, 32 * blk + i]), c)

    def test_fp8_swa_scalar_reference(self):
        e4, kbytes, vals = Q.quantize_fp8_ue8m0(self.x, 32)
        for r in range(self.x.shape[0]):
            for blk in range(2):
                xs = [float(v) for v in self.x[r, 32 * blk:32 * blk + 32]]
                t = f32(f32(max(max(abs(v) for v in xs), f32(1e-4))) * f32(1 / 448.0))
                m, e = math.frexp(t)
                k = e - 1 if m == 0.5 else e
                self.assertEqual(int(kbytes[r, blk]), k + 127)
                for i, v in enumerate(xs):
                    ref = e4m3_rne_scalar(max(-448.0, min(448.0, v / 2.0 ** k)))
                    self.assertEqual(Q.e4m3_byte_value(int(e4[r, 32 * blk + i])), ref)
                    self.assertEqual(float(vals[r, 32 * blk + i]), ref * 2.0 ** k)

    def test_nibble_order(self):
        x = torch.zeros(32)
        x[0], x[1], x[2] = 6.0, -0.5, 1.0    # codes 7, 9, 2 (scale 1: amax 6)
        e = Q.pack_fp4_index(x)
        self.assertEqual(e.shape[-1], 16 + 1)
        self.assertEqual(int(e[0]), 0x97)     # element 0 low nibble, element 1 high nibble
        self.assertEqual(int(e[1]), 0x02)
        self.assertEqual(int(e[16]), 127)     # UE8M0 2^0
        k = torch.zeros(16)
        k[0], k[1] = 3.0, 1.0                 # scale = e4m3(3/6) = 0.5: codes 7, 4
        e = Q.pack_fp4_kv(k)
        self.assertEqual(int(e[0]), 0x47)
        self.assertEqual(Q.e4m3_byte_value(int(e[8])), 0.5)

    def test_pack_unpack_equals_fake_quant(self):
        x = torch.cat([self.x, torch.randn(4, 64) * 3])
        for pack, unpack, fq, per in ((Q.pack_fp4_kv, Q.unpack_fp4_kv, Q.fake_quant_fp4_kv, 36),
                                      (Q.pack_fp4_index, Q.unpack_fp4_index, Q.fake_quant_fp4_index, 34),
                                      (Q.pack_fp8_swa, Q.unpack_fp8_swa, Q.fake_quant_fp8_swa, 66)):
            e = pack(x)
            self.assertEqual(e.dtype, torch.uint8)
            self.assertEqual(e.shape[-1], per)
            np.testing.assert_array_equal(unpack(e, 64).numpy(), fq(x).numpy())
        self.assertEqual(Q.pack_fp4_kv(torch.randn(512)).numel(), 288)     # MODEL_SPEC §3 sizes
        self.assertEqual(Q.pack_fp4_index(torch.randn(128)).numel(), 68)
        self.assertEqual(Q.pack_fp8_swa(torch.randn(512)).numel(), 528)

    def test_ste_passes_gradient(self):
        with torch.enable_grad():  # other test modules may have turned grad off process-wide
            x = self.x.clone().requires_grad_(True)
            y = Q.ste(x, Q.fake_quant_fp4_index)
            np.testing.assert_allclose(y.detach().numpy(), Q.fake_quant_fp4_index(self.x).numpy(), atol=1e-5)
            y.sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), np.ones_like(x.grad.numpy()))


# ---- the HF port's packing rule in plain python (independent of cedar_ref.quant) -------------

def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def hf_pow2_ceil_exp(t):
    """The port's _pow2_ceil_scale as an exponent: exponent field - 127 + (mantissa != 0)."""
    b = f32_bits(t)
    return ((b >> 23) & 0xFF) - 127 + (1 if b & 0x7FFFFF else 0)


def e4m3_byte_of(v):
    """Byte of an exactly representable E4M3 value (sign bit from the float's sign)."""
    b = e4m3_positive_values().index(abs(v))
    return b | (0x80 if math.copysign(1.0, v) < 0 else 0)


def hf_nibbles(codes):
    return [codes[2 * i] | (codes[2 * i + 1] << 4) for i in range(len(codes) // 2)]


def hf_pack_fp4_index(xs):
    """One FP4 index entry: scale 2^k, k = pow2ceil(fp32(max(amax, 6*2^-126) * fp32(1/6)))."""
    out_codes, out_scales = [], []
    for b in range(0, len(xs), 32):
        blk = [f32(v) for v in xs[b:b + 32]]
        t = f32(max(max(abs(v) for v in blk), f32(6 * 2.0 ** -126)) * f32(1 / 6.0))
        k = hf_pow2_ceil_exp(t)
        out_codes += [e2m1_code_scalar(max(-6.0, min(6.0, f32(v / 2.0 ** k)))) for v in blk]
        out_scales.append(k + 127)
    return hf_nibbles(out_codes) + out_scales


def hf_pack_fp8_swa(xs):
    """One FP8 SWA entry: scale 2^k, k = pow2ceil(fp32(max(amax, 1e-4) * fp32(1/448)))."""
    out, scales = [], []
    for b in range(0, len(xs), 32):
        blk = [f32(v) for v in xs[b:b + 32]]
        t = f32(max(max(abs(v) for v in blk), f32(1e-4)) * f32(1 / 448.0))
        k = hf_pow2_ceil_exp(t)
        out += [e4m3_byte_of(e4m3_rne_scalar(max(-448.0, min(448.0, f32(v / 2.0 ** k))))) for v in blk]
        scales.append(k + 127)
    return out + scales


def hf_pack_fp4_kv(xs):
    """One FP4 main-KV entry: scale e4m3(fp32(max(amax, 6*2^-9) / 6))."""
    codes, scales = [], []
    for b in range(0, len(xs), 16):
        blk = [f32(v) for v in xs[b:b + 16]]
        s = e4m3_rne_scalar(f32(max(max(abs(v) for v in blk), 6 * 2.0 ** -9) / 6.0))
        codes += [e2m1_code_scalar(max(-6.0, min(6.0, f32(v / s)))) for v in blk]
        scales.append(e4m3_byte_of(s))
    return hf_nibbles(codes) + scales


def crafted_rows():
    """Rows of 64 channels (2 UE8M0 blocks / 4 E4M3 blocks) on the scale and sign edges."""
    g = torch.Generator().manual_seed(11)
    filler = (torch.rand(64, generator=g) - 0.5) * 0.2  # rounds to +-0 at every scale below
    rows = []

    def row(first, rest=None):
        r = filler.clone() if rest is None else torch.full((64,), rest)
        r[: len(first)] = torch.tensor(first)
        r[32: 32 + len(first)] = -torch.tensor(first)
        return r

    rows.append(row([3.2, -0.01, 0.01, -0.0]))  # FP4 index: max code 3 at scale 2^0
    rows.append(row([2.9, -0.01, 0.01, -0.0]))  # ... the same values at scale 2^-1 (max code 6)
    rows.append(row([3.4, 1.0]))
    rows.append(row([6.0, 3.0]))                 # amax / 6 exactly 2^0
    rows.append(row([float(np.nextafter(np.float32(6.0), np.float32(7.0))), 1.0]))
    rows.append(row([228.0 / 8, 1.0]))           # FP8 SWA: max 228 at 2^-3 -> e4m3 224
    rows.append(row([224.0 / 8, -1e-3]))
    rows.append(row([448.0 / 16, -2e-4]))        # amax / 448 exactly 2^-4
    rows.append(row([1e-5, -3e-6], 0.0))         # below both clamps
    rows.append(row([], 0.0))                    # all zeros
    rows.append(row([-1e-30, 1e-30], -0.0))      # signed zeros and denormals
    rows.append(row([0.2, -0.2, 0.05, -0.05]))
    rows.append(torch.randn(64, generator=g) * 3.0)
    return torch.stack(rows)


class TestHFPackingConvention(unittest.TestCase):
    """Packed bytes follow the HF port's rule (= kernels/cpu/quant.cpp): scales from the raw
    block, -0 as code 8; a state's fake-quantised rows map back to them through PackLedger."""

    FORMATS = (("fp4_kv", Q.pack_fp4_kv, Q.fake_quant_fp4_kv, hf_pack_fp4_kv),
               ("fp4_index", Q.pack_fp4_index, Q.fake_quant_fp4_index, hf_pack_fp4_index),
               ("fp8_swa", Q.pack_fp8_swa, Q.fake_quant_fp8_swa, hf_pack_fp8_swa))

    def setUp(self):
        self.x = crafted_rows()

    def test_pack_matches_plain_python_hf_rule(self):
        for fmt, pack, _, hf in self.FORMATS:
            got = pack(self.x)
            for r in range(self.x.shape[0]):
                self.assertEqual(got[r].tolist(), hf([float(v) for v in self.x[r]]), f"{fmt} row {r}")

    def test_negative_zero_is_code_8(self):
        x = torch.zeros(32)
        x[0], x[1], x[2], x[3] = 6.0, -0.01, 0.01, -0.0
        e = Q.pack_fp4_index(x)
        self.assertEqual(int(e[0]), 0x87)            # element 1 (-0.01) -> code 8 in the high nibble
        self.assertEqual(int(e[1]), 0x80)            # 0.01 -> code 0, -0.0 -> code 8
        e = Q.pack_fp4_kv(x[:16])
        self.assertEqual(int(e[0]), 0x87)
        self.assertEqual(int(e[1]), 0x80)
        v = Q.fake_quant_fp4_kv(x[:16])              # -0 survives fake-quant, as in the C++ codec
        self.assertEqual(torch.signbit(v[:4]).tolist(), [False, True, False, True])
        self.assertEqual(Q.e2m1_decode(torch.tensor([8], dtype=torch.uint8)).item(), 0.0)
        self.assertTrue(math.copysign(1.0, Q.e2m1_decode(torch.tensor([8], dtype=torch.uint8)).item()) < 0)

    def test_ambiguous_scale_rows(self):
        # rows 0 and 1 fake-quantise to the same values but pack with scales 2^0 and 2^-1
        for fq in (Q.fake_quant_fp4_index,):
            np.testing.assert_array_equal(fq(self.x[0]).numpy(), fq(self.x[1]).numpy())
        a, b = Q.pack_fp4_index(self.x[0]), Q.pack_fp4_index(self.x[1])
        self.assertEqual((int(a[32]), int(b[32])), (127, 126))
        self.assertEqual(int(a[0]) & 0xF, 5)         # 3.2 -> code 5 (3.0) at 2^0
        self.assertEqual(int(b[0]) & 0xF, 7)         # 2.9 -> code 7 (6.0) at 2^-1
        swa = Q.pack_fp8_swa(self.x[5])              # 228/8 at scale 2^-3 -> E4M3 224 (0x76)
        self.assertEqual((int(swa[0]), int(swa[64])), (0x76, 127 - 3))

    def test_ledger_recovers_raw_bytes_of_fake_quantised_rows(self):
        x = torch.cat([self.x[:1], self.x[2:]])      # row 1 would make row 0 ambiguous (below)
        with Q.PackLedger() as ledger:
            fqs = {fmt: fq(x) for fmt, _, fq, _ in self.FORMATS}
        for fmt, pack, fq, _ in self.FORMATS:
            want = pack(x)
            np.testing.assert_array_equal(ledger.pack(fmt, fqs[fmt]).numpy(), want.numpy(), fmt)
            np.testing.assert_array_equal(ledger.pack(fmt, fqs[fmt][3:5]).numpy(), want[3:5].numpy(), fmt)
        # re-packing the values alone picks the lower scale for row 0 (why the ledger exists)
        self.assertNotEqual(Q.pack_fp4_index(fqs["fp4_index"][0]).tolist(), Q.pack_fp4_index(self.x[0]).tolist())
        self.assertNotEqual(Q.pack_fp8_swa(fqs["fp8_swa"][4]).tolist(), Q.pack_fp8_swa(x[4]).tolist())

    def test_ledger_rejects_unknown_and_ambiguous_rows(self):
        with Q.PackLedger() as ledger:
            Q.fake_quant_fp4_index(self.x[:2])        # rows 0 and 1: same values, other bytes
        self.assertEqual(Q._OPEN_LEDGERS, [])
        with self.assertRaisesRegex(ValueError, "pack to different bytes"):
            ledger.pack("fp4_index", Q.fake_quant_fp4_index(self.x[0]))
        with self.assertRaisesRegex(ValueError, "not produced"):
            ledger.pack("fp4_index", Q.fake_quant_fp4_index(self.x[5]))
        with self.assertRaisesRegex(ValueError, "unknown format"):
            ledger.pack("fp6", self.x[0])
        Q.fake_quant_fp4_index(self.x[5])             # closed: nothing recorded any more
        with self.assertRaisesRegex(ValueError, "not produced"):
            ledger.pack("fp4_index", Q.fake_quant_fp4_index(self.x[5]))


if __name__ == "__main__":
    unittest.main()
