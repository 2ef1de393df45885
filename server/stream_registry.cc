#include "server/stream_registry.h"

#include <vector>

namespace decoded::server {

bool StreamRegistry::Add(DrainableStream* stream) {
  absl::MutexLock lock(&mu_);
  if (draining_) return false;
  streams_.insert(stream);
  return true;
}

void StreamRegistry::Remove(DrainableStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
}

void StreamRegistry::StartDrain() {
  std::vector<DrainableStream*> streams;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    for (DrainableStream* s : streams_) {
      s->Ref();
      streams.push_back(s);
    }
  }
  // Without the lock: a stream that finishes here may unregister at once.
  for (DrainableStream* s : streams) {
    s->StartDrain();
    s->Unref();
  }
}

bool StreamRegistry::WaitUntilEmpty(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      absl::Condition(+[](absl::flat_hash_set<DrainableStream*>* s) { return s->empty(); }, &streams_), deadline);
}

int StreamRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

}  // namespace decoded::server
