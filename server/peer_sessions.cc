#include "server/peer_sessions.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace decoded::server {

std::string PeerSessions::PeerAddress(std::string_view grpc_peer) {
  const size_t colon = grpc_peer.rfind(':');
  // "ipv4:a.b.c.d:port" and "ipv6:[...]:port" end with a port; other schemes
  // ("unix:path") are one peer each as they are.
  if (colon == std::string_view::npos || grpc_peer.find(':') == colon) return std::string(grpc_peer);
  return std::string(grpc_peer.substr(0, colon));
}

absl::StatusOr<PeerSessions::Slot> PeerSessions::Acquire(std::string_view grpc_peer) {
  std::string peer = PeerAddress(grpc_peer);
  std::optional<Slot> slot = limit_.TryAcquire(peer);
  if (!slot.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat("the client ", peer, " holds its maximum of ",
                                                     limit_.max_per_peer(), " sessions (--max_sessions_per_peer)"));
  }
  return *std::move(slot);
}

}  // namespace decoded::server
