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
// Prints one JSON object; bench/run_batch_bench.py compares it with
// llama.cpp stepping B sequences per llama_decode.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/cpu_isa.h"
#include "engine/runtime.h"

ABSL_FLAG(std::string, model, "", "GGUF model path");
ABSL_FLAG(int, threads, 1, "compute threads");
ABSL_FLAG(std::string, batch_sizes, "1,2,4,8,16", "comma-separated batch sizes (sessions stepped together)");
ABSL_FLAG(int, prompt_tokens, 16, "prompt length of each session");
ABSL_FLAG(int, decode_steps, 64, "decode steps measured per batch size and repeat");
ABSL_FLAG(int, repeats, 3, "repetitions; the best rate is reported");

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
  if (absl::Status isa = InitCpuIsaFromEnvironment(); !isa.ok()) return Fail("cpu isa", isa);
  auto model = Model::Load(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return Fail("model", model.status());
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
  auto executor = CreateCpuExecutor(threads);

  std::string results;
  for (int32_t batch : sizes) {
    auto decoder = (*model)->NewBatchDecoder(batch);
    if (!decoder.ok()) return Fail("decoder", decoder.status());
    double best_rate = 0;
    std::vector<double> step_ms;
    for (int rep = 0; rep < std::max(1, absl::GetFlag(FLAGS_repeats)); ++rep) {
      std::vector<std::unique_ptr<DecodeContext>> ctx;
      std::vector<DecodeContext*> rows;
      std::vector<int32_t> tokens;
      const int32_t spread = std::max(1, std::min(50000, vocab - 1000));
      for (int32_t s = 0; s < batch; ++s) {
        auto c = (*model)->NewContext(n_prompt + steps + 1);
        if (!c.ok()) return Fail("context", c.status());
        std::vector<int32_t> prompt = {bos};
        for (int i = 1; i < n_prompt; ++i) {
          prompt.push_back(static_cast<int32_t>((1000 + (static_cast<int64_t>(i) * 7919 + s * 104729) % spread) % vocab));
        }
        auto l = (*c)->Prefill(prompt, false, *executor);
        if (!l.ok()) return Fail("prefill", l.status());
        tokens.push_back(Argmax(*l));
        rows.push_back(c->get());
        ctx.push_back(*std::move(c));
      }
      double total = 0;
      for (int k = 0; k < steps; ++k) {
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
    }
    char line[256];
    std::snprintf(line, sizeof(line),
                  "%s{\"batch\": %d, \"plan_rows\": %d, \"decode_tok_s\": %.2f, \"step_ms_p50\": %.3f, "
                  "\"step_ms_p99\": %.3f}",
                  results.empty() ? "" : ", ", batch, (*decoder)->plan_rows(batch), best_rate,
                  Percentile(step_ms, 0.5), Percentile(step_ms, 0.99));
    results += line;
  }
  std::printf("{\"threads\": %d, \"cpu_isa\": \"%s\", \"prompt_tokens\": %d, \"decode_steps\": %d, \"results\": [%s]}\n",
              threads, CpuIsaName(ActiveCpuIsa()), n_prompt, steps, results.c_str());
  return 0;
}

}  // namespace
}  // namespace decoded

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return decoded::Run();
}
