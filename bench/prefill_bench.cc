// prefill_bench: prefill tok/s at several prompt lengths through the
// daemon's own prefill path, and each length's rate against the first's
// (issue 18, part 2: 2,048 tokens at >= 0.8x the 128-token rate).
//
// The path is the serving one: a paged f16 KV pool of 16-position blocks
// (the daemon's --kv_type and --kv_block_tokens defaults), and the prompt
// fed as mixed steps (BatchDecoder::Step) of at most --max_step_tokens
// tokens each through held plans bucketed by row count, logits only for the
// last token (decode_bench instead prefills through D1 chunks of 128 on a
// contiguous cache). A warm-up round builds the plans first, as a running
// daemon has them.
//
// The lengths run one after the other in each of --rounds rounds (a fresh
// context each time), so each round's ratios compare runs seconds apart: on
// the shared VMs this project is measured on, the same binary's rate moves
// by a third between hours, and a ratio of rates taken minutes apart
// carries that drift. Reported per length: the median and best tok/s over
// the rounds, and the median, lowest and highest of the per-round ratios
// to the first length. One JSON object on stdout.
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
#include "engine/cpu_isa.h"
#include "engine/kv_pool.h"
#include "engine/runtime.h"

ABSL_FLAG(std::string, model, "", "GGUF model path");
ABSL_FLAG(int, threads, 1, "compute threads");
ABSL_FLAG(std::string, prompt_tokens, "128,2048", "comma-separated prompt lengths; ratios are to the first");
ABSL_FLAG(int, rounds, 5, "rounds of every length (after one warm-up round)");
ABSL_FLAG(std::string, device, "cpu", "cpu, vulkan or vulkan:N (as the daemon's --device)");
ABSL_FLAG(std::string, kv_type, "f16", "KV cache element type: f32, f16 (the daemon's default) or q8_0");
ABSL_FLAG(int, kv_block_tokens, 16, "positions per KV block (the daemon's --kv_block_tokens)");
ABSL_FLAG(int, max_step_tokens, 512, "tokens per prefill step (the daemon's --max_step_tokens)");

namespace decoded {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "prefill_bench: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int Run() {
  const std::string kv_type = absl::GetFlag(FLAGS_kv_type);
  auto model = bench::LoadBenchModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_device), kv_type);
  if (!model.ok()) return Fail("setup", model.status());
  Backend& backend = (*model)->backend();

  std::vector<int32_t> lengths;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_prompt_tokens), ',')) {
    int32_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > (*model)->info().context_length) {
      return Fail("--prompt_tokens", absl::InvalidArgumentError(std::string(part) + ": not in [1, context length]"));
    }
    lengths.push_back(n);
  }
  const int32_t longest = *std::max_element(lengths.begin(), lengths.end());
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const int32_t step_tokens = absl::GetFlag(FLAGS_max_step_tokens);
  const int32_t bt = absl::GetFlag(FLAGS_kv_block_tokens);
  if (step_tokens < 1 || step_tokens > kMaxStepTokens) {
    return Fail("--max_step_tokens",
                absl::InvalidArgumentError("must be in [1, " + std::to_string(kMaxStepTokens) + "]"));
  }
  if (bt < 1) return Fail("--kv_block_tokens", absl::InvalidArgumentError("must be positive"));

  auto made = backend.CreateExecutor(absl::GetFlag(FLAGS_threads));
  if (!made.ok()) return Fail("executor", made.status());
  std::unique_ptr<Executor> executor = *std::move(made);
  // The daemon's decoder: max_batch 16 (its default) and the step budget.
  auto decoder = (*model)->NewBatchDecoder(16, step_tokens);
  if (!decoder.ok()) return Fail("decoder", decoder.status());
  // One context at a time: a pool of the longest prompt's blocks in every
  // layer group (engine/kv_groups.h), and one block of slack per group.
  auto probe = (*model)->NewKvPool(bt, 1);
  if (!probe.ok()) return Fail("pool", probe.status());
  const int32_t groups = (*probe)->groups().n_groups();
  probe->reset();
  auto pool = (*model)->NewKvPool(bt, groups * ((longest + bt - 1) / bt + 1));
  if (!pool.ok()) return Fail("pool", pool.status());

  // BOS, then ids spread over the vocabulary (decode_bench's formula).
  const int32_t vocab = (*model)->info().vocab_size;
  const int32_t spread = std::max(1, std::min(50000, vocab - 1000));
  std::vector<int32_t> prompt = {std::max(0, (*model)->tokenizer().bos_id())};
  for (int64_t i = 1; i < longest; ++i) {
    prompt.push_back(static_cast<int32_t>((1000 + (i * 7919) % spread) % vocab));
  }

  // Seconds to prefill the first n tokens of `prompt` into a fresh context.
  auto prefill = [&](int32_t n) -> absl::StatusOr<double> {
    absl::StatusOr<std::unique_ptr<DecodeContext>> ctx = (*model)->NewContext(n, *pool);
    if (!ctx.ok()) return ctx.status();
    const Clock::time_point t0 = Clock::now();
    for (int32_t at = 0; at < n; at += step_tokens) {
      const int32_t len = std::min(step_tokens, n - at);
      if (absl::Status st = (*ctx)->ReserveKv(len); !st.ok()) return st;
      const StepSpan span{ctx->get(), absl::MakeConstSpan(prompt).subspan(at, len),
                          at + len == n ? SpanLogits::kLast : SpanLogits::kNone};
      if (auto logits = (*decoder)->Step({&span, 1}, *executor); !logits.ok()) return logits.status();
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };

  std::vector<std::vector<double>> rate(lengths.size()), ratio(lengths.size());
  for (int r = -1; r < rounds; ++r) {  // round -1 builds the held plans
    std::vector<double> this_round;
    for (int32_t n : lengths) {
      absl::StatusOr<double> s = prefill(n);
      if (!s.ok()) return Fail("prefill", s.status());
      this_round.push_back(n / *s);
    }
    if (r < 0) continue;
    for (size_t i = 0; i < lengths.size(); ++i) {
      rate[i].push_back(this_round[i]);
      ratio[i].push_back(this_round[i] / this_round[0]);
    }
  }
  std::string results;
  for (size_t i = 0; i < lengths.size(); ++i) {
    char line[384];
    std::snprintf(line, sizeof(line),
                  "%s{\"prompt_tokens\": %d, \"prefill_tok_s_median\": %.1f, \"prefill_tok_s_best\": %.1f, "
                  "\"ratio_to_first_median\": %.3f, \"ratio_min\": %.3f, \"ratio_max\": %.3f}",
                  i == 0 ? "" : ", ", lengths[i], Median(rate[i]), *std::max_element(rate[i].begin(), rate[i].end()),
                  Median(ratio[i]), *std::min_element(ratio[i].begin(), ratio[i].end()),
                  *std::max_element(ratio[i].begin(), ratio[i].end()));
    results += line;
  }
  std::printf("{\"device\": \"%s\", \"cpu_isa\": \"%s\", \"threads\": %d, \"kv_type\": \"%s\", "
              "\"kv_block_tokens\": %d, \"max_step_tokens\": %d, \"rounds\": %d, \"results\": [%s]}\n",
              std::string(backend.name()).c_str(), CpuIsaName(ActiveCpuIsa()), absl::GetFlag(FLAGS_threads),
              kv_type.c_str(), bt, step_tokens, rounds, results.c_str());
  return 0;
}

}  // namespace
}  // namespace decoded

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return decoded::Run();
}
