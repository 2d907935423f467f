#include "runtime/job_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <unordered_map>

#include "runtime/job_store_wire.h"

namespace sluice::runtime {

using namespace store_wire;  // NOLINT: the wire helpers of this file's protocol

// ---- StoreConnection ----

namespace {

// Connects one address with a deadline; returns the fd or -1 with errno set.
int ConnectOnce(const addrinfo* a, Clock::time_point deadline) {
  const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      const int err = errno;
      close(fd);
      errno = err;
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const int rc = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    int err = 0;
    socklen_t len = sizeof err;
    if (rc <= 0) {
      err = ETIMEDOUT;
    } else {
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err != 0) {
      close(fd);
      errno = err;
      return -1;
    }
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

StatusOr<std::unique_ptr<StoreConnection>> StoreConnection::Connect(
    const std::string& host, int port, const std::string& run_id, std::chrono::milliseconds timeout,
    Clock::time_point connect_deadline) {
  SLUICE_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host, port, /*passive=*/false));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  const std::string where = fmt::format("{}:{}", host, port);
  int last_err = 0;
  const Clock::time_point start = Clock::now();
  for (;;) {
    for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const int fd = ConnectOnce(a, std::max(connect_deadline, Clock::now() + timeout));
      if (fd < 0) {
        last_err = errno;
        continue;
      }
      std::unique_ptr<StoreConnection> c(new StoreConnection(fd, where, run_id + "/", timeout));
      std::string hello(1, static_cast<char>(Op::kHello));
      PutStr(&hello, run_id);
      StatusOr<std::string> r = c->Call(hello, timeout, "hello");
      if (!r.ok()) {
        return FailedPreconditionError(fmt::format(
            "the store at {} (MASTER_ADDR:MASTER_PORT) refused this job (run id '{}'): {}{}", where,
            run_id, r.status().message(),
            r.status().message().find("serves run id") != std::string::npos
                ? "; another job uses this MASTER_PORT: give each job its own port or the same "
                  "--run-id to all its ranks"
                : ""));
      }
      return c;
    }
    if (Clock::now() >= connect_deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return FailedPreconditionError(fmt::format(
      "could not reach the store at {} (MASTER_ADDR:MASTER_PORT) within {}: {}; rank 0, which "
      "serves it, has not started or has exited, or the address is wrong",
      where, Secs(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start)),
      std::strerror(last_err)));
}

StoreConnection::~StoreConnection() {
  if (fd_ >= 0) close(fd_);
}

StatusOr<std::string> StoreConnection::Call(const std::string& request,
                                            std::chrono::milliseconds wait,
                                            const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    return FailedPreconditionError(fmt::format(
        "store {}: the connection to {} was closed earlier: {}", what, where_, broken_));
  }
  const Clock::time_point deadline = Clock::now() + wait;
  const auto fail = [&](const std::string& why) -> Status {
    close(fd_);
    fd_ = -1;
    broken_ = why;
    return FailedPreconditionError(fmt::format("store {}: {}", what, why));
  };
  const auto left_ms = [&] {
    return static_cast<int>(std::clamp<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count(), 0,
        INT32_MAX));
  };
  const std::string frame = Frame(request);
  size_t sent = 0;
  while (sent < frame.size()) {
    pollfd p{fd_, POLLOUT, 0};
    const int rc = poll(&p, 1, left_ms());
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      return fail(
          fmt::format("{} did not take the request within {} (the process serving it "
                      "is stopped or hung, or the network failed)",
                      where_, Secs(wait)));
    }
    const ssize_t n = send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return fail(fmt::format("lost the connection to {}: {}", where_, std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  std::string in;
  size_t need = 4;
  bool have_len = false;
  char buf[65536];
  while (in.size() < need) {
    pollfd p{fd_, POLLIN, 0};
    const int rc = poll(&p, 1, left_ms());
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      const bool waits = what.rfind("get ", 0) == 0 || what.rfind("wait ", 0) == 0;
      return fail(
          waits ? fmt::format("not set within {} (or {} stopped answering)", Secs(wait), where_)
                : fmt::format("no answer from {} within {}", where_, Secs(wait)));
    }
    const ssize_t n = recv(fd_, buf, std::min(sizeof buf, need - in.size()), 0);
    if (n == 0) return fail(fmt::format("{} closed the connection", where_));
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return fail(fmt::format("lost the connection to {}: {}", where_, std::strerror(errno)));
    }
    in.append(buf, static_cast<size_t>(n));
    if (!have_len && in.size() == 4) {
      const uint32_t len = ReadU32(in.data());
      if (len == 0 || len > kMaxFrame) return fail("malformed reply");
      need = 4 + len;
      have_len = true;
    }
  }
  if (in[4] != '\0') {
    Reader r(std::string_view(in).substr(5));
    std::string message;
    r.Str(&message);
    (void)fail(message);
    return FailedPreconditionError(message);
  }
  return in.substr(5);
}

Status StoreConnection::Set(const std::string& key, const std::vector<uint8_t>& value) {
  std::string q(1, static_cast<char>(Op::kSet));
  PutStr(&q, prefix_ + key);
  PutStr(&q, std::string_view(reinterpret_cast<const char*>(value.data()), value.size()));
  return Call(q, timeout_, fmt::format("set of '{}'", key)).status();
}

StatusOr<std::vector<uint8_t>> StoreConnection::Get(const std::string& key) {
  return Get(key, timeout_);
}

StatusOr<std::vector<uint8_t>> StoreConnection::Get(const std::string& key,
                                                    std::chrono::milliseconds timeout) {
  std::string q(1, static_cast<char>(Op::kGet));
  PutStr(&q, prefix_ + key);
  StatusOr<std::string> r = Call(q, timeout, fmt::format("get of '{}'", key));
  if (!r.ok()) return r.status();
  Reader rd(*r);
  std::string v;
  if (!rd.Str(&v)) return FailedPreconditionError("store get: malformed reply");
  return std::vector<uint8_t>(v.begin(), v.end());
}

StatusOr<int64_t> StoreConnection::Add(const std::string& key, int64_t delta) {
  std::string q(1, static_cast<char>(Op::kAdd));
  PutStr(&q, prefix_ + key);
  PutI64(&q, delta);
  StatusOr<std::string> r = Call(q, timeout_, fmt::format("add to '{}'", key));
  if (!r.ok()) return r.status();
  Reader rd(*r);
  int64_t v = 0;
  if (!rd.I64(&v)) return FailedPreconditionError("store add: malformed reply");
  return v;
}

StatusOr<bool> StoreConnection::Check(const std::vector<std::string>& keys) {
  std::string q(1, static_cast<char>(Op::kCheck));
  PutU32(&q, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) PutStr(&q, prefix_ + k);
  StatusOr<std::string> r = Call(q, timeout_, "check");
  if (!r.ok()) return r.status();
  return !r->empty() && (*r)[0] == '\1';
}

StatusOr<bool> StoreConnection::Delete(const std::string& key) {
  std::string q(1, static_cast<char>(Op::kDelete));
  PutStr(&q, prefix_ + key);
  StatusOr<std::string> r = Call(q, timeout_, fmt::format("delete of '{}'", key));
  if (!r.ok()) return r.status();
  return !r->empty() && (*r)[0] == '\1';
}

StatusOr<int64_t> StoreConnection::NumKeys() {
  StatusOr<std::string> r =
      Call(std::string(1, static_cast<char>(Op::kNumKeys)), timeout_, "key count");
  if (!r.ok()) return r.status();
  Reader rd(*r);
  int64_t v = 0;
  if (!rd.I64(&v)) return FailedPreconditionError("store key count: malformed reply");
  return v;
}

Status StoreConnection::Wait(const std::vector<std::string>& keys,
                             std::chrono::milliseconds timeout) {
  std::string q(1, static_cast<char>(Op::kWait));
  PutU32(&q, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) PutStr(&q, prefix_ + k);
  std::string names;
  for (const std::string& k : keys) names += (names.empty() ? "'" : ", '") + k + "'";
  return Call(q, timeout, fmt::format("wait for {}", names)).status();
}

StatusOr<std::vector<uint8_t>> StoreConnection::CompareSet(const std::string& key,
                                                           const std::vector<uint8_t>& expected,
                                                           const std::vector<uint8_t>& desired) {
  std::string q(1, static_cast<char>(Op::kCompareSet));
  PutStr(&q, prefix_ + key);
  PutStr(&q, std::string_view(reinterpret_cast<const char*>(expected.data()), expected.size()));
  PutStr(&q, std::string_view(reinterpret_cast<const char*>(desired.data()), desired.size()));
  StatusOr<std::string> r = Call(q, timeout_, fmt::format("compare-set of '{}'", key));
  if (!r.ok()) return r.status();
  Reader rd(*r);
  std::string v;
  if (!rd.Str(&v)) return FailedPreconditionError("store compare-set: malformed reply");
  return std::vector<uint8_t>(v.begin(), v.end());
}

}  // namespace sluice::runtime
