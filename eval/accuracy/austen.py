"""austen-d128: the project's small byte-level Llama (14.4 M parameters) on numpy fp32.

Why: a real trained model whose held-out text (Persuasion) and reference numbers are known, so
KV-cache quantization can be scored on real activations on any CPU. The model files are not part
of the repository: they are read from the `model_dir` argument or KVARN_AUSTEN_DIR (default: the
development machines' copy, DEFAULT_DIR below). Tokens are bytes (token id = byte value), no BOS.

Windows: `score_windows(model, text, window, n)` scores the n consecutive, non-overlapping
windows text[w*window : (w+1)*window] for w < n, from the start of persuasion.txt; each window
is a fresh sequence and contributes window-1 next-byte predictions.

`python -m eval.accuracy.austen --check [--threads N|auto]` prints the validation numbers.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

import numpy as np

from . import llama_np
from .llama_np import LlamaConfig, LlamaModel, fp16_kv

DEFAULT_DIR = "/work/shared/data/austen-d128"
KV_DUMP = "kv-persuasion-100000-1024.safetensors"


def model_dir(path: Optional[str] = None) -> str:
    return path or os.environ.get("KVARN_AUSTEN_DIR") or DEFAULT_DIR


def load_model(path: Optional[str] = None) -> LlamaModel:
    """Load config + the two fp16 safetensors shards (widened to fp32)."""
    d = model_dir(path)
    with open(os.path.join(d, "austen-d128.config.json")) as f:
        cj = json.load(f)
    cfg = LlamaConfig(dim=cj["dim"], n_layers=cj["n_layers"], n_heads=cj["n_heads"],
                      n_kv_heads=cj["n_kv_heads"], head_dim=cj["head_dim"],
                      hidden=cj["hidden"], rope_theta=float(cj["rope_theta"]),
                      norm_eps=float(cj["norm_eps"]), vocab=cj["vocab"])
    t = {}
    for shard in cj["shards"]:
        t.update(llama_np.read_safetensors(os.path.join(d, shard)))
    t = {k: v.astype(np.float32) for k, v in t.items()}
    layers = []
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        layers.append({n: t[p + n + ".weight"] for n in
                       ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w1", "w3", "w2")})
    return LlamaModel(cfg, dict(embed=t["embed.weight"], norm=t["norm.weight"],
                                head=t.get("head.weight"), layers=layers))


def read_text(path: Optional[str] = None) -> bytes:
    """The held-out text, persuasion.txt, as bytes."""
    with open(os.path.join(model_dir(path), "persuasion.txt"), "rb") as f:
        return f.read()


def tokens_of(text_bytes: bytes) -> np.ndarray:
    return np.frombuffer(text_bytes, dtype=np.uint8).astype(np.int64)


def score_windows(model: LlamaModel, text_bytes: bytes, window: int, n_windows: int,
                  kv_quantizer=None, tile_tokens: int = 128, sink_tiles: int = 1,
                  **kw) -> dict:
    """Bits per byte over n_windows consecutive windows of `window` bytes from the start of
    text_bytes (offset=, stride= and the other options of llama_np.score_windows pass through,
    e.g. reference="exact" or keep_logprobs=True for KL / top-1 agreement)."""
    return llama_np.score_windows(model, tokens_of(text_bytes), window, n_windows,
                                  kv_quantizer=kv_quantizer, tile_tokens=tile_tokens,
                                  sink_tiles=sink_tiles, **kw)


def dump_kv(model: LlamaModel, text_bytes: Optional[bytes] = None, offset: int = 100000,
            length: int = 1024, path: Optional[str] = None, compare: bool = True) -> dict:
    """The model's own q, k, v (post-RoPE q and k, positions 0..length-1) for
    text[offset:offset+length] run as a fresh sequence, stacked over layers:
    q [L, Hq, T, D], k and v [L, Hk, T, D] float32, plus tokens. With compare=True and the
    default window, also loads the reference dump kv-persuasion-100000-1024.safetensors and
    adds 'ref_k', 'ref_v' (fp16 widened) and 'k_diff', 'v_diff' (llama_np.rel_diff dicts)."""
    text_bytes = read_text(path) if text_bytes is None else text_bytes
    toks = tokens_of(text_bytes[offset:offset + length])
    _, qkv = model.forward(toks, return_qkv=True)
    out = {"q": np.stack([x[0] for x in qkv]), "k": np.stack([x[1] for x in qkv]),
           "v": np.stack([x[2] for x in qkv]), "tokens": toks}
    ref_path = os.path.join(model_dir(path), KV_DUMP)
    if compare and offset == 100000 and length == 1024 and os.path.exists(ref_path):
        ref = llama_np.read_safetensors(ref_path)
        if not np.array_equal(ref["tokens"].astype(np.int64), toks):
            raise ValueError("reference dump tokens differ from text[offset:offset+length]")
        out["ref_k"] = ref["k"].astype(np.float32)
        out["ref_v"] = ref["v"].astype(np.float32)
        out["k_diff"] = llama_np.rel_diff(out["k"], out["ref_k"])
        out["v_diff"] = llama_np.rel_diff(out["v"], out["ref_v"])
        out["k_diff_fp16"] = llama_np.rel_diff(out["k"].astype(np.float16), out["ref_k"])
        out["v_diff_fp16"] = llama_np.rel_diff(out["v"].astype(np.float16), out["ref_v"])
    return out


def check(n_windows_2048: int = 64, n_windows_1024: int = 64) -> int:
    """Validation: self-check of the hook on this model, KV dump comparison, bits/byte with an
    exact cache (2048-byte windows) and with an fp16 cache under decode semantics (1024)."""
    t0 = time.time()
    model = load_model()
    text = read_text()
    print(f"austen-d128 loaded from {model_dir()} ({time.time() - t0:.1f}s), "
          f"persuasion.txt {len(text)} bytes")

    t = time.time()
    print("decode-semantics self-check (window of 424 bytes at offset 5000, G=128, sink=1):")
    ok = llama_np.self_check(model, tokens_of(text[5000:5424]), tile_tokens=128, sink_tiles=1)
    print(f"  {time.time() - t:.1f}s")

    t = time.time()
    d = dump_kv(model, text)
    per_layer = [llama_np.rel_diff(d["k"][i], d["ref_k"][i])["max_rel"]
                 for i in range(d["k"].shape[0])]
    print(f"kv dump vs {KV_DUMP} ({time.time() - t:.1f}s):")
    for n in ("k", "v"):
        x = d[n + "_diff"]
        print(f"  {n}: max|diff|={x['max_abs']:.4g}  max|diff|/max|ref|={x['max_rel']:.3e}  "
              f"||diff||/||ref||={x['fro_rel']:.3e}   (ours rounded to fp16: "
              f"max_rel={d[n + '_diff_fp16']['max_rel']:.3e})")
    print("  k max_rel per layer: " + " ".join(f"{e:.2e}" for e in per_layer))
    ok &= d["k_diff"]["fro_rel"] < 1e-2 and d["v_diff"]["fro_rel"] < 1e-2

    r = score_windows(model, text, 2048, n_windows_2048)
    print(f"exact fp32 cache, {n_windows_2048} windows x 2048 bytes from offset 0 "
          f"({r['n_predicted']} predictions): {r['bits_per_byte']:.4f} bits/byte "
          f"(reference 1.585)  [{r['seconds']:.1f}s]")
    ok &= abs(r["bits_per_byte"] - 1.585) < 0.02

    r16 = score_windows(model, text, 1024, n_windows_1024, kv_quantizer=fp16_kv,
                        reference="exact")
    print(f"fp16 cache (decode semantics, G=128, sink tile exact), {n_windows_1024} windows x "
          f"1024 bytes from offset 0 ({r16['n_predicted']} predictions): "
          f"{r16['bits_per_byte']:.4f} bits/byte (reference 1.6168); exact cache on the same "
          f"windows {r16['ref_bits_per_byte']:.4f}; KL(exact||fp16) {r16['kl_nats']:.2e} nats, "
          f"top-1 agreement {r16['top1_agreement']:.5f}  [{r16['seconds']:.1f}s]")
    print(f"total {time.time() - t0:.1f}s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(llama_np.check_main(sys.argv, check, __doc__))
