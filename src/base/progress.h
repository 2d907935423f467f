// Progress: a one-line progress bar for long work, drawn on a terminal only.
//
// On a TTY it redraws "label [#####.....] 123/456 12.3/s ETA 4s" at most ten times a second;
// when the stream is not a terminal (CI logs, pipes) it prints nothing until Finish(), which
// writes one summary line, so logs stay short. Work shorter than `min_total` shows nothing.
//
// Thread safety: one thread calls Add(); not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace sluice {

class Progress {
 public:
  // `total` units of work; 0 means unknown (the bar then counts without a fraction).
  Progress(std::string label, int64_t total, std::FILE* out = stderr, int64_t min_total = 2);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(int64_t n = 1);
  // Erases the bar from the terminal so the caller can print lines; the next Add() redraws it.
  void Clear();
  // Draws the final state and ends the line. Called by the destructor if not called before.
  void Finish();

 private:
  void Draw(bool final);

  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  std::FILE* out_;
  bool tty_;
  bool enabled_;
  bool finished_ = false;
  bool drawn_ = false;  // a bar is on the terminal line
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace sluice
