// The job store (job_store.h): operations, the run-id hello, the bound address and the bounded
// waits (a server that never answers must not block a client beyond its timeout).
#include "runtime/job_store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace sluice::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(JobStoreTest, Operations) {
  const int port = FreePort();
  auto server = StoreServer::Start("127.0.0.1", port, "job");
  ASSERT_TRUE(server.ok()) << server.status().message();
  EXPECT_EQ((*server)->bound(), "127.0.0.1:" + std::to_string(port));
  auto c = StoreConnection::Connect("127.0.0.1", port, "job", milliseconds(2000),
                                    Clock::now() + milliseconds(2000));
  ASSERT_TRUE(c.ok()) << c.status().message();
  StoreConnection& s = **c;
  ASSERT_TRUE(s.Set("a", Bytes("x")).ok());
  EXPECT_EQ(*s.Get("a"), Bytes("x"));
  EXPECT_EQ(*s.Add("n", 5), 5);
  EXPECT_EQ(*s.Add("n", -2), 3);
  EXPECT_EQ(*s.Get("n"), Bytes("3"));
  EXPECT_TRUE(*s.Check({"a", "n"}));
  EXPECT_FALSE(*s.Check({"a", "missing"}));
  EXPECT_EQ(*s.NumKeys(), 2);
  EXPECT_EQ(*s.CompareSet("a", Bytes("x"), Bytes("y")), Bytes("y"));
  EXPECT_EQ(*s.CompareSet("a", Bytes("x"), Bytes("z")), Bytes("y"));
  EXPECT_TRUE(*s.Delete("a"));
  EXPECT_FALSE(*s.Delete("a"));
  // A get waits for another connection's set.
  auto other = StoreConnection::Connect("127.0.0.1", port, "job", milliseconds(2000), Clock::now());
  ASSERT_TRUE(other.ok());
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE((*other)->Set("later", Bytes("v")).ok());
  });
  EXPECT_EQ(*s.Get("later"), Bytes("v"));
  setter.join();
  EXPECT_TRUE(s.Wait({"later", "n"}, milliseconds(500)).ok());
}

TEST(JobStoreTest, WaitsAreBoundedAndABrokenConnectionFailsAtOnce) {
  const int port = FreePort();
  auto server = StoreServer::Start("127.0.0.1", port, "job");
  ASSERT_TRUE(server.ok());
  auto c = StoreConnection::Connect("127.0.0.1", port, "job", milliseconds(300), Clock::now());
  ASSERT_TRUE(c.ok());
  const Clock::time_point t = Clock::now();
  StatusOr<std::vector<uint8_t>> v = (*c)->Get("never");
  EXPECT_FALSE(v.ok());
  EXPECT_LT(Since(t), 2.0);
  EXPECT_NE(v.status().message().find("'never'"), std::string::npos) << v.status().message();
  EXPECT_NE(v.status().message().find("not set within 0.3 s"), std::string::npos);
  const Clock::time_point t2 = Clock::now();
  EXPECT_FALSE((*c)->Add("n", 1).ok());  // the connection was closed after the timeout
  EXPECT_LT(Since(t2), 0.1);
}

TEST(JobStoreTest, ServerThatNeverAnswersDoesNotBlockTheClient) {
  // A listening socket nobody serves: what a stopped (SIGSTOP) rank 0 looks like to a client.
  const int port = FreePort();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  const Clock::time_point t = Clock::now();
  auto c = StoreConnection::Connect("127.0.0.1", port, "job", milliseconds(300), Clock::now());
  EXPECT_FALSE(c.ok());
  EXPECT_LT(Since(t), 2.0);
  EXPECT_NE(c.status().message().find("no answer from 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << c.status().message();
  close(fd);
}

TEST(JobStoreTest, AnotherRunIsRefusedNamingBothIds) {
  const int port = FreePort();
  auto server = StoreServer::Start("127.0.0.1", port, "first");
  ASSERT_TRUE(server.ok());
  auto c = StoreConnection::Connect("127.0.0.1", port, "second", milliseconds(1000), Clock::now());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("this store serves run id 'first', not 'second'"),
            std::string::npos)
      << c.status().message();
  // A second server on the port fails, naming it.
  auto again = StoreServer::Start("127.0.0.1", port, "second");
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("Address already in use"), std::string::npos);
}

TEST(JobStoreTest, ListensOnTheGivenAddressOnly) {
  const int port = FreePort();
  auto server = StoreServer::Start("127.0.0.1", port, "job");
  ASSERT_TRUE(server.ok());
  // 127.0.0.2 is this host too (loopback is a /8), but not the bound address.
  auto c = StoreConnection::Connect("127.0.0.2", port, "job", milliseconds(300), Clock::now());
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("Connection refused"), std::string::npos)
      << c.status().message();
  // Nothing there yet: connecting retries until the deadline, then names rank 0.
  const int idle = FreePort();
  const Clock::time_point t = Clock::now();
  auto none = StoreConnection::Connect("127.0.0.1", idle, "job", milliseconds(300),
                                       Clock::now() + milliseconds(500));
  EXPECT_FALSE(none.ok());
  EXPECT_GE(Since(t), 0.45);
  EXPECT_NE(none.status().message().find("rank 0, which serves it"), std::string::npos);
}

}  // namespace
}  // namespace sluice::runtime
