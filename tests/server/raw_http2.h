// A hand-rolled HTTP/2 client (RFC 9113) for the tests that must send what a
// well-behaved gRPC client never would: metadata past the server's limit, a
// header block that never ends, streams reset as fast as they open. Header
// blocks are HPACK literals without indexing or Huffman coding (RFC 7541
// section 6.2.2), which every decoder accepts and which keep no state.
#ifndef DECODED_TESTS_SERVER_RAW_HTTP2_H_
#define DECODED_TESTS_SERVER_RAW_HTTP2_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace decoded::server::e2e {

enum Http2FrameType : uint8_t {
  kData = 0, kHeaders = 1, kRstStream = 3, kSettings = 4, kPing = 6, kGoaway = 7, kWindowUpdate = 8,
  kContinuation = 9,
};
constexpr uint8_t kEndStream = 0x1, kEndHeaders = 0x4, kAck = 0x1;

struct Http2Frame {
  uint8_t type = 0;
  uint8_t flags = 0;
  uint32_t stream = 0;
  std::string payload;
};

class RawHttp2 {
 public:
  // Connects to 127.0.0.1:`port` and sends the preface and empty SETTINGS.
  explicit RawHttp2(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    Send(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + Frame(kSettings, 0, 0, ""));
  }
  ~RawHttp2() { close(fd_); }
  RawHttp2(const RawHttp2&) = delete;
  RawHttp2& operator=(const RawHttp2&) = delete;

  bool connected() const { return connected_; }

  static std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
    std::string f;
    const uint32_t n = static_cast<uint32_t>(payload.size());
    f.push_back(static_cast<char>(n >> 16));
    f.push_back(static_cast<char>(n >> 8));
    f.push_back(static_cast<char>(n));
    f.push_back(static_cast<char>(type));
    f.push_back(static_cast<char>(flags));
    for (int shift : {24, 16, 8, 0}) f.push_back(static_cast<char>((stream >> shift) & 0xff));
    return f + payload;
  }

  // An HPACK integer with a `prefix_bits`-bit prefix (RFC 7541 section 5.1).
  static std::string Integer(uint64_t v, int prefix_bits, uint8_t first = 0) {
    const uint64_t max = (uint64_t{1} << prefix_bits) - 1;
    std::string out;
    if (v < max) {
      out.push_back(static_cast<char>(first | v));
      return out;
    }
    out.push_back(static_cast<char>(first | max));
    v -= max;
    while (v >= 128) {
      out.push_back(static_cast<char>(v % 128 + 128));
      v /= 128;
    }
    out.push_back(static_cast<char>(v));
    return out;
  }
  static std::string Literal(const std::string& name, const std::string& value) {
    return std::string(1, '\0') + Integer(name.size(), 7) + name + Integer(value.size(), 7) + value;
  }
  // The header block of a gRPC call to `path`, plus `extra` headers.
  static std::string GrpcHeaders(const std::string& path,
                                 const std::vector<std::pair<std::string, std::string>>& extra = {}) {
    std::string block = Literal(":method", "POST") + Literal(":scheme", "http") + Literal(":path", path) +
                        Literal(":authority", "localhost") + Literal("content-type", "application/grpc") +
                        Literal("te", "trailers");
    for (const auto& [name, value] : extra) block += Literal(name, value);
    return block;
  }
  // A header block on `stream` cut into HEADERS + CONTINUATION frames of at
  // most 16 KiB (SETTINGS_MAX_FRAME_SIZE's default).
  void SendHeaderBlock(uint32_t stream, const std::string& block, bool end_stream) {
    std::string out;
    for (size_t at = 0; at < block.size() || at == 0; at += kMaxFrame) {
      const bool last = at + kMaxFrame >= block.size();
      const uint8_t flags = (last ? kEndHeaders : 0) | (at == 0 && end_stream ? kEndStream : 0);
      out += Frame(at == 0 ? kHeaders : kContinuation, flags, stream, block.substr(at, kMaxFrame));
      if (block.empty()) break;
    }
    Send(out);
  }
  // One gRPC message (uncompressed) as a DATA frame.
  void SendMessage(uint32_t stream, const std::string& message, bool end_stream) {
    std::string framed(1, '\0');
    const uint32_t n = static_cast<uint32_t>(message.size());
    for (int shift : {24, 16, 8, 0}) framed.push_back(static_cast<char>((n >> shift) & 0xff));
    Send(Frame(kData, end_stream ? kEndStream : 0, stream, framed + message));
  }
  void SendWindowUpdate(uint32_t stream, uint32_t increment) {
    std::string p;
    for (int shift : {24, 16, 8, 0}) p.push_back(static_cast<char>((increment >> shift) & 0xff));
    Send(Frame(kWindowUpdate, 0, stream, p));
  }
  void SendRstStream(uint32_t stream, uint32_t code = 8 /* CANCEL */) {
    std::string p;
    for (int shift : {24, 16, 8, 0}) p.push_back(static_cast<char>((code >> shift) & 0xff));
    Send(Frame(kRstStream, 0, stream, p));
  }

  // False once the peer closed the connection (or a write failed).
  bool Send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return open_ = false;
      done += static_cast<size_t>(n);
    }
    return open_;
  }

  // Reads frames for up to `timeout` (or until the connection closes);
  // acknowledges the server's SETTINGS and PINGs so the connection stays up.
  std::vector<Http2Frame> Read(absl::Duration timeout) {
    std::vector<Http2Frame> frames;
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      while (buffer_.size() >= 9) {
        const size_t n = (static_cast<uint8_t>(buffer_[0]) << 16) | (static_cast<uint8_t>(buffer_[1]) << 8) |
                         static_cast<uint8_t>(buffer_[2]);
        if (buffer_.size() < 9 + n) break;
        Http2Frame f;
        f.type = static_cast<uint8_t>(buffer_[3]);
        f.flags = static_cast<uint8_t>(buffer_[4]);
        for (int i = 5; i < 9; ++i) f.stream = (f.stream << 8) | static_cast<uint8_t>(buffer_[i]);
        f.stream &= 0x7fffffff;
        f.payload = buffer_.substr(9, n);
        buffer_.erase(0, 9 + n);
        if (f.type == kSettings && !(f.flags & kAck)) Send(Frame(kSettings, kAck, 0, ""));
        if (f.type == kPing && !(f.flags & kAck)) Send(Frame(kPing, kAck, 0, f.payload));
        frames.push_back(std::move(f));
      }
      if (!open_) return frames;
      // A zero timeout still takes what has arrived.
      const int64_t left = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) return frames;
      char buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        open_ = false;
        return frames;
      }
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }
  bool open() const { return open_; }

  // grpc-status of a trailers HEADERS frame the server encoded as literals
  // (gRPC sends grpc-status as a literal with an indexed or literal name);
  // -1 when none is found.
  static int GrpcStatus(const Http2Frame& headers) {
    const size_t at = headers.payload.find("grpc-status");
    if (at == std::string::npos || at + 12 >= headers.payload.size()) return -1;
    // After the name: a 7-bit length (1 for one digit) and the digits.
    const size_t len = static_cast<uint8_t>(headers.payload[at + 11]) & 0x7f;
    return std::stoi(headers.payload.substr(at + 12, len));
  }

 private:
  static constexpr size_t kMaxFrame = 16384;
  int fd_ = -1;
  bool connected_ = false;
  bool open_ = true;
  std::string buffer_;
};

}  // namespace decoded::server::e2e

#endif  // DECODED_TESTS_SERVER_RAW_HTTP2_H_
