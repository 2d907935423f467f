#include "base/progress.h"

#include <fmt/core.h>
#include <unistd.h>

namespace sluice {

Progress::Progress(std::string label, int64_t total, std::FILE* out, int64_t min_total)
    : label_(std::move(label)),
      total_(total),
      out_(out),
      tty_(out != nullptr && isatty(fileno(out)) != 0),
      enabled_(out != nullptr && (total == 0 || total >= min_total)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { Finish(); }

void Progress::Add(int64_t n) {
  done_ += n;
  if (!enabled_ || !tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  Draw(false);
}

void Progress::Clear() {
  if (!tty_ || !drawn_) return;
  fmt::print(out_, "\r\033[K");
  std::fflush(out_);
  drawn_ = false;
}

void Progress::Finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) Draw(true);
}

void Progress::Draw(bool final) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  std::string line;
  if (total_ > 0) {
    constexpr int kWidth = 30;
    const double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : 0.0;
    line = fmt::format("{} [{}] {}/{} {:.1f}/s", label_, bar, done_, total_, rate);
    if (!final) line += fmt::format(" ETA {:.0f}s", eta);
  } else {
    line = fmt::format("{} {} done {:.1f}/s", label_, done_, rate);
  }
  if (final) line += fmt::format(" in {:.1f}s", elapsed);
  if (tty_) {
    fmt::print(out_, "\r\033[K{}{}", line, final ? "\n" : "");
    drawn_ = !final;
  } else if (final) {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

}  // namespace sluice
