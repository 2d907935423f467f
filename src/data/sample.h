// Sample and Dataset: the unit of training data (a sequence's token lengths) and a list of them.
//
// A Sample is one training example reduced to what planning needs: its token lengths and task.
// Encoder-decoder samples have an input (encoder) and a target (decoder) length; decoder-only,
// pretraining-style samples have target_len 0. The task is a small integer into the owning
// Dataset's task-name table, so the batchers can sort and scan samples without touching strings.
//
// Invariants of a Dataset (checked by Validate(), kept by every reader and generator): sample ids
// are unique; lengths are in [0, kMaxLength] and input_len + target_len >= 1; every task id
// indexes task_names(); task names are distinct. Readers and generators number samples 0..n-1 in
// order, so samples()[i].id == i for them, but code must not rely on that.
//
// Thread safety: value types; concurrent reads are safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace sluice {

// Index into Dataset::task_names().
using TaskId = int32_t;

// The largest length a reader or generator accepts for either side of a sample. Keeps every sum
// of lengths over any dataset that fits in memory far from int64 overflow.
inline constexpr int64_t kMaxLength = 2'147'483'647;

struct Sample {
  int64_t id = 0;          // unique within its Dataset
  int64_t input_len = 0;   // tokens of the input (encoder side, or the whole decoder-only sequence)
  int64_t target_len = 0;  // tokens of the target (decoder side); 0 for decoder-only samples
  TaskId task = 0;         // index into the owning Dataset's task_names()

  // input_len + target_len: what a token budget counts.
  int64_t tokens() const { return input_len + target_len; }

  friend bool operator==(const Sample&, const Sample&) = default;
};

class Dataset {
 public:
  Dataset() = default;
  // `source` names where the samples came from (a path or a preset name) for messages and stats.
  explicit Dataset(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  void set_source(std::string source) { source_ = std::move(source); }

  // The id of task `name`, adding it to the table when new. Ids are given in order of first use.
  TaskId InternTask(std::string_view name);
  // The id of task `name`, or -1 when the table has no such task.
  TaskId FindTask(std::string_view name) const;
  // REQUIRES: 0 <= task < num_tasks().
  const std::string& task_name(TaskId task) const;
  const std::vector<std::string>& task_names() const { return task_names_; }
  int num_tasks() const { return static_cast<int>(task_names_.size()); }

  // Appends a sample. REQUIRES: 0 <= sample.task < num_tasks(); other invariants are checked by
  // Validate(), not here, so that readers can report them with file and line.
  void Add(const Sample& sample);
  // Appends a sample with id = size(). REQUIRES: as Add().
  void Add(int64_t input_len, int64_t target_len, TaskId task);
  void Reserve(size_t n) { samples_.reserve(n); }

  const std::vector<Sample>& samples() const { return samples_; }
  size_t size() const { return samples_.size(); }
  bool empty() const { return samples_.empty(); }
  const Sample& operator[](size_t i) const { return samples_[i]; }

  // Sums over all samples.
  int64_t input_tokens() const;
  int64_t target_tokens() const;
  int64_t tokens() const { return input_tokens() + target_tokens(); }
  // True when some sample has target_len > 0 (encoder-decoder or prompt/response pairs).
  bool has_targets() const;

  // A copy holding the first `n` samples (all when n >= size()), with the same task table.
  Dataset Prefix(size_t n) const;

  // OK when the invariants in the file comment hold; otherwise names the first offending sample.
  Status Validate() const;

  friend bool operator==(const Dataset& a, const Dataset& b) {
    return a.source_ == b.source_ && a.task_names_ == b.task_names_ && a.samples_ == b.samples_;
  }

 private:
  std::string source_;
  std::vector<std::string> task_names_;
  std::map<std::string, TaskId, std::less<>> task_ids_;
  std::vector<Sample> samples_;
};

}  // namespace sluice
