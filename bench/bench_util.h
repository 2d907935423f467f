// Helpers shared by the benchmark programs in bench/: abort on a broken set-up (a benchmark has
// no caller to return a Status to), medians, wall-clock milliseconds, and the path of a shipped
// length dataset in the repository's data/ folder.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "base/paths.h"
#include "base/status.h"

namespace sluice::bench {

// The value of `v`, or the program stops with its message (set-up failures only).
template <typename T>
T Must(StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "benchmark set-up failed: %s\n", v.status().ToString().c_str());
    std::abort();
  }
  return std::move(v).value();
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline double MillisSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// data/lengths/<name>.jsonl of this checkout (see base/paths.h).
inline std::string LengthsPath(const std::string& name) {
  return Must(DataFile("lengths/" + name + ".jsonl"));
}

}  // namespace sluice::bench
