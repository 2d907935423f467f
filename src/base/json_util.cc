#include "base/json_util.h"

#include <fmt/core.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace sluice {
namespace {

std::string TypeName(const nlohmann::json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number";
  return std::string(v.type_name()) == "array" ? "an array" : fmt::format("a {}", v.type_name());
}

// A value for "got ..." in messages: its kind and a preview ("a string \"x\""), or "null".
std::string JsonDescribe(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  return fmt::format("{} {}", TypeName(v), JsonPreview(v));
}


// Thrown by the parse callback to stop parsing at a depth or duplicate-key problem.
struct JsonShapeError {
  std::string message;
};

// Line and column of byte `byte` (0-based) of `text`.
std::pair<size_t, size_t> LineColumn(std::string_view text, size_t byte) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < std::min(byte, text.size()); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

}  // namespace

std::string JsonPreview(const nlohmann::json& v, size_t max_chars) {
  std::string s;
  if (v.is_array() || v.is_object()) {
    // One level only: children that are themselves structured show as [...] or {...}.
    const bool array = v.is_array();
    s += array ? "[" : "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end() && s.size() <= max_chars; ++it) {
      if (!first) s += ",";
      first = false;
      if (!array) s += nlohmann::json(it.key()).dump() + ":";
      const nlohmann::json& c = it.value();
      s += c.is_array() ? (c.empty() ? "[]" : "[...]")
           : c.is_object() ? (c.empty() ? "{}" : "{...}")
                           : c.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    s += array ? "]" : "}";
  } else {
    s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (s.size() > max_chars) s = s.substr(0, max_chars > 3 ? max_chars - 3 : 0) + "...";
  return s;
}


std::string JoinAllowed(std::span<const std::string_view> allowed) {
  std::string out;
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (i > 0) out += (i + 1 == allowed.size()) ? " or " : ", ";
    out += fmt::format("'{}'", allowed[i]);
  }
  return out;
}

JsonObjectReader::JsonObjectReader(const nlohmann::json& j, std::string source, std::string path)
    : j_(j), source_(std::move(source)), path_(std::move(path)) {
  if (!j_.is_object()) {
    status_ = InvalidArgumentError(fmt::format("{}: {}: expected a JSON object, got {}", source_,
                                               path_.empty() ? "top level" : "field '" + path_ + "'",
                                               TypeName(j_)));
  }
}

std::string JsonObjectReader::FieldPath(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

Status JsonObjectReader::Error(std::string_view key, std::string_view problem) const {
  return InvalidArgumentError(fmt::format("{}: field '{}': {}", source_, FieldPath(key), problem));
}

bool JsonObjectReader::Has(std::string_view key) const {
  return j_.is_object() && j_.find(std::string(key)) != j_.end();
}

const nlohmann::json* JsonObjectReader::Lookup(std::string_view key) {
  known_.emplace(key);
  if (!j_.is_object()) return nullptr;
  auto it = j_.find(std::string(key));
  return it == j_.end() ? nullptr : &*it;
}

Status JsonObjectReader::Int(std::string_view key, int64_t* out, int64_t min, int64_t max) {
  SLUICE_RETURN_IF_ERROR(status_);
  if (!Has(key)) {
    known_.emplace(key);
    return Error(key, fmt::format("is required (an integer in [{}, {}])", min, max));
  }
  return OptionalInt(key, out, min, max);
}

Status JsonObjectReader::OptionalInt(std::string_view key, int64_t* out, int64_t min,
                                     int64_t max) {
  SLUICE_RETURN_IF_ERROR(status_);
  const nlohmann::json* v = Lookup(key);
  if (v == nullptr) return Status::Ok();
  int64_t value = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) {
      return Error(key, fmt::format("must be an integer in [{}, {}], got {}", min, max, u));
    }
    value = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    value = v->get<int64_t>();
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
             std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    value = static_cast<int64_t>(v->get<double>());
  } else {
    return Error(key, fmt::format("must be an integer in [{}, {}], got {}", min, max,
                                  JsonDescribe(*v)));
  }
  if (value < min || value > max) {
    return Error(key, fmt::format("must be an integer in [{}, {}], got {}", min, max, value));
  }
  *out = value;
  return Status::Ok();
}

Status JsonObjectReader::OptionalInt(std::string_view key, int* out, int min, int max) {
  int64_t v = *out;
  SLUICE_RETURN_IF_ERROR(OptionalInt(key, &v, min, max));
  *out = static_cast<int>(v);
  return Status::Ok();
}

Status JsonObjectReader::Double(std::string_view key, double* out, double min, double max) {
  SLUICE_RETURN_IF_ERROR(status_);
  if (!Has(key)) {
    known_.emplace(key);
    return Error(key, fmt::format("is required (a number in [{}, {}])", min, max));
  }
  return OptionalDouble(key, out, min, max);
}

Status JsonObjectReader::OptionalDouble(std::string_view key, double* out, double min,
                                        double max) {
  SLUICE_RETURN_IF_ERROR(status_);
  const nlohmann::json* v = Lookup(key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_number()) {
    return Error(key, fmt::format("must be a number in [{}, {}], got {}", min, max,
                                  JsonDescribe(*v)));
  }
  const double value = v->get<double>();
  if (!std::isfinite(value) || value < min || value > max) {
    return Error(key, fmt::format("must be a number in [{}, {}], got {}", min, max, value));
  }
  *out = value;
  return Status::Ok();
}

Status JsonObjectReader::String(std::string_view key, std::string* out) {
  SLUICE_RETURN_IF_ERROR(status_);
  if (!Has(key)) {
    known_.emplace(key);
    return Error(key, "is required (a string)");
  }
  return OptionalString(key, out);
}

Status JsonObjectReader::OptionalString(std::string_view key, std::string* out) {
  SLUICE_RETURN_IF_ERROR(status_);
  const nlohmann::json* v = Lookup(key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_string()) {
    return Error(key, fmt::format("must be a string, got {}", JsonDescribe(*v)));
  }
  *out = v->get<std::string>();
  return Status::Ok();
}

Status JsonObjectReader::OptionalBool(std::string_view key, bool* out) {
  SLUICE_RETURN_IF_ERROR(status_);
  const nlohmann::json* v = Lookup(key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_boolean()) {
    return Error(key, fmt::format("must be true or false, got {}", JsonDescribe(*v)));
  }
  *out = v->get<bool>();
  return Status::Ok();
}

Status JsonObjectReader::Enum(std::string_view key, std::string* out,
                              std::span<const std::string_view> allowed) {
  SLUICE_RETURN_IF_ERROR(status_);
  if (!Has(key)) {
    known_.emplace(key);
    return Error(key, fmt::format("is required (one of {})", JoinAllowed(allowed)));
  }
  return OptionalEnum(key, out, allowed);
}

Status JsonObjectReader::OptionalEnum(std::string_view key, std::string* out,
                                      std::span<const std::string_view> allowed) {
  SLUICE_RETURN_IF_ERROR(status_);
  const nlohmann::json* v = Lookup(key);
  if (v == nullptr) return Status::Ok();
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    for (std::string_view a : allowed) {
      if (a == s) {
        *out = s;
        return Status::Ok();
      }
    }
  }
  return Error(key, fmt::format("must be one of {}, got {}", JoinAllowed(allowed), JsonPreview(*v)));
}

const nlohmann::json* JsonObjectReader::Child(std::string_view key) { return Lookup(key); }

void JsonObjectReader::Ignore(std::string_view key) { known_.emplace(key); }

Status JsonObjectReader::Finish() const {
  SLUICE_RETURN_IF_ERROR(status_);
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (known_.count(it.key()) == 0) {
      std::vector<std::string_view> allowed(known_.begin(), known_.end());
      return Error(it.key(), fmt::format("unknown key; allowed keys here: {}",
                                         JoinAllowed(allowed)));
    }
  }
  return Status::Ok();
}

StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view source) {
  // Keys seen so far in each open object (innermost last), to reject duplicates.
  std::vector<std::set<std::string, std::less<>>> keys;
  std::vector<std::string> path;  // the key of each open object's current member
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth >= kMaxJsonDepth) {
      throw JsonShapeError{fmt::format(
          "values nested deeper than {} levels (arrays and objects) are not accepted",
          kMaxJsonDepth)};
    }
    if (event == E::object_start) {
      keys.emplace_back();
      path.emplace_back();
    } else if (event == E::object_end) {
      if (!keys.empty()) keys.pop_back();
      if (!path.empty()) path.pop_back();
    } else if (event == E::key && !keys.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!keys.back().insert(key).second) {
        std::string where;
        for (size_t i = 0; i + 1 < path.size(); ++i) where += path[i] + ".";
        throw JsonShapeError{fmt::format("field '{}{}' is given twice (each key may appear once)",
                                         where, key)};
      }
      path.back() = key;
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, callback, /*allow_exceptions=*/false);
  } catch (const JsonShapeError& e) {
    return InvalidArgumentError(fmt::format("{}: {}", source, e.message));
  }
  if (!j.is_discarded()) return j;
  // Re-parse with exceptions to learn where it failed (nlohmann reports the byte offset).
  try {
    const nlohmann::json ignored = nlohmann::json::parse(text);
    (void)ignored;
  } catch (const nlohmann::json::parse_error& e) {
    const size_t byte = e.byte == 0 ? 0 : std::min(e.byte - 1, text.size());
    const auto [line, col] = LineColumn(text, byte);
    std::string what = e.what();
    const size_t pos = what.find("parse error");
    if (pos != std::string::npos) what = what.substr(pos);
    return InvalidArgumentError(
        fmt::format("{}:{}:{}: not valid JSON ({})", source, line, col, what));
  } catch (const std::exception& e) {
    return InvalidArgumentError(fmt::format("{}: not valid JSON ({})", source, e.what()));
  }
  return InvalidArgumentError(fmt::format("{}: not valid JSON", source));
}

StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, int64_t max_bytes,
                                      std::string_view what) {
  SLUICE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, max_bytes, what));
  return ParseJson(text, path);
}

}  // namespace sluice
