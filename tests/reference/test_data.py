"""Tests of cedar_ref/data.py: the synthetic agent transcripts of the default model.

Determinism, held-out disjointness (templates and value pools), tool results computed for real,
every sample rendering to the V4.1 format and parsing back (DSML round trip), and the loss
mask covering exactly the assistant turns. The held-out split is pinned by a hash (growing the
train split must not change one held-out byte), and the train split's breadth (paraphrases,
system prompts, wrappers, notool sub-kinds) is checked to stay clear of held-out phrasings."""

import datetime
import difflib
import hashlib
import json
import os
import random
import re
import unittest
from fractions import Fraction

import _paths  # noqa: F401  (sys.path, thread count)
from cedar_ref import bpe, chat, data

N = 40  # samples per split in the sweeps (recall sessions are long; keep the suite fast)


def _samples(split, n=N, seed=5):
    fams = data.FAMILIES
    # every family, round robin, plus the natural mix
    out = [data.make_sample(seed, i, split, fams[i % len(fams)], (300, 900)) for i in range(n)]
    out += [data.make_sample(seed, 1000 + i, split, None, (300, 900)) for i in range(6)]
    return out


class GeneratorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.train = _samples("train")
        cls.heldout = _samples("heldout")

    def test_deterministic(self):
        for i in (0, 3, 11):
            a = data.make_sample(9, i, "train")
            b = data.make_sample(9, i, "train")
            self.assertEqual(json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True))
        self.assertNotEqual(json.dumps(data.make_sample(9, 0, "train")),
                            json.dumps(data.make_sample(9, 1, "train")))

    def test_all_families_present_and_recall_is_far(self):
        fams = {s["family"] for s in self.train}
        self.assertEqual(fams, set(data.FAMILIES))
        s = data.make_sample(2, 0, "train", "recall", (3000, 3500))
        self.assertGreaterEqual(s["distance_chars"], 3000)
        prompt = data.prompt_text(s)
        self.assertIn(s["expect"], prompt[:len(prompt) - 3000])  # the value is far back
        self.assertGreater(data.FAMILY_WEIGHTS["recall"], 0.3)

    def test_heldout_templates_never_in_train(self):
        def rx(t):
            # also found after a lead-in ("Hey, ..."), with a lower-case first letter and without
            # the final punctuation mark (the wrappers of train messages, data._wrap_train)
            body = t.rstrip(".?!")
            pat = "(.+?)".join(re.escape(p) for p in re.split(r"\{\w+\}", body))
            if body[0].isalpha():
                pat = "[%s%s]" % (body[0].upper(), body[0].lower()) + pat[1:]
            return re.compile(r"(?:^|[ ,:!.] )" + pat, re.S)
        held = [rx(t) for key, (train_t, held_t) in data.T.items() if key.endswith("_q")
                for t in held_t if t not in train_t]
        users = [m["content"] for s in self.train for m in s["messages"] if m["role"] == "user"]
        self.assertGreater(len(users), 50)
        for u in users:
            for r in held:
                self.assertIsNone(r.search(u), f"train message {u!r} uses a held-out template")
        systems = {s["messages"][0]["content"] for s in self.train}
        self.assertFalse(systems & set(data.SYSTEMS[1]))
        self.assertFalse(set(data.SYSTEMS[0]) & set(data.SYSTEMS[1]))

    def test_heldout_values_disjoint(self):
        held_names = {n for i, n in enumerate(data.NAMES) if i % 5 == 0}
        train_names = set(data.NAMES) - held_names
        for s in self.train:
            text = json.dumps(s["messages"])
            for n in held_names:
                self.assertIsNone(re.search(r"\b%s\b" % n, text), f"{n} in a train sample")
        for s in self.heldout:
            text = json.dumps(s["messages"])
            for n in train_names:
                self.assertIsNone(re.search(r"\b%s\b" % n, text), f"{n} in a held-out sample")
        r_train = data.Values(__import__("random").Random(1), "train")
        r_held = data.Values(__import__("random").Random(1), "heldout")
        tw = {r_train.word() for _ in range(300)}
        hw = {r_held.word() for _ in range(300)}
        self.assertFalse(tw & hw)
        self.assertEqual(len({s["id"] for s in self.train} & {s["id"] for s in self.heldout}), 0)

    def test_tool_results_are_computed(self):
        n_calc = n_read = 0
        for s in self.train + self.heldout:
            calls = {}
            for m in s["messages"]:
                if m["role"] == "assistant":
                    for tc in m.get("tool_calls") or []:
                        calls[tc["id"]] = tc["function"]
                elif m["role"] == "tool":
                    fn = calls[m["tool_call_id"]]
                    if fn["name"] == "calculator":
                        expr = fn["arguments"]["expression"]
                        if re.fullmatch(r"[0-9 ()+\-*/]+", expr):
                            # an independent evaluation (Python on Fractions)
                            val = eval(re.sub(r"(\d+)", r"Fraction(\1)", expr),
                                       {"Fraction": Fraction})
                            self.assertEqual(m["content"], data.format_number(val))
                            n_calc += 1
                        else:
                            self.assertTrue(m["content"].startswith("error:"))
                    elif fn["name"] in ("file_read", data.MCP_PREFIX + "read_text_file"):
                        p = fn["arguments"]["path"]
                        rel = p[len(data.MCP_ROOT) + 1:] if p.startswith(data.MCP_ROOT + "/") else p
                        if rel in s["world"]["files"]:
                            self.assertEqual(m["content"], s["world"]["files"][rel])
                            n_read += 1
                        else:
                            self.assertRegex(m["content"], r"^(error: no such file|Error: ENOENT)")
        self.assertGreater(n_calc, 10)
        self.assertGreater(n_read, 10)

    def test_expected_answer_in_final_turn(self):
        for s in self.train + self.heldout:
            final = s["messages"][-1]
            self.assertEqual(final["role"], "assistant")
            self.assertFalse(final.get("tool_calls"))
            self.assertIn(s["expect"], final["content"], s["id"])

    def test_render_parse_round_trip_and_mask(self):
        tok = bpe.Tokenizer.load(_paths.os.path.join(_paths.ROOT, "model", "weights", "cedar-agent-tiny", "tokenizer.json"))
        for s in self.train[:20] + self.heldout[:10]:
            segs = data.render_sample(s["messages"])
            self.assertEqual("".join(t for t, _ in segs), chat.encode_messages(s["messages"]))
            asst = [m for m in s["messages"] if m["role"] == "assistant"]
            asst_segs = [t for t, a in segs if a]
            self.assertEqual(len(asst), len(asst_segs))
            for m, text in zip(asst, asst_segs):
                self.assertTrue(text.endswith(bpe.EOS))
                p = chat.parse_output(text[:-len(bpe.EOS)])
                self.assertEqual(p["errors"], [])
                self.assertEqual(p["content"], m["content"])
                want = [(tc["function"]["name"], tc["function"]["arguments"])
                        for tc in m.get("tool_calls") or []]
                got = [(c["name"], json.loads(c["arguments"])) for c in p["calls"]]
                self.assertEqual(got, want)
            ids, mask = data.tokenize_sample(tok, s["messages"])
            self.assertEqual(ids, tok.encode(chat.encode_messages(s["messages"])))
            masked = tok.decode([i for i, k in zip(ids, mask) if k])
            self.assertEqual(masked, "".join(asst_segs))
            self.assertTrue(data.check_generation_prefix(data.prompt_text(s)))


_words = data.template_words  # a template as a word sequence, every {field} the same token


class HeldoutPinTest(unittest.TestCase):
    # sha256 of these held-out samples, computed before the train split was widened (session 6).
    # A change here means the held-out split (tests/eval/*.jsonl, eval_agent.py) changed.
    PINNED = "d233cf5ac7532b76989e9b99ce662d9e1e55d90e89a9e9bd970ffc3b4b13d509"

    def test_heldout_samples_unchanged(self):
        h = hashlib.sha256()
        for i in range(12):
            h.update(json.dumps(data.make_sample(1001, i, "heldout", None, (300, 900)),
                                sort_keys=True).encode())
        for k, fam in enumerate(data.FAMILIES):
            for i in range(4):
                h.update(json.dumps(data.make_sample(5, 100 * k + i, "heldout", fam, (300, 900)),
                                    sort_keys=True).encode())
        self.assertEqual(h.hexdigest(), self.PINNED)


class TrainBreadthTest(unittest.TestCase):
    # question keys the train split draws from (age_q, notool_q and recall_q keep their old
    # train lists for reference; train uses clockcalc_q, NOTOOL_TRAIN and recall_*_q)
    LEGACY = {"age_q", "notool_q", "recall_q"}

    def test_many_paraphrases_and_system_prompts(self):
        for key, (train_t, held_t) in data.T.items():
            if key.endswith("_q") and key not in self.LEGACY:
                self.assertGreaterEqual(len(set(train_t)), 15, key)
            elif key.endswith("_a"):
                self.assertGreaterEqual(len(set(train_t)), 4, key)
            self.assertFalse(set(train_t) & set(held_t), key)
        self.assertGreaterEqual(len(set(data.SYSTEMS[0])), 12)
        self.assertGreaterEqual(sum(len(v) for v in data.NOTOOL_TRAIN.values()), 100)

    def test_no_train_question_near_a_heldout_one(self):
        held = [t for k, (_, ho) in data.T.items() if k.endswith("_q") for t in ho] + data.SYSTEMS[1]
        train = [t for k, (tr, _) in data.T.items() if k.endswith("_q") for t in tr]
        train += [q for pairs in data.NOTOOL_TRAIN.values() for q, _, _ in pairs] + data.SYSTEMS[0]
        # the one close pair that predates the widening (both original note_save_q templates)
        allowed = {("Write down that {k} is {v}.", "Remember that {k} is {v}.")}
        for h in held:
            for t in train:
                ratio = difflib.SequenceMatcher(None, _words(h), _words(t)).ratio()
                if (h, t) not in allowed:
                    self.assertLess(ratio, 0.8, f"train {t!r} is close to held-out {h!r}")

    def test_notool_train_answers_come_from_the_message(self):
        direct = {"n", "n2", "n3", "c", "w", "w2", "w3", "ci", "x", "y", "yr", "ev", "d", "f", "p",
                  "it", "ww"}
        for seed in range(30):
            f = data._notool_fields(data.Values(random.Random(seed), "train"))
            self.assertEqual(f["wlong"], max(f["w"], f["w2"], key=len))
            self.assertNotEqual(len(f["w"]), len(f["w2"]))
            self.assertEqual(int(f["xmax"]), max(int(f["x"]), int(f["x2"])))
            self.assertEqual(f["yn_big"], "Yes" if int(f["x"]) > int(f["x2"]) else "No")
            self.assertEqual(f["yn_code"], "Yes" if f["c"] == f["cq"] else "No")
            self.assertEqual(str(len(f["lst"].split(", "))), f["cnt"])
            for kind, pairs in data.NOTOOL_TRAIN.items():
                for q, a, key in pairs:
                    qs, ans = q.format(**f), a.format(**f)
                    self.assertIn(f[key], ans, (kind, q))
                    if key in direct and key != "ww":
                        self.assertIn(f[key], qs, (kind, q))
        seen = set()
        for i in range(60):
            s = data.make_sample(3, i, "train", "notool", (300, 900))
            graded = s["messages"][s["n_prompt"]:]
            self.assertEqual(len(graded), 1)
            self.assertFalse(graded[0].get("tool_calls"))
            self.assertTrue(s["tools"])
            seen.add(s["messages"][s["n_prompt"] - 1]["content"])
        self.assertGreater(len(seen), 55)

    def test_composed_notool_questions(self):
        """Composed notool questions state the value they ask for, answer with it, stay clear of
        the held-out templates and never use the held-out statement's verb; a share of the
        train notool exchanges is composed, with hundreds of distinct question templates."""
        r = random.Random(5)
        templates = set()
        for i in range(400):
            q, a, key = data._compose_notool(r)
            templates.add(q)
            self.assertFalse(data.near_heldout(q), q)
            self.assertNotIn("live", q.lower())
            self.assertNotIn("echo", q.lower())
            f = data._notool_fields(data.Values(random.Random(i), "train"))
            self.assertIn(f[key], q.format(**f), q)
            self.assertIn(f[key], a.format(**f), (q, a))
        self.assertGreater(len(templates), 300)
        drawn, compose = [], data._compose_notool
        data._compose_notool = lambda rng: drawn.append(compose(rng)) or drawn[-1]
        try:
            for i in range(200):
                s = data.make_sample(21, i, "train", "notool", (300, 900))
                self.assertTrue(s["messages"][s["n_prompt"]]["content"])
        finally:
            data._compose_notool = compose
        self.assertGreater(len(drawn), 50)   # _NOTOOL_COMPOSED_P = 0.4 of 200
        self.assertLess(len(drawn), 120)

    def test_composed_copy_requests(self):
        """Copy requests carry the value once and are answered with it, mostly bare (the answer
        starts with the value), in many phrasings without the held-out request's verb; they are
        a real share of the composed questions, and those kept are clear of held-out templates."""
        r = random.Random(8)
        phrasings, bare = set(), 0
        for i in range(600):
            key = ("c", "x", "w")[i % 3]
            q, a = data._compose_copy(r, key)
            phrasings.add(q)
            self.assertNotIn("echo", q.lower())
            f = data._notool_fields(data.Values(random.Random(i), "train"))
            self.assertEqual(q.format(**f).count(f[key]), 1, q)
            self.assertIn(f[key], a.format(**f), a)
            bare += a.format(**f).startswith(f[key])
        self.assertGreater(len(phrasings), 400)
        self.assertGreater(bare, 300)
        kept, copy = [], data._compose_copy
        data._compose_copy = lambda rng, key: kept.append(copy(rng, key)) or kept[-1]
        try:
            r = random.Random(9)
            for _ in range(400):
                q, a, key = data._compose_notool(r)
                self.assertFalse(data.near_heldout(q), q)
        finally:
            data._compose_copy = copy
        self.assertGreater(len(kept), 80)   # slots c, x, w: 5 of 10 weight, half of them copies

    def test_train_price_files_sometimes_list_made_up_items(self):
        """About 30% of train price files list pseudo-word items (train pool, plural s), so that
        the lookup matches any word against the lines; held-out price files keep the held-out
        items, and the item asked for in a train chain sample is one the file lists."""
        known = set(data.ITEMS) | set(data.EXTRA_TRAIN_ITEMS)
        made_up = 0
        for i in range(300):
            text, prices = data._price_file(data.Values(random.Random(i), "train"))
            self.assertEqual(text.count("\n") + 1, len(prices))
            if not set(prices) <= known:
                made_up += 1
                for it in prices:
                    self.assertTrue(it.endswith("s"), it)
                    self.assertEqual(data._pool_of(it[:-1]), "train", it)
            ho_text, ho_prices = data._price_file(data.Values(random.Random(i), "heldout"))
            ho_items = {c for j, c in enumerate(data.ITEMS) if j % 5 == 0}
            self.assertLessEqual(set(ho_prices), ho_items)
        self.assertGreater(made_up, 60)
        self.assertLess(made_up, 120)
        asked = 0
        for i in range(120):
            s = data.make_sample(31, i, "train", "chain", (300, 900))
            for m in s["messages"]:
                if m["role"] == "tool" and isinstance(m.get("content"), str) and ": " in m["content"]:
                    lines = dict(ln.split(": ", 1) for ln in m["content"].split("\n") if ": " in ln)
                    if any(k for k in lines if k in s["messages"][s["n_prompt"] - 1]["content"]):
                        asked += 1
                    break
        self.assertGreater(asked, 20)

    def test_train_error_folders_hold_near_miss_names(self):
        """Near-miss names keep the start or the end of the wanted stem and its extension, are
        train-pool words and never the name itself; a real share of the train error samples that
        list a folder show one beside the file that is then read."""
        v = data.Values(random.Random(4), "train")
        for _ in range(200):
            nm = data._near_miss_name(v, "wirkais.conf")
            if nm is None:
                continue
            stem = nm[:-len(".conf")]
            self.assertTrue(nm.endswith(".conf") and stem != "wirkais", nm)
            self.assertTrue(stem[:2] == "wi" or stem[-2:] == "is", nm)
            self.assertEqual(data._pool_of(stem), "train")
        shown = 0
        for i in range(300):
            smp = data.make_sample(41, i, "train", "error", (300, 900))
            msgs = smp["messages"]
            for j, m in enumerate(msgs):
                calls = m.get("tool_calls") or []
                if not (calls and calls[0]["function"]["name"] == "file_read"):
                    continue
                path = calls[0]["function"]["arguments"]["path"]
                base = path.rsplit("/", 1)[-1]
                if "/" not in path or not base.endswith(".conf"):
                    continue
                listing = msgs[j - 1].get("content", "") if j > 0 and msgs[j - 1]["role"] == "tool" else ""
                names = [ln.split(" ", 1)[-1] for ln in listing.split("\n")]
                if base in names and any(n != base and n.endswith(".conf") and
                                         (n[:2] == base[:2] or n[:-5][-2:] == base[:-5][-2:]) for n in names):
                    shown += 1
                    break
        self.assertGreater(shown, 15)

    def test_train_clock_reads_carry_the_weekday_like_the_builtin_clock(self):
        """Half of the train samples' clocks answer like runtime/builtin_tools.cpp
        ("2026-12-03 08:11 (Thursday)", the weekday right for the date); held-out never."""
        for split in ("train", "heldout"):
            with_day = 0
            for i in range(200):
                s = data.make_sample(9, i, split, "single", (300, 900))
                for m in s["messages"]:
                    c = m.get("content")
                    if m["role"] != "tool" or not isinstance(c, str):
                        continue
                    hit = re.fullmatch(r"(\d{4}-\d\d-\d\d) \d\d:\d\d(?: \((\w+)\))?", c)
                    if hit and hit.group(2):
                        with_day += 1
                        day = datetime.date.fromisoformat(hit.group(1)).strftime("%A")
                        self.assertEqual(hit.group(2), day, c)
            if split == "train":
                self.assertGreater(with_day, 5)
            else:
                self.assertEqual(with_day, 0)

    def test_real_names_are_train_only_and_off_by_default(self):
        """make_sample(..., real_names=P) draws English file, folder and note names (session 30):
        off by default (the stream of a seed unchanged), ignored in held-out, out-of-range
        shares refused; at 0.5 many file stems are real names, never an everyday task's name or
        a held-out real stem; the weekday, "here", worded arithmetic and misspelled-file requests come
        with them."""
        for i in range(5):
            self.assertEqual(data.make_sample(11, i, "train"),
                             data.make_sample(11, i, "train", None, (1500, 9000), 0.0))
            self.assertEqual(data.make_sample(11, i, "heldout"),
                             data.make_sample(11, i, "heldout", None, (1500, 9000), 0.5))
        for bad in (-0.1, 1.5):
            with self.assertRaises(ValueError):
                data.make_sample(11, 0, "train", None, (1500, 9000), bad)
        import make_eval_tasks
        for w in data.REAL_STEMS + sorted(data.EVERYDAY_NAMES):  # no name the unfinished-work check flags
            self.assertIsNone(make_eval_tasks._FLAGGED.search(w), w)
        train_pool, held_pool = set(data.real_pool("train")), set(data.real_pool("heldout"))
        self.assertFalse(train_pool & held_pool)
        self.assertTrue(data.EVERYDAY_NAMES & set(data.REAL_STEMS) <= held_pool)
        self.assertGreater(len(train_pool), 150)
        real = total = weekday = here = worded = 0
        for i in range(800):
            s = data.make_sample(12, i, "train", "single", (300, 900), 0.5)
            for m in s["messages"]:
                if m["role"] == "user":
                    weekday += m["content"] in data.WEEKDAY_Q or any(q in m["content"] for q in data.WEEKDAY_Q)
                    here += any(q in m["content"] for q in data.LIST_ROOT_Q)
                    worded += bool(re.search(r"squared|Add up|boxes of|divided by|gave away", m["content"]))
            for path in list(s["world"]["files"]) + list(s["world"]["notes"]):
                for part in re.split(r"[/.]", path)[:-1] if "." in path else [path]:
                    total += 1
                    words = [w for w in re.split(r"[_-]|\d+", part) if w]
                    if words and all(w in train_pool for w in words):
                        real += 1
                    self.assertFalse(set(words) & held_pool, path)
                    self.assertNotIn(part, data.EVERYDAY_NAMES, path)
        self.assertGreater(real, 0.25 * total)
        self.assertLess(real, 0.75 * total)
        self.assertGreater(weekday, 3)
        self.assertGreater(here, 3)
        self.assertGreater(worded, 10)  # arithmetic asked in words
        # a misspelled file: the failed read, the listing of the root, the file it shows
        typos = 0
        for i in range(200):
            s = data.make_sample(16, i, "train", "error", (300, 900), 0.5)
            calls = [tc["function"] for m in s["messages"] for tc in m.get("tool_calls", [])]
            reads = [c["arguments"]["path"] for c in calls if c["name"] in ("file_read", data.MCP_PREFIX + "read_text_file")]
            if len(reads) == 2 and any(c["name"] in ("file_list", data.MCP_PREFIX + "list_directory") for c in calls):
                wrong, right = (p.rsplit("/", 1)[-1] for p in reads)
                if wrong != right and difflib.SequenceMatcher(None, wrong, right).ratio() > 0.75:
                    typos += 1
                    self.assertNotIn(wrong, [p.rsplit("/", 1)[-1] for p in s["world"]["files"]])
                    self.assertIn(right, [p.rsplit("/", 1)[-1] for p in s["world"]["files"]])
        self.assertGreater(typos, 10)
        # every sample still answers what it is graded on
        for i in range(60):
            s = data.make_sample(13, i, "train", None, (300, 900), 0.5)
            self.assertIn(str(s["expect"]), s["messages"][-1]["content"], s["id"])

    def test_gen_data_draws_real_names_when_asked(self):
        """gen_data.py --real-names P (the tokenizer corpus of a retrain): the train samples it
        writes name real files; a share outside 0..1 is a usage error naming the option."""
        import subprocess
        import sys
        gen = os.path.join(_paths.REF_DIR, "gen_data.py")
        r = subprocess.run([sys.executable, gen, "--n", "40", "--seed", "3", "--family", "single",
                            "--real-names", "0.6", "--out", "-"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-1000:])
        pool = set(data.real_pool("train"))
        stems = [p.rsplit("/", 1)[-1].rsplit(".", 1)[0] for line in r.stdout.splitlines()
                 for p in json.loads(line)["world"]["files"]]
        self.assertTrue(stems)
        self.assertTrue(any(st in pool for st in stems), stems[:10])
        r = subprocess.run([sys.executable, gen, "--n", "1", "--real-names", "1.5", "--out", "-"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--real-names 1.5", r.stderr)

    def test_everyday_tasks_use_no_trained_name(self):
        """tests/eval/everyday.jsonl (make_everyday_tasks.py, the same bytes) names no file,
        folder or note with a real name of the train pool."""
        import make_everyday_tasks as E
        path = os.path.join(os.environ.get("CEDAR_SOURCE_DIR", "../.."), "tests", "eval", "everyday.jsonl")
        with open(path) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines, [json.dumps(t, ensure_ascii=False) for t in E.tasks()])
        train_pool = set(data.real_pool("train"))
        names = 0
        for t in map(json.loads, lines):
            for key in list(t.get("files", {})) + list(t.get("notes", {})):
                for part in key.split("/"):
                    stem = part.rsplit(".", 1)[0]
                    names += 1
                    self.assertNotIn(stem, train_pool, key)
                    self.assertIn(stem, data.EVERYDAY_NAMES, key)
        self.assertGreater(names, 20)
        import subprocess
        import sys
        r = subprocess.run([sys.executable, os.path.join(_paths.REF_DIR, "make_everyday_tasks.py"),
                            "--out", os.path.join(path, "no-such-dir", "x.jsonl")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot write", r.stderr)

    def test_train_wrappers_vary_user_messages(self):
        samples = [data.make_sample(4, i, "train", None, (300, 900)) for i in range(150)]
        users = [m["content"] for s in samples for m in s["messages"] if m["role"] == "user"]
        for s in samples:  # every template was filled in
            for m in s["messages"]:
                self.assertIsNone(re.search(r"\{\w+\}", m["content"]), (s["id"], m["content"]))
        prefixed = sum(any(u.startswith(p + " ") for p in data._WRAP_PREFIX) for u in users)
        suffixed = sum(any(u.endswith(" " + x) for x in data._WRAP_SUFFIX) for u in users)
        lower = sum(u[:1].islower() for u in users)
        bare = sum(u[-1:].isalnum() for u in users)
        for n in (prefixed, suffixed, lower, bare):
            self.assertGreater(n, len(users) // 50)
        self.assertGreater(len(users) // 2, prefixed)
        # the wrapper never touches a value: lower-casing only hits template words, and the
        # text between the first letter and the final punctuation stays as it was
        kinds = set()
        for seed in range(200):
            for text in ("Sven is my name. What's my name?", "What is 12 + 30?", "AB-1234 please."):
                w = data._wrap_train(random.Random(seed), text)
                self.assertIn(text[1:-1], w)
                if text[0] != "W":
                    self.assertIn(text[0], w)
                kinds.add(w == text)
        self.assertEqual(kinds, {True, False})
        self.assertEqual(data._wrap_train(random.Random(0), ""), "")


def _graded_calls(s):
    """[(name, arguments, result text)] of the calls in the graded turn of sample s."""
    calls = []
    for m in s["messages"][s["n_prompt"]:]:
        if m["role"] == "assistant":
            calls += [[tc["function"]["name"], tc["function"]["arguments"], None]
                      for tc in m.get("tool_calls") or []]
        elif m["role"] == "tool":
            next(c for c in calls if c[2] is None)[2] = m["content"]
    return calls


def _is_error(text):
    return text.lower().startswith("error")


class HeldoutCalcErrorTest(unittest.TestCase):
    def test_corrected_call_computes_what_the_question_asked(self):
        """A held-out calculator error task asks for "a <bad> b"; the corrected call (and so the
        expected answer) must use the same a and b. The division kind once rounded a down to a
        multiple of b after writing the question: "Calculate 2770 : 676." expected 4."""
        seen = 0
        for i in range(400):
            smp = data.make_sample(77, i, "heldout", "error", (300, 900))
            msgs = smp["messages"]
            last_user = max(j for j, m in enumerate(msgs) if m["role"] == "user")
            calls = [c["function"]["arguments"].get("expression") for m in msgs[last_user:]
                     if m["role"] == "assistant" for c in m.get("tool_calls") or []
                     if c["function"]["name"] == "calculator"]
            if len(calls) < 2:
                continue
            a, op, b = calls[-1].split(" ")
            question = [m["content"] for m in smp["messages"] if m["role"] == "user"][-1]
            self.assertRegex(question, rf"(?<![0-9]){a}\b.*\b{b}(?![0-9])", (question, calls))
            self.assertEqual(calls[0].split(" ")[0], a)
            seen += op == "/"
        self.assertGreater(seen, 5)


class MultiOneByOneTest(unittest.TestCase):
    def test_train_multi_sometimes_calls_one_at_a_time(self):
        """About _MULTI_SEQ_P of the train calc2/read2 requests make their two calls in two
        replies, each after the previous result; held-out ones always make both in one reply."""
        def shapes(split):
            out = []
            for i in range(300):
                smp = data.make_sample(31, i, split, "multi", (300, 900))
                msgs = smp["messages"][max(j for j, m in enumerate(smp["messages"]) if m["role"] == "user"):]
                n = [len(m["tool_calls"]) for m in msgs if m["role"] == "assistant" and m.get("tool_calls")]
                names = {c["function"]["name"] for m in msgs if m.get("tool_calls") for c in m["tool_calls"]}
                if "clock" not in names:
                    out.append(tuple(n))
            return out
        train, held = shapes("train"), shapes("heldout")
        seq = sum(x == (1, 1) for x in train) / len(train)
        self.assertGreater(seq, 0.15)
        self.assertLess(seq, 0.45)
        self.assertTrue(all(x == (1, 1) or x == (2,) for x in train))
        self.assertTrue(all(x == (2,) for x in held), set(held))


class TrainRobustnessTest(unittest.TestCase):
    """The train-only robustness of issue 6 (held-out success 41%): requests without their
    usual verb (_augment_request), more kinds of corrected errors (fam_error, train), wider
    config files (_config_file graded=True). None of it may change the held-out split."""

    # sha256 of 25 held-out samples per family (seed 2718) and 20 of the natural mix (seed
    # 2719), computed with the generator as it was BEFORE these train-only additions; renewed
    # once on purpose (session 23): held-out division error tasks asked for a / b but expected
    # the quotient of a rounded down to a multiple of b (5 of the 300 tasks in heldout.jsonl)
    PINNED = "3d5bfdcbfe0515d45b9a7e27011504556950210d8c20d5e7166a8509b9a79fea"

    def _heldout_hash(self):
        h = hashlib.sha256()
        for fam in data.FAMILIES:
            for i in range(25):
                h.update(json.dumps(data.make_sample(2718, i, "heldout", fam, (300, 900)),
                                    sort_keys=True).encode())
        for i in range(20):
            h.update(json.dumps(data.make_sample(2719, i, "heldout"), sort_keys=True).encode())
        return h.hexdigest()

    def test_heldout_unchanged_even_with_augmentation_always_on(self):
        self.assertEqual(self._heldout_hash(), self.PINNED)
        old = data._PSEUDO_VERB_P
        try:
            data._PSEUDO_VERB_P = 1.0
            self.assertEqual(self._heldout_hash(), self.PINNED)
        finally:
            data._PSEUDO_VERB_P = old

    def test_pseudo_verbs_are_off_by_default(self):
        # run 11 (12%) lost 15 of 50 chain tasks against run 12 (0%): off in the shipped data;
        # what tpl() returns is a T template or a composed request with a real verb
        self.assertEqual(data._PSEUDO_VERB_P, 0.0)
        for key in data._AUG_OBJECTS:
            composed = 0
            for i in range(400):
                t = data.tpl(random.Random(f"{key}/{i}"), "train", key)
                if t not in data.T[key][0]:
                    composed += 1
                    self.assertTrue(any(re.search(r"(?i)\b" + re.escape(v) + r"\b", t)
                                        for v in data._REAL_VERBS[key]), (key, t))
            self.assertTrue(0.12 * 400 < composed < 0.28 * 400, (key, composed))

    def test_composed_requests_not_near_heldout_and_keep_the_fields(self):
        held = [t for k, (_, ho) in data.T.items() if k.endswith("_q") for t in ho]
        self.assertEqual(set(data._REAL_VERBS), set(data._AUG_OBJECTS))
        for key in data._REAL_VERBS:
            train_t = data.T[key][0]
            need = set.intersection(*[set(re.findall(r"\{(\w+)\}", t)) for t in train_t])
            r = random.Random(key)
            seen = set()
            for _ in range(400):
                t = data._compose_request(r, key)
                seen.add(t)
                self.assertLessEqual(need, set(re.findall(r"\{(\w+)\}", t)), (key, t))
                self.assertNotRegex(t, r"\{[VvO]\}")
            self.assertGreater(len(seen), 120, key)  # hundreds of phrasings per key
            for t in seen:
                for h in held:
                    ratio = difflib.SequenceMatcher(None, _words(h), _words(t)).ratio()
                    self.assertLess(ratio, 0.8, f"composed {t!r} is close to held-out {h!r}")
        # the rule itself: a held-out template and a one-word change of it are both refused
        self.assertTrue(data.near_heldout("Look up my note called {k}."))
        self.assertTrue(data.near_heldout("Look up the note called {k}."))
        self.assertFalse(data.near_heldout("Fetch the note called {k}."))

    def test_augmentation_rate_and_fields(self):
        old, old_real = data._PSEUDO_VERB_P, data._REAL_VERB_P
        data._PSEUDO_VERB_P, data._REAL_VERB_P = 0.12, 0.0  # pseudo-verb requests alone
        try:
            self._check_augmentation_rate_and_fields()
        finally:
            data._PSEUDO_VERB_P, data._REAL_VERB_P = old, old_real

    def _check_augmentation_rate_and_fields(self):
        total = augmented = 0
        for key, objs in data._AUG_OBJECTS.items():
            train_t, held_t = data.T[key]
            # every object phrase carries the fields that every template of the key carries
            need = set.intersection(*[set(re.findall(r"\{(\w+)\}", t)) for t in train_t])
            for o in objs:
                self.assertLessEqual(need, set(re.findall(r"\{(\w+)\}", o)), (key, o))
            n_aug = 0
            for i in range(1000):
                for fn in (data.tpl, data.ttpl):
                    t = fn(random.Random(f"{key}/{i}"), "train", key)
                    if t not in train_t:
                        n_aug += 1
                        self.assertLessEqual(need, set(re.findall(r"\{(\w+)\}", t)), (key, t))
                        self.assertNotRegex(t, r"\{[VvO]\}")
                    # held-out never augments (tpl keys all have held-out templates)
                    if fn is data.ttpl or held_t:
                        h = fn(random.Random(f"{key}/{i}"), "heldout", key)
                        self.assertIn(h, held_t or train_t[:1])
            self.assertTrue(0.07 * 2000 < n_aug < 0.17 * 2000, (key, n_aug))
            total, augmented = total + 2000, augmented + n_aug
        self.assertAlmostEqual(augmented / total, data._PSEUDO_VERB_P, delta=0.015)
        # keys outside _AUG_OBJECTS (recall questions, note saves, answers) are never rebuilt
        for key in ("recall_note_q", "note_save_q", "field_a", "code_save_q"):
            for i in range(300):
                self.assertIn(data.tpl(random.Random(i), "train", key), data.T[key][0])

    def test_augmented_requests_keep_the_object(self):
        """With every request augmented, the values the graded turn's first call copies (path,
        note key, expression, text) are still in the user's message."""
        old = data._PSEUDO_VERB_P
        try:
            data._PSEUDO_VERB_P = 1.0
            self.assertGreater(self._check_requests_keep_the_object(), 5)
        finally:
            data._PSEUDO_VERB_P = old

    def test_composed_requests_keep_the_object(self):
        old = data._REAL_VERB_P
        try:
            data._REAL_VERB_P = 1.0
            self._check_requests_keep_the_object()
        finally:
            data._REAL_VERB_P = old

    def _check_requests_keep_the_object(self):
        verbless = 0
        for fam in ("single", "chain", "multi", "error"):
            for i in range(120):
                s = data.make_sample(8, i, "train", fam, (300, 900))
                user = s["messages"][s["n_prompt"] - 1]["content"]
                first = s["messages"][s["n_prompt"]]
                for tc in first.get("tool_calls") or []:
                    name, args = tc["function"]["name"], tc["function"]["arguments"]
                    for a, val in args.items():
                        if a == "pattern":
                            self.assertIn(val.rsplit("*", 1)[-1], user, s["id"])
                        elif val not in (".", data.MCP_ROOT):
                            # (the error family's first read may put the user's bare file
                            # name under the MCP root)
                            self.assertIn(val[len(data.MCP_ROOT) + 1:] if fam == "error" and
                                          val.startswith(data.MCP_ROOT + "/") else val,
                                          user, (s["id"], name, a))
                verbless += user.rstrip(" .!?:)").endswith(", please")
        return verbless

    def test_augmented_phrasings_not_near_heldout(self):
        held = [t for k, (_, ho) in data.T.items() if k.endswith("_q") for t in ho]
        cands = [f.replace("{V}", "Qverbq").replace("{v}", "qverbq").replace("{O}", o)
                 for objs in data._AUG_OBJECTS.values() for o in objs for f in data._AUG_FRAMES]
        cands += data._ERRNOTE2_Q
        for h in held:
            for t in cands:
                ratio = difflib.SequenceMatcher(None, _words(h), _words(t)).ratio()
                self.assertLess(ratio, 0.8, f"train {t!r} is close to held-out {h!r}")

    def test_error_family_corrects_and_never_repeats(self):
        n_two = 0
        kinds = set()
        for i in range(300):
            s = data.make_sample(12, i, "train", "error", (300, 900))
            calls = _graded_calls(s)
            failed = []
            for k, (name, args, res) in enumerate(calls):
                key = (name, json.dumps(args, sort_keys=True))
                self.assertNotIn(key, failed, (s["id"], "repeats a failed call"))
                if _is_error(res):
                    failed.append(key)
                    kinds.add(re.match(r"(?i)error: ([a-z ]+)", res).group(1).strip())
                if name.endswith("list") or name.endswith("list_directory"):
                    # a directory it lists was named before (user message or a tool result)
                    seen = json.dumps(s["messages"][:s["n_prompt"]]) + "".join(c[2] for c in calls[:k])
                    self.assertIn(args["path"].rstrip("/").split("/")[-1] or ".", seen + ". /data")
            self.assertTrue(failed, s["id"])
            self.assertFalse(_is_error(calls[-1][2]), s["id"])
            self.assertIn(s["expect"], s["messages"][-1]["content"])
            n_two += len(failed) >= 2
        self.assertTrue(0.15 * 300 < n_two < 0.45 * 300, n_two)
        self.assertEqual(kinds, {"no such file", "ENOENT", "no note named", "unexpected character",
                                 "Access denied"})

    def test_train_config_files_are_wider(self):
        def sizes(split, **kw):
            return [len(data._config_file(data.Values(random.Random(i), split), **kw)[1])
                    for i in range(400)]
        self.assertEqual(set(sizes("train", graded=True)), set(range(3, 13)))
        self.assertEqual(set(sizes("heldout", graded=True)), set(range(3, 8)))
        self.assertEqual(set(sizes("train")), set(range(3, 8)))  # filler files as they were
        self.assertEqual(set(sizes("train", n_keys=5, graded=True)), {5})
        long_fields = 0
        for i in range(200):
            s = data.make_sample(6, i, "train", "single", (300, 900))
            calls = _graded_calls(s)
            if len(calls) == 1 and calls[0][0] in ("file_read", data.MCP_PREFIX + "read_text_file"):
                lines = calls[0][2].split("\n")
                if len(lines) >= 8 and s["expect"] != lines[0]:  # a field question
                    long_fields += 1
                    self.assertIn(s["expect"], [ln.split(" = ", 1)[1] for ln in lines])
        self.assertGreater(long_fields, 5)


def _heldout_values():
    """Every held-out value: the NAMES, CITIES and ITEMS entries at indices i % 5 == 0."""
    return {w for pool in (data.NAMES, data.CITIES, data.ITEMS)
            for i, w in enumerate(pool) if i % 5 == 0}


def _request_rx(template):
    """A request template as a full-match regex over a user message: the template with its one
    {f} a file path (group 1; a name with an extension, so that list_q's "What's in {d}?" on a
    folder is not taken for read_q's "What's in {f}?"), allowing the light wrappers of
    data._wrap_train (a lead-in, a lower-case first letter, no final punctuation mark, a closing
    word) and nothing else."""
    body = template.rstrip(".?!")
    parts = body.split("{f}")
    assert len(parts) == 2, template
    pat = r"(\S+?\.\w+)".join(re.escape(p) for p in parts)
    if body[0].isalpha():
        pat = "[%s%s]" % (body[0].upper(), body[0].lower()) + pat[1:]
    pre = "|".join(re.escape(p) for p in data._WRAP_PREFIX)
    suf = "|".join(re.escape(x) for x in data._WRAP_SUFFIX)
    return re.compile(r"(?:(?:%s) )?%s[.?!]?(?: (?:%s))?" % (pre, pat, suf), re.S)


class TrainValuesAndReadAnswersTest(unittest.TestCase):
    """Train-only changes against memorised values and contradictory answers: the train value
    pools grow by EXTRA_TRAIN_* (never a held-out value), a request to show a file is always
    answered with its text (filler turns included), and the recall opener that reads a file for
    later uses phrasings of its own (_RECALL_READ_Q, answered with a summary), not read_q."""

    READ_TOOLS = ("file_read", data.MCP_PREFIX + "read_text_file")

    def test_extra_train_values_never_heldout(self):
        held = _heldout_values()
        held_lower = {w.lower() for w in held}
        extras = {"names": data.EXTRA_TRAIN_NAMES, "cities": data.EXTRA_TRAIN_CITIES,
                  "items": data.EXTRA_TRAIN_ITEMS}
        for kind, ex in extras.items():
            self.assertGreater(len(ex), 20, kind)
            self.assertEqual(len(ex), len(set(ex)), kind)
            # case-insensitively too: config files carry names lower-cased
            self.assertFalse({w.lower() for w in ex} & held_lower, kind)
        all_extra = {w for ex in extras.values() for w in ex}
        h = data.Values(random.Random(1), "heldout")
        self.assertEqual(h.names, [n for i, n in enumerate(data.NAMES) if i % 5 == 0])
        self.assertEqual(h.cities, [c for i, c in enumerate(data.CITIES) if i % 5 == 0])
        self.assertEqual(h.items, [c for i, c in enumerate(data.ITEMS) if i % 5 == 0])
        self.assertFalse(all_extra & set(h.names + h.cities + h.items))
        t = data.Values(random.Random(1), "train")
        for pool, ex in ((t.names, data.EXTRA_TRAIN_NAMES), (t.cities, data.EXTRA_TRAIN_CITIES),
                         (t.items, data.EXTRA_TRAIN_ITEMS)):
            self.assertLessEqual(set(ex), set(pool))
            self.assertFalse(set(pool) & held)
        # a few hundred train draws take the extra values, most of them
        for kind, ex in extras.items():
            vals = [data.Values(random.Random(k), "train") for k in range(300)]
            drawn = {v.pick(getattr(v, kind)) for v in vals}
            self.assertGreater(len(drawn & set(ex)), len(ex) // 3, kind)
        # and the samples show them: the names and cities of train notool exchanges (capitalised,
        # so a word match is a value), never in held-out samples
        caps = [w for w in all_extra if w[0].isupper()]
        rx = re.compile(r"\b(%s)\b" % "|".join(caps))
        train_text = "".join(json.dumps(data.make_sample(13, i, "train", "notool")["messages"])
                             for i in range(300))
        self.assertGreater(len(set(rx.findall(train_text))), 40)
        held_text = "".join(json.dumps(data.make_sample(13, i, "heldout", fam, (300, 900))
                                       ["messages"])
                            for fam in data.FAMILIES for i in range(25))
        self.assertEqual(rx.findall(held_text), [])

    def test_train_years_vary_and_skip_the_heldout_ones(self):
        years = {int(data.Values(random.Random(k), "train").date()[:4]) for k in range(400)}
        self.assertFalse(years & {2028, 2029})
        self.assertGreater(len(years), 30)
        held = {int(data.Values(random.Random(k), "heldout").date()[:4]) for k in range(50)}
        self.assertEqual(held, {2028, 2029})

    def test_train_read_requests_are_answered_with_the_text(self):
        read_rx = [_request_rx(t) for t in data.T["read_q"][0]]
        samples = [data.make_sample(17, i, "train", "recall", (1500, 3000)) for i in range(150)]
        samples += [data.make_sample(17, 500 + i, "train", "single", (300, 900))
                    for i in range(150)]
        samples += [data.make_sample(17, 1000 + i, "train", None, (300, 900)) for i in range(40)]
        n_checked = n_recall = 0
        for s in samples:
            msgs = s["messages"]
            for k, m in enumerate(msgs):
                if m["role"] != "user":
                    continue
                match = next((x for x in (r.fullmatch(m["content"]) for r in read_rx) if x), None)
                if match is None:
                    continue
                where = (s["id"], m["content"])
                # one read call of the path the user named, its result, then the final answer
                call = msgs[k + 1]
                self.assertEqual(call["role"], "assistant", where)
                tcs = call.get("tool_calls") or []
                self.assertEqual(len(tcs), 1, where)
                self.assertIn(tcs[0]["function"]["name"], self.READ_TOOLS, where)
                self.assertEqual(tcs[0]["function"]["arguments"]["path"], match.group(1), where)
                result = msgs[k + 2]
                self.assertEqual((result["role"], result["tool_call_id"]), ("tool", tcs[0]["id"]))
                self.assertFalse(result["content"].lower().startswith("error"), where)
                final = msgs[k + 3]
                self.assertEqual(final["role"], "assistant", where)
                self.assertFalse(final.get("tool_calls"), where)
                self.assertIn(result["content"], final["content"], where)
                n_checked += 1
                n_recall += s["family"] == "recall"
        # filler turns of the recall sessions and the single family's read requests
        self.assertGreater(n_recall, 100)
        self.assertGreater(n_checked - n_recall, 10)
        # the recall opener reads its file with a phrasing of _RECALL_READ_Q, and the answer
        # summarises (the text comes later, in the graded answer, only as the asked value)
        opener_rx = [_request_rx(t) for t in data._RECALL_READ_Q]
        n_open = 0
        for s in samples[:150]:
            users = [m["content"] for m in s["messages"] if m["role"] == "user"]
            n_open += any(r.fullmatch(u) for u in users for r in opener_rx)
        self.assertGreater(n_open, 30)

    def test_recall_openers_show_the_text_unless_told_not_to(self):
        # Only an opener that says not to show the file gets a summary; the rest show its text
        # (run 23 answered held-out "I'd like to see X" with opener summaries: "Read it: 6 keys.").
        opener_rx = [(_request_rx(t), any(w in t for w in data._RECALL_NO_SHOW))
                     for t in data._RECALL_READ_Q]
        self.assertGreaterEqual(sum(ns for _, ns in opener_rx), 3)
        seen = {True: 0, False: 0}
        for i in range(200):
            msgs = data.make_sample(23, i, "train", "recall", (1500, 3000))["messages"]
            for k, m in enumerate(msgs):
                if m["role"] != "user":
                    continue
                hit = next((ns for rx, ns in opener_rx if rx.fullmatch(m["content"])), None)
                if hit is None:
                    continue
                result, final = msgs[k + 2], msgs[k + 3]
                self.assertEqual(result["role"], "tool")
                self.assertEqual(final["role"], "assistant")
                self.assertFalse(final.get("tool_calls"))
                if hit:
                    self.assertNotIn(result["content"], final["content"], m["content"])
                else:
                    self.assertIn(result["content"], final["content"], m["content"])
                seen[hit] += 1
        self.assertGreater(seen[True], 5)
        self.assertGreater(seen[False], 2 * seen[True])  # 7 of the 10 phrasings show the text

    def test_train_file_recalls_sometimes_read_the_file_again(self):
        # About half of the train file recall questions are answered after a fresh read of the
        # asked file (the value then sits inside the sliding window); the answer carries the value.
        # Held-out recall questions are never followed by a scripted read (the model decides).
        n_file = n_reread = 0
        for i in range(300):
            smp = data.make_sample(24, i, "train", "recall", (1500, 3000))
            msgs = smp["messages"]
            last_user = max(k for k, m in enumerate(msgs) if m["role"] == "user")
            tail = msgs[last_user + 1:]
            if not str(smp["expect"]) or tail[-1]["role"] != "assistant":
                continue
            if len(tail) == 1:
                continue
            self.assertEqual([m["role"] for m in tail], ["assistant", "tool", "assistant"])
            call = tail[0]["tool_calls"][0]["function"]
            self.assertIn(call["name"], ("file_read", data.MCP_PREFIX + "read_text_file"))
            self.assertIn(str(smp["expect"]), tail[1]["content"])
            self.assertIn(str(smp["expect"]), tail[2]["content"])
            n_reread += 1
        for i in range(300):
            smp = data.make_sample(24, i, "train", "recall", (1500, 3000))
            # file recalls: the expected value is a line of a config file the session read
            if any(m["role"] == "tool" and f"= {smp['expect']}" in m["content"] for m in smp["messages"]):
                n_file += 1
        self.assertGreater(n_reread, 0.3 * n_file)
        self.assertLess(n_reread, 0.7 * n_file)
        for i in range(100):
            msgs = data.make_sample(24, i, "heldout", "recall", (1500, 3000))["messages"]
            last_user = max(k for k, m in enumerate(msgs) if m["role"] == "user")
            self.assertEqual(len(msgs) - last_user - 1, 1)

    def test_train_price_chains_quote_the_asked_line_before_the_call(self):
        # About half of the train price chains write the asked item's line of the file, in the
        # file's own form, as the text of the calculator call; the call multiplies that price.
        # Held-out price chains never carry a scripted quote (the model decides).
        n_price = n_quote = 0
        for i in range(400):
            msgs = data.make_sample(25, i, "train", "chain")["messages"]
            for k, m in enumerate(msgs):
                calls = m.get("tool_calls") or []
                if m["role"] != "assistant" or len(calls) != 1 or calls[0]["function"]["name"] != "calculator":
                    continue
                prev = msgs[k - 1]
                if prev["role"] != "tool" or not re.fullmatch(r"(?:[a-z]+: \d+\n?)+", prev["content"]):
                    continue
                n_price += 1
                if not m["content"]:
                    continue
                n_quote += 1
                self.assertIn(m["content"], prev["content"].split("\n"))
                price = m["content"].split(": ")[1]
                self.assertTrue(calls[0]["function"]["arguments"]["expression"].endswith(" * " + price))
        self.assertGreater(n_price, 40)
        self.assertGreater(n_quote, 0.3 * n_price)
        self.assertLess(n_quote, 0.7 * n_price)
        for i in range(200):
            msgs = data.make_sample(25, i, "heldout", "chain")["messages"]
            for m in msgs:
                calls = m.get("tool_calls") or []
                if calls and calls[0]["function"]["name"] == "calculator":
                    self.assertEqual(m["content"], "")

    def test_train_singles_look_up_prices_of_unseen_items(self):
        # Train-only single price lookups (half of them made-up items): the answer carries the
        # asked item's price; held-out samples never get one, and no phrasing is near held-out.
        held = [t for k, (_, ho) in data.T.items() if k.endswith("_q") for t in ho]
        for t in data.PRICE_LOOKUP_Q:
            for h in held:
                ratio = difflib.SequenceMatcher(None, _words(h), _words(t)).ratio()
                self.assertLess(ratio, 0.8, f"train {t!r} is close to held-out {h!r}")

        def rx(t):  # a phrasing as a regex capturing the item and the file
            return re.compile(re.escape(t).replace(re.escape("{it}"), r"(?P<it>\S+)")
                              .replace(re.escape("{f}"), r"(?P<f>\S+)"))
        qrx = [rx(t) for t in data.PRICE_LOOKUP_Q]
        n = pseudo = 0
        for i in range(400):
            msgs = data.make_sample(29, i, "train", "single")["messages"]
            k = max(j for j, m in enumerate(msgs) if m["role"] == "user")
            q = msgs[k]["content"]
            match = next((x for x in (r.fullmatch(q) for r in qrx) if x), None)
            if match is None:
                continue
            n += 1
            self.assertEqual(msgs[k + 2]["role"], "tool")
            result = msgs[k + 2]["content"]
            prices = dict(ln.split(": ") for ln in result.split("\n"))
            it = match.group("it")
            self.assertIn(it, prices, q)
            self.assertEqual(msgs[-1]["role"], "assistant")
            self.assertRegex(msgs[-1]["content"], r"(?<![0-9])%s(?![0-9])" % prices[it])
            pseudo += it not in data.ITEMS and it not in data.EXTRA_TRAIN_ITEMS
        self.assertGreater(n, 15)
        self.assertGreater(pseudo, n // 4)
        for fam in ("single", None):
            for i in range(150):
                for m in data.make_sample(29, i, "heldout", fam, (300, 900))["messages"]:
                    if m["role"] == "user":
                        self.assertFalse(any(r.fullmatch(m["content"]) for r in qrx), m["content"])

    def test_recall_read_phrasings_distinct_and_not_near_heldout(self):
        held = [t for k, (_, ho) in data.T.items() if k.endswith("_q") for t in ho]
        self.assertTrue(data.T["read_q"][1])
        self.assertGreaterEqual(len(set(data._RECALL_READ_Q)), 6)
        for t in data._RECALL_READ_Q:
            self.assertEqual(re.findall(r"\{(\w+)\}", t), ["f"], t)
            for h in held:
                ratio = difflib.SequenceMatcher(None, _words(h), _words(t)).ratio()
                self.assertLess(ratio, 0.8, f"train {t!r} is close to held-out {h!r}")
        # no recall opener reads as a show-me request (of either split): the two get different
        # answers (a summary vs the text), so one phrasing must not be asked both ways
        for t in data._RECALL_READ_Q:
            for q in data.T["read_q"][0] + data.T["read_q"][1]:
                self.assertIsNone(_request_rx(q).fullmatch(t.format(f="abc/defg.conf")), (t, q))
            self.assertNotIn(t, data.T["read_q"][0] + data.T["read_q"][1])


class ToolTest(unittest.TestCase):
    def test_calculator(self):
        w = data.new_world()
        run = lambda e: data.run_tool("calculator", {"expression": e}, w)  # noqa: E731
        self.assertEqual(run("2 + 3 * 4"), ("14", False))
        self.assertEqual(run("(2 + 3) * 4"), ("20", False))
        self.assertEqual(run("7 / 2"), ("3.5", False))
        self.assertEqual(run("1 / 3"), ("0.3333", False))
        self.assertEqual(run("-4 * -5"), ("20", False))
        self.assertEqual(run("12 x 7"), ("error: unexpected character 'x' at position 4", True))
        self.assertEqual(run("5 / 0"), ("error: division by zero", True))
        self.assertTrue(run("(1 + 2")[1])
        self.assertEqual(data.run_tool("calculator", {}, w)[1], True)

    def test_files_notes_clock_and_mcp(self):
        w = data.new_world("2026-01-02 03:04")
        w["files"].update({"a.txt": "x\ny\nz", "d/b.conf": "port = 1", "d/e/c.md": "hi"})
        self.assertEqual(data.run_tool("file_read", {"path": "a.txt"}, w), ("x\ny\nz", False))
        self.assertEqual(data.run_tool("file_list", {"path": "."}, w), ("a.txt\nd/", False))
        self.assertEqual(data.run_tool("file_list", {"path": "d"}, w), ("b.conf\ne/", False))
        self.assertTrue(data.run_tool("file_read", {"path": "nope"}, w)[1])
        self.assertEqual(data.run_tool("clock", {}, w), ("2026-01-02 03:04", False))
        self.assertTrue(data.run_tool("notes_read", {"key": "k"}, w)[1])
        data.run_tool("notes_save", {"key": "k", "text": "v"}, w)
        self.assertEqual(data.run_tool("notes_read", {"key": "k"}, w), ("v", False))
        P = data.MCP_PREFIX
        self.assertEqual(data.run_tool(P + "list_directory", {"path": "/data/d"}, w),
                         ("[FILE] b.conf\n[DIR] e", False))
        self.assertEqual(data.run_tool(P + "read_text_file", {"path": "/data/a.txt", "head": 2}, w),
                         ("x\ny", False))
        self.assertEqual(data.run_tool(P + "read_text_file", {"path": "/data/a.txt", "tail": 1}, w),
                         ("z", False))
        self.assertTrue(data.run_tool(P + "read_text_file", {"path": "/etc/passwd"}, w)[1])
        self.assertEqual(data.run_tool(P + "search_files", {"path": "/data", "pattern": "**/*.md"}, w),
                         ("/data/d/e/c.md", False))
        self.assertEqual(data.run_tool(P + "write_file", {"path": "/data/n.txt", "content": "q"}, w),
                         ("Successfully wrote to /data/n.txt", False))
        self.assertEqual(w["files"]["n.txt"], "q")
        self.assertTrue(data.run_tool("no_such_tool", {}, w)[1])
        for name, schema in data.TOOL_SCHEMAS.items():
            self.assertEqual(schema["function"]["name"], name)
        self.assertTrue(all(n.startswith("filesystem__") for n in data.MCP_TOOLS))


if __name__ == "__main__":
    unittest.main()
