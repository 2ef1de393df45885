// The server's hardening parts on their own, without an engine: the
// listener (connection limit, out of file descriptors), its probe, the
// request pool, per-peer session slots, the stream registry's bound, and the
// bearer-token comparison.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <dirent.h>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/bearer_token.h"
#include "server/http2_guard.h"
#include "server/listener.h"
#include "server/listener_probe.h"
#include "server/peer_limit.h"
#include "server/peer_sessions.h"
#include "server/request_pool.h"
#include "server/stream_registry.h"

namespace decoded::server {
namespace {

// Holds every connection it is handed, as gRPC would while it serves them.
class HoldingAcceptor final : public grpc::experimental::ExternalConnectionAcceptor {
 public:
  ~HoldingAcceptor() override { CloseAll(); }
  void HandleNewConnection(NewConnectionParameters* p) override {
    absl::MutexLock lock(&mu_);
    fds_.push_back(p->fd);
  }
  int held() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(fds_.size());
  }
  void CloseAll() {
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) close(fd);
    fds_.clear();
  }

 private:
  absl::Mutex mu_;
  std::vector<int> fds_;
};

int UnconnectedSocket() { return socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); }

bool Connect(int fd, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

// True when the server closed or reset the connection within `timeout`.
bool ClosedByServer(int fd, absl::Duration timeout) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0) return false;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

int OpenDescriptors() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n - 3;  // ".", ".." and the directory's own descriptor
}

template <typename Predicate>
bool WaitFor(Predicate done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(ListenerTest, ConnectionsBeyondTheLimitAreClosedAtOnceAndCountedAndTheSlotComesBack) {
  ListenerOptions options;
  options.address = "127.0.0.1:0";
  options.max_connections = 3;
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Bind(options);
  ASSERT_TRUE(listener.ok()) << listener.status();
  HoldingAcceptor acceptor;
  (*listener)->Start(&acceptor, nullptr);
  // The accept thread stops before the acceptor it calls goes.
  absl::Cleanup stop_listener = [&] { (*listener)->Stop(); };
  std::vector<int> clients;
  for (int i = 0; i < 5; ++i) {
    clients.push_back(UnconnectedSocket());
    ASSERT_TRUE(Connect(clients.back(), (*listener)->port()));
    if (i < 3) {
      ASSERT_TRUE(WaitFor([&] { return acceptor.held() == i + 1; }, absl::Seconds(5)));
    }
  }
  EXPECT_TRUE(ClosedByServer(clients[3], absl::Seconds(5)));
  EXPECT_TRUE(ClosedByServer(clients[4], absl::Seconds(5)));
  EXPECT_FALSE(ClosedByServer(clients[0], absl::Milliseconds(100)));
  ListenerStats stats = (*listener)->Stats();
  EXPECT_EQ(stats.open_connections, 3);
  EXPECT_EQ(stats.accepted_total, 3);
  EXPECT_EQ(stats.refused_total, 2);
  // gRPC closing its connections frees their slots.
  acceptor.CloseAll();
  const int late = UnconnectedSocket();
  ASSERT_TRUE(Connect(late, (*listener)->port()));
  EXPECT_TRUE(WaitFor([&] { return acceptor.held() == 1; }, absl::Seconds(5)));
  for (int fd : clients) close(fd);
  close(late);
}

// Debian's gRPC 1.51 stops accepting for good after one EMFILE. This
// listener closes the connections it cannot take (the client is told at
// once instead of hanging) and accepts again once descriptors are free.
TEST(ListenerTest, OutOfFileDescriptorsClosesNewConnectionsAndAcceptsAgainAfterwards) {
  ListenerOptions options;
  options.address = "127.0.0.1:0";
  options.max_connections = 1000;
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Bind(options);
  ASSERT_TRUE(listener.ok()) << listener.status();
  HoldingAcceptor acceptor;
  (*listener)->Start(&acceptor, nullptr);
  // The accept thread stops before the acceptor it calls goes.
  absl::Cleanup stop_listener = [&] { (*listener)->Stop(); };
  // Client sockets first: their descriptors exist before the limit drops.
  constexpr int kClients = 40;
  std::vector<int> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(UnconnectedSocket());
  const int late = UnconnectedSocket();
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  // UBSan's vptr check looks at a type the first time through a pipe (its
  // readable-memory probe); with no descriptor left it would report a false
  // "invalid vptr". Once seen, the type is in its cache.
  (void)acceptor.held();
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(OpenDescriptors() + 10);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  for (int fd : clients) ASSERT_TRUE(Connect(fd, (*listener)->port()));
  // About ten are accepted; every other one is closed, none left hanging.
  std::vector<bool> is_closed(kClients, false);
  int closed = 0;
  WaitFor(
      [&] {
        for (int i = 0; i < kClients; ++i) {
          if (!is_closed[i] && ClosedByServer(clients[i], absl::ZeroDuration())) {
            is_closed[i] = true;
            ++closed;
          }
        }
        return closed + acceptor.held() == kClients;
      },
      absl::Seconds(15));
  const int held = acceptor.held();
  EXPECT_GT(held, 0);
  EXPECT_LT(held, kClients);
  EXPECT_EQ(closed + held, kClients);
  EXPECT_GT((*listener)->Stats().accept_errors_total, 0);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  acceptor.CloseAll();
  ASSERT_TRUE(Connect(late, (*listener)->port()));
  EXPECT_TRUE(WaitFor([&] { return acceptor.held() == 1; }, absl::Seconds(5))) << "the listener stopped accepting";
  for (int fd : clients) close(fd);
  close(late);
}

// A connection that sends without anything being made of it (no call
// started, no message read: what a header block that never ends looks like
// from outside gRPC) is closed; one whose sends do make progress is not.
TEST(ListenerTest, AConnectionThatSendsWithoutProgressIsClosed) {
  ListenerOptions options;
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Bind(options);
  ASSERT_TRUE(listener.ok());
  // Reads and drops what each connection sends, as gRPC would parse it.
  class DrainingAcceptor final : public grpc::experimental::ExternalConnectionAcceptor {
   public:
    ~DrainingAcceptor() override {
      stop_ = true;
      for (std::thread& t : readers_) t.join();
    }
    void HandleNewConnection(NewConnectionParameters* p) override {
      const int fd = p->fd;
      ++accepted_;
      readers_.emplace_back([this, fd] {
        char buf[65536];
        while (!stop_.load()) {
          pollfd pf{fd, POLLIN, 0};
          if (poll(&pf, 1, 20) <= 0) continue;
          if (read(fd, buf, sizeof(buf)) <= 0) break;
        }
        close(fd);
      });
    }
    int held() const { return accepted_.load(); }

   private:
    std::atomic<bool> stop_{false};
    std::atomic<int> accepted_{0};
    std::vector<std::thread> readers_;
  } acceptor;
  (*listener)->Start(&acceptor, nullptr);
  // The accept thread stops before the acceptor it calls goes.
  absl::Cleanup stop_listener = [&] { (*listener)->Stop(); };
  const int stalled = UnconnectedSocket();
  const int working = UnconnectedSocket();
  ASSERT_TRUE(Connect(stalled, (*listener)->port()));
  ASSERT_TRUE(Connect(working, (*listener)->port()));
  ASSERT_TRUE(WaitFor([&] { return acceptor.held() == 2; }, absl::Seconds(5)));
  auto peer_of = [](int fd) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    return absl::StrCat("ipv4:127.0.0.1:", ntohs(addr.sin_port));
  };
  fcntl(stalled, F_SETFL, O_NONBLOCK);
  fcntl(working, F_SETFL, O_NONBLOCK);
  const std::string chunk(1 << 16, 'x');
  const absl::Time start = absl::Now();
  int64_t sent = 0;
  bool closed = false;
  while (!closed && absl::Now() - start < absl::Seconds(20)) {
    for (int i = 0; i < 16; ++i) {
      const ssize_t n = send(stalled, chunk.data(), chunk.size(), MSG_NOSIGNAL);
      if (n > 0) sent += n;
      // The same traffic, with progress after each piece.
      if (send(working, chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0) (*listener)->NoteProgress(peer_of(working));
    }
    closed = ClosedByServer(stalled, absl::Milliseconds(5));
  }
  EXPECT_TRUE(closed) << "still open after " << sent << " bytes";
  EXPECT_GT(sent, kMaxBytesWithoutProgress);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // checked every 250 ms
  EXPECT_FALSE(ClosedByServer(working, absl::Milliseconds(100)));
  EXPECT_EQ((*listener)->Stats().closed_without_progress_total, 1);
  close(stalled);
  close(working);
}

TEST(ListenerTest, ASecondListenerOnTheSamePortFails) {
  ListenerOptions options;
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Listener>> first = Listener::Bind(options);
  ASSERT_TRUE(first.ok());
  options.address = "127.0.0.1:" + std::to_string((*first)->port());
  absl::StatusOr<std::unique_ptr<Listener>> second = Listener::Bind(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_EQ(Listener::Bind({"nonsense", 1, 16}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Listener::Bind({"127.0.0.1:99999", 1, 16}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ListenerTest, AFailedListeningSocketIsReportedOnce) {
  ListenerOptions options;
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Bind(options);
  ASSERT_TRUE(listener.ok());
  HoldingAcceptor acceptor;
  std::atomic<int> failures{0};
  std::string why;
  (*listener)->Start(&acceptor, [&](const absl::Status& s) {
    why = std::string(s.message());
    ++failures;
  });
  // What an operator's `ss -K` or a stray shutdown does: the socket stops
  // listening. Found by its port among this process's descriptors.
  for (int fd = 3; fd < 1024; ++fd) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    int listening = 0;
    socklen_t ilen = sizeof(listening);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || addr.sin_family != AF_INET) continue;
    if (ntohs(addr.sin_port) != (*listener)->port()) continue;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ilen) != 0 || !listening) continue;
    shutdown(fd, SHUT_RDWR);
  }
  EXPECT_TRUE(WaitFor([&] { return failures.load() == 1; }, absl::Seconds(5)));
  EXPECT_TRUE(absl::StrContains(why, "accept4")) << why;
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(failures.load(), 1);
}

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int shift : {16, 8, 0}) f.push_back(static_cast<char>((n >> shift) & 0xff));
  f.push_back(static_cast<char>(type));
  f.push_back(static_cast<char>(flags));
  for (int shift : {24, 16, 8, 0}) f.push_back(static_cast<char>((stream >> shift) & 0xff));
  return f + payload;
}

// Reads what is there within `timeout` (until the peer closes).
std::string ReadSome(int fd, absl::Duration timeout, bool* closed = nullptr) {
  std::string got;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const int64_t left = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) return got;
    char buf[65536];
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) {
      if (closed != nullptr) *closed = true;
      return got;
    }
    got.append(buf, static_cast<size_t>(n));
  }
}

class GuardedListener {
 public:
  explicit GuardedListener(Http2GuardLimits limits) {
    guard_ = *Http2Guard::Start(limits);
    ListenerOptions options;
    options.address = "127.0.0.1:0";
    options.guard = guard_.get();
    listener_ = *Listener::Bind(options);
    listener_->Start(&acceptor_, nullptr);
  }
  // A client connection and the socket gRPC would have got for it.
  std::pair<int, int> Connect() {
    const int client = UnconnectedSocket();
    const int before = acceptor_.held();
    if (!::decoded::server::Connect(client, listener_->port())) return {-1, -1};
    WaitFor([&] { return acceptor_.held() == before + 1; }, absl::Seconds(5));
    return {client, acceptor_.last()};
  }
  Http2Guard& guard() { return *guard_; }

 private:
  class LastAcceptor final : public grpc::experimental::ExternalConnectionAcceptor {
   public:
    void HandleNewConnection(NewConnectionParameters* p) override {
      last_ = p->fd;
      ++held_;
    }
    int held() const { return held_.load(); }
    int last() const { return last_.load(); }

   private:
    std::atomic<int> held_{0};
    std::atomic<int> last_{-1};
  };
  std::unique_ptr<Http2Guard> guard_;  // outlives the listener
  LastAcceptor acceptor_;
  std::unique_ptr<Listener> listener_;
};

const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

TEST(Http2GuardTest, RelaysBothWaysAndNamesTheClient) {
  GuardedListener gl(Http2GuardLimits{});
  auto [client, grpc_end] = gl.Connect();
  ASSERT_GE(grpc_end, 0);
  const std::string hello = kPreface + Frame(4, 0, 0, "") + Frame(1, 4, 1, std::string(100, 'h'));
  ASSERT_EQ(send(client, hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
  EXPECT_EQ(ReadSome(grpc_end, absl::Milliseconds(300)), hello);
  const std::string answer = Frame(4, 0, 0, "") + Frame(0, 0, 1, "data");
  ASSERT_EQ(send(grpc_end, answer.data(), answer.size(), MSG_NOSIGNAL), static_cast<ssize_t>(answer.size()));
  EXPECT_EQ(ReadSome(client, absl::Milliseconds(300)), answer);
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(client, reinterpret_cast<sockaddr*>(&addr), &len);
  EXPECT_EQ(gl.guard().ClientPeer(Http2Guard::GrpcPeerOf(grpc_end)),
            absl::StrCat("ipv4:127.0.0.1:", ntohs(addr.sin_port)));
  EXPECT_EQ(gl.guard().Stats().relayed, 1);
  // gRPC closing the connection closes the client's.
  close(grpc_end);
  bool closed = false;
  ReadSome(client, absl::Seconds(2), &closed);
  EXPECT_TRUE(closed);
  close(client);
  EXPECT_TRUE(WaitFor([&] { return gl.guard().Stats().relayed == 0; }, absl::Seconds(5)));
}

TEST(Http2GuardTest, AHeaderBlockOverTheLimitGetsGoawayAndTheConnectionEnds) {
  Http2GuardLimits limits;
  limits.max_header_block_bytes = 64 << 10;
  GuardedListener gl(limits);
  auto [client, grpc_end] = gl.Connect();
  ASSERT_GE(grpc_end, 0);
  std::string flood = kPreface + Frame(4, 0, 0, "") + Frame(1, 0, 5, std::string(16000, 'a'));
  for (int i = 0; i < 8; ++i) flood += Frame(9, 0, 5, std::string(16000, 'b'));
  (void)!send(client, flood.data(), flood.size(), MSG_NOSIGNAL);
  bool closed = false;
  const std::string got = ReadSome(client, absl::Seconds(3), &closed);
  ASSERT_GE(got.size(), 17u);
  EXPECT_EQ(got[3], 7) << "not a GOAWAY";
  EXPECT_EQ(static_cast<uint8_t>(got[9 + 3]), 5) << "last stream id";
  EXPECT_EQ(static_cast<uint8_t>(got[9 + 7]), 0xb) << "not ENHANCE_YOUR_CALM";
  EXPECT_TRUE(absl::StrContains(got, "header block over 65536 bytes")) << got.substr(17);
  EXPECT_TRUE(closed);
  // gRPC got what came before the block and then the end.
  bool grpc_closed = false;
  const std::string relayed = ReadSome(grpc_end, absl::Seconds(1), &grpc_closed);
  EXPECT_TRUE(grpc_closed);
  EXPECT_LT(relayed.size(), size_t{64} << 10);
  EXPECT_EQ(gl.guard().Stats().closed_header_block_total, 1);
  // One frame that declares more than the limit ends it before its payload comes.
  auto [client2, grpc_end2] = gl.Connect();
  const std::string big = kPreface + Frame(1, 0, 1, "") ;
  std::string header = big.substr(0, big.size());
  std::string declared = Frame(9, 0, 1, "");
  declared[0] = 0x40;  // a 4 MiB CONTINUATION, payload never sent
  header += declared;
  (void)!send(client2, header.data(), header.size(), MSG_NOSIGNAL);
  closed = false;
  EXPECT_TRUE(absl::StrContains(ReadSome(client2, absl::Seconds(3), &closed), "header block over"));
  EXPECT_TRUE(closed);
  close(client);
  close(client2);
  close(grpc_end);
  close(grpc_end2);
}

TEST(Http2GuardTest, ResetsFasterThanTheLimitGetGoaway) {
  Http2GuardLimits limits;
  limits.max_resets_per_second = 10;
  limits.reset_burst = 20;
  GuardedListener gl(limits);
  auto [client, grpc_end] = gl.Connect();
  std::string burst = kPreface + Frame(4, 0, 0, "");
  for (uint32_t stream = 1; stream < 2 * 40; stream += 2) {
    burst += Frame(1, 4, stream, "h") + Frame(3, 0, stream, std::string("\0\0\0\x08", 4));
  }
  (void)!send(client, burst.data(), burst.size(), MSG_NOSIGNAL);
  bool closed = false;
  const std::string got = ReadSome(client, absl::Seconds(3), &closed);
  EXPECT_TRUE(absl::StrContains(got, "reset streams faster than 10 per second")) << got;
  EXPECT_TRUE(closed);
  EXPECT_EQ(gl.guard().Stats().closed_resets_total, 1);
  close(client);
  close(grpc_end);
}

TEST(ListenerProbeTest, TellsAcceptingFromNotAccepting) {
  // A socket that listens but never accepts: the kernel completes the
  // handshake into the backlog, and nothing more happens.
  const int silent = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(silent, 16), 0);
  socklen_t len = sizeof(addr);
  getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len);
  const int silent_port = ntohs(addr.sin_port);
  absl::Status s = ProbeListener("127.0.0.1", silent_port, absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "did not accept")) << s;

  // Accepted and closed at once (a server at its connection limit): accepted.
  ListenerOptions options;
  options.address = "127.0.0.1:0";
  options.max_connections = 1;
  absl::StatusOr<std::unique_ptr<Listener>> full = Listener::Bind(options);
  ASSERT_TRUE(full.ok());
  HoldingAcceptor acceptor;
  (*full)->Start(&acceptor, nullptr);
  // The accept thread stops before the acceptor it calls goes.
  absl::Cleanup stop_listener = [&] { (*full)->Stop(); };
  const int holder = UnconnectedSocket();
  ASSERT_TRUE(Connect(holder, (*full)->port()));
  ASSERT_TRUE(WaitFor([&] { return acceptor.held() == 1; }, absl::Seconds(5)));
  EXPECT_TRUE(ProbeListener("127.0.0.1", (*full)->port(), absl::Seconds(2)).ok());

  // The watchdog's own probe is closed at accept and never reaches gRPC (a
  // busy gRPC must not look like a dead listener).
  const int held_before = acceptor.held();
  acceptor.CloseAll();
  ASSERT_TRUE(WaitFor([&] { return (*full)->Stats().open_connections == 0; }, absl::Seconds(5)));
  EXPECT_TRUE(ProbeListener("127.0.0.1", (*full)->port(), absl::Seconds(2),
                            [&](int port) { (*full)->ExpectProbe(port); })
                  .ok());
  EXPECT_EQ(acceptor.held(), 0) << "the probe was handed over (" << held_before << " before)";

  // Nothing listens: refused.
  const int port = silent_port;
  close(silent);
  s = ProbeListener("127.0.0.1", port, absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ProbeListener("localhost", port, absl::Milliseconds(300)).code(), absl::StatusCode::kInvalidArgument);
  close(holder);
}

TEST(PeerSessionsTest, CountsSessionsPerAddressWithoutThePort) {
  EXPECT_EQ(PeerSessions::PeerAddress("ipv4:10.0.0.7:51234"), "ipv4:10.0.0.7");
  EXPECT_EQ(PeerSessions::PeerAddress("ipv6:[::1]:40000"), "ipv6:[::1]");
  EXPECT_EQ(PeerSessions::PeerAddress("unix:/run/x.sock"), "unix:/run/x.sock");
  PeerSessions peers(2);
  absl::StatusOr<PeerSessions::Slot> a = peers.Acquire("ipv4:10.0.0.7:1");
  absl::StatusOr<PeerSessions::Slot> b = peers.Acquire("ipv4:10.0.0.7:2");
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<PeerSessions::Slot> c = peers.Acquire("ipv4:10.0.0.7:3");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "--max_sessions_per_peer")) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "ipv4:10.0.0.7")) << c.status();
  EXPECT_TRUE(peers.Acquire("ipv4:10.0.0.8:1").ok());  // another client
  { PeerSessions::Slot released = *std::move(a); }
  EXPECT_EQ(peers.Count("ipv4:10.0.0.7:9"), 1);
  EXPECT_TRUE(peers.Acquire("ipv4:10.0.0.7:4").ok());
  PeerSessions unlimited(0);
  std::vector<PeerSessions::Slot> many;
  for (int i = 0; i < 100; ++i) many.push_back(*unlimited.Acquire("ipv4:1.2.3.4:5"));
  EXPECT_EQ(unlimited.Count("ipv4:1.2.3.4:6"), 100);
}

TEST(PeerLimitTest, CountsSlotsPerAddressAndReleasesEachOnce) {
  PeerLimit limit(2);
  std::optional<PeerLimit::Slot> a = limit.TryAcquire("10.0.0.7");
  std::optional<PeerLimit::Slot> b = limit.TryAcquire("10.0.0.7");
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->address(), "10.0.0.7");
  EXPECT_FALSE(limit.TryAcquire("10.0.0.7").has_value());
  EXPECT_TRUE(limit.TryAcquire("10.0.0.8").has_value());  // another address; released at once
  EXPECT_EQ(limit.Count("10.0.0.8"), 0);
  {
    // A moved-from slot releases nothing; its new owner releases once.
    PeerLimit::Slot moved = *std::move(a);
    a.reset();
    EXPECT_EQ(limit.Count("10.0.0.7"), 2);
  }
  EXPECT_EQ(limit.Count("10.0.0.7"), 1);
  EXPECT_TRUE(limit.TryAcquire("10.0.0.7").has_value());
  b.reset();
  EXPECT_EQ(limit.Count("10.0.0.7"), 0);
  PeerLimit unlimited(0);
  std::vector<PeerLimit::Slot> many;
  for (int i = 0; i < 100; ++i) many.push_back(*unlimited.TryAcquire("1.2.3.4"));
  EXPECT_EQ(unlimited.Count("1.2.3.4"), 100);
}

TEST(RequestPoolTest, RunsInOrderRefusesBeyondItsQueueAndRunsWhatIsQueuedWhenDestroyed) {
  std::vector<int> ran;
  absl::Mutex mu;
  absl::Notification release;
  {
    RequestPool pool(RequestPoolOptions{"utility", "--utility_queue", 1, 3, /*nice=*/10});
    int niceness = -100;
    ASSERT_TRUE(pool.Submit([&] {
                      niceness = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
                      release.WaitForNotification();
                    }).ok());
    ASSERT_TRUE(WaitFor([&] { return pool.running() == 1; }, absl::Seconds(5)));
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(pool.Submit([&, i] {
                        absl::MutexLock lock(&mu);
                        ran.push_back(i);
                      }).ok());
    }
    absl::Status full = pool.Submit([] {});
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(absl::StrContains(full.message(), "utility queue is full")) << full;
    EXPECT_TRUE(absl::StrContains(full.message(), "--utility_queue")) << full;
    EXPECT_EQ(pool.queued(), 3);
    release.Notify();
    // The destructor runs what is queued.
    WaitFor([&] { return pool.running() == 0; }, absl::Seconds(5));
    EXPECT_GE(niceness, 10);
  }
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2}));
}

class CountingStream final : public OpenStream {
 public:
  bool TryRef() override {
    ++refs;
    return true;
  }
  void Unref() override { --refs; }
  void StartDrain() override { ++drains; }
  void ExpireIfIdle(std::chrono::steady_clock::time_point, const IdleTimeouts&) override { ++expiries; }
  int refs = 0, drains = 0, expiries = 0;
};

TEST(StreamRegistryTest, BoundsOpenStreamsAndReachesEachOne) {
  StreamRegistry registry(2);
  CountingStream a, b, c;
  EXPECT_TRUE(registry.Add(&a).ok());
  EXPECT_TRUE(registry.Add(&b).ok());
  absl::Status over = registry.Add(&c);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.message(), "--max_streams")) << over;
  registry.ExpireIdle(IdleTimeouts{});
  EXPECT_EQ(a.expiries + b.expiries + c.expiries, 2);
  // An ending stream stops counting against the limit at once, while it
  // stays registered (a drain still waits for it).
  registry.StopCounting(&b);
  EXPECT_TRUE(registry.Add(&c).ok());
  EXPECT_EQ(registry.size(), 3);
  registry.Remove(&c);
  registry.Remove(&a);
  registry.StartDrain();
  EXPECT_EQ(b.drains, 1);
  EXPECT_EQ(registry.Add(&c).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a.refs + b.refs + c.refs, 0);
}

// The drain visits streams one by one; a turn read on a stream it has yet to
// reach must see the drain already (the reactor asks draining()), so the
// registry says so before it reaches the first stream.
TEST(StreamRegistryTest, DrainingIsVisibleBeforeTheDrainReachesAnyStream) {
  StreamRegistry registry(4);
  struct Probe final : public OpenStream {
    explicit Probe(const StreamRegistry* r) : registry(r) {}
    bool TryRef() override { return true; }
    void Unref() override {}
    void StartDrain() override { saw_draining = registry->draining(); }
    void ExpireIfIdle(std::chrono::steady_clock::time_point, const IdleTimeouts&) override {}
    const StreamRegistry* registry;
    std::optional<bool> saw_draining;
  };
  Probe a(&registry), b(&registry);
  ASSERT_TRUE(registry.Add(&a).ok());
  ASSERT_TRUE(registry.Add(&b).ok());
  EXPECT_FALSE(registry.draining());
  registry.StartDrain();
  EXPECT_EQ(a.saw_draining, std::optional<bool>(true));
  EXPECT_EQ(b.saw_draining, std::optional<bool>(true));
}

TEST(BearerTokenTest, MatchesTheSchemeInAnyCaseAndTheTokenExactly) {
  EXPECT_TRUE(BearerTokenMatches("Bearer s3cret", "s3cret"));
  EXPECT_TRUE(BearerTokenMatches("bEaReR s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3creT", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3crett", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Basic s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearers3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer ", ""));
  // A token that repeats does not match a header holding part of it twice.
  EXPECT_FALSE(BearerTokenMatches("Bearer abab", "ab"));
}

}  // namespace
}  // namespace decoded::server
