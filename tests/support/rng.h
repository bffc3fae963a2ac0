// Seeded random numbers for the tests (random inputs come from seeded generators and the seed is
// printed on failure).
//
// The generator is xoshiro256** seeded by splitmix64, and normals come from Box-Muller, so a
// seed gives the same numbers on every platform and standard library (std::normal_distribution
// does not). The seed of a test is derived from its full name, so tests are reproducible and
// independent of their order; KVARN_TEST_SEED=<n> overrides it (mixed with the test name).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace kvt {

inline uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t HashString(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : seed_(seed) {
    uint64_t x = seed;
    for (auto& w : s_) w = SplitMix64(x);
  }

  uint64_t seed() const { return seed_; }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [lo, hi] (inclusive).
  int64_t Int(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(Next() % span);
  }
  bool Bernoulli(double p) { return Uniform() < p; }

  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1;
    do {
      u1 = Uniform();
    } while (u1 <= 0.0);
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }

  template <typename T>
  void Shuffle(T* data, size_t n) {
    for (size_t i = n; i > 1; --i) {
      const size_t j = static_cast<size_t>(Next() % i);
      std::swap(data[i - 1], data[j]);
    }
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  uint64_t seed_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// The seed of the running test: a hash of its full name (plus KVARN_TEST_SEED when set) and a
// salt for several generators in one test.
inline uint64_t TestSeed(uint64_t salt = 0) {
  std::string name = "kvarn";
  if (const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    name = std::string(info->test_suite_name()) + "." + info->name();
  }
  uint64_t seed = HashString(name) ^ (salt * 0x9e3779b97f4a7c15ull);
  if (const char* env = std::getenv("KVARN_TEST_SEED")) {
    seed ^= std::strtoull(env, nullptr, 0) * 0xd1b54a32d192ed03ull;
  }
  return seed;
}

}  // namespace kvt

// Declares `Rng var` seeded for this test and prints its seed with every failure below it.
#define KVT_SEEDED_RNG(var, salt)                                                       \
  ::kvt::Rng var(::kvt::TestSeed(salt));                                                \
  SCOPED_TRACE(::testing::Message() << "rng seed " #var " = " << var.seed()             \
                                    << " (derived from the test name; KVARN_TEST_SEED " \
                                    << "changes it)")
