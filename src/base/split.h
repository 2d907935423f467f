// Splitting a flag's text into its separated parts.
//
// Thread safety: pure functions.
#pragma once

#include <string_view>
#include <vector>

namespace sluice {

// The parts of `text` between the separators, in order, empty parts kept: "a,,b" -> {"a", "",
// "b"}, "" -> {""}, "a," -> {"a", ""}. The views point into `text`.
std::vector<std::string_view> SplitOn(std::string_view text, char separator);

}  // namespace sluice
