#include "server/stream_registry.h"

#include <optional>
#include <utility>
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
  std::optional<PeerLimit::Slot> slot = per_peer_.TryAcquire(peer);
  if (!slot.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat("the client ", peer, " holds its maximum of ",
                                                     per_peer_.max_per_peer(),
                                                     " open Generate streams (--max_streams_per_peer)"));
  }
  streams_.insert(stream);
  counted_.emplace(stream, *std::move(slot));
  return absl::OkStatus();
}

void StreamRegistry::UncountLocked(OpenStream* stream) {
  counted_.erase(stream);  // its peer slot with it
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
