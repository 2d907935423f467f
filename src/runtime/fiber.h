// Fiber: a body that runs on a thread of its own, one step at a time, as a coroutine of the
// thread that resumes it. Exactly one of the two runs at any moment: Resume() blocks the caller
// until the body calls Suspend() or returns, and Suspend() blocks the body until the next
// Resume(). The executor runs a segmented MoE compute op this way (executor.cc): the op's code
// (a forward, or an autograd backward that is inside the engine) stops where it needs an
// all-to-all's result, the
// executor goes on with the program (other pieces, weight gradients, transfers) while the
// all-to-all travels, and a later piece resumes the op where it stopped. The handoff through one
// mutex orders every memory access of the body before the caller's next step and back, so the
// two may share state without further locks.
//
// A fiber destroyed while suspended is aborted: its Suspend() throws FiberAborted, which the
// body lets unwind (the thread is joined). A body's escaped exception is kept for the caller.
//
// Thread safety: Resume, finished, error and the destructor from one (the owning) thread;
// Suspend only from the body.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace sluice::runtime {

struct FiberAborted : std::runtime_error {
  FiberAborted() : std::runtime_error("fiber aborted") {}
};

class Fiber {
 public:
  explicit Fiber(std::function<void()> body) : body_(std::move(body)) {}
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Runs the body (starting its thread the first time) until it suspends or returns.
  // REQUIRES: !finished().
  void Resume();
  // Whether the body returned (or threw).
  bool finished() const { return finished_; }
  // The exception the body threw (null when none).
  std::exception_ptr error() const { return error_; }
  // From the body: hands control back to the resumer until the next Resume. Throws FiberAborted
  // when the fiber is destroyed instead.
  void Suspend();

 private:
  std::function<void()> body_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool body_turn_ = false;  // guarded by mu_
  bool abort_ = false;      // guarded by mu_
  bool finished_ = false;   // written by the body before it hands back for the last time
  std::exception_ptr error_;
};

}  // namespace sluice::runtime
