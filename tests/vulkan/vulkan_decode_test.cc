// Every family fixture decoded on the Vulkan backend (lavapipe in CI):
//   - D2 (the held plan: one command buffer recorded once, resubmitted with
//     rebound per-token data) is byte-identical to D1 (a graph rebuilt and a
//     plan recorded per token) on the same device;
//   - the logits match the CPU backend's within a tolerance measured here
//     (the CPU multiplies 8-bit-quantized activations, the GPU f32 ones);
//   - batched decode gives every row the bytes of its solo decode;
//   - one recording serves N tokens (N recordings with the re-record control);
//   - the validation layer reports nothing.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/decode_driver.h"
#include "engine/model_registry.h"
#include "engine/runtime.h"
#include "engine/vulkan/kernels.h"
#include "engine/vulkan/vulkan_backend.h"
#include "engine/vulkan/vulkan_executor.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/vulkan/vulkan_test_device.h"

namespace decoded {
namespace {

struct Loaded {
  std::shared_ptr<const Weights> weights;
  std::unique_ptr<Backend> backend;  // outlives the model (declared before it)
  std::unique_ptr<DecodeModel> model;
};

Loaded Load(const std::string& file, std::unique_ptr<Backend> backend) {
  Loaded l;
  auto f = GgufFile::Open(testing::TestDataPath(file));
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return l;
  auto w = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*f)));
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return l;
  l.weights = *w;
  l.backend = std::move(backend);
  FamilyOptions options;
  options.backend = l.backend.get();
  auto m = CreateFamily(l.weights, options);
  EXPECT_TRUE(m.ok()) << m.status();
  if (m.ok()) l.model = *std::move(m);
  return l;
}

std::unique_ptr<KvCache> NewKv(const DecodeModel& m, int32_t capacity) {
  auto kv = KvCache::Create(m.backend(), m.dims().n_layers, m.dims().kv_layout(), capacity);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return kv.ok() ? *std::move(kv) : nullptr;
}

int32_t Argmax(absl::Span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

bool SameBytes(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

float MaxAbsDiff(absl::Span<const float> a, absl::Span<const float> b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return a.size() == b.size() ? m : INFINITY;
}

// The logits of a prompt's prefill and `steps` greedy decode tokens through
// D1 (graph rebuilt per token) on `m`, following `follow`'s tokens when given.
std::vector<std::vector<float>> DecodeD1(const DecodeModel& m, Executor& ex, const std::vector<int32_t>& prompt,
                                         int steps, const std::vector<std::vector<float>>* follow = nullptr) {
  std::vector<std::vector<float>> out;
  auto kv = NewKv(m, 64);
  auto first = forward_with_kv_context(m, *kv, prompt, false, ex);
  EXPECT_TRUE(first.ok()) << first.status();
  if (!first.ok()) return out;
  out.push_back(*first);
  for (int s = 0; s < steps; ++s) {
    const int32_t tok = Argmax(follow ? (*follow)[static_cast<size_t>(s)] : out.back());
    auto l = forward_with_kv_context(m, *kv, std::vector<int32_t>{tok}, false, ex);
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return out;
    out.push_back(*std::move(l));
  }
  return out;
}

const std::vector<int32_t> kPrompt = {5, 17, 3, 42, 9, 11, 2};
constexpr int kSteps = 4;

struct FixtureCase {
  const char* file;
  float tolerance;  // max |logit difference| against the CPU backend, measured (see below)
};

class VulkanFixtureTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(VulkanFixtureTest, HeldPlanIsByteIdenticalToRebuildAndNearTheCpu) {
  DECODED_VULKAN_DEVICE_OR_SKIP(device);
  const int64_t validation0 = device->validation_messages();
  EXPECT_TRUE(device->validation_enabled() || !testing::VulkanRequired()) << "the Khronos validation layer is not installed";
  Loaded gpu = Load(GetParam().file, vulkan::CreateBackend(device));
  ASSERT_NE(gpu.model, nullptr);
  auto ex_or = gpu.backend->CreateExecutor(1);
  ASSERT_TRUE(ex_or.ok()) << ex_or.status();
  auto ex = *std::move(ex_or);
  ASSERT_NE(ex, nullptr);
  const DecodeModel& m = *gpu.model;

  const auto d1 = DecodeD1(m, *ex, kPrompt, kSteps);
  ASSERT_EQ(d1.size(), static_cast<size_t>(kSteps + 1));

  // D2: the same tokens through the held plan.
  auto kv = NewKv(m, 64);
  DecodeSession session;
  auto first = forward_with_kv_context(m, *kv, kPrompt, false, *ex);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(SameBytes(*first, d1[0]));
  const int64_t recordings0 = vulkan::GetPlanStats().recordings;
  for (int s = 0; s < kSteps; ++s) {
    auto l = forward_with_kv_context_persistent(m, *kv, session, Argmax(d1[static_cast<size_t>(s)]), *ex);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_TRUE(SameBytes(*l, d1[static_cast<size_t>(s) + 1])) << "D2 step " << s << " differs from D1";
  }
  EXPECT_EQ(vulkan::GetPlanStats().recordings - recordings0, 1) << "the held plan was recorded more than once";

  // Against the CPU backend, on the GPU's tokens.
  Loaded cpu = Load(GetParam().file, nullptr);
  ASSERT_NE(cpu.model, nullptr);
  CpuExecutor cex(1);
  const auto ref = DecodeD1(*cpu.model, cex, kPrompt, kSteps, &d1);
  ASSERT_EQ(ref.size(), d1.size());
  float worst = 0.0f;
  for (size_t s = 0; s < d1.size(); ++s) worst = std::max(worst, MaxAbsDiff(d1[s], ref[s]));
  EXPECT_LE(worst, GetParam().tolerance) << "max |Vulkan - CPU| logit";
  std::printf("%s: max |Vulkan - CPU| logit %.3g (tolerance %.3g)\n", GetParam().file, worst, GetParam().tolerance);
  EXPECT_EQ(device->validation_messages(), validation0) << "the Vulkan validation layer reported problems";
}

// A prefill chunk of 64 tokens takes the tiled mat-mat (matmul_tiled.comp)
// for its matmuls: every row's logits within the fixture's tolerance of the
// CPU's, and two decode tokens on the KV cache it wrote as well.
TEST_P(VulkanFixtureTest, ALongPrefillChunkTakesTheTiledMatMulAndStaysNearTheCpu) {
  DECODED_VULKAN_DEVICE_OR_SKIP(device);
  const int64_t validation0 = device->validation_messages();
  Loaded gpu = Load(GetParam().file, vulkan::CreateBackend(device));
  ASSERT_NE(gpu.model, nullptr);
  auto ex_or = gpu.backend->CreateExecutor(1);
  ASSERT_TRUE(ex_or.ok()) << ex_or.status();
  auto ex = *std::move(ex_or);
  Loaded cpu = Load(GetParam().file, nullptr);
  ASSERT_NE(cpu.model, nullptr);
  CpuExecutor cex(1);
  const DecodeModel& m = *gpu.model;
  std::vector<int32_t> prompt;
  for (int j = 0; j < 64; ++j) prompt.push_back(3 + (j * 37 + 11) % (m.dims().vocab - 3));
  ASSERT_GE(static_cast<int64_t>(prompt.size()), vulkan::TiledMatMulMinRows(*device));

  auto gkv = NewKv(m, 80);
  auto ckv = NewKv(*cpu.model, 80);
  const int64_t tiled0 = vulkan::GetPlanStats().tiled_matmuls;
  auto g = forward_with_kv_context(m, *gkv, prompt, /*all_logits=*/true, *ex);
  ASSERT_TRUE(g.ok()) << g.status();
  if (device->shared_memory_bytes() >= vulkan::kTiledMatMulSharedBytes) {
    EXPECT_GT(vulkan::GetPlanStats().tiled_matmuls, tiled0) << "the chunk's matmuls took the mat-vec";
  }
  auto c = forward_with_kv_context(*cpu.model, *ckv, prompt, /*all_logits=*/true, cex);
  ASSERT_TRUE(c.ok()) << c.status();
  float worst = MaxAbsDiff(*g, *c);
  int32_t tok = Argmax(absl::MakeConstSpan(*g).last(static_cast<size_t>(m.dims().vocab)));
  DecodeSession session;
  for (int s = 0; s < 2; ++s) {
    auto gl = forward_with_kv_context_persistent(m, *gkv, session, tok, *ex);
    ASSERT_TRUE(gl.ok()) << gl.status();
    auto cl = forward_with_kv_context(*cpu.model, *ckv, std::vector<int32_t>{tok}, false, cex);
    ASSERT_TRUE(cl.ok()) << cl.status();
    worst = std::max(worst, MaxAbsDiff(*gl, *cl));
    tok = Argmax(*gl);
  }
  EXPECT_LE(worst, GetParam().tolerance) << "max |Vulkan - CPU| logit over the chunk's rows and 2 decode tokens";
  std::printf("%s: 64-token chunk, max |Vulkan - CPU| logit %.3g (tolerance %.3g)\n", GetParam().file, worst,
              GetParam().tolerance);
  EXPECT_EQ(device->validation_messages(), validation0) << "the Vulkan validation layer reported problems";
}

// One recording per held plan is what the re-record control is measured
// against: the same tokens with a recording per run give the same bytes.
TEST_P(VulkanFixtureTest, RerecordingEveryTokenGivesTheSameBytesAndOneRecordingPerToken) {
  DECODED_VULKAN_DEVICE_OR_SKIP(device);
  vulkan::BackendOptions rerecord;
  rerecord.plan.record_every_run = true;
  Loaded held = Load(GetParam().file, vulkan::CreateBackend(device));
  Loaded control = Load(GetParam().file, vulkan::CreateBackend(device, rerecord));
  ASSERT_NE(held.model, nullptr);
  ASSERT_NE(control.model, nullptr);
  auto ex_or = held.backend->CreateExecutor(1);
  ASSERT_TRUE(ex_or.ok()) << ex_or.status();
  auto ex = *std::move(ex_or);
  std::vector<std::vector<float>> logits[2];
  int64_t recordings[2];
  for (int c = 0; c < 2; ++c) {
    const DecodeModel& m = c == 0 ? *held.model : *control.model;
    auto kv = NewKv(m, 64);
    DecodeSession session;
    auto first = forward_with_kv_context(m, *kv, kPrompt, false, *ex);
    ASSERT_TRUE(first.ok()) << first.status();
    int32_t tok = Argmax(*first);
    const int64_t r0 = vulkan::GetPlanStats().recordings;
    for (int s = 0; s < kSteps; ++s) {
      auto l = forward_with_kv_context_persistent(m, *kv, session, tok, *ex);
      ASSERT_TRUE(l.ok()) << l.status();
      logits[c].emplace_back(l->begin(), l->end());
      tok = Argmax(*l);
    }
    recordings[c] = vulkan::GetPlanStats().recordings - r0;
  }
  EXPECT_EQ(recordings[0], 1);
  EXPECT_EQ(recordings[1], kSteps);
  for (int s = 0; s < kSteps; ++s) EXPECT_TRUE(SameBytes(logits[0][s], logits[1][s])) << "step " << s;
}

// Streams joining one per step, so every batch size 1..6 runs (buckets 1, 2,
// 3, 4, 6, padding included); each row's logits must be the bytes of its solo
// D1 decode. Control: two rows' caches exchanged must be caught.
TEST_P(VulkanFixtureTest, BatchedRowsAreByteIdenticalToSoloDecode) {
  DECODED_VULKAN_DEVICE_OR_SKIP(device);
  Loaded gpu = Load(GetParam().file, vulkan::CreateBackend(device));
  ASSERT_NE(gpu.model, nullptr);
  const DecodeModel& m = *gpu.model;
  auto ex_or = gpu.backend->CreateExecutor(1);
  ASSERT_TRUE(ex_or.ok()) << ex_or.status();
  auto ex = *std::move(ex_or);
  constexpr int kStreams = 6;
  std::vector<std::vector<int32_t>> prompts(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    for (int j = 0; j <= 2 * i; ++j) prompts[i].push_back(3 + (i * 31 + j * 7) % (m.dims().vocab - 3));
  }
  std::vector<std::vector<std::vector<float>>> solo(kStreams);
  for (int i = 0; i < kStreams; ++i) solo[i] = DecodeD1(m, *ex, prompts[i], kStreams);
  for (bool swap : {false, true}) {
    const std::vector<int32_t> buckets = {1, 2, 3, 4, 6};  // BatchBuckets(6)
    std::vector<DecodeSession> plans(buckets.size());
    std::vector<std::unique_ptr<KvCache>> kv(kStreams);
    std::vector<int> done(kStreams, 0);
    for (int i = 0; i < kStreams; ++i) {
      kv[i] = NewKv(m, 64);
      ASSERT_TRUE(forward_with_kv_context(m, *kv[i], prompts[i], false, *ex).ok());
    }
    int mismatches = 0;
    for (int step = 0; step < 2 * kStreams; ++step) {
      std::vector<int> active;
      for (int i = 0; i < kStreams; ++i) {
        if (i <= step && done[i] < kStreams) active.push_back(i);
      }
      if (active.empty()) continue;
      if (step % 2 == 1) std::reverse(active.begin(), active.end());
      std::vector<DecodeRow> rows;
      for (int i : active) rows.push_back(DecodeRow{kv[i].get(), Argmax(solo[i][done[i]])});
      if (swap && rows.size() >= 2) std::swap(rows[0].kv, rows[1].kv);
      size_t b = 0;
      while (buckets[b] < static_cast<int32_t>(rows.size())) ++b;
      auto logits = forward_batch_persistent(m, rows, buckets[b], plans[b], *ex);
      ASSERT_TRUE(logits.ok()) << logits.status();
      const size_t vocab = static_cast<size_t>(m.dims().vocab);
      for (size_t r = 0; r < active.size(); ++r) {
        const int i = active[r];
        if (!SameBytes(logits->subspan(r * vocab, vocab), solo[i][done[i] + 1])) {
          ++mismatches;
          if (!swap) ADD_FAILURE() << "stream " << i << " step " << done[i] << " in a batch of " << rows.size();
        }
        ++done[i];
      }
    }
    if (swap) {
      EXPECT_GT(mismatches, 0) << "exchanged caches went unnoticed";
    } else {
      EXPECT_EQ(mismatches, 0);
    }
  }
}

// A span (several rows on one cache, beside another session's decode row)
// through the held plan on the GPU: each row byte-identical to its token
// decoded alone by D1 on the same device; twice, so the rebind path runs.
// Then through a plan that computes only the rows asking for logits.
TEST_P(VulkanFixtureTest, ASpanOfOneSequenceEqualsItsTokensDecodedOneByOne) {
  DECODED_VULKAN_DEVICE_OR_SKIP(device);
  Loaded gpu = Load(GetParam().file, vulkan::CreateBackend(device));
  ASSERT_NE(gpu.model, nullptr);
  const DecodeModel& m = *gpu.model;
  auto ex_or = gpu.backend->CreateExecutor(1);
  ASSERT_TRUE(ex_or.ok()) << ex_or.status();
  auto ex = *std::move(ex_or);
  const std::vector<int32_t> other = {8, 13, 21};
  const std::vector<std::vector<int32_t>> spans = {{4, 19, 27, 6, 33}, {12, 2, 45}};
  const std::vector<int32_t> other_next = {30, 16};
  auto solo = [&](const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens) {
    auto kv = NewKv(m, 64);
    std::vector<std::vector<float>> out;
    EXPECT_TRUE(forward_with_kv_context(m, *kv, prompt, false, *ex).ok());
    for (int32_t t : tokens) {
      auto l = forward_with_kv_context(m, *kv, std::vector<int32_t>{t}, false, *ex);
      EXPECT_TRUE(l.ok()) << l.status();
      out.push_back(l.ok() ? *std::move(l) : std::vector<float>{});
    }
    return out;
  };
  std::vector<int32_t> all = spans[0];
  all.insert(all.end(), spans[1].begin(), spans[1].end());
  const auto want = solo(kPrompt, all), want_other = solo(other, other_next);
  auto a = NewKv(m, 64), b = NewKv(m, 64);
  ASSERT_TRUE(forward_with_kv_context(m, *a, kPrompt, false, *ex).ok());
  ASSERT_TRUE(forward_with_kv_context(m, *b, other, false, *ex).ok());
  DecodeSession plan, two_outputs;
  const size_t vocab = static_cast<size_t>(m.dims().vocab);
  size_t done = 0;
  for (size_t step = 0; step < spans.size(); ++step) {
    std::vector<DecodeRow> rows = {{b.get(), other_next[step]}};
    for (int32_t t : spans[step]) rows.push_back({a.get(), t});
    auto logits = forward_batch_persistent(m, rows, 8, plan, *ex);
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_TRUE(SameBytes(logits->subspan(0, vocab), want_other[step])) << "step " << step << ": the decode row";
    for (size_t k = 0; k < spans[step].size(); ++k) {
      EXPECT_TRUE(SameBytes(logits->subspan((k + 1) * vocab, vocab), want[done + k]))
          << "step " << step << ": span row " << k;
    }
    done += spans[step].size();
  }
  EXPECT_EQ(a->cached_len(), static_cast<int32_t>(kPrompt.size() + all.size()));

  // A plan of 8 rows and 2 outputs: only the decode row and the span's last
  // row reach the output head (take_rows on the GPU).
  auto a2 = NewKv(m, 64), b2 = NewKv(m, 64);
  ASSERT_TRUE(forward_with_kv_context(m, *a2, kPrompt, false, *ex).ok());
  ASSERT_TRUE(forward_with_kv_context(m, *b2, other, false, *ex).ok());
  done = 0;
  for (size_t step = 0; step < spans.size(); ++step) {
    std::vector<DecodeRow> rows;
    for (size_t k = 0; k < spans[step].size(); ++k) {
      rows.push_back({a2.get(), spans[step][k], k + 1 == spans[step].size()});
    }
    rows.push_back({b2.get(), other_next[step]});
    auto logits = forward_batch_persistent(m, rows, 8, 2, two_outputs, *ex);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->size(), 2 * vocab);
    done += spans[step].size();
    EXPECT_TRUE(SameBytes(logits->subspan(0, vocab), want[done - 1])) << "step " << step << ": the span's last row";
    EXPECT_TRUE(SameBytes(logits->subspan(vocab, vocab), want_other[step])) << "step " << step << ": the decode row";
  }
}

// Tolerances: the largest difference measured on lavapipe (AMD EPYC host,
// avx2 CPU kernels), 1.3e-5 over these fixtures (all f32 weights, so the CPU
// also multiplies f32 activations), times about 7.
constexpr float kF32Tolerance = 1e-4f;
constexpr FixtureCase kFixtures[] = {
    {"gemma3_tiny_swa.gguf", kF32Tolerance}, {"gemma3_tiny_softcap.gguf", kF32Tolerance},
    {"gemma3_tiny_f16.gguf", kF32Tolerance}, {"llama_tiny.gguf", kF32Tolerance},
    {"llama3rope_tiny.gguf", kF32Tolerance}, {"llamayarn_tiny.gguf", kF32Tolerance},
    {"qwen2_tiny.gguf", kF32Tolerance},      {"qwen2yarn_tiny.gguf", kF32Tolerance},
    {"qwen3_tiny.gguf", kF32Tolerance},      {"phi3_tiny.gguf", kF32Tolerance},
    {"phi2_tiny.gguf", kF32Tolerance},       {"smollm3_tiny.gguf", kF32Tolerance},
    {"glm4_tiny.gguf", kF32Tolerance},       {"deepseek2_tiny.gguf", kF32Tolerance},
    {"deepseek2lite_tiny.gguf", kF32Tolerance},
    // Routed experts (moe.comp, moe_matmul.comp): Qwen3-MoE (softmax, top-k
    // normalized), DeepSeek-V2 MoE (group-limited greedy), DeepSeek-V3
    // (sigmoid, selection bias, top-2-sum groups, scaling).
    {"qwen3moe_tiny.gguf", kF32Tolerance},   {"deepseek2moe_tiny.gguf", kF32Tolerance},
    {"deepseek3_tiny.gguf", kF32Tolerance},
};

std::string FixtureName(const ::testing::TestParamInfo<FixtureCase>& info) {
  std::string s = info.param.file;
  s = s.substr(0, s.find('.'));
  return s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VulkanFixtureTest, ::testing::ValuesIn(kFixtures), FixtureName);

// A discrete GPU's memory path on any device: weights staged into device-only
// buffers the host never maps, KV caches and intermediates likewise, logits
// copied into a host-read buffer. The same kernels on the same device: the
// mapped path's bytes, token for token.
TEST(VulkanUnmappedMemoryTest, StagedWeightsAndUnmappedBuffersGiveTheMappedPathsBytes) {
  DECODED_VULKAN_DEVICE_OR_SKIP(device);
  auto unmapped = vulkan::Device::Open(
      {.index = 0, .validation = device->validation_enabled(), .unmapped_device_memory = true});
  ASSERT_TRUE(unmapped.ok()) << unmapped.status();
  for (const char* file : {"gemma3_tiny_swa.gguf", "deepseek3_tiny.gguf"}) {
    std::vector<std::vector<float>> logits[2];
    for (int u = 0; u < 2; ++u) {
      Loaded l = Load(file, vulkan::CreateBackend(u == 0 ? device : *unmapped));
      ASSERT_NE(l.model, nullptr) << file;
      auto ex = l.backend->CreateExecutor(1);
      ASSERT_TRUE(ex.ok()) << ex.status();
      auto kv = NewKv(*l.model, 64);
      ASSERT_NE(kv, nullptr);
      EXPECT_EQ(kv->k(0) == nullptr, u == 1) << file << ": the KV cache is mapped only on the mapped path";
      auto first = forward_with_kv_context(*l.model, *kv, kPrompt, false, **ex);
      ASSERT_TRUE(first.ok()) << first.status();
      logits[u].push_back(*first);
      DecodeSession session;
      for (int s = 0; s < kSteps; ++s) {
        auto r = forward_with_kv_context_persistent(*l.model, *kv, session, Argmax(logits[u].back()), **ex);
        ASSERT_TRUE(r.ok()) << r.status();
        logits[u].emplace_back(r->begin(), r->end());
      }
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t i = 0; i < logits[0].size(); ++i) EXPECT_TRUE(SameBytes(logits[0][i], logits[1][i])) << file << " step " << i;
  }
  EXPECT_GT((*unmapped)->staging_copies(), 0) << "no weight went through the staging copy";
  EXPECT_EQ(device->staging_copies(), 0) << "the mapped path staged a copy";
  EXPECT_EQ((*unmapped)->validation_messages(), 0);
}

}  // namespace
}  // namespace decoded
