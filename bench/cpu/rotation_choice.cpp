// Why head dims 80 and 96 rotate by a full Hadamard matrix (docs/FORMAT.md section 3): the round
// trip error of K and V through libkvarn's records with the rotation the library uses (the
// Kronecker product P_m (x) S_p, which mixes every channel) against a block-diagonal Sylvester
// rotation (64 + 16, 64 + 32: each channel mixes only inside its block) and no rotation, on
// heavy-tailed data with outlier channels. The alternatives are applied outside the library in
// float64 (the records then hold their cache frame: KVARN_CODEC_CACHE_FRAME), so all three go
// through the same normalization and RTN. Public API only. Prints a markdown table.
//
// usage: kvarn-rotation-choice [tiles] [seed]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"

namespace {

// x <- x S_n / sqrt(n) in double (Sylvester order), n a power of two.
void Sylvester(double* x, int n) {
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  for (int i = 0; i < n; ++i) x[i] /= std::sqrt(static_cast<double>(n));
}

// Block-diagonal: Sylvester of 64 on channels [0, 64), of D - 64 on the rest (its own inverse).
void BlockDiagonal(double* x, int D) {
  Sylvester(x, 64);
  Sylvester(x + 64, D - 64);
}

struct Data {
  std::vector<float> k, v;  // [tiles][G][D]
};

// Keys: per-channel scales (log-normal), 4 outlier channels at 15-30x with a mean offset, Student
// t(3) noise (heavy tails), per-token scales; values: the same without the outlier offsets.
Data MakeData(std::mt19937_64& rng, int tiles, int G, int D) {
  std::normal_distribution<double> normal;
  std::student_t_distribution<double> t3(3.0);
  std::uniform_int_distribution<int> channel(0, D - 1);
  Data d;
  for (int which = 0; which < 2; ++which) {
    std::vector<float>& x = which ? d.v : d.k;
    x.resize(static_cast<size_t>(tiles) * G * D);
    std::vector<double> scale(D), offset(D, 0.0);
    for (int c = 0; c < D; ++c) scale[c] = std::exp(0.5 * normal(rng));
    for (int o = 0; o < 4; ++o) {
      const int c = channel(rng);
      scale[c] *= which ? 5.0 : 15.0 + 15.0 * std::abs(normal(rng));
      if (!which) offset[c] = 3.0 * scale[c];
    }
    for (int tile = 0; tile < tiles; ++tile) {
      for (int t = 0; t < G; ++t) {
        const double ts = std::exp(0.3 * normal(rng));
        for (int c = 0; c < D; ++c) {
          x[(static_cast<size_t>(tile) * G + t) * D + c] =
              static_cast<float>(ts * (offset[c] + scale[c] * t3(rng)));
        }
      }
    }
  }
  return d;
}

enum Rotation { kLibrary = 0, kBlockDiagonal = 1, kNone = 2 };

// Relative MSE (sum sq err / sum sq) of K and V through records of `preset` with `rot`.
void RoundTrip(kvarn_context_t* ctx, const char* preset, int D, const Data& in, Rotation rot,
               double* k_err, double* v_err) {
  kvarn_config_t cfg;
  if (kvarn_config_from_preset(preset, D, &cfg) != KVARN_OK) std::exit(1);
  const int G = cfg.tile_tokens;
  const size_t n = in.k.size(), tiles = n / (static_cast<size_t>(G) * D);
  size_t rb = 0;
  kvarn_record_bytes(&cfg, &rb);
  std::vector<uint8_t> rec(tiles * rb);
  std::vector<float> k(n), v(n);
  if (rot == kLibrary) {
    if (kvarn_quantize(ctx, &cfg, tiles, KVARN_DTYPE_F32, in.k.data(), in.v.data(), 0, rec.data(),
                       rb) != KVARN_OK ||
        kvarn_dequantize(ctx, &cfg, tiles, rec.data(), rb, 0, KVARN_DTYPE_F32, k.data(),
                         v.data()) != KVARN_OK) {
      std::fprintf(stderr, "%s\n", kvarn_last_error());
      std::exit(1);
    }
  } else {
    // The cache frame made here: rotated in double, rounded to fp32 (the library rounds it to
    // fp16 as it would its own rotation's fp32 result).
    std::vector<float> kh(n), vh(n);
    std::vector<double> row(D);
    for (size_t r = 0; r < n / D; ++r) {
      for (int which = 0; which < 2; ++which) {
        const float* src = (which ? in.v.data() : in.k.data()) + r * D;
        for (int c = 0; c < D; ++c) row[c] = src[c];
        if (rot == kBlockDiagonal) BlockDiagonal(row.data(), D);
        float* dst = (which ? vh.data() : kh.data()) + r * D;
        for (int c = 0; c < D; ++c) dst[c] = static_cast<float>(row[c]);
      }
    }
    if (kvarn_quantize(ctx, &cfg, tiles, KVARN_DTYPE_F32, kh.data(), vh.data(),
                       KVARN_CODEC_CACHE_FRAME, rec.data(), rb) != KVARN_OK ||
        kvarn_dequantize(ctx, &cfg, tiles, rec.data(), rb, KVARN_CODEC_CACHE_FRAME, KVARN_DTYPE_F32,
                         k.data(), v.data()) != KVARN_OK) {
      std::fprintf(stderr, "%s\n", kvarn_last_error());
      std::exit(1);
    }
    for (size_t r = 0; r < n / D && rot == kBlockDiagonal; ++r) {
      for (int which = 0; which < 2; ++which) {
        float* x = (which ? v.data() : k.data()) + r * D;
        for (int c = 0; c < D; ++c) row[c] = x[c];
        BlockDiagonal(row.data(), D);  // its own inverse
        for (int c = 0; c < D; ++c) x[c] = static_cast<float>(row[c]);
      }
    }
  }
  for (int which = 0; which < 2; ++which) {
    const std::vector<float>& a = which ? in.v : in.k;
    const std::vector<float>& b = which ? v : k;
    double e = 0, s = 0;
    for (size_t i = 0; i < n; ++i) {
      e += (static_cast<double>(b[i]) - a[i]) * (static_cast<double>(b[i]) - a[i]);
      s += static_cast<double>(a[i]) * a[i];
    }
    *(which ? v_err : k_err) = e / s;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int tiles = argc > 1 ? std::atoi(argv[1]) : 64;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 25;
  kvarn_context_options_t options;
  kvarn_context_options_defaults(&options);
  options.backend = KVARN_BACKEND_CPU;
  kvarn_context_t* ctx = nullptr;
  if (kvarn_context_create(&options, &ctx) != KVARN_OK) return 1;
  std::printf("| D | preset | rotation | K rel MSE | V rel MSE |\n|---|---|---|---:|---:|\n");
  for (int D : {80, 96}) {
    for (const char* preset : {"k4v2_g128", "k2v2_g128", "k4v4_g128"}) {
      std::mt19937_64 rng(seed * 1000 + D);
      const Data in = MakeData(rng, tiles, 128, D);
      const char* names[] = {"Paley x Sylvester (libkvarn)", "block-diagonal Sylvester", "none"};
      for (int r = 0; r < 3; ++r) {
        double ke = 0, ve = 0;
        RoundTrip(ctx, preset, D, in, static_cast<Rotation>(r), &ke, &ve);
        std::printf("| %d | %s | %s | %.3e | %.3e |\n", D, preset, names[r], ke, ve);
      }
    }
  }
  kvarn_context_destroy(ctx);
  return 0;
}
