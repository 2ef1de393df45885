// The model-level API: loading, per-session KV accounting, and its errors.
#include "engine/runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/backend.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"

namespace decoded {
namespace {

TEST(ModelLoadTest, MissingFileIsNotFound) {
  auto m = Model::Load("/nonexistent/model.gguf");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelLoadTest, GarbageFileIsInvalidArgument) {
  const std::string path = ::testing::TempDir() + "/garbage.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out << "this is not a gguf file at all";
  }
  auto m = Model::Load(path);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  std::remove(path.c_str());
}

TEST(ModelLoadTest, TinyFixtureLoadsWithItsGeometry) {
  auto m = Model::Load(testing::TestDataPath("gemma3_tiny_swa.gguf"));
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelInfo& info = (*m)->info();
  EXPECT_EQ(info.family, "gemma3");
  EXPECT_EQ(info.n_layers, 6);
  EXPECT_EQ(info.hidden_size, 64);
  EXPECT_EQ(info.sliding_window, 4);
  EXPECT_EQ(info.device, "cpu");
  EXPECT_EQ((*m)->NewContext(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->NewContext(info.context_length + 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// The CPU backend with one op refused by CheckSupported, and weights it
// cannot hold from PrepareWeights: what a device without a kernel, or with
// too little memory, answers at load.
class RefusingBackend final : public Backend {
 public:
  RefusingBackend(std::optional<Op> refused, bool weights_fit) : refused_(refused), weights_fit_(weights_fit) {}
  std::string_view name() const override { return "refusing"; }
  absl::StatusOr<std::unique_ptr<Executor>> CreateExecutor(int threads, const std::atomic<int>* lent) override {
    return CpuBackend().CreateExecutor(threads, lent);
  }
  absl::Status CheckSupported(const Graph& graph) const override {
    for (const Node& n : graph.nodes()) {
      if (refused_ && n.op == *refused_) return absl::UnimplementedError(absl::StrCat("no kernel for ", OpName(n.op), " node ", n.name));
    }
    return CpuBackend().CheckSupported(graph);
  }
  absl::Status PrepareWeights(const Graph& graph) override {
    ++prepared;
    if (weights_fit_) return absl::OkStatus();
    return absl::ResourceExhaustedError("weight token_embd.weight: out of device memory");
  }
  int64_t allocated_bytes() const override { return CpuBackend().allocated_bytes(); }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes, BufferAccess) override { return CpuBackend().Allocate(bytes); }
  void Upload(DeviceBuffer& dst, const void* src, size_t bytes, size_t offset) override {
    CpuBackend().Upload(dst, src, bytes, offset);
  }
  absl::StatusOr<std::unique_ptr<CompiledPlan>> Compile(Graph graph, MemoryPlan plan,
                                                       const PlanResources& resources) override {
    return CpuBackend().Compile(std::move(graph), std::move(plan), resources);
  }
  int prepared = 0;

 private:
  const std::optional<Op> refused_;
  const bool weights_fit_;
};

TEST(ModelLoadTest, ABackendWithoutAKernelForAnOpIsRefusedAtLoadNamingOpAndFamily) {
  for (const Op op : {Op::kAttention, Op::kRmsNorm, Op::kGetRows}) {
    auto backend = std::make_shared<RefusingBackend>(op, /*weights_fit=*/true);
    ModelLoadOptions o;
    o.backend = backend;
    auto m = Model::Load(testing::TestDataPath("gemma3_tiny_swa.gguf"), o);
    ASSERT_FALSE(m.ok()) << OpName(op);
    EXPECT_TRUE(absl::IsFailedPrecondition(m.status())) << m.status();
    EXPECT_NE(m.status().message().find(OpName(op)), std::string::npos) << m.status();
    EXPECT_NE(m.status().message().find("gemma3"), std::string::npos) << m.status();
    EXPECT_EQ(backend->prepared, 0) << "weights prepared for a model that cannot run";
  }
}

TEST(ModelLoadTest, WeightsTheDeviceCannotHoldAreRefusedAtLoad) {
  auto backend = std::make_shared<RefusingBackend>(std::nullopt, /*weights_fit=*/false);
  ModelLoadOptions o;
  o.backend = backend;
  auto m = Model::Load(testing::TestDataPath("gemma3_tiny_swa.gguf"), o);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(m.status())) << m.status();
  EXPECT_NE(m.status().message().find("token_embd.weight"), std::string::npos) << m.status();

  auto fits = std::make_shared<RefusingBackend>(std::nullopt, /*weights_fit=*/true);
  o.backend = fits;
  auto ok = Model::Load(testing::TestDataPath("gemma3_tiny_swa.gguf"), o);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(fits->prepared, 1);
  EXPECT_EQ(&(*ok)->backend(), fits.get());
  EXPECT_EQ((*ok)->info().backend, "refusing");
}

TEST(ModelLoadTest, PrefillChunkBoundsAreChecked) {
  auto m = Model::Load(testing::TestDataPath("gemma3_tiny_swa.gguf"));
  ASSERT_TRUE(m.ok());
  auto ctx = (*m)->NewContext(128);
  ASSERT_TRUE(ctx.ok());
  auto ex = CreateCpuExecutor(1);
  EXPECT_EQ((*ctx)->Prefill({}, false, *ex).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> too_long(kMaxPrefillChunk + 1, 5);
  EXPECT_EQ((*ctx)->Prefill(too_long, false, *ex).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ctx)->cached_len(), 0);
}

// Rewind forgets the tail: decoding after a rewind gives byte-identical
// logits to a context that never held the tail, through the same held plan
// (the sliding window of the fixture is crossed on both sides of the rewind).
TEST(ModelLoadTest, RewindThenDecodeEqualsNeverHavingTheTail) {
  auto m = Model::Load(testing::TestDataPath("gemma3_tiny_swa.gguf"));
  ASSERT_TRUE(m.ok()) << m.status();
  auto ex = CreateCpuExecutor(1);
  const std::vector<int32_t> prompt = {2, 17, 33, 4, 58, 9, 21, 40, 7, 13};
  const std::vector<int32_t> tail = {61, 3, 45, 12, 30, 8};
  const std::vector<int32_t> after = {5, 19, 27};
  auto decode_all = [&](DecodeContext& ctx, const std::vector<int32_t>& tokens) {
    std::vector<float> last;
    for (int32_t t : tokens) {
      auto logits = ctx.Decode(t, *ex);
      EXPECT_TRUE(logits.ok()) << logits.status();
      if (!logits.ok()) return last;
      last.assign(logits->begin(), logits->end());
    }
    return last;
  };
  auto plain = (*m)->NewContext(64);
  auto rewound = (*m)->NewContext(64);
  ASSERT_TRUE(plain.ok() && rewound.ok());
  ASSERT_TRUE((*plain)->Prefill(prompt, false, *ex).ok());
  const std::vector<float> expected = decode_all(**plain, after);

  ASSERT_TRUE((*rewound)->Prefill(prompt, false, *ex).ok());
  decode_all(**rewound, tail);  // the held plan is built here, over the tail
  EXPECT_EQ((*rewound)->Rewind(static_cast<int32_t>(prompt.size()) + 7).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*rewound)->Rewind(-1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*rewound)->Rewind(static_cast<int32_t>(prompt.size())).ok());
  EXPECT_EQ((*rewound)->cached_len(), static_cast<int32_t>(prompt.size()));
  const std::vector<float> got = decode_all(**rewound, after);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(0, std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)));
}

TEST(RealModelRuntimeTest, KvBytesFollowTheGeometryAndAreReleased) {
  DECODED_REQUIRE_REAL_MODEL();
  auto model = Model::Load(testing::RealModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  const EngineCounters before = GetEngineCounters();
  {
    auto ctx = (*model)->NewContext(1024);
    ASSERT_TRUE(ctx.ok());
    // 2 (K, V) x 18 layers x 1 kv head x 256 head_dim x 1024 positions x 4 bytes (f32).
    EXPECT_EQ((*ctx)->kv_bytes(), 2LL * 18 * 1 * 256 * 1024 * 4);
    EXPECT_EQ(GetEngineCounters().kv_bytes - before.kv_bytes, (*ctx)->kv_bytes());
    auto ex = CreateCpuExecutor(2);
    ASSERT_TRUE((*ctx)->Prefill(std::vector<int32_t>{2, 818, 5279}, false, *ex).ok());
    ASSERT_TRUE((*ctx)->Decode(529, *ex).ok());
    EXPECT_GT((*ctx)->bound_nodes(), 0);
    EXPECT_EQ(GetEngineCounters().bound_nodes - before.bound_nodes, (*ctx)->bound_nodes());
    EXPECT_EQ(GetEngineCounters().live_contexts - before.live_contexts, 1);
  }
  const EngineCounters after = GetEngineCounters();
  EXPECT_EQ(after.kv_bytes, before.kv_bytes);
  EXPECT_EQ(after.bound_nodes, before.bound_nodes);
  EXPECT_EQ(after.live_contexts, before.live_contexts);
}

// A team that lends threads to host work (EngineOptions::
// lend_threads_to_host_work) runs its regions narrower; every logit must stay
// the same byte for byte, or a session's output would depend on what other
// clients asked for. The real model: a prefill and decode steps with the
// width changing between steps (3, 2, 1, 3, 2), against the full-width team.
// (Every family's fixture, batched: batch_decode_test.)
TEST(LentThreadsTest, ANarrowerTeamGivesTheRealModelTheSameLogits) {
  DECODED_REQUIRE_REAL_MODEL();
  auto model = Model::Load(testing::RealModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> prompt = {2, 818, 5279, 529, 7001, 563, 9079, 236764};
  const std::vector<int32_t> next = {6, 1, 8, 10, 12};
  auto run = [&](Executor& ex, std::atomic<int>* lent) {
    std::vector<std::vector<float>> out;
    auto ctx = (*model)->NewContext(32);
    if (!ctx.ok()) return out;
    auto logits = (*ctx)->Prefill(prompt, false, ex);
    for (size_t i = 0; logits.ok(); ++i) {
      out.emplace_back(logits->begin(), logits->end());
      if (i == next.size()) break;
      if (lent != nullptr) lent->store(static_cast<int>(i % 3));
      logits = (*ctx)->Decode(next[i], ex);
    }
    return out;
  };
  auto full = CreateCpuExecutor(3);
  const std::vector<std::vector<float>> want = run(*full, nullptr);
  ASSERT_EQ(want.size(), next.size() + 1);
  std::atomic<int> lent{1};
  auto lending = CreateCpuExecutor(3, &lent);
  const std::vector<std::vector<float>> got = run(*lending, &lent);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0) << "step " << i;
  }
}

// The real instruct models of the llama-style families through the runtime
// (GGUF -> family + byte-level BPE tokenizer): the prompt tokenizes as
// llama.cpp tokenized it (tests/data/<name>_llamacpp.json) and greedy decode
// completes it as llama.cpp did.
struct RealLlamaStyle {
  const char* name;
  const char* env_var;
  const char* file_name;
  const char* family;
};

class RealLlamaStyleRuntimeTest : public ::testing::TestWithParam<RealLlamaStyle> {};

TEST_P(RealLlamaStyleRuntimeTest, CompletesTheCapitalOfFranceWithParis) {
  const RealLlamaStyle& rm = GetParam();
  const testing::NamedModel path = testing::NamedModelPath(rm.env_var, rm.file_name);
  if (!std::ifstream(path.path).good()) {
    if (path.required) FAIL() << rm.env_var << " = " << path.path << " does not exist";
    GTEST_SKIP() << path.path << " absent (scripts/fetch_model.sh fetches it)";
  }
  auto model = Model::Load(path.path);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->info().family, rm.family);
  EXPECT_EQ((*model)->info().sliding_window, 0);
  std::ifstream in(testing::TestDataPath(std::string(rm.name) + "_llamacpp.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::json ref = nlohmann::json::parse(in)["cases"][0];
  ASSERT_EQ(ref["name"], "plain_capital");
  const std::vector<int32_t> prompt =
      (*model)->tokenizer().Encode(ref["prompt"].get<std::string>(), /*add_bos=*/true, /*parse_special=*/true);
  EXPECT_EQ(prompt, ref["prompt_ids"].get<std::vector<int32_t>>());
  auto ctx = (*model)->NewContext(64);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto ex = CreateCpuExecutor(2);
  auto logits = (*ctx)->Prefill(prompt, false, *ex);
  ASSERT_TRUE(logits.ok()) << logits.status();
  std::vector<int32_t> out;
  for (int i = 0; i < 3; ++i) {
    out.push_back(static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin()));
    logits = (*ctx)->Decode(out.back(), *ex);
    ASSERT_TRUE(logits.ok()) << logits.status();
  }
  auto text = (*model)->tokenizer().Detokenize(out, false);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->rfind(" Paris", 0), 0u) << *text;
}

INSTANTIATE_TEST_SUITE_P(
    RealModels, RealLlamaStyleRuntimeTest,
    ::testing::Values(RealLlamaStyle{"smollm2", "DECODED_SMOLLM2_PATH", "smollm2-135m-instruct-q4_1.gguf", "llama"},
                      RealLlamaStyle{"qwen2", "DECODED_QWEN2_PATH", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                                     "qwen2"}),
    [](const ::testing::TestParamInfo<RealLlamaStyle>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace decoded
