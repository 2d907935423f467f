#include "runtime/comm.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstdio>

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace sluice::runtime {
namespace {

constexpr auto kBeat = std::chrono::milliseconds(200);
// A heartbeat counter at or above this marks a rank that finished cleanly.
constexpr int64_t kFinishedBeat = int64_t{1} << 40;
// How long the store may fail before the watchdog gives up on it.
constexpr auto kStoreGrace = std::chrono::seconds(2);

std::string HeartbeatKey(int64_t rank) { return fmt::format("sluice/hb/{}", rank); }
// "<iteration> <instruction>\n<what the main thread waits in, or empty>"
std::string ProgressKey(int64_t rank) { return fmt::format("sluice/progress/{}", rank); }
constexpr const char* kAbortCount = "sluice/abort/count";
constexpr const char* kAbortMessage = "sluice/abort/message";

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

c10::intrusive_ptr<c10d::ProcessGroup> MakeGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const std::string& name, int64_t rank,
                                                 int64_t size, Backend backend,
                                                 std::chrono::milliseconds timeout) {
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("sluice/pg/" + name, store);
#ifdef USE_C10D_NCCL
  if (backend == Backend::kNccl) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, static_cast<int>(rank),
                                                       static_cast<int>(size), opts);
  }
#endif
  (void)backend;
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(rank),
                                                     static_cast<int>(size), opts);
}

}  // namespace

// ---- StoreClient ----

StatusOr<std::unique_ptr<StoreClient>> StoreClient::Connect(const DistEnv& env, bool join,
                                                           std::chrono::milliseconds timeout) {
  const std::string where = fmt::format("{}:{}", env.master_addr, env.master_port);
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(env.master_port);
  o.isServer = join && env.rank == 0;
  o.numWorkers = join ? c10::optional<size_t>(env.world_size) : c10::nullopt;
  o.waitWorkers = join;
  o.timeout = timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
    return std::unique_ptr<StoreClient>(new StoreClient(std::move(store), where));
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format(
        "rank {}: rendezvous at {} (MASTER_ADDR:MASTER_PORT) failed{}: {}", env.rank, where,
        join ? fmt::format(" (waiting for {} ranks for {:.0f} s)", env.world_size,
                           Seconds(timeout))
             : "",
        e.what()));
  }
}

Status StoreClient::Error(const std::string& op, const std::string& key,
                          const std::exception& e) const {
  return FailedPreconditionError(fmt::format(
      "store {} of '{}' failed: {}; the store at {} is served by rank 0 (did rank 0 die?)", op,
      key, e.what(), where_));
}

Status StoreClient::Set(const std::string& key, const std::vector<uint8_t>& value) {
  try {
    store_->set(key, value);
    return Status::Ok();
  } catch (const std::exception& e) {
    return Error("set", key, e);
  }
}

Status StoreClient::SetString(const std::string& key, const std::string& value) {
  return Set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

StatusOr<std::vector<uint8_t>> StoreClient::Get(const std::string& key) {
  try {
    return store_->get(key);
  } catch (const std::exception& e) {
    return Error("get", key, e);
  }
}

StatusOr<std::string> StoreClient::GetString(const std::string& key) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<uint8_t> v, Get(key));
  return std::string(v.begin(), v.end());
}

StatusOr<int64_t> StoreClient::Add(const std::string& key, int64_t delta) {
  try {
    return store_->add(key, delta);
  } catch (const std::exception& e) {
    return Error("add", key, e);
  }
}

StatusOr<bool> StoreClient::Check(const std::string& key) {
  try {
    return store_->check({key});
  } catch (const std::exception& e) {
    return Error("check", key, e);
  }
}

Status StoreClient::Delete(const std::string& key) {
  try {
    store_->deleteKey(key);
    return Status::Ok();
  } catch (const std::exception& e) {
    return Error("delete", key, e);
  }
}

// ---- Watchdog ----

StatusOr<std::unique_ptr<Watchdog>> Watchdog::Start(const DistEnv& env,
                                                    std::chrono::milliseconds timeout) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<StoreClient> store,
                          StoreClient::Connect(env, /*join=*/false, timeout));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<StoreClient> beat_store,
                          StoreClient::Connect(env, /*join=*/false, timeout));
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
    for (const int64_t p : peers) {
      StatusOr<bool> has = store_->Check(ProgressKey(p));
      if (!has.ok() || !*has) continue;
      StatusOr<std::string> text = store_->GetString(ProgressKey(p));
      if (!text.ok()) continue;
      const size_t nl = text->find('\n');
      const std::string where = text->substr(0, nl);
      const std::string waiting = nl == std::string::npos ? "" : text->substr(nl + 1);
      if (waiting != what) {
        const size_t sp = where.find(' ');
        blamed.push_back(fmt::format(
            "rank {} has not joined it (it is at iteration {}, instruction {}{})", p,
            where.substr(0, sp), sp == std::string::npos ? "?" : where.substr(sp + 1),
            waiting.empty() ? ", not waiting" : ", waiting in " + waiting));
      }
    }
  }
  std::string out;
  for (const std::string& b : blamed) out += (out.empty() ? "" : "; ") + b;
  return out;
}

void Watchdog::Abort(const std::string& message) {
  StatusOr<int64_t> n = store_->Add(kAbortCount, 1);
  if (n.ok() && *n == 1) (void)store_->SetString(kAbortMessage, message);
}

std::optional<std::string> Watchdog::PostedFailure() {
  StatusOr<int64_t> n = store_->Add(kAbortCount, 0);
  if (!n.ok() || *n == 0) return std::nullopt;
  StatusOr<std::string> m = store_->GetString(kAbortMessage);
  if (!m.ok()) return std::nullopt;
  return *m;
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
    std::string waiting;
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiting = wait_what_;
    }
    (void)beat_store_->SetString(ProgressKey(env_.rank),
                                 fmt::format("{} {}\n{}", pos >> 32, pos & 0xffffffff, waiting));
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
        Die(fmt::format("lost the rendezvous store served by rank 0 at {}:{}: rank 0 died or "
                        "the network failed ({})",
                        env_.master_addr, env_.master_port, aborts.status().message()));
      }
      continue;
    }
    store_failing = false;
    if (*aborts > 0) {
      StatusOr<std::string> msg = store_->GetString(kAbortMessage);
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
        culprit = fmt::format(" waiting for rank {} (hung or dead)", peers[0]);
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

// ---- Communicator ----

StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    const DistEnv& env, const ParallelConfig& par, const std::vector<int64_t>& embedding_ranks,
    Backend backend, std::chrono::milliseconds timeout) {
#ifndef USE_C10D_NCCL
  if (backend == Backend::kNccl) {
    return InvalidArgumentError(
        "--backend nccl: this build's libtorch has no NCCL (USE_C10D_NCCL is not defined); use "
        "--backend gloo or build against a CUDA libtorch");
  }
#endif
  if (par.tp != 1 || par.ep != 1) {
    return InvalidArgumentError("the runtime supports tp = 1 and ep = 1 only");
  }
  if (env.world_size != par.dp * par.pp) {
    return InvalidArgumentError(fmt::format(
        "--parallel dp={} x pp={} needs {} processes, but WORLD_SIZE is {}", par.dp, par.pp,
        par.dp * par.pp, env.world_size));
  }
  std::unique_ptr<Communicator> c(new Communicator());
  c->env_ = env;
  c->par_ = par;
  SLUICE_ASSIGN_OR_RETURN(c->store_, StoreClient::Connect(env, /*join=*/true, timeout));
  // Gloo's own timeout stays above the watchdog's: a timed-out Gloo pair aborts the process
  // without a message, the watchdog names the rank.
  const std::chrono::milliseconds pg_timeout = timeout * 2 + std::chrono::seconds(60);
  const c10::intrusive_ptr<c10d::Store>& store = c->store_->store();
  const int64_t d = c->dp_index(), p = c->pp_index();
  try {
    c->world_ = MakeGroup(store, "world", env.rank, env.world_size, backend, pg_timeout);
    if (par.dp > 1) {
      c->dp_ = MakeGroup(store, fmt::format("dp{}", p), d, par.dp, backend, pg_timeout);
      for (int64_t k = 0; k < par.dp; ++k) {
        if (k != d) c->dp_peers_.push_back(k * par.pp + p);
      }
    }
    const auto it = std::find(embedding_ranks.begin(), embedding_ranks.end(), p);
    if (embedding_ranks.size() > 1 && it != embedding_ranks.end()) {
      c->emb_ = MakeGroup(store, fmt::format("emb{}", d), it - embedding_ranks.begin(),
                          static_cast<int64_t>(embedding_ranks.size()), backend, pg_timeout);
      for (const int64_t q : embedding_ranks) {
        if (q != p) c->emb_peers_.push_back(d * par.pp + q);
      }
    }
  } catch (const std::exception& e) {
    return FailedPreconditionError(
        fmt::format("rank {}: creating the process groups failed: {}", env.rank, e.what()));
  }
  return c;
}

StatusOr<Communicator::Handle> Communicator::Send(const at::Tensor& t, int64_t peer, int64_t tag) {
  try {
    std::vector<at::Tensor> v{t};
    return world_->send(v, static_cast<int>(peer), static_cast<int>(tag));
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("send to rank {} failed: {}", peer, e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::Recv(const at::Tensor& t, int64_t peer, int64_t tag) {
  try {
    std::vector<at::Tensor> v{t};
    return world_->recv(v, static_cast<int>(peer), static_cast<int>(tag));
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("receive from rank {} failed: {}", peer, e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::AllReduceDp(const at::Tensor& t) {
  if (!dp_) return InternalError("no data-parallel group (dp = 1)");
  try {
    std::vector<at::Tensor> v{t};
    return dp_->allreduce(v);
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("data-parallel all-reduce failed: {}", e.what()));
  }
}

StatusOr<Communicator::Handle> Communicator::AllReduceEmbedding(const at::Tensor& t) {
  if (!emb_) return InternalError("no embedding group");
  try {
    std::vector<at::Tensor> v{t};
    return emb_->allreduce(v);
  } catch (const std::exception& e) {
    return FailedPreconditionError(fmt::format("embedding all-reduce failed: {}", e.what()));
  }
}

Status Communicator::Wait(const Handle& h) {
  try {
    h->wait();
    return Status::Ok();
  } catch (const std::exception& e) {
    return FailedPreconditionError(e.what());
  }
}

}  // namespace sluice::runtime
