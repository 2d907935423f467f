#include "base/numbers.h"

namespace sluice {

std::string GroupDigits(std::string_view digits) {
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string FormatCount(int64_t n) {
  const uint64_t magnitude = n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
  const std::string grouped = GroupDigits(std::to_string(magnitude));
  return n < 0 ? "-" + grouped : grouped;
}

}  // namespace sluice
