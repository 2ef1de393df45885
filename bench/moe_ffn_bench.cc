// moe_ffn_bench: per-token cost of the MoE FFN op (cpu::MoeFfn, the kernel
// behind Graph::moe_ffn) against the number of experts used (k) and the
// number of experts stored (n_expert), one decode row, one thread.
//
// Shapes are Qwen3-MoE-like at a small scale: hidden 1024, expert FFN 512,
// gate/up/down experts in Q8_0 (quantized from random floats by the
// activation quantizer, whose Q8_0 blocks are the weight format's). Each
// iteration routes a different row of 64 precomputed random router logits,
// so the selected experts change from token to token as in decode; the
// router matmul itself (an ordinary matmul node) is not timed.
//
//   build/bench/moe_ffn_bench [--benchmark_filter=...]
//       [--benchmark_repetitions=3 --benchmark_report_aggregates_only=true]
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/cpu/kernels.h"
#include "engine/quant/quant.h"

namespace decoded::cpu {
namespace {

constexpr int64_t kHidden = 1024;
constexpr int64_t kExpertFfn = 512;
constexpr int kRoutingRows = 64;

struct Experts {
  std::vector<uint8_t> bytes;
  MoeExpertMatrix m;
};

// n_expert planes of [rows, cols] Q8_0 rows quantized from N(0, 0.05).
Experts MakeExperts(int32_t n_expert, int64_t rows, int64_t cols, std::mt19937& rng) {
  Experts e;
  const size_t rb = quant::ActivationRowBytes(DType::kQ8_0, cols);
  e.bytes.resize(rb * static_cast<size_t>(rows) * static_cast<size_t>(n_expert));
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (size_t r = 0; r < static_cast<size_t>(rows * n_expert); ++r) {
    for (float& v : row) v = normal(rng);
    quant::QuantizeActivationRow(DType::kQ8_0, row.data(), cols, e.bytes.data() + r * rb);
  }
  e.m = {DType::kQ8_0, e.bytes.data(), rb, rows, cols};
  return e;
}

void BM_MoeFfnDecodeRow(benchmark::State& state) {
  const auto n_expert = static_cast<int32_t>(state.range(0));
  const auto k = static_cast<int32_t>(state.range(1));
  std::mt19937 rng(7);
  const Experts gate = MakeExperts(n_expert, kExpertFfn, kHidden, rng);
  const Experts up = MakeExperts(n_expert, kExpertFfn, kHidden, rng);
  const Experts down = MakeExperts(n_expert, kHidden, kExpertFfn, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kHidden), logits(static_cast<size_t>(kRoutingRows) * n_expert), out(kHidden);
  for (float& v : x) v = normal(rng);
  for (float& v : logits) v = normal(rng);
  MoeFfnArgs a{.x = x.data(), .gate = gate.m, .up = up.m, .down = down.m, .out = out.data(), .rows = 1,
               .routing = {.n_expert = n_expert, .k = k, .norm_topk_prob = true}};
  const size_t ws_bytes = (MoeFfnWorkspaceBytes(a) + 63) / 64 * 64;
  std::unique_ptr<void, decltype(&std::free)> ws(std::aligned_alloc(64, ws_bytes), &std::free);
  a.workspace = ws.get();
  int row = 0;
  for (auto _ : state) {
    a.router_logits = logits.data() + static_cast<size_t>(row) * n_expert;
    row = (row + 1) % kRoutingRows;
    MoeFfn(a, 0, 1, [] {});
    benchmark::DoNotOptimize(out.data());
  }
  // Weight bytes read per token: k experts' gate, up and down planes.
  const double per_token = static_cast<double>(k) * static_cast<double>(gate.m.rows * gate.m.row_bytes +
                                                                           up.m.rows * up.m.row_bytes +
                                                                           down.m.rows * down.m.row_bytes);
  state.counters["expert_MB_per_token"] = per_token / 1e6;
  state.counters["GB/s"] = benchmark::Counter(per_token, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

// k at fixed n_expert = 64, then n_expert at fixed k = 8.
BENCHMARK(BM_MoeFfnDecodeRow)
    ->ArgNames({"n_expert", "k"})
    ->Args({64, 1})
    ->Args({64, 2})
    ->Args({64, 4})
    ->Args({64, 8})
    ->Args({64, 16})
    ->Args({16, 8})
    ->Args({128, 8})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace decoded::cpu

BENCHMARK_MAIN();
