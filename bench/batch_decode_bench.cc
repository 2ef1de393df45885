// batch_decode_bench: in-process aggregate decode rate of B sessions stepped
// together (BatchDecoder, the serving path's batched decode), for each B.
//
// For each B: B contexts are prefilled with B different --prompt_tokens-token
// prompts (BOS, then ids spread over the vocabulary, offset per sequence: the
// formula bench/llamacpp_batched_bench.py uses), then --decode_steps steps
// each feed every context its greedy token. Reported per B, best of
// --repeats: aggregate decode tok/s (B * steps / time of the steps; a step's
// time is the BatchDecoder::Decode call, the argmax is outside it) and the
// per-step latency p50 / p99 (the inter-token latency each session sees).
// Each B runs the plan the daemon's defaults would give it (--max_batch and
// --max_step_tokens set the plan buckets: B = 7 runs the 8-row plan, with
// one padding row); "plan_rows" reports it.
// Prints one JSON object; bench/run_batch_bench.py compares it with
// llama.cpp stepping B sequences per llama_decode.
//
// --device vulkan[:N] runs the same steps on the Vulkan backend and adds, per
// B, what a step costs there besides its time: queue submissions per step
// (1: the whole batch in one), recordings in the steady state (0 once the
// B-row plan is held) and bytes written into device buffers per step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_model.h"
#include "bench/device_counters.h"
#include "engine/cpu_isa.h"
#include "engine/kv_pool.h"
#include "engine/runtime.h"

ABSL_FLAG(std::string, model, "", "GGUF model path");
ABSL_FLAG(int, threads, 1, "compute threads");
ABSL_FLAG(std::string, batch_sizes, "1,2,4,8,16", "comma-separated batch sizes (sessions stepped together)");
ABSL_FLAG(int, prompt_tokens, 16, "prompt length of each session");
ABSL_FLAG(int, decode_steps, 64, "decode steps measured per batch size and repeat");
ABSL_FLAG(int, repeats, 3, "repetitions; the best rate is reported");
ABSL_FLAG(std::string, device, "cpu", "cpu, vulkan or vulkan:N (as the daemon's --device)");
ABSL_FLAG(int, kv_block_tokens, 0, "paged KV: positions per block of one pool all sessions share (0: contiguous caches)");
ABSL_FLAG(std::string, kv_type, "f32", "KV cache element type: f32, f16 or q8_0");
ABSL_FLAG(int, max_batch, 16,
          "the decoder's max_batch (the daemon's --max_batch); with --max_step_tokens it sets the plan buckets, so a "
          "batch runs the plan of as many rows as it does in the daemon (0: each batch size its own top bucket)");
ABSL_FLAG(int, max_step_tokens, 512, "the decoder's token budget (the daemon's --max_step_tokens)");

namespace decoded {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "batch_decode_bench: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

int32_t Argmax(absl::Span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(static_cast<double>(v.size()) * q))];
}

int Run() {
  const std::string kv_type = absl::GetFlag(FLAGS_kv_type);
  auto model = bench::LoadBenchModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_device), kv_type);
  if (!model.ok()) return Fail("setup", model.status());
  Backend& backend = (*model)->backend();
  std::vector<int32_t> sizes;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_batch_sizes), ',')) {
    int32_t b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1 || b > kMaxBatch) {
      return Fail("--batch_sizes", absl::InvalidArgumentError(std::string(part)));
    }
    sizes.push_back(b);
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  const int n_prompt = std::max(1, absl::GetFlag(FLAGS_prompt_tokens));
  const int steps = std::max(1, absl::GetFlag(FLAGS_decode_steps));
  const int32_t vocab = (*model)->info().vocab_size;
  const int32_t bos = std::max(0, (*model)->tokenizer().bos_id());
  auto made = backend.CreateExecutor(threads);
  if (!made.ok()) return Fail("executor", made.status());
  std::unique_ptr<Executor> executor = *std::move(made);

  std::string results;
  for (int32_t batch : sizes) {
    const int32_t max_batch = absl::GetFlag(FLAGS_max_batch);
    auto decoder = max_batch > 0 ? (*model)->NewBatchDecoder(std::max(max_batch, batch),
                                                             absl::GetFlag(FLAGS_max_step_tokens))
                                 : (*model)->NewBatchDecoder(batch);
    if (!decoder.ok()) return Fail("decoder", decoder.status());
    double best_rate = 0;
    std::vector<double> step_ms;
    bench::DeviceCounters steady;  // of the last repeat's steps after the first
    for (int rep = 0; rep < std::max(1, absl::GetFlag(FLAGS_repeats)); ++rep) {
      std::vector<std::unique_ptr<DecodeContext>> ctx;
      std::vector<DecodeContext*> rows;
      std::vector<int32_t> tokens;
      const int32_t spread = std::max(1, std::min(50000, vocab - 1000));
      const int32_t capacity = n_prompt + steps + 1;
      std::shared_ptr<KvPool> pool;
      if (const int bt = absl::GetFlag(FLAGS_kv_block_tokens); bt > 0) {
        // A position range takes a block of each layer group (engine/kv_groups.h).
        auto probe = (*model)->NewKvPool(bt, 1);
        if (!probe.ok()) return Fail("pool", probe.status());
        const int32_t groups = (*probe)->groups().n_groups();
        probe->reset();
        auto p = (*model)->NewKvPool(bt, batch * groups * ((capacity + bt - 1) / bt));
        if (!p.ok()) return Fail("pool", p.status());
        pool = *std::move(p);
      }
      for (int32_t s = 0; s < batch; ++s) {
        auto c = (*model)->NewContext(capacity, pool);
        if (!c.ok()) return Fail("context", c.status());
        std::vector<int32_t> prompt = {bos};
        for (int i = 1; i < n_prompt; ++i) {
          prompt.push_back(static_cast<int32_t>((1000 + (static_cast<int64_t>(i) * 7919 + s * 104729) % spread) % vocab));
        }
        absl::StatusOr<absl::Span<const float>> l;
        for (size_t at = 0; at < prompt.size(); at += kMaxPrefillChunk) {
          const size_t n = std::min<size_t>(kMaxPrefillChunk, prompt.size() - at);
          l = (*c)->Prefill(absl::MakeConstSpan(prompt).subspan(at, n), false, *executor);
          if (!l.ok()) return Fail("prefill", l.status());
        }
        tokens.push_back(Argmax(*l));
        rows.push_back(c->get());
        ctx.push_back(*std::move(c));
      }
      double total = 0;
      bench::DeviceCounters after_first;
      for (int k = 0; k < steps; ++k) {
        if (k == 1) after_first = bench::ReadDeviceCounters();
        const Clock::time_point t0 = Clock::now();
        auto logits = (*decoder)->Decode(rows, tokens, *executor);
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        if (!logits.ok()) return Fail("decode", logits.status());
        total += dt;
        step_ms.push_back(dt * 1e3);
        for (int32_t s = 0; s < batch; ++s) {
          tokens[static_cast<size_t>(s)] = Argmax(logits->subspan(static_cast<size_t>(s) * vocab, vocab));
        }
      }
      best_rate = std::max(best_rate, batch * steps / total);
      if (steps > 1) steady = bench::ReadDeviceCounters() - after_first;
    }
    const double later_steps = std::max(1, steps - 1);
    char line[512];
    std::snprintf(line, sizeof(line),
                  "%s{\"batch\": %d, \"plan_rows\": %d, \"decode_tok_s\": %.2f, \"step_ms_p50\": %.3f, "
                  "\"step_ms_p99\": %.3f, \"submissions_per_step\": %.2f, \"recordings_in_steady_state\": %lld, "
                  "\"bytes_uploaded_per_step\": %.1f}",
                  results.empty() ? "" : ", ", batch, (*decoder)->plan_rows(batch), best_rate,
                  Percentile(step_ms, 0.5), Percentile(step_ms, 0.99), steady.submissions / later_steps,
                  static_cast<long long>(steady.recordings), steady.uploaded / later_steps);
    results += line;
  }
  std::printf("{\"device\": \"%s\", \"device_name\": \"%s\", \"threads\": %d, \"cpu_isa\": \"%s\", "
              "\"prompt_tokens\": %d, \"decode_steps\": %d, \"results\": [%s]}\n",
              std::string(backend.name()).c_str(), backend.device_name().c_str(), threads,
              CpuIsaName(ActiveCpuIsa()), n_prompt, steps, results.c_str());
  return 0;
}

}  // namespace
}  // namespace decoded

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return decoded::Run();
}
