#!/usr/bin/python3
"""Regenerates the tokenizer and chat-format goldens under tests/tokenizer/ from cedar_ref.

  /usr/bin/python3 tests/tokenizer/make_goldens.py      (from the repository root)

Writes:
  tokenizer.json       2000-merge byte-level BPE trained on corpus.txt (train_tokenizer.py)
  encode_golden.json   {"format": "cedar-encode-golden-v1", "cases": [{text, allow_special, pieces, ids}]}
                       pieces: the pre-tokenizer output for the text (no added tokens involved)
  chat_golden.json     {"format": "cedar-chat-golden-v1", "cases": [{name, messages, mode,
                       reasoning_effort, drop_thinking, prompt, ids}]}
  dsml_golden.json     {"format": "cedar-dsml-golden-v1", "cases": [{name, thinking, text,
                       max_tag_bytes, max_value_bytes, max_call_bytes, reasoning, content,
                       calls: [{name, arguments}], errors}]}
  chat_golden.json also has "json_dumps": [{json, python}]: Python's json.dumps of json.loads.
  unicode_classes.json {"format": "cedar-unicode-classes-v1", "unidata_version", "classes":
                       [{name: L|M|N|P|S|s, ranges: [[first, last], ...]}]}: the classes bpe.py
                       uses, which PCRE2 (UTF+UCP) must reproduce for the C++ ids to match.
The C++ tests (tests/model/*_test.cpp) must reproduce every field exactly.
"""

import json
import os
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "model", "reference"))

from cedar_ref import bpe, chat  # noqa: E402
import train_tokenizer  # noqa: E402

ENCODE_TEXTS = [
    ("Hello, world!", True),
    ("The quick brown fox jumps over the lazy dog.", True),
    ("It's, they're, we'll, I'd, you've, she'S — apostrophes", True),
    ("numbers 0 7 42 123 1234 12345678901 3.14159 -2e10 0x1F 1,000,000", True),
    ("fullwidth １２３４ roman ⅫⅣ superscript x² arabic ٠١٢٣٤٥ fractions ½¾", True),
    ("中文测试：深度求索发布了新的模型。混合English和中文123混排", True),
    ("日本語のテキスト、ひらがなカタカナ漢字。ｶﾀｶﾅ半角", True),
    ("한국어 문장 안녕하세요 ไทยภาษา हिन्दी भाषा Ελληνικά русский العربية", True),
    ("emoji 😀👍🏽❤️🇫🇷👨‍👩‍👧‍👦🚀✨ and text", True),
    ("  leading spaces, trailing spaces   ", True),
    ("tabs\t\tand\tmixed \t whitespace\n\n\nnewlines\r\nCRLF\r\n\r\n  \n end", True),
    ("unicode spaces:\u00a0nbsp\u3000ideographic\u2028line sep\u2029para\u0085nel\u180emvs\u200bzwsp", True),
    ("control \x00\x01\x07\x1b[0m\x7f chars \x1c\x1d\x1e\x1f", True),
    ("combining: e\u0301 a\u0308 \u0301alone  \u0301 n\u0303o", True),
    ("def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n", True),
    ("int main(void) { printf(\"%d\\n\", a[i]++); return -1; } // c++ <vector>::iterator", True),
    ("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 3, \"ok\": true}}", True),
    ("https://example.com/path?q=1&r=two#frag user@example.org .NET C# ++i i-- a->b ::", True),
    ("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>hmm</think>ok<｜end▁of▁sentence｜>", True),
    ("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>hmm</think>ok<｜end▁of▁sentence｜>", False),
    ("partial markers <｜User <think <｜DSML｜ almost｜DSML｜ </think> <｜end▁of▁sentence｜", True),
    ("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"search\">\n<｜DSML｜ parameter name=\"q\" string=\"true\">cats</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>", True),
    ("<｜System｜><｜latest_reminder｜><｜deepseek_image｜><｜action｜><｜query｜><｜▁pad▁｜>", True),
    ("<｜System｜><｜latest_reminder｜><｜deepseek_image｜><｜action｜><｜query｜><｜▁pad▁｜>", False),
    ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ababababababababab ....... !!!???", True),
    ("MixedCASE camelCaseWords snake_case_words SCREAMING_CASE kebab-case-words", True),
    ("'quoted' \"double\" `back` «guillemets» „low“ ‘single’ — – … ·", True),
    ("x", True),
    ("", True),
    (" ", True),
    ("\n", True),
    ("¡¿ÀÉÎÕÜ ñ ß ø å æ œ þ ð", True),
    ("math: ∑∫∂√∞≈≠≤≥ ∀x∈ℝ: x²≥0 → α+β=γ", True),
    ("𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 astral 𠀀𠀁 \U0010FFFD private \ue000", True),
    (" " * 2000 + "x" + "\n" * 1000 + " \t" * 500 + "y" + " " * 1000, True),
    ("1234567890" * 100 + "!" * 1000 + "中" * 1000 + "a\u0301" * 300, True),
]


def random_texts(n, seed=1234):
    """Seeded random strings over a pool that exercises every pre-tokenizer class boundary."""
    import random
    rng = random.Random(seed)
    pool = list("aZ qQ09") + [" ", "  ", "\t", "\n", "\r\n", "\r", "'s", "'T", ".", ",", "!", "?", "-", "_",
            "(", ")", "{", "}", "<", ">", "\"", "#", "$", "+", "=", "€", "©", "—", "«", "é", "\u0301",
            "\u0308", "ß", "Ж", "中", "文", "の", "カ", "ｶ", "한", "ไ", "\u0e31", "१", "٣", "２", "Ⅻ", "²",
            "😀", "👍🏽", "\u200d", "\ufe0f", "\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\x00",
            "\x1c", "\x7f", "<｜User｜>", "<think>", "｜DSML｜", "<｜", "｜>", "\U0001d518"]
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        out.append("".join(rng.choice(pool) for _ in range(k)))
    return out


def encode_goldens(tok):
    cases = []
    texts = list(ENCODE_TEXTS) + [(t, i % 2 == 0) for i, t in enumerate(random_texts(300))]
    for text, allow in texts:
        ids = tok.encode(text, allow_special=allow)
        assert tok.decode(ids) == text, text
        cases.append({"text": text, "allow_special": allow,
                      "pieces": bpe.pretokenize(text), "ids": ids})
    return {"format": "cedar-encode-golden-v1", "cases": cases}


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city (°C).",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
            "threshold": {"type": "number", "default": 0.5}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "run_code", "description": "Run a snippet.\nReturns stdout.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"},
                                                        "timeout_s": {"type": "number"}}}}},
]

CALLS_1 = [
    {"id": "call_a", "type": "function", "function": {"name": "get_weather",
        "arguments": "{\"city\": \"Zürich\", \"days\": 3, \"threshold\": 1e-05, \"opts\": {\"units\": [\"C\", null, true], \"big\": 12345678901234567890, \"f\": 1E16, \"g\": 0.1, \"z\": -0.0}}"}},
    {"id": "call_b", "type": "function", "function": {"name": "run_code",
        "arguments": {"code": "print(\"hi\")\nx = '<tag>' & 1", "timeout_s": 2.5}}},
]


def chat_cases():
    u = lambda t: {"role": "user", "content": t}  # noqa: E731
    sysm = {"role": "system", "content": "You are a careful assistant."}
    agent = [
        {"role": "system", "content": "You are an agent.", "tools": TOOLS},
        u("What's the weather in Zürich, and run print('hi')?"),
        {"role": "assistant", "reasoning_content": "Two tools needed.", "content": "Checking both.",
         "tool_calls": CALLS_1},
        {"role": "tool", "tool_call_id": "call_b", "content": "hi\n"},
        {"role": "tool", "tool_call_id": "call_a", "content": [{"type": "text", "text": "3 days: 12°C"},
                                                                {"type": "image"}]},
        u("Thanks. Summarise."),
    ]
    history = [
        sysm, u("First question?"),
        {"role": "assistant", "reasoning_content": "old thoughts", "content": "First answer."},
        {"role": "developer", "content": "Be brief."},
        u("Second question? 中文 😀"),
        {"role": "assistant", "reasoning_content": "new thoughts", "content": "Second answer."},
        u("Third?"),
    ]
    cases = [
        ("chat_system_user", [sysm, u("Hello!")], "chat", None, True),
        ("chat_user_only", [u("Hi there")], "chat", None, True),
        ("thinking_user_only", [u("Hi there")], "thinking", None, True),
        ("thinking_effort_max", [sysm, u("Prove it.")], "thinking", "max", True),
        ("thinking_effort_7", [u("Quick.")], "thinking", 7, True),
        ("thinking_history_dropped", history, "thinking", "low", True),
        ("thinking_history_kept", history, "thinking", "xhigh", False),
        ("chat_history", history, "chat", None, True),
        ("thinking_agent_tools", agent, "thinking", None, True),
        ("chat_agent_tools", agent, "chat", None, True),
        ("agent_ends_with_tool_results", agent[:5], "thinking", None, True),
        ("assistant_last", [u("Say hi"), {"role": "assistant", "content": "hi"}], "chat", None, True),
        ("assistant_prefill_wo_eos", [u("Say hi"), {"role": "assistant", "reasoning_content": "r",
                                                    "content": "h", "wo_eos": True}], "thinking", None, True),
        ("latest_reminder", [sysm, u("Task"), {"role": "latest_reminder", "content": "Remember: be terse."}],
         "thinking", None, True),
        ("mid_system", [sysm, u("a"), {"role": "assistant", "content": "b"},
                        {"role": "system", "content": "New rules."}], "chat", None, True),
        ("developer_tools", [{"role": "developer", "content": "Use tools.", "tools": TOOLS[:1]}, u("Go")],
         "chat", None, True),
        ("consecutive_users", [u("one"), u("two"), {"role": "tool", "tool_call_id": "x", "content": None}],
         "chat", None, True),
        ("special_strings_in_text", [u("literal <｜User｜> and <think> and ｜DSML｜ text")], "chat", None, True),
        ("no_bos", [u("x")], "chat", None, True),
    ]
    return cases


def chat_goldens(tok):
    cases = []
    for name, msgs, mode, effort, drop in chat_cases():
        add_bos = name != "no_bos"
        prompt = chat.encode_messages(msgs, mode, effort, drop, add_bos)
        cases.append({"name": name, "messages": msgs, "mode": mode,
                      "reasoning_effort": chat.resolve_effort(effort), "drop_thinking": drop,
                      "add_bos": add_bos, "prompt": prompt, "ids": tok.encode(prompt)})
    json_texts = ["1e-05", "1E16", "123456789012345678.0", "0.1", "-0.0", "1.5e300", "2.5e-10", "100.0",
                  "12345678901234567890", "-9223372036854775808", "[1, 2.0, \"\\u00e9\\n\\u0001\\u007f\"]",
                  "{\"b\": 1, \"a\": {\"c\": []}, \"b\": 2}", "{}", "\"\\ud83d\\ude00\"", "0.000123",
                  "1234567890123456.0", "9007199254740993"]
    dumps = [{"json": t, "python": json.dumps(json.loads(t), ensure_ascii=False)} for t in json_texts]
    return {"format": "cedar-chat-golden-v1", "cases": cases, "json_dumps": dumps}


def dsml_cases():
    block = lambda calls: "\n\n" + chat.render_tool_calls(calls)  # noqa: E731
    call_w = {"name": "get_weather", "arguments": {"city": "Zürich \"ZH\"\n<b>", "days": 3, "x": [1, {"y": None}]}}
    call_r = {"name": "run_code", "arguments": {"code": "for i in range(3):\n    print(i)\n"}}
    P = lambda k, s, v: f'<｜DSML｜ parameter name="{k}" string="{s}">{v}</｜DSML｜ parameter>'  # noqa: E731
    head = "\n\n<｜DSML｜ calls>\n"
    tail = "\n</｜DSML｜ calls>"
    inv = lambda name, body: f'<｜DSML｜ invoke name="{name}">\n{body}\n</｜DSML｜ invoke>'  # noqa: E731
    eos = chat.EOS
    cases = [
        ("plain_chat", False, "Hello there, 中文 😀." + eos, {}),
        ("plain_no_eos", False, "Hello\n\nworld <not a tag> \n\n<｜DSML", {}),
        ("thinking_plain", True, "Let me think\n\n</thin>ok</think>Answer." + eos, {}),
        ("one_call", False, "Checking." + block([call_w]) + eos, {}),
        ("two_calls_thinking", True, "need tools</think>" + block([call_w, call_r]) + eos, {}),
        ("call_no_params", False, head + inv("ping", "") + tail, {}),
        ("block_without_blank_line", False, "text<｜DSML｜ calls>\n" + inv("f", P("a", "true", "1")) + tail, {}),
        ("content_after_block", False, head + inv("f", P("a", "false", "[1,2]")) + tail + "\nmore text" + eos, {}),
        ("text_after_eos", False, "done" + eos + "\n  trailing junk", {}),
        ("missing_think_end", True, "thinking forever...", {}),
        ("eos_in_reasoning", True, "thinking" + eos, {}),
        ("unknown_attribute", False, head + '<｜DSML｜ invoke name="f" color="red">\n</｜DSML｜ invoke>\n'
         + inv("g", P("a", "true", "ok")) + tail, {}),
        ("bad_json_value", False, head + inv("f", P("n", "false", "{bad json")) + "\n" + inv("g", P("n", "false", "5")) + tail, {}),
        ("nan_is_not_json", False, head + inv("f", P("n", "false", "NaN")) + tail, {}),
        ("duplicate_parameter", False, head + inv("f", P("a", "true", "1") + "\n" + P("a", "true", "2")) + tail, {}),
        ("missing_string_attr", False, head + inv("f", '<｜DSML｜ parameter name="a">x</｜DSML｜ parameter>') + tail, {}),
        ("bad_string_attr", False, head + inv("f", P("a", "yes", "x")) + tail, {}),
        ("invoke_without_name", False, head + '<｜DSML｜ invoke>\n</｜DSML｜ invoke>' + tail, {}),
        ("unterminated_value", False, head + '<｜DSML｜ invoke name="f">\n<｜DSML｜ parameter name="a" string="true">abc', {}),
        ("unterminated_block", False, head + inv("f", P("a", "true", "x")), {}),
        ("unterminated_invoke_tag", False, head + '<｜DSML｜ invoke name="f', {}),
        ("garbage_between_tags", False, head + "garbage\n" + inv("f", "") + "\nmore garbage" + inv("g", "") + tail, {}),
        ("garbage_in_call", False, head + '<｜DSML｜ invoke name="f">\nnoise\n</｜DSML｜ invoke>\n' + inv("g", "") + tail, {}),
        ("missing_invoke_close", False, head + '<｜DSML｜ invoke name="f">\n' + P("a", "true", "1") + "\n" + inv("g", P("b", "true", "2")) + tail, {}),
        ("missing_tag_gt", False, head + '<｜DSML｜ invoke name="f"\n' + P("a", "true", "1") + "\n</｜DSML｜ invoke>\n" + inv("g", "") + tail, {}),
        ("tag_name_glued", False, head + '<｜DSML｜ invokename="f">\n</｜DSML｜ invoke>' + tail, {}),
        ("nested_garbage_in_value", False, head + inv("f", P("a", "true", "<｜DSML｜ invoke name=\"x\"> </｜DSML｜ calls> ok")) + tail, {}),
        ("eos_in_block", False, head + inv("f", "") + eos + "x", {}),
        ("gt_in_quoted_attr", False, head + inv("a>b", P("k>", "true", "v")) + tail, {}),
        ("tag_too_long", False, head + '<｜DSML｜ invoke name="' + "x" * 80 + '">\n</｜DSML｜ invoke>\n' + inv("g", "") + tail,
         {"max_tag_bytes": 64}),
        ("value_too_long", False, head + inv("f", P("a", "true", "y" * 100)) + "\n" + inv("g", P("b", "true", "short")) + tail,
         {"max_value_bytes": 50}),
        ("value_at_limit", False, head + inv("f", P("a", "true", "é" * 25)) + tail, {"max_value_bytes": 50}),
        ("call_too_big", False, head + inv("f", "\n".join(P(f"k{i}", "false", str(i)) for i in range(20))) + "\n" + inv("g", "") + tail,
         {"max_call_bytes": 40}),
        ("empty", False, "", {}),
        ("only_newlines", False, "\n\n\n", {}),
    ]
    return cases


def dsml_goldens():
    cases = []
    for name, thinking, text, limits in dsml_cases():
        r = chat.parse_output(text, thinking, **limits)
        cases.append({"name": name, "thinking": thinking, "text": text,
                      "max_tag_bytes": limits.get("max_tag_bytes", chat.MAX_TAG_BYTES),
                      "max_value_bytes": limits.get("max_value_bytes", chat.MAX_VALUE_BYTES),
                      "max_call_bytes": limits.get("max_call_bytes", chat.MAX_CALL_BYTES), **r})
    return {"format": "cedar-dsml-golden-v1", "cases": cases}


def main():
    tok_path = os.path.join(HERE, "tokenizer.json")
    rc = train_tokenizer.main(["--corpus", os.path.join(HERE, "corpus.txt"), "--merges", "2000",
                               "--out", tok_path])
    if rc:
        return rc
    tok = bpe.Tokenizer.load(tok_path)

    def dump(name, obj):
        # One case per line: diffable, and compact for cases with thousands of ids.
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            f.write("{\n")
            items = list(obj.items())
            for k, (key, val) in enumerate(items):
                end = ",\n" if k + 1 < len(items) else "\n"
                if isinstance(val, list):
                    rows = ",\n".join(" " + json.dumps(v, ensure_ascii=False) for v in val)
                    f.write(f" {json.dumps(key)}: [\n{rows}\n ]{end}")
                else:
                    f.write(f" {json.dumps(key)}: {json.dumps(val, ensure_ascii=False)}{end}")
            f.write("}\n")

    dump("encode_golden.json", encode_goldens(tok))
    dump("chat_golden.json", chat_goldens(tok))
    dump("dsml_golden.json", dsml_goldens())
    ranges = bpe.class_ranges()
    dump("unicode_classes.json", {"format": "cedar-unicode-classes-v1",
                                  "unidata_version": unicodedata.unidata_version,
                                  "classes": [{"name": k, "ranges": ranges[k]} for k in "LMNPSs"]})
    print("goldens written to", HERE, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
