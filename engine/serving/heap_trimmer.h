// Gives heap memory that closed sessions freed back to the operating system.
//
// glibc's malloc keeps freed chunks in its arenas (one per thread that
// allocates: gRPC threads, workers) for reuse, and only returns memory at the
// top of an arena's heap. A storm of short sessions therefore leaves the
// daemon's resident size grown by hundreds of MB of free but retained heap
// (measured: 336 -> 484 MB after 1,000 aborted streams), although nothing
// leaks. malloc_trim(0) releases the free pages of every arena (madvise), so
// the trimmer runs it on its own thread after sessions are destroyed, at most
// once per `min_interval`, never on a worker's or a gRPC thread's path.
// Elsewhere than glibc it does nothing.
//
// Thread-safety: Request may be called from any thread, with locks held.
#ifndef DECODED_ENGINE_SERVING_HEAP_TRIMMER_H_
#define DECODED_ENGINE_SERVING_HEAP_TRIMMER_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace decoded::serving {

class HeapTrimmer {
 public:
  // `also`, when set, runs with every trim on the trimmer's thread (the KV
  // pool's Trim: blocks closed sessions freed).
  explicit HeapTrimmer(absl::Duration min_interval = absl::Milliseconds(250),
                       std::function<void()> also = nullptr);
  ~HeapTrimmer();
  HeapTrimmer(const HeapTrimmer&) = delete;
  HeapTrimmer& operator=(const HeapTrimmer&) = delete;

  // Asks for a trim: one runs within min_interval of the request.
  void Request() ABSL_LOCKS_EXCLUDED(mu_);

  // Trims run so far (tests).
  int64_t trims() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  const absl::Duration min_interval_;
  const std::function<void()> also_;
  mutable absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t trims_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace decoded::serving

#endif  // DECODED_ENGINE_SERVING_HEAP_TRIMMER_H_
