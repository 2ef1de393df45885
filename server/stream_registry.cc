#include "server/stream_registry.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace decoded::server {

absl::Status StreamRegistry::Add(OpenStream* stream) {
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the server is draining");
  if (static_cast<int>(counted_.size()) >= max_streams_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the server holds its maximum of ", max_streams_, " open Generate streams (--max_streams)"));
  }
  streams_.insert(stream);
  counted_.insert(stream);
  return absl::OkStatus();
}

void StreamRegistry::StopCounting(OpenStream* stream) {
  absl::MutexLock lock(&mu_);
  counted_.erase(stream);
}

void StreamRegistry::Remove(OpenStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
  counted_.erase(stream);
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

void StreamRegistry::ExpireIdle(std::chrono::nanoseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  for (OpenStream* s : RefAll()) {
    s->ExpireIfIdle(now, timeout);
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
