// The Generate streams a server has open, so a drain can reach each of them.
//
// A stream registers when its reactor starts and unregisters when it is
// deleted (gRPC and the engine are both done with it).
// StartDrain takes a reference on each stream under the registry lock and
// calls it without the lock, so a stream may finish (and unregister) inside
// the call while it stays alive until the call returns.
//
// Thread-safety: every method may be called from any thread.
#ifndef DECODED_SERVER_STREAM_REGISTRY_H_
#define DECODED_SERVER_STREAM_REGISTRY_H_

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace decoded::server {

// What a drain asks of one open stream.
class DrainableStream {
 public:
  virtual ~DrainableStream() = default;
  // Keeps the stream alive between the two calls.
  virtual void Ref() = 0;
  virtual void Unref() = 0;
  // The server is draining: refuse new turns; end the stream (UNAVAILABLE)
  // at once when idle, else after its running turn ends. Must not block.
  virtual void StartDrain() = 0;
};

class StreamRegistry {
 public:
  // False once a drain has started: the stream must refuse itself.
  bool Add(DrainableStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(DrainableStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls StartDrain on every open stream; later Adds fail.
  void StartDrain() ABSL_LOCKS_EXCLUDED(mu_);
  // True once no stream is open; false if `deadline` passed first.
  bool WaitUntilEmpty(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  int size() const ABSL_LOCKS_EXCLUDED(mu_);

  // Set just before the server cancels the streams still open after the
  // drain deadline, so their cancellation counts as shutdown, not as a
  // client that went away.
  void MarkCancellingAll() { cancelling_all_.store(true); }
  bool cancelling_all() const { return cancelling_all_.load(); }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_set<DrainableStream*> streams_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> cancelling_all_{false};
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_STREAM_REGISTRY_H_
