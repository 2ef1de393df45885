// quant_matmul_bench: single-thread throughput of the quant.h mat-vec kernels
// per weight type, in weight bytes streamed per second (GB/s) and elements
// per second, for every instruction-set tier this CPU supports (the last
// part of each name: avx512vnni, avx2, scalar; engine/cpu_isa.h), or only
// DECODED_CPU_ISA's when it is set.
//
// Each case multiplies a weight matrix of about `size` bytes (rows of k =
// 4096 elements) by m activation rows already converted to the type's
// activation type, so only MatMul is timed:
//   l2     ~1 MiB of weights, m = 1 and 8: L2-resident, the kernels'
//          compute cost per byte;
//   l3     ~64 MiB, m = 1: a small model's decode step where the last-level
//          cache holds its weights (SmolLM2-135M Q4_1 is 98 MB);
//   dram   ~512 MiB, m = 1: a decode step's weight stream from memory;
//   gemm   ~1 MiB, m = 128: a prefill chunk (kMaxPrefillChunk rows), the
//          tiled multi-row path.
//
//   build/bench/quant_matmul_bench [--benchmark_filter='dram/.*avx512vnni']
//       [--benchmark_repetitions=3 --benchmark_enable_random_interleaving]
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/cpu_isa.h"
#include "engine/dtype.h"
#include "engine/quant/quant.h"

namespace decoded::quant {
namespace {

constexpr int64_t kK = 4096;

// Offsets of each block's fp16 scale fields (d, m / dmin), which must be
// finite; all other bytes are random codes.
std::vector<size_t> HalfFields(DType t) {
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ8_0:
      return {0};
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
      return {0, 2};
    case DType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

struct Problem {
  std::vector<uint8_t> w;
  size_t row_bytes = 0;
  int64_t rows = 0;
  std::vector<uint8_t> xq;
  size_t xq_row_bytes = 0;
  std::vector<float> y;
};

Problem MakeProblem(DType t, size_t target_bytes, int64_t m) {
  Problem p;
  p.row_bytes = *RowBytes(t, kK);
  p.rows = std::max<int64_t>(1, static_cast<int64_t>(target_bytes / p.row_bytes));
  p.w.resize(p.row_bytes * static_cast<size_t>(p.rows));
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= p.w.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&p.w[i], &v, 8);
  }
  const DTypeTraits& tr = Traits(t);
  const uint16_t h = F32ToF16(0.01f);
  for (size_t b = 0; b < p.w.size(); b += tr.block_bytes) {
    for (size_t off : HalfFields(t)) std::memcpy(&p.w[b + off], &h, 2);
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * kK));
  for (float& v : x) v = normal(rng);
  p.xq_row_bytes = ActivationRowBytes(t, kK);
  p.xq.resize(p.xq_row_bytes * static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) QuantizeActivationRow(t, x.data() + i * kK, kK, p.xq.data() + i * p.xq_row_bytes);
  p.y.resize(static_cast<size_t>(m * p.rows));
  return p;
}

// The library calls a benchmark function several times while it sizes the
// iteration count; the last problem is kept so 512 MiB is filled once.
Problem& CachedProblem(DType t, size_t target_bytes, int64_t m) {
  static std::unique_ptr<Problem> problem;
  static std::tuple<DType, size_t, int64_t> key;
  if (problem == nullptr || key != std::make_tuple(t, target_bytes, m)) {
    problem.reset();
    problem = std::make_unique<Problem>(MakeProblem(t, target_bytes, m));
    key = {t, target_bytes, m};
  }
  return *problem;
}

void BM_MatMul(benchmark::State& state, DType t, size_t target_bytes, CpuIsa isa) {
  if (absl::Status s = SetActiveCpuIsa(isa); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  const int64_t m = state.range(0);
  Problem& p = CachedProblem(t, target_bytes, m);
  for (auto _ : state) {
    MatMul(t, p.w.data(), p.row_bytes, kK, p.xq.data(), p.xq_row_bytes, m, p.y.data(), p.rows, 0, p.rows);
    benchmark::DoNotOptimize(p.y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(p.w.size()));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * p.rows * kK * m);
  state.SetLabel(std::string(KernelVariant()) + ", " + std::to_string(p.w.size() >> 10) + " KiB");
}

const DType kTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                        DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

int Register() {
  // DECODED_CPU_ISA narrows the run to one tier; a bad value is reported by
  // the first benchmark (SetActiveCpuIsa refuses a tier the CPU lacks).
  std::vector<CpuIsa> tiers;
  const char* only = std::getenv(kCpuIsaEnv);
  if (only != nullptr && *only != '\0') {
    absl::StatusOr<CpuIsa> isa = ParseCpuIsa(only);
    tiers.push_back(isa.ok() ? *isa : CpuIsa::kScalar);
  } else {
    for (CpuIsa isa : kCpuIsas) {
      if (CpuSupports(isa)) tiers.push_back(isa);
    }
  }
  for (DType t : kTypes) {
    for (CpuIsa isa : tiers) {
      const std::string name = std::string(DTypeName(t)) + "/" + CpuIsaName(isa);
      benchmark::RegisterBenchmark(("l2/" + name).c_str(), BM_MatMul, t, size_t{1} << 20, isa)
          ->Arg(1)
          ->Arg(8)
          ->ArgName("m")
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("l3/" + name).c_str(), BM_MatMul, t, size_t{64} << 20, isa)
          ->Arg(1)
          ->ArgName("m")
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("gemm/" + name).c_str(), BM_MatMul, t, size_t{1} << 20, isa)
          ->Arg(128)
          ->ArgName("m")
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("dram/" + name).c_str(), BM_MatMul, t, size_t{512} << 20, isa)
          ->Arg(1)
          ->ArgName("m")
          ->Unit(benchmark::kMillisecond)
          ->MinTime(1.0);
    }
  }
  return 0;
}

const int kRegistered = Register();

}  // namespace
}  // namespace decoded::quant

BENCHMARK_MAIN();
