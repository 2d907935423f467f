#include "schedule/schedule_csv.h"

#include <fmt/core.h>

#include <algorithm>
#include <vector>

namespace sluice {

std::string ScheduleToCsv(const Schedule& schedule) {
  std::string out;
  for (const std::vector<Action>& rank : schedule.ranks) {
    for (size_t k = 0; k < rank.size(); ++k) {
      if (k > 0) out += ',';
      out += rank[k].ToString();
    }
    out += '\n';
  }
  return out;
}

StatusOr<Schedule> ScheduleFromCsv(std::string_view text, std::string_view source,
                                   std::string_view name) {
  Schedule s;
  s.name = std::string(name);
  int64_t max_stage = -1;
  int64_t max_mb = -1;
  size_t pos = 0;
  int64_t line = 0;
  while (pos < text.size()) {
    ++line;
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view row = text.substr(pos, end - pos);
    pos = end + 1;
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    std::vector<Action>& rank = s.ranks.emplace_back();
    size_t cell_begin = 0;
    while (cell_begin <= row.size()) {
      size_t cell_end = row.find(',', cell_begin);
      if (cell_end == std::string_view::npos) cell_end = row.size();
      const std::string_view cell = row.substr(cell_begin, cell_end - cell_begin);
      if (!cell.empty()) {
        SLUICE_ASSIGN_OR_RETURN(
            Action a, ParseAction(cell, fmt::format("{}:{}:{}", source, line, cell_begin + 1)));
        max_stage = std::max(max_stage, a.stage);
        max_mb = std::max(max_mb, a.microbatch);
        rank.push_back(a);
      }
      cell_begin = cell_end + 1;
    }
  }
  s.pp = static_cast<int64_t>(s.ranks.size());
  if (s.pp == 0)
    return InvalidArgumentError(fmt::format("{}: no ranks (the file is empty)", source));
  const int64_t stages = max_stage + 1;
  if (stages > 0 && stages % s.pp != 0) {
    return InvalidArgumentError(fmt::format(
        "{}: stages 0..{} on {} ranks; the number of stages must be a multiple of the ranks "
        "(stage s runs on rank s % pp)",
        source, max_stage, s.pp));
  }
  s.vpp = stages > 0 ? stages / s.pp : 1;
  s.num_microbatches = max_mb + 1;
  return s;
}

}  // namespace sluice
