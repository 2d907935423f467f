// Helpers shared by the length readers in reader.cc and jsonl_reader.cc (not public API).
//
// Messages have the form "<source>:<line>: <what>: <problem>"; user input quoted in a message is
// cut to 40 bytes with control and non-ASCII bytes escaped, so a message stays one short line
// whatever the file holds.
//
// Thread safety: stateless functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "data/reader.h"
#include "data/sample.h"

namespace sluice::data_internal {

// ReaderOptions' default names of the optional fields.
inline constexpr std::string_view kDefaultTargetField = "target_len";
inline constexpr std::string_view kDefaultTaskField = "task";

// A configured optional field name other than the default: the user asked for it by name, so a
// file without it is an error rather than a silent "absent".
inline bool IsCustom(std::string_view name, std::string_view default_name) {
  return !name.empty() && name != default_name;
}

// A piece of user input for a message: 'text', at most 40 bytes, odd bytes as \xNN.
std::string Quote(std::string_view s);

inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }
std::string_view Trim(std::string_view s);

// Calls fn(line, line_number) for every line that is not blank; stops at the first error. A
// leading UTF-8 byte-order mark and a '\r' before each '\n' are removed.
template <typename Fn>
Status ForEachLine(std::string_view text, Fn&& fn) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (Trim(line).empty()) continue;
    SLUICE_RETURN_IF_ERROR(fn(line, line_no));
  }
  return Status::Ok();
}

// Where a value came from, for messages: "<source>:<line>: <what>: <problem>".
struct Where {
  std::string_view source;
  int64_t line;
  std::string_view what;  // "input length", "column 'task'"

  Status Error(std::string_view problem) const;
};

// A decimal integer token (digits, optionally a leading '-', optionally a zero fraction such as
// "12.0", which pandas writes for integer columns with missing values) into *out, checked to be
// in [0, kMaxLength].
Status ParseLengthToken(std::string_view token, const Where& where, int64_t* out);
// "<source>:<line>: empty sample ..." unless input + target >= 1.
Status CheckNotEmpty(int64_t input, int64_t target, std::string_view source, int64_t line);
// "<source>: no samples ...".
Status NoSamples(std::string_view source);

// The JSON Lines reader (jsonl_reader.cc).
StatusOr<Dataset> ParseJsonLines(std::string_view text, const ReaderOptions& options,
                                 std::string_view source);

}  // namespace sluice::data_internal
