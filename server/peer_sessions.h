// Sessions per client address (--max_sessions_per_peer), so one client cannot
// hold every session slot of the server.
//
// A peer is the client's IP address as gRPC reports it (the port is dropped:
// one client's connections share it). Behind a proxy or gateway every
// session comes from the proxy's address, so there the limit caps the proxy
// as a whole; such deployments leave it off and let the proxy limit clients
// (docs/deploy.md).
//
// Thread-safety: every method may be called from any thread.
#ifndef DECODED_SERVER_PEER_SESSIONS_H_
#define DECODED_SERVER_PEER_SESSIONS_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/peer_limit.h"

namespace decoded::server {

class PeerSessions {
 public:
  // `max_per_peer` 0: no limit (counted all the same).
  explicit PeerSessions(int max_per_peer) : limit_(max_per_peer) {}

  // One session of a peer; releases its count when destroyed.
  using Slot = PeerLimit::Slot;

  // A slot for the peer of gRPC's `peer` string ("ipv4:10.0.0.7:51234",
  // "ipv6:[::1]:40000"); RESOURCE_EXHAUSTED naming the peer and the limit
  // when it holds max_per_peer sessions already.
  absl::StatusOr<Slot> Acquire(std::string_view grpc_peer);

  // Sessions held by the peer of `grpc_peer`.
  int Count(std::string_view grpc_peer) const { return limit_.Count(PeerAddress(grpc_peer)); }

  // "ipv4:10.0.0.7" of "ipv4:10.0.0.7:51234": the address without its port.
  static std::string PeerAddress(std::string_view grpc_peer);

 private:
  PeerLimit limit_;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_PEER_SESSIONS_H_
