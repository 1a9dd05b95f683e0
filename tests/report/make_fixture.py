#!/usr/bin/env python3
"""Writes tests/report/study_fixture.json: a FIXTURE for the HTML report tests.

The numbers are synthetic (seeded random values shaped like a `kvq study` of
the default model: 4 layers, 2 KV heads, head_dim 64), NOT measurements. They
exist so the renderer and its headless-Chromium test can run before, and
independently of, the study engine. Schema: STUDY_SCHEMA.md (version 1).

    /usr/bin/python3 tests/report/make_fixture.py > tests/report/study_fixture.json
"""
import json
import math
import random

rng = random.Random(7)
LAYERS, HEADS, KV_HEADS, HEAD_DIM, CTX = 4, 6, 2, 64, 1024
HALF = HEAD_DIM // 2


def r(x, digits=4):
    return float(f"{x:.{digits}g}")


def outlier_layer(layer):
    pre, post, v, channels, consistency = [], [], [], [], []
    for h in range(KV_HEADS):
        base = [abs(rng.gauss(1.0, 0.25)) + 0.2 for _ in range(HEAD_DIM)]
        out = sorted(rng.sample(range(HEAD_DIM), 2 if layer in (0, LAYERS - 1) else 1))
        for c in out:
            base[c] *= rng.uniform(6, 12)
        # Rotate-half RoPE mixes channel c with c +- 32: the pair shares the magnitude.
        rotated = [math.hypot(base[c], base[(c + HALF) % HEAD_DIM]) / math.sqrt(2)
                   for c in range(HEAD_DIM)]
        pre.append([r(x) for x in base])
        post.append([r(x * rng.uniform(0.95, 1.05)) for x in rotated])
        v.append([r(abs(rng.gauss(0.6, 0.1)) + 0.1) for _ in range(HEAD_DIM)])
        channels.append(out)
        consistency.append(r(rng.uniform(0.8, 0.99), 3))
    return {"layer": layer, "k_pre_rope_channel_absmax": pre, "k_post_rope_channel_absmax": post,
            "v_channel_absmax": v, "k_pre_rope_outlier_channels": channels,
            "k_outlier_consistency": consistency, "sink_mass": r(rng.uniform(0.2, 0.6), 3)}


def fake_quant_rows():
    rows = []
    # (name, k_axis, v_axis): per-channel K beats per-token K; V per-token beats per-channel.
    for name, k_axis, v_axis in [("K per-token, V per-token", "token", "token"),
                                 ("K per-channel, V per-channel", "channel", "channel"),
                                 ("K per-channel, V per-token", "channel", "token"),
                                 ("K per-token, V per-channel", "token", "channel"),
                                 ("K per-token, V per-token (literal formula)", "token", "token")]:
        literal = "literal" in name
        for bits in (2, 4):
            eff_bits = bits + 1 if literal else bits
            k_err = (0.62 if k_axis == "channel" else 0.79) * 2 ** (-(eff_bits - 2) * 0.95)
            v_err = (0.30 if v_axis == "token" else 0.45) * 2 ** (-(eff_bits - 2) * 0.95)
            per_layer = []
            for layer in range(LAYERS):
                bump = 1.6 if layer in (0, LAYERS - 1) and k_axis == "token" else 1.0
                s = k_err * bump * rng.uniform(0.85, 1.15)
                per_layer.append({"layer": layer, "score_rel_error": r(s),
                                  "prob_kl": r(0.2 * s * s * rng.uniform(0.8, 1.2)),
                                  "output_rel_error": r(math.hypot(0.5 * s, v_err))})
            rows.append({"name": name, "k_axis": k_axis, "v_axis": v_axis,
                         "literal_formula": literal, "bits": bits,
                         "score_rel_error": r(sum(p["score_rel_error"] for p in per_layer) / LAYERS),
                         "prob_kl": r(sum(p["prob_kl"] for p in per_layer) / LAYERS),
                         "output_rel_error": r(sum(p["output_rel_error"] for p in per_layer) / LAYERS),
                         "per_layer": per_layer})
    return rows


F16_BYTES = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2  # 2048 bytes per token
# (name, k, v, rotate, bytes/token, ppl delta, kl_mean, recall failure rate)
SCHEMES = [
    ("f16", "f16", "f16", False, 2048, 0.0, 0.0, 0.0),
    ("bf16", "bf16", "bf16", False, 2048, 0.01, 2.1e-5, 0.0),
    ("fp8_e4m3", "fp8_e4m3", "fp8_e4m3", False, 1024 + 16, 0.05, 4.0e-4, 0.0),
    ("int8", "int8", "int8", False, 1088, 0.01, 6.0e-5, 0.0),
    ("int4", "int4", "int4", False, 576, 0.35, 8.0e-3, 0.05),
    ("int4+rot", "int4", "int4", True, 576, 0.21, 4.5e-3, 0.0),
    ("int2", "int2", "int2", False, 320, 9.8, 0.41, 0.7),
    ("int2+rot", "int2", "int2", True, 320, 4.1, 0.19, 0.45),
    ("kivi4", "kivi4", "kivi4", False, 640, 0.12, 2.2e-3, 0.0),
    ("kivi2", "kivi2", "kivi2", False, 384, 1.3, 0.045, 0.15),
    ("kvquant4", "kvquant4", "kvquant4", False, 600, 0.08, 1.6e-3, 0.0),
    ("kvquant3", "kvquant3", "kvquant3", False, 472, 0.3, 6.5e-3, 0.05),
    ("kvquant2", "kvquant2", "kvquant2", False, 352, 1.1, 0.038, 0.1),
    ("gear4", "gear4", "gear4", False, 700, 0.1, 1.9e-3, 0.0),
    ("gear2", "gear2", "gear2", False, 450, 0.9, 0.03, 0.1),
]


def schemes():
    out = []
    base_ppl = 31.42
    for name, k, v, rot, nbytes, dppl, kl, fail in SCHEMES:
        recall = []
        for ctx in (256, 512, 1024):
            for depth in (0.1, 0.5, 0.9):
                p_fail = min(1.0, fail * (ctx / 512) * (1.2 if depth < 0.3 else 1.0))
                correct = sum(rng.random() >= p_fail for _ in range(4))
                recall.append({"context": ctx, "depth": depth, "correct": correct, "trials": 4})
        out.append({"name": name, "k_type": k, "v_type": v, "rotate": rot,
                    "bits_per_value": r(nbytes * 8 / (2 * LAYERS * KV_HEADS * HEAD_DIM)),
                    "bytes_per_token": float(nbytes),
                    "compression_vs_f16": r(F16_BYTES / nbytes),
                    "ppl": r(base_ppl + dppl, 5), "ppl_error": 0.61,
                    "kl_mean": r(kl) if kl > 0 else 0.0, "kl_p99": r(kl * 9.5),
                    "top1_agreement": r(1.0 - min(0.6, 2.2 * math.sqrt(kl)), 4),
                    "recall": recall})
    return out


def memory():
    contexts = [512, 1024, 2048, 4096, 8192, 16384, 32768]
    return {"contexts": contexts,
            "series": [{"name": name, "bytes": [nbytes * c for c in contexts]}
                       for name, _, _, rot, nbytes, *_ in SCHEMES if not rot]}


study = {
    "kvq_study_version": 1,
    "fixture_note": "FIXTURE for the report renderer tests: synthetic numbers, not a measurement "
                    "(tests/report/make_fixture.py)",
    "created_utc": "2026-11-30T01:23:45Z",
    "command": "FIXTURE (synthetic numbers for the report test): kvq study --report study.html",
    "quick": False,
    "model": {"path": "models/kvq-tiny-qwen2 [fixture: synthetic numbers]",
              "architecture": "qwen2", "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS,
              "head_dim": HEAD_DIM, "context": CTX, "parameters": 9443200,
              "k_bias_norms": [[r(rng.uniform(1, 3) * (12 if l in (0, LAYERS - 1) else 1), 3)
                                for _ in range(KV_HEADS)] for l in range(LAYERS)]},
    "text": {"path": ".deps/corpus/test.txt", "tokens_used": 4096},
    "outliers": {"capture_tokens": CTX, "layers": [outlier_layer(l) for l in range(LAYERS)]},
    "fake_quant": {"rows": fake_quant_rows()},
    "schemes": schemes(),
    "memory": memory(),
    "timings_seconds": {"capture": 1.2, "fake_quant": 3.4, "end_to_end": 120.0, "total": 130.0},
}
print(json.dumps(study, indent=1))
