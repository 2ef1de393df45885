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

SamplingParams With(float temperature, int32_t top_k, float top_p, int32_t top_logprobs, float repetition) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.top_logprobs = top_logprobs;
  p.repetition_penalty = repetition;
  return p;
}

// Name, params (temperature, top_k, top_p, top_logprobs, repetition penalty), penalised ids accepted.
BENCHMARK_CAPTURE(Run, Greedy, With(0.0f, 0, 1.0f, 0, 1.0f), false);
BENCHMARK_CAPTURE(Run, GreedyPenalised, With(0.0f, 0, 1.0f, 0, 1.1f), true);
BENCHMARK_CAPTURE(Run, GreedyTopLogprobs5, With(0.0f, 0, 1.0f, 5, 1.0f), false);
BENCHMARK_CAPTURE(Run, Temperature, With(0.8f, 0, 1.0f, 0, 1.0f), false);
BENCHMARK_CAPTURE(Run, TopKTopP, With(0.8f, 40, 0.95f, 0, 1.0f), false);
BENCHMARK_CAPTURE(Run, TopP, With(0.8f, 0, 0.95f, 0, 1.0f), false);

}  // namespace
}  // namespace decoded

BENCHMARK_MAIN();
