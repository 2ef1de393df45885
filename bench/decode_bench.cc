// decode_bench: in-process throughput of the engine on a GGUF model.
//
// Measures, for one thread count:
//   prefill tok/s   D1 over a prompt of --prompt_tokens, in kMaxPrefillChunk chunks
//   decode tok/s    D2 (held plan, rebind per token) over --decode_tokens
//   D1 step time    the same decode steps rebuilding the graph every token
// and counts heap allocations per rebind step (--kv_type: the caches'
// element type; f32 by default, the daemon's is f16). Prints one JSON object, naming
// the kernels' instruction-set tier ("cpu_isa": the best this CPU supports,
// or DECODED_CPU_ISA's); the driver script bench/run_bench.py compares it
// with llama.cpp in the same run.
//
// --device vulkan[:N] runs the same steps on the Vulkan backend and adds what a
// held plan costs per token beside the GPU's time: kernel dispatches and
// queue submissions, the calling thread's CPU microseconds (rebind, submit,
// wait), bytes written into device buffers, recordings (0 once held). On
// lavapipe, a CPU, the rates are no claim about any GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include <ctime>

#include "bench/device_counters.h"
#include "engine/cpu_isa.h"
#include "engine/device_spec.h"
#include "engine/decode_driver.h"
#include "engine/kv_layout.h"
#include "engine/kv_rows.h"
#include "engine/model_registry.h"
#include "engine/runtime.h"
#include "tests/common/counting_allocator.h"


ABSL_FLAG(std::string, model, "", "GGUF model path");
ABSL_FLAG(int, threads, 1, "compute threads");
ABSL_FLAG(int, prompt_tokens, 128, "prompt length for the prefill measurement");
ABSL_FLAG(int, decode_tokens, 128, "decode steps measured");
ABSL_FLAG(int, d1_tokens, 16, "decode steps measured with D1 (rebuild per token)");
ABSL_FLAG(int, repeats, 3, "repetitions; the best is reported");
ABSL_FLAG(std::string, device, "cpu", "cpu, vulkan or vulkan:N (as the daemon's --device)");
ABSL_FLAG(std::string, kv_type, "f32", "KV cache element type: f32, f16 (the daemon's default) or q8_0");

namespace decoded {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// CPU time of the calling thread (the driver's host work; not a device's threads).
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

using bench::DeviceCounters;
using bench::ReadDeviceCounters;

// A failed step ends the benchmark with its status on stderr: a silent exit 1
// would leave run_bench.py with nothing to report.
int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "decode_bench: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

int Run() {
  const std::string kv_name = absl::GetFlag(FLAGS_kv_type);
  const absl::StatusOr<DType> kv_parsed = KvTypeFromName(kv_name);
  if (!kv_parsed.ok()) return Fail("--kv_type", kv_parsed.status());
  const DType kv_type = *kv_parsed;
  if (absl::Status isa = InitCpuIsaFromEnvironment(); !isa.ok()) {
    std::fprintf(stderr, "%s\n", isa.ToString().c_str());
    return 1;
  }
  const std::string path = absl::GetFlag(FLAGS_model);
  auto file = GgufFile::Open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  if (!weights.ok()) return Fail("weights", weights.status());
  absl::StatusOr<std::shared_ptr<Backend>> backend = OpenBackend(absl::GetFlag(FLAGS_device));
  if (!backend.ok()) return Fail("--device", backend.status());
  FamilyOptions family_options;
  family_options.backend = backend->get();
  auto model = CreateFamily(*weights, family_options);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const DecodeModel& m = **model;
  // Device copies of the weights now, not inside the first measured prefill.
  if (absl::Status st = (*backend)->PrepareWeights(build_one_token_decode_graph(m)); !st.ok()) {
    return Fail("weights", st);
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  auto executor = (*backend)->CreateExecutor(threads);
  if (!executor.ok()) return Fail("executor", executor.status());
  Executor& ex = **executor;
  const int n_prompt = absl::GetFlag(FLAGS_prompt_tokens);
  const int n_decode = absl::GetFlag(FLAGS_decode_tokens);
  const int n_d1 = absl::GetFlag(FLAGS_d1_tokens);
  // A whole number of 16-position panels, as the daemon's paged blocks are,
  // so the CPU keeps keys in panels here too (engine/cpu/key_panels.h).
  const int capacity = (n_prompt + n_decode + n_d1 + 8 + 15) / 16 * 16;
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  // Ids spread over the vocabulary (any family's: SmolLM2's has 49152 entries).
  const int spread = std::max(1, std::min(50000, m.dims().vocab - 1000));
  for (int i = 0; i < n_prompt; ++i) prompt[static_cast<size_t>(i)] = (1000 + (i * 7919) % spread) % m.dims().vocab;
  prompt[0] = 2;

  double best_prefill = 1e30, best_decode = 1e30, best_d1 = 1e30;
  int64_t allocs_per_step = -1;
  double host_us_per_step = 0;
  DeviceCounters plan_cost, per_step;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    auto kv = KvCache::Create(m.backend(), m.dims().n_layers,
                              KvLayout::Separate(m.dims().n_kv_heads, m.dims().head_dim).WithType(kv_type), capacity);
    if (!kv.ok()) return Fail("KV cache", kv.status());
    auto t0 = Clock::now();
    for (int off = 0; off < n_prompt; off += kMaxPrefillChunk) {
      const int n = std::min(kMaxPrefillChunk, n_prompt - off);
      auto r = forward_with_kv_context(m, **kv, absl::MakeConstSpan(prompt).subspan(off, n), false, ex);
      if (!r.ok()) return Fail("prefill", r.status());
    }
    auto t1 = Clock::now();
    best_prefill = std::min(best_prefill, Seconds(t0, t1));

    DecodeSession session;
    int32_t tok = 3000;
    // First token builds the plan; it is not part of the steady-state rate.
    const DeviceCounters b0 = ReadDeviceCounters();
    if (auto first = forward_with_kv_context_persistent(m, **kv, session, tok, ex); !first.ok()) {
      return Fail("first decode step", first.status());
    }
    const DeviceCounters b1 = ReadDeviceCounters();
    plan_cost.dispatches = b1.dispatches - b0.dispatches;  // the held plan's recording
    const int64_t a0 = testing::HeapAllocations();
    const double c0 = ThreadCpuSeconds();
    auto t2 = Clock::now();
    for (int i = 0; i < n_decode; ++i) {
      auto r = forward_with_kv_context_persistent(m, **kv, session, tok, ex);
      if (!r.ok()) return Fail("decode step (held plan)", r.status());
      tok = static_cast<int32_t>(std::max_element(r->begin(), r->end()) - r->begin());
    }
    auto t3 = Clock::now();
    host_us_per_step = (ThreadCpuSeconds() - c0) * 1e6 / std::max(n_decode, 1);
    const DeviceCounters b2 = ReadDeviceCounters();
    per_step.submissions = b2.submissions - b1.submissions;
    per_step.recordings = b2.recordings - b1.recordings;
    per_step.uploaded = b2.uploaded - b1.uploaded;
    allocs_per_step = (testing::HeapAllocations() - a0) / std::max(n_decode, 1);
    best_decode = std::min(best_decode, Seconds(t2, t3));

    auto t4 = Clock::now();
    for (int i = 0; i < n_d1; ++i) {
      auto r = forward_with_kv_context(m, **kv, std::vector<int32_t>{tok}, false, ex);
      if (!r.ok()) return Fail("decode step (rebuilt graph)", r.status());
    }
    auto t5 = Clock::now();
    best_d1 = std::min(best_d1, Seconds(t4, t5));
  }
  const double d2_step = best_decode / n_decode;
  const double d1_step = best_d1 / n_d1;
  const double steps = std::max(n_decode, 1);
  std::printf(
      "{\"device\": \"%s\", \"device_name\": \"%s\", \"dispatches_per_token\": %lld, "
      "\"submissions_per_token\": %.2f, \"recordings_in_steady_state\": %lld, \"host_us_per_token\": %.1f, "
      "\"bytes_uploaded_per_token\": %.1f, ",
      std::string((*backend)->name()).c_str(), (*backend)->device_name().c_str(),
      static_cast<long long>(plan_cost.dispatches), per_step.submissions / steps,
      static_cast<long long>(per_step.recordings), host_us_per_step, per_step.uploaded / steps);
  std::printf(
      "\"cpu_isa\": \"%s\", \"kv_type\": \"%s\", \"threads\": %d, \"prompt_tokens\": %d, \"decode_tokens\": %d, "
      "\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"d2_step_ms\": %.4f, \"d1_step_ms\": %.4f, "
      "\"d2_over_d1_speedup\": %.3f, \"heap_allocations_per_rebind_step\": %lld}\n",
      CpuIsaName(ActiveCpuIsa()), kv_name.c_str(), threads, n_prompt, n_decode, n_prompt / best_prefill,
      n_decode / best_decode, d2_step * 1e3, d1_step * 1e3, d1_step / d2_step, static_cast<long long>(allocs_per_step));
  return 0;
}

}  // namespace
}  // namespace decoded

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return decoded::Run();
}
