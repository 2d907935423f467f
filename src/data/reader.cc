#include "data/reader.h"

#include <fmt/core.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "base/json_util.h"
#include "data/reader_util.h"

namespace sluice {
namespace {

using data_internal::CheckNotEmpty;
using data_internal::ForEachLine;
using data_internal::IsCustom;
using data_internal::IsSpace;
using data_internal::kDefaultTargetField;
using data_internal::kDefaultTaskField;
using data_internal::NoSamples;
using data_internal::ParseLengthToken;
using data_internal::Quote;
using data_internal::Trim;
using data_internal::Where;

constexpr std::array<std::string_view, 4> kFormatNames = {"auto", "text", "jsonl", "csv"};

// ---------------------------------------------------------------------------------------------
// text

StatusOr<Dataset> ParseText(std::string_view text, const ReaderOptions& options,
                            std::string_view source) {
  Dataset ds{std::string(source)};
  ds.Reserve(text.size() / 8);
  const TaskId task = ds.InternTask(options.default_task);
  Status status = ForEachLine(text, [&](std::string_view line, int64_t line_no) -> Status {
    std::string_view rest = Trim(line);
    if (rest.front() == '#') return Status::Ok();
    std::array<std::string_view, 2> tokens;
    size_t count = 0;
    while (!rest.empty()) {
      size_t end = 0;
      while (end < rest.size() && !IsSpace(rest[end])) ++end;
      if (count == tokens.size()) {
        return InvalidArgumentError(fmt::format(
            "{}:{}: expected 'INPUT' or 'INPUT TARGET' (one or two integers), got more fields "
            "starting at {}",
            source, line_no, Quote(rest)));
      }
      tokens[count++] = rest.substr(0, end);
      rest = Trim(rest.substr(end));
    }
    int64_t input = 0, target = 0;
    SLUICE_RETURN_IF_ERROR(ParseLengthToken(tokens[0], {source, line_no, "input length"}, &input));
    if (count == 2) {
      SLUICE_RETURN_IF_ERROR(
          ParseLengthToken(tokens[1], {source, line_no, "target length"}, &target));
    }
    SLUICE_RETURN_IF_ERROR(CheckNotEmpty(input, target, source, line_no));
    ds.Add(input, target, task);
    return Status::Ok();
  });
  SLUICE_RETURN_IF_ERROR(status);
  if (ds.empty()) return NoSamples(source);
  return ds;
}

// ---------------------------------------------------------------------------------------------
// CSV

// Splits one CSV record into fields (RFC 4180 quoting; spaces around fields trimmed).
Status SplitCsv(std::string_view line, std::string_view source, int64_t line_no,
                std::vector<std::string>* fields) {
  fields->clear();
  size_t i = 0;
  while (true) {
    while (i < line.size() && IsSpace(line[i])) ++i;
    std::string field;
    if (i < line.size() && line[i] == '"') {
      ++i;
      bool closed = false;
      while (i < line.size()) {
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          closed = true;
          break;
        }
        field += line[i++];
      }
      if (!closed) {
        return InvalidArgumentError(fmt::format(
            "{}:{}: field {}: unterminated quoted field (line breaks inside fields are not "
            "supported)",
            source, line_no, fields->size() + 1));
      }
      while (i < line.size() && IsSpace(line[i])) ++i;
      if (i < line.size() && line[i] != ',') {
        return InvalidArgumentError(
            fmt::format("{}:{}: field {}: expected ',' after a closing quote, got {}", source,
                        line_no, fields->size() + 1, Quote(line.substr(i))));
      }
    } else {
      const size_t start = i;
      while (i < line.size() && line[i] != ',') {
        if (line[i] == '"') {
          return InvalidArgumentError(
              fmt::format("{}:{}: field {}: a quote inside an unquoted field", source, line_no,
                          fields->size() + 1));
        }
        ++i;
      }
      field = std::string(Trim(line.substr(start, i - start)));
    }
    fields->push_back(std::move(field));
    if (i >= line.size()) break;
    ++i;  // the comma
  }
  return Status::Ok();
}

StatusOr<Dataset> ParseCsv(std::string_view text, const ReaderOptions& options,
                           std::string_view source) {
  Dataset ds{std::string(source)};
  ds.Reserve(text.size() / 24);
  std::vector<std::string> header, fields;
  int input_col = -1, target_col = -1, task_col = -1;
  TaskId default_task = -1;
  Status status = ForEachLine(text, [&](std::string_view line, int64_t line_no) -> Status {
    if (header.empty()) {
      SLUICE_RETURN_IF_ERROR(SplitCsv(line, source, line_no, &header));
      std::string names;
      for (size_t c = 0; c < header.size(); ++c) {
        const std::string& name = header[c];
        if (c < 20) names += (c == 0 ? "" : ", ") + Quote(name);
        if (c == 20) names += fmt::format(", ... ({} columns)", header.size());
        for (auto [want, col] : {std::pair{&options.input_field, &input_col},
                                 std::pair{&options.target_field, &target_col},
                                 std::pair{&options.task_field, &task_col}}) {
          if (want->empty() || name != *want) continue;
          if (*col >= 0) {
            return InvalidArgumentError(
                fmt::format("{}:{}: header: column '{}' appears twice", source, line_no, name));
          }
          *col = static_cast<int>(c);
        }
      }
      if (input_col < 0) {
        return InvalidArgumentError(fmt::format(
            "{}:{}: header: no column '{}' (the input length); the header has {}; rename the "
            "column, or name it with `sluice data stats --input-field`",
            source, line_no, options.input_field, names));
      }
      const auto missing = [&](std::string_view name, std::string_view what) {
        return InvalidArgumentError(fmt::format(
            "{}:{}: header: no column '{}' (the configured {} column); the header has {}", source,
            line_no, name, what, names));
      };
      if (target_col < 0 && IsCustom(options.target_field, kDefaultTargetField)) {
        return missing(options.target_field, "target");
      }
      if (task_col < 0 && IsCustom(options.task_field, kDefaultTaskField)) {
        return missing(options.task_field, "task");
      }
      return Status::Ok();
    }
    SLUICE_RETURN_IF_ERROR(SplitCsv(line, source, line_no, &fields));
    if (fields.size() != header.size()) {
      return InvalidArgumentError(fmt::format("{}:{}: expected {} fields as in the header, got {}",
                                              source, line_no, header.size(), fields.size()));
    }
    int64_t input = 0, target = 0;
    const std::string input_what = fmt::format("column '{}'", options.input_field);
    if (fields[input_col].empty()) {
      return Where{source, line_no, input_what}.Error("missing the input length");
    }
    SLUICE_RETURN_IF_ERROR(
        ParseLengthToken(fields[input_col], {source, line_no, input_what}, &input));
    if (target_col >= 0 && !fields[target_col].empty()) {
      const std::string what = fmt::format("column '{}'", options.target_field);
      SLUICE_RETURN_IF_ERROR(
          ParseLengthToken(fields[target_col], {source, line_no, what}, &target));
    }
    SLUICE_RETURN_IF_ERROR(CheckNotEmpty(input, target, source, line_no));
    TaskId task;
    if (task_col >= 0 && !fields[task_col].empty()) {
      task = ds.InternTask(fields[task_col]);
    } else {
      if (default_task < 0) default_task = ds.InternTask(options.default_task);
      task = default_task;
    }
    ds.Add(input, target, task);
    return Status::Ok();
  });
  SLUICE_RETURN_IF_ERROR(status);
  if (header.empty()) {
    return InvalidArgumentError(
        fmt::format("{}: empty file: expected a header row naming the columns (e.g. '{}')", source,
                    options.input_field));
  }
  if (ds.empty()) return NoSamples(source);
  return ds;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::string_view LengthFormatName(LengthFormat format) {
  return kFormatNames[static_cast<size_t>(format)];
}

StatusOr<LengthFormat> ParseLengthFormat(std::string_view name) {
  for (size_t i = 0; i < kFormatNames.size(); ++i) {
    if (name == kFormatNames[i]) return static_cast<LengthFormat>(i);
  }
  if (name == "txt") return LengthFormat::kText;
  if (name == "json") return LengthFormat::kJsonLines;
  return InvalidArgumentError(fmt::format("unknown length-file format {}; allowed: {}", Quote(name),
                                          JoinAllowed(kFormatNames)));
}

StatusOr<LengthFormat> LengthFormatFromPath(std::string_view path) {
  if (EndsWith(path, ".txt")) return LengthFormat::kText;
  if (EndsWith(path, ".jsonl") || EndsWith(path, ".json")) return LengthFormat::kJsonLines;
  if (EndsWith(path, ".csv")) return LengthFormat::kCsv;
  return InvalidArgumentError(fmt::format(
      "{}: cannot tell the format from the extension (known: .txt, .jsonl, .json, .csv); name "
      "the format explicitly (text, jsonl or csv)",
      path));
}

StatusOr<Dataset> ParseLengths(std::string_view text, LengthFormat format,
                               const ReaderOptions& options, std::string_view source) {
  if (options.input_field.empty()) {
    return InvalidArgumentError(fmt::format("{}: the input field name must not be empty", source));
  }
  if (options.default_task.empty()) {
    return InvalidArgumentError(fmt::format("{}: the default task name must not be empty", source));
  }
  switch (format) {
    case LengthFormat::kText:
      return ParseText(text, options, source);
    case LengthFormat::kJsonLines:
      return data_internal::ParseJsonLines(text, options, source);
    case LengthFormat::kCsv:
      return ParseCsv(text, options, source);
    case LengthFormat::kAuto:
      break;
  }
  return InvalidArgumentError(fmt::format(
      "{}: the format must be given (text, jsonl or csv) when parsing a string", source));
}

StatusOr<Dataset> ReadLengthsFile(const std::string& path, const ReaderOptions& options) {
  LengthFormat format = options.format;
  if (format == LengthFormat::kAuto) {
    SLUICE_ASSIGN_OR_RETURN(format, LengthFormatFromPath(path));
  }
  SLUICE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kMaxDataFileBytes, "a length file"));
  return ParseLengths(text, format, options, path);
}

}  // namespace sluice
