#include "model/spec_util.h"

#include <fmt/core.h>

#include <charconv>
#include <cmath>

namespace sluice::model_internal {

Status FieldError(std::string_view source, std::string_view field, std::string_view problem) {
  return InvalidArgumentError(fmt::format("{}: field '{}': {}", source, field, problem));
}

Status CheckIntRange(std::string_view source, std::string_view field, int64_t value, int64_t lo,
                     int64_t hi) {
  if (value >= lo && value <= hi) return Status::Ok();
  return FieldError(source, field,
                    fmt::format("must be an integer in [{}, {}], got {}", lo, hi, value));
}

Status CheckPositive(std::string_view source, std::string_view field, double value, double hi) {
  if (std::isfinite(value) && value > 0 && value <= hi) return Status::Ok();
  return FieldError(source, field, fmt::format("must be a number in (0, {}], got {}", hi, value));
}

Status ReadPositive(JsonObjectReader& reader, std::string_view key, bool required, double max,
                    double* out) {
  SLUICE_RETURN_IF_ERROR(reader.status());
  if (!reader.Has(key)) {
    reader.Ignore(key);
    if (!required) return Status::Ok();
    return reader.Error(key, fmt::format("is required (a number in (0, {}])", max));
  }
  const nlohmann::json* v = reader.Child(key);
  if (v->is_number()) {
    const double value = v->get<double>();
    if (std::isfinite(value) && value > 0 && value <= max) {
      *out = value;
      return Status::Ok();
    }
  }
  std::string shown = v->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  return reader.Error(key, fmt::format("must be a number in (0, {}], got {}", max, shown));
}

nlohmann::json NumberJson(double v) {
  constexpr double kExactIntegers = 9007199254740992.0;  // 2^53
  if (std::isfinite(v) && std::floor(v) == v && std::fabs(v) < kExactIntegers) {
    return nlohmann::json(static_cast<int64_t>(v));
  }
  return nlohmann::json(v);
}

double DivideForJson(double value, double scale) {
  const double guess = value / scale;
  if (guess * scale == value) return guess;
  double up = guess;
  double down = guess;
  for (int step = 0; step < 4; ++step) {
    up = std::nextafter(up, HUGE_VAL);
    down = std::nextafter(down, -HUGE_VAL);
    if (up * scale == value) return up;
    if (down * scale == value) return down;
  }
  return guess;
}

std::optional<int64_t> ParseDecimal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> low;
  std::vector<int64_t> high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

std::string JoinInts(const std::vector<int64_t>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  return out;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::vector<std::string_view> views(names.begin(), names.end());
  return JoinAllowed(views);
}

}  // namespace sluice::model_internal
