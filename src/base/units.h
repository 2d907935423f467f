// Units carried in types: Duration (int64 nanoseconds) and Bytes (int64 bytes).
//
// Inside sluice every time is a Duration and every memory size is Bytes; conversions to
// human units happen only at the edges (files and terminal output), through the named
// factories and accessors below. Files say their unit in the field name (`time_ms`, `mb`).
// "MB" in files and flags means 10^6 bytes: the profile tables use it (a GPT-6.7B layer's
// 12h^2+13h parameters in fp16 are 402.76e6 bytes; the table says 402.771 MB), and so do the
// memory limits quoted beside them (DynaPipe's 36,000 MB). MiB/GiB appear only in output.
//
// Thread safety: value types.
#pragma once

#include <cmath>
#include <compare>
#include <cstdint>
#include <limits>
#include <string>

namespace sluice {

class Duration {
 public:
  constexpr Duration() = default;
  static constexpr Duration Nanos(int64_t ns) { return Duration(ns); }
  static constexpr Duration Micros(double us) { return Duration(Round(us * 1e3)); }
  static constexpr Duration Millis(double ms) { return Duration(Round(ms * 1e6)); }
  static constexpr Duration Seconds(double s) { return Duration(Round(s * 1e9)); }
  static constexpr Duration Zero() { return Duration(0); }
  // A time longer than any schedule: the value of "never" and of infeasible costs.
  static constexpr Duration Infinite() { return Duration(std::numeric_limits<int64_t>::max()); }

  constexpr int64_t nanos() const { return ns_; }
  constexpr double micros() const { return static_cast<double>(ns_) * 1e-3; }
  constexpr double millis() const { return static_cast<double>(ns_) * 1e-6; }
  constexpr double seconds() const { return static_cast<double>(ns_) * 1e-9; }
  constexpr bool is_infinite() const { return ns_ == std::numeric_limits<int64_t>::max(); }

  constexpr Duration operator+(Duration o) const { return Duration(ns_ + o.ns_); }
  constexpr Duration operator-(Duration o) const { return Duration(ns_ - o.ns_); }
  constexpr Duration& operator+=(Duration o) {
    ns_ += o.ns_;
    return *this;
  }
  constexpr Duration& operator-=(Duration o) {
    ns_ -= o.ns_;
    return *this;
  }
  constexpr Duration operator*(int64_t k) const { return Duration(ns_ * k); }
  constexpr Duration Scaled(double k) const { return Duration(Round(static_cast<double>(ns_) * k)); }
  constexpr auto operator<=>(const Duration&) const = default;

 private:
  constexpr explicit Duration(int64_t ns) : ns_(ns) {}
  static constexpr int64_t Round(double v) {
    return static_cast<int64_t>(v < 0 ? v - 0.5 : v + 0.5);
  }
  int64_t ns_ = 0;
};

class Bytes {
 public:
  constexpr Bytes() = default;
  static constexpr Bytes Of(int64_t bytes) { return Bytes(bytes); }
  static constexpr Bytes MB(double v) { return Bytes(Round(v * 1e6)); }
  static constexpr Bytes KiB(double v) { return Bytes(Round(v * 1024.0)); }
  static constexpr Bytes MiB(double v) { return Bytes(Round(v * 1048576.0)); }
  static constexpr Bytes GiB(double v) { return Bytes(Round(v * 1073741824.0)); }
  static constexpr Bytes Zero() { return Bytes(0); }

  constexpr int64_t count() const { return n_; }
  constexpr double mb() const { return static_cast<double>(n_) * 1e-6; }
  constexpr double mib() const { return static_cast<double>(n_) / 1048576.0; }
  constexpr double gib() const { return static_cast<double>(n_) / 1073741824.0; }

  constexpr Bytes operator+(Bytes o) const { return Bytes(n_ + o.n_); }
  constexpr Bytes operator-(Bytes o) const { return Bytes(n_ - o.n_); }
  constexpr Bytes& operator+=(Bytes o) {
    n_ += o.n_;
    return *this;
  }
  constexpr Bytes& operator-=(Bytes o) {
    n_ -= o.n_;
    return *this;
  }
  constexpr Bytes operator*(int64_t k) const { return Bytes(n_ * k); }
  constexpr Bytes Scaled(double k) const { return Bytes(Round(static_cast<double>(n_) * k)); }
  constexpr auto operator<=>(const Bytes&) const = default;

 private:
  constexpr explicit Bytes(int64_t n) : n_(n) {}
  static constexpr int64_t Round(double v) {
    return static_cast<int64_t>(v < 0 ? v - 0.5 : v + 0.5);
  }
  int64_t n_ = 0;
};

// "12.5 ms", "3.20 s", "850 us": for terminal output.
std::string FormatDuration(Duration d);
// "1.50 GiB", "512.0 MiB", "64 B": for terminal output.
std::string FormatBytes(Bytes b);

}  // namespace sluice
