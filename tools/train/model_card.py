"""Model card (README.md) and loss curve for an exported model, from the training
folder's train.log / metrics.jsonl, the corpus' sources.json and evaluate.py's results."""
import json
import os
import re
import subprocess

import numpy as np

# Arguments that only control when/how a run stops or reports; left out of the
# reproduction command (the schedule changes are replayed with --max-steps-at).
_RUNTIME_ARGS = {"deadline", "time_budget", "fit_deadline", "bench", "max_steps_at", "ckpt_every",
                 "threads_file"}


def training_summary(log_path):
    """Parse a train.log: args, schedule changes, and the final line."""
    args, changes, last_step, final = None, [], 0, None
    with open(log_path) as f:
        for line in f:
            body = line.split(" ", 1)[1].strip() if " " in line else line
            if body.startswith("args ") and args is None:
                args = json.loads(body[5:])
            m = re.match(r"resumed from .* at step (\d+)", body)
            if m:  # schedule changes logged after the checkpoint were undone by the resume
                changes = [c for c in changes if c[0] <= int(m.group(1))]
            m = re.match(r"step (\d+) ", body)
            if m:
                last_step = int(m.group(1))
            m = re.match(r"(?:fit-deadline|replay): max_steps \d+ -> (\d+)(?: at step (\d+))?", body)
            if m:
                changes.append((int(m.group(2) or last_step), int(m.group(1))))
            if body.startswith("done:"):
                final = body
    return args, changes, final


def command(args, changes):
    parts = ["OMP_WAIT_POLICY=PASSIVE GLIBC_TUNABLES=glibc.malloc.hugetlb=1 /usr/bin/python3 tools/train/train.py"]
    for k, v in args.items():
        if k in _RUNTIME_ARGS or (k == "max_tokens" and not v):
            continue
        parts.append(f"--{k.replace('_', '-')} {v}")
    if changes:
        parts.append("--max-steps-at " + ",".join(f"{s}:{m}" for s, m in changes))
    return " \\\n    ".join(parts)


def read_metrics(path):
    train, valid = [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            (valid if "valid_loss" in r else train).append(r)
    return train, valid


def thread_changes(log_path):
    """How often a run's thread count changed (train.py --threads-file logs each change)."""
    with open(log_path) as f:
        return sum(1 for line in f if re.search(r" threads \d+ -> \d+ ", line))


def commit_adding(path):
    """The commit that added a stage's log: the model folder as it stood after that stage (the
    weights the next stage starts from). "" outside a git checkout or before the commit."""
    try:
        out = subprocess.run(["git", "log", "--format=%h", "--diff-filter=A", "-1", "--", os.path.abspath(path)],
                             capture_output=True, text=True, check=False,
                             cwd=os.path.dirname(os.path.abspath(path)))
        return out.stdout.strip()
    except OSError:
        return ""


def load_stages(model_dir):
    """Training stages kept with the model in training/: stageN.train.log + stageN.metrics.jsonl
    (copied from the run folder by evaluate.py --stage N), or stageN.json (a summary, for a stage
    whose logs no longer exist). Each stage continues from the previous stage's weights."""
    folder = os.path.join(model_dir, "training")
    numbers = sorted({int(m.group(1)) for f in os.listdir(folder) if (m := re.match(r"stage(\d+)\.", f))})
    stages, offset = [], 0
    for n in numbers:
        log = os.path.join(folder, f"stage{n}.train.log")
        if os.path.exists(log):
            args, changes, _ = training_summary(log)
            train, valid = read_metrics(os.path.join(folder, f"stage{n}.metrics.jsonl"))
            train = list({r["step"]: r for r in train}.values())  # a resumed run may repeat steps
            valid = list({r["step"]: r for r in valid}.values())
            steps = max(r["step"] for r in train)
            st = {"stage": n, "args": args, "changes": changes, "steps": steps,
                  "tokens": steps * args["batch"] * args["seq"], "train": train, "valid": valid,
                  "median_tok_s": float(np.median([r["tok_s"] for r in train])),
                  "final_train_loss": float(np.mean([r["loss"] for r in train][-25:])),
                  "final_valid_loss": valid[-1]["valid_loss"] if valid else float("nan"), "note": "",
                  "thread_changes": thread_changes(log)}
        else:
            with open(os.path.join(folder, f"stage{n}.json")) as f:
                st = json.load(f)
            st.update(train=[], valid=[], changes=[tuple(c) for c in st["changes"]])
        if not st.get("weights_commit"):
            st["weights_commit"] = commit_adding(os.path.join(folder, f"stage{n}.train.log"))
        st["token_offset"] = offset
        offset += st["tokens"]
        stages.append(st)
    return stages


def loss_curve(path, stages):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    train = [dict(r, tokens=r["tokens"] + s["token_offset"]) for s in stages for r in s["train"]]
    valid = [dict(r, tokens=r["tokens"] + s["token_offset"]) for s in stages for r in s["valid"]]
    x = np.array([r["tokens"] for r in train]) / 1e6
    y = np.array([r["loss"] for r in train])
    w = min(25, len(y))
    smooth = np.convolve(y, np.ones(w) / w, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(x, y, color="#bbb", lw=0.6, label="train (per step)")
    ax.plot(x[w - 1:], smooth, color="C0", lw=1.5, label=f"train ({w}-step mean)")
    if valid:
        ax.plot([r["tokens"] / 1e6 for r in valid], [r["valid_loss"] for r in valid], "o-", color="C3", label="validation")
    for st in stages[1:]:
        ax.axvline(st["token_offset"] / 1e6, color="#888", ls="--", lw=0.8)
        ax.text(st["token_offset"] / 1e6, ax.get_ylim()[1], f" stage {st['stage']}", va="top", fontsize=8)
    missing = [st["stage"] for st in stages if not st["train"]]
    for st in stages:
        if not st["train"]:
            ax.plot([(st["token_offset"] + st["tokens"]) / 1e6], [st["final_valid_loss"]], "s", color="C3", mfc="none",
                    label=f"validation at the end of stage {st['stage']}")
    ax.set_xlabel("training tokens (millions)" +
                  (f"; stage {', '.join(map(str, missing))} log lost, only its length is shown" if missing else ""))
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(max(0, min(y.min(), smooth.min()) - 0.3), min(9.5, float(y.max()) + 0.2))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def stage_row(st):
    lr = st["args"]["lr"]
    return (f"| {st['stage']} | {'from scratch' if st['stage'] == 1 else 'stage ' + str(st['stage'] - 1) + ' weights'} "
            f"| {st['steps']:,} | {st['tokens']:,} | {lr} | {st['args']['seed']} | {st['args'].get('autocast', 'none')} "
            f"| {st['median_tok_s']:.0f} | {st['final_train_loss']:.3f} | {st['final_valid_loss']:.3f} |")


def stage_command(st, previous):
    init = ""
    if previous:
        commit = previous.get("weights_commit") or "<the commit that added them>"
        init = (f"# stage {st['stage']} starts from stage {previous['stage']}'s weights, the model folder as "
                f"committed after it:\nmkdir -p /tmp/stage{previous['stage']} && git archive {commit} "
                f"models/kvq-tiny-qwen2 | tar -x -C /tmp/stage{previous['stage']}\n")
    args = dict(st["args"])
    if args.get("init_from"):
        args["init_from"] = f"/tmp/stage{st['stage'] - 1}/models/kvq-tiny-qwen2"
    if st["stage"] > 1:
        args["out"] = f"/var/cache/kvq/train/run{st['stage']}"
    note = ""
    if st.get("thread_changes"):
        note = (f"# (this stage lent a core to other work {st['thread_changes']} times through --threads-file, "
                f"so its replay is equal in distribution, not bit-exact)\n")
    return init + note + command(args, st["changes"])


def write(model_dir, corpus, res):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(corpus, "sources.json")) as f:
        sources = json.load(f)
    stages = load_stages(model_dir)
    loss_curve(os.path.join(model_dir, "loss_curve.png"), stages)
    args = stages[-1]["args"]
    tokens = sum(st["tokens"] for st in stages)
    final_train, final_valid = stages[-1]["final_train_loss"], stages[-1]["final_valid_loss"]
    n_params = sum(int(np.prod(s)) for s in _shapes(cfg))
    st = sources["stats"]
    train_tokens = os.path.getsize(os.path.join(corpus, "train.bin")) // 2
    stage_rows = "\n".join(stage_row(st) for st in stages)
    stage_notes = "".join(f"\n\nStage {st['stage']}: {st['note']}" for st in stages if st.get("note"))
    commands = "\n".join(stage_command(st, stages[i - 1] if i else None) for i, st in enumerate(stages))
    r = res
    ok = r["ratio_transformer_to_bigram_ppl"] <= 0.5
    under = (f" The model is under-trained: {tokens:,} tokens ({tokens / train_tokens:.2f} epochs) so far, on a "
             "shared 2-core CPU. Another stage (see `tools/train/README.md`) is the way to improve it; the numbers "
             "here are honest numbers for this checkpoint.")
    src_rows = "\n".join(f"| {s['name']} | {s['package']} | {s['license']} |" for s in sources["sources"])
    samples = "\n\n".join(f"**{s['mode']}** — prompt `{s['prompt']}`:\n\n> {s['text'].replace(chr(10), ' ')}"
                          for s in r["samples"])
    text = f"""# kvq-tiny-qwen2

A **tiny** ({n_params / 1e6:.1f}M parameters) language model in the exact Hugging Face
`Qwen2ForCausalLM` layout, trained from scratch by kvq on ~{st['train']['words'] / 1e6:.1f}M words of
public-domain / permissively licensed English. It exists so that kvq's KV-cache
experiments run on keys and values produced by real training, and as a PyTorch
correctness reference. It is **not** a useful assistant: it writes English-looking
phrases with little coherence. Point kvq at your own Qwen2/Qwen2.5/Llama folder or
GGUF with `-m` for real work.

## Architecture (`config.json`)

| field | value |
|---|---|
| layers | {cfg['num_hidden_layers']} |
| hidden size | {cfg['hidden_size']} |
| attention heads / KV heads | {cfg['num_attention_heads']} / {cfg['num_key_value_heads']} (GQA, head_dim {cfg['hidden_size'] // cfg['num_attention_heads']}) |
| MLP (SwiGLU) intermediate | {cfg['intermediate_size']} |
| vocabulary | {cfg['vocab_size']} (byte-level BPE, Qwen2 pre-tokenizer regex, specials `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) |
| context (trained) | {cfg['max_position_embeddings']} |
| RoPE theta | {cfg['rope_theta']} |
| RMSNorm eps | {cfg['rms_norm_eps']} |
| QKV bias / tied embeddings | yes / yes |
| weights | float32 safetensors |

## Data

Split by whole documents (seed {sources['seed']}): train {st['train']['documents']} documents /
{st['train']['words']:,} words, validation {st['valid']['documents']} / {st['valid']['words']:,},
test {st['test']['documents']} / {st['test']['words']:,}. The test split holds a whole book
never seen in training (*The Adventures of Tom Sawyer*) plus whole State of the Union
addresses and Brown corpus samples (lists in `.deps/corpus/split.json`; SHA-256 of every
input file in `.deps/corpus/sources.json`, both written by `tools/train/build_corpus.py`).

| source | package | license |
|---|---|---|
{src_rows}

## Training

Plain PyTorch {_torch_version()} on a shared 2-core CPU: AdamW (β 0.9/0.95, weight decay
{args['weight_decay']}), {args['warmup']} warm-up steps then cosine decay to {args['min_lr_frac']}× of the peak LR,
gradient clip {args['clip']}, batch {args['batch']} × {args['seq']} tokens. Training ran in stages (one per work
session, since a session may end mid-run); each stage after the first starts from the previous stage's exported
weights with a fresh optimizer and its own seed (so it draws different windows) and schedule.
"bf16" stages ran matmuls under `torch.autocast` bfloat16 (weights, optimizer and validation in float32).
Total: {tokens:,} tokens ({tokens / train_tokens:.2f} epochs of the {train_tokens:,}-token train split).
Final train loss {final_train:.3f} (mean of the last 25 steps), validation loss {final_valid:.3f}.

| stage | starts from | steps | tokens | peak LR | seed | matmuls | median tokens/s | final train loss | final valid loss |
|---|---|---|---|---|---|---|---|---|---|
{stage_rows}{stage_notes}

![loss curve](loss_curve.png)

Commands (`--max-steps-at` replays the schedule changes `--fit-deadline` made to finish by a deadline; re-running
a stage's command resumes from the last checkpoint in its `--out`; data order depends only on seed and step):

```
/usr/bin/python3 tools/train/build_corpus.py .deps
/usr/bin/python3 tools/train/train_tokenizer.py --corpus .deps/corpus
{commands}
/usr/bin/python3 tools/train/export.py --ckpt /var/cache/kvq/train/run{len(stages)}/ckpt.pt --out models/kvq-tiny-qwen2 --golden tests/golden/kvq-tiny-qwen2.golden
/usr/bin/python3 tools/train/evaluate.py --model models/kvq-tiny-qwen2 --run /var/cache/kvq/train/run{len(stages)} --stage {len(stages)}
```
(Debian's `/usr/bin/python3` with `python3-torch`, `python3-numpy`, `python3-regex`,
`python3-matplotlib`. The two environment variables only change speed on a busy CPU:
passive OpenMP waiting and huge pages for large allocations. Bit-exact reproduction
also needs the same thread count, 2.)

## Held-out test perplexity

Whole test split ({r['test_tokens_predicted']:,} predicted tokens, {r['test_words']:,} words,
{r['tokens_per_word']:.3f} tokens/word), non-overlapping {r['window']}-token windows. The baselines
use the same tokenizer and predict the same tokens; their add-k constants were chosen on
the validation split.

| model | PPL per token | PPL per word |
|---|---|---|
| unigram (add-k, k={r['unigram_k']:.3g}) | {r['unigram']['ppl_per_token']:.1f} | {r['unigram']['ppl_per_word']:.1f} |
| bigram (add-k, k={r['bigram_k']:.3g}) | {r['bigram']['ppl_per_token']:.1f} | {r['bigram']['ppl_per_word']:.1f} |
| **kvq-tiny-qwen2** | **{r['transformer']['ppl_per_token']:.1f}** | **{r['transformer']['ppl_per_word']:.1f}** |

Transformer / bigram perplexity ratio: **{r['ratio_transformer_to_bigram_ppl']:.3f}**
(quality bar ≤ 0.5: {'met' if ok else 'NOT met'}).{'' if ok else under}

## Sample generations (PyTorch reference, 48 new tokens)

{samples}

## Files

`config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json` (ChatML
template as in Qwen2, although this base model was never trained on chat data),
`generation_config.json`, `eval.json` (all numbers above), `loss_curve.png`. The golden
reference outputs for kvq's tests are in `tests/golden/kvq-tiny-qwen2.golden`
(format: `tools/train/README.md`).
"""
    with open(os.path.join(model_dir, "README.md"), "w") as f:
        f.write(text)


def _shapes(cfg):
    h, i, v, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hd = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    per_layer = [(h, h), (h,), (kv, h), (kv,), (kv, h), (kv,), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
    return [(v, h), (h,)] + per_layer * L


def _torch_version():
    import torch
    return torch.__version__
