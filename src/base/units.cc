#include "base/units.h"

#include <fmt/core.h>

namespace sluice {

std::string FormatDuration(Duration d) {
  if (d.is_infinite()) return "inf";
  const double ns = static_cast<double>(d.nanos());
  const double a = std::fabs(ns);
  if (a >= 1e9) return fmt::format("{:.2f} s", ns * 1e-9);
  if (a >= 1e6) return fmt::format("{:.2f} ms", ns * 1e-6);
  if (a >= 1e3) return fmt::format("{:.1f} us", ns * 1e-3);
  return fmt::format("{} ns", d.nanos());
}

std::string FormatBytes(Bytes b) {
  const double n = static_cast<double>(b.count());
  const double a = std::fabs(n);
  if (a >= 1073741824.0) return fmt::format("{:.2f} GiB", n / 1073741824.0);
  if (a >= 1048576.0) return fmt::format("{:.1f} MiB", n / 1048576.0);
  if (a >= 1024.0) return fmt::format("{:.1f} KiB", n / 1024.0);
  return fmt::format("{} B", b.count());
}

}  // namespace sluice
