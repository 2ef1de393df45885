// Relays each plaintext connection between its client and gRPC and reads the
// HTTP/2 frame headers on the way (RFC 9113 section 4.1), to enforce what
// gRPC 1.51 cannot be configured to enforce:
//   - a header block (HEADERS and its CONTINUATION frames) of at most
//     `max_header_block_bytes`. gRPC 1.51 keeps a header block that never
//     ends in full, and re-copies a header value longer than a frame at
//     every frame, so such a block costs memory and CPU that grow with the
//     square of its length (six connections of 12 MiB each stalled the
//     daemon for 20 s);
//   - at most `max_resets_per_second` RST_STREAM frames from the client
//     (`reset_burst` at once): HTTP/2 Rapid Reset (CVE-2023-44487).
// A connection that breaks either limit is sent GOAWAY with
// ENHANCE_YOUR_CALM and the reason (RFC 9113 section 6.8), then closed on
// both sides: gRPC tears its transport down as for any closed connection.
// Everything else passes through untouched, both ways, with back-pressure
// (a side that does not read stops the other side's reads).
//
// gRPC sees each relayed connection as a TCP connection from 127.0.0.1 (the
// inner end of a loopback pair the guard makes): ClientPeer translates its
// peer string back to the client's, for everything that limits per client.
// TLS connections are not relayed (their frames are encrypted); they keep
// the listener's byte budget (server/listener.h) and the reset guard.
//
// One thread relays every connection (epoll); each connection costs three
// file descriptors (client, and both ends of the loopback pair) and at most
// 2 x kRelayBufferBytes of buffers.
//
// Thread-safety: Adopt, ClientPeer and Stats from any thread.
#ifndef DECODED_SERVER_HTTP2_GUARD_H_
#define DECODED_SERVER_HTTP2_GUARD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace decoded::server {

inline constexpr size_t kRelayBufferBytes = 256 << 10;

struct Http2GuardLimits {
  int64_t max_header_block_bytes = int64_t{1} << 20;
  double max_resets_per_second = 500;  // 0: no limit
  double reset_burst = 1000;
};

struct Http2GuardStats {
  int64_t relayed = 0;                  // connections open through the guard
  int64_t closed_header_block_total = 0;
  int64_t closed_resets_total = 0;
};

class Http2Guard {
 public:
  static absl::StatusOr<std::unique_ptr<Http2Guard>> Start(const Http2GuardLimits& limits);
  // Closes every relayed connection.
  ~Http2Guard();
  Http2Guard(const Http2Guard&) = delete;
  Http2Guard& operator=(const Http2Guard&) = delete;

  // Takes the accepted `client` socket (owned from now on) of `client_peer`
  // (gRPC's spelling of its address) and returns the socket to hand to gRPC.
  // UNAVAILABLE when the loopback pair cannot be made (out of descriptors):
  // `client` is closed then.
  absl::StatusOr<int> Adopt(int client, const std::string& client_peer) ABSL_LOCKS_EXCLUDED(mu_);

  // gRPC's peer string for the socket Adopt returned (how gRPC will name
  // the connection).
  static std::string GrpcPeerOf(int grpc_end);

  // The client's peer string for gRPC's peer string of a relayed connection;
  // `grpc_peer` itself for any other.
  std::string ClientPeer(const std::string& grpc_peer) const ABSL_LOCKS_EXCLUDED(mu_);

  Http2GuardStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Connection;
  Http2Guard() = default;
  void Run();
  void Wake();

  Http2GuardLimits limits_;
  int epoll_ = -1;
  int wake_ = -1;       // eventfd
  int internal_ = -1;   // loopback listener the inner ends connect to
  int internal_port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;

  mutable absl::Mutex mu_;
  // Connections the relay thread owns, keyed by their id; new ones wait in
  // adopted_ until the thread takes them.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Connection>> adopted_ ABSL_GUARDED_BY(mu_);
  // gRPC's peer string of each relayed connection -> its client's.
  absl::flat_hash_map<std::string, std::string> peers_ ABSL_GUARDED_BY(mu_);
  Http2GuardStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_HTTP2_GUARD_H_
