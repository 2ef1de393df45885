#include "server/stream_registry.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "server/peer_sessions.h"

namespace decoded::server {

absl::Status StreamRegistry::Add(OpenStream* stream, const std::string& grpc_peer) {
  std::string peer = PeerSessions::PeerAddress(grpc_peer);
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the server is draining");
  if (static_cast<int>(counted_.size()) >= max_streams_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the server holds its maximum of ", max_streams_, " open Generate streams (--max_streams)"));
  }
  if (auto it = per_peer_.find(peer);
      max_streams_per_peer_ > 0 && it != per_peer_.end() && it->second >= max_streams_per_peer_) {
    return absl::ResourceExhaustedError(absl::StrCat("the client ", peer, " holds its maximum of ",
                                                     max_streams_per_peer_,
                                                     " open Generate streams (--max_streams_per_peer)"));
  }
  ++per_peer_[peer];
  streams_.insert(stream);
  counted_.emplace(stream, std::move(peer));
  return absl::OkStatus();
}

void StreamRegistry::UncountLocked(OpenStream* stream) {
  auto it = counted_.find(stream);
  if (it == counted_.end()) return;
  auto peer = per_peer_.find(it->second);
  if (peer != per_peer_.end() && --peer->second <= 0) per_peer_.erase(peer);
  counted_.erase(it);
}

void StreamRegistry::StopCounting(OpenStream* stream) {
  absl::MutexLock lock(&mu_);
  UncountLocked(stream);
}

void StreamRegistry::Remove(OpenStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
  UncountLocked(stream);
}

std::vector<OpenStream*> StreamRegistry::RefAll() {
  std::vector<OpenStream*> streams;
  absl::MutexLock lock(&mu_);
  streams.reserve(streams_.size());
  for (OpenStream* s : streams_) {
    if (s->TryRef()) streams.push_back(s);
  }
  return streams;
}

void StreamRegistry::StartDrain() {
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
  }
  // Without the lock: a stream that finishes here may unregister at once.
  for (OpenStream* s : RefAll()) {
    s->StartDrain();
    s->Unref();
  }
}

bool StreamRegistry::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

void StreamRegistry::ExpireIdle(const IdleTimeouts& timeouts) {
  const auto now = std::chrono::steady_clock::now();
  for (OpenStream* s : RefAll()) {
    s->ExpireIfIdle(now, timeouts);
    s->Unref();
  }
}

bool StreamRegistry::WaitUntilEmpty(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      absl::Condition(+[](absl::flat_hash_set<OpenStream*>* s) { return s->empty(); }, &streams_), deadline);
}

int StreamRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

}  // namespace decoded::server
