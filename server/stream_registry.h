// The Generate streams a server has open, so a drain and the idle timeout can
// reach each of them, and so their number stays bounded.
//
// A stream registers when its reactor starts and unregisters when it is
// deleted (gRPC and the engine are both done with it).
// StartDrain and ExpireIdle take a reference on each stream under the
// registry lock (skipping one whose last reference is gone and which is
// about to unregister) and call it without the lock, so a stream may finish
// (and unregister) inside the call while it stays alive until the call
// returns.
//
// Thread-safety: every method may be called from any thread.
#ifndef DECODED_SERVER_STREAM_REGISTRY_H_
#define DECODED_SERVER_STREAM_REGISTRY_H_

#include <atomic>
#include <chrono>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace decoded::server {

// What the server asks of one open stream.
class OpenStream {
 public:
  virtual ~OpenStream() = default;
  // Keeps the stream alive until Unref. False when the stream is already
  // being destroyed (its last reference went while it was still registered):
  // it must then be left alone.
  virtual bool TryRef() = 0;
  virtual void Unref() = 0;
  // The server is draining: refuse new turns; end the stream (UNAVAILABLE)
  // at once when idle, else after its running turn ends. Must not block.
  virtual void StartDrain() = 0;
  // Ends the stream if it has been idle for `timeout` at `now` (see
  // GenerateReactor). Must not block.
  virtual void ExpireIfIdle(std::chrono::steady_clock::time_point now, std::chrono::nanoseconds timeout) = 0;
};

class StreamRegistry {
 public:
  // `max_streams`: open streams beyond which Add refuses (>= 1).
  explicit StreamRegistry(int max_streams) : max_streams_(max_streams) {}

  // OK, or the status the stream must refuse itself with: UNAVAILABLE once a
  // drain has started, RESOURCE_EXHAUSTED when max_streams count against the
  // limit.
  absl::Status Add(OpenStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream is ending (cancelled, or its status is on the way): it stops
  // counting against max_streams at once, so a burst of reset streams whose
  // reactors gRPC has yet to destroy refuses no newcomer. It stays registered.
  void StopCounting(OpenStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(OpenStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls StartDrain on every open stream; later Adds fail.
  void StartDrain() ABSL_LOCKS_EXCLUDED(mu_);
  // Calls ExpireIfIdle on every open stream.
  void ExpireIdle(std::chrono::nanoseconds timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // True once no stream is open; false if `deadline` passed first.
  bool WaitUntilEmpty(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Registered streams, ending ones included.
  int size() const ABSL_LOCKS_EXCLUDED(mu_);

  // Set just before the server cancels the streams still open after the
  // drain deadline, so their cancellation counts as shutdown, not as a
  // client that went away.
  void MarkCancellingAll() { cancelling_all_.store(true); }
  bool cancelling_all() const { return cancelling_all_.load(); }

 private:
  // Every open stream, each with a reference (released by the caller).
  std::vector<OpenStream*> RefAll() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_streams_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<OpenStream*> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<OpenStream*> counted_ ABSL_GUARDED_BY(mu_);  // those not yet ending
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> cancelling_all_{false};
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_STREAM_REGISTRY_H_
