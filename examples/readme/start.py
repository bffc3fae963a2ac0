import numpy as np, kvarn

ctx = kvarn.Context("cpu")
config = kvarn.Config.from_preset("k4v2_g128", head_dim=128)  # 4-bit K, 2-bit V, 128-token tiles
cache = kvarn.Cache(config, num_layers=2, num_kv_heads=2, max_tokens=4096, max_sequences=1,
                    ctx=ctx)  # pools for 4096 tokens of one sequence
print(f"cache: {cache.stats().bytes_capacity} bytes reserved")

rng = np.random.default_rng(0)
cache.add_sequence(42)
for layer in range(2):  # K, V: [n_tokens, Hk, D] as the model produced them (unrotated)
    k = rng.standard_normal((4000, 2, 128), dtype=np.float32)
    v = rng.standard_normal((4000, 2, 128), dtype=np.float32)
    cache.append(42, layer, k, v)

q = rng.standard_normal((1, 8, 128), dtype=np.float32)  # decode: 1 token, 8 query heads (GQA 4)
out = cache.attention(0, [42], q)  # [1, 8, 128]

s = cache.stats()
print(f"{s.tokens} tokens: {s.bytes_used} bytes used, {s.fp16_bytes} as fp16: "
      f"{s.compression_ratio:.2f}x smaller")
