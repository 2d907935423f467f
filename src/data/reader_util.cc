#include "data/reader_util.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>

namespace sluice::data_internal {
namespace {

Status CheckRange(int64_t v, const Where& where) {
  if (v < 0) return where.Error(fmt::format("a length must be >= 0, got {}", v));
  if (v > kMaxLength) {
    return where.Error(fmt::format("a length must be at most {}, got {}", kMaxLength, v));
  }
  return Status::Ok();
}

}  // namespace

std::string Quote(std::string_view s) {
  std::string out = "'";
  const size_t n = std::min<size_t>(s.size(), 40);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > n) out += "...";
  out += "'";
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

Status Where::Error(std::string_view problem) const {
  return InvalidArgumentError(fmt::format("{}:{}: {}: {}", source, line, what, problem));
}

Status ParseLengthToken(std::string_view token, const Where& where, int64_t* out) {
  const bool negative = !token.empty() && token.front() == '-';
  std::string_view digits = negative ? token.substr(1) : token;
  if (const size_t dot = digits.find('.'); dot != std::string_view::npos && dot > 0) {
    const std::string_view fraction = digits.substr(dot + 1);
    if (!fraction.empty() && fraction.find_first_not_of('0') == std::string_view::npos) {
      digits = digits.substr(0, dot);
    }
  }
  bool all_digits = !digits.empty();
  for (char c : digits) all_digits = all_digits && c >= '0' && c <= '9';
  if (!all_digits) {
    return where.Error(fmt::format("expected a non-negative integer, got {}", Quote(token)));
  }
  if (negative) return where.Error(fmt::format("a length must be >= 0, got {}", Quote(token)));
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || ptr != digits.data() + digits.size()) {
    return where.Error(
        fmt::format("a length must be at most {}, got {}", kMaxLength, Quote(token)));
  }
  SLUICE_RETURN_IF_ERROR(CheckRange(v, where));
  *out = v;
  return Status::Ok();
}

Status CheckNotEmpty(int64_t input, int64_t target, std::string_view source, int64_t line) {
  if (input + target > 0) return Status::Ok();
  return InvalidArgumentError(fmt::format(
      "{}:{}: empty sample: input and target lengths are both 0 (a sample needs a token)", source,
      line));
}

Status NoSamples(std::string_view source) {
  return InvalidArgumentError(
      fmt::format("{}: no samples (the input is empty or has only blank lines)", source));
}

}  // namespace sluice::data_internal
