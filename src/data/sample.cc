#include "data/sample.h"

#include <fmt/core.h>

#include <unordered_set>

namespace sluice {

TaskId Dataset::InternTask(std::string_view name) {
  auto it = task_ids_.find(name);
  if (it != task_ids_.end()) return it->second;
  const TaskId id = static_cast<TaskId>(task_names_.size());
  task_names_.emplace_back(name);
  task_ids_.emplace(std::string(name), id);
  return id;
}

TaskId Dataset::FindTask(std::string_view name) const {
  auto it = task_ids_.find(name);
  return it == task_ids_.end() ? -1 : it->second;
}

const std::string& Dataset::task_name(TaskId task) const {
  SLUICE_CHECK(task >= 0 && task < num_tasks());
  return task_names_[static_cast<size_t>(task)];
}

void Dataset::Add(const Sample& sample) {
  SLUICE_CHECK(sample.task >= 0 && sample.task < num_tasks());
  samples_.push_back(sample);
}

void Dataset::Add(int64_t input_len, int64_t target_len, TaskId task) {
  Add(Sample{static_cast<int64_t>(samples_.size()), input_len, target_len, task});
}

int64_t Dataset::input_tokens() const {
  int64_t sum = 0;
  for (const Sample& s : samples_) sum += s.input_len;
  return sum;
}

int64_t Dataset::target_tokens() const {
  int64_t sum = 0;
  for (const Sample& s : samples_) sum += s.target_len;
  return sum;
}

bool Dataset::has_targets() const {
  for (const Sample& s : samples_) {
    if (s.target_len > 0) return true;
  }
  return false;
}

Dataset Dataset::Prefix(size_t n) const {
  Dataset out = *this;
  if (n < out.samples_.size()) out.samples_.resize(n);
  return out;
}

Status Dataset::Validate() const {
  std::unordered_set<int64_t> ids;
  ids.reserve(samples_.size());
  for (size_t i = 0; i < samples_.size(); ++i) {
    const Sample& s = samples_[i];
    const auto where = [&] { return fmt::format("{}: sample {} (id {})", source_, i, s.id); };
    if (!ids.insert(s.id).second) {
      return InvalidArgumentError(fmt::format("{}: duplicate sample id", where()));
    }
    if (s.input_len < 0 || s.input_len > kMaxLength || s.target_len < 0 ||
        s.target_len > kMaxLength) {
      return InvalidArgumentError(fmt::format("{}: lengths must be in [0, {}], got {} and {}",
                                              where(), kMaxLength, s.input_len, s.target_len));
    }
    if (s.tokens() == 0) {
      return InvalidArgumentError(
          fmt::format("{}: empty sample (input and target are 0)", where()));
    }
    if (s.task < 0 || s.task >= num_tasks()) {
      return InvalidArgumentError(fmt::format("{}: task id {} is not in the task table ({} tasks)",
                                              where(), s.task, num_tasks()));
    }
  }
  return Status::Ok();
}

}  // namespace sluice
