// Gradient dumps: named float arrays in a small binary file, for comparing a pipelined run with
// the single-process reference (tests, `sluice train --dump-dir`). Torch-free.
//
// Format, little-endian: "SLGD" i64:count { i64:name_len name i64:n f32[n] }*count.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace sluice::runtime {

struct NamedValues {
  std::string name;
  std::vector<float> values;

  friend bool operator==(const NamedValues&, const NamedValues&) = default;
};

Status WriteNamedValues(const std::string& path, const std::vector<NamedValues>& values);
// Errors name the file and what is malformed.
StatusOr<std::vector<NamedValues>> ReadNamedValues(const std::string& path);

// File names inside a dump directory.
std::string PackageDumpName(int64_t iteration);                // "iter-3.package"
std::string GradDumpName(int64_t iteration, int64_t rank);     // "grads-iter-3-rank-1.bin"

}  // namespace sluice::runtime
