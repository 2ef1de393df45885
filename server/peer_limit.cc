#include "server/peer_limit.h"

#include <utility>

#include "absl/strings/string_view.h"

namespace decoded::server {

PeerLimit::Slot::~Slot() {
  if (owner_ != nullptr) owner_->Release(address_);
}

std::optional<PeerLimit::Slot> PeerLimit::TryAcquire(std::string address) {
  absl::MutexLock lock(&mu_);
  int& n = held_[address];
  if (max_per_peer_ > 0 && n >= max_per_peer_) return std::nullopt;
  ++n;
  return Slot(this, std::move(address));
}

int PeerLimit::Count(std::string_view address) const {
  absl::MutexLock lock(&mu_);
  // Debian's Abseil hashes absl::string_view, not std::string_view.
  auto it = held_.find(absl::string_view(address.data(), address.size()));
  return it == held_.end() ? 0 : it->second;
}

void PeerLimit::Release(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(address);
  if (it != held_.end() && --it->second <= 0) held_.erase(it);
}

}  // namespace decoded::server
