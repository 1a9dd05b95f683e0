#!/usr/bin/python3
"""Train kvq's default Qwen2-architecture model on the tokenized corpus.

Deterministic and resumable: batch k is drawn from an RNG seeded with (seed, k),
so a resumed run sees exactly the data order of an uninterrupted one.  A
checkpoint (model + AdamW state + step) is written atomically every
--ckpt-every seconds and at the end to OUT/ckpt.pt; re-running the same command
resumes from it.  Logs go to stdout and OUT/train.log; metrics (one JSON per
line) to OUT/metrics.jsonl for the loss curve.

Stopping: after --max-steps, or earlier at --deadline (UTC "YYYY-mm-ddTHH:MM")
or --time-budget seconds.  With --fit-deadline the cosine schedule's length follows
the measured speed (shorter when the CPU is busy, longer -- up to --max-steps -- when
it is quiet) so that it completes by the deadline;
each change is logged as "fit-deadline: max_steps A -> B at step S" and can be
replayed exactly with --max-steps-at S:B,... (what the model card's command does).

Usage: /usr/bin/python3 tools/train/train.py --data .deps/corpus --out /var/cache/kvq/train/run
"""
import argparse
import datetime as dt
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_io import load_hf_folder  # noqa: E402
from model import Qwen2Config, Qwen2ForCausalLM  # noqa: E402


def get_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=".deps/corpus", help="folder with train.bin / valid.bin (uint16)")
    ap.add_argument("--out", default="/var/cache/kvq/train/run", help="checkpoint + log folder")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--seq", type=int, default=1024, help="training window (tokens)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=0, help="if >0, overrides --max-steps")
    ap.add_argument("--deadline", default="", help="UTC 'YYYY-mm-ddTHH:MM': stop (and checkpoint) by then")
    ap.add_argument("--time-budget", type=float, default=0, help="seconds from start of this process")
    ap.add_argument("--fit-deadline", action="store_true", help="fit the schedule length to the deadline at the measured speed (<= --max-steps)")
    ap.add_argument("--max-steps-at", default="",
                    help="replay schedule changes of a --fit-deadline run: 'STEP:MAX_STEPS,...'")
    ap.add_argument("--ckpt-every", type=float, default=600, help="seconds between checkpoints")
    ap.add_argument("--eval-every", type=int, default=100, help="steps between validation evals")
    ap.add_argument("--eval-tokens", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--threads-file", default="",
                    help="file holding a thread count, re-read every step: lets a shared machine lend a core "
                         "to other work mid-run (`echo 1 > FILE`; 0 pauses) without losing the run; changes "
                         "are logged. Results stay equal in distribution, not bit-exact, across changes")
    ap.add_argument("--init-from", default="",
                    help="HF model folder (e.g. an earlier export) whose weights start a NEW run; the "
                         "architecture flags must match it. Ignored when resuming from --out/ckpt.pt")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: forward/backward matmuls in bfloat16 (oneDNN; ~3x f32 on AVX512-BF16 CPUs); "
                         "weights, optimizer state and validation stay float32")
    ap.add_argument("--bench", type=int, default=0, help="time N steps, print tokens/s, save nothing")
    return ap.parse_args(argv)


def config_from_args(a):
    return Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                       num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                       max_position_embeddings=a.seq, rope_theta=a.rope_theta)


def load_tokens(path):
    return np.fromfile(path, dtype="<u2").astype(np.int64)


def batch_at(tokens, step, a):
    """Random windows for step `step`; depends only on (seed, step): resumable."""
    rng = np.random.default_rng([a.seed, step])
    starts = rng.integers(0, len(tokens) - a.seq - 1, size=a.batch)
    x = np.stack([tokens[s:s + a.seq + 1] for s in starts])
    x = torch.from_numpy(x)
    return x[:, :-1], x[:, 1:]


def lr_at(step, max_steps, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = min(1.0, (step - a.warmup) / max(1, max_steps - a.warmup))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def evaluate(model, tokens, seq, n_tokens, batch):
    """Mean next-token loss over the first n_tokens of `tokens`, in non-overlapping windows."""
    model.eval()
    n_win = min(n_tokens // seq, (len(tokens) - 1) // seq)
    total, count = 0.0, 0
    for i in range(0, n_win, batch):
        rows = [tokens[w * seq: w * seq + seq + 1] for w in range(i, min(n_win, i + batch))]
        x = torch.from_numpy(np.stack(rows))
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += x[:, 1:].numel()
    model.train()
    return total / count


def make_optimizer(model, a):
    # No weight decay on norms and biases (1-D tensors).
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)


def read_threads_file(path):
    try:
        with open(path) as f:
            return int(f.read().strip() or -1)
    except (OSError, ValueError):
        return -1


def apply_threads_file(path, log):
    """N > 0: train on N threads; 0: pause (e.g. while a benchmark needs the machine) until the
    file says N > 0 again. Called before a step's clock starts, so a pause never counts as step
    time (--fit-deadline then only sees the wall-clock deadline come closer)."""
    wanted = read_threads_file(path)
    if wanted == 0:
        log(f"paused ({path} says 0)")
        while wanted == 0:
            time.sleep(5)
            wanted = read_threads_file(path)
        log(f"resumed ({path} says {wanted})")
    if wanted > 0 and wanted != torch.get_num_threads():
        log(f"threads {torch.get_num_threads()} -> {wanted} (from {path})")
        torch.set_num_threads(wanted)


def save_ckpt(path, model, opt, step, max_steps, a, cfg):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "max_steps": max_steps,
                "args": vars(a), "config": cfg.to_dict()}, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-save never corrupts the last checkpoint


def main():
    a = get_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    log_f = open(os.path.join(a.out, "train.log"), "a") if not a.bench else None
    metrics_f = open(os.path.join(a.out, "metrics.jsonl"), "a") if not a.bench else None

    def log(msg):
        line = f"{dt.datetime.utcnow():%H:%M:%S} {msg}"
        print(line, flush=True)
        if log_f:
            log_f.write(line + "\n")
            log_f.flush()

    cfg = config_from_args(a)
    model = Qwen2ForCausalLM(cfg)
    opt = make_optimizer(model, a)
    train = load_tokens(os.path.join(a.data, "train.bin"))
    valid = load_tokens(os.path.join(a.data, "valid.bin"))
    tokens_per_step = a.batch * a.seq
    max_steps = a.max_tokens // tokens_per_step if a.max_tokens else a.max_steps
    step = 0
    ckpt = os.path.join(a.out, "ckpt.pt")
    if os.path.exists(ckpt) and not a.bench:
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, max_steps = state["step"], min(max_steps, state["max_steps"])
        log(f"resumed from {ckpt} at step {step} (max_steps {max_steps})")
    elif a.init_from and not a.bench:
        init = load_hf_folder(a.init_from)
        if init.cfg.to_dict() != cfg.to_dict():
            raise SystemExit(f"--init-from {a.init_from}: config {init.cfg.to_dict()} != flags {cfg.to_dict()}")
        model.load_state_dict(init.state_dict())
        log(f"initialized weights from {a.init_from} (fresh optimizer state, step 0)")
    log(f"config {json.dumps(cfg.to_dict())}")
    log(f"params {model.num_params():,}  train tokens {len(train):,}  valid tokens {len(valid):,}  "
        f"tokens/step {tokens_per_step}  max_steps {max_steps}")
    log(f"args {json.dumps(vars(a))}")

    start = time.time()
    deadline = None
    if a.deadline:
        deadline = dt.datetime.strptime(a.deadline, "%Y-%m-%dT%H:%M").replace(tzinfo=dt.timezone.utc).timestamp()
    if a.time_budget:
        deadline = min(deadline or float("inf"), start + a.time_budget)
    last_ckpt = time.time()
    step_times = []
    replay = dict(tuple(map(int, kv.split(":"))) for kv in a.max_steps_at.split(",") if kv)
    if step in replay:
        # A change at exactly the resume step (e.g. extending a finished run) applies now;
        # an uninterrupted run applies it at the same point: right after step `step`.
        log(f"replay: max_steps {max_steps} -> {replay[step]} at step {step}")
        max_steps = replay[step]
    model.train()
    while step < max_steps:
        if a.threads_file:
            apply_threads_file(a.threads_file, log)
        t0 = time.time()
        lr = lr_at(step, max_steps, a)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch_at(train, step, a)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip).item()
        opt.step()
        step += 1
        dt_step = time.time() - t0
        step_times.append(dt_step)
        tps = tokens_per_step / dt_step
        log(f"step {step} loss {loss.item():.4f} lr {lr:.2e} gnorm {gnorm:.2f} tok/s {tps:.0f}")
        if a.bench:
            if step >= a.bench:
                tail = step_times[1:] or step_times
                log(f"bench: {tokens_per_step * len(tail) / sum(tail):.0f} tokens/s (excluding first step)")
                return
            continue
        metrics_f.write(json.dumps({"step": step, "tokens": step * tokens_per_step, "loss": loss.item(), "lr": lr,
                                    "tok_s": tps, "time": time.time()}) + "\n")
        metrics_f.flush()

        now = time.time()
        if step in replay:
            log(f"replay: max_steps {max_steps} -> {replay[step]} at step {step}")
            max_steps = replay[step]
        if deadline and a.fit_deadline and len(step_times) >= 10 and step % 10 == 0:
            # Fit the schedule to the deadline (keep 3 min for the final save/eval) at the speed of the
            # last 100 steps: shorten it when the CPU is busier, lengthen it (never beyond --max-steps)
            # when it gets quieter. Changes under 5% are ignored so the LR curve does not jitter.
            per_step = sum(step_times[-100:]) / len(step_times[-100:])
            fit = min(a.max_steps, step + int((deadline - now - 180) / per_step))
            if abs(fit - max_steps) > 0.05 * max_steps and step % 50 == 0 or fit < step + 10 < max_steps:
                log(f"fit-deadline: max_steps {max_steps} -> {max(step, fit)} at step {step}")
                max_steps = max(step, fit)
        if step % a.eval_every == 0 or step == max_steps:
            vl = evaluate(model, valid, a.seq, a.eval_tokens, a.batch)
            log(f"eval step {step} valid_loss {vl:.4f} valid_ppl {math.exp(vl):.2f}")
            metrics_f.write(json.dumps({"step": step, "tokens": step * tokens_per_step, "valid_loss": vl}) + "\n")
            metrics_f.flush()
        if now - last_ckpt >= a.ckpt_every or step == max_steps:
            save_ckpt(ckpt, model, opt, step, max_steps, a, cfg)
            last_ckpt = time.time()
            log(f"checkpoint step {step} -> {ckpt}")
        if deadline and time.time() >= deadline and step < max_steps:
            save_ckpt(ckpt, model, opt, step, max_steps, a, cfg)
            log(f"deadline reached at step {step}/{max_steps}; checkpoint saved, stopping")
            return
    log(f"done: {step} steps, {step * tokens_per_step:,} tokens, {time.time() - start:.0f}s in this process")


if __name__ == "__main__":
    main()
