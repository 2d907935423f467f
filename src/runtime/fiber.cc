#include "runtime/fiber.h"

#include "base/status.h"

namespace sluice::runtime {

Fiber::~Fiber() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) {
      abort_ = true;
      body_turn_ = true;
    }
  }
  cv_.notify_all();
  thread_.join();
}

void Fiber::Resume() {
  SLUICE_CHECK(!finished_);
  std::unique_lock<std::mutex> lock(mu_);
  body_turn_ = true;
  if (!thread_.joinable()) {
    thread_ = std::thread([this] {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return body_turn_; });
      }
      try {
        body_();
      } catch (const FiberAborted&) {
        // Destroyed while suspended: unwind quietly.
      } catch (...) {
        error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> l(mu_);
      finished_ = true;
      body_turn_ = false;
      cv_.notify_all();
    });
  } else {
    cv_.notify_all();
  }
  cv_.wait(lock, [this] { return !body_turn_; });
}

void Fiber::Suspend() {
  std::unique_lock<std::mutex> lock(mu_);
  body_turn_ = false;
  cv_.notify_all();
  cv_.wait(lock, [this] { return body_turn_; });
  if (abort_) throw FiberAborted();
}

}  // namespace sluice::runtime
