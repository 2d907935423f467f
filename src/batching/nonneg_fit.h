// FitNonNegative: weighted non-negative least squares over a few basis columns, by trying every
// subset of active columns (2^K - 1 small dense solves). For the handful of columns the cost
// fits use (StageCostEvaluator's varlen quadratic: K = 3) this is exact and needs no solver
// library.
//
// Thread safety: a pure function.
#pragma once

#include <array>
#include <cmath>
#include <utility>
#include <vector>

namespace sluice {

// Non-negative least squares with weights w over up to three basis columns: tries every subset
// of active columns, keeps the best solution with all coefficients >= 0. Returns the coefficients.
template <int K>
inline std::array<double, K> FitNonNegative(const std::vector<std::array<double, K>>& x,
                                            const std::vector<double>& y,
                                            const std::vector<double>& w) {
  std::array<double, K> best{};
  double best_err = -1;
  for (int mask = 1; mask < (1 << K); ++mask) {
    int idx[K];
    int n = 0;
    for (int k = 0; k < K; ++k) {
      if (mask & (1 << k)) idx[n++] = k;
    }
    // Normal equations A c = b over the active columns, Gaussian elimination with pivoting.
    double a[K][K + 1] = {};
    for (size_t p = 0; p < y.size(); ++p) {
      for (int r = 0; r < n; ++r) {
        for (int c = 0; c < n; ++c) a[r][c] += w[p] * x[p][idx[r]] * x[p][idx[c]];
        a[r][n] += w[p] * x[p][idx[r]] * y[p];
      }
    }
    bool singular = false;
    for (int col = 0; col < n && !singular; ++col) {
      int piv = col;
      for (int r = col + 1; r < n; ++r) {
        if (std::abs(a[r][col]) > std::abs(a[piv][col])) piv = r;
      }
      if (std::abs(a[piv][col]) < 1e-300) {
        singular = true;
        break;
      }
      for (int c = 0; c <= n; ++c) std::swap(a[col][c], a[piv][c]);
      for (int r = 0; r < n; ++r) {
        if (r == col) continue;
        const double f = a[r][col] / a[col][col];
        for (int c = col; c <= n; ++c) a[r][c] -= f * a[col][c];
      }
    }
    if (singular) continue;
    std::array<double, K> coef{};
    bool nonneg = true;
    for (int r = 0; r < n; ++r) {
      coef[idx[r]] = a[r][n] / a[r][r];
      if (!(coef[idx[r]] >= 0)) nonneg = false;
    }
    if (!nonneg) continue;
    double err = 0;
    for (size_t p = 0; p < y.size(); ++p) {
      double v = 0;
      for (int k = 0; k < K; ++k) v += coef[k] * x[p][k];
      err += w[p] * (v - y[p]) * (v - y[p]);
    }
    if (best_err < 0 || err < best_err) {
      best_err = err;
      best = coef;
    }
  }
  return best;
}

}  // namespace sluice
