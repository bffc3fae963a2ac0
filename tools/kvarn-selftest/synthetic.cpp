// Seeded synthetic KV-cache data with the structure of a large model's cache.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
//
// The generator (per KV head, all randomness from splitmix64 seeded by (seed, head)):
//
// Keys. Channels are RoPE pairs (j, j + D/2), the rotate-half pairing of Llama-style models.
//  - Each pair has a scale sigma_j = 0.25 * exp(0.35 N) and each channel a mean offset
//    mu_d = 0.6 sigma_j N (real keys have a per-channel bias that RoPE turns into a slowly
//    rotating component).
//  - max(1, D/64) outlier pairs, taken among the low-frequency half of the pairs (where models put
//    them), have sigma scaled by U(10, 30) and a large same-sign mean offset: the "outlier
//    channels 10-30x larger than the rest" that defeat per-token quantization of K.
//  - Token t: content x_d = mu_d + sigma_d N, rotated in each pair by the angle
//    t * 10000^(-2j/D) (RoPE), times a token magnitude m_t = exp(0.3 N); one token in 48 (never
//    token 0) has m_t further multiplied by U(10, 50): the rare very large tokens.
//  - Token 0 is an attention sink: a large-norm key (6x the head's typical key norm) along a
//    fixed random direction of the head, and a small value (0.1x).
// Values. Per-channel scale 0.25 * exp(0.3 N), max(1, D/128) outlier channels scaled by
//  U(10, 20), no RoPE, zero mean, the same per-token magnitude spread as the keys (its own draw).
// Queries. For a query at position p of KV head h: q = (0.5 sqrt(D) / typical key norm) *
//  (a k~_j + b u_sink + c z), with j uniform in [0, p] and k~_j the unit direction of key j
//  without its RoPE-rotated mean (queries attend to keys whose content they resemble), u_sink the
//  sink direction (so every query gives the sink some mass, as real heads do) and z an isotropic
//  unit Gaussian direction; a = 4 + g, b = 0.6 + 0.25 g for the g-th query head of the group.
//  The outlier channels of q are damped 10x: otherwise the rare 10-50x keys take nearly all the
//  weight and attention is one-hot, which would hide errors on every other token. With these
//  weights (600 tokens, D 64..512) the sink takes 8-28% of the weight, the largest weight is
//  0.26-0.38 and about 115-170 tokens carry the softmax (exp of its entropy): neither uniform nor
//  one-hot, so the attention check sees the sink, the records and the tail.
//
// Magnitudes stay far inside fp16 (|x| < ~1e4 after rotation), so a correct library never
// reports an overflow on this data.
#include "synthetic.h"

#include <algorithm>
#include <cmath>

namespace kvarn_selftest {
namespace {

constexpr double kPi = 3.14159265358979323846;

// One KV head's fixed structure.
struct HeadProfile {
  std::vector<double> key_sigma;    // [D]
  std::vector<double> key_mean;     // [D]
  std::vector<double> rope_theta;   // [D/2]
  std::vector<double> value_sigma;  // [D]
  std::vector<double> sink_dir;     // [D], unit
};

uint64_t MixSeed(uint64_t seed, uint64_t stream) {
  SplitMix64 mixer(seed ^ (0x9E3779B97F4A7C15ull * (stream + 1)));
  return mixer.Next();
}

void Normalize(std::vector<double>* x) {
  double norm = 0.0;
  for (double e : *x) norm += e * e;
  norm = std::sqrt(norm);
  if (norm > 0.0) {
    for (double& e : *x) e /= norm;
  }
}

HeadProfile MakeHeadProfile(int head_dim, SplitMix64* rng) {
  const int half = head_dim / 2;
  HeadProfile p;
  p.key_sigma.resize(head_dim);
  p.key_mean.resize(head_dim);
  p.rope_theta.resize(half);
  p.value_sigma.resize(head_dim);
  p.sink_dir.resize(head_dim);
  for (int j = 0; j < half; ++j) {
    const double sigma = 0.25 * std::exp(0.35 * rng->Normal());
    p.key_sigma[j] = sigma;
    p.key_sigma[j + half] = sigma;
    p.rope_theta[j] = std::pow(10000.0, -2.0 * j / head_dim);
  }
  for (int d = 0; d < head_dim; ++d) p.key_mean[d] = 0.6 * p.key_sigma[d] * rng->Normal();
  const int key_outliers = std::max(1, head_dim / 64);
  for (int i = 0; i < key_outliers; ++i) {
    int j;
    do {
      j = half / 2 + rng->UniformInt(half - half / 2);
    } while (p.key_sigma[j] > 1.0);  // distinct pairs (non-outliers stay far below 1)
    const double factor = rng->Uniform(10.0, 30.0);
    const double sign = rng->Uniform() < 0.5 ? -1.0 : 1.0;
    for (int d : {j, j + half}) {
      p.key_sigma[d] *= factor;
      p.key_mean[d] = sign * p.key_sigma[d] * rng->Uniform(0.5, 1.5);
    }
  }
  for (int d = 0; d < head_dim; ++d) p.value_sigma[d] = 0.25 * std::exp(0.3 * rng->Normal());
  const int value_outliers = std::max(1, head_dim / 128);
  for (int i = 0; i < value_outliers; ++i) {
    p.value_sigma[rng->UniformInt(head_dim)] *= rng->Uniform(10.0, 20.0);
  }
  for (int d = 0; d < head_dim; ++d) p.sink_dir[d] = rng->Normal();
  Normalize(&p.sink_dir);
  return p;
}

double TokenMagnitude(int token, SplitMix64* rng) {
  double m = std::exp(0.3 * rng->Normal());
  // Draw unconditionally so the stream does not depend on the branch taken.
  const double rare = rng->Uniform();
  const double factor = rng->Uniform(10.0, 50.0);
  if (token > 0 && rare < 1.0 / 48.0) m *= factor;
  return m;
}

double TypicalKeyNorm(const HeadProfile& p) {
  double sq = 0.0;
  for (size_t d = 0; d < p.key_sigma.size(); ++d) {
    sq += p.key_sigma[d] * p.key_sigma[d] + p.key_mean[d] * p.key_mean[d];
  }
  return std::sqrt(sq);
}

// Unit vector of the head's key mean after RoPE at position `token`.
void RotatedMean(const HeadProfile& p, int token, std::vector<double>* out) {
  const int dim = static_cast<int>(p.key_mean.size()), half = dim / 2;
  out->resize(dim);
  for (int j = 0; j < half; ++j) {
    const double angle = token * p.rope_theta[j];
    const double c = std::cos(angle), s = std::sin(angle);
    const double a = p.key_mean[j], b = p.key_mean[j + half];
    (*out)[j] = a * c - b * s;
    (*out)[j + half] = a * s + b * c;
  }
  Normalize(out);
}

}  // namespace

uint64_t SplitMix64::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SplitMix64::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

int SplitMix64::UniformInt(int n) { return static_cast<int>(Uniform() * n) % n; }

double SplitMix64::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = 1.0 - Uniform();  // (0, 1]: log stays finite
  const double u2 = Uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2.0 * kPi * u2);
  has_spare_ = true;
  return r * std::cos(2.0 * kPi * u2);
}

KvSequence GenerateKv(int num_tokens, int num_kv_heads, int head_dim, uint64_t seed) {
  KvSequence kv;
  kv.num_tokens = num_tokens;
  kv.num_kv_heads = num_kv_heads;
  kv.head_dim = head_dim;
  const size_t row = static_cast<size_t>(num_kv_heads) * head_dim;
  kv.k.assign(static_cast<size_t>(num_tokens) * row, 0.0f);
  kv.v.assign(static_cast<size_t>(num_tokens) * row, 0.0f);
  const int half = head_dim / 2;
  std::vector<double> x(head_dim);
  for (int h = 0; h < num_kv_heads; ++h) {
    SplitMix64 rng(MixSeed(seed, static_cast<uint64_t>(h)));
    const HeadProfile p = MakeHeadProfile(head_dim, &rng);
    const double key_norm = TypicalKeyNorm(p);
    for (int t = 0; t < num_tokens; ++t) {
      float* k = kv.k.data() + t * row + static_cast<size_t>(h) * head_dim;
      float* v = kv.v.data() + t * row + static_cast<size_t>(h) * head_dim;
      const double km = TokenMagnitude(t, &rng);
      const double vm = TokenMagnitude(t, &rng);
      if (t == 0) {
        for (int d = 0; d < head_dim; ++d) {
          x[d] = 6.0 * key_norm * p.sink_dir[d] + 0.2 * p.key_sigma[d] * rng.Normal();
        }
      } else {
        for (int d = 0; d < head_dim; ++d) x[d] = p.key_mean[d] + p.key_sigma[d] * rng.Normal();
      }
      for (int j = 0; j < half; ++j) {
        const double angle = t * p.rope_theta[j];
        const double c = std::cos(angle), s = std::sin(angle);
        const double a = x[j], b = x[j + half];
        k[j] = static_cast<float>(km * (a * c - b * s));
        k[j + half] = static_cast<float>(km * (a * s + b * c));
      }
      const double value_gain = t == 0 ? 0.1 : vm;
      for (int d = 0; d < head_dim; ++d) {
        v[d] = static_cast<float>(value_gain * p.value_sigma[d] * rng.Normal());
      }
    }
  }
  return kv;
}

std::vector<float> GenerateQueries(const KvSequence& kv, const std::vector<int>& positions,
                                   int num_q_heads, uint64_t seed) {
  const int dim = kv.head_dim;
  const int group = num_q_heads / kv.num_kv_heads;
  std::vector<float> q(positions.size() * num_q_heads * dim, 0.0f);
  std::vector<double> kj(dim), z(dim), mean(dim);
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    // The profile is re-derived from the same stream as GenerateKv so queries know the sink
    // direction and the typical key norm without GenerateKv having to export them.
    SplitMix64 profile_rng(MixSeed(seed, static_cast<uint64_t>(h)));
    const HeadProfile p = MakeHeadProfile(dim, &profile_rng);
    const double gain = 0.5 * std::sqrt(static_cast<double>(dim)) / TypicalKeyNorm(p);
    SplitMix64 rng(MixSeed(seed ^ 0x5151515151515151ull, static_cast<uint64_t>(h)));
    for (size_t i = 0; i < positions.size(); ++i) {
      for (int g = 0; g < group; ++g) {
        const int qh = h * group + g;
        const int j = rng.UniformInt(positions[i] + 1);
        const float* key = kv.KeyAt(j, h);
        // The key's direction without its RoPE-rotated mean: the content that tells tokens
        // apart. Without the projection every query would favour the largest keys, and the
        // rare 10-50x tokens would take all the attention.
        RotatedMean(p, j, &mean);
        double along = 0.0;
        for (int d = 0; d < dim; ++d) along += key[d] * mean[d];
        for (int d = 0; d < dim; ++d) {
          kj[d] = key[d] - along * mean[d];
          z[d] = rng.Normal();
        }
        Normalize(&kj);
        Normalize(&z);
        // Heads of one group differ in how much they look at the sink and at content.
        const double a = 4.0 + g;
        const double b = 0.6 + 0.25 * g;
        const double c = 1.0;
        float* out = q.data() + (i * num_q_heads + qh) * dim;
        for (int d = 0; d < dim; ++d) {
          const double damp = p.key_sigma[d] > 1.0 ? 0.1 : 1.0;  // outlier channels
          out[d] = static_cast<float>(damp * gain * (a * kj[d] + b * p.sink_dir[d] + c * z[d]));
        }
      }
    }
  }
  return q;
}

}  // namespace kvarn_selftest
