"""Byte-level BPE for cedar: a trainer, an encoder/decoder, and the HF tokenizer.json format.

What this owns
  * The DeepSeek-V3-family pre-tokenizer (three `Split` regexes, each `Isolated`, then
    `ByteLevel(use_regex=false)`). Python's `re` has no `\\p{..}`, so there are two
    implementations: hand-written matchers (pretokenize_reference, the oracle) and `re`
    patterns with every class spelled out as code-point ranges (pretokenize, the fast path);
    tests check that they agree.
    The C++ tokenizer (model/tokenizer.cpp) runs the same regex strings through PCRE2 with
    PCRE2_UTF|PCRE2_UCP; the hand-written matcher below reproduces PCRE2's semantics exactly
    (character classes checked over every code point: Python 3.11 and PCRE2 10.42 both use
    Unicode 14.0; PCRE2's UCP `\\s` is Z* plus U+0009..U+000D, U+0085 and U+180E).
  * A deterministic byte-level BPE trainer (incremental pair counts, ties broken by the
    lexicographically smallest pair) that writes an HF-compatible tokenizer.json.
  * Encoding (added tokens first, then pre-tokenizer, byte mapping, merges by rank) and
    decoding (ids -> bytes -> UTF-8).

Special-token id table (the choice for cedar's own tokenizers; documented in the report)
  Added tokens sit at FIXED LOW IDS 0..16 so that they do not move when the merge count
  changes; the 256 byte symbols follow at 17..272 (byte b -> id 17 + b), merges after that.
  bos/eos/pad keep DeepSeek's ids 0/1/2. `｜DSML｜` is ONE added token (special=false, like
  `<think>`/`</think>`) so that DSML markup costs few tokens and survives
  decode(skip_special=True); the real V4.1 vocabulary may differ (MODEL_SPEC §9), which
  is why runtime code must look ids up by content, never hard-code them.

Invariants
  1. encode(text) concatenated decode is byte-identical to text (byte-level BPE is lossless).
  2. Merging applies the lowest-rank adjacent pair first, the leftmost on ties (HF semantics).
  3. The same tokenizer.json gives the same ids here and in C++ (golden-tested).
"""

from __future__ import annotations

import heapq
import json
import re
import sys
import unicodedata
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

# ---------------------------------------------------------------------------------------------
# Special tokens
# ---------------------------------------------------------------------------------------------

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
SYSTEM = "<｜System｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
LATEST_REMINDER = "<｜latest_reminder｜>"
DSML = "｜DSML｜"
IMAGE = "<｜deepseek_image｜>"

# (content, special). The position in this list is the id.
SPECIAL_TOKENS: List[Tuple[str, bool]] = [
    (BOS, True),
    (EOS, True),
    (PAD, True),
    (SYSTEM, True),
    (USER, True),
    (ASSISTANT, True),
    (THINK_START, False),
    (THINK_END, False),
    (LATEST_REMINDER, True),
    (DSML, False),
    (IMAGE, True),
    ("<｜action｜>", True),
    ("<｜query｜>", True),
    ("<｜authority｜>", True),
    ("<｜domain｜>", True),
    ("<｜title｜>", True),
    ("<｜read_url｜>", True),
]
N_SPECIAL = len(SPECIAL_TOKENS)  # byte symbols start here

# ---------------------------------------------------------------------------------------------
# Pre-tokenizer: the DeepSeek-V3 tokenizer.json Split regexes (verbatim, incl. raw CR/LF chars)
# ---------------------------------------------------------------------------------------------

PATTERN_DIGITS = "\\p{N}{1,3}"
PATTERN_CJK = "[一-龥぀-ゟ゠-ヿ]+"
PATTERN_MAIN = (
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+"
    "|\\s+(?!\\S)"
    "|\\s+"
)
PATTERNS = [PATTERN_DIGITS, PATTERN_CJK, PATTERN_MAIN]

_ASCII_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_EXTRA_SPACE = frozenset("\t\n\x0b\x0c\r\x85\u180e")


def _cat(ch: str) -> str:
    return unicodedata.category(ch)[0]


def is_space(ch: str) -> bool:
    """PCRE2 UCP `\\s`: Z categories, TAB..CR, NEL, U+180E."""
    return ch in _EXTRA_SPACE or _cat(ch) == "Z"


def _is_lm(ch: str) -> bool:
    return _cat(ch) in ("L", "M")


def _is_ps(ch: str) -> bool:
    return _cat(ch) in ("P", "S")


def _is_ascii_letter(ch: str) -> bool:
    return ("a" <= ch <= "z") or ("A" <= ch <= "Z")


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FA5 or 0x3040 <= o <= 0x309F or 0x30A0 <= o <= 0x30FF


def _match_digits(s: str, i: int) -> Optional[int]:
    j = i
    while j < len(s) and j - i < 3 and _cat(s[j]) == "N":
        j += 1
    return j if j > i else None


def _match_cjk(s: str, i: int) -> Optional[int]:
    j = i
    while j < len(s) and _is_cjk(s[j]):
        j += 1
    return j if j > i else None


def _match_main(s: str, i: int) -> Optional[int]:
    """End of PATTERN_MAIN's match starting exactly at i (backtracking semantics), or None."""
    n = len(s)
    c = s[i]
    # 1. [ascii punct][A-Za-z]+
    if c in _ASCII_PUNCT and i + 1 < n and _is_ascii_letter(s[i + 1]):
        j = i + 1
        while j < n and _is_ascii_letter(s[j]):
            j += 1
        return j
    # 2. [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+  (try with the optional char, then without)
    if c not in "\r\n" and _cat(c) not in ("L", "P", "S"):
        j = i + 1
        while j < n and _is_lm(s[j]):
            j += 1
        if j > i + 1:
            return j
    if _is_lm(c):
        j = i
        while j < n and _is_lm(s[j]):
            j += 1
        return j
    # 3.  ?[\p{P}\p{S}]+[\r\n]*
    j = i + 1 if c == " " else i
    k = j
    while k < n and _is_ps(s[k]):
        k += 1
    if k > j:
        while k < n and s[k] in "\r\n":
            k += 1
        return k
    if not is_space(c):
        return None
    r = i
    while r < n and is_space(s[r]):
        r += 1
    # 4. \s*[\r\n]+  -> up to the last CR/LF of the whitespace run
    for p in range(r - 1, i - 1, -1):
        if s[p] in "\r\n":
            return p + 1
    # 5. \s+(?!\S)  -> the whole run at the end of the piece, else all but its last char
    if r == n:
        return r
    if r - i >= 2:
        return r - 1
    # 6. \s+
    return r


def _split_isolated(s: str, matcher) -> List[str]:
    """HF Split(behavior=Isolated): matches and the unmatched gaps between them, in order."""
    out: List[str] = []
    gap_start = 0
    i = 0
    n = len(s)
    while i < n:
        end = matcher(s, i)
        if end is None:
            i += 1
            continue
        if gap_start < i:
            out.append(s[gap_start:i])
        out.append(s[i:end])
        i = end
        gap_start = end
    if gap_start < n:
        out.append(s[gap_start:n])
    return out


_MATCHERS = {PATTERN_DIGITS: _match_digits, PATTERN_CJK: _match_cjk, PATTERN_MAIN: _match_main}


def pretokenize_reference(text: str, patterns: Sequence[str] = PATTERNS) -> List[str]:
    """The pre-tokenizer from the hand-written matchers above: slow, and the oracle in tests."""
    pieces = [text] if text else []
    for pat in patterns:
        m = _MATCHERS[pat]
        nxt: List[str] = []
        for p in pieces:
            nxt.extend(_split_isolated(p, m))
        pieces = nxt
    return pieces


# The fast path: the same three patterns for Python's `re`, with every \p{..} and \s spelled
# out as explicit code-point ranges built once from unicodedata (tests check it against the
# hand-written matchers on random text).
_FAST: Dict[str, Dict[str, "re.Pattern"]] = {}
_ASTRAL = re.compile("[\\U00010000-\\U0010ffff]")


def class_ranges() -> Dict[str, List[List[int]]]:
    """Inclusive code-point ranges of \\p{L}, \\p{M}, \\p{N}, \\p{P}, \\p{S} and \\s ("s") as this
    module sees them (surrogates excluded); the C++ tests check PCRE2 against them."""
    ranges: Dict[str, List[List[int]]] = {k: [] for k in "LMNPSs"}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        for k in (_cat(ch), "s" if is_space(ch) else None):
            if k in ranges:
                r = ranges[k]
                if r and r[-1][1] == cp - 1:
                    r[-1][1] = cp
                else:
                    r.append([cp, cp])
    return ranges


def _fast_patterns() -> Dict[str, Dict[str, "re.Pattern"]]:
    if _FAST:
        return _FAST
    ranges = class_ranges()

    # sre compiles a class of BMP code points to a bitmap (O(1) per char) but scans astral
    # ranges one by one, so each class is split into a BMP part and an astral part.
    def ranges_of(keys: str, astral: bool) -> str:
        lo, hi = (0x10000, 0x10FFFF) if astral else (0, 0xFFFF)
        out = []
        for k in keys:
            for a, b in ranges[k]:
                a, b = max(a, lo), min(b, hi)
                if a <= b:
                    out.append(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}")
        return "".join(out)

    def pos(keys: str) -> str:  # any char of the classes
        astral = ranges_of(keys, True)
        bmp = f"[{ranges_of(keys, False)}]"
        return f"(?:{bmp}|[{astral}])" if astral else bmp

    def neg(keys: str, extra: str = "") -> str:  # any char but `extra` and the classes
        astral = ranges_of(keys, True)
        bmp = f"[^{extra}{ranges_of(keys, False)}\\U00010000-\\U0010ffff]"
        any_astral = "[\\U00010000-\\U0010ffff]"
        return f"(?:{bmp}|(?![{astral}]){any_astral})" if astral else f"(?:{bmp}|{any_astral})"

    def build(pos, neg) -> Dict[str, "re.Pattern"]:
        sp = pos("s")
        not_lps = neg("LPS", "\\r\\n")
        return {
            PATTERN_DIGITS: re.compile(f"{pos('N')}{{1,3}}"),
            PATTERN_CJK: re.compile("[\\u4e00-\\u9fa5\\u3040-\\u309f\\u30a0-\\u30ff]+"),
            PATTERN_MAIN: re.compile(
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
                f"|{not_lps}?{pos('LM')}+"
                f"| ?{pos('PS')}+[\\r\\n]*"
                f"|{sp}*[\\r\\n]+"
                f"|{sp}+(?!{neg('s')})"
                f"|{sp}+"),
        }

    # Text without astral characters (the common case) uses pure-bitmap BMP classes.
    bmp_pos = lambda keys: f"[{ranges_of(keys, False)}]"  # noqa: E731
    bmp_neg = lambda keys, extra="": f"[^{extra}{ranges_of(keys, False)}]"  # noqa: E731
    _FAST["bmp"] = build(bmp_pos, bmp_neg)
    _FAST["all"] = build(pos, neg)
    return _FAST


def pretokenize(text: str, patterns: Sequence[str] = PATTERNS) -> List[str]:
    """HF Sequence of Split(Isolated) regexes: matches and the gaps between them, in order."""
    fast = _fast_patterns()["all" if _ASTRAL.search(text) else "bmp"]
    pieces = [text] if text else []
    for pat in patterns:
        rx = fast[pat]
        nxt: List[str] = []
        for p in pieces:
            last = 0
            for m in rx.finditer(p):
                if m.start() > last:
                    nxt.append(p[last:m.start()])
                nxt.append(m.group(0))
                last = m.end()
            if last < len(p):
                nxt.append(p[last:])
        pieces = nxt
    return pieces


# ---------------------------------------------------------------------------------------------
# Byte <-> unicode map (GPT-2 ByteLevel)
# ---------------------------------------------------------------------------------------------


def bytes_to_unicode() -> Dict[int, str]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


_BYTE_TABLE = str.maketrans({chr(b): c for b, c in BYTE_TO_CHAR.items()})


def byte_level(piece: str) -> str:
    return piece.encode("utf-8").decode("latin-1").translate(_BYTE_TABLE)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


class TokenizerError(ValueError):
    pass


class Tokenizer:
    def __init__(self, vocab: Dict[str, int], merges: List[Tuple[str, str]],
                 added: List[Tuple[int, str, bool]], patterns: Sequence[str] = PATTERNS,
                 ignore_merges: bool = False):
        self.vocab = dict(vocab)
        self.merges = list(merges)
        self.ranks: Dict[Tuple[str, str], int] = {}
        for r, pair in enumerate(self.merges):
            self.ranks.setdefault(pair, r)  # a repeated pair keeps its first (lowest) rank
        self.added = sorted(added)
        self.patterns = list(patterns)
        self.ignore_merges = ignore_merges
        self.id_to_tok: Dict[int, str] = {i: t for t, i in self.vocab.items()}
        self.added_ids = {}
        self.special_ids = set()
        for i, content, special in self.added:
            self.id_to_tok[i] = content
            self.added_ids[content] = i
            if special:
                self.special_ids.add(i)
        self._cache: Dict[str, List[int]] = {}
        self._re_all = self._alternation([c for _, c, _ in self.added])
        self._re_plain = self._alternation([c for i, c, s in self.added if not s])

    @staticmethod
    def _alternation(contents: List[str]):
        if not contents:
            return None
        # Longest first: at the leftmost position the longest added token wins.
        alts = sorted(contents, key=lambda c: (-len(c), c))
        return re.compile("|".join(re.escape(c) for c in alts))

    # -- ids ------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return max(self.id_to_tok) + 1

    def token_to_id(self, tok: str) -> Optional[int]:
        if tok in self.added_ids:
            return self.added_ids[tok]
        return self.vocab.get(tok)

    def id_to_token(self, i: int) -> Optional[str]:
        return self.id_to_tok.get(i)

    # -- encode ---------------------------------------------------------------------------------
    def _bpe(self, word: str) -> List[int]:
        if self.ignore_merges and word in self.vocab:
            out = [self.vocab[word]]
        else:
            # Lowest rank first, leftmost on ties: a heap of (rank, left position) over a linked
            # list of symbols; stale heap entries are skipped (O(n log n) on long pieces).
            syms = list(word)
            n = len(syms)
            nxt = list(range(1, n)) + [-1]
            prv = list(range(-1, n - 1))
            heap = []

            def push(left):
                if left >= 0 and nxt[left] >= 0:
                    r = self.ranks.get((syms[left], syms[nxt[left]]))
                    if r is not None:
                        heapq.heappush(heap, (r, left, syms[left], syms[nxt[left]]))

            for k in range(n - 1):
                push(k)
            while heap:
                r, left, a, b = heapq.heappop(heap)
                right = nxt[left]
                if syms[left] != a or right < 0 or syms[right] != b:
                    continue  # stale: a side changed since the pair was queued
                syms[left] = a + b
                syms[right] = None
                nxt[left] = nxt[right]
                if nxt[right] >= 0:
                    prv[nxt[right]] = left
                push(prv[left])
                push(left)
            out = []
            for s in (t for t in syms if t is not None):
                if s not in self.vocab:
                    raise TokenizerError(f"symbol {s!r} missing from model.vocab")
                out.append(self.vocab[s])
        return out

    def encode_plain(self, text: str) -> List[int]:
        """Text with no added-token recognition: pre-tokenize, byte-map, merge."""
        ids: List[int] = []
        cache = self._cache
        for piece in pretokenize(text, self.patterns):
            hit = cache.get(piece)  # keyed by the raw piece: a hit skips the byte mapping
            if hit is None:
                hit = self._bpe(byte_level(piece))
                if len(cache) < 200000:
                    cache[piece] = hit
            ids.extend(hit)
        return ids

    def encode(self, text: str, allow_special: bool = True) -> List[int]:
        """Added tokens are recognised in text: all of them when allow_special, else only the
        non-special ones (`<think>`, `</think>`, `｜DSML｜`), as in HF."""
        pat = self._re_all if allow_special else self._re_plain
        ids: List[int] = []
        pos = 0
        if pat is not None:
            for m in pat.finditer(text):
                ids.extend(self.encode_plain(text[pos:m.start()]))
                ids.append(self.added_ids[m.group(0)])
                pos = m.end()
        ids.extend(self.encode_plain(text[pos:]))
        return ids

    # -- decode ---------------------------------------------------------------------------------
    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        out = bytearray()
        for i in ids:
            tok = self.id_to_tok.get(i)
            if tok is None:
                raise TokenizerError(f"id {i} is not in the vocabulary")
            if self.added_ids.get(tok) == i:
                if skip_special and i in self.special_ids:
                    continue
                out += tok.encode("utf-8")
            elif all(ch in CHAR_TO_BYTE for ch in tok):
                for ch in tok:
                    out.append(CHAR_TO_BYTE[ch])
            else:
                out += tok.encode("utf-8")  # not byte-level text (a marker): itself, as in HF
        return bytes(out)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    # -- tokenizer.json -------------------------------------------------------------------------
    def to_json_obj(self) -> dict:
        added = [
            {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": s}
            for i, c, s in self.added
        ]
        pre = [{"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False}
               for p in self.patterns]
        pre.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": False})
        vocab = dict(sorted(self.vocab.items(), key=lambda kv: kv[1]))
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {
                "type": "BPE", "dropout": None, "unk_token": None,
                "continuing_subword_prefix": None, "end_of_word_suffix": None,
                "fuse_unk": False, "byte_fallback": False, "ignore_merges": self.ignore_merges,
                "vocab": vocab,
                "merges": [f"{a} {b}" for a, b in self.merges],
            },
        }

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json_obj(), f, ensure_ascii=False, indent=1)
            f.write("\n")

    @classmethod
    def from_json_obj(cls, obj: dict) -> "Tokenizer":
        def need(d, key, where):
            if not isinstance(d, dict) or key not in d:
                raise TokenizerError(f"tokenizer.json: missing field '{where}{key}'")
            return d[key]

        model = need(obj, "model", "")
        if need(model, "type", "model.") != "BPE":
            raise TokenizerError("tokenizer.json: field 'model.type' must be \"BPE\"")
        vocab = need(model, "vocab", "model.")
        if not isinstance(vocab, dict):
            raise TokenizerError("tokenizer.json: field 'model.vocab' must be an object")
        merges = []
        for k, m in enumerate(need(model, "merges", "model.")):
            if isinstance(m, str):
                parts = m.split(" ")
            else:
                parts = list(m)
            if len(parts) != 2:
                raise TokenizerError(f"tokenizer.json: field 'model.merges[{k}]' is not a pair")
            merges.append((parts[0], parts[1]))
        added = []
        for k, a in enumerate(obj.get("added_tokens") or []):
            for flag in ("single_word", "lstrip", "rstrip"):
                if a.get(flag):
                    raise TokenizerError(f"tokenizer.json: field 'added_tokens[{k}].{flag}' = true is unsupported")
            added.append((int(need(a, "id", f"added_tokens[{k}].")), need(a, "content", f"added_tokens[{k}]."),
                          bool(a.get("special", False))))
        pre = need(obj, "pre_tokenizer", "")
        patterns: List[str] = []
        subs = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        for k, sub in enumerate(subs):
            t = sub.get("type")
            if t == "Split":
                p = sub.get("pattern", {}).get("Regex")
                if p not in _MATCHERS:
                    raise TokenizerError(f"tokenizer.json: field 'pre_tokenizer.pretokenizers[{k}].pattern.Regex' is not a DeepSeek-V3 split regex")
                if sub.get("behavior") != "Isolated" or sub.get("invert"):
                    raise TokenizerError(f"tokenizer.json: field 'pre_tokenizer.pretokenizers[{k}].behavior' must be Isolated, invert false")
                patterns.append(p)
            elif t == "ByteLevel":
                if sub.get("use_regex") or sub.get("add_prefix_space"):
                    raise TokenizerError(f"tokenizer.json: field 'pre_tokenizer.pretokenizers[{k}]' ByteLevel must have use_regex/add_prefix_space false")
            else:
                raise TokenizerError(f"tokenizer.json: field 'pre_tokenizer.pretokenizers[{k}].type' = {t!r} is unsupported")
        return cls(vocab, merges, added, patterns, bool(model.get("ignore_merges", False)))

    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        with open(path, encoding="utf-8") as f:
            return cls.from_json_obj(json.load(f))


# ---------------------------------------------------------------------------------------------
# Trainer
# ---------------------------------------------------------------------------------------------


def _split_added(text: str) -> List[str]:
    """Plain-text segments of `text` between added-token strings (never learned as merges)."""
    pat = re.compile("|".join(re.escape(c) for c, _ in sorted(SPECIAL_TOKENS, key=lambda t: -len(t[0]))))
    return [s for s in pat.split(text) if s]


def train(texts: Iterable[str], n_merges: int, min_frequency: int = 2,
          progress=None) -> Tokenizer:
    """Deterministic byte-level BPE. Each merge takes the most frequent adjacent pair; ties go to
    the lexicographically smallest (left, right) pair of byte-mapped strings."""
    counts: Dict[str, int] = {}
    for text in texts:
        for seg in _split_added(text):
            for piece in pretokenize(seg):
                w = byte_level(piece)
                counts[w] = counts.get(w, 0) + 1
    words = [list(w) for w in counts]
    freqs = list(counts.values())

    pair_counts: Dict[Tuple[str, str], int] = {}
    where: Dict[Tuple[str, str], set] = {}
    for wi, w in enumerate(words):
        for k in range(len(w) - 1):
            p = (w[k], w[k + 1])
            pair_counts[p] = pair_counts.get(p, 0) + freqs[wi]
            where.setdefault(p, set()).add(wi)
    heap = [(-c, p) for p, c in pair_counts.items()]
    heapq.heapify(heap)

    vocab: Dict[str, int] = {c: i for i, (c, _) in enumerate(SPECIAL_TOKENS)}
    for b in range(256):
        vocab[BYTE_TO_CHAR[b]] = N_SPECIAL + b
    merges: List[Tuple[str, str]] = []

    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negc:
            continue  # stale entry
        if -negc < min_frequency:
            break
        merges.append(pair)
        new_tok = pair[0] + pair[1]
        if new_tok not in vocab:
            vocab[new_tok] = len(vocab)
        touched = set()
        for wi in sorted(where.pop(pair, ())):
            w = words[wi]
            f = freqs[wi]
            for k in range(len(w) - 1):
                p = (w[k], w[k + 1])
                pair_counts[p] -= f
                touched.add(p)
            out = []
            k = 0
            while k < len(w):
                if k + 1 < len(w) and w[k] == pair[0] and w[k + 1] == pair[1]:
                    out.append(new_tok)
                    k += 2
                else:
                    out.append(w[k])
                    k += 1
            words[wi] = out
            for k in range(len(out) - 1):
                p = (out[k], out[k + 1])
                pair_counts[p] = pair_counts.get(p, 0) + f
                where.setdefault(p, set()).add(wi)
                touched.add(p)
        pair_counts.pop(pair, None)
        for p in touched:
            c = pair_counts.get(p, 0)
            if c > 0 and p != pair:
                heapq.heappush(heap, (-c, p))
        if progress is not None and (len(merges) % 500 == 0):
            progress(f"merges {len(merges)}/{n_merges} (last {pair[0]!r}+{pair[1]!r}, count {-negc})")

    added = [(i, c, s) for i, (c, s) in enumerate(SPECIAL_TOKENS)]
    return Tokenizer(vocab, merges, added)
