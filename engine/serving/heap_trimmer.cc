#include "engine/serving/heap_trimmer.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <utility>

namespace decoded::serving {

HeapTrimmer::HeapTrimmer(absl::Duration min_interval, std::function<void()> also)
    : min_interval_(min_interval), also_(std::move(also)) {
  thread_ = std::thread([this] { Loop(); });
}

HeapTrimmer::~HeapTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void HeapTrimmer::Request() {
  absl::MutexLock lock(&mu_);
  requested_ = true;
}

int64_t HeapTrimmer::trims() const {
  absl::MutexLock lock(&mu_);
  return trims_;
}

void HeapTrimmer::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(
        +[](HeapTrimmer* t) ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->requested_ || t->stopping_; }, this));
    if (stopping_) return;
    requested_ = false;
    mu_.Unlock();
    if (also_) also_();
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    mu_.Lock();
    ++trims_;
    // Rate limit: requests during the pause are served by the next trim.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), min_interval_);
  }
}

}  // namespace decoded::serving
