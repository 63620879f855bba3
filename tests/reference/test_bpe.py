"""Tests of cedar_ref/bpe.py: the hand-written pre-tokenizer against Python's `re` (on text where
`re` can express the same classes), the trainer's determinism, lossless round trips, the
tokenizer.json format, and agreement with the committed goldens."""

import json
import os
import random
import re
import tempfile
import unittest

from cedar_ref import bpe

ROOT = os.environ.get("CEDAR_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOK_DIR = os.path.join(ROOT, "tests", "tokenizer")

# PATTERN_MAIN with each Unicode class spelled out for a small alphabet whose categories are
# known (letters, one combining mark, punctuation, symbols, digits, spaces, a control char).
_L = "A-Za-zéßЖ"
_M = "\u0301"
_PS = re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~—«€©")
_SPACE = " \t\n\x0b\x0c\r\u00a0\u3000\u0085\u180e"
RE_MAIN = re.compile(
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
    f"|[^\r\n{_L}{_PS}]?[{_L}{_M}]+"
    f"| ?[{_PS}]+[\r\n]*"
    f"|[{_SPACE}]*[\r\n]+"
    f"|[{_SPACE}]+(?![^{_SPACE}])"
    f"|[{_SPACE}]+"
)
ALPHABET = list("aZé ß Ж\u0301!.'-—«€©07٣\t\n\r\x0b\u00a0\u3000\u0085\u180e\x01") + ["'s", " .", "\r\n"]


def re_split_isolated(s):
    out, last = [], 0
    for m in RE_MAIN.finditer(s):
        if m.start() > last:
            out.append(s[last:m.start()])
        out.append(m.group(0))
        last = m.end()
    if last < len(s):
        out.append(s[last:])
    return out


class PretokenizerTest(unittest.TestCase):
    def test_main_pattern_matches_re_on_random_text(self):
        rng = random.Random(7)
        for _ in range(3000):
            s = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24)))
            self.assertEqual(bpe._split_isolated(s, bpe._match_main), re_split_isolated(s), repr(s))

    def test_fast_pretokenizer_matches_the_hand_written_one(self):
        rng = random.Random(11)
        pools = [(0, 0x7F), (0x80, 0x3100), (0x3000, 0x9FFF), (0x1F300, 0x1F6FF), (0x10000, 0x10FFFF)]
        for i in range(3000):
            chars = []
            for _ in range(rng.randint(1, 30)):
                a, b = rng.choice(pools[:3] if i % 2 else pools)
                cp = rng.randint(a, b)
                chars.append(chr(cp) if not 0xD800 <= cp < 0xE000 else " ")
            s = "".join(chars)
            self.assertEqual(bpe.pretokenize(s), bpe.pretokenize_reference(s), repr(s))

    def test_digits_split_in_threes_and_cjk_runs_isolated(self):
        self.assertEqual(bpe.pretokenize("1234567"), ["123", "456", "7"])
        self.assertEqual(bpe.pretokenize("ab中文cd"), ["ab", "中文", "cd"])
        # Fullwidth and Arabic-Indic digits are \p{N} too.
        self.assertEqual(bpe.pretokenize("１２３４"), ["１２３", "４"])
        self.assertEqual(bpe.pretokenize("x٣٤"), ["x", "٣٤"])

    def test_whitespace_rules(self):
        # \s*[\r\n]+ takes the run up to its last newline; \s+(?!\S) leaves one space for the word.
        self.assertEqual(bpe.pretokenize("a  \n\n  b"), ["a", "  \n\n", " ", " b"])
        self.assertEqual(bpe.pretokenize("a   "), ["a", "   "])
        self.assertEqual(bpe.pretokenize(" ."), [" ."])

    def test_space_class_is_pcre2s(self):
        for ch in "\t\n\x0b\x0c\r \u0085\u180e\u00a0\u2028\u3000":
            self.assertTrue(bpe.is_space(ch), repr(ch))
        for ch in "\x1c\x1f\u200b\x00a":
            self.assertFalse(bpe.is_space(ch), repr(ch))


class TokenizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tok = bpe.Tokenizer.load(os.path.join(TOK_DIR, "tokenizer.json"))
        with open(os.path.join(TOK_DIR, "corpus.txt"), encoding="utf-8", newline="") as f:
            cls.corpus = f.read()

    def test_special_token_ids_are_fixed_low(self):
        for i, (content, special) in enumerate(bpe.SPECIAL_TOKENS):
            self.assertEqual(self.tok.token_to_id(content), i)
            self.assertEqual(i in self.tok.special_ids, special)
        self.assertEqual(self.tok.token_to_id(bpe.BYTE_TO_CHAR[0]), bpe.N_SPECIAL)
        self.assertEqual(self.tok.token_to_id(bpe.BYTE_TO_CHAR[255]), bpe.N_SPECIAL + 255)

    def test_round_trip_corpus_and_random_text(self):
        self.assertEqual(self.tok.decode(self.tok.encode(self.corpus)), self.corpus)
        rng = random.Random(3)
        for _ in range(200):
            s = "".join(chr(rng.choice([rng.randint(0, 0x7f), rng.randint(0x80, 0x2fff),
                                        rng.randint(0x1f300, 0x1f6ff)])) for _ in range(rng.randint(0, 30)))
            self.assertEqual(self.tok.decode(self.tok.encode(s)), s)

    def test_merges_compress_the_corpus(self):
        ids = self.tok.encode(self.corpus)
        self.assertLess(len(ids), len(self.corpus.encode("utf-8")) / 2.5)

    def test_special_tokens_only_when_allowed(self):
        text = "<｜User｜>hi<think>"
        with_special = self.tok.encode(text, allow_special=True)
        self.assertEqual(with_special[0], self.tok.token_to_id(bpe.USER))
        without = self.tok.encode(text, allow_special=False)
        self.assertNotIn(self.tok.token_to_id(bpe.USER), without)
        # special=false added tokens are always recognised (HF semantics).
        self.assertEqual(without[-1], self.tok.token_to_id(bpe.THINK_START))
        self.assertEqual(self.tok.decode(without), text)
        self.assertEqual(self.tok.decode(with_special, skip_special=True), "hi<think>")

    def test_merge_order_lowest_rank_leftmost(self):
        # A toy vocabulary where rank order, not left-to-right order, decides.
        added = [(i, c, s) for i, (c, s) in enumerate(bpe.SPECIAL_TOKENS)]
        vocab = {bpe.BYTE_TO_CHAR[b]: bpe.N_SPECIAL + b for b in range(256)}
        for t in ["bc", "ab", "abc", "aa"]:
            vocab[t] = len(vocab)
        tok = bpe.Tokenizer(vocab, [("b", "c"), ("a", "b"), ("a", "bc"), ("a", "a")], added)
        self.assertEqual([tok.id_to_token(i) for i in tok.encode("abc")], ["abc"])
        self.assertEqual([tok.id_to_token(i) for i in tok.encode("aaa")], ["aa", "a"])
        # (a,b) has rank 1 < (a,a) rank 3, so the right pair merges first.
        self.assertEqual([tok.id_to_token(i) for i in tok.encode("aab")], ["a", "ab"])

    def test_goldens_agree_with_this_encoder(self):
        with open(os.path.join(TOK_DIR, "encode_golden.json"), encoding="utf-8") as f:
            gold = json.load(f)
        self.assertEqual(gold["format"], "cedar-encode-golden-v1")
        self.assertGreater(len(gold["cases"]), 300)
        for c in gold["cases"]:
            self.assertEqual(bpe.pretokenize(c["text"]), c["pieces"])
            self.assertEqual(self.tok.encode(c["text"], c["allow_special"]), c["ids"])


class TrainerTest(unittest.TestCase):
    def test_training_is_deterministic_and_reloads(self):
        texts = ["the cat sat on the mat. the cat ate 12345 rats! 中文中文 😀😀", "the mat was flat\n\n  indeed"] * 5
        a = bpe.train(texts, 60)
        b = bpe.train(list(texts), 60)
        self.assertEqual(a.merges, b.merges)
        self.assertEqual(a.vocab, b.vocab)
        self.assertGreater(len(a.merges), 20)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "tok.json")
            a.save(path)
            c = bpe.Tokenizer.load(path)
        for t in texts:
            self.assertEqual(c.encode(t), a.encode(t))
            self.assertEqual(c.decode(c.encode(t)), t)
        # The most frequent pair of the toy corpus is merged first.
        self.assertIn(a.merges[0], [("Ġ", "t"), ("h", "e"), ("t", "h"), ("a", "t")])

    def test_special_strings_are_not_learned(self):
        tok = bpe.train(["<｜User｜>hello<｜User｜>hello<｜User｜>"] * 4, 30)
        for a, b in tok.merges:
            self.assertNotIn("ï½ľ", a + b)  # byte-level form of U+FF5C would appear in a merged special

    def test_malformed_json_names_the_field(self):
        good = bpe.Tokenizer.load(os.path.join(TOK_DIR, "tokenizer.json")).to_json_obj()
        bad = json.loads(json.dumps(good))
        bad["model"]["type"] = "WordPiece"
        with self.assertRaisesRegex(bpe.TokenizerError, "model.type"):
            bpe.Tokenizer.from_json_obj(bad)
        bad = json.loads(json.dumps(good))
        bad["model"]["merges"][3] = "a b c"
        with self.assertRaisesRegex(bpe.TokenizerError, r"model.merges\[3\]"):
            bpe.Tokenizer.from_json_obj(bad)
        bad = json.loads(json.dumps(good))
        bad["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"
        with self.assertRaisesRegex(bpe.TokenizerError, r"pretokenizers\[0\]"):
            bpe.Tokenizer.from_json_obj(bad)


if __name__ == "__main__":
    unittest.main()
