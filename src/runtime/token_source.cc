#include "runtime/token_source.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "base/rng.h"
#include "base/status.h"

namespace sluice::runtime {
namespace {

constexpr int kSuccessors = 4;
constexpr double kRestart = 0.1;
constexpr std::array<double, kSuccessors> kSuccessorP = {0.45, 0.225, 0.135, 0.09};
constexpr uint64_t kTableStream = 0x7a11e5ULL;

}  // namespace

TokenSource::TokenSource(int64_t vocab, uint64_t seed) : vocab_(vocab), seed_(seed) {
  SLUICE_CHECK(vocab >= 2);
  zipf_cdf_.resize(static_cast<size_t>(vocab));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    sum += 1.0 / std::pow(static_cast<double>(v + 1), 1.1);
    zipf_cdf_[v] = sum;
  }
  for (double& c : zipf_cdf_) c /= sum;
  Rng rng = Rng(seed).Fork(kTableStream);
  successors_.resize(static_cast<size_t>(vocab * kSuccessors));
  for (int64_t& s : successors_) s = Zipf(rng.Uniform01());
}

int64_t TokenSource::Zipf(double u) const {
  const auto it = std::upper_bound(zipf_cdf_.begin(), zipf_cdf_.end(), u);
  return std::min<int64_t>(it - zipf_cdf_.begin(), vocab_ - 1);
}

std::vector<int64_t> TokenSource::Tokens(int64_t id, int64_t n) const {
  std::vector<int64_t> out;
  if (n <= 0) return out;
  out.reserve(static_cast<size_t>(n));
  Rng rng = Rng(seed_).Fork(static_cast<uint64_t>(id));
  int64_t t = Zipf(rng.Uniform01());
  out.push_back(t);
  while (static_cast<int64_t>(out.size()) < n) {
    double u = rng.Uniform01();
    if (u < kRestart) {
      t = Zipf(rng.Uniform01());
    } else {
      u -= kRestart;
      int k = 0;
      while (k + 1 < kSuccessors && u >= kSuccessorP[k]) u -= kSuccessorP[k++];
      t = successors_[t * kSuccessors + k];
    }
    out.push_back(t);
  }
  return out;
}

double TokenSource::ConditionalEntropy() const {
  // H(next | current) = E_current[-sum_next p log p], the current token drawn from the chain's
  // own stream (one long sample). The restart mass r * zipf(v) covers every token; the terms of a
  // token's successors are replaced by their combined probability.
  const std::vector<int64_t> walk = Tokens(-1, 4000);
  auto term = [](double q) { return q > 0 ? -q * std::log(q) : 0.0; };
  auto zipf_p = [&](int64_t v) { return zipf_cdf_[v] - (v ? zipf_cdf_[v - 1] : 0.0); };
  double restart_all = 0;
  for (int64_t v = 0; v < vocab_; ++v) restart_all += term(kRestart * zipf_p(v));
  double h = 0;
  for (size_t i = 0; i + 1 < walk.size(); ++i) {
    std::map<int64_t, double> p;
    for (int k = 0; k < kSuccessors; ++k) {
      p[successors_[walk[i] * kSuccessors + k]] += (1 - kRestart) * kSuccessorP[k];
    }
    double hi = restart_all;
    for (const auto& [tok, q] : p) {
      const double r = kRestart * zipf_p(tok);
      hi += term(q + r) - term(r);
    }
    h += hi;
  }
  return h / static_cast<double>(walk.size() - 1);
}

}  // namespace sluice::runtime
