"""Model card (README.md) and loss curve for an exported model, from the training
folder's train.log / metrics.jsonl, the corpus' sources.json and evaluate.py's results."""
import json
import os
import re

import numpy as np

# Arguments that only control when/how a run stops or reports; left out of the
# reproduction command (the schedule changes are replayed with --max-steps-at).
_RUNTIME_ARGS = {"deadline", "time_budget", "fit_deadline", "bench", "max_steps_at", "ckpt_every"}


def training_summary(run):
    """Parse train.log: args, schedule changes, and the last checkpointed step."""
    args, changes, last_step, final = None, [], 0, None
    with open(os.path.join(run, "train.log")) as f:
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


def read_metrics(run):
    train, valid = [], []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            (valid if "valid_loss" in r else train).append(r)
    return train, valid


def loss_curve(path, train, valid):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    # A resumed run may repeat steps: keep the last record per step.
    train = list({r["step"]: r for r in train}.values())
    valid = list({r["step"]: r for r in valid}.values())
    x = np.array([r["tokens"] for r in train]) / 1e6
    y = np.array([r["loss"] for r in train])
    w = min(25, len(y))
    smooth = np.convolve(y, np.ones(w) / w, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(x, y, color="#bbb", lw=0.6, label="train (per step)")
    ax.plot(x[w - 1:], smooth, color="C0", lw=1.5, label=f"train ({w}-step mean)")
    if valid:
        ax.plot([r["tokens"] / 1e6 for r in valid], [r["valid_loss"] for r in valid], "o-", color="C3", label="validation")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(max(0, min(y.min(), smooth.min()) - 0.3), min(9.5, float(y.max()) + 0.2))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(model_dir, run, corpus, res):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(corpus, "sources.json")) as f:
        sources = json.load(f)
    args, changes, final = training_summary(run)
    train, valid = read_metrics(run)
    loss_curve(os.path.join(model_dir, "loss_curve.png"), train, valid)
    steps = max(r["step"] for r in train)
    tokens = steps * args["batch"] * args["seq"]
    tps = float(np.median([r["tok_s"] for r in train]))
    final_train = float(np.mean([r["loss"] for r in train][-25:]))
    final_valid = valid[-1]["valid_loss"] if valid else float("nan")
    n_params = sum(int(np.prod(s)) for s in _shapes(cfg))
    st = sources["stats"]
    train_tokens = os.path.getsize(os.path.join(corpus, "train.bin")) // 2
    schedule_note = ("The schedule length changed during the run (shortened to fit a wall-clock deadline by "
                     "`--fit-deadline`, extended when a finished run was continued); the command below "
                     "replays exactly the same schedule with `--max-steps-at`. " if changes else "")
    r = res
    ok = r["ratio_transformer_to_bigram_ppl"] <= 0.5
    under = (f" The model is under-trained: {tokens:,} tokens ({tokens / train_tokens:.2f} epochs) were all "
             "a shared 2-core CPU allowed in one session. Continuing the run (see `tools/train/README.md`) "
             "is the way to improve it; the numbers here are honest numbers for this checkpoint.")
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
{args['weight_decay']}), peak LR {args['lr']}, {args['warmup']} warm-up steps then cosine decay to
{args['min_lr_frac']}×, gradient clip {args['clip']}, batch {args['batch']} × {args['seq']} tokens, seed {args['seed']}.
Steps: {steps} ({tokens:,} tokens, {tokens / train_tokens:.2f} epochs of the {train_tokens:,}-token train split).
Median throughput {tps:.0f} tokens/s (the CPU was shared with C++ builds, so throughput varied a lot).
Final train loss {final_train:.3f} (mean of the last 25 steps), validation loss {final_valid:.3f}.

![loss curve](loss_curve.png)

{schedule_note}Re-running the training command resumes from the last checkpoint in `--out`
(checkpoints every 10 minutes; data order depends only on seed and step):

```
/usr/bin/python3 tools/train/build_corpus.py .deps
/usr/bin/python3 tools/train/train_tokenizer.py --corpus .deps/corpus
{command(args, changes)}
/usr/bin/python3 tools/train/export.py --ckpt {args['out']}/ckpt.pt --out models/kvq-tiny-qwen2 --golden tests/golden/kvq-tiny-qwen2.golden
/usr/bin/python3 tools/train/evaluate.py --model models/kvq-tiny-qwen2 --run {args['out']}
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
