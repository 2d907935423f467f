// Rng: a seeded pseudo-random generator whose output is the same on every platform.
//
// std::mt19937 is portable but std::normal_distribution and friends are not (each standard
// library draws differently), which would break "same seed, byte-identical plan". Rng is
// xoshiro256** seeded through splitmix64, with its own uniform, normal (Box-Muller) and
// shuffle, so every draw is specified here.
//
// Thread safety: not thread-safe; give each thread (or each consumer) its own Rng.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace sluice {

class Rng {
 public:
  explicit Rng(uint64_t seed);

  uint64_t NextU64();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform01();
  // Uniform integer in [lo, hi]. REQUIRES: lo <= hi.
  int64_t UniformInt(int64_t lo, int64_t hi);
  // Standard normal N(0, 1).
  double Normal();
  // exp(N(mu, sigma^2)).
  double LogNormal(double mu, double sigma);
  // An independent generator derived from this one's seed and `stream` (for sub-tasks).
  Rng Fork(uint64_t stream) const;

  // Fisher-Yates, drawing indices with UniformInt.
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      const size_t j = static_cast<size_t>(UniformInt(0, static_cast<int64_t>(i) - 1));
      std::swap(v[i - 1], v[j]);
    }
  }

 private:
  uint64_t seed_;
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace sluice
