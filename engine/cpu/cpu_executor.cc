#include "engine/cpu/cpu_executor.h"

#include <immintrin.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "engine/runtime.h"

namespace decoded {
namespace {
inline void CpuRelax() { _mm_pause(); }
// Spin iterations before a worker sleeps: long enough to bridge the gap
// between the decode steps of a busy session, short enough not to burn a core
// when idle.
constexpr int kSpinBeforeSleep = 1 << 16;
constexpr int kSpinBeforeYield = 1 << 12;
}  // namespace

CpuExecutor::CpuExecutor(int threads, const std::atomic<int>* lent_threads)
    : nth_(threads < 1 ? 1 : threads), lent_threads_(lent_threads) {
  for (int i = 1; i < nth_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

CpuExecutor::~CpuExecutor() {
  stop_.store(true);
  epoch_.fetch_add(1);
  epoch_.notify_all();
  for (auto& t : workers_) t.join();
}

void CpuExecutor::WorkerLoop(int ith) {
  uint32_t seen = 0;
  bool skipped = false;
  for (;;) {
    // A member left out of the last region sleeps at once: its core is lent.
    int spins = skipped ? kSpinBeforeSleep : 0;
    uint32_t e;
    while ((e = epoch_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpinBeforeSleep) {
        CpuRelax();
      } else {
        epoch_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = e;
    if (stop_.load(std::memory_order_acquire)) return;
    skipped = ith >= width_;
    if (!skipped) fn_(ctx_, ith, width_);
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void CpuExecutor::Parallel(RegionFn fn, void* ctx) {
  const int lent = lent_threads_ == nullptr ? 0 : lent_threads_->load(std::memory_order_relaxed);
  const int width = lent <= 0 ? nth_ : std::max(1, nth_ - lent);
  if (width == 1) {  // the other members are not woken
    width_ = 1;
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  width_ = width;
  done_.store(0, std::memory_order_relaxed);
  epoch_.fetch_add(1, std::memory_order_acq_rel);
  epoch_.notify_all();
  fn(ctx, 0, width);
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != nth_ - 1) {
    if (++spins < kSpinBeforeYield) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

void CpuExecutor::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
  struct Job {
    int64_t n;
    absl::FunctionRef<void(int64_t)> fn;
  } job{n, fn};
  Parallel(
      [](void* ctx, int ith, int nth) {
        const Job& j = *static_cast<const Job*>(ctx);
        for (int64_t i = ith; i < j.n; i += nth) j.fn(i);
      },
      &job);
}

void CpuExecutor::Barrier() {
  if (width_ == 1) return;
  const uint32_t phase = barrier_phase_.load(std::memory_order_acquire);
  if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == width_ - 1) {
    barrier_count_.store(0, std::memory_order_relaxed);
    barrier_phase_.fetch_add(1, std::memory_order_acq_rel);
  } else {
    // Spin first (the common case: the team is balanced and on its own
    // cores), then yield so an oversubscribed machine still makes progress.
    int spins = 0;
    while (barrier_phase_.load(std::memory_order_acquire) == phase) {
      if (++spins < kSpinBeforeYield) {
        CpuRelax();
      } else {
        std::this_thread::yield();
      }
    }
  }
}

std::unique_ptr<Executor> CreateCpuExecutor(int threads, const std::atomic<int>* lent_threads) {
  return std::make_unique<CpuExecutor>(threads, lent_threads);
}

}  // namespace decoded
