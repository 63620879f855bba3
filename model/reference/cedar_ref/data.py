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
  * Train breadth (train split only; held-out samples are byte-for-byte what they were before
    it, pinned by a hash in tests/reference/test_data.py): 15+ paraphrases per question
    template key and several per answer key (T, drawn by tpl / ttpl), 16 system prompts, light
    wrappers on user messages (_wrap_train: a lead-in, a closing word, a lower-case first
    word, a missing final mark) and notool exchanges of 12 sub-kinds (NOTOOL_TRAIN: restate a
    name, city, number or code, repeat a word, yes/no and comparisons about the message,
    list positions, facts the user already gave, greetings). Every train-only random draw sits
    on a train-only code path, so the held-out random stream is unchanged.
  * Train robustness (issue 6, held-out success 41%; train only, each rate a module constant
    with its reason): composed requests, a real verb of the request's intent in a frame
    around its object (_compose_request, _REAL_VERB_P = 0.2; never near a held-out template);
    composed notool questions, a statement carrying a value, sometimes a distractor, and a
    question about it (_compose_notool, _NOTOOL_COMPOSED_P = 0.4, same rule);
    requests that lose their verb for a pseudo-word or none (_PSEUDO_VERB_P: measured
    harmful, now 0), more ways to name a note key; the error family adds
    more kinds of failure, two failures in a row and no guessed directory names
    (_ERROR_TRAIN_KINDS); config files a graded turn reads have 3-12 lines (_TRAIN_CONFIG_KEYS).
  * render_sample(): the V4.1 prompt text (cedar_ref.chat.encode_messages, chat mode) cut into
    segments [(text, is_assistant)]; tokenize_sample() turns it into ids + a loss mask that is
    1 exactly on assistant tokens (their content, DSML block and end-of-sentence).

Invariants: make_sample(seed, i, split) depends only on its arguments (its own random.Random);
rendering every prefix of a transcript gives a prefix of the whole rendering (checked).
"""

from __future__ import annotations

import datetime
import difflib
import functools
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


# The built-in clock of the runtime (runtime/builtin_tools.cpp) answers "2026-12-03 08:11
# (Thursday)"; eval task files fix "now" without the weekday. Until session 18 every train clock
# read gave the latter, and `cedar demo` answered the real clock with "It is 2026-12-03
# 08:11-12-03 08:11.". Half of the train samples (train only) now carry the weekday.
_CLOCK_WEEKDAY_P = 0.5


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


# Train-only additions to the value lists above (never drawn by the held-out split, none of them a
# held-out value): with 40 names and 16 cities the model memorised the train values and, given a
# held-out city ("I live in Hanoi"), answered a train one ("Turin"). Hundreds of values make
# copying from the context the only way to be right (issue 6: "values varied widely").
EXTRA_TRAIN_NAMES = [
    "Aaron", "Abel", "Ada", "Adele", "Adrian", "Agnes", "Aiko", "Aisha", "Alba", "Aldo", "Alma",
    "Amir", "Amos", "Ana", "Andrei", "Anton", "Arjun", "Astrid", "Aurora", "Axel", "Beatriz",
    "Bela", "Bianca", "Bjorn", "Bram", "Caleb", "Camila", "Carmen", "Cecil", "Chiara", "Clara",
    "Colm", "Cyrus", "Dagny", "Dario", "Deepa", "Derya", "Diego", "Dora", "Edgar", "Edith",
    "Efe", "Eldar", "Elena", "Elias", "Ella", "Emil", "Enzo", "Erik", "Esra", "Ezra", "Fatima",
    "Femi", "Filip", "Flora", "Frida", "Gabor", "Gael", "Gemma", "Goran", "Hana", "Hamid",
    "Hedda", "Heidi", "Helga", "Henrik", "Hiro", "Ida", "Igor", "Ilse", "Imani", "Irene",
    "Isaac", "Ivan", "Jana", "Jasper", "Joao", "Jorge", "Josef", "Juno", "Kai", "Karim",
    "Kasper", "Katya", "Keanu", "Kofi", "Lars", "Layla", "Leo", "Liam", "Lila", "Linus",
    "Lucia", "Lukas", "Magnus", "Maja", "Malik", "Mateo", "Maya", "Milan", "Mina", "Moritz",
    "Nadir", "Naomi", "Nell", "Nico", "Nina", "Noor", "Odile", "Oskar", "Otto", "Paula",
    "Petra", "Pia", "Radu", "Rafael", "Ravi", "Reza", "Rina", "Ruben", "Ruth", "Saanvi",
    "Selma", "Sergio", "Silas", "Sofia", "Stella", "Stefan", "Talia", "Teo", "Thea", "Timo",
    "Ugo", "Ulla", "Valentin", "Vanya", "Wiebke", "Xavier", "Yann", "Yuki", "Zara", "Zeno"]
EXTRA_TRAIN_CITIES = [
    "Aarhus", "Accra", "Adelaide", "Antwerp", "Athens", "Austin", "Baku", "Bilbao", "Bogota",
    "Bonn", "Bremen", "Brno", "Bruges", "Busan", "Cadiz", "Calgary", "Cardiff", "Cusco",
    "Delft", "Denver", "Dijon", "Dublin", "Durban", "Essen", "Faro", "Fez", "Geneva", "Genoa",
    "Ghent", "Hamburg", "Havana", "Helsinki", "Izmir", "Jaipur", "Kaunas", "Kiev", "Kobe",
    "Krakow", "Lagos", "Lahore", "Leipzig", "Lille", "Linz", "Lucerne", "Lyon", "Madrid",
    "Malaga", "Manila", "Medan", "Minsk", "Mombasa", "Munich", "Muscat", "Nagoya", "Naples",
    "Nice", "Odense", "Osaka", "Ottawa", "Padua", "Parma", "Pisa", "Poznan", "Prague", "Pune",
    "Rabat", "Reno", "Rome", "Salzburg", "Seville", "Sofia", "Tartu", "Tbilisi", "Tokyo",
    "Toledo", "Tunis", "Utrecht", "Valencia", "Verona", "Vienna", "Vilnius", "Warsaw", "York",
    "Zagreb", "Zurich"]
EXTRA_TRAIN_ITEMS = [
    "batteries", "bottles", "brushes", "buckets", "candles", "clamps", "cups", "drills",
    "envelopes", "fans", "folders", "hinges", "hoses", "keys", "knives", "ladders", "locks",
    "magnets", "maps", "mops", "notebooks", "plates", "pliers", "ropes", "screws", "shelves",
    "spoons", "staplers", "towels", "trays", "tubes", "washers"]


# Train years: all of 2000-2049 but the held-out two. With 2025-2027 only, the model cut the
# held-out dates it had to copy ("It is currently 202931" for 2029-12-20 05:31): the years too
# must be copied, not recalled.
_TRAIN_YEARS = [y for y in range(2000, 2050) if y not in (2028, 2029)]


def _pool_of(word: str) -> str:
    return "heldout" if zlib.crc32(word.encode()) % 5 == 0 else "train"


# Real names (session 30). Every pool above draws made-up words (steamgolshex.conf), and the
# shipped model copied none of the names people use: `cedar run "What's in app.conf?"` read
# "wapth: 2" (tests/eval/everyday.jsonl: 7 of 34 everyday requests right). Train
# samples made with make_sample(..., real_names=P) draw each word from these English file, folder
# and note names with probability P, alone, joined ("db_backup", "api-keys") or numbered
# ("report2031", "build-7"). A fifth of them (by crc32, as _pool_of) and every name of the
# everyday tasks (EVERYDAY_NAMES, model/reference/make_everyday_tasks.py) are never trained on.
REAL_STEMS = [
    "access", "account", "accounts", "admin", "agent", "alerts", "alpha", "analytics", "api",
    "archive", "assets", "audio", "audit", "auth", "avatar", "balance", "bank", "base", "batch",
    "beta", "billing", "bills", "blog", "board", "books", "boot", "branch", "bucket", "bugs",
    "build", "bundle", "cache", "calendar", "camera", "campaign", "car", "cards", "cart", "chat",
    "checkout", "chores", "city", "class", "client", "cloud", "cluster", "code", "colors",
    "common", "config", "console", "core", "course", "credits", "cron", "css", "customers",
    "daily", "dashboard", "data", "debug", "default", "demo", "deps", "desk", "dev", "diary",
    "dinner", "disk", "dns", "doctor", "domain", "drafts", "drive", "editor", "email", "engine",
    "env", "events", "exams", "export", "family", "feed", "files", "finance", "flags", "fleet",
    "flights", "fonts", "forms", "frontend", "game", "gateway", "gifts", "git", "goals", "grades",
    "graph", "grid", "health", "help", "history", "holiday", "home", "hooks", "host", "hotel",
    "ideas", "images", "import", "inbox", "index", "infra", "input", "jobs", "journal", "keys",
    "kitchen", "lab", "lang", "launch", "layout", "leads", "lessons", "library", "links", "lists",
    "loans", "local", "logs", "lunch", "mail", "main", "maps", "market", "media", "meeting",
    "members", "menu", "metrics", "migrate", "mobile", "model", "modules", "money", "monitor",
    "movies", "music", "network", "news", "node", "office", "orders", "output", "packages",
    "pages", "passwords", "payments", "payroll", "people", "pets", "phone", "photos", "pipeline",
    "plan", "plants", "players", "plugins", "policy", "pool", "portal", "posts", "prod",
    "profile", "project", "proxy", "public", "queue", "quotes", "rates", "readme", "receipts",
    "records", "release", "remote", "reports", "repos", "reviews", "roles", "routes", "rules",
    "runner", "sales", "school", "scores", "scripts", "search", "secrets", "service", "session",
    "setup", "shared", "shop", "shopping", "site", "sprint", "stats", "status", "stock",
    "storage", "store", "sync", "system", "tasks", "taxes", "teams", "temp", "test", "tickets",
    "timer", "tools", "tracks", "trips", "update", "upload", "users", "vault", "vendor", "video",
    "wallet", "weather", "web", "weekly", "work", "worker", "workout", "yard", "zone"]
EVERYDAY_NAMES = frozenset([
    "app", "server", "database", "prices", "budget", "invoices", "march", "docs", "guide", "faq",
    "deploy", "settings", "wifi", "rent", "gym", "groceries", "printer", "backup", "nginx",
    "staging", "dentist", "parking", "recipes", "pancakes", "team", "contacts", "locker", "garage",
    "config", "notes", "gym_time"])


def real_pool(split: str) -> List[str]:
    """The real names of a split: train never holds an everyday name or a crc32-held-out one."""
    return [w for w in REAL_STEMS
            if (w in EVERYDAY_NAMES or _pool_of(w) == "heldout") == (split == "heldout")]


_REAL_TRAIN = real_pool("train")


class Values:
    """Draws the varying values of one sample from the split's pools."""

    def __init__(self, rng: random.Random, split: str, real_names: float = 0.0):
        self.r = rng
        self.split = split
        # train only: the share of word() draws that are real names (no draw at all when 0, so
        # the stream of a seed is the one it always was)
        self.real_names = real_names if split == "train" else 0.0
        names = [n for i, n in enumerate(NAMES) if (i % 5 == 0) == (split == "heldout")]
        cities = [c for i, c in enumerate(CITIES) if (i % 5 == 0) == (split == "heldout")]
        items = [c for i, c in enumerate(ITEMS) if (i % 5 == 0) == (split == "heldout")]
        if split == "train":
            names, cities, items = (names + EXTRA_TRAIN_NAMES, cities + EXTRA_TRAIN_CITIES,
                                    items + EXTRA_TRAIN_ITEMS)
        self.names, self.cities, self.items = names, cities, items
        self.hi = 60000 if split == "heldout" else 20000

    def word(self, syll=None):
        r = self.r
        if self.real_names > 0 and syll is None and r.random() < self.real_names:
            return self.real_name()
        while True:
            n = syll or r.choice([2, 2, 3])
            w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) + r.choice(_CODAS) for _ in range(n))
            if 4 <= len(w) <= 12 and _pool_of(w) == self.split:
                return w

    def real_name(self):
        """A train real name: one word (60%), two joined by '_' or '-' (20%), or a word and a
        number (20%)."""
        r = self.r
        w, x = r.choice(_REAL_TRAIN), r.random()
        if x < 0.6:
            return w
        if x < 0.8:
            return w + r.choice("_-") + r.choice(_REAL_TRAIN)
        n = r.choice([r.randint(1, 9), r.randint(10, 99), r.randint(2000, 2035)])
        return w + r.choice(["", "", "-", "_"]) + str(n)

    def num(self, lo=2, hi=None):
        """Log-uniform integer in [lo, hi]."""
        import math
        hi = hi or self.hi
        return int(math.exp(self.r.uniform(math.log(lo), math.log(hi + 1)))) if hi > lo else lo

    def code(self):
        r = self.r
        if self.real_names > 0 and r.random() < self.real_names:
            # codes as people write them (train, real names): "LH 438", "LH438", "lh-438", "X7-22"
            a = "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(r.choice([1, 2, 2, 3])))
            n = str(r.randint(1, 9999))
            return r.choice([a + " " + n, a + n, a.lower() + "-" + n, a + str(r.randint(1, 9)) + "-" + n])
        return "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(2)) + "-" + str(r.randint(100, 9999))

    def date(self):
        r = self.r
        y = r.choice(_TRAIN_YEARS) if self.split == "train" else r.choice([2028, 2029])
        return f"{y}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"

    def filename(self, ext=None):
        return self.word() + "." + (ext or self.r.choice(["txt", "md", "conf", "log", "csv"]))

    def pick(self, seq):
        return self.r.choice(seq)


# ---------------------------------------------------------------------------------------------
# Templates. Each entry: (train templates, held-out templates); held-out ones are never used in
# train. The held-out split must stay exactly as it was when the train lists grew, so:
#   * tpl() keys (calc_q ... recall_q) draw one rng.choice from the split's own list; growing a
#     train list changes only train samples.
#   * ttpl() keys were fixed phrasings before: held-out samples take their one held-out template
#     (or, when the held-out list is empty, the first train template, the old shared phrasing)
#     WITHOUT a random draw; train samples draw from the whole train list.
# Train lists are paraphrases (word order, politeness, questions vs imperatives, terse vs chatty);
# none copies a held-out template or a near-duplicate of one (tests/reference/test_data.py).
# ---------------------------------------------------------------------------------------------

T = {
    "calc_q": (["What is {e}?", "Compute {e}.", "Please calculate {e}.", "Can you work out {e}?",
                "I need the result of {e}.", "{e} = ?",
                "What's {e}?", "Calculate {e}.", "Could you compute {e}, please?", "Solve {e}.",
                "Give me the value of {e}.", "What does {e} come to?", "Work out {e}, please.",
                "{e}?", "Tell me what {e} equals.", "Do the math: {e}.", "What do you get for {e}?",
                "Can you tell me the answer to {e}?", "Figure out {e}.",
                "I'd like the exact result of {e}.", "Quick sum: {e}", "what's {e}"],
               ["Evaluate {e} for me.", "How much is {e}?"]),
    "calc_a": (["{e} = {v}.", "The result is {v}.", "It comes to {v}.", "{v}",
                "{e} equals {v}.", "The answer is {v}.", "{e} is {v}.", "It's {v}.", "{v}.",
                "You get {v}.", "It works out to {v}.", "{e} comes out to {v}.",
                "The calculator says {e} = {v}."],
               ["That gives {v}.", "Answer: {v}."]),
    "clock_q": (["What's the date today?", "What time is it?", "Which day is it today?",
                 "Tell me the current date and time.",
                 "What day is it?", "What's the time right now?", "Current date?",
                 "Can you tell me the time?", "What is the date and time now?",
                 "Give me the current date and time.", "What's the date?",
                 "I lost track of time. What time is it?", "Date and time, please.",
                 "What year is it?", "How late is it?", "Please tell me the time and date.",
                 "What does the clock say?", "Is it still morning? What's the time?",
                 "time?"],
                ["Do you know today's date?", "Check the clock, please."]),
    "clock_a": (["It is {v}.", "Now: {v}.", "The clock says {v}.",
                 "It's {v}.", "Right now it is {v}.", "According to the clock, it is {v}.",
                 "{v}.", "The time is {v}.", "It is currently {v}.", "Today is {v}.",
                 "The date and time are {v}."],
                ["Current time: {v}."]),
    "read_q": (["What does {f} say?", "Show me the contents of {f}.", "Read {f}.",
                "Open {f} and tell me what is in it.",
                "Can you read {f}?", "Display {f}.", "What's in {f}?", "Give me the contents of {f}.",
                "Open {f}.", "Let me see what {f} contains.", "Read the file {f}, please.",
                "What is written in {f}?", "Fetch {f} and show it.", "Could you open {f}?",
                "Dump the contents of {f}.", "Tell me what {f} contains.",
                "Look at {f} and show me its text.", "{f}: what's inside?", "show {f}",
                # wishes rather than commands (the request verb is not a tool word)
                "I want to look at {f}.", "Could I get a look at {f}?",
                "I'm curious what {f} holds.", "Mind opening {f}?"],
               ["Print {f} for me.", "I'd like to see {f}."]),
    "read_a": (["{f} contains:\n{r}", "Here is {f}:\n{r}", "Contents of {f}:\n{r}",
                "The file says:\n{r}", "{f}:\n{r}", "This is what {f} holds:\n{r}",
                "{r}"], []),
    "field_q": (["What is the {k} in {f}?", "Look up {k} in {f}.", "Which {k} is set in {f}?",
                 "Check {f}: what is {k}?",
                 "What's {k} set to in {f}?", "Tell me the {k} from {f}.", "Get {k} out of {f}.",
                 "Which value does {f} give for {k}?", "{f} has a {k} setting. What is it?",
                 "What value is {k} in {f}?", "I need the {k} that {f} defines.",
                 "Read {f} and tell me the {k}.", "Can you check the {k} in {f}?",
                 "What does {f} say the {k} is?", "Give me {k} from {f}, please.",
                 "Pull the {k} out of {f}.", "Open {f}. What {k} does it use?",
                 "{k} in {f}?"],
                ["Find the value of {k} in the file {f}.", "In {f}, what's {k}?"]),
    "field_a": (["The {k} in {f} is {v}.", "{k} = {v}.", "{f} sets {k} to {v}.", "It is {v}.",
                 "The {k} is {v}.", "{f} has {k} = {v}.", "{v}", "{k} is set to {v} in {f}.",
                 "It's set to {v}.", "According to {f}, {k} is {v}.", "{k}: {v}.",
                 "The value of {k} is {v}.", "{f} says {k} = {v}."],
                ["{v} is the {k}.", "Found it: {k} is {v}."]),
    "note_save_q": (["Remember that {k} is {v}.", "Save a note: {k} = {v}.",
                     "Please note {k}: {v}.", "Keep this in mind: {k} is {v}.",
                     "Make a note that {k} is {v}.", "Note down {k}: {v}.", "Save {k} as {v}.",
                     "Please save {v} under {k}.", "Can you remember {k} = {v} for me?",
                     "Put {v} in a note called {k}.", "Jot this: {k} is {v}.", "Record {k} = {v}.",
                     "Keep a note of {k}: {v}.", "{k} is {v}, please remember that.",
                     "Create a note {k} with {v}.",
                     "note: {k} = {v}"],
                    ["Store {k} = {v} in your notes.", "Write down that {k} is {v}."]),
    "note_save_a": (["Saved: {k} is {v}.", "Noted.", "Done, I saved {k}.",
                     "Okay, {k} is saved.", "Saved {k} = {v}.", "I've noted that {k} is {v}.",
                     "Done.", "Note saved.", "All set, {k} is {v}.", "I'll remember {k}."],
                    ["Got it, {k} stored."]),
    "note_read_q": (["What did I save as {k}?", "Read my note {k}.", "What is in the note {k}?",
                     "What does my note {k} say?", "Open the note {k}.", "Check my {k} note.",
                     "What's saved under {k}?", "Tell me what I noted as {k}.",
                     "Can you read back the {k} note?", "Get my note {k}.", "Show me the note {k}.",
                     "I saved something as {k}. What was it?", "What's in my {k} note?",
                     "Read back {k} from my notes.", "Fetch note {k}.",
                     "What value is stored in note {k}?", "Remind me what my {k} note says.",
                     # more ways to introduce the key: quoted, named, titled, as an entry
                     "Read the note \"{k}\".", "What's in the note named {k}?",
                     "Show me the {k} entry from my notes.", "Open my note titled '{k}'.",
                     "What does the {k} note hold?", "Find the note with the key {k} and read it.",
                     "My notes have an entry {k}. What does it say?"],
                    ["Look up my note called {k}."]),
    "note_read_a": (["Your note {k} says {r}.", "The note {k} says {r}.", "{k}: {r}.",
                     "It says {r}.", "You saved {r} as {k}.", "{r}"], []),
    "list_q": (["What files are in {d}?", "List the directory {d}.", "Show me what is inside {d}.",
                "What's in {d}?", "List {d}.", "Show the files in {d}.",
                "Can you list the contents of {d}?", "What does the folder {d} hold?",
                "Give me a listing of {d}.", "Tell me what files {d} has.",
                "What can I find in {d}?", "Directory listing of {d}, please.",
                "Look inside {d} and list everything.", "What is stored in {d}?",
                "Could you show me the folder {d}?", "list {d}"],
               ["Which entries does {d} contain?"]),
    "list_a": (["It contains: {x}.", "{d} has: {x}.", "Entries: {x}.", "I found {x}.",
                "There are {n} entries: {x}.", "In {d}: {x}."], []),
    "total_q": (["{f} lists prices. What do {n} {it} cost?",
                 "Using the prices in {f}, how much are {n} {it}?",
                 "Read {f} and compute the cost of {n} {it}.",
                 "What's the price of {n} {it}? The prices are in {f}.",
                 "I want to buy {n} {it}. Look up the price in {f} and give me the sum.",
                 "Based on {f}, what do {n} {it} come to?", "{n} {it}: what's the cost? See {f}.",
                 "Compute the cost of {n} {it} from {f}.",
                 "What would I pay for {n} {it}? Prices: {f}.", "Use {f} to price {n} {it}.",
                 "Find the {it} price in {f} and multiply by {n}.",
                 "How expensive are {n} {it}? Look in {f}.",
                 "Look up {it} in {f}; I need {n} of them. What do I pay?",
                 "Price list is {f}. Cost of {n} {it}?",
                 "If I order {n} {it} at the prices in {f}, what do I spend?"],
                ["Check {f} for the unit price of {it}, then tell me the total for {n}.",
                 "How much would {n} {it} cost according to {f}?"]),
    "total_a": (["{n} {it} cost {v} ({n} x {p}).", "The total is {v}.", "{n} {it} at {p} each: {v}.",
                 "That comes to {v}.", "{n} x {p} = {v}.", "The cost is {v}.", "You would pay {v}.",
                 "{it} cost {p} each, so {n} cost {v}.", "{v} for {n} {it}."],
                ["That's {v} in total.", "Total for {n} {it}: {v}."]),
    "age_q": (["How many days until {d}? Today's date is on the clock.",
               "Read the clock and tell me the year plus {n}."],
              ["Take the current year from the clock and add {n}."]),
    "multi_q": (["What are {e1} and {e2}?", "Compute both {e1} and {e2}.",
                 "I need two results: {e1}, and {e2}.",
                 "Calculate {e1} and {e2}.", "What do {e1} and {e2} give?",
                 "Two sums please: {e1} and {e2}.", "Please compute {e1}, then {e2}.",
                 "{e1} and {e2}: what are the results?", "I'd like both {e1} and {e2}.",
                 "Give me {e1} and {e2}.", "Can you do {e1} and {e2} at once?",
                 "Solve these two: {e1}; {e2}.", "What are the values of {e1} and {e2}?",
                 "Compute {e1}. Also compute {e2}.", "{e1}? and {e2}?"],
                ["Work out {e1} as well as {e2}."]),
    "multi_a": (["{e1} = {v1} and {e2} = {v2}.", "First: {v1}. Second: {v2}.",
                 "{e1} is {v1}, and {e2} is {v2}.", "The first is {v1}, the second {v2}.",
                 "{e1} = {v1}; {e2} = {v2}.", "You get {v1} for the first and {v2} for the second."],
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
    # --- ttpl() keys: the old fixed phrasing first (held-out keeps it or its own one) ---------
    "write_q": (["Write '{b}' to {p}.", "Save the text '{b}' into {p}.", "Put '{b}' in {p}.",
                 "Please write '{b}' into the file {p}.", "Store '{b}' as the text of {p}.",
                 "Can you write '{b}' to {p}?", "I need {p} to say '{b}'.",
                 "Overwrite {p} with '{b}'.", "{p} should hold the text '{b}'. Write it.",
                 "Make {p} read '{b}'.", "Write the words '{b}' to {p}, please.",
                 "Save '{b}' to {p}.", "Put the line '{b}' into {p}.",
                 "Fill {p} with '{b}'.", "write '{b}' to {p}"],
                ["Create {p} containing: {b}"]),
    "write_a": (["Done: {r}.", "{r}.", "Written: {r}.", "Done, {p} now says '{b}'. {r}."], []),
    "search_q": (["Find all .{x} files under {root}.", "List every .{x} file in {root}.",
                  "Search {root} for .{x} files.", "Where are the .{x} files under {root}?",
                  "Show me all *.{x} files in {root}.", "Look for .{x} files anywhere in {root}.",
                  "I need the paths of the .{x} files in {root}.",
                  "Can you find the .{x} files below {root}?",
                  "Get me every file ending in .{x} under {root}.",
                  "Which paths under {root} end with .{x}?", "Search for *.{x} in {root}.",
                  "Locate the .{x} files under {root}.", "Find .{x} files in {root}, please.",
                  "Any .{x} files under {root}? List them.", "find *.{x} under {root}"],
                 ["Which .{x} files exist in {root}?"]),
    "search_a": (["Found:\n{r}", "Matches:\n{r}", "These match:\n{r}", "I found:\n{r}", "{r}"], []),
    "fieldcalc_q": (["What is the {k} in {f} {word} {m}?",
                     "Read {f}, take its {k} and give me that {word} {m}.",
                     "What do I get if I take the {k} from {f} {word} {m}?",
                     "Look up {k} in {f}; what is it {word} {m}?",
                     "{f} has a {k}. What's that {word} {m}?",
                     "Compute the {k} of {f} {word} {m}.", "I need the {k} from {f} {word} {m}.",
                     "Check {f}: {k} {word} {m} is what?", "Find {k} in {f}, then give me it {word} {m}.",
                     "What's {k} ({f}) {word} {m}?", "Take {k} from {f}. What is it {word} {m}?",
                     "Please work out the {k} in {f} {word} {m}.",
                     "Using {f}, what is {k} {word} {m}?", "{k} from {f}, {word} {m}: result?",
                     "Tell me the {k} in {f} {word} {m}."],
                    []),
    "fieldcalc_a": (["The {k} is {x}, so {x} {op} {m} = {v}.", "{x} {op} {m} = {v}.",
                     "{k} is {x}; {word} {m} gives {v}.", "It's {v} ({x} {op} {m}).",
                     "The {k} in {f} is {x}, and {x} {op} {m} = {v}.", "{v}."], []),
    "notecalc_q": (["Take the number in my note {k} and multiply it by {m}.",
                    "Multiply the number in note {k} by {m}.", "What is my note {k} times {m}?",
                    "Read my note {k} and multiply it by {m}.",
                    "My note {k} holds a number. What's it times {m}?",
                    "Get note {k}, then multiply by {m}.", "Note {k} times {m}, please.",
                    "Can you multiply the value in my {k} note by {m}?",
                    "Look up note {k}; I need it multiplied by {m}.",
                    "What do I get when I multiply note {k} by {m}?",
                    "Check my note {k} and give me {m} times that.",
                    "{m} times the number saved as {k}: what is it?",
                    "I saved a number as {k}. Multiply it by {m}.",
                    "Compute {m} times my note {k}.", "Please take note {k} and times it by {m}.",
                    "Multiply the note \"{k}\" by {m}.",
                    "Take the {k} entry from my notes and multiply it by {m}.",
                    "What is {m} times the note named {k}?"],
                   []),
    "notecalc_a": (["{x} * {m} = {v}.", "Your note {k} is {x}; times {m} that is {v}.",
                    "{x} times {m} is {v}.", "It's {v}.", "{k} = {x}, so the result is {v}."], []),
    "clockcalc_q": (["Read the clock and tell me what year it will be in {n} years.",
                     "What year will it be {n} years from now?", "In {n} years, what year will it be?",
                     "Check the date: which year is {n} years ahead?",
                     "Which year is it going to be in {n} years?",
                     "Look at the clock. What year comes {n} years after this one?",
                     "If I wait {n} years, what year is it then?",
                     "Tell me the year {n} years from today.",
                     "What's this year plus {n}? Use the clock.", "{n} years from now is which year?",
                     "Can you work out the year {n} years from now?",
                     "Which year will it be after {n} more years?",
                     "Get today's date and tell me the year {n} years later.",
                     "I retire in {n} years. What year is that?",
                     "What year is {n} years away?"],
                    []),
    "clockcalc_a": (["In {n} years it will be {v}.", "It will be {v}.", "{v}.",
                     "That would be {v}.", "{n} years from now it is {v}.", "The year {v}."], []),
    "read2_q": (["Tell me the {k1} in {f1} and the {k2} in {f2}.",
                 "What are the {k1} in {f1} and the {k2} in {f2}?",
                 "I need {k1} from {f1} and {k2} from {f2}.",
                 "Look up {k1} in {f1} and {k2} in {f2}.",
                 "Check {f1} for {k1} and {f2} for {k2}.",
                 "Get the {k1} of {f1}, and the {k2} of {f2}.",
                 "Read {f1} and {f2}: what are {k1} and {k2}?",
                 "{f1} has a {k1} and {f2} has a {k2}. What are they?",
                 "Give me {k1} ({f1}) and {k2} ({f2}).",
                 "Can you find the {k1} in {f1} and the {k2} in {f2}?",
                 "Two lookups: {k1} in {f1}, {k2} in {f2}.",
                 "Please tell me both the {k1} from {f1} and the {k2} from {f2}.",
                 "What's {k1} in {f1}? And {k2} in {f2}?",
                 "Open {f1} and {f2} and report {k1} and {k2}.",
                 "{k1} in {f1} and {k2} in {f2}?"],
                []),
    "read2_a": (["{f1}: {k1} = {v1}. {f2}: {k2} = {v2}.",
                 "The {k1} in {f1} is {v1} and the {k2} in {f2} is {v2}.",
                 "{k1} = {v1} ({f1}); {k2} = {v2} ({f2}).", "{k1} is {v1}, {k2} is {v2}.",
                 "{f1} sets {k1} to {v1}; {f2} sets {k2} to {v2}."], []),
    "mixed_q": (["What's the date, and what is {e}?", "Tell me the date and compute {e}.",
                 "What day is it? Also, what is {e}?", "Two things: the current time, and {e}.",
                 "Give me today's date and the value of {e}.",
                 "Read the clock and calculate {e}.", "I need the time and the result of {e}.",
                 "What time is it, and what does {e} come to?",
                 "Date please, and {e} too.", "Can you get the date and work out {e}?",
                 "Calculate {e} and tell me what day it is.",
                 "What's {e}? And what's the date today?", "The time, and {e}, please.",
                 "Look at the clock and solve {e}.", "date and {e}?"],
                []),
    "mixed_a": (["It is {now}, and {e} = {v}.", "The date is {now}; {e} = {v}.",
                 "Now: {now}. {e} = {v}.", "It's {now}, and {e} is {v}.",
                 "{now}, and {v}."], []),
    "errpath_hint_q": (["What is the {k} in {b}? It is somewhere in {d}.",
                        "Find the {k} in {b}; the file is under {d}.",
                        "{b} is somewhere in {d}. What is its {k}?",
                        "What's {k} in {b}? Look in {d}.", "I put {b} in {d}. What {k} does it set?",
                        "Check the {k} in {b}, which is in {d} somewhere.",
                        "Somewhere in {d} there is {b}. Tell me its {k}.",
                        "What {k} does {b} have? It should be in {d}.",
                        "Get me the {k} from {b} (it lives in {d}).",
                        "Read {b} from {d} and tell me the {k}.",
                        "{k} in {b}? The file is in {d}.",
                        "Can you find {b} in {d} and read its {k}?",
                        "Look for {b} under {d}; I need the {k}.",
                        "The {k} from {b}, please. It's in {d}.",
                        "Which {k} is in {b}? Try {d}."],
                       []),
    "errpath_q": (["What is the {k} in {b}?", "What's the {k} in {b}?", "Read the {k} from {b}.",
                   "Tell me the {k} set in {b}.", "Which {k} does {b} use?",
                   "Look up {k} in {b}.", "Open {b} and give me the {k}.", "{k} in {b}?",
                   "Can you check {b} for the {k}?", "What does {b} set {k} to?",
                   "I need the {k} from {b}.", "Get {k} out of {b}, please.",
                   "What value has {k} in {b}?", "Check the {k} of {b}.",
                   "Please find the {k} in {b}."],
                  []),
    "errcalc_q": (["Calculate {a} {bad} {b}.", "What is {a} {bad} {b}?", "Compute {a} {bad} {b}, please.",
                   "{a} {bad} {b} = ?", "Work out {a} {bad} {b}.", "What's {a} {bad} {b}?",
                   "Can you calculate {a} {bad} {b}?", "I need {a} {bad} {b}.",
                   "Solve {a} {bad} {b}.", "Tell me {a} {bad} {b}.", "{a} {bad} {b}?",
                   "Give me the result of {a} {bad} {b}.", "Please work out {a} {bad} {b}.",
                   "Figure out {a} {bad} {b} for me.", "what is {a} {bad} {b}"],
                  []),
    "errcalc_a": (["{e} = {v}.", "The result is {v} ({e}).", "{e} is {v}.", "It comes to {v}.",
                   "With the operator fixed: {e} = {v}."], []),
    "errnote_q": (["Read my note {k}. If it does not exist, try {real}.",
                   "Open note {k}; if there is none, use {real}.",
                   "What does my note {k} say? It might be saved as {real}.",
                   "Check note {k}, or {real} if {k} is missing.",
                   "Read {k} from my notes (maybe it's called {real}).",
                   "I saved a note as {k} or {real}. What does it say?",
                   "Get my note {k}. Fall back to {real} if needed.",
                   "Note {k}, please. If that fails, try {real}.",
                   "What's in my note {k}? It could also be {real}.",
                   "Look up the note {k}, else {real}.",
                   "Can you read note {k}? Otherwise read {real}.",
                   "Show my note {k}; if it's not there, {real}.",
                   "Try note {k} first, then {real}.",
                   "Read back {k} from my notes, or {real} if {k} doesn't exist.",
                   "my note {k} or maybe {real}: what does it say?"],
                  []),
    "errnote_a": (["The note {k} does not exist; {real} says {r}.",
                   "There is no note {k}, but {real} says {r}.",
                   "{k} was missing. {real}: {r}.", "Note {real} says {r} ({k} does not exist).",
                   "{real} says {r}."], []),
    # recall questions of the train split, by kind (the held-out ones are in recall_q[1] and
    # recall_note_q[1])
    "recall_file_q": (["Earlier you read {f}. What was the {k} in it?",
                       "Going back to the start: what was the {k} in {f}?",
                       "Remind me, what was {k} in {f}?",
                       "What was {k} in {f} again?", "Back to {f}: what did it set {k} to?",
                       "I forgot the {k} from {f}. What was it?", "Which {k} did {f} have?",
                       "Can you remind me of the {k} in {f}?",
                       "From the file {f} you read earlier, what's the {k}?",
                       "What {k} did {f} list?", "What was the value of {k} in {f}?",
                       "Tell me the {k} from {f} you opened at the start.",
                       "Without reading it again, what was {k} in {f}?",
                       "Remember {f}? What was its {k}?", "{k} in {f}, what was it again?"],
                      []),
    "recall_calc_q": (["What was the result of the first calculation, {e}?",
                       "Remind me of the result of {e}.", "What was {e} again?",
                       "Earlier you computed {e}. What was the answer?",
                       "What result did you get for {e}?",
                       "What did the calculator return for {e} before?",
                       "The first calculation, {e}: what was its result?",
                       "Don't recompute it: what was {e}?", "I forgot what {e} was. Remind me?",
                       "What was the value of {e} from earlier?",
                       "You worked out {e} at the start. What was it?",
                       "Back at the beginning, {e} was what?",
                       "Tell me again the result for {e}.", "{e} earlier: what was the result?",
                       "What answer did {e} have?"],
                      []),
    "recall_code_q": (["What was my {cn} that I told you at the beginning?",
                       "What's my {cn}?", "Remind me of my {cn}.",
                       "Tell me my {cn} again.", "I forgot my {cn}. What was it?",
                       "What {cn} did I mention earlier?",
                       "Can you tell me the {cn} I gave you?",
                       "My {cn}, what was it?", "Do you still have my {cn}?",
                       "Please repeat my {cn}.", "What was that {cn} of mine?",
                       "I need my {cn} now.", "Which {cn} was mine?",
                       "Remember my {cn}? Say it.", "{cn}?"],
                      []),
    "recall_note_q": (["What value did I ask you to remember for {k}?",
                       "What was {k} again?", "Remind me what {k} was.",
                       "What did I save under {k} at the start?",
                       "What's the value of {k} I gave you earlier?",
                       "Earlier I gave you {k}. What was its value?",
                       "I forgot {k}. What was it?", "Which number did I give for {k}?",
                       "Can you remind me of {k}?", "What did I want you to keep for {k}?",
                       "Back to the note {k}: what was its value?",
                       "What was the number I asked you to save as {k}?",
                       "{k}, what was it again?", "Tell me {k} again, please.",
                       "What did we save for {k}?"],
                      ["Which value did I tell you to store for {k}?"]),
    "code_save_q": (["My {cn} is {c}. Please remember it.", "Remember my {cn}: {c}.",
                     "Please memorize this {cn}: {c}.",
                     "My {cn} is {c}, don't forget it.",
                     "Here is my {cn}, {c}. Remember it.", "{cn} {c}, remember that",
                     "I'll need my {cn} later. It's {c}.",
                     "Can you remember my {cn}? It is {c}.",
                     "The {cn} is {c}. Keep it in mind.",
                     "Hold on to my {cn}: {c}.", "Remember this: {cn} {c}.",
                     "My {cn} is {c}. Please remember.",
                     "Don't forget my {cn}, {c}.", "This is my {cn}: {c}. Memorize it.",
                     "Just so you know, my {cn} is {c}."],
                    ["Keep this for later: my code is {c}."]),
}

# answers of the recall questions and the code-remember turn (held-out: the first, fixed one)
T.update({
    "recall_file_a": (["The {k} in {f} was {v}.", "{k} was {v}.", "It was {v}.",
                       "{f} set {k} to {v}.", "The {k} was {v}.", "{v}"], []),
    "recall_calc_a": (["{e} was {v}.", "It was {v}.", "The result was {v}.", "{e} = {v}.",
                       "{v}"], []),
    "recall_code_a": (["Your code is {c}.", "Your {cn} is {c}.", "It's {c}.", "{c}",
                       "You told me {c}."], []),
    "recall_note_a": (["You asked me to remember {v} for {k}.", "{k} was {v}.", "It was {v}.",
                       "You gave me {v} for {k}.", "{v}"], []),
    "code_save_a": (["Got it.", "Okay, I'll remember it.", "Understood.", "Sure, remembered.",
                     "Noted, your {cn} is {c}.", "I will keep it in mind."], []),
})

_CODE_NOUNS = ["locker code", "locker code", "door code", "access code", "gate code",
               "wifi code", "parking code", "code"]  # what the recall code is (train)
_RECALL_OPEN_Q = ["Hi.", "Let's get started.", "Hello, I have a few tasks.",  # the first 3: both
                  "Good morning! A few things today.", "Hey, can you help me with some stuff?",
                  "I have some questions.", "Let's begin.", "hi", "Ready? Let's go.",
                  "Hello there. I need some help with my files."]
_RECALL_OPEN_A = ["Hello! What can I do for you?", "Sure, go ahead.",  # the first 2: both
                  "Of course. What do you need?", "Hi! Ready when you are.", "Sure, I'm listening.",
                  "Hello! How can I help?"]
# A request to show a file is answered with its text, in filler turns as everywhere else (answers
# that only counted its lines taught "I'd like to see X" -> "X has 4 lines").
_FILLER_READ_A = ["Here it is:\n{r}", "{f} says:\n{r}", "Contents:\n{r}", "{r}",
                  "{f} contains:\n{r}"]
# Train: the recall opener asks to read a file for later, in words of its own, and is answered
# with a summary. It used read_q, whose every other answer shows the text: the same request had
# two answers, and held-out "show me X" requests got "X holds 6 settings."
_RECALL_READ_Q = ["Read {f}; I'll ask you about it later.", "Please read {f} and keep it in mind.",
                  "Have a look at {f}. I will have questions about it.",
                  "Take in {f} for now, questions come later.", "Load {f} so you know it.",
                  "Go through {f}, we'll need it later.", "First, read {f} and remember it.",
                  "Read {f} for later, no need to show it.",
                  "Just read {f} quietly, don't print it.", "Read {f} without showing it to me."]
# Only the openers that say not to show the file are answered with a summary; the others show
# the text, as any request to read a file is. Run 23 answered 8 of its 11 failed held-out single
# tasks ("I'd like to see X", "In X, what's limit?") with an opener summary ("Read it: 6 keys."):
# the summaries followed 19% of the train samples' file reads, whatever the request said.
_RECALL_NO_SHOW = ("no need to show", "don't print", "without showing")
# Train: half of the file recall questions are answered after reading the file again (the value
# then sits a few tokens back, inside the sliding window). Run 24, whose train recall answers all
# came from memory, answered held-out recall questions from memory and missed 4 more of 50 than
# the weights before, which read the file again on their own; at ~8K tokens a memory answer
# needs the asked key from ~110 tokens back, past the 64-token window (model card, "Run 24").
_RECALL_REREAD_P = 0.5
_RECALL_REREAD_A = ["{f} says {k} = {v}.", "The {k} in {f} is {v}.", "{k} = {v} in {f}.",
                    "Reading it again: {k} is {v}.", "It is {v}."]

# Train notool exchanges: (question, answer, field holding the expected value) by sub-kind.
# Every one is answerable from the message alone; the sample still offers tools. Fields come
# from _notool_fields(). None repeats the held-out notool_q phrasings (echo back / live in).
NOTOOL_TRAIN = {
    "name": [("My name is {n}. What's my name?", "Your name is {n}.", "n"),
             ("I'm {n}. What is my name?", "Your name is {n}.", "n"),
             ("Call me {n}. What should you call me?", "I should call you {n}.", "n"),
             ("{n} here. Who am I?", "You are {n}.", "n"),
             ("Hello, this is {n}. Can you tell me my name?", "Your name is {n}.", "n"),
             ("People call me {n}. What do people call me?", "People call you {n}.", "n"),
             ("Hi, {n} speaking. What's my name?", "You're {n}.", "n"),
             ("My first name is {n}. Repeat my first name.", "{n}", "n"),
             ("The name's {n}. Say my name.", "{n}.", "n"),
             ("I am called {n}. What am I called?", "You are called {n}.", "n"),
             ("Nice to meet you, I'm {n}. Do you remember my name?", "Yes, your name is {n}.", "n"),
             ("You're talking to {n}. Who are you talking to?", "I'm talking to {n}.", "n"),
             ("my name is {n}, what is it?", "It's {n}.", "n"),
             ("My friend is {n2} and I am {n}. What is my name?", "Your name is {n}.", "n"),
             ("My colleague {n2} says hi. I'm {n}. What's my colleague's name?",
              "Your colleague is {n2}.", "n2")],
    "code": [("Please repeat this code exactly: {c}.", "{c}", "c"),
             ("Repeat after me: {c}", "{c}", "c"),
             ("Copy this code back to me: {c}", "{c}", "c"),
             ("Say {c} back to me.", "{c}", "c"),
             ("Can you type {c} exactly as written?", "{c}", "c"),
             ("Return this string unchanged: {c}", "{c}", "c"),
             ("Write back exactly {c}.", "{c}", "c"),
             ("Reply with just this code: {c}", "{c}", "c"),
             ("Here is a code: {c}. Repeat it.", "{c}", "c"),
             ("{c} - please say that back.", "{c}", "c"),
             ("Parrot this: {c}", "{c}", "c"),
             ("Give me back the code {c} without changes.", "{c}", "c"),
             ("Just reply {c}.", "{c}", "c"),
             ("Read this back to me: {c}", "Here it is: {c}", "c"),
             ("My ticket number is {c}. What's my ticket number?", "Your ticket number is {c}.", "c"),
             ("The booking reference is {c}. Tell me the booking reference.",
              "The booking reference is {c}.", "c"),
             ("Confirm the code I'm sending you: {c}", "The code is {c}.", "c"),
             ("What code did I just write? {c}", "You wrote {c}.", "c")],
    "word": [("Repeat the word {w}.", "{w}", "w"), ("Say {w}.", "{w}", "w"),
             ("Type {w} back to me.", "{w}", "w"), ("Put {w} in quotes.", "\"{w}\"", "w"),
             ("The password hint is {w}. What's the hint?", "The hint is {w}.", "w"),
             ("My cat is called {w}. What is my cat called?", "Your cat is called {w}.", "w"),
             ("Our project is named {w}. Which name does our project have?",
              "It is named {w}.", "w"),
             ("Say {w}, nothing else.", "{w}", "w")],
    "twice": [("Say the word {w} twice.", "{w} {w}", "ww"), ("Write {w} two times.", "{w} {w}", "ww"),
              ("Repeat {w} twice, separated by a space.", "{w} {w}", "ww"),
              ("Give me {w} two times in a row.", "{w} {w}", "ww"),
              ("Double this word: {w}.", "{w} {w}", "ww"), ("{w} twice, please.", "{w} {w}", "ww")],
    "city": [("Hi! I'm {n} from {ci}. Where am I from?", "You are from {ci}.", "ci"),
             ("I'm from {ci}. Where do I come from?", "You come from {ci}.", "ci"),
             ("My hometown is {ci}. What is my hometown?", "Your hometown is {ci}.", "ci"),
             ("I was born in {ci}. Where was I born?", "You were born in {ci}.", "ci"),
             ("I'm based in {ci}. Where am I based?", "You are based in {ci}.", "ci"),
             ("I just arrived in {ci}. Where did I arrive?", "You arrived in {ci}.", "ci"),
             ("I work in {ci}. Where do I work?", "You work in {ci}.", "ci"),
             ("We're meeting in {ci}. Where is the meeting?", "The meeting is in {ci}.", "ci"),
             ("I'm flying to {ci} tomorrow. Where am I flying to?", "You are flying to {ci}.", "ci"),
             ("My office is in {ci}. Where's my office?", "Your office is in {ci}.", "ci"),
             ("I grew up in {ci}. Where did I grow up?", "You grew up in {ci}.", "ci"),
             ("{ci} is my home. Name my home town.", "Your home town is {ci}.", "ci"),
             ("I'm visiting {ci} this week. What place am I visiting?", "You are visiting {ci}.", "ci"),
             ("I spent last summer in {ci}. Where did I spend the summer?",
              "You spent it in {ci}.", "ci"),
             ("My sister moved to {ci}. Where did my sister move?", "She moved to {ci}.", "ci"),
             ("Our team sits in {ci} and {ci2}. Which one did I name first?",
              "You named {ci} first.", "ci")],
    "number": [("My favourite number is {x}. What is my favourite number?",
                "Your favourite number is {x}.", "x"),
               ("My room number is {x}. What's my room number?", "Your room number is {x}.", "x"),
               ("The meeting is in room {x}. Which room is it in?", "Room {x}.", "x"),
               ("My PIN is {x}. Tell me my PIN.", "Your PIN is {x}.", "x"),
               ("I ran {x} meters today. How far did I run?", "You ran {x} meters.", "x"),
               ("Order {x} is mine. What's my order number?", "Your order number is {x}.", "x"),
               ("I scored {x} points. What was my score?", "Your score was {x}.", "x"),
               ("There are {x} people in the queue. How many people are waiting?",
                "{x} people are waiting.", "x"),
               ("I have {x} {it}. How many {it} do I have?", "You have {x} {it}.", "x"),
               ("The invoice total is {x}. What is the invoice total?",
                "The invoice total is {x}.", "x"),
               ("I'm {y} years old. How old am I?", "You are {y} years old.", "y"),
               ("I was born in {yr}. Which year was I born in?", "You were born in {yr}.", "yr")],
    "yesno": [("Is {x} bigger than {x2}?", "{yn_big}, {x} is {cmp} than {x2}.", "yn_big"),
              ("Is {x} larger than {x2}? Just yes or no.", "{yn_big}.", "yn_big"),
              ("My name is {n}. Is my name {nq}?", "{yn_name}, your name is {n}.", "yn_name"),
              ("I'm from {ci}. Am I from {ciq}?", "{yn_city}, you are from {ci}.", "yn_city"),
              ("Is {c} the same as {cq}?", "{yn_code}, {same}.", "yn_code"),
              ("Is {x} an even number?", "{yn_even}, {x} is {parity}.", "yn_even"),
              ("Is {x} an odd number?", "{yn_odd}, {x} is {parity}.", "yn_odd"),
              ("I have {x} {it} and you have {x2}. Do I have more?",
               "{yn_big}, {x} is {cmp} than {x2}.", "yn_big")],
    "compare": [("Which is longer, {w} or {w2}?", "{wlong} is longer.", "wlong"),
                ("Which word is shorter: {w} or {w2}?", "{wshort} is shorter.", "wshort"),
                ("Which number is larger, {x} or {x2}?", "{xmax} is larger.", "xmax"),
                ("Which is smaller: {x} or {x2}?", "{xmin} is smaller.", "xmin"),
                ("Which comes first alphabetically, {w} or {w2}?", "{walpha} comes first.", "walpha"),
                ("Between {x} and {x2}, which is the bigger number?", "{xmax}.", "xmax"),
                ("Of {w} and {w2}, which has more letters?", "{wlong} has more letters.", "wlong")],
    "list": [("Here are three words: {w}, {w2}, {w3}. Which one is second?",
              "The second one is {w2}.", "w2"),
             ("From {w}, {w2}, {w3}, which is last?", "{w3} is last.", "w3"),
             ("I listed {n}, {n2} and {n3}. Who did I mention first?", "You mentioned {n} first.", "n"),
             ("What is the first item in this list: {it}, {it2}, {it3}?", "The first item is {it}.", "it"),
             ("How many items are in this list: {lst}?", "There are {cnt} items.", "cnt"),
             ("Count the words: {lst}.", "{cnt} words.", "cnt"),
             ("{n}, {n2} and {n3} are coming. Who is the third person?", "{n3} is the third.", "n3")],
    "join": [("Join {w} and {w2} into one word.", "{wjoin}", "wjoin"),
             ("Write {n} in lower case.", "{nlow}", "nlow"),
             ("Combine {w} and {w2} with a dash between them.", "{wdash}", "wdash"),
             ("What do you get if you put {w2} after {w}?", "{wjoin}", "wjoin")],
    "given": [("I already know that {e} = {ev}. What did I say {e} equals?", "You said {e} = {ev}.", "ev"),
              ("My calculator says {e} is {ev}. What did my calculator say?", "It said {ev}.", "ev"),
              ("The answer to {e} is {ev}, as we know. Repeat that answer.", "{ev}", "ev"),
              ("The file {f} says {k} = {x}. Going by what I just told you, what is {k}?",
               "{k} is {x}.", "x"),
              ("It's {d} today. What's today's date?", "Today is {d}.", "d"),
              ("Today is {d}. What date did I say it is?", "You said it is {d}.", "d"),
              ("My note {kw} says {x}, I just checked. What does my note {kw} say?",
               "Your note {kw} says {x}.", "x"),
              ("I saved the report as {f}. What's the file called?", "It is called {f}.", "f"),
              ("{it} cost {p} each. What is the price of one of the {it}?", "{p}.", "p"),
              ("I wrote '{w} {w2}' into {f}. Which file did I write to?", "You wrote to {f}.", "f")],
    "greet": [("Hello!", "Hello! How can I help you?", "hello"),
              ("Hi there.", "Hello! What can I do for you?", "hello"),
              ("Good morning!", "Good morning! How can I help?", "morning"),
              ("Hey, how are you?", "I'm fine, thanks. How can I help?", "help"),
              ("Thanks, that's all for now.", "You're welcome!", "welcome"),
              ("Thank you!", "You're welcome.", "welcome"),
              ("Good evening.", "Good evening! What do you need?", "evening"),
              ("Bye!", "Goodbye!", "bye"),
              ("Hi, are you there?", "Yes, I'm here. How can I help?", "help"),
              ("Who are you?", "I'm an assistant that can use tools.", "assistant")],
}
NOTOOL_WEIGHTS = {"name": 2, "code": 3, "word": 1, "twice": 1, "city": 3, "number": 2,
                  "yesno": 2, "compare": 2, "list": 2, "join": 1, "given": 3, "greet": 1}
_NOTOOL_KINDS = list(NOTOOL_WEIGHTS)
_NOTOOL_W = [NOTOOL_WEIGHTS[k] for k in _NOTOOL_KINDS]


def tpl(rng, split, key):
    tr, ho = T[key]
    if split == "heldout":
        return rng.choice(ho)
    return _augment_request(rng, key, rng.choice(tr))


def ttpl(rng, split, key):
    """Train: a random template of key (sometimes rebuilt by _augment_request). Held-out: its
    fixed phrasing (the held-out template, or the first train template when there is none),
    drawn WITHOUT using rng."""
    tr, ho = T[key]
    if split == "train":
        return _augment_request(rng, key, rng.choice(tr))
    return ho[0] if ho else tr[0]


# Request augmentation (train only). A model trained on T's paraphrases alone keys on a few
# request verbs ("read", "open", "what's in") and fails on held-out wordings it never saw: it
# took "called X" as the key of "Look up my note called X", and answered "I'd like to see
# X.conf" without reading the file. So a small share of train requests drop the template's
# request verb for a pseudo-word (the syllables of the value pools, train half) or for no verb
# at all, keeping only the object: the path, the note key, the expression, the numbers. What
# to do must then come from the object and the tools offered, not from one verb. 12% keeps the
# natural phrasings dominant (they are what users write) while every template key sees the
# verb-free form often. Objects carry every field that all of the key's templates carry (the
# values the target call copies); note keys are introduced with a clear boundary (quoted,
# "named", "the X note", "the X entry").
# Measured, and off: run 11 (12%) scored 118/300 held-out, run 12 (0%, the same data otherwise,
# same eval) 140/300, run 13 (run 12's settings, another seed) 113/300 — so the run-to-run spread
# (~±15 tasks) is as large as the effect; the augmentation showed no gain, and in run 11 the
# chain family fell (19 vs 34 of 50: the model stopped chaining a second call after reading).
# The mechanism stays for further ablations; at 0 it still draws r.random() per request, so the
# train stream is run 12's.
_PSEUDO_VERB_P = 0.0
_AUG_FRAMES = ["{V} {O}.", "{V} {O}, please.", "Please {v} {O}.", "Could you {v} {O}?",
               "Can you {v} {O}?", "I need you to {v} {O}.", "Go ahead and {v} {O}.",
               "Next task: {v} {O}.", "When you have a moment, {v} {O}.", "{V} {O} now.",
               "About {O}: {v} it.", "{O} - {v} that, please.",
               "{O}, please."]  # the last one has no verb at all
_NOTE_REFS = ["my note {k}", "the note \"{k}\"", "note '{k}'", "the {k} note", "my {k} note",
              "the note named {k}", "the {k} entry in my notes", "the note with key {k}",
              "the note called {k}", "my note titled {k}", "the note labelled '{k}'",
              "what I saved under {k}"]
_AUG_OBJECTS = {
    "calc_q": ["{e}", "the expression {e}", "the sum {e}"],
    "clock_q": ["the time", "the current date", "today's date and time", "the date"],
    "read_q": ["{f}", "the file {f}", "the text of {f}", "file {f}"],
    "field_q": ["the {k} in {f}", "{k} from {f}", "the {k} setting of {f}", "the {k} line of {f}",
                "{f}, key {k}"],
    "list_q": ["{d}", "the folder {d}", "the directory {d}", "the entries of {d}"],
    "note_read_q": _NOTE_REFS,
    "total_q": ["{n} {it} at the prices in {f}", "the cost of {n} {it} (prices: {f})",
                "the price of {n} {it}, going by {f}", "what {n} {it} come to with the prices of {f}",
                "the total for {n} {it} from the price list {f}", "{n} {it}, priced by {f}",
                "how much {n} {it} are, per {f}", "the bill for {n} {it} (see {f})"],
    "multi_q": ["{e1} and {e2}", "both {e1} and {e2}", "{e1}, and also {e2}", "{e1} along with {e2}",
                "{e1} together with {e2}", "{e1} in addition to {e2}", "{e1} and then {e2}",
                "{e1}, then {e2}", "{e1}, followed by {e2}", "{e1} alongside {e2}",
                "{e1} and additionally {e2}", "not only {e1} but also {e2}", "{e1}; {e2} too",
                "{e1} and, separately, {e2}", "{e1} plus, on its own, {e2}"],
    "write_q": ["'{b}' into {p}", "the text '{b}' to {p}"],
    "search_q": ["the .{x} files under {root}", "every *.{x} file in {root}"],
    "fieldcalc_q": ["the {k} in {f} {word} {m}", "{k} from {f}, {word} {m}"],
    "notecalc_q": [o + " times {m}" for o in _NOTE_REFS],
    "clockcalc_q": ["the year {n} years from now", "this year plus {n}"],
    "read2_q": ["the {k1} in {f1} and the {k2} in {f2}", "{k1} from {f1} and {k2} from {f2}"],
    "mixed_q": ["the date and {e}", "the current time and {e}"],
    "errpath_q": ["the {k} in {b}", "{k} from {b}"],
    "errpath_hint_q": ["the {k} in {b} (somewhere in {d})", "{k} from {b}, under {d}"],
    "errcalc_q": ["{a} {bad} {b}"],
}


# Composed requests (train only, on by default since session 16): a real request verb of the
# key's intent (_REAL_VERBS) in a frame (_REAL_FRAMES) around an object phrase (_AUG_OBJECTS).
# The 20-30 paraphrases per key in T are whole sentences; a small model keyed on their few
# verbs and word orders: on the held-out single-call tasks it took "called" as the note key of
# "Look up my note called X" (10 of 10 wrong, each a run of failing calls) and did not read the
# file of "Print X for me" (4 of 4). Verbs x frames x objects gives each key hundreds of
# phrasings where the object (path, key, expression) sits after many different verbs.
# Every composed request is kept away from the held-out templates by the same rule as T's
# lists (word-sequence similarity < 0.8 to every held-out question template,
# tests/reference/test_data.py); a draw that comes too close is drawn again.
_REAL_VERB_P = 0.2
_REAL_FRAMES = ["{V} {O}.", "{V} {O}, please.", "Please {v} {O}.", "Could you {v} {O}?",
                "Can you {v} {O}?", "I need you to {v} {O}.", "Go ahead and {v} {O}.",
                "Next task: {v} {O}.", "When you have a moment, {v} {O}.", "{V} {O} now.",
                "{V} {O} for me.", "Please {v} {O} for me.", "Would you {v} {O}?",
                "I'd like you to {v} {O}.", "Could you please {v} {O}?", "Quick one: {v} {O}.",
                "Help me out: {v} {O}.", "{V} {O}?", "I want you to {v} {O}.", "Hey, {v} {O}.",
                "Kindly {v} {O}.", "Now {v} {O}.", "Try to {v} {O}.", "Mind if you {v} {O}?"]
_V_CALC = ["compute", "calculate", "evaluate", "work out", "solve", "figure out", "find",
           "give me", "tell me", "get"]
_V_LOOKUP = ["find", "look up", "get", "fetch", "tell me", "check", "give me", "report", "read",
             "extract", "pull", "retrieve", "show me", "print"]
_REAL_VERBS = {
    "calc_q": _V_CALC,
    "clock_q": ["tell me", "check", "give me", "get", "show me", "look up", "find out", "report",
                "read"],
    "read_q": ["show me", "print", "display", "open", "read", "dump", "bring up", "pull up",
               "output", "view", "fetch", "type out", "load", "show"],
    "field_q": _V_LOOKUP,
    "list_q": ["list", "show me", "display", "enumerate", "print", "give me", "tell me", "check",
               "browse", "show"],
    "note_read_q": ["read", "open", "fetch", "get", "show me", "look up", "find", "retrieve",
                    "check", "pull up", "print", "recall", "bring up", "tell me"],
    "total_q": ["compute", "calculate", "work out", "figure out", "find", "get", "tell me"],
    "multi_q": _V_CALC,
    "write_q": ["write", "save", "put", "store", "record"],
    "search_q": ["find", "search for", "locate", "list", "look for", "show me"],
    "fieldcalc_q": ["compute", "calculate", "work out", "figure out", "give me", "tell me", "find"],
    "notecalc_q": _V_CALC,
    "clockcalc_q": ["tell me", "compute", "work out", "figure out", "give me", "find"],
    "read2_q": ["find", "look up", "get", "fetch", "tell me", "give me", "read", "check"],
    "mixed_q": ["tell me", "give me", "get", "find"],
    "errpath_q": _V_LOOKUP,
    "errpath_hint_q": _V_LOOKUP,
    "errcalc_q": _V_CALC,
}


def template_words(t: str) -> List[str]:
    """A template as a word sequence, every {field} the same token (the held-out distance rule)."""
    return re.findall(r"\{\}|[a-z']+|[^\sa-z']", re.sub(r"\{\w+\}", "{}", t).lower())


@functools.lru_cache(maxsize=None)
def near_heldout(t: str) -> bool:
    """True when t's word sequence is 0.8 or more similar to a held-out question template
    (quick_ratio bounds ratio from above, so most templates cost no full match)."""
    w = template_words(t)
    for k, (_, ho) in T.items():
        if k.endswith("_q"):
            for h in ho:
                sm = difflib.SequenceMatcher(None, template_words(h), w)
                if sm.quick_ratio() >= 0.8 and sm.ratio() >= 0.8:
                    return True
    return False


def _fill_frame(frame: str, verb: str, obj: str) -> str:
    if frame.startswith("{O}"):
        obj = obj[0].upper() + obj[1:]
    return frame.replace("{V}", verb[0].upper() + verb[1:]).replace("{v}", verb).replace("{O}", obj)


def _compose_request(r: random.Random, key: str) -> str:
    """A composed request of key (a verb of _REAL_VERBS[key] in a frame around an object of
    _AUG_OBJECTS[key]) that is not near a held-out template; redrawn until one is not."""
    for _ in range(64):
        t = _fill_frame(r.choice(_REAL_FRAMES), r.choice(_REAL_VERBS[key]), r.choice(_AUG_OBJECTS[key]))
        if not near_heldout(t):
            return t
    raise RuntimeError(f"composed requests of {key!r}: every draw is near a held-out template")


def _pseudo_verb(r: random.Random) -> str:
    """A two-syllable pseudo-word of the train pool, 4 to 9 letters."""
    while True:
        w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) + r.choice(_CODAS) for _ in range(2))
        if 4 <= len(w) <= 9 and _pool_of(w) == "train":
            return w


def _augment_request(r: random.Random, key: str, template: str) -> str:
    """Train only: with probability _PSEUDO_VERB_P (keys of _AUG_OBJECTS) a new template of
    the same fields: a frame of _AUG_FRAMES around a pseudo-word verb and an object phrase;
    otherwise the template unchanged. Draws from r only for the keys of _AUG_OBJECTS."""
    objs = _AUG_OBJECTS.get(key)
    if objs is None:
        return template
    u = r.random()
    if u < _PSEUDO_VERB_P:
        frame, obj, verb = r.choice(_AUG_FRAMES), r.choice(objs), _pseudo_verb(r)
        return _fill_frame(frame, verb, obj)
    if u < _PSEUDO_VERB_P + _REAL_VERB_P and key in _REAL_VERBS:
        return _compose_request(r, key)
    return template


SYSTEMS = (["You are cedar, a helpful assistant. Use the tools when they help.",
            "You are a careful assistant with tools. Answer briefly.",
            "You are cedar. Call tools to read files, compute and check facts; otherwise answer directly.",
            "",
            "You are cedar, an assistant that can call tools. Use them only when needed.",
            "You are a helpful assistant. Tools are available for files, notes, the clock and "
            "arithmetic.",
            "Be concise. Use a tool only when the answer is not already in the conversation.",
            "You are cedar. Answer from the conversation when you can; call a tool for anything "
            "you must look up or compute.",
            "You help users with files, notes and calculations.",
            "You are a friendly assistant. Be brief and exact.",
            "cedar assistant. Copy values exactly as they appear in tool results.",
            "You are a precise assistant. When a tool returns a value, report it exactly.",
            "Reply in one or two sentences. If the user already gave you the information, do not "
            "call a tool.",
            "You are an AI assistant with access to a workspace.",
            "You are cedar, a local assistant. Think before calling a tool.",
            "Helpful, short, correct."],
           ["You are an agent running on cedar. Prefer tools for facts and arithmetic.",
            "Assistant with tool access. Keep answers short."])

# Light wrappers on train user messages (Session.user): a greeting or lead-in, a closing word,
# a lower-case first word, a missing final punctuation mark. Train only.
_WRAP_PREFIX = ["Hey,", "Hi,", "Hello!", "Hi!", "Quick one:", "Quick question:", "Question:",
                "Okay,", "OK so", "So,", "Hey there!", "Good morning.", "One more thing:", "Next:",
                "Also,", "Hmm,", "Right,", "Alright,", "Sorry to bother you, but", "Hi again."]
_WRAP_SUFFIX = ["Thanks!", "Thank you.", "Thanks.", "Cheers!", "Please.", "thx", "ty",
                "Appreciate it!", ":)", "Much appreciated.", "Thanks in advance.", "Please and thanks."]
_WRAP_CONTINUE = {"OK so", "Sorry to bother you, but"}  # lead-ins that continue the sentence


def _starter_words() -> frozenset:
    """Capitalised first words of the train questions: the words _wrap_train may lower-case
    (a message that starts with a value, e.g. a name, is left alone)."""
    qs = [t for key, (tr, _) in T.items() if key.endswith("_q") for t in tr]
    qs += [q for pairs in NOTOOL_TRAIN.values() for q, _, _ in pairs] + _RECALL_OPEN_Q
    return frozenset(m.group(0) for m in (re.match(r"[A-Z][A-Za-z']*", q) for q in qs) if m)


_STARTERS = _starter_words()


def _wrap_train(r: random.Random, text: str) -> str:
    """Train user messages only: 45% get a light wrapper (a lower-case first word, no final
    punctuation, a lead-in such as "Hey," or "Quick one:", a closing "Thanks!"); the rest and
    empty texts stay as they are."""
    if not text or r.random() < 0.55:
        return text
    first = re.match(r"[A-Za-z']+", text)
    starter = first is not None and first.group(0) in _STARTERS
    if starter and r.random() < 0.3:
        text = text[0].lower() + text[1:]
    if r.random() < 0.3 and text[-1] in ".?!":
        text = text[:-1]
    if r.random() < 0.5:
        p = r.choice(_WRAP_PREFIX)
        if starter and (p[-1] == "," or p in _WRAP_CONTINUE):
            text = text[0].lower() + text[1:]
        text = p + " " + text
    if r.random() < 0.35:
        text = text + " " + r.choice(_WRAP_SUFFIX)
    return text


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
        if self.split == "train":
            text = _wrap_train(self.r, text)
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


# Config files that a graded turn reads (train only): 3 to 12 lines instead of 3 to 7, from a
# wider key list. With few lines the model got away with a rough position of the asked key and
# answered another line's number on held-out files (it read "limit = 299" and said 691); more
# distractor lines, more of them numeric, make copying the value of the asked key's own line
# matter. The held-out range (3-7) lies inside the train one. Filler files of long sessions
# and the recall file keep their sizes (session lengths stay as they were).
_TRAIN_CONFIG_KEYS = (3, 12)
_TRAIN_EXTRA_KEYS = ["workers", "threads", "quota", "interval", "depth", "delay", "capacity",
                     "batch", "theme", "zone", "label", "channel"]
_NUMERIC_KEYS = frozenset(["port", "timeout", "retries", "limit", "budget", "version", "level",
                           "workers", "threads", "quota", "interval", "depth", "delay", "capacity",
                           "batch"])


def _config_file(v: Values, n_keys=None, graded=False):
    """A key = value config file: returns (text, {key: value}). graded: the file a graded turn
    reads (wider in train, _TRAIN_CONFIG_KEYS; no change in held-out)."""
    r = v.r
    keys = ["port", "host", "user", "timeout", "retries", "region", "owner", "version", "limit",
            "token", "color", "level", "mode", "budget", "city", "team"]
    if graded and n_keys is None and v.split == "train":
        keys = keys + _TRAIN_EXTRA_KEYS
        n_keys = r.randint(*_TRAIN_CONFIG_KEYS)
    ks = r.sample(keys, n_keys or r.randint(3, 7))
    kv = {}
    for k in ks:
        if k in _NUMERIC_KEYS:
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


# Price files of pseudo-word items (train only, since session 19). The held-out price files
# list items that train never names (filters, valves, ...); asked "How much would 15 filters
# cost according to F?", the shipped model multiplied another line's price (pens: 1) in 8 of
# its 15 failed chain tasks: it had learned to find a few dozen known item words, not to match
# an arbitrary word against the lines. A share of train price files names made-up items.
_PSEUDO_ITEM_P = 0.3


def _price_file(v: Values, pseudo_p: float = _PSEUDO_ITEM_P):
    pool = v.items
    if v.split == "train" and v.r.random() < pseudo_p:  # no draw in held-out
        pool = list(dict.fromkeys(v.word() + "s" for _ in range(8)))
    items = v.r.sample(pool, min(len(pool), v.r.randint(3, 6)))
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


# Train only (since session 20): one price looked up, no arithmetic. Run 23 missed 13 of the 20
# held-out "How much would N X cost according to F?" tasks by multiplying another line's price
# (mostly the smallest): it did not find the line of an item it had never seen. The question
# names the item after a space (" valves"), the file line starts with it ("valves: 7"): other
# BPE pieces, matched only by practice on words it cannot have memorised (half made-up items).
PRICE_LOOKUP_Q = ["What is the unit price of {it} in {f}?", "Look up the price of {it} in {f}.",
                  "{f} has prices; give me the one for {it}.", "Find {it} in {f} and tell me its price.",
                  "{f} is a price list. What do {it} cost each?", "Which price does {f} give for {it}?",
                  "Read {f}: what is listed for {it}?", "Tell me the {it} price from {f}."]
PRICE_LOOKUP_A = ["{it} cost {p} each.", "The price of {it} is {p}.", "{p} per item for {it}.",
                  "{f} lists {it} at {p}.", "{it}: {p}.", "One costs {p}."]


# Train only, with real names: the weekday asked for, and the workspace root called "here".
WEEKDAY_Q = ["Which weekday is it?", "What weekday is today?", "Tell me the day of the week.",
             "Is it a weekday? Which day is it?", "Which day of the week are we on?",
             "What's the weekday today?"]
WEEKDAY_A = ["It is {day}.", "Today is {day}.", "{day} ({v}).", "It's {day}: {v}."]
LIST_ROOT_Q = ["What files are here?", "List the files in this folder.", "What's in the current directory?",
               "Show me the files.", "Which files do I have?", "List everything in the workspace.",
               "what files do we have here", "Show me this directory."]


def fam_single(s: Session, v: Values):
    r = v.r
    kind = r.choice(["calc", "calc", "clock", "read", "field", "list", "note"]
                    + (["write", "search"] if s.mcp else [])
                    + (["price"] if s.split == "train" else []))  # no new draw in held-out
    if kind == "price":
        text, prices = _price_file(v, pseudo_p=0.5)
        rel = (v.word() + "/" if r.random() < 0.3 else "") + v.filename("csv")
        s.world["files"][rel] = text
        it = r.choice(list(prices))
        f = s.show_path(rel)
        s.user(r.choice(PRICE_LOOKUP_Q).format(it=it, f=f))
        s.call([s.read_call(rel)])
        s.answer(r.choice(PRICE_LOOKUP_A).format(it=it, f=f, p=prices[it]))
        return str(prices[it])
    if kind == "write":
        rel = v.filename("txt")
        body = " ".join(v.word() for _ in range(r.randint(2, 6)))
        p = s.show_path(rel)
        s.user(ttpl(r, s.split, "write_q").format(b=body, p=p))
        res = s.call([(MCP_PREFIX + "write_file", {"path": p, "content": body})])[0]
        s.answer(ttpl(r, s.split, "write_a").format(r=res, p=p, b=body))
        return p
    if kind == "search":
        paths = _populate_fs(v, s.world, r.randint(3, 8))
        ext = r.choice(sorted({p.rsplit(".", 1)[1] for p in paths}))
        s.user(ttpl(r, s.split, "search_q").format(x=ext, root=MCP_ROOT))
        res = s.call([(MCP_PREFIX + "search_files", {"path": MCP_ROOT, "pattern": f"**/*.{ext}"})])[0]
        s.answer(ttpl(r, s.split, "search_a").format(r=res))
        return res.split("\n")[0]
    if kind == "calc":
        if v.real_names > 0 and r.random() < 0.35:
            e, q = _worded_calc(v)
            s.user(q)
            res = s.call([("calculator", {"expression": e})])[0]
            s.answer(tpl(r, s.split, "calc_a").format(e=e, v=res))
            return res
        e, val = _expr(v, hard=r.random() < 0.4)
        s.user(tpl(r, s.split, "calc_q").format(e=e))
        res = s.call([("calculator", {"expression": e})])[0]
        s.answer(tpl(r, s.split, "calc_a").format(e=e, v=res))
        return val
    if kind == "clock":
        # with real names (train): a third of the clock reads that carry the weekday ask for it
        if v.real_names > 0 and s.world["now"].endswith(")") and r.random() < 0.33:
            s.user(r.choice(WEEKDAY_Q))
            res = s.call([("clock", {})])[0]
            day = res.rsplit("(", 1)[-1].rstrip(")")
            s.answer(r.choice(WEEKDAY_A).format(day=day, v=res))
            return day
        s.user(tpl(r, s.split, "clock_q"))
        res = s.call([("clock", {})])[0]
        s.answer(tpl(r, s.split, "clock_a").format(v=res))
        return res
    if kind in ("read", "field"):
        text, kv = _config_file(v, graded=True)
        rel = (v.word() + "/" if r.random() < 0.5 else "") + v.filename("conf")
        s.world["files"][rel] = text
        if kind == "read":
            s.user(tpl(r, s.split, "read_q").format(f=s.show_path(rel)))
            res = s.call([s.read_call(rel)])[0]
            s.answer(ttpl(r, s.split, "read_a").format(f=s.show_path(rel), r=res))
            return text.split("\n")[0]
        k = r.choice(list(kv))
        s.user(tpl(r, s.split, "field_q").format(k=k, f=s.show_path(rel)))
        s.call([s.read_call(rel)])
        s.answer(tpl(r, s.split, "field_a").format(k=k, f=s.show_path(rel), v=kv[k]))
        return kv[k]
    if kind == "list":
        paths = _populate_fs(v, s.world, r.randint(2, 6))
        d = r.choice(sorted({p.rsplit("/", 1)[0] if "/" in p else "" for p in paths}))
        shown = s.show_path(d) if d else (MCP_ROOT if s.mcp else "the workspace root")
        if v.real_names > 0 and not d and not s.mcp and r.random() < 0.5:
            s.user(r.choice(LIST_ROOT_Q))  # "here", as people say it (train, real names)
        else:
            s.user(tpl(r, s.split, "list_q").format(d=shown))
        res = s.call([s.list_call(d)])[0]
        names = [ln.split(" ", 1)[-1] if s.mcp else ln for ln in res.split("\n")]
        s.answer(ttpl(r, s.split, "list_a").format(x=", ".join(names), d=shown, n=len(names)))
        return names[0]
    # note: save then (same turn family) read back in a second user turn
    k, val = v.word(), str(v.num())
    s.world["notes"][k] = val
    s.user(tpl(r, s.split, "note_read_q").format(k=k))
    res = s.call([("notes_read", {"key": k})])[0]
    s.answer(ttpl(r, s.split, "note_read_a").format(k=k, r=res))
    return val


def _worded_calc(v: Values):
    """Train, with real names: arithmetic asked in words -> (expression, request)."""
    r = v.r
    a, b, c = v.num(2, 999), v.num(2, 999), v.num(2, 999)
    it = v.pick(v.items)
    kind = r.randrange(8)
    if kind == 0:
        return f"{a} + {b} + {c}", r.choice(["Add up {a}, {b} and {c}.", "What is the total of {a}, {b} and {c}?",
                                             "Sum {a}, {b} and {c} for me.", "{a} plus {b} plus {c}?"]).format(a=a, b=b, c=c)
    if kind == 1:
        return f"{a} * {b}", r.choice(["How much is {a} times {b}?", "Multiply {a} by {b}.", "{a} times {b}, please.",
                                       "what is {a} multiplied by {b}"]).format(a=a, b=b)
    if kind == 2:
        q = v.num(2, 99)
        return f"{a * q} / {q}", r.choice(["Divide {t} by {q}.", "What is {t} divided by {q}?", "{t} over {q}?",
                                           "How many times does {q} go into {t}?"]).format(t=a * q, q=q)
    if kind == 3:
        hi, lo = max(a, b) + 1, min(a, b)
        return f"{hi} - {lo}", r.choice(["What is {hi} minus {lo}?", "Subtract {lo} from {hi}.",
                                         "What's the difference between {hi} and {lo}?", "Take {lo} away from {hi}."]).format(hi=hi, lo=lo)
    if kind == 4:
        n, per = v.num(2, 60), v.num(2, 200)
        return f"{n} * {per}", r.choice(["I have {n} boxes of {per} {it}. How many {it} is that in total?",
                                         "There are {n} packs with {per} {it} each. How many {it} altogether?",
                                         "{n} crates hold {per} {it} each; how many {it} in all?"]).format(n=n, per=per, it=it)
    if kind == 5:
        n, each = v.num(2, 40), v.num(2, 300)
        return f"{n * each} / {n}", r.choice(["{t} {it} are shared equally by {n} people. How many does each get?",
                                              "Split {t} {it} evenly into {n} groups. How many per group?"]).format(t=n * each, n=n, it=it)
    if kind == 6:
        hi, lo = max(a, b) + 1, min(a, b)
        return f"{hi} - {lo}", r.choice(["I had {hi} {it} and gave away {lo}. How many are left?",
                                         "Of {hi} {it}, {lo} were sold. How many remain?"]).format(hi=hi, lo=lo, it=it)
    x = v.num(2, 99)
    return f"{x} * {x}", r.choice(["What is {x} squared?", "Square {x}.", "{x} to the power of two?"]).format(x=x)


# Train: half of the price chains quote the asked item's line ("valves: 107") before the
# calculator call. The model then writes the item in the file's own form (line start: "valves",
# not the question's " valves", other BPE pieces) and the price that follows it is a copy of what
# follows the same tokens in the file (an induction copy). Runs 23-24 multiplied the file's
# smallest price (1, 2 or 3) in 13 of 15 failed held-out price chains, with the line inside the
# sliding window: finding the line is the step they miss.
_PRICE_QUOTE_P = 0.5


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
        quote = f"{it}: {prices[it]}" if s.split == "train" and r.random() < _PRICE_QUOTE_P else ""
        res = s.call([("calculator", {"expression": e})], content=quote)[0]
        s.answer(tpl(r, s.split, "total_a").format(n=n, it=it, p=prices[it], v=res))
        return res
    if kind == "field_calc":
        text, kv = _config_file(v, graded=True)
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
        f = s.show_path(rel)
        s.user(ttpl(r, s.split, "fieldcalc_q").format(k=k, f=f, word=word, m=m))
        s.call([s.read_call(rel)])
        res = s.call([("calculator", {"expression": f"{kv[k]} {op} {m}"})])[0]
        s.answer(ttpl(r, s.split, "fieldcalc_a").format(k=k, f=f, x=kv[k], op=op, word=word, m=m,
                                                         v=res))
        return res
    if kind == "note_calc":
        k = v.word()
        val = v.num()
        s.world["notes"][k] = str(val)
        m = v.num(2, 99)
        s.user(ttpl(r, s.split, "notecalc_q").format(k=k, m=m))
        s.call([("notes_read", {"key": k})])
        res = s.call([("calculator", {"expression": f"{val} * {m}"})])[0]
        s.answer(ttpl(r, s.split, "notecalc_a").format(k=k, x=val, m=m, v=res))
        return res
    n = v.num(2, 40)
    s.user(ttpl(r, s.split, "clockcalc_q").format(n=n))
    now = s.call([("clock", {})])[0]
    year = now[:4]
    res = s.call([("calculator", {"expression": f"{year} + {n}"})])[0]
    s.answer(ttpl(r, s.split, "clockcalc_a").format(n=n, v=res))
    return res


# Train: a share of the two-part requests is served one call at a time (the second call after
# the first result). The shipped model answered 6 of its 9 failed held-out multi tasks ("Work out
# A as well as B.") after computing A alone: every train sample made both calls in one reply, so
# nothing showed a second call after a result.
_MULTI_SEQ_P = 0.3


def _calls_maybe_one_by_one(s: Session, v: Values, calls):
    if s.split == "train" and v.r.random() < _MULTI_SEQ_P:
        return [s.call([c])[0] for c in calls]
    return s.call(calls)


def fam_multi(s: Session, v: Values):
    r = v.r
    kind = r.choice(["calc2", "read2", "mixed"])
    if kind == "calc2":
        (e1, _), (e2, _) = _expr(v), _expr(v)
        s.user(tpl(r, s.split, "multi_q").format(e1=e1, e2=e2))
        v1, v2 = _calls_maybe_one_by_one(s, v, [("calculator", {"expression": e1}),
                                                ("calculator", {"expression": e2})])
        s.answer(tpl(r, s.split, "multi_a").format(e1=e1, e2=e2, v1=v1, v2=v2))
        return v2
    if kind == "read2":
        (t1, kv1), (t2, kv2) = _config_file(v, graded=True), _config_file(v, graded=True)
        f1, f2 = v.filename("conf"), v.filename("conf")
        if f1 == f2:
            f2 = "b" + f2
        s.world["files"][f1], s.world["files"][f2] = t1, t2
        k1, k2 = r.choice(list(kv1)), r.choice(list(kv2))
        p1, p2 = s.show_path(f1), s.show_path(f2)
        s.user(ttpl(r, s.split, "read2_q").format(k1=k1, f1=p1, k2=k2, f2=p2))
        _calls_maybe_one_by_one(s, v, [s.read_call(f1), s.read_call(f2)])
        s.answer(ttpl(r, s.split, "read2_a").format(k1=k1, f1=p1, v1=kv1[k1], k2=k2, f2=p2,
                                                     v2=kv2[k2]))
        return kv2[k2]
    e, _ = _expr(v)
    s.user(ttpl(r, s.split, "mixed_q").format(e=e))
    now, val = s.call([("clock", {}), ("calculator", {"expression": e})])
    s.answer(ttpl(r, s.split, "mixed_a").format(now=now, e=e, v=val))
    return val


# Error family, train split: more kinds of failure and of correction. The model retried a
# failing call with the same arguments until the round limit; every train error sample shows a
# corrected call that differs from each failed one, now after more kinds of error (operators,
# thousands separators, currency signs, powers, percentages, a path outside the MCP root, a
# file one directory deeper) and, in a share of them, after two failures in a row (each retry
# fixes what the last error message names). Weights: the original three kinds keep about 70%.
_ERROR_TRAIN_KINDS = {"path": 4, "nested": 1, "root": 1, "calc": 2, "calc2": 1, "note": 2,
                      "note2": 1}  # "root" only with the MCP tools
# calculator errors: (operator, what the user wrote instead)
_ERR_OPS = [("*", "x"), ("*", "times"), ("/", ":"), ("+", "plus"), ("*", "\u00d7"),
            ("/", "\u00f7"), ("-", "minus")]
_ERRNOTE2_Q = ["Read my note {k}. If it does not exist, try {alt}, and then {real}.",
               "What does my note {k} say? It may be saved as {alt} or as {real}.",
               "Check note {k}; failing that {alt}; failing that {real}.",
               "I saved a note as {k}, {alt} or {real}, not sure which. What does it say?",
               "Open note {k}, or {alt}, or {real}: whichever exists.",
               "Try my notes {k}, {alt} and {real} in that order and tell me what the first "
               "existing one says.",
               "Get note {k} (it could also be {alt} or {real}).",
               "My note is {k}, or maybe {alt}, or {real}. Read it."]
_ERRNOTE2_A = ["Neither {k} nor {alt} exists; {real} says {r}.",
               "{k} and {alt} are missing. {real}: {r}.",
               "Note {real} says {r} ({k} and {alt} do not exist).", "{real} says {r}.",
               "There is no note {k} or {alt}, but {real} says {r}."]


def _err_calc_train(s: Session, v: Values, n_err: int):
    """A calculator request written with n_err (1 or 2) things the calculator rejects; each
    retry fixes the leftmost one (the one the error names), the last call succeeds."""
    r = v.r
    sub = "op" if n_err == 2 else r.choice(["op", "op", "num", "power", "percent"])
    if sub == "power":
        x = v.num(2, 99)
        texts, calls = (str(x), "^", "2"), [f"{x} ^ 2", f"{x} * {x}"]
    elif sub == "percent":
        p, b = r.choice([5, 10, 15, 20, 25, 30, 40, 50, 75]), v.num(20, 5000)
        texts, calls = (f"{p}%", "of", str(b)), [f"{p}% of {b}", f"{p} / 100 * {b}"]
    else:
        op, bad = r.choice(_ERR_OPS) if sub == "op" else (r.choice("+-*/"), None)
        b = v.num(2, 99) if op == "/" else v.num(2, 999)
        a = b * v.num(2, 999) if op == "/" else v.num()
        a_bad = None
        if sub == "num" or n_err == 2:  # a thousands separator or a currency sign on a
            a_bad = f"{a:,}" if a >= 1000 and r.random() < 0.6 else r.choice("$\u20ac\u00a3") + str(a)
        texts = (a_bad or str(a), bad or op, str(b))
        calls = [" ".join(texts)]
        if a_bad and bad:
            calls.append(f"{a} {bad} {b}")
        calls.append(f"{a} {op} {b}")
    s.user(ttpl(r, s.split, "errcalc_q").format(a=texts[0], bad=texts[1], b=texts[2]))
    for e in calls:
        res = s.call([("calculator", {"expression": e})])[0]
    e = calls[-1]
    fixed_op = sub == "op" and n_err == 1
    s.answer(r.choice([t for t in T["errcalc_a"][0] if fixed_op or "operator" not in t])
             .format(e=e, v=res))
    return res


def _err_note2_train(s: Session, v: Values):
    """Two missing notes (the key and the first fallback the user names), then the second."""
    r = v.r
    k, val = v.word(), str(v.num())
    s1, s2 = r.sample(["_notes", "s", "_list", "_old", "2", "_main", "_v2"], 2)
    alt, real = k + s1, k + s2
    s.world["notes"][real] = val
    s.user(r.choice(_ERRNOTE2_Q).format(k=k, alt=alt, real=real))
    s.call([("notes_read", {"key": k})])
    s.call([("notes_read", {"key": alt})])
    res = s.call([("notes_read", {"key": real})])[0]
    s.answer(r.choice(_ERRNOTE2_A).format(k=k, alt=alt, real=real, r=res))
    return val


# Near-miss file names (train only, since session 19): after a missing file the shipped model
# listed the right folder and then read a path it had built from syllables of the names it saw
# (`baisbraswait/baikais.conf` for `wirkais.conf`, 6 of its 13 failed error tasks). Half of the
# train folders listed on that path hold 1-2 files that share the start or the end of the wanted
# name, so only an exact copy of the listed name reads the right file.
_NEAR_MISS_P = 0.5


def _near_miss_name(v: Values, name: str) -> Optional[str]:
    """A train-pool file name that keeps the start or the end of name's stem (and its
    extension) but is not name; None when no draw qualifies."""
    stem, ext = name.rsplit(".", 1)
    for _ in range(8):
        w = v.word()
        cut = v.r.randint(2, max(2, len(stem) - 2))
        cand = stem[:cut] + w[cut:] if v.r.random() < 0.5 else w[:cut] + stem[cut:]
        if 4 <= len(cand) <= 14 and cand != stem and _pool_of(cand) == "train":
            return cand + "." + ext
    return None


def _add_near_misses(s: "Session", v: Values, d: str, name: str):
    """Train only: with probability _NEAR_MISS_P, 1-2 near-miss files of name in folder d."""
    if v.r.random() >= _NEAR_MISS_P:
        return
    for _ in range(v.r.randint(1, 2)):
        nm = _near_miss_name(v, name)
        if nm and f"{d}/{nm}" not in s.world["files"]:
            s.world["files"][f"{d}/{nm}"] = _prose_file(v, 2) if v.r.random() < 0.5 else _config_file(v)[0]


def _err_path_train(s: Session, v: Values, kind: str):
    """nested: the file sits one directory below the one the user names (read at the root
    fails, read in that directory fails, list it, list the sub-directory, read). root (MCP):
    the user gives a relative path, the server denies it, the retry puts it under the root."""
    r = v.r
    text, kv = _config_file(v, graded=True)
    d = v.word()
    k = r.choice(list(kv))
    if kind == "root":
        rel = f"{d}/{v.filename('conf')}"
        s.world["files"][rel] = text
        s.user(tpl(r, s.split, "field_q").format(k=k, f=rel))
        s.call([(MCP_PREFIX + "read_text_file", {"path": rel})])
        s.call([s.read_call(rel)])
        s.answer(tpl(r, s.split, "field_a").format(k=k, f=s.show_path(rel), v=kv[k]))
        return kv[k]
    sub = v.word()
    base = v.filename("conf")
    rel = f"{d}/{sub}/{base}"
    s.world["files"][rel] = text
    for _ in range(r.randint(1, 2)):
        s.world["files"][f"{d}/{v.filename()}"] = _prose_file(v, 2)
    if r.random() < 0.5:
        s.world["files"][f"{d}/{sub}/{v.filename()}"] = _prose_file(v, 2)
    _add_near_misses(s, v, f"{d}/{sub}", base)
    s.user(ttpl(r, s.split, "errpath_hint_q").format(k=k, b=base, d=s.show_path(d)))
    s.call([s.read_call(base)])
    s.call([s.read_call(f"{d}/{base}")])
    s.call([s.list_call(d)])
    s.call([s.list_call(f"{d}/{sub}")])
    s.call([s.read_call(rel)])
    s.answer(tpl(r, s.split, "field_a").format(k=k, f=s.show_path(rel), v=kv[k]))
    return kv[k]


# Train, with real names: the user misspells a file at the root ("apps.conf" for "app.conf"); the
# read fails, the root is listed, and the model reads the file the listing shows.
TYPO_READ_Q = ["Read {f}.", "What's in {f}?", "Open {f}, please.", "Show me {f}."]
TYPO_FIELD_Q = ["What is the {k} in {f}?", "Which {k} does {f} set?", "Check {f} for the {k}."]
TYPO_READ_A = ["There is no {t}, but {f} says:\n{r}", "{t} does not exist; {f} reads:\n{r}"]
TYPO_FIELD_A = ["There is no {t}; {f} has {k} = {val}.", "{t} does not exist, but {f} sets {k} to {val}.",
                "The {k} in {f} is {val}."]


def _typo(r: random.Random, stem: str) -> str:
    """A misspelling of stem: a letter added, dropped or doubled, two swapped, or '_'/'-' swapped."""
    for _ in range(8):
        i = r.randrange(len(stem))
        kind = r.randrange(5)
        if kind == 0:
            t = stem + "s"
        elif kind == 1 and len(stem) > 3:
            t = stem[:i] + stem[i + 1:]
        elif kind == 2:
            t = stem[:i] + stem[i] + stem[i:]
        elif kind == 3 and i + 1 < len(stem):
            t = stem[:i] + stem[i + 1] + stem[i] + stem[i + 2:]
        else:
            t = stem.replace("_", "-") if "_" in stem else stem.replace("-", "_") if "-" in stem else stem + "s"
        if t != stem:
            return t
    return stem + "s"


def _err_typo_train(s: Session, v: Values):
    r = v.r
    text, kv = _config_file(v, graded=True)
    stem = v.word()
    name = stem + ".conf"
    s.world["files"][name] = text
    for _ in range(r.randint(0, 3)):
        s.world["files"].setdefault(v.filename(), _prose_file(v, 2))
    typo = _typo(r, stem) + ".conf"
    if typo in s.world["files"]:
        del s.world["files"][typo]
    f, t = s.show_path(name), s.show_path(typo)
    if r.random() < 0.5:
        k = r.choice(list(kv))
        s.user(r.choice(TYPO_FIELD_Q).format(f=t, k=k))
        s.call([s.read_call(typo)])
        s.call([s.list_call("")])
        s.call([s.read_call(name)])
        s.answer(r.choice(TYPO_FIELD_A).format(t=t, f=f, k=k, val=kv[k]))
        return kv[k]
    s.user(r.choice(TYPO_READ_Q).format(f=t))
    s.call([s.read_call(typo)])
    s.call([s.list_call("")])
    res = s.call([s.read_call(name)])[0]
    s.answer(r.choice(TYPO_READ_A).format(t=t, f=f, r=res))
    return text.split("\n")[0]


def fam_error(s: Session, v: Values):
    r = v.r
    if s.split == "train" and v.real_names > 0 and r.random() < 0.2:
        return _err_typo_train(s, v)
    if s.split == "train":
        kinds = [k for k in _ERROR_TRAIN_KINDS if k != "root" or s.mcp]
        kind = r.choices(kinds, weights=[_ERROR_TRAIN_KINDS[k] for k in kinds])[0]
        if kind in ("calc", "calc2"):
            return _err_calc_train(s, v, 2 if kind == "calc2" else 1)
        if kind == "note2":
            return _err_note2_train(s, v)
        if kind in ("nested", "root"):
            return _err_path_train(s, v, kind)
    else:
        kind = r.choice(["path", "path", "calc", "note"])
    if kind == "path":
        text, kv = _config_file(v, graded=True)
        d = v.word()
        rel = f"{d}/{v.filename('conf')}"
        s.world["files"][rel] = text
        for _ in range(r.randint(0, 2)):
            s.world["files"][f"{d}/{v.filename()}"] = _prose_file(v, 2)
        k = r.choice(list(kv))
        base = rel.split("/")[-1]
        if s.split == "train":  # no draw in held-out
            _add_near_misses(s, v, d, base)
        hint = r.random() < 0.5
        s.user(ttpl(r, s.split, "errpath_hint_q" if hint else "errpath_q")
               .format(k=k, b=base, d=s.show_path(d)))
        s.call([s.read_call(base)])
        if s.split == "train" and not hint:
            # the user named no directory: find it (search, or list the root) rather than
            # list a directory name that appears nowhere in the conversation
            if s.mcp:
                s.call([(MCP_PREFIX + "search_files", {"path": MCP_ROOT, "pattern": f"**/{base}"})])
            else:
                s.call([s.list_call("")])
                s.call([s.list_call(d)])
        else:
            s.call([s.list_call(d)])
        s.call([s.read_call(rel)])
        s.answer(tpl(r, s.split, "field_a").format(k=k, f=s.show_path(rel), v=kv[k]))
        return kv[k]
    if kind == "calc":
        a, b = v.num(), v.num(2, 999)
        op, bad = r.choice([("*", "x"), ("*", "times"), ("/", ":"), ("+", "plus")])
        if op == "/":  # a whole quotient; the question asks for this a (it asked for the a before
            a = a - a % b if a >= b else a * b  # the change, expected the new one's quotient)
        s.user(ttpl(r, s.split, "errcalc_q").format(a=a, bad=bad, b=b))
        s.call([("calculator", {"expression": f"{a} {bad} {b}"})])
        e = f"{a} {op} {b}"
        res = s.call([("calculator", {"expression": e})])[0]
        s.answer(ttpl(r, s.split, "errcalc_a").format(e=e, v=res))
        return res
    k, val = v.word(), str(v.num())
    real = k + r.choice(["_notes", "s", "_list"])
    s.world["notes"][real] = val
    s.user(ttpl(r, s.split, "errnote_q").format(k=k, real=real))
    s.call([("notes_read", {"key": k})])
    res = s.call([("notes_read", {"key": real})])[0]
    s.answer(ttpl(r, s.split, "errnote_a").format(k=k, real=real, r=res))
    return val


def fam_notool(s: Session, v: Values):
    if s.split == "train":
        return _notool_train(s, v)
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


def _notool_fields(v: Values) -> Dict[str, str]:
    """Every value a NOTOOL_TRAIN template may use, drawn in a fixed order (train only)."""
    r = v.r
    n, n2, n3 = r.sample(v.names, 3)
    ci, ci2 = r.sample(v.cities, 2)
    it, it2, it3 = r.sample(v.items, 3)
    c = v.code()
    cq = c if r.random() < 0.5 else c[:-1] + str((int(c[-1]) + r.randint(1, 9)) % 10)
    w = v.word()
    w2 = v.word()
    while len(w2) == len(w):
        w2 = v.word()
    w3 = v.word()
    while w3 in (w, w2):
        w3 = v.word()
    x = v.num()
    x2 = v.num()
    while x2 == x:
        x2 = v.num()
    nq = n if r.random() < 0.5 else n2
    ciq = ci if r.random() < 0.5 else ci2
    e, ev = _expr(v)
    cnt = r.randint(2, 5)
    lst = ", ".join(v.word() for _ in range(cnt))
    yn = lambda b: "Yes" if b else "No"  # noqa: E731
    return {
        "n": n, "n2": n2, "n3": n3, "nq": nq, "nlow": n.lower(), "ci": ci, "ci2": ci2, "ciq": ciq,
        "it": it, "it2": it2, "it3": it3, "c": c, "cq": cq, "w": w, "w2": w2, "w3": w3,
        "ww": f"{w} {w}", "wjoin": w + w2, "wdash": f"{w}-{w2}",
        "wlong": w if len(w) > len(w2) else w2, "wshort": w2 if len(w) > len(w2) else w,
        "walpha": min(w, w2), "x": str(x), "x2": str(x2), "xmax": str(max(x, x2)),
        "xmin": str(min(x, x2)), "cmp": "bigger" if x > x2 else "smaller",
        "parity": "even" if x % 2 == 0 else "odd", "y": str(r.randint(16, 95)),
        "yr": str(r.randint(1950, 2010)), "e": e, "ev": ev, "f": v.filename(),
        "k": r.choice(["port", "timeout", "limit", "budget", "retries", "level"]),
        "kw": v.word(), "d": v.date(), "p": str(v.num(1, 500)), "cnt": str(cnt), "lst": lst,
        "yn_big": yn(x > x2), "yn_name": yn(nq == n), "yn_city": yn(ciq == ci),
        "yn_code": yn(cq == c), "same": "they are identical" if cq == c else "they differ",
        "yn_even": yn(x % 2 == 0), "yn_odd": yn(x % 2 == 1),
        "hello": "Hello", "morning": "Good morning", "evening": "Good evening", "bye": "Goodbye",
        "welcome": "welcome", "help": "help", "assistant": "assistant",
    }


# Composed notool questions (train only, since session 18). NOTOOL_TRAIN holds ~150 whole
# exchanges; on the held-out "I live in X. Which city do I live in?" the shipped model answered
# "You're welcome." or a garbled name in 24 of 50 tasks: it keys on the few question sentences
# it saw, not on "a value stated, then asked for". A composed question is a statement carrying
# the value (_NT_FACTS), sometimes a second statement of another slot (a distractor, either
# side), a bridge and a question about the first (_NT_ASKS), answered by a frame of _NT_ANSWERS
# that contains the value. Kept clear of held-out templates by the rule of T's lists
# (near_heldout); none says "live" (the held-out statement's verb).
_NOTOOL_COMPOSED_P = 0.4
_NT_FACTS = {
    "ci": ["I'm from {ci}.", "My home town is {ci}.", "I grew up in {ci}.", "I'm staying in {ci} this month.",
           "My flat is in {ci}.", "{ci} is where I'm from.", "I moved to {ci} last year.",
           "Our office is in {ci}.", "I'm writing from {ci}.", "My parents are in {ci}.",
           "I just got back to {ci}.", "Home for me is {ci}.", "My house is in {ci}.",
           "I'm currently in {ci}.", "We settled in {ci}."],
    "n": ["My name is {n}.", "I'm {n}.", "This is {n}.", "{n} here.", "Call me {n}.", "I go by {n}.",
          "Everyone calls me {n}.", "You're chatting with {n}.", "The name is {n}."],
    "c": ["My code is {c}.", "The code is {c}.", "Here is my ticket: {c}.", "Reference: {c}.",
          "My booking number is {c}.", "The order ID is {c}.", "Note this code: {c}.",
          "{c} is my membership number.", "Code {c} is the one.", "The serial is {c}."],
    "x": ["My lucky number is {x}.", "I counted {x} birds.", "The total on my receipt is {x}.",
          "My badge number is {x}.", "We sold {x} tickets.", "I walked {x} steps today."],
    "w": ["The password hint is {w}.", "My dog is named {w}.", "Our project is called {w}.",
          "The magic word is {w}.", "My boat is named {w}.", "The word of the day is {w}."],
}
_NT_ASKS = {
    "ci": ["Which city did I mention?", "What city did I name?", "What place did I just mention?",
           "Tell me the city I gave you.", "Name the city I said.", "Which town was that?",
           "What's the name of that city?", "Which place did I say?", "Remind me which city that was.",
           "Can you repeat the city?", "Which city is it, then?", "What city is that?",
           "Which city was it again?", "Say the city back to me."],
    "n": ["What's my name?", "Who am I?", "What did I say my name is?", "Tell me my name.",
          "Can you repeat my name?", "Which name did I give?", "Remind me what I'm called."],
    "c": ["What was the code?", "Repeat the code.", "Which code did I give you?",
          "Tell me that code again.", "Read the code back.", "What's the code, exactly?"],
    "x": ["What number did I say?", "Which number was that?", "Repeat the number.",
          "What was the number?", "Tell me the number I gave."],
    "w": ["What was the word?", "Which word did I use?", "Repeat that word.", "Tell me the word again.",
          "What's the name I gave?"],
}
_NT_ANSWERS = {
    "ci": ["{ci}.", "You mentioned {ci}.", "It was {ci}.", "The city is {ci}.", "{ci}, as you said.",
           "You said {ci}."],
    "n": ["{n}.", "Your name is {n}.", "You said you are {n}.", "You're {n}."],
    "c": ["{c}", "The code is {c}.", "You gave me {c}.", "It was {c}."],
    "x": ["{x}.", "You said {x}.", "The number is {x}.", "It was {x}."],
    "w": ["{w}.", "The word is {w}.", "You said {w}.", "It was {w}."],
}
_NT_BRIDGES = ["", "", "", "Quick question: ", "Now, ", "OK. ", "Test: ", "So, ", "One thing: "]
_NT_SLOTS, _NT_SLOT_W = ["ci", "n", "c", "x", "w"], [3, 2, 3, 1, 1]
# Composed copy requests (since session 19): a value to send back unchanged, asked by a verb
# (_NT_COPY_VERBS, never "echo": the held-out request's verb) of an object phrase in a frame;
# mostly answered with the bare value. The shipped model echoed held-out codes with their first
# letter wrong (NV-1552 -> YV-1552): the first token of a bare answer had to find the value
# after request sentences it never saw.
_NT_COPY_P = 0.5  # of the composed questions whose slot is c, x or w
_NT_COPY_VERBS = ["repeat", "copy", "type", "write", "say", "send", "return", "give", "reproduce",
                  "mirror", "play", "read", "hand", "paste", "spell out", "output", "print"]
_NT_COPY_BACK = ["", " back", " back exactly", " exactly", " word for word", " as is", " unchanged"]
_NT_COPY_OBJECTS = ["this", "this code", "the text below", "these characters", "what follows",
                    "the string", "the next bit", "the following text", "this value",
                    "the characters after the colon", "my input", "the token"]
_NT_COPY_FRAMES = ["{V} {O}{B}: {x}", "{V} {O}{B}: {x}.", "Please {v} {O}{B}: {x}",
                   "Could you {v} {O}{B}? {x}", "{x} - {v} {O}{B}, please.", "Can you {v} {O}{B}: {x}",
                   "{V}{B}: {x}", "I need you to {v} {O}{B}: {x}", "Task: {v} {O}{B}. {x}",
                   "{x}\n{V} {O}{B}."]
_NT_COPY_ANSWERS = ["{x}", "{x}", "{x}", "{x}.", "Here it is: {x}", "Sure: {x}", "{x} (unchanged)"]


def _compose_copy(r: random.Random, slot: str):
    """(question, answer) templates of a copy request of field slot (c, x or w)."""
    verb, back = r.choice(_NT_COPY_VERBS), r.choice(_NT_COPY_BACK)
    frame = r.choice(_NT_COPY_FRAMES).replace("{B}", back)
    q = _fill_frame(frame, verb, r.choice(_NT_COPY_OBJECTS))
    return q.replace("{x}", "{" + slot + "}"), r.choice(_NT_COPY_ANSWERS).replace("{x}", "{" + slot + "}")


def _compose_notool(r: random.Random):
    """(question template, answer template, field) of a composed notool question, not near a
    held-out template; redrawn until one is not."""
    for _ in range(64):
        slot = r.choices(_NT_SLOTS, weights=_NT_SLOT_W)[0]
        if slot in ("c", "x", "w") and r.random() < _NT_COPY_P:
            q, a = _compose_copy(r, slot)
            if not near_heldout(q):
                return q, a, slot
            continue
        facts = [r.choice(_NT_FACTS[slot])]
        if r.random() < 0.3:
            other = r.choice([k for k in _NT_SLOTS if k != slot])
            facts.insert(r.randrange(2), r.choice(_NT_FACTS[other]))
        ask = r.choice(_NT_ASKS[slot])
        bridge = r.choice(_NT_BRIDGES)
        if bridge:
            ask = bridge + (ask if bridge.endswith(". ") else ask[0].lower() + ask[1:])
        q = " ".join(facts + [ask])
        if not near_heldout(q):
            return q, r.choice(_NT_ANSWERS[slot]), slot
    raise RuntimeError("composed notool questions: every draw is near a held-out template")


def _notool_train(s: Session, v: Values):
    """A train notool exchange: a question answerable from the message itself (tools offered
    but not called). A composed question (_NOTOOL_COMPOSED_P) or a sub-kind of NOTOOL_TRAIN
    weighted by NOTOOL_WEIGHTS; the answer contains the expected value."""
    r = v.r
    if r.random() < _NOTOOL_COMPOSED_P:
        q, a, ek = _compose_notool(r)
    else:
        kind = r.choices(_NOTOOL_KINDS, weights=_NOTOOL_W)[0]
        q, a, ek = r.choice(NOTOOL_TRAIN[kind])
    f = _notool_fields(v)
    s.user(q.format(**f))
    s.answer(a.format(**f))
    return f[ek]


def _filler_turn(s: Session, v: Values, files):
    """One ordinary exchange of a long session (adds ~60-400 tokens)."""
    r = v.r
    x = r.random()
    if x < 0.35 and files:
        rel = r.choice(files)
        s.user(tpl(r, "train" if s.split == "train" else "heldout", "read_q").format(f=s.show_path(rel)))
        res = s.call([s.read_call(rel)])[0]
        if s.split == "train":
            s.answer(r.choice(_FILLER_READ_A).format(f=s.show_path(rel), r=res))
        else:
            s.answer(f"Here it is:\n{res}" if r.random() < 0.5
                     else f"{s.show_path(rel)} has {len(res.splitlines())} lines.")
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
    train = s.split == "train"
    files = _populate_fs(v, s.world, r.randint(3, 8))
    kind = r.choice(["file", "file", "calc", "code", "note"])
    reread = None  # (file, answer) when the question is answered after reading the file again
    s.user(r.choice(_RECALL_OPEN_Q if train else _RECALL_OPEN_Q[:3]) if r.random() < 0.3 else "")
    if not s.messages[-1]["content"]:
        s.messages.pop()
    else:
        s.answer(r.choice(_RECALL_OPEN_A if train else _RECALL_OPEN_A[:2]))
    if kind == "file":
        text, kv = _config_file(v, r.randint(4, 7))
        rel = v.filename("conf")
        s.world["files"][rel] = text
        k = r.choice(list(kv))
        f = s.show_path(rel)
        opener = (r.choice(_RECALL_READ_Q) if train else tpl(r, s.split, "read_q")).format(f=f)
        s.user(opener)
        res = s.call([s.read_call(rel)])[0]
        if train and not any(w in opener for w in _RECALL_NO_SHOW):
            s.answer(r.choice(_FILLER_READ_A).format(f=f, r=res))
        else:
            s.answer(r.choice([f"{f} holds {len(kv)} settings.", "Done, I have read it.",
                               f"It has these keys: {', '.join(kv)}."]
                              + ([f"Read it: {len(kv)} keys.", "I've read the file.",
                                  f"{f} is a config file with {len(kv)} entries."] if train else [])))
        q = (r.choice(T["recall_file_q"][0]) if train else
             r.choice([t for t in T['recall_q'][1] if "{f}" in t])).format(f=f, k=k)
        ans = ttpl(r, s.split, "recall_file_a").format(k=k, f=f, v=kv[k])
        if train and r.random() < _RECALL_REREAD_P:
            reread = (rel, r.choice(_RECALL_REREAD_A).format(k=k, f=f, v=kv[k]))
        exp = marker = kv[k]
    elif kind == "calc":
        e, _ = _expr(v, hard=True)
        s.user(tpl(r, s.split, "calc_q").format(e=e))
        val = s.call([("calculator", {"expression": e})])[0]
        s.answer(tpl(r, s.split, "calc_a").format(e=e, v=val))
        q = (r.choice(T["recall_calc_q"][0]) if train else
             r.choice([t for t in T['recall_q'][1] if "{e}" in t])).format(e=e)
        ans = ttpl(r, s.split, "recall_calc_a").format(e=e, v=val)
        exp = marker = val
    elif kind == "code":
        c = v.code()
        cn = r.choice(_CODE_NOUNS) if train else "code"  # held-out templates have no {cn}
        s.user(ttpl(r, s.split, "code_save_q").format(c=c, cn=cn))
        s.answer(ttpl(r, s.split, "code_save_a").format(c=c, cn=cn))
        q = (r.choice(T["recall_code_q"][0]).format(cn=cn) if train else
             r.choice([t for t in T['recall_q'][1] if "code" in t]))
        ans = ttpl(r, s.split, "recall_code_a").format(c=c, cn=cn)
        exp = marker = c
    else:
        k, val = v.word(), str(v.num())
        s.user(tpl(r, s.split, "note_save_q").format(k=k, v=val))
        s.call([("notes_save", {"key": k, "text": val})])
        s.answer(tpl(r, s.split, "note_save_a").format(k=k, v=val))
        q = ttpl(r, s.split, "recall_note_q").format(k=k)
        ans = ttpl(r, s.split, "recall_note_a").format(k=k, v=val)
        exp = marker = val
    start = len(chat.encode_messages(s.messages))
    while len(chat.encode_messages(s.messages)) - start < target_chars:
        _filler_turn(s, v, files)
    s.user(q)
    if reread:
        s.call([s.read_call(reread[0])])
        ans = reread[1]
    s.answer(ans)
    return exp, marker


FAMILY_WEIGHTS = {"single": 0.14, "chain": 0.12, "multi": 0.10, "error": 0.09, "notool": 0.07,
                  "recall": 0.48}
FAMILIES = list(FAMILY_WEIGHTS)


def make_sample(seed: int, index: int, split: str = "train", family: Optional[str] = None,
                recall_chars: Tuple[int, int] = (1500, 9000), real_names: float = 0.0) -> Dict[str, Any]:
    """One deterministic sample. recall_chars: range of the recall distance in characters.
    real_names (train only): the share of drawn words that are real names (REAL_STEMS)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split {split!r}: expected 'train' or 'heldout'")
    if not 0.0 <= real_names <= 1.0:
        raise ValueError(f"real_names {real_names}: expected a share from 0 to 1")
    r = random.Random(f"{seed}/{split}/{index}")
    v = Values(r, split, real_names)
    if family is None:
        family = r.choices(FAMILIES, weights=[FAMILY_WEIGHTS[f] for f in FAMILIES])[0]
    if family not in FAMILY_WEIGHTS:
        raise ValueError(f"family {family!r}: expected one of {FAMILIES}")
    mcp = r.random() < 0.4
    now = f"{v.date()} {r.randint(0, 23):02d}:{r.randint(0, 59):02d}"
    if split == "train" and r.random() < _CLOCK_WEEKDAY_P:
        now += datetime.date.fromisoformat(now[:10]).strftime(" (%A)")
    world = new_world(now)
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
