// A CPU executor: a fixed team of `threads` threads (the caller plus
// threads - 1 workers) that runs one parallel region at a time.
//
// Parallel(fn, ctx) runs fn(ctx, ith, nth) on every team member and returns
// when all have finished; inside, Barrier() synchronises the team. Workers
// spin briefly between regions (decode issues one region per token with a few
// hundred barriers, so wake-up latency matters) and then sleep on a futex.
// Nothing here allocates after construction.
//
// While *lent_threads > 0 (when given), a region runs on fewer members:
// width = max(1, threads - *lent_threads), fixed for the region; the others
// skip it and go straight back to sleep, leaving their cores to the host work
// the threads were lent to.
//
// Thread-safety: Parallel() is called by one thread at a time (the worker
// that owns the executor).
#ifndef DECODED_ENGINE_CPU_CPU_EXECUTOR_H_
#define DECODED_ENGINE_CPU_CPU_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "engine/backend.h"

namespace decoded {

class CpuExecutor final : public Executor {
 public:
  using RegionFn = void (*)(void* ctx, int ith, int nth);

  explicit CpuExecutor(int threads, const std::atomic<int>* lent_threads = nullptr);
  ~CpuExecutor() override;
  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  std::string_view backend_name() const override { return "cpu"; }
  int threads() const override { return nth_; }

  void Parallel(RegionFn fn, void* ctx);
  // Indices dealt round-robin to the team (i % nth == ith).
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) override;
  // All members running the region (its nth) must call it the same number of
  // times within it.
  void Barrier();

 private:
  void WorkerLoop(int ith);

  int nth_;
  const std::atomic<int>* const lent_threads_;
  std::vector<std::thread> workers_;
  RegionFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int width_ = 1;  // members running the current region; published by epoch_
  std::atomic<uint32_t> epoch_{0};
  std::atomic<int> done_{0};
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<int> barrier_count_{0};
  alignas(64) std::atomic<uint32_t> barrier_phase_{0};
};

}  // namespace decoded

#endif  // DECODED_ENGINE_CPU_CPU_EXECUTOR_H_
