// The job store's wire format and socket helpers, shared by its server (job_store_server.cc) and
// its connection (job_store.cc). Internal to runtime/job_store.*; job_store.h documents the
// protocol: length-prefixed frames (u32 little-endian), a one-byte op, length-prefixed strings.
#pragma once

#include <fcntl.h>
#include <fmt/core.h>
#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace sluice::runtime::store_wire {

using Clock = std::chrono::steady_clock;

enum class Op : uint8_t {
  kHello = 1,
  kSet,
  kGet,
  kAdd,
  kCheck,
  kDelete,
  kNumKeys,
  kWait,
  kCompareSet,
};
constexpr uint32_t kMaxFrame = 1u << 30;  // 1 GiB: larger frames are a protocol error

inline void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void PutI64(std::string* s, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
inline void PutStr(std::string* s, std::string_view v) {
  PutU32(s, static_cast<uint32_t>(v.size()));
  s->append(v);
}
inline std::string Frame(const std::string& payload) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(payload.size()));
  return out + payload;
}
inline uint32_t ReadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Reads fields from a payload; every getter fails (returns false) past the end.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool U8(uint8_t* v) {
    if (s_.size() < 1) return false;
    *v = static_cast<uint8_t>(s_[0]);
    s_.remove_prefix(1);
    return true;
  }
  bool U32(uint32_t* v) {
    if (s_.size() < 4) return false;
    *v = ReadU32(s_.data());
    s_.remove_prefix(4);
    return true;
  }
  bool I64(int64_t* v) {
    if (s_.size() < 8) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(s_[i])) << (8 * i);
    *v = static_cast<int64_t>(u);
    s_.remove_prefix(8);
    return true;
  }
  bool Str(std::string* v) {
    uint32_t n = 0;
    if (!U32(&n) || s_.size() < n) return false;
    v->assign(s_.data(), n);
    s_.remove_prefix(n);
    return true;
  }
  bool done() const { return s_.empty(); }

 private:
  std::string_view s_;
};

inline std::string AddrText(const sockaddr* a) {
  char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
  const socklen_t len = a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  getnameinfo(a, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV);
  return a->sa_family == AF_INET6 ? fmt::format("[{}]:{}", host, serv)
                                  : fmt::format("{}:{}", host, serv);
}

inline StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return InvalidArgumentError(
        fmt::format("cannot resolve '{}' (MASTER_ADDR): {}", host, gai_strerror(rc)));
  }
  return res;
}

inline void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

inline std::string Secs(std::chrono::milliseconds d) {
  return fmt::format("{:g} s", static_cast<double>(d.count()) / 1000.0);
}

}  // namespace sluice::runtime::store_wire
