// Helpers shared by the model/ readers, writers and validators (not part of the public API).
//
// Messages follow JsonObjectReader's form, "<source>: field '<field>': <problem>", so that a
// problem found after reading (a relation between fields) reads like one found while reading.
// Numbers are written so that reading them back gives the same value bit for bit.
//
// Thread safety: stateless functions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json_util.h"
#include "base/status.h"

namespace sluice::model_internal {

// InvalidArgument "<source>: field '<field>': <problem>".
Status FieldError(std::string_view source, std::string_view field, std::string_view problem);

// OK when lo <= value <= hi; else "must be an integer in [lo, hi], got value".
Status CheckIntRange(std::string_view source, std::string_view field, int64_t value, int64_t lo,
                     int64_t hi);
// OK when 0 < value <= hi (and finite); else "must be a number in (0, hi], got value".
Status CheckPositive(std::string_view source, std::string_view field, double value, double hi);

// Reads `key` as a number in (0, max]. Absent: an error when `required`, else *out is unchanged.
Status ReadPositive(JsonObjectReader& reader, std::string_view key, bool required, double max,
                    double* out);

// A JSON number for `v`: an integer when `v` is whole and below 2^53, else a double.
nlohmann::json NumberJson(double v);
// `value / scale`, moved by up to a few ulps so that `result * scale == value` where such a
// double exists: the number a reader that multiplies by `scale` turns back into `value`.
double DivideForJson(double value, double scale);

// A plain decimal integer ("16", "0042"); nullopt for a sign, a space, other characters, an empty
// string or a value beyond int64.
std::optional<int64_t> ParseDecimal(std::string_view text);

// The divisors of n >= 1 in increasing order.
std::vector<int64_t> Divisors(int64_t n);
// "1, 2, 4, 8".
std::string JoinInts(const std::vector<int64_t>& values);
// "'a', 'b' or 'c'" for a list of names.
std::string JoinNames(const std::vector<std::string>& names);

}  // namespace sluice::model_internal
