// sampler_bench: time of one Sampler::Sample call over a vocabulary-sized
// logits row (Gemma 3's 262144 ids), per sampling configuration. The daemon
// samples every decoded row on the worker's threads between two batched
// steps, so this cost adds to every token's latency.
//
//   build/bench/sampler_bench [--benchmark_filter=Greedy]
#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/sampling/sampler.h"

namespace decoded {
namespace {

constexpr int32_t kVocab = 262144;

// Logits shaped like a language model's: most ids far below a handful of
// likely ones.
std::vector<float> MakeLogits() {
  std::mt19937 rng(7);
  std::normal_distribution<float> body(-4.0f, 2.5f);
  std::vector<float> x(kVocab);
  for (float& v : x) v = body(rng);
  for (int i = 0; i < 16; ++i) x[(i * 7919) % kVocab] = 12.0f + static_cast<float>(i) * 0.25f;
  return x;
}

void Run(benchmark::State& state, SamplingParams p, bool penalise) {
  const std::vector<float> logits = MakeLogits();
  Sampler sampler(p, kVocab);
  if (penalise) {
    for (int32_t id = 0; id < 64; ++id) sampler.Accept(id * 31);
  }
  for (auto _ : state) benchmark::DoNotOptimize(sampler.Sample(logits));
  state.SetItemsProcessed(state.iterations() * kVocab);
}

void BM_Greedy(benchmark::State& s) { Run(s, SamplingParams{}, false); }
void BM_GreedyPenalised(benchmark::State& s) {
  SamplingParams p;
  p.repetition_penalty = 1.1f;
  Run(s, p, true);
}
void BM_GreedyTopLogprobs5(benchmark::State& s) {
  SamplingParams p;
  p.top_logprobs = 5;
  Run(s, p, false);
}
void BM_Temperature(benchmark::State& s) {
  SamplingParams p;
  p.temperature = 0.8f;
  Run(s, p, false);
}
void BM_TopKTopP(benchmark::State& s) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  Run(s, p, false);
}
void BM_TopP(benchmark::State& s) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  Run(s, p, false);
}
BENCHMARK(BM_Greedy);
BENCHMARK(BM_GreedyPenalised);
BENCHMARK(BM_GreedyTopLogprobs5);
BENCHMARK(BM_Temperature);
BENCHMARK(BM_TopKTopP);
BENCHMARK(BM_TopP);

}  // namespace
}  // namespace decoded

BENCHMARK_MAIN();
