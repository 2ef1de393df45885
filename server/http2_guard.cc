#include "server/http2_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace decoded::server {
namespace {

constexpr uint8_t kHeaders = 0x1, kRstStream = 0x3, kGoaway = 0x7, kContinuation = 0x9;
constexpr uint8_t kEndHeaders = 0x4;
constexpr uint32_t kEnhanceYourCalm = 0xb;
constexpr size_t kPrefaceBytes = 24;  // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
// After its GOAWAY, a violating client gets this long to read it.
constexpr absl::Duration kCloseGrace = absl::Seconds(2);

void SetNonBlocking(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int LocalPort(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return ntohs(addr.sin_port);
}

int PeerPort(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return ntohs(addr.sin_port);
}

// Reads the frame headers of one direction of an HTTP/2 connection as its
// bytes go by, without keeping the bytes.
class FrameReader {
 public:
  explicit FrameReader(size_t preface) : preface_left_(preface) {}

  struct Frame {
    uint32_t length;
    uint8_t type;
    uint8_t flags;
    uint32_t stream;
  };
  // Feeds `n` bytes; `on_frame` sees each frame header as it completes and
  // returns false to stop (the rest is not read).
  template <typename OnFrame>
  bool Feed(const char* data, size_t n, OnFrame on_frame) {
    size_t i = 0;
    while (i < n) {
      if (preface_left_ > 0) {
        const size_t take = std::min(preface_left_, n - i);
        preface_left_ -= take;
        i += take;
      } else if (payload_left_ > 0) {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(payload_left_, n - i));
        payload_left_ -= take;
        i += take;
      } else {
        header_[have_++] = static_cast<uint8_t>(data[i++]);
        if (have_ < sizeof(header_)) continue;
        have_ = 0;
        Frame f;
        f.length = (uint32_t{header_[0]} << 16) | (uint32_t{header_[1]} << 8) | header_[2];
        f.type = header_[3];
        f.flags = header_[4];
        f.stream = ((uint32_t{header_[5]} << 24) | (uint32_t{header_[6]} << 16) | (uint32_t{header_[7]} << 8) |
                    header_[8]) &
                   0x7fffffff;
        payload_left_ = f.length;
        if (!on_frame(f)) return false;
      }
    }
    return true;
  }
  // Between two frames: another frame may be inserted here.
  bool at_boundary() const { return preface_left_ == 0 && payload_left_ == 0 && have_ == 0; }

 private:
  size_t preface_left_;
  uint8_t header_[9] = {};
  size_t have_ = 0;
  uint64_t payload_left_ = 0;
};

std::string GoawayFrame(uint32_t last_stream, const std::string& reason) {
  std::string payload;
  for (uint32_t v : {last_stream, kEnhanceYourCalm}) {
    for (int shift : {24, 16, 8, 0}) payload.push_back(static_cast<char>((v >> shift) & 0xff));
  }
  payload += reason;
  std::string frame;
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int shift : {16, 8, 0}) frame.push_back(static_cast<char>((n >> shift) & 0xff));
  frame.push_back(static_cast<char>(kGoaway));
  frame.push_back(0);
  frame.append(4, '\0');  // stream 0
  return frame + payload;
}

}  // namespace

struct Http2Guard::Connection {
  uint64_t id = 0;
  int client = -1;  // the client's socket
  int inner = -1;   // our end of the loopback pair; gRPC holds the other
  std::string grpc_peer;
  std::string client_peer;
  std::string up;  // client -> gRPC, not yet written
  std::string down;  // gRPC -> client, not yet written
  bool client_eof = false;
  bool inner_eof = false;
  bool up_shut = false;    // inner's write side shut after client_eof
  bool down_shut = false;  // client's write side shut after inner_eof
  FrameReader up_frames{kPrefaceBytes};
  FrameReader down_frames{0};
  uint32_t last_stream = 0;
  int64_t header_block = 0;  // bytes of the open header block
  double reset_tokens = 0;
  absl::Time reset_at;
  bool violated = false;
  absl::Time close_by = absl::InfiniteFuture();
};

absl::StatusOr<std::unique_ptr<Http2Guard>> Http2Guard::Start(const Http2GuardLimits& limits) {
  std::unique_ptr<Http2Guard> guard(new Http2Guard());
  guard->limits_ = limits;
  guard->epoll_ = epoll_create1(EPOLL_CLOEXEC);
  guard->wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  guard->internal_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (guard->epoll_ < 0 || guard->wake_ < 0 || guard->internal_ < 0) {
    return absl::InternalError(absl::StrCat("http2 guard: ", std::strerror(errno)));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(guard->internal_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(guard->internal_, 64) != 0) {
    return absl::InternalError(absl::StrCat("http2 guard: loopback listener: ", std::strerror(errno)));
  }
  guard->internal_port_ = LocalPort(guard->internal_);
  fcntl(guard->internal_, F_SETFL, fcntl(guard->internal_, F_GETFL) | O_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // the wake-up
  epoll_ctl(guard->epoll_, EPOLL_CTL_ADD, guard->wake_, &ev);
  Http2Guard* self = guard.get();
  guard->thread_ = std::thread([self] { self->Run(); });
  return guard;
}

Http2Guard::~Http2Guard() {
  stopping_ = true;
  Wake();
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, c] : adopted_) {
    if (c->client >= 0) close(c->client);
    if (c->inner >= 0) close(c->inner);
  }
  for (int fd : {epoll_, wake_, internal_}) {
    if (fd >= 0) close(fd);
  }
}

void Http2Guard::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof(one));
}

absl::StatusOr<int> Http2Guard::Adopt(int client, const std::string& client_peer) {
  // A loopback pair: `inner` connects to the guard's own listener, whose
  // accepted end goes to gRPC. Only Adopt accepts there: any connection
  // already waiting is a stranger's (another local process found the port),
  // dropped first so that it can neither fill the backlog nor pass for ours.
  for (int stranger; (stranger = accept4(internal_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) close(stranger);
  const int inner = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(internal_port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (inner < 0 || connect(inner, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string why = std::strerror(errno);
    if (inner >= 0) close(inner);
    close(client);
    return absl::UnavailableError(absl::StrCat("http2 guard: loopback pair: ", why));
  }
  const int inner_port = LocalPort(inner);
  int grpc_end = -1;
  for (int tries = 0; tries < 8 && grpc_end < 0; ++tries) {
    const int accepted = accept4(internal_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (accepted < 0) break;
    if (PeerPort(accepted) == inner_port) {
      grpc_end = accepted;
    } else {
      close(accepted);
    }
  }
  if (grpc_end < 0) {
    close(inner);
    close(client);
    return absl::UnavailableError("http2 guard: the loopback pair did not connect");
  }
  SetNonBlocking(inner);
  SetNonBlocking(grpc_end);
  SetNonBlocking(client);

  auto c = std::make_unique<Connection>();
  c->client = client;
  c->inner = inner;
  c->client_peer = client_peer;
  c->grpc_peer = absl::StrCat("ipv4:127.0.0.1:", inner_port);
  c->reset_tokens = limits_.reset_burst;
  c->reset_at = absl::Now();
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
    c->id = id;
    peers_[c->grpc_peer] = client_peer;
    ++stats_.relayed;
    adopted_[id] = std::move(c);
  }
  // Each descriptor's events carry the connection id and which side it is.
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = id << 1;
  epoll_ctl(epoll_, EPOLL_CTL_ADD, client, &ev);
  ev.data.u64 = (id << 1) | 1;
  epoll_ctl(epoll_, EPOLL_CTL_ADD, inner, &ev);
  return grpc_end;
}

std::string Http2Guard::GrpcPeerOf(int grpc_end) {
  return absl::StrCat("ipv4:127.0.0.1:", PeerPort(grpc_end));
}

std::string Http2Guard::ClientPeer(const std::string& grpc_peer) const {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(grpc_peer);
  return it == peers_.end() ? grpc_peer : it->second;
}

Http2GuardStats Http2Guard::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Http2Guard::Run() {
  std::vector<epoll_event> events(256);
  std::vector<char> buf(64 << 10);

  auto find = [this](uint64_t id) -> Connection* {
    absl::MutexLock lock(&mu_);
    auto it = adopted_.find(id);
    return it == adopted_.end() ? nullptr : it->second.get();
  };
  auto drop = [this](Connection* c) {
    if (c->client >= 0) close(c->client);
    if (c->inner >= 0) close(c->inner);
    absl::MutexLock lock(&mu_);
    peers_.erase(c->grpc_peer);
    --stats_.relayed;
    adopted_.erase(c->id);
  };
  // gRPC's side is done (it closed, or the client broke a limit): nothing
  // more goes to it.
  auto close_inner = [](Connection* c) {
    if (c->inner >= 0) close(c->inner);
    c->inner = -1;
    c->up.clear();
  };
  // Which events each side wants now: reads while its buffer has room and
  // more may come, writes while bytes for it wait; a violating client is
  // only watched for leaving.
  auto rearm = [this](Connection* c) {
    epoll_event ev{};
    ev.events = 0;
    if (c->violated) {
      ev.events |= EPOLLRDHUP;
    } else if (!c->client_eof && c->up.size() < kRelayBufferBytes) {
      ev.events |= EPOLLIN;
    }
    if (!c->down.empty()) ev.events |= EPOLLOUT;
    ev.data.u64 = c->id << 1;
    epoll_ctl(epoll_, EPOLL_CTL_MOD, c->client, &ev);
    if (c->inner >= 0) {
      ev.events = 0;
      if (c->down.size() < kRelayBufferBytes) ev.events |= EPOLLIN;
      if (!c->up.empty()) ev.events |= EPOLLOUT;
      ev.data.u64 = (c->id << 1) | 1;
      epoll_ctl(epoll_, EPOLL_CTL_MOD, c->inner, &ev);
    }
  };
  // The client broke a limit: GOAWAY to it (between two of gRPC's frames, or
  // not at all), the gRPC side closed at once, the client's once it has read
  // that (or after kCloseGrace).
  auto violate = [&](Connection* c, const std::string& reason, bool resets) {
    c->violated = true;
    close_inner(c);
    if (c->down_frames.at_boundary()) c->down += GoawayFrame(c->last_stream, reason);
    c->close_by = absl::Now() + kCloseGrace;
    {
      absl::MutexLock lock(&mu_);
      ++(resets ? stats_.closed_resets_total : stats_.closed_header_block_total);
    }
    std::cerr << "decoded: closed the connection of " << c->client_peer << ": " << reason << "\n";
  };
  // What the client sent: checked frame by frame, then queued for gRPC.
  auto from_client = [&](Connection* c, const char* data, size_t n) {
    std::string broken;
    bool resets = false;
    c->up_frames.Feed(data, n, [&](const FrameReader::Frame& f) {
      if (f.type == kHeaders) {
        c->last_stream = std::max(c->last_stream, f.stream);
        c->header_block = f.length;
      } else if (f.type == kContinuation) {
        c->header_block += f.length;
      } else if (f.type == kRstStream && limits_.max_resets_per_second > 0) {
        const absl::Time now = absl::Now();
        c->reset_tokens = std::min(limits_.reset_burst,
                                   c->reset_tokens + absl::ToDoubleSeconds(now - c->reset_at) *
                                                         limits_.max_resets_per_second);
        c->reset_at = now;
        if (--c->reset_tokens < 0) {
          broken = absl::StrCat("it reset streams faster than ", limits_.max_resets_per_second,
                                " per second (--max_stream_resets_per_second)");
          resets = true;
          return false;
        }
      }
      if (f.type == kHeaders || f.type == kContinuation) {
        if (c->header_block > limits_.max_header_block_bytes) {
          broken = absl::StrCat("a header block over ", limits_.max_header_block_bytes, " bytes");
          return false;
        }
        if (f.flags & kEndHeaders) c->header_block = 0;
      }
      return true;
    });
    if (!broken.empty()) {
      violate(c, broken, resets);
      return;
    }
    c->up.append(data, n);
  };
  // Writes what is pending towards `fd`; false on a broken socket.
  auto flush = [](int fd, std::string& pending) {
    while (!pending.empty()) {
      const ssize_t n = send(fd, pending.data(), pending.size(), MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
      if (n <= 0) return false;
      pending.erase(0, static_cast<size_t>(n));
    }
    return true;
  };

  while (!stopping_.load()) {
    const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), 250);
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == 0) {
        uint64_t drained;
        (void)!read(wake_, &drained, sizeof(drained));
        continue;
      }
      Connection* c = find(key >> 1);
      if (c == nullptr) continue;
      const uint32_t what = events[i].events;
      bool broken = false;
      if ((key & 1) == 0) {
        // The client's socket.
        if (c->violated) {
          if (what & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) broken = true;  // it has gone: done with it
        } else if (what & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
          const ssize_t got = recv(c->client, buf.data(), buf.size(), 0);
          if (got > 0) {
            from_client(c, buf.data(), static_cast<size_t>(got));
          } else if (got == 0) {
            c->client_eof = true;
          } else if (errno != EAGAIN && errno != EINTR) {
            broken = true;
          }
        }
      } else if (c->inner >= 0 && (what & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
        // gRPC's side.
        const ssize_t got = recv(c->inner, buf.data(), buf.size(), 0);
        if (got > 0) {
          c->down_frames.Feed(buf.data(), static_cast<size_t>(got), [](const FrameReader::Frame&) { return true; });
          c->down.append(buf.data(), static_cast<size_t>(got));
        } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
          close_inner(c);  // gRPC closed the connection (it never half-closes)
        }
      }
      if (!broken && c->inner >= 0 && !flush(c->inner, c->up)) close_inner(c);
      if (!broken && !flush(c->client, c->down)) broken = true;
      // A client's half-close goes on to gRPC once what came before it has.
      if (!broken && c->client_eof && c->up.empty() && !c->up_shut && c->inner >= 0) {
        shutdown(c->inner, SHUT_WR);
        c->up_shut = true;
      }
      // gRPC is gone: the client gets the rest, then the end.
      if (!broken && c->inner < 0 && c->down.empty() && !c->down_shut) {
        shutdown(c->client, SHUT_WR);
        c->down_shut = true;
        if (!c->violated) c->close_by = absl::Now() + kCloseGrace;
      }
      if (broken || (c->down_shut && c->client_eof)) {
        drop(c);
        continue;
      }
      rearm(c);
    }
    // Clients that did not leave within the grace after their end.
    const absl::Time now = absl::Now();
    std::vector<Connection*> late;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [id, c] : adopted_) {
        if (c->close_by < now) late.push_back(c.get());
      }
    }
    for (Connection* c : late) drop(c);
  }
}

}  // namespace decoded::server
