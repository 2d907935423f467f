// Counts for terminal output and reports: digits grouped by three with commas.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice {

// "1234567" -> "1,234,567": commas between groups of three in a string of decimal digits.
std::string GroupDigits(std::string_view digits);
// 1234567 -> "1,234,567", -1234 -> "-1,234".
std::string FormatCount(int64_t n);

}  // namespace sluice
