// Readers for sample-length files: plain text, JSON Lines and CSV (docs/formats.md).
//
// Each reader turns a whole file (or an in-memory text, for tests and the fuzzer) into a Dataset
// whose samples are numbered 0..n-1 in file order. Reading is strict: the first malformed line
// stops it with an InvalidArgument Status "<source>:<line>: <what was expected, what was found>"
// (negative or non-integer length, missing field, unknown column, ...). A file with no samples is
// an error. Blank lines are skipped in all three formats; a UTF-8 byte-order mark and CRLF line
// ends are accepted.
//
//   text   one sample per line: "INPUT" or "INPUT TARGET" (whitespace-separated integers);
//          '#' starts a comment line. Every sample gets ReaderOptions::default_task.
//   jsonl  one JSON object per line; fields named by ReaderOptions (input required, target and
//          task optional; a null target or task counts as absent); other fields are ignored.
//   csv    a header row naming the columns, then one row per sample (RFC 4180 quoting, no
//          line breaks inside fields); the input column is required, the others optional.
//
// Thread safety: free functions without shared state.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "data/sample.h"

namespace sluice {

enum class LengthFormat {
  kAuto,  // from the file extension: .txt, .jsonl (or .json), .csv
  kText,
  kJsonLines,
  kCsv,
};

// "auto", "text", "jsonl" or "csv".
std::string_view LengthFormatName(LengthFormat format);
// Parses a LengthFormatName(); the error lists the allowed names. Also accepts "txt", "json".
StatusOr<LengthFormat> ParseLengthFormat(std::string_view name);
// The format a path's extension implies, or InvalidArgument naming the known extensions.
StatusOr<LengthFormat> LengthFormatFromPath(std::string_view path);

struct ReaderOptions {
  // kAuto picks by extension (files only; ParseLengths needs an explicit format).
  LengthFormat format = LengthFormat::kAuto;
  // JSON field / CSV column holding the input length. Required in every record.
  std::string input_field = "input_len";
  // JSON field / CSV column holding the target length; absent means 0. Empty: never read.
  // A name other than the default must occur (in the CSV header, on some JSON line), so that a
  // misspelt name is an error rather than a file read without targets.
  std::string target_field = "target_len";
  // JSON field / CSV column holding the task name; absent means default_task. Empty: never read.
  // A name other than the default must occur, as for target_field.
  std::string task_field = "task";
  // Task name for samples without one (every sample of a text file).
  std::string default_task = "default";
};

// Parses `text` in `format` (not kAuto). `source` names the text in messages ("a.jsonl").
StatusOr<Dataset> ParseLengths(std::string_view text, LengthFormat format,
                               const ReaderOptions& options, std::string_view source);

// Reads the file at `path`; the Dataset's source is `path`. options.format kAuto picks by
// extension. Errors name the path (and line for malformed content).
StatusOr<Dataset> ReadLengthsFile(const std::string& path, const ReaderOptions& options = {});

}  // namespace sluice
