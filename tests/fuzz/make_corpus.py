#!/usr/bin/env python3
"""Regenerates the seed corpora of tests/fuzz/corpus/<target>/ (small, committed).

Seeds are valid or nearly valid inputs of each entry point, so the fuzzers start deep in the
format instead of at the first byte check; the parameter bytes each target takes from the
front of an input (see the target's design comment) are prepended here. Sources: the DSML
goldens and the tokenizer corpus of tests/tokenizer/, the shipped config.json files, and
hand-written MCP/SSE/safetensors/KV-page examples.
Usage: /usr/bin/python3 tests/fuzz/make_corpus.py   (from anywhere; rewrites the corpus dirs)
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def dsml():
    with open(os.path.join(ROOT, "tests/tokenizer/dsml_golden.json"), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    for i, c in enumerate(cases):
        small = c["max_tag_bytes"] < 1024 or c["max_value_bytes"] < (1 << 20)
        flags = (1 if c["thinking"] else 0) | (2 if small else 0)
        params = bytes([flags]) + (bytes([min(255, max(0, c["max_tag_bytes"] - 8))]) if small else b"")
        sizes = [1, 7, 3] if i % 2 else [64]
        params += bytes([len(sizes) - 1]) + bytes(s - 1 for s in sizes)
        write("dsml", "%02d_%s" % (i, c["name"]), params + c["text"].encode("utf-8"))


def tokenizer():
    with open(os.path.join(ROOT, "tests/tokenizer/corpus.txt"), encoding="utf-8") as f:
        lines = [l for l in f.read().split("\n") if l]
    for i, line in enumerate(lines[:12]):
        write("tokenizer", "encode_%02d" % i, b"\x00" + line.encode("utf-8"))
    write("tokenizer", "encode_special",
          b"\x02<\xef\xbd\x9cUser\xef\xbd\x9c>hi<\xef\xbd\x9cAssistant\xef\xbd\x9c><think>x</think>")
    write("tokenizer", "encode_invalid_utf8", b"\x00abc\xff\xfe\xc3")
    # decode: ids as little-endian int32 (mode 3 wraps them into the vocabulary).
    ids = [0, 1, 2, 100, 1000, 5000, 127, 128, 255, 256, 300, 7]
    write("tokenizer", "decode_ids", b"\x01" + struct.pack("<%di" % len(ids), *ids))
    write("tokenizer", "decode_wrapped", b"\x03" + bytes(range(0, 96)))
    write("tokenizer", "decode_unknown", b"\x01" + struct.pack("<3i", 1, -5, 1 << 30))


def config():
    for rel in ["config/cedar-agent-tiny.json", "config/deepseek-v41-flash.json",
                "config/deepseek-v41-tiny-a.json", "tests/fixtures/deepseek-v41-tiny-A/config.hf.json",
                "tests/fixtures/deepseek-v41-tiny-A/config.inference.json"]:
        with open(os.path.join(ROOT, rel), "rb") as f:
            write("config", os.path.basename(os.path.dirname(rel)) + "_" + os.path.basename(rel), f.read())
    write("config", "flat_small", '{"model_type":"deepseek_v41_text","num_hidden_layers":12}')
    write("config", "not_object", "[1,2,3]")


def safetensors_file(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes); laid out in order, no padding."""
    header, data = {}, b""
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors():
    f32 = struct.pack("<6f", 1.0, -2.0, 0.5, 3.25, -0.0, 7.0)
    write("safetensors", "f32", safetensors_file([("a.weight", "F32", [2, 3], f32)], {"format": "pt"}))
    bf16 = struct.pack("<4H", 0x3F80, 0xC000, 0x3F00, 0x0000)
    i32 = struct.pack("<2i", 5, -6)
    write("safetensors", "mixed", safetensors_file([("w", "F32", [6], f32), ("b", "BF16", [4], bf16),
                                                   ("n", "I32", [2], i32), ("e", "F16", [0], b"")]))
    # FP8 weight [2, 4] with a UE8M0 block scale [1, 1].
    write("safetensors", "fp8_scaled", safetensors_file([
        ("l.weight", "F8_E4M3", [2, 4], bytes([0x38, 0x40, 0xB8, 0x00, 0x30, 0x48, 0x7E, 0x01])),
        ("l.scale", "F8_E8M0", [1, 1], bytes([127]))]))
    # FP4 experts: I8 [2, 16] packs [2, 32] E2M1 values; scale [2, 1].
    write("safetensors", "fp4_scaled", safetensors_file([
        ("e.weight", "I8", [2, 16], bytes(range(32))),
        ("e.scale", "F8_E8M0", [2, 1], bytes([127, 128]))]))
    write("safetensors", "truncated", safetensors_file([("a", "F32", [2, 3], f32)])[:-5])
    write("safetensors", "bad_len", struct.pack("<Q", 1 << 40) + b"{}")


def page_format():
    # A valid-looking page: 2 entries of 8 + 4 bytes. The xxh64 fields are zero here; the
    # target recomputes them (second check of each input), so the full path runs.
    n, main_b, index_b = 2, 8, 4
    hdr = struct.pack("<4sHHQIHHIIQIIQQ", b"CKVP", 1, 64, 0x1234_5678_9ABC_DEF0, 2, 16, 8,
                      main_b, index_b, 40, n, 0, 0, 0)
    payload = bytes(range(n * (main_b + index_b)))
    write("page_format", "two_entries", hdr + payload)
    write("page_format", "empty_page", hdr[:40] + struct.pack("<IIQQ", 0, 0, 0, 0))
    write("page_format", "truncated", (hdr + payload)[:70])
    write("page_format", "wrong_magic", b"XKVP" + hdr[4:] + payload)
    write("page_format", "short", hdr[:20])
    # Regression: (main + index entry bytes) x n_entries wraps around 2^64 to 4, so a 68-byte
    # page matched its "total size" and verify_page returned views far outside the buffer.
    wrap = struct.pack("<4sHHQIHHIIQIIQQ", b"CKVP", 1, 64, 7, 2, 16, 8,
                       0xFFFFFFFF, 131075, 0, 4294836226, 0, 0, 0)
    write("page_format", "size_wraps_2_64", wrap + b"abcd")


def json_schema():
    pairs = [
        ({"type": "object", "properties": {"path": {"type": "string", "minLength": 1}},
          "required": ["path"], "additionalProperties": False}, {"path": "/tmp/x"}),
        ({"type": "array", "items": {"type": "integer", "minimum": 0, "multipleOf": 3},
          "minItems": 1, "maxItems": 4}, [3, 6, 9]),
        ({"anyOf": [{"type": "string"}, {"type": "null"}], "not": {"const": "x"}}, None),
        ({"oneOf": [{"enum": [1, 2]}, {"type": "number", "exclusiveMaximum": 1.5}]}, 1),
        ({"allOf": [{"type": ["number", "string"]}, {"maxLength": 3}]}, "abcd"),
        ({"type": "object", "additionalProperties": {"type": "boolean"}}, {"a": True, "b": 1}),
        (True, {"any": ["thing"]}),
        (False, 0),
    ]
    for i, (s, v) in enumerate(pairs):
        write("json_schema", "pair_%02d" % i, json.dumps(s).encode() + b"\x00" + json.dumps(v).encode())
    write("json_schema", "no_nul", '{"type":"object","properties":{"type":{"type":"string"}}}')


RPC = [
    {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "hi"}]}},
    {"jsonrpc": "2.0", "id": 7, "method": "ping"},
    {"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage", "params": {}},
    {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 0.5, "total": 1}},
    {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"},
    {"jsonrpc": "2.0", "id": 2, "error": {"code": -32601, "message": "no"}},
]


def mcp_stdio():
    lines = [json.dumps(m) for m in RPC]
    write("mcp_stdio", "session", b"\x03\x10" + ("\n".join(lines) + "\n").encode())
    write("mcp_stdio", "batch_crlf", b"\x00\x40" + (json.dumps(RPC[:3]) + "\r\n\r\n" + lines[3] + "\r\n").encode())
    write("mcp_stdio", "garbage", b"\x05\x01" + b'{"jsonrpc": "2.0", "id": 1, "res\nnot json\n[1,2,\n')
    write("mcp_stdio", "oversized", b"\x07\x00" + b'{"a": "' + b"x" * 100 + b'"}\n')


def mcp_sse():
    events = "".join("id: %d\nevent: message\ndata: %s\n\n" % (i, json.dumps(m)) for i, m in enumerate(RPC))
    write("mcp_sse", "stream", b"\x07" + events.encode())
    write("mcp_sse", "priming_retry", b"\x00" + b": comment\r\nid: ev-0\r\nretry: 1500\r\ndata:\r\n\r\n")
    write("mcp_sse", "multiline_cr", b"\x02" + b"data: {\"jsonrpc\":\rdata: \"2.0\",\"id\":1,\"result\":{}}\r\r")
    write("mcp_sse", "no_final_blank", b"\x0b" + b"event: x\ndata: 1\nid\nretry: 12a\ndata")


def main():
    for fn in [dsml, tokenizer, config, safetensors, page_format, json_schema, mcp_stdio, mcp_sse]:
        d = os.path.join(CORPUS, fn.__name__)
        if os.path.isdir(d):
            shutil.rmtree(d)
        fn()


if __name__ == "__main__":
    main()
