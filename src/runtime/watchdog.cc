// The rank's watchdog (Watchdog) and the deadline guard (DeadlineGuard) of runtime/comm.h: moved
// out of comm.cc, which keeps the store client and the communicator.
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <thread>

#include "runtime/comm.h"

namespace sluice::runtime {
namespace {

constexpr auto kBeat = std::chrono::milliseconds(200);
// A heartbeat counter at or above this marks a rank that finished cleanly.
constexpr int64_t kFinishedBeat = int64_t{1} << 40;
// How long the store may fail before the watchdog gives up on it.
constexpr auto kStoreGrace = std::chrono::seconds(2);

std::string HeartbeatKey(int64_t rank) { return fmt::format("sluice/hb/{}", rank); }
// "<iteration> <instruction>\n<what the main thread waits in, or empty>\n<awaited ranks, comma
// separated>"
std::string ProgressKey(int64_t rank) { return fmt::format("sluice/progress/{}", rank); }
constexpr const char* kAbortCount = "sluice/abort/count";
constexpr const char* kAbortMessage = "sluice/abort/message";

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

// ---- DeadlineGuard ----

DeadlineGuard::DeadlineGuard(int64_t rank, std::chrono::milliseconds limit, std::string message) {
  thread_ = std::thread([this, rank, limit, message = std::move(message)] {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, limit, [&] { return done_; })) return;
    std::fprintf(stderr, "sluice: rank %ld: %s (not done within %.0f s)\n", static_cast<long>(rank),
                 message.c_str(), std::chrono::duration<double>(limit).count());
    std::fflush(stderr);
    std::fflush(stdout);
    _exit(1);
  });
}

DeadlineGuard::~DeadlineGuard() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

// ---- Watchdog ----

StatusOr<std::unique_ptr<Watchdog>> Watchdog::Start(const DistEnv& env,
                                                    std::chrono::milliseconds timeout) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<StoreClient> store, StoreClient::Connect(env, timeout));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<StoreClient> beat_store,
                          StoreClient::Connect(env, timeout));
  std::unique_ptr<Watchdog> w(
      new Watchdog(env, timeout, std::move(store), std::move(beat_store)));
  SLUICE_RETURN_IF_ERROR(w->store_->Add(HeartbeatKey(env.rank), 1).status());
  w->beat_thread_ = std::thread([p = w.get()] { p->BeatLoop(); });
  w->thread_ = std::thread([p = w.get()] { p->Loop(); });
  return w;
}

Watchdog::Watchdog(const DistEnv& env, std::chrono::milliseconds timeout,
                   std::unique_ptr<StoreClient> store, std::unique_ptr<StoreClient> beat_store)
    : env_(env), timeout_(timeout), store_(std::move(store)), beat_store_(std::move(beat_store)) {}

Watchdog::~Watchdog() {
  stop_ = true;
  stop_beat_ = true;
  if (thread_.joinable()) thread_.join();
  if (beat_thread_.joinable()) beat_thread_.join();
}

void Watchdog::BeginWait(std::string what, int64_t peer) {
  BeginWait(std::move(what), std::vector<int64_t>{peer});
}

void Watchdog::BeginWait(std::string what, std::vector<int64_t> peers) {
  std::lock_guard<std::mutex> lock(mu_);
  wait_what_ = std::move(what);
  wait_peers_ = std::move(peers);
  wait_since_ = std::chrono::steady_clock::now();
}

void Watchdog::EndWait() {
  std::lock_guard<std::mutex> lock(mu_);
  wait_what_.clear();
}

std::string Watchdog::Chain(int64_t peer) {
  // Follow "rank p waits for rank q" through the published progress keys to the rank that is
  // not waiting (hung, or computing) or whose heartbeat stopped.
  std::vector<int64_t> path{peer};
  std::string tail;
  for (int64_t step = 0; step < env_.world_size; ++step) {
    const int64_t cur = path.back();
    StatusOr<bool> has = store_->Check(ProgressKey(cur));
    if (!has.ok() || !*has) break;
    StatusOr<std::string> text = store_->GetString(ProgressKey(cur));
    if (!text.ok()) break;
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t nl; (nl = text->find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(text->substr(start, nl - start));
    }
    lines.push_back(text->substr(start));
    lines.resize(3);
    if (lines[1].empty()) {
      tail = fmt::format(
          "; rank {} is not waiting for anyone (it is at iteration {}): it is "
          "the one that hangs",
          cur, lines[0].substr(0, lines[0].find(' ')));
      break;
    }
    int64_t next = -1;
    if (!lines[2].empty() && lines[2].find(',') == std::string::npos) {
      std::from_chars(lines[2].data(), lines[2].data() + lines[2].size(), next);
    }
    if (next < 0 || next == env_.rank || std::find(path.begin(), path.end(), next) != path.end()) {
      tail = fmt::format("; rank {} waits in {}", cur, lines[1]);
      break;
    }
    path.push_back(next);
  }
  if (path.size() == 1) return tail;
  std::string chain;
  for (size_t i = 1; i < path.size(); ++i) {
    chain += fmt::format("{}rank {}", i == 1 ? "" : ", which waits for ", path[i]);
  }
  return fmt::format(", which waits for {}{}", chain, tail);
}

std::string Watchdog::Blame(const std::vector<int64_t>& peers, const std::string& what) {
  auto beats = [&] {
    std::vector<int64_t> out;
    for (const int64_t p : peers) {
      StatusOr<int64_t> c = store_->Add(HeartbeatKey(p), 0);
      out.push_back(c.ok() ? *c : -1);
    }
    return out;
  };
  const std::vector<int64_t> before = beats();
  std::this_thread::sleep_for(kBeat * 4);
  const std::vector<int64_t> after = beats();
  std::vector<std::string> blamed;
  for (size_t i = 0; i < peers.size(); ++i) {
    if (after[i] < kFinishedBeat && after[i] == before[i]) {
      blamed.push_back(fmt::format("rank {} is dead or stopped (no heartbeat)", peers[i]));
    }
  }
  if (blamed.empty()) {
    for (size_t i = 0; i < peers.size(); ++i) {
      const int64_t p = peers[i];
      if (after[i] >= kFinishedBeat) continue;  // finished cleanly
      StatusOr<bool> has = store_->Check(ProgressKey(p));
      if (!has.ok() || !*has) continue;
      StatusOr<std::string> text = store_->GetString(ProgressKey(p));
      if (!text.ok()) continue;
      const size_t nl = text->find('\n');
      const std::string where = text->substr(0, nl);
      std::string waiting = nl == std::string::npos ? "" : text->substr(nl + 1);
      waiting = waiting.substr(0, waiting.find('\n'));
      if (waiting != what) {
        const size_t sp = where.find(' ');
        blamed.push_back(
            fmt::format("rank {} has not joined it (it is at iteration {}, instruction {}{})", p,
                        where.substr(0, sp), sp == std::string::npos ? "?" : where.substr(sp + 1),
                        waiting.empty() ? ", not waiting" : ", waiting in " + waiting + Chain(p)));
      }
    }
  }
  std::string out;
  for (const std::string& b : blamed) out += (out.empty() ? "" : "; ") + b;
  return out;
}

bool Watchdog::Abort(const std::string& message) {
  StatusOr<int64_t> n = store_->Add(kAbortCount, 1);
  if (n.ok() && *n == 1) return store_->SetString(kAbortMessage, message).ok();
  return n.ok();
}

StatusOr<std::optional<std::string>> Watchdog::ReadPostedFailure() {
  StatusOr<int64_t> n = store_->Add(kAbortCount, 0);
  if (!n.ok()) return n.status();
  if (*n == 0) return std::optional<std::string>();
  StatusOr<std::string> m = store_->GetString(kAbortMessage);
  if (!m.ok()) return m.status();
  return std::optional<std::string>(*m);
}

std::optional<std::string> Watchdog::PostedFailure() {
  StatusOr<std::optional<std::string>> r = ReadPostedFailure();
  return r.ok() ? *r : std::nullopt;
}

void Watchdog::Finish() {
  stop_ = true;
  stop_beat_ = true;
  if (thread_.joinable()) thread_.join();
  if (beat_thread_.joinable()) beat_thread_.join();
  (void)store_->Add(HeartbeatKey(env_.rank), kFinishedBeat);
}

void Watchdog::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Die(const std::string& message) {
  std::fprintf(stderr, "sluice: rank %ld: %s\n", static_cast<long>(env_.rank), message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  _exit(1);
}

void Watchdog::BeatLoop() {
  while (!stop_beat_) {
    std::this_thread::sleep_for(kBeat);
    if (stop_beat_) break;
    if (!beat_store_->Add(HeartbeatKey(env_.rank), 1).ok()) continue;  // Loop reports it
    const int64_t pos = progress_.load();
    std::string waiting, peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiting = wait_what_;
      if (!waiting.empty()) peers = fmt::format("{}", fmt::join(wait_peers_, ","));
    }
    (void)beat_store_->SetString(
        ProgressKey(env_.rank),
        fmt::format("{} {}\n{}\n{}", pos >> 32, pos & 0xffffffff, waiting, peers));
  }
}

void Watchdog::Loop() {
  using Clock = std::chrono::steady_clock;
  const int64_t world = env_.world_size;
  std::vector<int64_t> last_count(world, -1);
  std::vector<Clock::time_point> last_change(world, Clock::now());
  Clock::time_point store_failing_since{};
  bool store_failing = false;
  while (!stop_) {
    std::this_thread::sleep_for(kBeat);
    if (stop_) break;
    const Clock::time_point now = Clock::now();
    StatusOr<int64_t> aborts = store_->Add(kAbortCount, 0);
    if (!aborts.ok()) {
      if (!store_failing) store_failing_since = now;
      store_failing = true;
      if (now - store_failing_since > kStoreGrace) {
        Die(
            fmt::format("lost the rendezvous store served by rank 0 at {}:{}: rank 0 died, "
                        "stopped or hung, or the network failed ({})",
                        env_.master_addr, env_.master_port, aborts.status().message()));
      }
      continue;
    }
    store_failing = false;
    if (*aborts > 0) {
      StatusOr<std::string> msg = store_->GetString(kAbortMessage);
      // Rank 0 serves the store: it stays a moment so that the others read the cause too
      // instead of only losing the store.
      if (env_.rank == 0) std::this_thread::sleep_for(kLinger);
      Die(fmt::format("stopping: {}", msg.ok() ? *msg : "another rank failed"));
    }
    for (int64_t j = 0; j < world; ++j) {
      if (j == env_.rank) continue;
      StatusOr<int64_t> c = store_->Add(HeartbeatKey(j), 0);
      if (!c.ok() || *c >= kFinishedBeat) continue;
      if (*c != last_count[j]) {
        last_count[j] = *c;
        last_change[j] = now;
      } else if (now - last_change[j] > timeout_) {
        const std::string m =
            fmt::format("rank {} stopped responding (no heartbeat for {:.0f} s, detected by rank {})",
                        j, Seconds(now - last_change[j]), env_.rank);
        if (std::optional<std::string> posted = PostedFailure()) Die("stopping: " + *posted);
        Abort(m);
        std::this_thread::sleep_for(kLinger);
        Die(m);
      }
    }
    std::string what;
    std::vector<int64_t> peers;
    Clock::duration waited{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!wait_what_.empty()) {
        what = wait_what_;
        peers = wait_peers_;
        waited = now - wait_since_;
      }
    }
    if (!what.empty() && waited > timeout_) {
      std::string culprit;
      if (peers.size() == 1) {
        const std::string chain = Chain(peers[0]);
        culprit = chain.empty() ? fmt::format(" waiting for rank {} (hung or dead)", peers[0])
                                : fmt::format(" waiting for rank {}{}", peers[0], chain);
      } else if (!peers.empty()) {
        const std::string b = Blame(peers, what);
        culprit = b.empty() ? fmt::format(" waiting for ranks {}", fmt::join(peers, ", "))
                            : ": " + b;
      }
      const std::string m = fmt::format("rank {} timed out after {:.0f} s in {}{}", env_.rank,
                                        Seconds(waited), what, culprit);
      if (std::optional<std::string> posted = PostedFailure()) Die("stopping: " + *posted);
      Abort(m);
      std::this_thread::sleep_for(kLinger);
      Die(m);
    }
  }
}

}  // namespace sluice::runtime
