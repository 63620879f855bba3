"""Synthetic agent transcripts for cedar's default model (issue 6): tools, a virtual world, the
task families, rendering to the V4.1 chat format and the assistant-token loss mask.

What this owns
  * TOOL_SCHEMAS: the built-in tools (calculator, notes_save / notes_read, clock, file_read,
    file_list) and the MCP filesystem server's tools as the runtime exposes them
    (`filesystem__read_text_file`, `filesystem__list_directory`, `filesystem__write_file`,
    `filesystem__search_files`; the server's own schemas and descriptions), as OpenAI-style
    function schemas.
  * World + run_tool(): every tool result is COMPUTED (the calculator evaluates with a small
    exact parser, files come from a per-sample virtual file system, notes from a per-sample
    store, the clock from the sample's fixed "now"), so the model must copy values from its
    context. eval_agent.py executes the model's own calls with the same function.
  * make_sample(seed, index, split): one deterministic sample = {id, family, split, tools,
    world, messages (the whole transcript), n_prompt (messages before the graded turn), expect,
    distance_chars}. Families and their share of the train mix (FAMILY_WEIGHTS):
      single  one tool call, then the answer
      chain   look up (file / note / clock), then compute, then answer
      multi   several calls in one assistant turn, then one answer
      error   a failing call (bad path, bad expression, missing note), then a corrected call
      notool  answer directly from the user's message, no call
      recall  a long session (many tool turns, thousands of tokens) ending in a question about
              a value that appeared near its start; answered from context without a call
  * Held-out split: its own question templates (HELDOUT templates are never used in train),
    word pools disjoint from train's (a crc32 split of one pseudo-word generator), names from a
    disjoint list and wider number ranges. `split="heldout"` samples are never trained on.
  * render_sample(): the V4.1 prompt text (cedar_ref.chat.encode_messages, chat mode) cut into
    segments [(text, is_assistant)]; tokenize_sample() turns it into ids + a loss mask that is
    1 exactly on assistant tokens (their content, DSML block and end-of-sentence).

Invariants: make_sample(seed, i, split) depends only on its arguments (its own random.Random);
rendering every prefix of a transcript gives a prefix of the whole rendering (checked).
"""

from __future__ import annotations

import random
import re
import zlib
from typing import Any, Dict, List, Optional, Tuple

from . import chat
from .bpe import ASSISTANT, EOS, THINK_END

MCP_PREFIX = "filesystem__"
MCP_ROOT = "/data"

# ---------------------------------------------------------------------------------------------
# Tool schemas
# ---------------------------------------------------------------------------------------------


def _fn(name, description, props, required):
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required}}}


_S = {"type": "string"}
TOOL_SCHEMAS: Dict[str, Dict[str, Any]] = {
    "calculator": _fn("calculator", "Evaluate an arithmetic expression with + - * / and "
                      "parentheses; returns the exact result.",
                      {"expression": {"type": "string", "description": "e.g. (12 + 30) * 4"}},
                      ["expression"]),
    "notes_save": _fn("notes_save", "Save a short note under a key.",
                      {"key": _S, "text": _S}, ["key", "text"]),
    "notes_read": _fn("notes_read", "Read the note saved under a key.", {"key": _S}, ["key"]),
    "clock": _fn("clock", "Current local date and time.", {}, []),
    "file_read": _fn("file_read", "Read a text file from the workspace.",
                     {"path": {"type": "string", "description": "relative path"}}, ["path"]),
    "file_list": _fn("file_list", "List a workspace directory; directories end with '/'.",
                     {"path": {"type": "string", "description": "relative path, '.' for the root"}},
                     ["path"]),
    MCP_PREFIX + "read_text_file": _fn(
        MCP_PREFIX + "read_text_file",
        "Read the complete contents of a file from the file system as text. Handles various "
        "text encodings and provides detailed error messages if the file cannot be read. Use "
        "this tool when you need to examine the contents of a single file. Use the 'head' "
        "parameter to read only the first N lines of a file, or the 'tail' parameter to read "
        "only the last N lines of a file. Operates on the file as text regardless of "
        "extension. Only works within allowed directories.",
        {"path": _S,
         "tail": {"type": "number", "description": "If provided, returns only the last N lines of the file"},
         "head": {"type": "number", "description": "If provided, returns only the first N lines of the file"}},
        ["path"]),
    MCP_PREFIX + "list_directory": _fn(
        MCP_PREFIX + "list_directory",
        "Get a detailed listing of all files and directories in a specified path. Results "
        "clearly distinguish between files and directories with [FILE] and [DIR] prefixes. "
        "This tool is essential for understanding directory structure and finding specific "
        "files within a directory. Only works within allowed directories.",
        {"path": _S}, ["path"]),
    MCP_PREFIX + "write_file": _fn(
        MCP_PREFIX + "write_file",
        "Create a new file or completely overwrite an existing file with new content. Use "
        "with caution as it will overwrite existing files without warning. Handles text "
        "content with proper encoding. Only works within allowed directories.",
        {"path": _S, "content": _S}, ["path", "content"]),
    MCP_PREFIX + "search_files": _fn(
        MCP_PREFIX + "search_files",
        "Recursively search for files and directories matching a pattern. The patterns "
        "should be glob-style patterns that match paths relative to the working directory. "
        "Use pattern like '*.ext' to match files in current directory, and '**/*.ext' to "
        "match files in all subdirectories. Returns full paths to all matching items. Great "
        "for finding files when you don't know their exact location. Only searches within "
        "allowed directories.",
        {"path": _S, "pattern": _S,
         "excludePatterns": {"type": "array", "items": _S, "default": []}},
        ["path", "pattern"]),
}
BUILTIN_TOOLS = ["calculator", "notes_save", "notes_read", "clock", "file_read", "file_list"]
MCP_TOOLS = [n for n in TOOL_SCHEMAS if n.startswith(MCP_PREFIX)]

# ---------------------------------------------------------------------------------------------
# Calculator: exact arithmetic on integers and decimals (no eval)
# ---------------------------------------------------------------------------------------------


class CalcError(ValueError):
    pass


def _calc_tokens(expr: str) -> List[str]:
    toks, i = [], 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c.isdigit() or c == ".":
            j = i
            while j < len(expr) and (expr[j].isdigit() or expr[j] == "."):
                j += 1
            toks.append(expr[i:j])
            i = j
        elif c in "+-*/()":
            toks.append(c)
            i += 1
        else:
            raise CalcError(f"unexpected character '{c}' at position {i + 1}")
    return toks


def calc_eval(expr: str):
    """Evaluate + - * / ( ) over decimals exactly (fractions.Fraction). Raises CalcError."""
    from fractions import Fraction
    toks = _calc_tokens(expr)
    if not toks:
        raise CalcError("empty expression")
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take():
        t = peek()
        pos[0] += 1
        return t

    def atom():
        t = take()
        if t is None:
            raise CalcError("expression ends too early")
        if t == "(":
            v = expr_()
            if take() != ")":
                raise CalcError("missing ')'")
            return v
        if t == "-":
            return -atom()
        if t[0].isdigit() or t[0] == ".":
            try:
                return Fraction(t)
            except ValueError:
                raise CalcError(f"bad number '{t}'")
        raise CalcError(f"unexpected '{t}'")

    def term():
        v = atom()
        while peek() in ("*", "/"):
            op = take()
            r = atom()
            if op == "*":
                v = v * r
            else:
                if r == 0:
                    raise CalcError("division by zero")
                v = v / r
        return v

    def expr_():
        v = term()
        while peek() in ("+", "-"):
            op = take()
            r = term()
            v = v + r if op == "+" else v - r
        return v

    v = expr_()
    if pos[0] != len(toks):
        raise CalcError(f"unexpected '{toks[pos[0]]}'")
    return v


def format_number(v) -> str:
    """Integers exactly; other values rounded to 4 decimals, trailing zeros dropped."""
    from fractions import Fraction
    v = Fraction(v)
    if v.denominator == 1:
        return str(v.numerator)
    s = f"{float(v):.4f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


# ---------------------------------------------------------------------------------------------
# The world a sample's tools act on, and the tool executor
# ---------------------------------------------------------------------------------------------


def new_world(now="2026-03-14 09:26 (Saturday)"):
    return {"files": {}, "notes": {}, "now": now}


def _norm_rel(path: str) -> str:
    p = path.strip().lstrip("./") if path.strip() not in (".", "./", "") else ""
    return p.rstrip("/")


def _list_dir(files: Dict[str, str], d: str) -> Optional[List[Tuple[str, bool]]]:
    """Entries (name, is_dir) of directory d ('' = root), sorted; None if d is no directory."""
    prefix = d + "/" if d else ""
    out = {}
    for f in files:
        if f.startswith(prefix):
            rest = f[len(prefix):]
            head, sep, _ = rest.partition("/")
            out[head] = bool(sep)
    if not out and d:
        return None
    return sorted(out.items())


def run_tool(name: str, args: Dict[str, Any], world: Dict[str, Any]) -> Tuple[str, bool]:
    """Execute one call against the world (mutating it for writes) -> (result text, is_error).
    Unknown tools and bad arguments are errors, reported as text, never raised."""
    files, notes = world["files"], world["notes"]
    if not isinstance(args, dict):
        return "error: arguments must be an object", True

    def arg(k):
        v = args.get(k)
        if not isinstance(v, str):
            raise KeyError(k)
        return v
    try:
        if name == "calculator":
            try:
                return format_number(calc_eval(arg("expression"))), False
            except CalcError as e:
                return f"error: {e}", True
        if name == "notes_save":
            notes[arg("key")] = arg("text")
            return f"saved note '{arg('key')}'", False
        if name == "notes_read":
            k = arg("key")
            if k not in notes:
                return f"error: no note named '{k}'", True
            return notes[k], False
        if name == "clock":
            return world["now"], False
        if name == "file_read":
            p = _norm_rel(arg("path"))
            if p not in files:
                return f"error: no such file: {arg('path')}", True
            return files[p], False
        if name == "file_list":
            ents = _list_dir(files, _norm_rel(arg("path")))
            if ents is None:
                return f"error: no such directory: {arg('path')}", True
            return "\n".join(n + ("/" if d else "") for n, d in ents), False
        if name.startswith(MCP_PREFIX):
            op = name[len(MCP_PREFIX):]
            path = arg("path")
            if not (path == MCP_ROOT or path.startswith(MCP_ROOT + "/")):
                return (f"Error: Access denied - path outside allowed directories: {path} not in "
                        f"{MCP_ROOT}"), True
            rel = path[len(MCP_ROOT):].strip("/")
            if op == "read_text_file":
                if rel not in files:
                    return f"Error: ENOENT: no such file or directory, open '{path}'", True
                lines = files[rel].split("\n")
                if isinstance(args.get("head"), int):
                    lines = lines[:args["head"]]
                if isinstance(args.get("tail"), int):
                    lines = lines[-args["tail"]:] if args["tail"] > 0 else []
                return "\n".join(lines), False
            if op == "list_directory":
                ents = _list_dir(files, rel)
                if ents is None:
                    return f"Error: ENOENT: no such file or directory, scandir '{path}'", True
                return "\n".join(("[DIR] " if d else "[FILE] ") + n for n, d in ents), False
            if op == "write_file":
                files[rel] = arg("content")
                return f"Successfully wrote to {path}", False
            if op == "search_files":
                pat = arg("pattern")
                rx = re.compile("^" + re.escape(pat).replace(r"\*\*/", "(.*/)?")
                                .replace(r"\*", "[^/]*").replace(r"\?", "[^/]") + "$")
                base = rel + "/" if rel else ""
                hits = [MCP_ROOT + "/" + f for f in sorted(files)
                        if f.startswith(base) and (rx.match(f[len(base):]) or
                                                   rx.match(f[len(base):].split("/")[-1]))]
                return ("\n".join(hits) if hits else "No matches found"), False
        return f"error: unknown tool '{name}'", True
    except KeyError as e:
        return f"error: missing or non-string argument {e.args[0]!r}", True


# ---------------------------------------------------------------------------------------------
# Value pools (train and held-out disjoint)
# ---------------------------------------------------------------------------------------------

_ONSETS = ["b", "br", "c", "d", "f", "g", "gr", "h", "j", "k", "l", "m", "n", "p", "pl", "r",
           "s", "st", "t", "tr", "v", "w", "z", "sh", "ch"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
_CODAS = ["", "", "n", "r", "l", "s", "t", "m", "x", "k"]

NAMES = ["Alice", "Bruno", "Chen", "Dana", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas",
         "Kenji", "Lena", "Marco", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara",
         "Umar", "Vera", "Wei", "Ximena", "Yusuf", "Zoe", "Anika", "Boris", "Carla", "Dmitri",
         "Emma", "Felix", "Gina", "Hassan", "Ivy", "Jakob", "Kira", "Luis", "Mira", "Nils",
         "Olga", "Pablo", "Rhea", "Sami", "Tomas", "Uma", "Viktor", "Wanda", "Yara", "Zane"]
CITIES = ["Lisbon", "Oslo", "Kyoto", "Lima", "Cairo", "Quito", "Perth", "Riga", "Turin", "Dakar",
          "Hanoi", "Bergen", "Porto", "Leeds", "Graz", "Nantes", "Cork", "Basel", "Malmo", "Split"]
ITEMS = ["apples", "bolts", "cables", "desks", "eggs", "filters", "gloves", "hammers", "inks",
         "jars", "kettles", "lamps", "mugs", "nails", "oranges", "pens", "quilts", "rulers",
         "soaps", "tapes", "valves", "wires", "boxes", "chairs", "forks", "sensors"]


def _pool_of(word: str) -> str:
    return "heldout" if zlib.crc32(word.encode()) % 5 == 0 else "train"


class Values:
    """Draws the varying values of one sample from the split's pools."""

    def __init__(self, rng: random.Random, split: str):
        self.r = rng
        self.split = split
        names = [n for i, n in enumerate(NAMES) if (i % 5 == 0) == (split == "heldout")]
        cities = [c for i, c in enumerate(CITIES) if (i % 5 == 0) == (split == "heldout")]
        items = [c for i, c in enumerate(ITEMS) if (i % 5 == 0) == (split == "heldout")]
        self.names, self.cities, self.items = names, cities, items
        self.hi = 60000 if split == "heldout" else 20000

    def word(self, syll=None):
        r = self.r
        while True:
            n = syll or r.choice([2, 2, 3])
            w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) + r.choice(_CODAS) for _ in range(n))
            if 4 <= len(w) <= 12 and _pool_of(w) == self.split:
                return w

    def num(self, lo=2, hi=None):
        """Log-uniform integer in [lo, hi]."""
        import math
        hi = hi or self.hi
        return int(math.exp(self.r.uniform(math.log(lo), math.log(hi + 1)))) if hi > lo else lo

    def code(self):
        r = self.r
        return "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(2)) + "-" + str(r.randint(100, 9999))

    def date(self):
        r = self.r
        y = r.choice([2025, 2026, 2027]) if self.split == "train" else r.choice([2028, 2029])
        return f"{y}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"

    def filename(self, ext=None):
        return self.word() + "." + (ext or self.r.choice(["txt", "md", "conf", "log", "csv"]))

    def pick(self, seq):
        return self.r.choice(seq)


# ---------------------------------------------------------------------------------------------
# Templates. Each list: train templates first, then `heldout:` ones (never used in train).
# ---------------------------------------------------------------------------------------------

T = {
    "calc_q": (["What is {e}?", "Compute {e}.", "Please calculate {e}.", "Can you work out {e}?",
                "I need the result of {e}.", "{e} = ?"],
               ["Evaluate {e} for me.", "How much is {e}?"]),
    "calc_a": (["{e} = {v}.", "The result is {v}.", "It comes to {v}.", "{v}"],
               ["That gives {v}.", "Answer: {v}."]),
    "clock_q": (["What's the date today?", "What time is it?", "Which day is it today?",
                 "Tell me the current date and time."],
                ["Do you know today's date?", "Check the clock, please."]),
    "clock_a": (["It is {v}.", "Now: {v}.", "The clock says {v}."], ["Current time: {v}."]),
    "read_q": (["What does {f} say?", "Show me the contents of {f}.", "Read {f}.",
                "Open {f} and tell me what is in it."],
               ["Print {f} for me.", "I'd like to see {f}."]),
    "field_q": (["What is the {k} in {f}?", "Look up {k} in {f}.", "Which {k} is set in {f}?",
                 "Check {f}: what is {k}?"],
                ["Find the value of {k} in the file {f}.", "In {f}, what's {k}?"]),
    "field_a": (["The {k} in {f} is {v}.", "{k} = {v}.", "{f} sets {k} to {v}.", "It is {v}."],
                ["{v} is the {k}.", "Found it: {k} is {v}."]),
    "note_save_q": (["Remember that {k} is {v}.", "Save a note: {k} = {v}.",
                     "Please note {k}: {v}.", "Keep this in mind: {k} is {v}."],
                    ["Store {k} = {v} in your notes.", "Write down that {k} is {v}."]),
    "note_save_a": (["Saved: {k} is {v}.", "Noted.", "Done, I saved {k}."],
                    ["Got it, {k} stored."]),
    "note_read_q": (["What did I save as {k}?", "Read my note {k}.", "What is in the note {k}?"],
                    ["Look up my note called {k}."]),
    "list_q": (["What files are in {d}?", "List the directory {d}.", "Show me what is inside {d}."],
               ["Which entries does {d} contain?"]),
    "total_q": (["{f} lists prices. What do {n} {it} cost?",
                 "Using the prices in {f}, how much are {n} {it}?",
                 "Read {f} and compute the cost of {n} {it}."],
                ["Check {f} for the unit price of {it}, then tell me the total for {n}.",
                 "How much would {n} {it} cost according to {f}?"]),
    "total_a": (["{n} {it} cost {v} ({n} x {p}).", "The total is {v}.", "{n} {it} at {p} each: {v}."],
                ["That's {v} in total.", "Total for {n} {it}: {v}."]),
    "age_q": (["How many days until {d}? Today's date is on the clock.",
               "Read the clock and tell me the year plus {n}."],
              ["Take the current year from the clock and add {n}."]),
    "multi_q": (["What are {e1} and {e2}?", "Compute both {e1} and {e2}.",
                 "I need two results: {e1}, and {e2}."],
                ["Work out {e1} as well as {e2}."]),
    "multi_a": (["{e1} = {v1} and {e2} = {v2}.", "First: {v1}. Second: {v2}."],
                ["Results: {v1} and {v2}."]),
    "notool_q": (["My name is {n}. What's my name?", "Please repeat this code exactly: {c}.",
                  "Hi! I'm {n} from {ci}. Where am I from?", "Say the word {w} twice."],
                 ["Echo back the following: {c}.", "I live in {ci}. Which city do I live in?"]),
    "recall_q": (["Earlier you read {f}. What was the {k} in it?",
                  "Going back to the start: what was the {k} in {f}?",
                  "Remind me, what was {k} in {f}?",
                  "What was the result of the first calculation, {e}?",
                  "What was my locker code that I told you at the beginning?",
                  "What value did I ask you to remember for {k}?"],
                 ["Before all that, {f} had a {k}. What was it?",
                  "Quick question about the beginning: the {k} from {f}?",
                  "At the start, what did {e} come out as?",
                  "Which code did I give you first?"]),
}


def tpl(rng, split, key):
    tr, ho = T[key]
    return rng.choice(ho if split == "heldout" else tr)


SYSTEMS = (["You are cedar, a helpful assistant. Use the tools when they help.",
            "You are a careful assistant with tools. Answer briefly.",
            "You are cedar. Call tools to read files, compute and check facts; otherwise answer directly.",
            ""],
           ["You are an agent running on cedar. Prefer tools for facts and arithmetic.",
            "Assistant with tool access. Keep answers short."])


# ---------------------------------------------------------------------------------------------
# Transcript construction helpers
# ---------------------------------------------------------------------------------------------


class Session:
    """Builds one transcript; tool results come from run_tool on the world."""

    def __init__(self, rng, split, world, mcp):
        self.r, self.split, self.world, self.mcp = rng, split, world, mcp
        self.messages: List[Dict[str, Any]] = []
        self.used = set()
        self.n_calls = 0

    def user(self, text):
        import copy
        self.messages.append({"role": "user", "content": text})
        self.world_at_last_user = copy.deepcopy(self.world)

    def call(self, calls: List[Tuple[str, Dict[str, Any]]], content=""):
        """One assistant turn with these calls, then their tool messages. -> result texts."""
        tcs, results = [], []
        for name, args in calls:
            self.n_calls += 1
            cid = f"call_{self.n_calls}"
            tcs.append({"id": cid, "type": "function",
                        "function": {"name": name, "arguments": args}})
            self.used.add(name)
        self.messages.append({"role": "assistant", "content": content, "tool_calls": tcs})
        for tc, (name, args) in zip(tcs, calls):
            text, _ = run_tool(name, args, self.world)
            results.append(text)
            self.messages.append({"role": "tool", "tool_call_id": tc["id"], "content": text})
        return results

    def answer(self, text):
        self.messages.append({"role": "assistant", "content": text})

    # file access through the built-in or the MCP tool
    def read_call(self, rel):
        if self.mcp:
            return (MCP_PREFIX + "read_text_file", {"path": f"{MCP_ROOT}/{rel}"})
        return ("file_read", {"path": rel})

    def list_call(self, rel):
        if self.mcp:
            return (MCP_PREFIX + "list_directory", {"path": f"{MCP_ROOT}/{rel}" if rel else MCP_ROOT})
        return ("file_list", {"path": rel or "."})

    def show_path(self, rel):
        return f"{MCP_ROOT}/{rel}" if self.mcp else rel


def _expr(v: Values, hard=False):
    r = v.r
    a, b = v.num(), v.num(2, 999 if not hard else None)
    op = r.choice(["+", "-", "*", "*", "/"]) if True else "+"
    if op == "/":
        b = v.num(2, 99)
        a = b * v.num(2, 999)
    e = f"{a} {op} {b}"
    if hard and r.random() < 0.5:
        c = v.num(2, 99)
        e = f"({e}) {r.choice(['+', '-', '*'])} {c}"
    return e, format_number(calc_eval(e))


def _config_file(v: Values, n_keys=None):
    """A key = value config file: returns (text, {key: value})."""
    r = v.r
    keys = ["port", "host", "user", "timeout", "retries", "region", "owner", "version", "limit",
            "token", "color", "level", "mode", "budget", "city", "team"]
    ks = r.sample(keys, n_keys or r.randint(3, 7))
    kv = {}
    for k in ks:
        if k in ("port", "timeout", "retries", "limit", "budget", "version", "level"):
            kv[k] = str(v.num(1, 65000 if k == "port" else None))
        elif k == "city":
            kv[k] = v.pick(v.cities)
        elif k in ("user", "owner"):
            kv[k] = v.pick(v.names).lower()
        elif k == "token":
            kv[k] = v.code()
        else:
            kv[k] = v.word()
    return "\n".join(f"{k} = {val}" for k, val in kv.items()), kv


def _price_file(v: Values):
    items = v.r.sample(v.items, min(len(v.items), v.r.randint(3, 6)))
    prices = {it: v.num(1, 500) for it in items}
    return "\n".join(f"{it}: {p}" for it, p in prices.items()), prices


def _prose_file(v: Values, n_lines):
    r = v.r
    lines = []
    for _ in range(n_lines):
        lines.append(" ".join(v.word() for _ in range(r.randint(4, 9))) + r.choice([".", ".", "?", "!"]))
    return "\n".join(lines)


def _populate_fs(v: Values, world, n_files):
    """Random directories of config / price / prose files. Returns the list of paths."""
    r = v.r
    dirs = [""] + [v.word() for _ in range(r.randint(1, 3))]
    paths = []
    for _ in range(n_files):
        d = r.choice(dirs)
        kind = r.random()
        if kind < 0.45:
            text, _ = _config_file(v)
            name = v.filename("conf")
        elif kind < 0.65:
            text, _ = _price_file(v)
            name = v.filename("csv")
        else:
            text = _prose_file(v, r.randint(2, 6))
            name = v.filename(r.choice(["txt", "md", "log"]))
        p = (d + "/" if d else "") + name
        world["files"][p] = text
        paths.append(p)
    return paths


# ---------------------------------------------------------------------------------------------
# Families. Each returns (session, expect) after adding the graded turn; the graded turn is
# everything after the last user message.
# ---------------------------------------------------------------------------------------------


def fam_single(s: Session, v: Values):
    r = v.r
    kind = r.choice(["calc", "calc", "clock", "read", "field", "list", "note"]
                    + (["write", "search"] if s.mcp else []))
    if kind == "write":
        rel = v.filename("txt")
        body = " ".join(v.word() for _ in range(r.randint(2, 6)))
        s.user(f"Write '{body}' to {s.show_path(rel)}." if s.split == "train"
               else f"Create {s.show_path(rel)} containing: {body}")
        res = s.call([(MCP_PREFIX + "write_file", {"path": s.show_path(rel), "content": body})])[0]
        s.answer(f"Done: {res}.")
        return s.show_path(rel)
    if kind == "search":
        paths = _populate_fs(v, s.world, r.randint(3, 8))
        ext = r.choice(sorted({p.rsplit(".", 1)[1] for p in paths}))
        s.user(f"Find all .{ext} files under {MCP_ROOT}." if s.split == "train"
               else f"Which .{ext} files exist in {MCP_ROOT}?")
        res = s.call([(MCP_PREFIX + "search_files", {"path": MCP_ROOT, "pattern": f"**/*.{ext}"})])[0]
        s.answer("Found:\n" + res)
        return res.split("\n")[0]
    if kind == "calc":
        e, val = _expr(v, hard=r.random() < 0.4)
        s.user(tpl(r, s.split, "calc_q").format(e=e))
        res = s.call([("calculator", {"expression": e})])[0]
        s.answer(tpl(r, s.split, "calc_a").format(e=e, v=res))
        return val
    if kind == "clock":
        s.user(tpl(r, s.split, "clock_q"))
        res = s.call([("clock", {})])[0]
        s.answer(tpl(r, s.split, "clock_a").format(v=res))
        return res
    if kind in ("read", "field"):
        text, kv = _config_file(v)
        rel = (v.word() + "/" if r.random() < 0.5 else "") + v.filename("conf")
        s.world["files"][rel] = text
        if kind == "read":
            s.user(tpl(r, s.split, "read_q").format(f=s.show_path(rel)))
            res = s.call([s.read_call(rel)])[0]
            s.answer(f"{s.show_path(rel)} contains:\n{res}")
            return text.split("\n")[0]
        k = r.choice(list(kv))
        s.user(tpl(r, s.split, "field_q").format(k=k, f=s.show_path(rel)))
        s.call([s.read_call(rel)])
        s.answer(tpl(r, s.split, "field_a").format(k=k, f=s.show_path(rel), v=kv[k]))
        return kv[k]
    if kind == "list":
        paths = _populate_fs(v, s.world, r.randint(2, 6))
        d = r.choice(sorted({p.rsplit("/", 1)[0] if "/" in p else "" for p in paths}))
        s.user(tpl(r, s.split, "list_q").format(d=s.show_path(d) if d else (MCP_ROOT if s.mcp else "the workspace root")))
        res = s.call([s.list_call(d)])[0]
        names = [ln.split(" ", 1)[-1] if s.mcp else ln for ln in res.split("\n")]
        s.answer("It contains: " + ", ".join(names) + ".")
        return names[0]
    # note: save then (same turn family) read back in a second user turn
    k, val = v.word(), str(v.num())
    s.world["notes"][k] = val
    s.user(tpl(r, s.split, "note_read_q").format(k=k))
    res = s.call([("notes_read", {"key": k})])[0]
    s.answer(f"Your note {k} says {res}.")
    return val


def fam_chain(s: Session, v: Values):
    r = v.r
    kind = r.choice(["price", "price", "field_calc", "note_calc", "clock_calc"])
    if kind == "price":
        text, prices = _price_file(v)
        rel = v.filename("csv")
        s.world["files"][rel] = text
        it = r.choice(list(prices))
        n = v.num(2, 99)
        s.user(tpl(r, s.split, "total_q").format(f=s.show_path(rel), n=n, it=it))
        s.call([s.read_call(rel)])
        e = f"{n} * {prices[it]}"
        res = s.call([("calculator", {"expression": e})])[0]
        s.answer(tpl(r, s.split, "total_a").format(n=n, it=it, p=prices[it], v=res))
        return res
    if kind == "field_calc":
        text, kv = _config_file(v)
        num_keys = [k for k, x in kv.items() if x.isdigit()]
        if not num_keys:
            kv["limit"] = str(v.num())
            text += f"\nlimit = {kv['limit']}"
            num_keys = ["limit"]
        rel = v.filename("conf")
        s.world["files"][rel] = text
        k = r.choice(num_keys)
        m = v.num(2, 50)
        op = r.choice(["*", "+"])
        word = "times" if op == "*" else "plus"
        s.user(f"What is the {k} in {s.show_path(rel)} {word} {m}?")
        s.call([s.read_call(rel)])
        res = s.call([("calculator", {"expression": f"{kv[k]} {op} {m}"})])[0]
        s.answer(f"The {k} is {kv[k]}, so {kv[k]} {op} {m} = {res}.")
        return res
    if kind == "note_calc":
        k = v.word()
        val = v.num()
        s.world["notes"][k] = str(val)
        m = v.num(2, 99)
        s.user(f"Take the number in my note {k} and multiply it by {m}.")
        s.call([("notes_read", {"key": k})])
        res = s.call([("calculator", {"expression": f"{val} * {m}"})])[0]
        s.answer(f"{val} * {m} = {res}.")
        return res
    n = v.num(2, 40)
    s.user(tpl(r, s.split, "age_q").format(d=v.date(), n=n) if False else
           f"Read the clock and tell me what year it will be in {n} years.")
    now = s.call([("clock", {})])[0]
    year = now[:4]
    res = s.call([("calculator", {"expression": f"{year} + {n}"})])[0]
    s.answer(f"In {n} years it will be {res}.")
    return res


def fam_multi(s: Session, v: Values):
    r = v.r
    kind = r.choice(["calc2", "read2", "mixed"])
    if kind == "calc2":
        (e1, _), (e2, _) = _expr(v), _expr(v)
        s.user(tpl(r, s.split, "multi_q").format(e1=e1, e2=e2))
        v1, v2 = s.call([("calculator", {"expression": e1}), ("calculator", {"expression": e2})])
        s.answer(tpl(r, s.split, "multi_a").format(e1=e1, e2=e2, v1=v1, v2=v2))
        return v2
    if kind == "read2":
        (t1, kv1), (t2, kv2) = _config_file(v), _config_file(v)
        f1, f2 = v.filename("conf"), v.filename("conf")
        if f1 == f2:
            f2 = "b" + f2
        s.world["files"][f1], s.world["files"][f2] = t1, t2
        k1, k2 = r.choice(list(kv1)), r.choice(list(kv2))
        s.user(f"Tell me the {k1} in {s.show_path(f1)} and the {k2} in {s.show_path(f2)}.")
        s.call([s.read_call(f1), s.read_call(f2)])
        s.answer(f"{s.show_path(f1)}: {k1} = {kv1[k1]}. {s.show_path(f2)}: {k2} = {kv2[k2]}.")
        return kv2[k2]
    e, _ = _expr(v)
    s.user(f"What's the date, and what is {e}?")
    now, val = s.call([("clock", {}), ("calculator", {"expression": e})])
    s.answer(f"It is {now}, and {e} = {val}.")
    return val


def fam_error(s: Session, v: Values):
    r = v.r
    kind = r.choice(["path", "path", "calc", "note"])
    if kind == "path":
        text, kv = _config_file(v)
        d = v.word()
        rel = f"{d}/{v.filename('conf')}"
        s.world["files"][rel] = text
        for _ in range(r.randint(0, 2)):
            s.world["files"][f"{d}/{v.filename()}"] = _prose_file(v, 2)
        k = r.choice(list(kv))
        base = rel.split("/")[-1]
        s.user(f"What is the {k} in {base}? It is somewhere in {s.show_path(d)}."
               if r.random() < 0.5 else f"What is the {k} in {base}?")
        s.call([s.read_call(base)])
        s.call([s.list_call(d)])
        s.call([s.read_call(rel)])
        s.answer(tpl(r, s.split, "field_a").format(k=k, f=s.show_path(rel), v=kv[k]))
        return kv[k]
    if kind == "calc":
        a, b = v.num(), v.num(2, 999)
        op, bad = r.choice([("*", "x"), ("*", "times"), ("/", ":"), ("+", "plus")])
        s.user(f"Calculate {a} {bad} {b}.")
        s.call([("calculator", {"expression": f"{a} {bad} {b}"})])
        if op == "/":
            a = a - a % b if a >= b else a * b
        e = f"{a} {op} {b}"
        res = s.call([("calculator", {"expression": e})])[0]
        s.answer(f"{e} = {res}.")
        return res
    k, val = v.word(), str(v.num())
    real = k + r.choice(["_notes", "s", "_list"])
    s.world["notes"][real] = val
    s.user(f"Read my note {k}. If it does not exist, try {real}.")
    s.call([("notes_read", {"key": k})])
    res = s.call([("notes_read", {"key": real})])[0]
    s.answer(f"The note {k} does not exist; {real} says {res}.")
    return val


def fam_notool(s: Session, v: Values):
    r = v.r
    n, c, ci, w = v.pick(v.names), v.code(), v.pick(v.cities), v.word()
    q = tpl(r, s.split, "notool_q").format(n=n, c=c, ci=ci, w=w)
    s.user(q)
    if "name" in q:
        ans, exp = f"Your name is {n}.", n
    elif "code" in q or "Echo" in q:
        ans, exp = c, c
    elif "twice" in q:
        ans, exp = f"{w} {w}", f"{w} {w}"
    else:
        ans, exp = f"You are from {ci}." if "from" in q else f"You live in {ci}.", ci
    s.answer(ans)
    return exp


def _filler_turn(s: Session, v: Values, files):
    """One ordinary exchange of a long session (adds ~60-400 tokens)."""
    r = v.r
    x = r.random()
    if x < 0.35 and files:
        rel = r.choice(files)
        s.user(tpl(r, "train" if s.split == "train" else "heldout", "read_q").format(f=s.show_path(rel)))
        res = s.call([s.read_call(rel)])[0]
        s.answer(f"Here it is:\n{res}" if r.random() < 0.5 else f"{s.show_path(rel)} has {len(res.splitlines())} lines.")
    elif x < 0.6:
        fam_single(s, v)
    elif x < 0.75:
        fam_multi(s, v)
    elif x < 0.85:
        fam_chain(s, v)
    else:
        fam_notool(s, v)


def fam_recall(s: Session, v: Values, target_chars):
    """Key fact near the start, filler turns until ~target_chars, then the question."""
    r = v.r
    files = _populate_fs(v, s.world, r.randint(3, 8))
    kind = r.choice(["file", "file", "calc", "code", "note"])
    s.user(r.choice(["Hi.", "Let's get started.", "Hello, I have a few tasks."]) if r.random() < 0.3 else "")
    if not s.messages[-1]["content"]:
        s.messages.pop()
    else:
        s.answer(r.choice(["Hello! What can I do for you?", "Sure, go ahead."]))
    if kind == "file":
        text, kv = _config_file(v, r.randint(4, 7))
        rel = v.filename("conf")
        s.world["files"][rel] = text
        k = r.choice(list(kv))
        s.user(tpl(r, s.split, "read_q").format(f=s.show_path(rel)))
        s.call([s.read_call(rel)])
        s.answer(r.choice([f"{s.show_path(rel)} holds {len(kv)} settings.", "Done, I have read it.",
                           f"It has these keys: {', '.join(kv)}."]))
        q = r.choice([t for t in (T['recall_q'][1] if s.split == 'heldout' else T['recall_q'][0])
                      if "{f}" in t]).format(f=s.show_path(rel), k=k)
        ans, exp = f"The {k} in {s.show_path(rel)} was {kv[k]}.", kv[k]
        marker = kv[k]
    elif kind == "calc":
        e, _ = _expr(v, hard=True)
        s.user(tpl(r, s.split, "calc_q").format(e=e))
        val = s.call([("calculator", {"expression": e})])[0]
        s.answer(tpl(r, s.split, "calc_a").format(e=e, v=val))
        q = r.choice([t for t in (T['recall_q'][1] if s.split == 'heldout' else T['recall_q'][0])
                      if "{e}" in t]).format(e=e)
        ans, exp, marker = f"{e} was {val}.", val, val
    elif kind == "code":
        c = v.code()
        s.user(f"My locker code is {c}. Please remember it." if s.split == "train"
               else f"Keep this for later: my code is {c}.")
        s.answer("Got it.")
        q = r.choice([t for t in (T['recall_q'][1] if s.split == 'heldout' else T['recall_q'][0])
                      if "code" in t])
        ans, exp, marker = f"Your code is {c}.", c, c
    else:
        k, val = v.word(), str(v.num())
        s.user(tpl(r, s.split, "note_save_q").format(k=k, v=val))
        s.call([("notes_save", {"key": k, "text": val})])
        s.answer(tpl(r, s.split, "note_save_a").format(k=k, v=val))
        q = (r.choice(T["recall_q"][0][5:6]) if s.split == "train"
             else "Which value did I tell you to store for {k}?").format(k=k)
        ans, exp, marker = f"You asked me to remember {val} for {k}.", val, val
    start = len(chat.encode_messages(s.messages))
    while len(chat.encode_messages(s.messages)) - start < target_chars:
        _filler_turn(s, v, files)
    s.user(q)
    s.answer(ans)
    return exp, marker


FAMILY_WEIGHTS = {"single": 0.14, "chain": 0.12, "multi": 0.10, "error": 0.09, "notool": 0.07,
                  "recall": 0.48}
FAMILIES = list(FAMILY_WEIGHTS)


def make_sample(seed: int, index: int, split: str = "train", family: Optional[str] = None,
                recall_chars: Tuple[int, int] = (1500, 9000)) -> Dict[str, Any]:
    """One deterministic sample. recall_chars: range of the recall distance in characters."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split {split!r}: expected 'train' or 'heldout'")
    r = random.Random(f"{seed}/{split}/{index}")
    v = Values(r, split)
    if family is None:
        family = r.choices(FAMILIES, weights=[FAMILY_WEIGHTS[f] for f in FAMILIES])[0]
    if family not in FAMILY_WEIGHTS:
        raise ValueError(f"family {family!r}: expected one of {FAMILIES}")
    mcp = r.random() < 0.4
    world = new_world(f"{v.date()} {r.randint(0, 23):02d}:{r.randint(0, 59):02d}")
    s = Session(r, split, world, mcp)
    sysmsg = r.choice(SYSTEMS[1] if split == "heldout" else SYSTEMS[0])
    world0 = None
    marker = None
    if family == "recall":
        exp, marker = fam_recall(s, v, r.randint(*recall_chars))
    else:
        if r.random() < 0.3:  # a short unrelated exchange first
            fam_notool(s, v) if r.random() < 0.5 else fam_single(s, v)
        exp = {"single": fam_single, "chain": fam_chain, "multi": fam_multi, "error": fam_error,
               "notool": fam_notool}[family](s, v)
    # tools offered: those used + a few others (fixed order of TOOL_SCHEMAS)
    pool = BUILTIN_TOOLS + (MCP_TOOLS if mcp else [])
    extra = set(r.sample(pool, r.randint(1, 4)))
    names = [n for n in TOOL_SCHEMAS if n in s.used or n in extra]
    messages = [{"role": "system", "content": sysmsg,
                 "tools": [TOOL_SCHEMAS[n] for n in names]}] + s.messages
    last_user = max(k for k, m in enumerate(messages) if m["role"] == "user")
    # the world as it was when the graded turn started (replay the earlier writes)
    world0 = s.world_at_last_user
    out = {"id": f"{split}-{seed}-{index}", "family": family, "split": split, "tools": names,
           "world": world0, "messages": messages, "n_prompt": last_user + 1, "expect": exp}
    if marker is not None:
        text = chat.encode_messages(messages[:last_user + 1])
        first = text.find(marker)
        out["distance_chars"] = len(text) - first if first >= 0 else 0
    return out


# ---------------------------------------------------------------------------------------------
# Rendering and tokenization
# ---------------------------------------------------------------------------------------------


def render_sample(messages) -> List[Tuple[str, bool]]:
    """-> [(text, is_assistant)] whose concatenation is chat.encode_messages(messages)."""
    segs, prev = [], ""
    for k in range(1, len(messages) + 1):
        if k < len(messages) and messages[k]["role"] in ("tool",) and messages[k - 1]["role"] == "tool":
            continue
        text = chat.encode_messages(messages[:k])
        if not text.startswith(prev):
            raise ValueError(f"rendering of message {k - 1} is not a prefix extension")
        delta = text[len(prev):]
        if messages[k - 1]["role"] == "assistant":
            if not delta.endswith(EOS):
                raise ValueError("assistant turn does not end with EOS")
            segs.append((delta, True))
        else:
            # a user-side prefix of the next turn includes the generation prefix only when the
            # next message is an assistant; keep that prefix on the prompt side
            segs.append((delta, False))
        prev = text
    full = chat.encode_messages(messages)
    if "".join(t for t, _ in segs) != full:
        raise ValueError("segments do not rebuild the prompt")
    return segs


def tokenize_sample(tok, messages) -> Tuple[List[int], List[int]]:
    """-> (ids, mask) with mask[i] = 1 iff token i belongs to an assistant turn."""
    ids, mask = [], []
    for text, is_asst in render_sample(messages):
        t = tok.encode(text)
        ids.extend(t)
        mask.extend([1 if is_asst else 0] * len(t))
    return ids, mask


def prompt_text(sample) -> str:
    """The prompt of the graded turn (ends with the generation prefix)."""
    return chat.encode_messages(sample["messages"][:sample["n_prompt"]])


def check_generation_prefix(text: str) -> bool:
    return text.endswith(ASSISTANT + THINK_END)
