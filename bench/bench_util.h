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

#include <benchmark/benchmark.h>

#include "base/paths.h"
#include "base/status.h"
#include "data/reader.h"
#include "data/sample.h"

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

// `count` decoder-only global batches of about `tokens` tokens each, cut in file order from the
// shipped mixture-4task lengths (wrapping around), every sample clipped to `max_len` tokens in
// all; ids 0..n-1 within each batch.
inline std::vector<std::vector<Sample>> CutMixtureBatches(size_t count, int64_t tokens,
                                                          int64_t max_len) {
  const std::vector<Sample> stream =
      Must(ReadLengthsFile(LengthsPath("mixture-4task"))).samples();
  std::vector<std::vector<Sample>> out;
  std::vector<Sample> cur;
  int64_t have = 0;
  for (size_t i = 0; out.size() < count; i = (i + 1) % stream.size()) {
    Sample s = stream[i];
    s.input_len = std::clamp<int64_t>(s.input_len, 1, max_len);
    s.target_len = std::min(s.target_len, max_len - s.input_len);
    s.id = static_cast<int64_t>(cur.size());
    have += s.tokens();
    cur.push_back(s);
    if (have >= tokens) {
      out.push_back(std::move(cur));
      cur.clear();
      have = 0;
    }
  }
  return out;
}

// main() of a program whose benchmarks `register_all` registers at run time (their names depend
// on the presets they loop over): registers, parses the Google Benchmark flags, runs.
inline int RunRegisteredBenchmarks(int argc, char** argv, void (*register_all)()) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace sluice::bench
