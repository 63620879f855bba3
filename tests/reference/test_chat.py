"""Tests of cedar_ref/chat.py: the V4.1 prompt structure, tool-result merging and ordering,
reasoning dropping, render -> parse round trips, chunking invariance of the DSML parser,
malformed output, and agreement with the committed goldens."""

import json
import os
import random
import unittest

from cedar_ref import bpe, chat

ROOT = os.environ.get("CEDAR_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOK_DIR = os.path.join(ROOT, "tests", "tokenizer")

TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look up a value",
                                         "parameters": {"type": "object", "properties": {
                                             "query": {"type": "string"}, "limit": {"type": "integer"}}}}}


def u(t):
    return {"role": "user", "content": t}


class RenderTest(unittest.TestCase):
    def test_chat_turn_structure(self):
        p = chat.encode_messages([{"role": "system", "content": "S"}, u("Q"),
                                  {"role": "assistant", "content": "A"}, u("Q2")], "chat")
        self.assertEqual(p, f"{bpe.BOS}{bpe.SYSTEM}S{bpe.USER}Q{bpe.ASSISTANT}{bpe.THINK_END}A{bpe.EOS}"
                            f"{bpe.USER}Q2{bpe.ASSISTANT}{bpe.THINK_END}")

    def test_thinking_prefix_effort_and_dropped_reasoning(self):
        msgs = [u("Q"), {"role": "assistant", "reasoning_content": "R1", "content": "A"}, u("Q2")]
        p = chat.encode_messages(msgs, "thinking", "max")
        self.assertTrue(p.startswith(bpe.BOS + bpe.SYSTEM + chat.effort_line(100) + bpe.USER))
        self.assertNotIn("R1", p)  # earlier reasoning dropped...
        self.assertIn(f"{bpe.USER}Q{bpe.ASSISTANT}{bpe.THINK_END}A{bpe.EOS}", p)
        self.assertTrue(p.endswith(f"{bpe.USER}Q2{bpe.ASSISTANT}{bpe.THINK_START}"))
        kept = chat.encode_messages(msgs, "thinking", 30, drop_thinking=False)
        self.assertIn(f"{bpe.ASSISTANT}{bpe.THINK_START}R1{bpe.THINK_END}A{bpe.EOS}", kept)
        self.assertIn(chat.effort_line(30), kept)
        # ...unless tools are present anywhere.
        with_tools = chat.encode_messages(chat.attach_tools(msgs, [TOOL]), "thinking")
        self.assertIn("R1</think>A", with_tools)
        self.assertIn("## Tools", with_tools)
        self.assertIn(json.dumps(TOOL["function"], ensure_ascii=False), with_tools)

    def test_tool_results_merge_in_call_order(self):
        calls = [{"id": "c1", "function": {"name": "lookup", "arguments": {"query": "a"}}},
                 {"id": "c2", "function": {"name": "lookup", "arguments": {"query": "b", "limit": 2}}}]
        msgs = [u("Q"), {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c2", "content": "RB"},
                {"role": "tool", "tool_call_id": "c1", "content": "RA"}, u("more")]
        p = chat.encode_messages(msgs, "chat")
        self.assertIn(f"{bpe.USER}<tool_result>RA</tool_result>\n\n<tool_result>RB</tool_result>\n\nmore"
                      f"{bpe.ASSISTANT}{bpe.THINK_END}", p)
        self.assertIn('\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="lookup">\n'
                      '<｜DSML｜ parameter name="query" string="true">a</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n'
                      '<｜DSML｜ invoke name="lookup">\n<｜DSML｜ parameter name="query" string="true">b</｜DSML｜ parameter>\n'
                      '<｜DSML｜ parameter name="limit" string="false">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n'
                      f'</｜DSML｜ calls>{bpe.EOS}', p)

    def test_bad_input_raises_clear_errors(self):
        with self.assertRaisesRegex(chat.ChatFormatError, "reasoning effort"):
            chat.encode_messages([u("x")], "thinking", 0)
        with self.assertRaisesRegex(chat.ChatFormatError, "mode"):
            chat.encode_messages([u("x")], "fast")
        with self.assertRaisesRegex(chat.ChatFormatError, "JSON object"):
            chat.encode_messages([u("x"), {"role": "assistant", "tool_calls": [
                {"function": {"name": "f", "arguments": "[1]"}}]}], "chat")

    def test_goldens_agree(self):
        tok = bpe.Tokenizer.load(os.path.join(TOK_DIR, "tokenizer.json"))
        with open(os.path.join(TOK_DIR, "chat_golden.json"), encoding="utf-8") as f:
            gold = json.load(f)
        self.assertEqual(gold["format"], "cedar-chat-golden-v1")
        for c in gold["cases"]:
            p = chat.encode_messages(c["messages"], c["mode"], c["reasoning_effort"], c["drop_thinking"], c["add_bos"])
            self.assertEqual(p, c["prompt"], c["name"])
            self.assertEqual(tok.encode(p), c["ids"], c["name"])
            self.assertEqual(tok.decode(c["ids"]), p)


def chunked(text, sizes, thinking=False, **limits):
    p = chat.DsmlParser(thinking, **limits)
    data = text.encode("utf-8")
    ev, i, k = [], 0, 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        ev += p.feed(data[i:i + n])
        i += n
        k += 1
    ev += p.finish()
    return ev


class ParserTest(unittest.TestCase):
    CALLS = [{"name": "get_weather", "arguments": {"city": "Zürich \"ZH\"\n<b>", "days": 3, "x": [1.5, {"y": None}]}},
             {"name": "run", "arguments": {"code": "a</｜DSML｜ parameter\n>", "empty": ""}}]

    def test_round_trip_render_parse(self):
        for thinking in (False, True):
            msgs = [u("Q"), {"role": "assistant", "reasoning_content": "why", "content": "ok",
                             "tool_calls": [{"function": c} for c in self.CALLS]}]
            p = chat.encode_messages(msgs, "thinking" if thinking else "chat", drop_thinking=False)
            gen_prefix = bpe.ASSISTANT + (bpe.THINK_START if thinking else bpe.THINK_END)
            out = p.split(gen_prefix, 1)[1]
            r = chat.parse_output(out, thinking)
            self.assertEqual(r["errors"], [])
            self.assertEqual(r["content"], "ok")
            self.assertEqual(r["reasoning"], "why" if thinking else "")
            self.assertEqual([c["name"] for c in r["calls"]], ["get_weather", "run"])
            for got, want in zip(r["calls"], self.CALLS):
                self.assertEqual(json.loads(got["arguments"]), want["arguments"])
                self.assertEqual(got["arguments"], json.dumps(want["arguments"], ensure_ascii=False))

    def test_every_chunking_gives_the_same_result(self):
        with open(os.path.join(TOK_DIR, "dsml_golden.json"), encoding="utf-8") as f:
            gold = json.load(f)
        for c in gold["cases"]:
            limits = {k: c[k] for k in ("max_tag_bytes", "max_value_bytes", "max_call_bytes")}
            want = {k: c[k] for k in ("reasoning", "content", "calls", "errors")}
            self.assertEqual(chat.parse_output(c["text"], c["thinking"], **limits), want, c["name"])
            n = len(c["text"].encode("utf-8"))
            for size in range(1, min(n, 64) + 1):
                got = chat.collect(chunked(c["text"], [size], c["thinking"], **limits))
                self.assertEqual(got, want, (c["name"], size))
            rng = random.Random(n)
            for _ in range(10):
                got = chat.collect(chunked(c["text"], [rng.randint(1, 9) for _ in range(7)], c["thinking"], **limits))
                self.assertEqual(got, want, c["name"])

    def test_events_stream_in_order_and_text_is_whole_characters(self):
        text = "é😀" + "\n\n" + chat.render_tool_calls(self.CALLS) + bpe.EOS
        ev = chunked(text, [1])
        kinds = [e["type"] for e in ev]
        self.assertEqual(kinds.count("call_begin"), 2)
        self.assertEqual(kinds.count("parameter"), 5)
        self.assertEqual(kinds.count("call_end"), 2)
        self.assertLess(kinds.index("call_begin"), kinds.index("parameter"))
        self.assertEqual("".join(e["text"] for e in ev if e["type"] == "content"), "é😀")
        self.assertNotIn("\ufffd", "".join(e.get("text", "") for e in ev))

    def test_memory_stays_bounded_on_garbage(self):
        p = chat.DsmlParser(False, max_tag_bytes=64, max_value_bytes=256)
        p.feed("\n\n<｜DSML｜ calls>\nnot a tag ")
        for _ in range(2000):
            p.feed("garbage <｜DSML garbage ")
            self.assertLess(len(p.buf), 64)
        p.feed('<｜DSML｜ invoke name="f">\n<｜DSML｜ parameter name="a" string="true">')
        ev = []
        for _ in range(100):
            ev += p.feed("v" * 50)
            self.assertLessEqual(len(p.value) + len(p.buf), 256 + 64)
        ev += p.feed("</｜DSML｜ parameter>") + p.finish()
        self.assertTrue(any("longer than 256 bytes" in e.get("message", "") for e in ev))

    def test_invalid_utf8_becomes_replacement(self):
        p = chat.DsmlParser()
        ev = p.feed(b"a\xff\xe4\xb8") + p.feed(b"\xadb") + p.finish()  # \xe4\xb8\xad is one char
        self.assertEqual("".join(e["text"] for e in ev), "a\ufffd\u4e2db")


if __name__ == "__main__":
    unittest.main()
