#!/usr/bin/python3
"""Train cedar's default agent model (issue 6) on freshly generated synthetic transcripts.

Pipeline: worker processes generate train-split samples (cedar_ref/data.py, seeded by index)
and tokenize them; the main process groups them by length into batches, trains with the
TRAINING_NOTES recipe (cedar_ref/train_core.py: stages A dense / B sparse / C quantised +
candidate pool + bounded replay, indexer KL, MoE bias rule, AdamW groups), then evaluates on
the held-out split (teacher-forced exact match, and real agent generation — see
cedar_ref/train_eval.py) and exports bf16 safetensors + config.json + token_map.npy +
tokenizer.json, a JSON log and a loss-curve PNG.

The schedule runs on a time budget (--minutes) or a step count (--steps): stage boundaries and
the LR decay are fractions of it. Progress lines go to stderr.

  /usr/bin/python3 model/reference/train.py --config config/cedar-agent-tiny.json \
      --tokenizer model/weights/cedar-agent-tiny/tokenizer.json --minutes 6 --out /tmp/run

Continuing from an exported model (a new LR cycle, stage A skipped). The data stream is a
function of --seed alone, so give a seed the checkpoint's run did not use, or the same samples
come again in the same order:

  ... --init-from model/weights/cedar-agent-tiny --dense-frac 0 --seed 2 --minutes 4 --out /tmp/run2

Several GPUs of one host: `--gpus N` runs one process per GPU (NCCL); each rank trains on its own
share of the data stream (chunks r, r + N, ...), gradients are averaged and MoE loads summed
every step (cedar_ref/train_core.DataParallel), rank 0 logs, exports and evaluates. The log's
"data wait" share says whether the data workers keep up.
"""

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cedar_ref import bpe, data  # noqa: E402
from cedar_ref import train_core as TC  # noqa: E402
from cedar_ref import train_eval as TE  # noqa: E402
from cedar_ref.config import ModelConfig  # noqa: E402

_TOK = None
_ARGS = None


def _init_worker(tok_path, recall_chars, max_len, long_frac=0.0, long_chars=(9000, 40000),
                 long_max_len=12288, copy_weight=1, frequent=(), real_names=0.0):
    global _TOK, _ARGS
    _TOK = bpe.Tokenizer.load(tok_path)
    _ARGS = (tuple(recall_chars), max_len, long_frac, tuple(long_chars), long_max_len,
             int(copy_weight), frozenset(frequent), float(real_names))
    torch.set_num_threads(1)


def is_long_recall(seed: int, index: int, long_frac: float) -> bool:
    """Whether train sample `index` of the stream is a long recall sample (its own draw, so the
    choice does not depend on the chunking or the number of workers)."""
    return long_frac > 0 and random.Random(f"{seed}/long-recall/{index}").random() < long_frac


def _gen_chunk(task):
    """task = (seed, first index, count) -> list of (ids, mask, start, family)."""
    seed, first, count = task
    rc, max_len, long_frac, long_rc, long_max_len, copy_weight, frequent, real_names = _ARGS
    out = []
    for i in range(first, first + count):
        if is_long_recall(seed, i, long_frac):
            s = data.make_sample(seed, i, "train", "recall", long_rc, real_names)
            limit = long_max_len
        else:
            s = data.make_sample(seed, i, "train", None, rc, real_names)
            limit = max_len
        ids, mask = data.tokenize_sample(_TOK, s["messages"])
        if len(ids) > limit:
            continue
        out.append((np.asarray(ids, np.int32), TC.copy_weights(ids, mask, frequent, copy_weight),
                    TC.last_turn_start(mask), s["family"]))
    return out


COPY_DF_SAMPLES = 600


def frequent_ids(tok, args):
    """The ids that --copy-weight never treats as copied values: those in more than
    --copy-frequent of the first COPY_DF_SAMPLES train samples of the run's seed, numbers
    excepted (a number in the answer is always a copy when the context showed it)."""
    lists = []
    for i in range(COPY_DF_SAMPLES):
        s = data.make_sample(args.seed, i, "train", None, tuple(args.recall_chars), args.real_names)
        lists.append(data.tokenize_sample(tok, s["messages"])[0])
    return TC.copy_frequent_ids(tok, lists, args.copy_frequent)


class Stream:
    """Bounded prefetch of generated chunks from a process pool (or in-process)."""

    def __init__(self, args, rank=0, world=1, frequent=()):
        self.args = args
        self.chunk = 32
        self.next_index = rank * self.chunk  # rank r takes chunks r, r + world, ... of the stream
        self.stride = world * self.chunk
        self.pool = None
        self.inflight = deque()
        self.worker_args = (args.tokenizer, args.recall_chars, args.max_len, args.long_recall_frac,
                            args.long_recall_train_chars, args.long_max_len, args.copy_weight,
                            tuple(sorted(frequent)), args.real_names)
        if args.workers > 0:
            self.pool = mp.get_context("fork").Pool(args.workers, _init_worker,
                                                    self.worker_args)
        else:
            _init_worker(*self.worker_args)
        self.n_samples = 0
        self.families = {}

    def _task(self):
        t = (self.args.seed, self.next_index, self.chunk)
        self.next_index += self.stride
        return t

    def take(self, n):
        items = []
        while len(items) < n:
            if self.pool is None:
                got = _gen_chunk(self._task())
            else:
                while len(self.inflight) < 3 * self.args.workers:
                    self.inflight.append(self.pool.apply_async(_gen_chunk, (self._task(),)))
                got = self.inflight.popleft().get()
            for ids, mask, start, fam in got:
                self.families[fam] = self.families.get(fam, 0) + 1
            items.extend((ids, mask, start) for ids, mask, start, _ in got)
        self.n_samples += len(items)
        return items

    def close(self):
        if self.pool is not None:
            self.pool.terminate()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="model config.json (e.g. config/cedar-agent-tiny.json)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json matching the config's vocab_size")
    ap.add_argument("--out", required=True, help="output directory (model/, train_log.json, loss.png, eval.json)")
    ap.add_argument("--minutes", type=float, help="training time budget (schedule by time)")
    ap.add_argument("--steps", type=int, help="training steps (schedule by steps)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init-from", metavar="DIR",
                    help="continue from DIR/model.safetensors (an exported model dir; use with "
                         "--dense-frac 0 to skip the dense stage A, and a --seed the checkpoint's "
                         "run did not use, else its samples are generated again)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gpus", type=int, default=1,
                    help="data-parallel ranks: one process per GPU (NCCL); with --device cpu, "
                         "that many CPU processes (gloo). Batch budgets are per rank")
    ap.add_argument("--workers", type=int, default=max(0, min(15, (os.cpu_count() or 1) - 1)),
                    help="data generation processes (0: in-process)")
    ap.add_argument("--max-len", type=int, default=3072, help="drop samples longer than this (tokens)")
    ap.add_argument("--recall-chars", type=int, nargs=2, default=[1500, 9000], metavar=("LO", "HI"))
    ap.add_argument("--long-recall-frac", type=float, default=0.0, metavar="P",
                    help="share of train samples that are recall samples at a long distance "
                         "(--long-recall-train-chars), for recall at ~8K tokens of history")
    ap.add_argument("--long-recall-train-chars", type=int, nargs=2, default=[9000, 40000],
                    metavar=("LO", "HI"), help="recall distance of the long samples, in characters")
    ap.add_argument("--long-max-len", type=int, default=12288,
                    help="drop long recall samples longer than this (tokens)")
    ap.add_argument("--max-tokens", type=int, default=98304, help="tokens per batch (padded)")
    ap.add_argument("--max-sq", type=float, default=14 * 2048 ** 2,
                    help="batch budget of B*T^2 for dense attention (stage A, --dense-attention; 8x "
                         "gave 62 GB on an H200). The sparse stages' memory grows with B*T, not "
                         "B*T^2 (bench_train_step: 112 GB at 98K tokens for T = 1024, 2048, 3072), so "
                         "their batches are bound by --max-tokens alone")
    ap.add_argument("--copy-weight", type=int, default=1, metavar="W",
                    help="loss weight (1..255) of assistant tokens that copy a value from the context: "
                         "ids seen earlier in a non-assistant message and not frequent (default 1: off)")
    ap.add_argument("--copy-frequent", type=float, default=0.1, metavar="F",
                    help="with --copy-weight: ids in more than this fraction of %d train samples of the "
                         "run's seed count as frequent, never as copies" % COPY_DF_SAMPLES)
    ap.add_argument("--real-names", type=float, default=0.0, metavar="P",
                    help="share (0..1) of the train data's drawn words that are real file, folder and "
                         "note names (data.REAL_STEMS: app-style names people use) instead of made-up "
                         "ones; also adds weekday and 'files here' requests (default 0: off)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--gamma", type=float, default=1e-3, help="MoE bias update speed")
    ap.add_argument("--dense-frac", type=float, default=0.12, help="stage A share")
    ap.add_argument("--stage-c-frac", type=float, default=0.70, help="stage C starts here")
    ap.add_argument("--replay-rows", type=int, default=1, help="rows per batch given a replay tail in stage C")
    ap.add_argument("--indexer-only", action="store_true",
                    help="train the indexers alone: every other parameter frozen and the MoE router "
                         "biases not updated; the forward (and the LM loss, logged) as usual")
    ap.add_argument("--indexer-lr-mult", type=float, default=1.0, metavar="X",
                    help="the indexer group's learning rate as a multiple of --lr (default 1)")
    ap.add_argument("--kl-teacher-topk", type=int, default=0, metavar="K",
                    help="indexer KL over the selection and the K entries this layer's attention "
                         "over EVERY visible entry weighs most (the teacher of TRAINING_NOTES §1), "
                         "so the indexer learns of entries its own top-k misses (recall far back); "
                         "0: over the selection only")
    ap.add_argument("--quant-distill", type=float, default=0.0, metavar="W",
                    help="in stage C, add W x KL(unquantised || quantised) over the assistant "
                         "targets: the same weights' forward without FP8 window / FP4 KV and "
                         "indexer rounding (no gradients) as the teacher of the quantised one, "
                         "to close the gap between --kv fp4 and --kv bf16; 0: off")
    ap.add_argument("--sparse-moe", action="store_true",
                    help="keep the reference's per-expert MoE loop on the GPU (default there: the "
                         "sync-free dense-weighted form, same function)")
    ap.add_argument("--dense-attention", action="store_true",
                    help="stages B/C through the dense [T, T] attention path (the sparse training "
                         "path computes the same function, several times faster)")
    ap.add_argument("--no-autocast", action="store_true", help="fp32 on the GPU (default: bf16 autocast)")
    ap.add_argument("--ema", type=float, default=0.0, metavar="DECAY",
                    help="also keep an exponential moving average of the weights (e.g. 0.998) and "
                         "export it to OUT/model_ema beside the last weights in OUT/model")
    ap.add_argument("--checkpoint-minutes", type=float, default=0.0, metavar="M",
                    help="every M minutes of training, export the live weights (and the EMA's, "
                         "with --ema) to OUT/checkpoint/{model,model_ema} (replaced atomically, "
                         "with checkpoint.json: step, seconds, tokens), so that a run cut off with "
                         "its machine can go on with --init-from OUT/checkpoint/model; 0: off")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--tf-eval-n", type=int, default=300, help="held-out samples for teacher-forced eval")
    ap.add_argument("--gen-eval-n", type=int, default=60, help="held-out samples for generation eval")
    ap.add_argument("--gen-eval-seconds", type=float, default=120)
    ap.add_argument("--long-recall-n", type=int, default=6,
                    help="extra held-out recall samples at ~8K tokens of distance (generation eval)")
    ap.add_argument("--long-recall-chars", type=int, nargs=2, default=[32000, 38000])
    ap.add_argument("--eval-seed", type=int, default=1001)
    ap.add_argument("--transport-parts", action="store_true",
                    help="split model.safetensors into <= 15 MiB parts (.part0, .part1, ...; "
                         "concatenate to restore) and leave out tokenizer.json / token_map.npy "
                         "(for a copy-back limit of 16 MiB per file)")
    args = ap.parse_args(argv)
    if (args.minutes is None) == (args.steps is None):
        ap.error("give exactly one of --minutes and --steps")
    if args.gpus < 1:
        ap.error("--gpus must be >= 1")
    if not 0.0 <= args.long_recall_frac <= 1.0:
        ap.error(f"--long-recall-frac {args.long_recall_frac}: a share between 0 and 1")
    lo, hi = args.long_recall_train_chars
    if not 0 < lo <= hi:
        ap.error(f"--long-recall-train-chars {lo} {hi}: expected 0 < LO <= HI")
    if not args.indexer_lr_mult > 0:
        ap.error(f"--indexer-lr-mult {args.indexer_lr_mult}: a multiple of --lr > 0")
    if args.kl_teacher_topk < 0:
        ap.error(f"--kl-teacher-topk {args.kl_teacher_topk}: a number of entries >= 0 (0: off)")
    if not 0.0 <= args.quant_distill <= 100.0:
        ap.error(f"--quant-distill {args.quant_distill}: a loss weight from 0 (off) to 100")
    if args.checkpoint_minutes < 0:
        ap.error(f"--checkpoint-minutes {args.checkpoint_minutes}: a number of minutes >= 0 (0: off)")
    if not 0.0 <= args.real_names <= 1.0:
        ap.error(f"--real-names {args.real_names}: a share from 0 to 1")
    if not 1 <= args.copy_weight <= 255:
        ap.error(f"--copy-weight {args.copy_weight}: a loss weight from 1 (off) to 255")
    if not 0.0 < args.copy_frequent <= 1.0:
        ap.error(f"--copy-frequent {args.copy_frequent}: a fraction of samples in (0, 1]")
    if args.ema and not 0.0 < args.ema < 1.0:
        ap.error(f"--ema {args.ema}: the decay must lie between 0 and 1 (e.g. 0.998), or 0 for none")
    if args.gpus > 1 and args.device.startswith("cuda") and torch.cuda.device_count() < args.gpus:
        ap.error(f"--gpus {args.gpus}: only {torch.cuda.device_count()} CUDA devices are visible")
    # varying batch shapes fragment the caching allocator near full memory otherwise
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if args.gpus == 1:
        return run(0, 1, args)
    import torch.multiprocessing as tmp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    try:
        tmp.spawn(_rank_entry, args=(args.gpus, args), nprocs=args.gpus, join=True)
    except tmp.ProcessExitedException as e:  # a rank's own message is already on stderr
        print(f"train: rank {e.error_index} exited with code {e.exit_code}", file=sys.stderr)
        return e.exit_code if e.exit_code and e.exit_code > 0 else 1
    return 0


def _rank_entry(rank, world, args):
    rc = run(rank, world, args)
    if rc:
        raise SystemExit(rc)


def run(rank, world, args) -> int:
    """One training process: rank 0 of 1, or one data-parallel rank (rank 0 logs, exports and
    evaluates)."""

    def log(msg):
        if rank == 0:
            print(f"train: {msg}", file=sys.stderr, flush=True)

    os.makedirs(args.out, exist_ok=True)
    dev = torch.device(args.device)
    if world > 1 and dev.type == "cuda":
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    cfg = ModelConfig.from_json(args.config)
    tok = bpe.Tokenizer.load(args.tokenizer)
    if tok.vocab_size > cfg.vocab_size:
        log(f"tokenizer has {tok.vocab_size} ids but the config's vocab_size is {cfg.vocab_size}")
        return 2
    pad_id = tok.token_to_id(bpe.PAD)
    base = {"index_topk": cfg.index_topk, "candidate_topk_blocks": cfg.candidate_topk_blocks}
    if world > 1:
        args.workers = max(1, args.workers // world)
    frequent = ()
    if args.copy_weight > 1:
        frequent = frequent_ids(tok, args)
        log(f"copy weight {args.copy_weight}: {len(frequent)} frequent ids "
            f"(in > {args.copy_frequent:.0%} of {COPY_DF_SAMPLES} samples) never count as copies")
    if args.real_names > 0:
        log(f"real names: {args.real_names:.0%} of the train data's drawn words are real file, "
            f"folder and note names ({len(data.real_pool('train'))} stems)")
    stream = Stream(args, rank, world, frequent)  # fork the data workers before CUDA is initialised
    parallel = None
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world)
        parallel = TC.DataParallel(rank, world, dev)
    m = TC.build_model(cfg, args.seed, dev)
    if args.init_from:
        try:
            n_t = TC.init_from(m, args.init_from)
        except (OSError, ValueError) as e:
            log(f"--init-from {args.init_from}: {e}")
            stream.close()
            return 2
        log(f"initialised {n_t} tensors from {args.init_from}")
    if dev.type == "cuda" and not args.sparse_moe:
        TC.use_dense_moe(m)
    m.kl_teacher_topk = args.kl_teacher_topk
    n_params = sum(p.numel() for p in m.parameters())
    log(f"model {n_params / 1e6:.2f}M params on {dev}; vocab {cfg.vocab_size}, layers "
        f"{[cfg.layer_mode(l) for l in range(cfg.num_hidden_layers)]}")
    if args.indexer_only:
        n_train, n_frozen = TC.freeze_all_but_indexers(m)
        log(f"indexer only: {n_train / 1e6:.3f}M indexer parameters train, {n_frozen / 1e6:.2f}M frozen")
    groups = TC.param_groups(m, args.lr)
    for g in groups:
        if g["name"] == "indexer":
            g["lr_mult"] = args.indexer_lr_mult
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    tracker = TC.MoETracker(m)
    ema = TC.WeightEMA(m, args.ema) if args.ema else None
    sched = TC.Schedule(steps=args.steps or 1, dense_frac=args.dense_frac, stage_c_frac=args.stage_c_frac)
    autocast = None
    if dev.type == "cuda" and not args.no_autocast:
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    rng = random.Random(args.seed)

    def export_to(mdir, meta):
        TC.export(m, args.config, mdir, base, meta)
        if args.transport_parts:
            path = os.path.join(mdir, "model.safetensors")
            with open(path, "rb") as f:
                blob = f.read()
            part = 15 << 20
            for k in range(0, len(blob), part):
                with open(f"{path}.part{k // part}", "wb") as g:
                    g.write(blob[k:k + part])
            os.remove(path)
            os.remove(os.path.join(mdir, "token_map.npy"))
        else:
            with open(args.tokenizer, "rb") as f, open(os.path.join(mdir, "tokenizer.json"), "wb") as g:
                g.write(f.read())

    def run_meta(step):
        meta = {"format": "pt", "trained_steps": step, "data_seed": args.seed}
        if args.init_from:
            meta["init_from"] = os.path.basename(os.path.normpath(args.init_from))
        return meta

    def save_checkpoint(step, tokens):
        """OUT/checkpoint replaced as a whole: written beside it, then renamed into place."""
        final = os.path.join(args.out, "checkpoint")
        tmp, old = final + ".tmp", final + ".old"
        for d in (tmp, old):
            shutil.rmtree(d, ignore_errors=True)
        meta = dict(run_meta(step), checkpoint="1")
        export_to(os.path.join(tmp, "model"), meta)
        if ema is not None:
            with ema.swapped():
                export_to(os.path.join(tmp, "model_ema"), dict(meta, ema_decay=args.ema))
        with open(os.path.join(tmp, "checkpoint.json"), "w") as f:
            json.dump({"step": step, "seconds": round(time.time() - t_start, 1), "tokens": tokens,
                       "ema": bool(ema is not None)}, f)
        if os.path.isdir(final):
            os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)

    history = []
    t_start = time.time()
    last_ckpt = t_start
    budget = args.minutes * 60 if args.minutes else None
    step, tokens_seen, last_t, last_tok = 0, 0, time.time(), 0
    batches = deque()
    fell_back = False
    t_data = t_step = 0.0  # seconds waiting for samples / in train_step (this rank)
    try:
        while True:
            frac = ((time.time() - t_start) / budget) if budget else step / args.steps
            if parallel is not None:
                frac = parallel.agree(frac)
            if frac >= 1.0:
                break
            sstep = int(frac * 10000)
            sched.steps = 10000
            stage = sched.stage(sstep)
            TC.apply_stage(m, stage, base, sparse=not args.dense_attention)
            lrm = sched.lr_mult(sstep)
            for g in opt.param_groups:
                g["lr"] = args.lr * lrm * g["lr_mult"]
            t0 = time.time()
            if not batches:
                items = stream.take(384)
                quadratic = stage == "A" or args.dense_attention
                batches.extend(TC.make_batches(items, args.max_tokens,
                                               args.max_sq if quadratic else float("inf"), rng=rng))
            batch = TC.collate(batches.popleft(), pad_id, dev)
            t1 = time.time()
            t_data += t1 - t0
            m.train()
            try:
                out = TC.train_step(m, opt, tracker, batch, stage, args.gamma,
                                    replay_rows=args.replay_rows, autocast=autocast, rng=rng,
                                    update_bias=not (args.indexer_only or sched.bias_frozen(sstep)),
                                    parallel=parallel, quant_distill=args.quant_distill)
                t_step += time.time() - t1
                if out is None:  # another rank ran out of memory: nobody updated
                    continue
                if ema is not None:
                    ema.update()
            except torch.cuda.OutOfMemoryError:
                del batch
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                if parallel is not None:
                    parallel.step_ok(False)
                args.max_sq /= 2
                args.max_tokens //= 2
                batches.clear()
                log(f"out of memory: batch budgets halved to {args.max_tokens} tokens, "
                    f"{args.max_sq:.3g} T^2")
                continue
            except Exception as e:  # noqa: BLE001 - one retry without autocast on the first step
                if autocast is not None and step == 0 and not fell_back:
                    log(f"bf16 autocast failed ({type(e).__name__}: {str(e)[:300]}); continuing in fp32")
                    autocast, fell_back = None, True
                    opt.zero_grad(set_to_none=True)
                    if parallel is not None:
                        parallel.step_ok(False)
                    continue
                raise
            step += 1
            tokens_seen += int(batch[2].sum())
            rec = {"step": step, "t": round(time.time() - t_start, 2), "stage": stage,
                   "lr": args.lr * lrm, "loss": out.loss, "lm": out.lm, "kl": out.kl,
                   "aux": out.aux, "replay_lm": out.replay_lm, "maxvio": out.maxvio,
                   "batch": list(batch[0].shape), "tokens": tokens_seen}
            if args.quant_distill:
                rec["quant_gap"] = out.quant_gap
            if out.teacher:  # --kl-teacher-topk: the teacher mass the selection holds, per layer
                rec["teacher"] = {str(l): c for l, c in out.teacher.items()}
            history.append(rec)
            if step % args.log_every == 0 or step == 1:
                now = time.time()
                all_tokens = tokens_seen
                if parallel is not None:  # every rank reaches the same steps
                    all_tokens = int(parallel.sum([float(tokens_seen)])[0])
                    rec["tokens_all_ranks"] = all_tokens
                tps = (all_tokens - last_tok) / max(now - last_t, 1e-9)
                last_t, last_tok = now, all_tokens
                rec["tok_per_s"] = tps
                log(f"step {step} {stage} {rec['t']:.0f}s lm {out.lm:.4f} kl {out.kl:.4f} "
                    f"replay {out.replay_lm:.4f} aux {out.aux:.2e} maxvio {out.maxvio:.2f} "
                    + (f"qgap {out.quant_gap:.4f} " if args.quant_distill else "") +
                    f"lr {rec['lr']:.2e} B×T {rec['batch']} {tps:.0f} tok/s "
                    f"(data wait {100 * t_data / max(now - t_start, 1e-9):.0f}%, step "
                    f"{100 * t_step / max(now - t_start, 1e-9):.0f}%)"
                    + (f" mem {torch.cuda.max_memory_allocated() / 2**30:.1f}G" if dev.type == "cuda" else "")
                    + (" sel-mass " + " ".join(f"{l}:{c['captured']:.2f}" for l, c in out.teacher.items())
                       if out.teacher else ""))
            if args.checkpoint_minutes and rank == 0 and time.time() - last_ckpt >= 60 * args.checkpoint_minutes:
                last_ckpt = time.time()
                try:  # a checkpoint is an aid: a full disk or a bad path must not end the run
                    save_checkpoint(step, tokens_seen)
                    log(f"checkpoint of step {step} in {args.out}/checkpoint")
                except OSError as e:
                    log(f"checkpoint of step {step} failed ({e}); training goes on, the last good "
                        f"checkpoint (if any) stays in {args.out}/checkpoint")
    finally:
        stream.close()
    train_s = time.time() - t_start
    n_samples = stream.n_samples
    if parallel is not None:
        tokens_seen, n_samples = (int(v) for v in parallel.sum([float(tokens_seen), float(n_samples)]))
        parallel.dist.destroy_process_group()
        if rank != 0:
            return 0
    log(f"trained {step} steps, {tokens_seen} tokens ({n_samples} samples, {world} rank(s)) in "
        f"{train_s:.0f}s; data wait {t_data:.0f}s, train_step {t_step:.0f}s (rank 0)")

    # ---- export ----
    TC.serving_mode(m, base, quant=True)
    m.eval()
    meta = run_meta(step)
    export_to(os.path.join(args.out, "model"), meta)
    if ema is not None:
        with ema.swapped():
            export_to(os.path.join(args.out, "model_ema"), dict(meta, ema_decay=args.ema))
        log(f"exported the EMA weights (decay {args.ema}, {ema.n} updates) to {args.out}/model_ema")

    def save(ev):
        summary = {"params": n_params, "steps": step, "train_seconds": train_s,
                   "tokens": tokens_seen, "samples": n_samples, "ranks": world,
                   "families_trained": stream.families,
                   "tokens_per_second": tokens_seen / max(train_s, 1e-9), "device": str(dev),
                   "torch": torch.__version__, "autocast_bf16": autocast is not None,
                   "args": vars(args), "eval": ev}
        with open(os.path.join(args.out, "train_log.json"), "w") as f:
            json.dump({"summary": summary, "history": history}, f)
        with open(os.path.join(args.out, "eval.json"), "w") as f:
            json.dump(ev, f, indent=1)

    xs = [h["step"] for h in history]
    curves = {"LM (assistant tokens)": [h["lm"] for h in history],
              "indexer KL": [max(h["kl"], 1e-6) for h in history]}
    if args.quant_distill:  # stage-C steps only (the term is 0 elsewhere)
        curves["KL unquantised || quantised (--quant-distill)"] = [
            max(h.get("quant_gap", 0.0), 1e-6) if h["stage"] == "C" else float("nan") for h in history]
    how = TC.write_png(os.path.join(args.out, "loss.png"), curves,
                       xs, f"cedar-agent-tiny: {step} steps, {train_s / 60:.1f} min")
    teach = [h for h in history if "teacher" in h]
    if teach:  # --kl-teacher-topk: the selection's share of the teacher mass, per layer (mean of 20 steps)
        layers = sorted({l for h in teach for l in h["teacher"]}, key=int)
        series = {}
        for l in layers:
            ys = [h["teacher"][l]["captured"] if l in h["teacher"] else float("nan") for h in teach]
            series[f"layer {l}"] = [sum(v for v in ys[max(0, i - 19):i + 1] if v == v) /
                                    max(1, sum(1 for v in ys[max(0, i - 19):i + 1] if v == v))
                                    for i in range(len(ys))]
        TC.write_png(os.path.join(args.out, "indexer.png"), series, [h["step"] for h in teach],
                     "share of the all-entries teacher's mass on the indexer's selection",
                     ylabel="captured mass")
    save({})
    log(f"saved model, log and loss curve (png via {how})")

    # ---- eval ----
    heldout = [data.make_sample(args.eval_seed, i, "heldout", None, tuple(args.recall_chars))
               for i in range(max(args.tf_eval_n, args.gen_eval_n))]
    ev = {}
    t0 = time.time()
    ev["teacher_forced"] = TE.tf_eval(m, tok, heldout[:args.tf_eval_n], dev, pad_id=pad_id)
    ev["teacher_forced"]["seconds"] = time.time() - t0
    log(f"teacher-forced held-out exact {ev['teacher_forced']['exact']:.3f} "
        f"({json.dumps({f: round(v['exact'], 3) for f, v in ev['teacher_forced']['families'].items()})})")
    # generation: round-robin over families so a time cut keeps the mix
    by_fam = {}
    for s in heldout:
        by_fam.setdefault(s["family"], []).append(s)
    order, k = [], 0
    while len(order) < args.gen_eval_n and any(k < len(v) for v in by_fam.values()):
        for f in sorted(by_fam):
            if k < len(by_fam[f]) and len(order) < args.gen_eval_n:
                order.append(by_fam[f][k])
        k += 1
    if args.gen_eval_n > 0:
        ev["generation"] = TE.gen_eval(m, tok, order, dev, args.gen_eval_seconds,
                                       log=log if args.gen_eval_n <= 20 else None)
        g = ev["generation"]
        log(f"generation held-out success {g['success']:.3f} on {g['n']}, valid calls "
            f"{g['valid_tool_call_rate']:.3f}, families "
            f"{json.dumps({f: round(v['success'], 3) for f, v in g['families'].items()})}, recall "
            f"{json.dumps({b: (round(v['success'], 2), v['n']) for b, v in g['recall_by_distance'].items()})}")

    if args.long_recall_n > 0:
        save(ev)
        longs = [data.make_sample(args.eval_seed + 1, i, "heldout", "recall",
                                  tuple(args.long_recall_chars)) for i in range(args.long_recall_n)]
        ev["generation_long_recall"] = TE.gen_eval(m, tok, longs, dev, args.gen_eval_seconds / 2)
        g = ev["generation_long_recall"]
        log(f"long recall: success {g['success']:.3f} on {g['n']}, by distance "
            f"{json.dumps({b: (round(v['success'], 2), v['n']) for b, v in g['recall_by_distance'].items()})}")
    save(ev)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
