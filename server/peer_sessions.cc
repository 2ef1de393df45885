#include "server/peer_sessions.h"

#include "absl/strings/str_cat.h"

namespace decoded::server {

PeerSessions::Slot::~Slot() {
  if (owner_ != nullptr) owner_->Release(peer_);
}

std::string PeerSessions::PeerAddress(std::string_view grpc_peer) {
  const size_t colon = grpc_peer.rfind(':');
  // "ipv4:a.b.c.d:port" and "ipv6:[...]:port" end with a port; other schemes
  // ("unix:path") are one peer each as they are.
  if (colon == std::string_view::npos || grpc_peer.find(':') == colon) return std::string(grpc_peer);
  return std::string(grpc_peer.substr(0, colon));
}

absl::StatusOr<PeerSessions::Slot> PeerSessions::Acquire(std::string_view grpc_peer) {
  std::string peer = PeerAddress(grpc_peer);
  absl::MutexLock lock(&mu_);
  if (auto it = sessions_.find(peer); max_per_peer_ > 0 && it != sessions_.end() && it->second >= max_per_peer_) {
    return absl::ResourceExhaustedError(absl::StrCat("the client ", peer, " holds its maximum of ", max_per_peer_,
                                                     " sessions (--max_sessions_per_peer)"));
  }
  ++sessions_[peer];
  return Slot(this, std::move(peer));
}

int PeerSessions::Count(std::string_view grpc_peer) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(PeerAddress(grpc_peer));
  return it == sessions_.end() ? 0 : it->second;
}

void PeerSessions::Release(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(peer);
  if (it != sessions_.end() && --it->second <= 0) sessions_.erase(it);
}

}  // namespace decoded::server
