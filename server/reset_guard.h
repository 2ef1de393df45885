// Closes a connection whose client resets streams faster than any client
// doing useful work would (HTTP/2 "Rapid Reset", CVE-2023-44487).
//
// Each stream the client cancels before it ends costs the server a reactor,
// a registry entry and a round of callbacks; opened and reset in a loop,
// streams cost CPU that decoding streams need (f57ec97: 20k resets in 5-7 s
// raised another client's inter-token latency 1.5-3x). gRPC 1.51 has no
// limit on the rate of resets and the application cannot send a GOAWAY, so
// the daemon closes the connection itself (Listener::CloseConnection): its
// client sees UNAVAILABLE on every stream and must reconnect.
//
// The budget is a token bucket per connection (gRPC's peer string names the
// connection: address and port): `burst` resets at once, refilled at `rate`
// per second. A client that disconnects with all its streams open resets at
// most MAX_CONCURRENT_STREAMS of them at once, far below the burst.
//
// Thread-safety: every method may be called from any thread.
#ifndef DECODED_SERVER_RESET_GUARD_H_
#define DECODED_SERVER_RESET_GUARD_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace decoded::server {

class ResetGuard {
 public:
  // `close(peer)` closes that connection (false when it is already gone);
  // called at most once per connection, without the guard's lock.
  ResetGuard(double rate, double burst, std::function<bool(const std::string& peer)> close)
      : rate_(rate), burst_(burst), close_(std::move(close)) {}

  // A stream of `grpc_peer`'s connection was reset by its client.
  void StreamReset(const std::string& grpc_peer) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets connections whose budget is full again (call now and then).
  void Prune() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t connections_closed() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Bucket {
    double tokens;
    absl::Time last;
    bool closed = false;
  };
  const double rate_;
  const double burst_;
  const std::function<bool(const std::string&)> close_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  int64_t closed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_RESET_GUARD_H_
