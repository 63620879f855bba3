"""Evaluation of a trained cedar model on the held-out split (issue 6), two ways.

  tf_eval()   teacher-forced: one batched forward per group of samples in serving mode (FP4/FP8
              quantisation on, sparse top-k, candidate pool); a sample is "exact" when the
              greedy argmax reproduces every token of its graded turn (all assistant tokens
              after the last user message: calls, and the answer). Cheap; used during training.
  gen_eval()  the runtime's way, one sample at a time: CED prefill of the prompt
              (model.prefill_ced), greedy decode to end-of-sentence, parse the DSML output
              (cedar_ref.chat.parse_output), execute every call for real against the sample's
              world (cedar_ref.data.run_tool), append the results, continue with the live state
              (a full-stack chunked prefill of the new tokens: in-session state is exact), up to
              `max_rounds` assistant turns. Scores: the final answer contains the expected value
              (word-bounded), every call is valid (parses without error, names an offered tool,
              required arguments present with the schema's types), recall accuracy by distance
              (tokens between the value's first appearance and the end of the prompt).
  The C++ `cedar eval` must reproduce gen_eval on the same samples.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections import defaultdict

import torch

from . import chat, data
from .bpe import EOS
from .expect import expect_of


def graded_start(tok, sample) -> int:
    """Token index where the graded turn starts (the length of the tokenized prompt)."""
    n = 0
    plen = len(data.prompt_text(sample))
    acc = 0
    for text, _ in data.render_sample(sample["messages"]):
        if acc >= plen:
            break
        n += len(tok.encode(text))
        acc += len(text)
    return n


def answer_ok(content: str, expect: str) -> bool:
    """`content` holds the value `expect` as a whole token, as cedar eval judges (expect.py)."""
    return re.search(expect_of(expect)["regex"], content) is not None


@torch.no_grad()
def tf_eval(m, tok, samples, device, max_tokens=32768, pad_id=2, copy_frequent=0.1):
    """-> families' exact match, graded-turn loss, and the graded turn's tokens split the way
    train.py --copy-weight splits them ("copy": values copied from the context, with the
    frequent ids taken over these samples at `copy_frequent`; "other": the rest): mean loss and
    greedy token accuracy of each."""
    from .train_core import copy_frequent_ids, copy_weights
    out = defaultdict(lambda: [0, 0])
    loss_sum, loss_n = 0.0, 0
    split = {k: [0.0, 0, 0] for k in ("copy", "other")}  # loss sum, tokens, right
    items = []
    tokenized = [data.tokenize_sample(tok, s["messages"]) for s in samples]
    frequent = copy_frequent_ids(tok, [ids for ids, _ in tokenized], copy_frequent)
    for s, (ids, mask) in zip(samples, tokenized):
        g = graded_start(tok, s)
        items.append((ids, copy_weights(ids, mask, frequent, 2), g, s["family"]))
    items.sort(key=lambda it: len(it[0]))
    i = 0
    while i < len(items):
        T = len(items[i][0])
        B = 1
        while i + B < len(items) and (B + 1) * len(items[i + B][0]) <= max_tokens:
            B += 1
        group = items[i:i + B]
        i += B
        T = max(len(it[0]) for it in group)
        ids = torch.full((len(group), T), pad_id, dtype=torch.long)
        for b, it in enumerate(group):
            ids[b, :len(it[0])] = torch.tensor(it[0])
        ids = ids.to(device)
        logits = m(ids)
        pred = logits.argmax(-1).cpu()
        lp = torch.log_softmax(logits.float(), -1).cpu()
        for b, (tids, mask, g, fam) in enumerate(group):
            tids_t = torch.tensor(tids)
            pos = [t for t in range(max(g, 1), len(tids)) if mask[t]]
            ok = all(int(pred[b, t - 1]) == tids[t] for t in pos)
            out[fam][0] += int(ok)
            out[fam][1] += 1
            for t in pos:
                nll = -float(lp[b, t - 1, tids_t[t]])
                loss_sum += nll
                loss_n += 1
                c = split["copy" if mask[t] == 2 else "other"]
                c[0] += nll
                c[1] += 1
                c[2] += int(int(pred[b, t - 1]) == tids[t])
    res = {f: {"exact": c / n, "n": n} for f, (c, n) in sorted(out.items())}
    tot_c = sum(c for c, _ in out.values())
    tot_n = sum(n for _, n in out.values())
    r = {"families": res, "exact": tot_c / max(tot_n, 1), "n": tot_n,
         "graded_loss": loss_sum / max(loss_n, 1)}
    for k, (ls, n, right) in split.items():
        r[f"{k}_tokens"] = n
        r[f"{k}_loss"] = ls / max(n, 1)
        r[f"{k}_token_acc"] = right / max(n, 1)
    return r


def call_valid(call, offered) -> bool:
    name = call.get("name")
    if name not in offered or name not in data.TOOL_SCHEMAS:
        return False
    try:
        args = json.loads(call.get("arguments") or "{}")
    except ValueError:
        return False
    if not isinstance(args, dict):
        return False
    params = data.TOOL_SCHEMAS[name]["function"]["parameters"]
    for req in params.get("required", []):
        if req not in args:
            return False
    for k, v in args.items():
        spec = params["properties"].get(k)
        if spec is None:
            return False
        if spec.get("type") == "string" and not isinstance(v, str):
            return False
        if spec.get("type") == "number" and not isinstance(v, (int, float)):
            return False
    return True


@torch.no_grad()
def run_agent(m, tok, sample, device, max_new=160, max_rounds=4):
    """Greedy agent loop on one sample -> dict(answer, calls, valid_calls, rounds, tokens)."""
    eos = tok.token_to_id(EOS)
    world = copy.deepcopy(sample["world"])
    msgs = copy.deepcopy(sample["messages"][:sample["n_prompt"]])
    offered = set(sample["tools"])
    ids, _ = data.tokenize_sample(tok, msgs)
    st = m.new_state(1)
    logits = m.prefill_ced(torch.tensor([ids], device=device), st)[0, -1]
    consumed = list(ids)
    n_calls, n_valid, answer = 0, 0, ""
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        gen = []
        for _ in range(max_new):
            nxt = int(logits.argmax())
            if nxt == eos:
                break
            gen.append(nxt)
            logits = m(torch.tensor([[nxt]], device=device), st)[0, -1]
        consumed += gen
        text = tok.decode(gen)
        parsed = chat.parse_output(text)
        calls = parsed["calls"]
        answer = parsed["content"]
        if not calls:
            if parsed["errors"]:
                n_calls += 1  # a malformed call block counts as one invalid call
            break
        tcs = []
        for k, c in enumerate(calls):
            n_calls += 1
            ok = call_valid(c, offered) and not parsed["errors"]
            n_valid += int(ok)
            try:
                args = json.loads(c["arguments"] or "{}")
            except ValueError:
                args = {}
            tcs.append({"id": f"gen_{rounds}_{k}", "type": "function",
                        "function": {"name": c["name"], "arguments": args}})
        msgs.append({"role": "assistant", "content": answer, "tool_calls": tcs})
        for tc in tcs:
            res, _ = data.run_tool(tc["function"]["name"], tc["function"]["arguments"], world)
            msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": res})
        try:
            full, _ = data.tokenize_sample(tok, msgs)
        except (ValueError, chat.ChatFormatError):
            break
        if full[:len(consumed)] == consumed:
            rest = full[len(consumed):]
            # the end-of-sentence the model emitted, then the tool results, then the prefix
            logits = m(torch.tensor([rest], device=device), st)[0, -1]
        else:  # non-canonical tokenization of the generated text: re-prefill from scratch
            st = m.new_state(1)
            logits = m.prefill_ced(torch.tensor([full], device=device), st)[0, -1]
        consumed = list(full)
    return {"answer": answer, "calls": n_calls, "valid_calls": n_valid, "rounds": rounds,
            "prompt_tokens": len(ids)}


def distance_tokens(tok, sample):
    if "distance_chars" not in sample:
        return None
    text = data.prompt_text(sample)
    return len(tok.encode(text[len(text) - sample["distance_chars"]:]))


BUCKETS = [(0, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 8192), (8192, 1 << 30)]


def gen_eval(m, tok, samples, device, time_limit=None, log=None):
    t0 = time.time()
    fam = defaultdict(lambda: [0, 0])
    calls = valid = 0
    rec = defaultdict(lambda: [0, 0])
    details = []
    for s in samples:
        if time_limit is not None and time.time() - t0 > time_limit:
            break
        r = run_agent(m, tok, s, device)
        ok = answer_ok(r["answer"], s["expect"])
        fam[s["family"]][0] += int(ok)
        fam[s["family"]][1] += 1
        calls += r["calls"]
        valid += r["valid_calls"]
        d = distance_tokens(tok, s)
        if d is not None:
            for lo, hi in BUCKETS:
                if lo <= d < hi:
                    rec[f"{lo}-{hi if hi < (1 << 30) else 'inf'}"][0] += int(ok)
                    rec[f"{lo}-{hi if hi < (1 << 30) else 'inf'}"][1] += 1
        details.append({"id": s["id"], "family": s["family"], "ok": ok, "answer": r["answer"][:200],
                        "expect": s["expect"], "calls": r["calls"], "valid": r["valid_calls"],
                        "distance_tokens": d})
        if log:
            log(f"gen_eval {len(details)}/{len(samples)} {s['family']} ok={ok} "
                f"({time.time() - t0:.0f}s)")
    n = sum(c[1] for c in fam.values())
    return {"n": n, "success": sum(c[0] for c in fam.values()) / max(n, 1),
            "families": {f: {"success": c / k, "n": k} for f, (c, k) in sorted(fam.items())},
            "valid_tool_call_rate": valid / max(calls, 1), "tool_calls": calls,
            "recall_by_distance": {b: {"success": c / k, "n": k} for b, (c, k) in rec.items()},
            "seconds": time.time() - t0, "details": details}
