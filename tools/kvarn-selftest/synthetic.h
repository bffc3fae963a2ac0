// Seeded synthetic KV-cache data with the structure of a large model's cache.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#ifndef KVARN_TOOLS_SELFTEST_SYNTHETIC_H_
#define KVARN_TOOLS_SELFTEST_SYNTHETIC_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvarn_selftest {

// splitmix64 (Steele, Lea, Flood 2014): tiny, well mixed, and identical on every platform, so
// the selftest prints the same numbers everywhere for a given seed. std::normal_distribution is
// not used because its output is implementation-defined.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();
  // Uniform in [lo, hi).
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n), n > 0.
  int UniformInt(int n);
  // Standard normal by Box-Muller (both outputs used).
  double Normal();

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// Keys and values of one sequence, unrotated (as an inference engine appends them).
struct KvSequence {
  int num_tokens = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  std::vector<float> k;  // [num_tokens][num_kv_heads][head_dim]
  std::vector<float> v;  // [num_tokens][num_kv_heads][head_dim]

  const float* KeyAt(int token, int head) const {
    return k.data() + (static_cast<size_t>(token) * num_kv_heads + head) * head_dim;
  }
  const float* ValueAt(int token, int head) const {
    return v.data() + (static_cast<size_t>(token) * num_kv_heads + head) * head_dim;
  }
};

// Generates num_tokens tokens of K and V for num_kv_heads heads. See synthetic.cpp for the model.
KvSequence GenerateKv(int num_tokens, int num_kv_heads, int head_dim, uint64_t seed);

// Queries for the given query positions of `kv` (one query token per position), laid out
// [positions.size()][num_q_heads][head_dim]. Query head h belongs to KV head
// h / (num_q_heads / num_kv_heads) and is correlated with the keys that position may attend to
// (tokens 0..position).
std::vector<float> GenerateQueries(const KvSequence& kv, const std::vector<int>& positions,
                                   int num_q_heads, uint64_t seed);

}  // namespace kvarn_selftest

#endif  // KVARN_TOOLS_SELFTEST_SYNTHETIC_H_
