// Strict reading of JSON objects with messages that name the file, the field and what is allowed.
//
// JsonObjectReader walks one JSON object. Each accessor marks its key as known and checks the
// type and range; Finish() reports any key nobody asked for, with the list of allowed keys. All
// messages have the form "<source>: field '<path.key>': <problem>", so a user can find the line.
//
//   JsonObjectReader r(j, "model.json");
//   SLUICE_RETURN_IF_ERROR(r.Int("layers", &spec.layers, 1, 100000));
//   SLUICE_RETURN_IF_ERROR(r.Finish());
//
// Thread safety: a reader is used by one thread; the JSON it reads must outlive it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/files.h"
#include "base/status.h"

namespace sluice {

class JsonObjectReader {
 public:
  // `source` names where the JSON came from (a file path or a flag); `path` is the dotted path of
  // this object inside it ("" for the root).
  JsonObjectReader(const nlohmann::json& j, std::string source, std::string path = "");

  // Non-OK when the value given to the constructor is not a JSON object.
  const Status& status() const { return status_; }
  bool Has(std::string_view key) const;

  // Required fields: absent is an error. Integers must be whole numbers within [min, max].
  Status Int(std::string_view key, int64_t* out, int64_t min, int64_t max);
  Status Double(std::string_view key, double* out, double min, double max);
  Status String(std::string_view key, std::string* out);
  // One of `allowed`; the message lists them.
  Status Enum(std::string_view key, std::string* out, std::span<const std::string_view> allowed);

  // Optional fields: absent leaves *out unchanged (the caller's default).
  Status OptionalInt(std::string_view key, int64_t* out, int64_t min, int64_t max);
  Status OptionalInt(std::string_view key, int* out, int min, int max);
  Status OptionalDouble(std::string_view key, double* out, double min, double max);
  Status OptionalString(std::string_view key, std::string* out);
  Status OptionalBool(std::string_view key, bool* out);
  Status OptionalEnum(std::string_view key, std::string* out,
                      std::span<const std::string_view> allowed);

  // A nested value (object or array), or nullptr when absent. Marks the key as known.
  const nlohmann::json* Child(std::string_view key);
  // Marks keys as known without reading them (fields kept only for documentation).
  void Ignore(std::string_view key);

  // An error for every key that no accessor asked for.
  Status Finish() const;

  // "<path.key>" for messages about this object's fields.
  std::string FieldPath(std::string_view key) const;
  // An InvalidArgument Status "<source>: field '<path.key>': <problem>".
  Status Error(std::string_view key, std::string_view problem) const;
  const std::string& source() const { return source_; }

 private:
  const nlohmann::json* Lookup(std::string_view key);

  const nlohmann::json& j_;
  std::string source_;
  std::string path_;
  Status status_;
  std::set<std::string, std::less<>> known_;
};

// "a", "b" or "c" — for messages listing allowed values.
std::string JoinAllowed(std::span<const std::string_view> allowed);

// The deepest nesting of arrays and objects ParseJson accepts. Every sluice file is at most a few
// levels deep; the bound keeps recursive code (dump, comparisons) far from the stack's end.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; a syntax error names `source`, the line and the column. Also rejected, naming
// the place: nesting deeper than kMaxJsonDepth, and a key given twice in one object (JSON leaves
// duplicates undefined; nlohmann would keep the last silently).
StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view source);

// At most `max_chars` characters of `v` as JSON text for messages, never recursing into a
// deep value: arrays and objects show their size beyond the first level.
std::string JsonPreview(const nlohmann::json& v, size_t max_chars = 40);
// Reads (at most `max_bytes`, base/files.h) and parses a JSON file; errors name the path.
StatusOr<nlohmann::json> ReadJsonFile(const std::string& path,
                                      int64_t max_bytes = kMaxConfigFileBytes,
                                      std::string_view what = "a configuration file");

}  // namespace sluice
