"""The DeepSeek-V4.1 chat format and the DSML tool-call parser (reference for model/chat_format
and model/dsml; the C++ must give byte-identical prompts and identical parse results).

What this owns
  * encode_messages(): OpenAI-style messages -> the V4.1 prompt text, following SGLang's
    `encoding_dsv41.py` (adapted from the release's encoding/): BOS; `<｜System｜>` with the
    thinking-mode "Reasoning Effort" line; tool schemas as JSON lines under `## Tools` in the
    system (or developer) turn; `<｜User｜>`; the generation prefix `<｜Assistant｜></think>`
    (chat) or `<｜Assistant｜><think>` (thinking); assistant turns
    `reasoning</think>content[\\n\\n<DSML block>]<｜end▁of▁sentence｜>`; tool messages merged
    into user turns as `<tool_result>` blocks sorted in call order; earlier reasoning dropped
    in thinking mode unless some message carries tools.
  * DsmlParser: a streaming parser of model output (reasoning, content, DSML tool calls) that
    accepts any chunking, reports malformed output as error events, and bounds its memory.

Not supported (reported, not silently mangled): images, `task` tokens, response_format,
multi-turn `context` continuation. JSON is written as Python's json.dumps(ensure_ascii=False).

Choices where SGLang is silent or raises (the C++ follows the same ones):
  * A user/tool message with content None renders as "".
  * Tool messages whose content is a list render its text blocks joined by "\\n\\n" and
    other blocks as "[Unsupported TYPE]" (as SGLang's content-block path does).
  * The parser is lenient where SGLang asserts: whitespace between DSML tags is skipped, a
    block not preceded by "\\n\\n" is still a block, text after `</｜DSML｜ calls>` is more
    content; and strict where SGLang is silent: unknown attributes, bad JSON in
    string="false" values and duplicate parameters drop the call with an error event.
"""

from __future__ import annotations

import codecs
import copy
import json
from typing import Any, Dict, List, Optional, Tuple, Union

from .bpe import (ASSISTANT, BOS, DSML, EOS, LATEST_REMINDER, SYSTEM, THINK_END, THINK_START,
                  USER)

# ---------------------------------------------------------------------------------------------
# Format strings
# ---------------------------------------------------------------------------------------------

CALLS_TAG = DSML + " calls"
INVOKE_TAG = DSML + " invoke"
PARAM_TAG = DSML + " parameter"

EFFORT_LEVELS = {"low": 25, "high": 50, "xhigh": 75, "max": 100}
DEFAULT_EFFORT = "high"


def effort_line(budget: int) -> str:
    return (f"Reasoning Effort: {budget} "
            "(range 1-100, the higher the value, the more thorough the reasoning)\n\n")


def tools_section(schema_lines: List[str]) -> str:
    c, i, p = CALLS_TAG, INVOKE_TAG, PARAM_TAG
    return (
        "## Tools\n\n"
        "You have access to a set of tools to help answer the user's question. You can invoke "
        f"tools by writing a \"<{c}>\" block like the following:\n\n"
        f"<{c}>\n"
        f"<{i} name=\"$TOOL_NAME\">\n"
        f"<{p} name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{p}>\n"
        "...\n"
        f"</{i}>\n"
        f"<{i} name=\"$TOOL_NAME2\">\n"
        "...\n"
        f"</{i}>\n"
        f"</{c}>\n\n"
        "String parameters should be specified as is and set `string=\"true\"`. For all other "
        "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
        "`string=\"false\"`.\n\n"
        f"If thinking_mode is enabled (triggered by {THINK_START}), you MUST output your complete "
        f"reasoning inside {THINK_START}...{THINK_END} BEFORE any tool calls or final response.\n\n"
        f"Otherwise, output directly after {THINK_END} with tool calls or final response.\n\n"
        "### Available Tool Schemas\n\n"
        + "\n".join(schema_lines)
        + "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to "
        "invoke tool calls.\n"
    )


def py_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class ChatFormatError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def resolve_effort(effort: Union[str, int, None]) -> int:
    if effort is None:
        effort = DEFAULT_EFFORT
    if type(effort) is int and 1 <= effort <= 100:
        return effort
    if isinstance(effort, str) and effort in EFFORT_LEVELS:
        return EFFORT_LEVELS[effort]
    raise ChatFormatError(f"reasoning effort {effort!r}: expected an int in [1, 100] or one of "
                          f"{sorted(EFFORT_LEVELS)}")


def render_call_arguments(arguments: Union[str, Dict[str, Any]]) -> str:
    """One `<｜DSML｜ parameter ...>` line per argument: strings raw, the rest JSON."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    if not isinstance(args, dict):
        raise ChatFormatError("tool call arguments must be a JSON object")
    lines = []
    for key, val in args.items():
        is_str = isinstance(val, str)
        text = val if is_str else py_json(val)
        lines.append(f'<{PARAM_TAG} name="{key}" string="{"true" if is_str else "false"}">'
                     f"{text}</{PARAM_TAG}>")
    return "\n".join(lines)


def render_tool_calls(calls: List[Dict[str, Any]]) -> str:
    """calls: [{"name", "arguments"}] -> the DSML block (without the leading "\\n\\n")."""
    invokes = [f'<{INVOKE_TAG} name="{c["name"]}">\n{render_call_arguments(c["arguments"])}\n</{INVOKE_TAG}>'
               for c in calls]
    return f"<{CALLS_TAG}>\n" + "\n".join(invokes) + f"\n</{CALLS_TAG}>"


def _function_of(tool: Dict[str, Any]) -> Dict[str, Any]:
    if "function" not in tool:
        raise ChatFormatError("tool schema lacks its 'function' object")
    return tool["function"]


def _calls_of(msg: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function", tc)
        out.append({"name": fn["name"], "arguments": fn.get("arguments", {}), "id": tc.get("id", "")})
    return out


def _tool_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for b in content:
            if b.get("type") == "text":
                parts.append(b.get("text", ""))
            else:
                parts.append(f"[Unsupported {b.get('type')}]")
        return "\n\n".join(parts)
    return content


def merge_tool_messages(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Tool messages become `tool_result` blocks of a user message; consecutive user-side
    messages (user or tool) merge into one user message of blocks."""
    out: List[Dict[str, Any]] = []
    for m in messages:
        m = copy.deepcopy(m)
        role = m.get("role")
        if role == "tool":
            block = {"type": "tool_result", "id": m.get("tool_call_id", "") or "",
                     "text": _tool_text(m.get("content"))}
            if out and out[-1].get("role") == "user" and "blocks" in out[-1]:
                out[-1]["blocks"].append(block)
            else:
                out.append({"role": "user", "blocks": [block]})
        elif role == "user":
            blocks = [{"type": "text", "text": m.get("content") or ""}]
            if out and out[-1].get("role") == "user" and "blocks" in out[-1]:
                out[-1]["blocks"].extend(blocks)
            else:
                m["blocks"] = blocks
                out.append(m)
        else:
            out.append(m)
    return out


def sort_tool_results(messages: List[Dict[str, Any]]) -> None:
    """Reorders each user message's tool_result blocks into the call order of the latest
    assistant message with tool calls (stable; unknown ids sort as position 0)."""
    order: Dict[str, int] = {}
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            order = {}
            for k, c in enumerate(_calls_of(m)):
                if c["id"]:
                    order[c["id"]] = k
        elif m.get("role") == "user" and m.get("blocks"):
            results = [b for b in m["blocks"] if b["type"] == "tool_result"]
            if len(results) > 1 and order:
                results.sort(key=lambda b: order.get(b["id"], 0))
                it = iter(results)
                m["blocks"] = [next(it) if b["type"] == "tool_result" else b for b in m["blocks"]]


def _last_user_index(messages: List[Dict[str, Any]]) -> int:
    for k in range(len(messages) - 1, -1, -1):
        role = messages[k].get("role")
        if role in ("user", "developer") or (role == "system" and k > 0):
            return k
    return -1


def _drop_old_reasoning(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Thinking mode without tools: assistant turns before the last user turn lose their
    reasoning; developer turns before it are dropped."""
    last = _last_user_index(messages)
    out = []
    for k, m in enumerate(messages):
        role = m.get("role")
        if role in ("user", "system", "tool", "latest_reminder") or k >= last:
            out.append(m)
        elif role == "assistant":
            m = dict(m)
            m.pop("reasoning_content", None)
            out.append(m)
    return out


def _render_one(k: int, messages: List[Dict[str, Any]], thinking: bool, drop: bool, effort: int) -> str:
    m = messages[k]
    role = m.get("role")
    last_user = _last_user_index(messages)
    effort_text = effort_line(effort) if (k == 0 and thinking) else ""
    out = SYSTEM if k == 0 and (effort_text or role == "system") else ""
    out += effort_text

    if role == "system":
        if k > 0:
            out += SYSTEM
        out += m.get("content") or ""
        if m.get("tools"):
            out += "\n\n" + tools_section([py_json(_function_of(t)) for t in m["tools"]])
    elif role == "developer":
        if not m.get("content"):
            raise ChatFormatError(f"message {k}: a developer message needs content")
        out += USER + m["content"]
        if m.get("tools"):
            out += "\n\n" + tools_section([py_json(_function_of(t)) for t in m["tools"]])
    elif role == "user":
        out += USER
        parts = []
        for b in m.get("blocks", [{"type": "text", "text": m.get("content") or ""}]):
            if b["type"] == "text":
                parts.append(b["text"])
            else:
                parts.append(f"<tool_result>{b['text']}</tool_result>")
        out += "\n\n".join(parts)
    elif role == "latest_reminder":
        out += LATEST_REMINDER + (m.get("content") or "")
    elif role == "assistant":
        calls = _calls_of(m)
        dsml = ("\n\n" + render_tool_calls(calls)) if calls else ""
        reasoning = ""
        if thinking and (not drop or k > last_user):
            reasoning = (m.get("reasoning_content") or "") + THINK_END
        out += reasoning + (m.get("content") or "") + dsml
        if not m.get("wo_eos", False):
            out += EOS
    else:
        raise ChatFormatError(f"message {k}: unknown role {role!r}")

    # The generation prefix follows a user-side turn unless the next turn is another user-side
    # one (the assistant answer, or a latest_reminder, may follow).
    if k + 1 < len(messages) and messages[k + 1].get("role") not in ("assistant", "latest_reminder"):
        return out
    if role in ("user", "developer") or (role == "system" and k > 0):
        out += ASSISTANT
        if thinking and (not drop or k >= last_user):
            out += THINK_START
        else:
            out += THINK_END
    return out


def encode_messages(messages: List[Dict[str, Any]], mode: str = "chat",
                    reasoning_effort: Union[str, int, None] = None, drop_thinking: bool = True,
                    add_bos: bool = True) -> str:
    """messages: OpenAI-style dicts (role system/developer/user/assistant/tool/latest_reminder;
    assistant: content, reasoning_content, tool_calls [{id, function: {name, arguments}}];
    tool: tool_call_id, content; system/developer: tools [{type, function}]).
    mode: "chat" or "thinking". Returns the prompt text."""
    if mode not in ("chat", "thinking"):
        raise ChatFormatError(f"mode {mode!r}: expected 'chat' or 'thinking'")
    thinking = mode == "thinking"
    effort = resolve_effort(reasoning_effort)
    msgs = merge_tool_messages(messages)
    sort_tool_results(msgs)
    drop = drop_thinking and not any(m.get("tools") for m in msgs)
    if thinking and drop:
        msgs = _drop_old_reasoning(msgs)
    out = BOS if add_bos else ""
    for k in range(len(msgs)):
        out += _render_one(k, msgs, thinking, drop, effort)
    return out


def attach_tools(messages: List[Dict[str, Any]], tools: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Request-level tools go on the first system message (one is prepended if missing)."""
    msgs = copy.deepcopy(messages)
    if not tools:
        return msgs
    if not msgs or msgs[0].get("role") != "system":
        msgs.insert(0, {"role": "system", "content": ""})
    msgs[0]["tools"] = copy.deepcopy(tools)
    return msgs


# ---------------------------------------------------------------------------------------------
# DSML streaming parser
# ---------------------------------------------------------------------------------------------

MAX_TAG_BYTES = 1024
MAX_VALUE_BYTES = 1 << 20
MAX_CALL_BYTES = 4 << 20

_B = lambda s: s.encode("utf-8")  # noqa: E731
B_THINK_END = _B(THINK_END)
B_EOS = _B(EOS)
B_CALLS_OPEN = _B(f"<{CALLS_TAG}>")
B_CALLS_OPEN_NL = b"\n\n" + B_CALLS_OPEN
B_CALLS_CLOSE = _B(f"</{CALLS_TAG}>")
B_INVOKE_OPEN = _B(f"<{INVOKE_TAG}")
B_INVOKE_CLOSE = _B(f"</{INVOKE_TAG}>")
B_PARAM_OPEN = _B(f"<{PARAM_TAG}")
B_PARAM_CLOSE = _B(f"</{PARAM_TAG}>")
_WS = b" \t\r\n"


def _find_earliest(buf: bytes, markers: List[bytes]) -> Tuple[int, Optional[bytes]]:
    best, which = -1, None
    for mk in markers:
        p = buf.find(mk)
        if p >= 0 and (best < 0 or p < best or (p == best and len(mk) > len(which))):
            best, which = p, mk
    return best, which


def _holdback(buf: bytes, markers: List[bytes]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of a marker."""
    h = 0
    for mk in markers:
        for n in range(min(len(mk) - 1, len(buf)), h, -1):
            if buf.endswith(mk[:n]):
                h = n
                break
    return h


def _valid_json(text: str) -> bool:
    def bad_constant(_):
        raise ValueError("not JSON")
    try:
        json.loads(text, parse_constant=bad_constant)
        return True
    except (ValueError, RecursionError):
        return False


def _parse_attrs(raw: bytes) -> Tuple[Optional[List[Tuple[str, str]]], str]:
    """` name="x" string="true"` -> [(name, value)], or (None, reason)."""
    s = raw.decode("utf-8", errors="replace")
    attrs = []
    i, n = 0, len(s)
    if n and s[0] not in " \t\r\n":
        return None, "expected a space after the tag name"
    while True:
        while i < n and s[i] in " \t\r\n":
            i += 1
        if i >= n:
            return attrs, ""
        j = i
        while j < n and (s[j].isascii() and (s[j].isalnum() or s[j] in "_-")):
            j += 1
        if j == i:
            return None, "expected an attribute name"
        key = s[i:j]
        if j >= n or s[j] != "=" or j + 1 >= n or s[j + 1] != '"':
            return None, f"expected =\"...\" after attribute '{key}'"
        end = s.find('"', j + 2)
        if end < 0:
            return None, f"unterminated value of attribute '{key}'"
        attrs.append((key, s[j + 2:end]))
        i = end + 1
        if i < n and s[i] not in " \t\r\n":
            return None, f"expected a space after attribute '{key}'"


class DsmlParser:
    """Streaming parser of one assistant output. feed(chunk) -> events; finish() -> events.

    Events (dicts, "type" first):
      reasoning {text} | content {text} | call_begin {index, name}
      parameter {index, name, value (JSON text), string (bool)}
      call_end {index, name, arguments (a JSON object text)} | error {message}
    Memory is bounded: a tag by MAX_TAG_BYTES, a value by MAX_VALUE_BYTES, a call's arguments
    by MAX_CALL_BYTES, held-back text by the longest marker. States: reasoning, content, block, call, tag, value, skip, done.
    """

    def __init__(self, thinking: bool = False, max_tag_bytes: int = MAX_TAG_BYTES,
                 max_value_bytes: int = MAX_VALUE_BYTES, max_call_bytes: int = MAX_CALL_BYTES):
        self.max_tag = max_tag_bytes
        self.max_value = max_value_bytes
        self.max_call = max_call_bytes
        self.params_bytes = 0
        self.state = "reasoning" if thinking else "content"
        self.buf = b""
        self.pos = 0  # stream byte offset of buf[0]
        self.events: List[Dict[str, Any]] = []
        self.dec = {"reasoning": codecs.getincrementaldecoder("utf-8")("replace"),
                    "content": codecs.getincrementaldecoder("utf-8")("replace")}
        self.n_calls = 0
        self.tag_kind = ""
        self.call_name = ""
        self.params: List[Tuple[str, str]] = []
        self.param_name = ""
        self.param_is_str = False
        self.value = b""
        self.done_warned = False

    # -- helpers ---------------------------------------------------------------------------------
    def _emit_text(self, kind: str, data: bytes, final: bool = False) -> None:
        text = self.dec[kind].decode(data, final)
        if text:
            self.events.append({"type": kind, "text": text})

    def _consume(self, n: int) -> bytes:
        head, self.buf = self.buf[:n], self.buf[n:]
        self.pos += n
        return head

    def _error(self, message: str) -> None:
        self.events.append({"type": "error", "message": message})

    def _fail_call(self, message: str) -> None:
        self._error(message)
        self.state = "skip"

    # -- API -------------------------------------------------------------------------------------
    def feed(self, chunk: Union[str, bytes]) -> List[Dict[str, Any]]:
        self.buf += chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
        while self._step():
            pass
        out, self.events = self.events, []
        return out

    def finish(self) -> List[Dict[str, Any]]:
        st = self.state
        if st == "reasoning":
            self._emit_text("reasoning", self._consume(len(self.buf)), final=True)
            self._error(f"output ended inside the reasoning (no {THINK_END})")
        elif st == "content":
            self._emit_text("content", self._consume(len(self.buf)), final=True)
        elif st == "block":
            self._error(f"output ended inside the tool-call block (no </{CALLS_TAG}>)")
        elif st in ("call", "value") or (st == "tag" and self.tag_kind == "parameter"):
            self._error(f"output ended inside call '{self.call_name}'")
        elif st == "tag":
            self._error("output ended inside a DSML tag")
        self.state = "done"
        self.buf = b""
        out, self.events = self.events, []
        return out

    # -- state machine ---------------------------------------------------------------------------
    def _step(self) -> bool:
        """Advances once; False when more input is needed."""
        st = self.state
        if st == "reasoning":
            marks = [B_THINK_END, B_EOS]
            p, mk = _find_earliest(self.buf, marks)
            if mk is None:
                keep = _holdback(self.buf, marks)
                self._emit_text("reasoning", self._consume(len(self.buf) - keep))
                return False
            self._emit_text("reasoning", self._consume(p), final=True)
            self._consume(len(mk))
            if mk == B_EOS:
                self._error(f"{EOS} inside the reasoning (no {THINK_END})")
                self.state = "done"
            else:
                self.state = "content"
            return True
        if st == "content":
            marks = [B_CALLS_OPEN_NL, B_CALLS_OPEN, B_EOS]
            p, mk = _find_earliest(self.buf, marks)
            if mk is None:
                keep = _holdback(self.buf, marks)
                self._emit_text("content", self._consume(len(self.buf) - keep))
                return False
            self._emit_text("content", self._consume(p), final=True)  # a marker ends the text
            self._consume(len(mk))
            self.state = "done" if mk == B_EOS else "block"
            return True
        if st in ("block", "call"):
            k = 0
            while k < len(self.buf) and self.buf[k] in _WS:
                k += 1
            self._consume(k)
            if not self.buf:
                return False
            expected = [B_INVOKE_OPEN, B_CALLS_CLOSE, B_EOS] if st == "block" else [B_PARAM_OPEN, B_INVOKE_CLOSE, B_EOS]
            for tok in expected:
                if self.buf.startswith(tok):
                    self._consume(len(tok))
                    self._on_token(tok)
                    return True
            if any(tok.startswith(self.buf) for tok in expected):
                return False
            where = "the tool-call block" if st == "block" else f"call '{self.call_name}'"
            want = (f"'<{INVOKE_TAG}' or '</{CALLS_TAG}>'" if st == "block"
                    else f"'<{PARAM_TAG}' or '</{INVOKE_TAG}>'")
            self.state = "skip"
            self._error(f"unexpected text at byte {self.pos} inside {where}; expected {want}")
            return True
        if st == "tag":
            return self._step_tag()
        if st == "value":
            return self._step_value()
        if st == "skip":
            marks = [B_INVOKE_OPEN, B_CALLS_CLOSE, B_EOS]
            p, mk = _find_earliest(self.buf, marks)
            if mk is None:
                self._consume(len(self.buf) - _holdback(self.buf, marks))
                return False
            self._consume(p + len(mk))
            if mk == B_INVOKE_OPEN:
                self.tag_kind = "invoke"
                self.state = "tag"
            elif mk == B_CALLS_CLOSE:
                self.state = "content"
            else:
                self.state = "done"
            return True
        # done: anything but whitespace after EOS is reported once
        k = 0
        while k < len(self.buf) and self.buf[k] in _WS:
            k += 1
        if k < len(self.buf) and not self.done_warned:
            self.done_warned = True
            self._error(f"text after {EOS} at byte {self.pos + k} ignored")
        self._consume(len(self.buf))
        return False

    def _on_token(self, tok: bytes) -> None:
        if tok == B_EOS:
            self._error(f"{EOS} inside the tool-call block")
            self.state = "done"
        elif tok == B_CALLS_CLOSE:
            self.state = "content"
        elif tok == B_INVOKE_OPEN:
            self.tag_kind = "invoke"
            self.state = "tag"
        elif tok == B_PARAM_OPEN:
            self.tag_kind = "parameter"
            self.state = "tag"
        elif tok == B_INVOKE_CLOSE:
            args = "{" + ", ".join(f"{py_json(k)}: {v}" for k, v in self.params) + "}"
            self.events.append({"type": "call_end", "index": self.n_calls - 1, "name": self.call_name,
                                "arguments": args})
            self.state = "block"

    def _step_tag(self) -> bool:
        in_quote = False
        end = -1
        for k in range(min(len(self.buf), self.max_tag + 1)):
            c = self.buf[k]
            if c == 0x22:
                in_quote = not in_quote
            elif c == 0x3E and not in_quote:
                end = k
                break
        what = "invoke" if self.tag_kind == "invoke" else "parameter"
        if end < 0:
            if len(self.buf) > self.max_tag:
                self._consume(self.max_tag)
                self._fail_call(f"DSML {what} tag longer than {self.max_tag} bytes")
                return True
            return False
        raw = self._consume(end + 1)[:-1]
        attrs, why = _parse_attrs(raw)
        if attrs is None:
            self._fail_call(f"malformed DSML {what} tag: {why}")
            return True
        allowed = ("name",) if what == "invoke" else ("name", "string")
        seen: Dict[str, str] = {}
        for key, val in attrs:
            if key not in allowed:
                self._fail_call(f"unknown attribute '{key}' on DSML {what} tag")
                return True
            if key in seen:
                self._fail_call(f"duplicate attribute '{key}' on DSML {what} tag")
                return True
            seen[key] = val
        if not seen.get("name"):
            self._fail_call(f"DSML {what} tag without a name")
            return True
        if what == "invoke":
            self.call_name = seen["name"]
            self.params = []
            self.params_bytes = 0
            self.n_calls += 1
            self.events.append({"type": "call_begin", "index": self.n_calls - 1, "name": self.call_name})
            self.state = "call"
            return True
        if seen.get("string") not in ("true", "false"):
            self._fail_call(f"parameter '{seen['name']}' of call '{self.call_name}' needs string=\"true\" or string=\"false\"")
            return True
        if any(k == seen["name"] for k, _ in self.params):
            self._fail_call(f"duplicate parameter '{seen['name']}' in call '{self.call_name}'")
            return True
        self.param_name = seen["name"]
        self.param_is_str = seen["string"] == "true"
        self.value = b""
        self.state = "value"
        return True

    def _step_value(self) -> bool:
        room = self.max_value - len(self.value)
        p = self.buf.find(B_PARAM_CLOSE)
        if p < 0:
            safe = len(self.buf) - _holdback(self.buf, [B_PARAM_CLOSE])
            if safe > room:
                self._consume(room)
                self._fail_call(f"value of parameter '{self.param_name}' in call '{self.call_name}' "
                                f"longer than {self.max_value} bytes")
                return True
            self.value += self._consume(safe)
            return False
        if p > room:
            self._consume(room)
            self._fail_call(f"value of parameter '{self.param_name}' in call '{self.call_name}' "
                            f"longer than {self.max_value} bytes")
            return True
        self.value += self._consume(p)
        self._consume(len(B_PARAM_CLOSE))
        text = self.value.decode("utf-8", errors="replace")
        self.value = b""
        if self.param_is_str:
            js = py_json(text)
        else:
            if not _valid_json(text):
                self._fail_call(f"parameter '{self.param_name}' of call '{self.call_name}' has "
                                "string=\"false\" but its value is not valid JSON")
                return True
            js = text
        self.params_bytes += len(self.param_name.encode("utf-8")) + len(js.encode("utf-8"))
        if self.params_bytes > self.max_call:
            self._fail_call(f"arguments of call '{self.call_name}' longer than {self.max_call} bytes")
            return True
        self.params.append((self.param_name, js))
        self.events.append({"type": "parameter", "index": self.n_calls - 1, "name": self.param_name,
                            "value": js, "string": self.param_is_str})
        self.state = "call"
        return True


def parse_output(text: Union[str, bytes], thinking: bool = False, **limits) -> Dict[str, Any]:
    """One-shot parse: {reasoning, content, calls: [{name, arguments}], errors: [str]}."""
    p = DsmlParser(thinking, **limits)
    return collect(p.feed(text) + p.finish())


def collect(events: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"reasoning": "", "content": "", "calls": [], "errors": []}
    for e in events:
        t = e["type"]
        if t == "reasoning":
            out["reasoning"] += e["text"]
        elif t == "content":
            out["content"] += e["text"]
        elif t == "call_end":
            out["calls"].append({"name": e["name"], "arguments": e["arguments"]})
        elif t == "error":
            out["errors"].append(e["message"])
    return out
