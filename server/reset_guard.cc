#include "server/reset_guard.h"

#include <algorithm>
#include <iostream>

#include "absl/time/clock.h"

namespace decoded::server {

void ResetGuard::StreamReset(const std::string& grpc_peer) {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    auto [it, fresh] = buckets_.try_emplace(grpc_peer, Bucket{burst_, now});
    Bucket& b = it->second;
    if (b.closed) return;
    b.tokens = std::min(burst_, b.tokens + absl::ToDoubleSeconds(now - b.last) * rate_);
    b.last = now;
    b.tokens -= 1;
    if (b.tokens >= 0) return;
    b.closed = true;
    ++closed_;
  }
  if (close_(grpc_peer)) {
    std::cerr << "decoded: closed the connection of " << grpc_peer << ": its client reset streams faster than "
              << rate_ << " per second (burst " << burst_ << ")\n";
  }
}

void ResetGuard::Prune() {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    const Bucket& b = it->second;
    // Full again (or closed a while ago): nothing to remember.
    const bool full = b.tokens + absl::ToDoubleSeconds(now - b.last) * rate_ >= burst_;
    if (full || (b.closed && now - b.last > absl::Minutes(1))) {
      buckets_.erase(it++);
    } else {
      ++it;
    }
  }
}

int64_t ResetGuard::connections_closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

}  // namespace decoded::server
