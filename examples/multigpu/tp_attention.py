#!/usr/bin/env python3
"""Tensor-parallel attention over kvarn caches: the KV heads of austen-d128 split across devices.

    python examples/multigpu/tp_attention.py [--devices 0,1] [--model DIR] [--windows N]
                                             [--preset k4v2_g128] [--new-tokens N]

Engines that outgrow one GPU shard attention heads across GPUs (tensor parallelism). Here one
process drives one `kvarn.Context` and one `kvarn.Cache` per device; KV head group i (and the
query heads that read it) lives on device i. Every layer update sends each shard its KV heads,
the attention runs on each device over its own quantized cache, and the head outputs come back
to the first device (where a real engine would run the row-parallel output projection and an
all-reduce; gathering the heads and projecting once is the same arithmetic).

The run checks the sharded model against the same model with one kvarn cache on the first
device: the next-byte log-probabilities over `--windows` windows of persuasion.txt (decode
semantics: tile-aligned chunks, as in examples/python/hf_cache.py) and greedy generations must
agree. Attention of a head depends only on its own KV head, so the only allowed difference is
the order of floating-point sums when the split plan changes with the number of heads per
device. Exit status 0 only if they agree within tolerance.

`--devices 0,0` runs two contexts on one GPU (what a one-GPU machine can check); `--devices 0,1`
is the two-GPU run. Needs torch and transformers (as hf_cache.py). On a multi-GPU host keep
NCCL_NVLS_ENABLE=0 (no multicast objects are created here).
"""

from __future__ import annotations

import argparse
import copy
import math
import pathlib
import sys
import threading
import time
from typing import Any, List, Optional

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import hf_cache as H  # noqa: E402  (the single-device KvarnCache and the model loader)
from transformers.cache_utils import Cache, CacheLayerMixin  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

import kvarn  # noqa: E402

_current = threading.local()


class ShardedLayer(CacheLayerMixin):
    """One layer: forwards each shard its slice of KV heads."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, owner: "ShardedKvarnCache", layer_idx: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer_idx = layer_idx

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        h = self.owner.kv_heads_per_shard
        for i, shard in enumerate(self.owner.shards):
            dev = self.owner.devices[i]
            shard.layers[self.layer_idx].update(
                key_states[:, i * h : (i + 1) * h].to(dev),
                value_states[:, i * h : (i + 1) * h].to(dev),
            )
        _current.cache = self.owner
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.shards[0].layers[self.layer_idx].get_mask_sizes(query_length)

    def get_seq_length(self) -> int:
        return self.owner.shards[0].layers[self.layer_idx].get_seq_length()

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        for shard in self.owner.shards:
            shard.layers[self.layer_idx].reset()


class ShardedKvarnCache(Cache):
    """KV heads split evenly over one kvarn.Cache per context (one context per device)."""

    def __init__(self, model_config: Any, contexts: List[kvarn.Context], devices: List[str],
                 preset: str) -> None:
        hk = model_config.num_key_value_heads
        if hk % len(contexts):
            raise ValueError(f"{hk} KV heads do not split over {len(contexts)} devices")
        self.kv_heads_per_shard = hk // len(contexts)
        self.q_heads_per_shard = model_config.num_attention_heads // len(contexts)
        shard_config = copy.copy(model_config)
        shard_config.num_key_value_heads = self.kv_heads_per_shard
        self.shards = [H.KvarnCache(shard_config, ctx, preset) for ctx in contexts]
        self.devices = devices
        super().__init__(
            layers=[ShardedLayer(self, i) for i in range(model_config.num_hidden_layers)]
        )

    @property
    def batch_size(self) -> int:
        return 1


def tp_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """Each device attends its query heads over its KV heads; outputs gathered on query's device."""
    owner: Optional[ShardedKvarnCache] = getattr(_current, "cache", None)
    if owner is None:
        raise RuntimeError("the 'kvarn_tp' attention needs a ShardedKvarnCache")
    hq = owner.q_heads_per_shard
    outs = []
    for i, shard in enumerate(owner.shards):
        q = query[0, i * hq : (i + 1) * hq].transpose(0, 1).contiguous().to(owner.devices[i])
        outs.append(H.attend(shard, module.layer_idx, q, scaling).to(query.device))
    return torch.cat(outs, dim=1).unsqueeze(0), None  # [1, n, Hq, D]


AttentionInterface.register("kvarn_tp", tp_attention)


@torch.no_grad()
def window_logprobs(model, ids: torch.Tensor, make_cache, chunk: int) -> torch.Tensor:
    kwarg = H.cache_kwarg(model.forward)
    cache = make_cache()
    logits = torch.cat(
        [
            model(ids[:, s : s + chunk], use_cache=True, **{kwarg: cache}).logits.float()
            for s in range(0, ids.shape[1], chunk)
        ],
        dim=1,
    )
    return torch.log_softmax(logits[0], dim=-1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default=None,
                        help="comma-separated CUDA ordinals, one shard each (default: 0,1 with "
                             "two GPUs, else 0,0)")
    parser.add_argument("--model", type=pathlib.Path, default=H.DEFAULT_MODEL)
    parser.add_argument("--preset", default="k4v2_g128")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--tolerance", type=float, default=2e-3,
                        help="max |difference| of next-byte log-probabilities")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("tp_attention: no CUDA device; this example needs one or more GPUs")
        return 2
    ordinals = ([int(d) for d in args.devices.split(",")] if args.devices
                else ([0, 1] if torch.cuda.device_count() >= 2 else [0, 0]))
    devices = [f"cuda:{d}" for d in ordinals]
    contexts = [
        kvarn.Context("cuda", device=d, stream=torch.cuda.current_stream(d).cuda_stream)
        for d in ordinals
    ]
    model = H.load_model(args.model, torch.float32, devices[0])
    g = kvarn.Config.from_preset(args.preset, model.config.head_dim).tile_tokens
    text = (args.model / "persuasion.txt").read_bytes()
    print(f"tp_attention: {len(contexts)} shards on {devices}, {model.config.num_key_value_heads} "
          f"KV heads, preset {args.preset}, kvarn {kvarn.__version__}", flush=True)

    def single():
        return H.KvarnCache(model.config, contexts[0], args.preset)

    def sharded():
        return ShardedKvarnCache(model.config, contexts, devices, args.preset)

    worst, bits = 0.0, {"single": 0.0, "sharded": 0.0}
    count = 0
    start = time.perf_counter()
    for w in range(args.windows):
        ids = torch.tensor([list(text[w * 2048 : (w + 1) * 2048])], device=devices[0])
        H.use_attention(model, "kvarn")
        a = window_logprobs(model, ids, single, g)
        H.use_attention(model, "kvarn_tp")
        b = window_logprobs(model, ids, sharded, g)
        worst = max(worst, (a - b).abs().max().item())
        target = ids[0, 1:, None]
        bits["single"] -= a[:-1].gather(1, target).sum().item() / math.log(2)
        bits["sharded"] -= b[:-1].gather(1, target).sum().item() / math.log(2)
        count += ids.shape[1] - 1
    seconds = time.perf_counter() - start

    prompt = text[4096 : 4096 + 512]
    gens = {}
    for name, attention, make in (("single", "kvarn", single), ("sharded", "kvarn_tp", sharded)):
        H.use_attention(model, attention)
        gens[name] = H.generate(model, prompt, args.new_tokens, make(), g)
    agree = next((i for i, (x, y) in enumerate(zip(gens["single"], gens["sharded"])) if x != y),
                 len(gens["single"]))

    bpb = {k: v / count for k, v in bits.items()}
    print(f"windows {args.windows} x 2048 bytes ({seconds:.1f} s): bits/byte single "
          f"{bpb['single']:.5f}, sharded {bpb['sharded']:.5f}; max |d log p| {worst:.2e} "
          f"(tolerance {args.tolerance:.0e})")
    print(f"greedy generation: {agree}/{len(gens['single'])} bytes identical")
    ok = worst <= args.tolerance and agree == len(gens["single"])
    print("tp_attention: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
