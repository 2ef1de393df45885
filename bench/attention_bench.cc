// attention_bench: the CPU attention kernel (cpu::Attention) alone, over a
// contiguous cache of random keys and values, for the real models' head
// geometries: one decode row attending over the whole context, and a prefill
// span of 128 rows ending at it (causal). Reports (query head, key) pairs
// per second, so the figures compare across geometries and lengths.
//
//   build/bench/attention_bench [--benchmark_filter=smollm2]
//
// Arguments of each case: context length, rows (1: decode; 128: prefill
// span), KV type (0: f32, 1: f16), threads.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/kernels.h"
#include "engine/dtype.h"
#include "engine/kv_layout.h"
#include "engine/kv_rows.h"
#include "engine/quant/blocks.h"

namespace decoded {
namespace {

struct HeadGeometry {
  int32_t n_heads, n_kv_heads, head_dim;
};
constexpr HeadGeometry kSmolLM2{9, 3, 64};
constexpr HeadGeometry kQwen25{14, 2, 64};
constexpr HeadGeometry kGemma3{4, 1, 256};

void Run(benchmark::State& state, HeadGeometry g) {
  const int32_t ctx = static_cast<int32_t>(state.range(0));
  const int32_t rows = static_cast<int32_t>(state.range(1));
  const DType type = state.range(2) == 0 ? DType::kF32 : DType::kF16;
  const int threads = static_cast<int>(state.range(3));
  const int64_t rb = KvRowBytes(type, g.head_dim);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill_pool = [&](std::vector<uint8_t>& pool) {
    pool.resize(static_cast<size_t>(g.n_kv_heads) * ctx * rb);
    for (size_t i = 0; i < pool.size() / 4 * (type == DType::kF32 ? 1 : 2); ++i) {
      const float x = nd(rng);
      if (type == DType::kF32) {
        std::memcpy(pool.data() + 4 * i, &x, 4);
      } else {
        const uint16_t h = quant::internal::FloatToHalf(x);
        std::memcpy(pool.data() + 2 * i, &h, 2);
      }
    }
  };
  std::vector<uint8_t> k, v;
  fill_pool(k);
  fill_pool(v);
  std::vector<float> q(static_cast<size_t>(rows) * g.n_heads * g.head_dim);
  for (float& x : q) x = nd(rng);
  std::vector<float> out(q.size());
  const int32_t table[] = {0};
  const auto addr = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(p)); };
  std::vector<int64_t> kv_rows;
  std::vector<int32_t> bounds;
  int64_t pairs = 0;
  for (int32_t r = 0; r < rows; ++r) {
    for (int64_t x : {int64_t{ctx}, int64_t{ctx}, static_cast<int64_t>(type), int64_t{0}, addr(table),
                      addr(k.data()), addr(v.data())}) {
      kv_rows.push_back(x);
    }
    const int32_t hi = ctx - rows + r + 1;
    bounds.push_back(0);
    bounds.push_back(hi);
    pairs += int64_t{hi} * g.n_heads;
  }
  struct Ctx {
    const float* q;
    const int32_t* bounds;
    const int64_t* kv_rows;
    float* out;
    int32_t rows;
    HeadGeometry g;
  } c{q.data(), bounds.data(), kv_rows.data(), out.data(), rows, g};
  CpuExecutor ex(threads);
  for (auto _ : state) {
    ex.Parallel(
        [](void* p, int ith, int nth) {
          const Ctx& c = *static_cast<const Ctx*>(p);
          cpu::Attention(c.q, c.bounds, c.kv_rows, KvRowStride(1), 0, c.out, c.rows, c.g.n_heads, c.g.n_kv_heads,
                         c.g.head_dim, c.g.head_dim, c.g.head_dim, 1.0f / 8.0f, 0.0f, ith, nth);
        },
        &c);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * pairs);
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t threads : {1, 2}) {
    for (int64_t type : {0, 1}) {
      for (int64_t ctx : {512, 2048}) {
        for (int64_t rows : {1, 128}) b->Args({ctx, rows, type, threads});
      }
    }
  }
  b->ArgNames({"ctx", "rows", "f16", "threads"})->UseRealTime();
}

BENCHMARK_CAPTURE(Run, smollm2, kSmolLM2)->Apply(Args);
BENCHMARK_CAPTURE(Run, qwen25, kQwen25)->Apply(Args);
BENCHMARK_CAPTURE(Run, gemma3, kGemma3)->Apply(Args);

}  // namespace
}  // namespace decoded

BENCHMARK_MAIN();
