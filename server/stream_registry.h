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
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/peer_limit.h"

namespace decoded::server {

// When an open stream counts as idle (see GenerateReactor::ExpireIfIdle).
struct IdleTimeouts {
  // No turn in flight for this long (a session's think time).
  std::chrono::nanoseconds idle_session = std::chrono::seconds(300);
  // No turn at all since the stream opened, for this long: a stream holds a
  // slot of --max_streams, and a client means to use it at once.
  std::chrono::nanoseconds first_turn = std::chrono::seconds(30);
};

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
  // Ends the stream if it is idle by `timeouts` at `now` (see
  // GenerateReactor). Must not block.
  virtual void ExpireIfIdle(std::chrono::steady_clock::time_point now, const IdleTimeouts& timeouts) = 0;
};

class StreamRegistry {
 public:
  // `max_streams`: open streams beyond which Add refuses (>= 1);
  // `max_streams_per_peer`: the same for the streams of one client address
  // (PeerSessions::PeerAddress), 0 for no such limit.
  explicit StreamRegistry(int max_streams, int max_streams_per_peer = 0)
      : max_streams_(max_streams), per_peer_(max_streams_per_peer) {}

  // OK, or the status the stream must refuse itself with: UNAVAILABLE once a
  // drain has started, RESOURCE_EXHAUSTED when max_streams (or the peer's
  // max_streams_per_peer) count against the limit. `grpc_peer`: the call's
  // peer, "ipv4:10.0.0.7:51234".
  absl::Status Add(OpenStream* stream, const std::string& grpc_peer = "") ABSL_LOCKS_EXCLUDED(mu_);
  // The stream is ending (cancelled, or its status is on the way): it stops
  // counting against max_streams at once, so a burst of reset streams whose
  // reactors gRPC has yet to destroy refuses no newcomer. It stays registered.
  void StopCounting(OpenStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(OpenStream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls StartDrain on every open stream; later Adds fail.
  void StartDrain() ABSL_LOCKS_EXCLUDED(mu_);
  // True from the start of StartDrain, before it reaches each stream: a turn
  // read meanwhile on a stream it has yet to reach is refused all the same.
  bool draining() const ABSL_LOCKS_EXCLUDED(mu_);
  // Calls ExpireIfIdle on every open stream.
  void ExpireIdle(const IdleTimeouts& timeouts) ABSL_LOCKS_EXCLUDED(mu_);
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

  void UncountLocked(OpenStream* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_streams_;
  PeerLimit per_peer_;  // declared before counted_, whose slots it counts
  mutable absl::Mutex mu_;
  absl::flat_hash_set<OpenStream*> streams_ ABSL_GUARDED_BY(mu_);
  // Those not yet ending, each with its peer's slot.
  absl::flat_hash_map<OpenStream*, PeerLimit::Slot> counted_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> cancelling_all_{false};
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_STREAM_REGISTRY_H_
