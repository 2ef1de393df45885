// Software prefetch of the weight stream. Internal to engine/quant.
//
// A decode step reads each weight byte once, so the mat-vec kernels are
// memory-bound, yet without help they reach only about two thirds of the
// read bandwidth (Q8_0 at m = 1: 5.6 GB/s of 8.6 on one Xeon thread): the
// hardware prefetcher runs too little ahead of a loop that also spends
// compute on every block, so memory stalls and arithmetic take turns
// instead of overlapping. Asking for the lines kPrefetchAhead bytes ahead of
// the row being computed keeps enough misses in flight: +15-35% at m = 1..2
// (bench/quant_matmul_bench dram, bench/batch_decode_bench). Prefetches never
// fault, so running past the matrix's end is harmless.
#ifndef DECODED_ENGINE_QUANT_PREFETCH_H_
#define DECODED_ENGINE_QUANT_PREFETCH_H_

#include <cstddef>
#include <cstdint>

#include "engine/isa_namespace.h"

namespace decoded::quant::internal {
inline namespace DECODED_ISA_NS {

// Measured on a 2-vCPU Xeon (AVX-512): 2-16 KiB ahead all gain alike; 4 KiB
// is a few rows of a small model's matrices and well inside L1 + L2.
inline constexpr size_t kPrefetchAhead = 4096;

// Prefetches (into all cache levels) the `bytes` bytes starting
// kPrefetchAhead bytes after `p`, one request per 64-byte line.
inline void PrefetchAhead(const uint8_t* p, size_t bytes) {
  const uint8_t* ahead = p + kPrefetchAhead;
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(ahead + off, /*rw=*/0, /*locality=*/3);
}

// PrefetchAhead spread over the steps of a compute loop: a tile loop that
// issues a whole tile's lines at once stalls on the full miss buffers (a
// third of the Q8_0 tile kernel's time sat on those prefetches at 8 rows);
// a few lines per step keep the requests in flight while the arithmetic runs.
class SpreadPrefetch {
 public:
  SpreadPrefetch() = default;
  // The lines of [p + kPrefetchAhead, + bytes), over `steps` Step() calls.
  SpreadPrefetch(const uint8_t* p, size_t bytes, int64_t steps)
      : next_(p + kPrefetchAhead),
        end_(next_ + bytes),
        per_step_(steps > 0 ? (bytes / 64 + static_cast<size_t>(steps)) / static_cast<size_t>(steps) : bytes / 64 + 1) {}
  void Step() {
    for (size_t i = 0; i < per_step_ && next_ < end_; ++i, next_ += 64) __builtin_prefetch(next_, 0, 3);
  }
  // What Step() has not issued yet (a loop shorter than planned).
  void Finish() {
    for (; next_ < end_; next_ += 64) __builtin_prefetch(next_, 0, 3);
  }

 private:
  const uint8_t* next_ = nullptr;
  const uint8_t* end_ = nullptr;
  size_t per_step_ = 0;
};

}  // namespace DECODED_ISA_NS
}  // namespace decoded::quant::internal

#endif  // DECODED_ENGINE_QUANT_PREFETCH_H_
