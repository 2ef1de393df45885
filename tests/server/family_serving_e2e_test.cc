// Every model family served through the daemon, unchanged: the real server
// in-process on a loopback port, a real gRPC stub, and each family's tiny
// random-weight Hugging Face fixture (tests/data/<name>.{gguf,json}, written by
// tools/make_*_fixture*.py) loaded through the normal engine path
// (Engine::Create -> Model::Load -> the family registry). On one Generate
// stream a token-id turn sends HF's prompt and a second turn continues it; the
// streamed greedy tokens must be HF's greedy continuation (generated_ids) and
// every reported log-probability HF's within the families' logit tolerance.
// GetModelInfo names the family, and the session's KV and bindings are back to
// zero once the stream closes.
//
// The tokenizer. The fixtures of every family but Gemma 3 carry none (their
// ids are random-weight token ids with no text), and the daemon serves a model
// only with one: the streamed text, stop strings and Detokenize are defined
// over a vocabulary, and real GGUFs always carry one. The test therefore adds
// to a temporary copy of the fixture a minimal byte-level BPE vocabulary of the
// fixture's size (RewriteKvs, tests/gguf/gguf_test_writer.h: metadata only,
// tensors byte for byte): <unk> <s> </s> as control tokens (ids 0, 1, 2: the
// fixtures' HF configs use 1 and 2 as BOS and EOS), then one printable ASCII
// byte per id ('!' + id - 3; GPT-2's byte-to-unicode map spells these bytes as
// themselves), no merges. The weights, and so HF's reference, are untouched;
// the vocabulary only gives the daemon text to stream, which the test checks
// against its own spelling of the ids. Rejected: writing a tokenizer into the
// committed fixtures (changes their bytes, proves nothing more) and a
// tokenizer-less daemon mode (no real GGUF needs it; clients that tokenize
// themselves already have token turns). Gemma 3's fixtures carry their own
// SentencePiece vocabulary and are served as they are.
//
// Why the greedy comparison is exact: the families' reference tests bound
// |ours - HF| per logit by kLogitTolerance (docs/families.md), so HF's argmax
// is ours wherever HF's top-1 / top-2 gap exceeds twice that; the test checks
// the gap of every sampled row first (smallest: deepseek3_tiny, 8.5e-3). A
// log-softmax moves by at most twice the largest logit change (the logit's
// own change plus the log-sum-exp's), hence kLogprobTolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/model_registry.h"
#include "engine/runtime.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/decoded.grpc.pb.h"
#include "server/server.h"
#include "tests/common/model_path.h"
#include "tests/common/test_backend.h"
#include "tests/common/test_vocabulary.h"
#include "tests/gguf/gguf_test_writer.h"
#include "tests/server/e2e_support.h"

namespace decoded::server {
namespace {

using testing::CopyWithTestVocabulary;
using testing::TestVocabText;

// The families' reference tests' logit tolerance (their measured worst:
// 1.8e-5, llama_tiny).
constexpr double kLogitTolerance = 5e-5;
constexpr double kLogprobTolerance = 2 * kLogitTolerance;

struct FamilyFixture {
  const char* gguf;        // tests/data/<gguf>
  const char* json;        // tests/data/<json>: HF's reference
  const char* family;      // its general.architecture, as GetModelInfo must report it
  bool carries_tokenizer;  // served as committed (else the test vocabulary is added)
};

// For test names and messages (gtest would print the bytes).
void PrintTo(const FamilyFixture& fx, std::ostream* os) { *os << fx.gguf; }

// Every tiny HF fixture of every family, variants included.
constexpr FamilyFixture kFixtures[] = {
    {"gemma3_tiny_swa.gguf", "gemma3_tiny_swa.json", "gemma3", true},
    {"gemma3_tiny_softcap.gguf", "gemma3_tiny_softcap.json", "gemma3", true},
    {"gemma3_tiny_f16.gguf", "gemma3_tiny_f16.json", "gemma3", true},
    {"llama_tiny.gguf", "llama_tiny.json", "llama", false},
    {"llama3rope_tiny.gguf", "llama3rope_tiny.json", "llama", false},
    {"llamayarn_tiny.gguf", "llamayarn_tiny.json", "llama", false},
    {"qwen2_tiny.gguf", "qwen2_tiny.json", "qwen2", false},
    {"qwen2yarn_tiny.gguf", "qwen2yarn_tiny.json", "qwen2", false},
    {"qwen3_tiny.gguf", "qwen3_tiny.json", "qwen3", false},
    {"qwen3moe_tiny.gguf", "qwen3moe_tiny.json", "qwen3moe", false},
    {"phi3_tiny.gguf", "phi3_tiny.json", "phi3", false},
    {"phi2_tiny.gguf", "phi2_tiny.json", "phi2", false},
    {"phi2_tiny_fused.gguf", "phi2_tiny.json", "phi2", false},
    {"smollm3_tiny.gguf", "smollm3_tiny.json", "smollm3", false},
    {"glm4_tiny.gguf", "glm4_tiny.json", "glm4", false},
    {"deepseek2_tiny.gguf", "deepseek2_tiny.json", "deepseek2", false},
    {"deepseek2lite_tiny.gguf", "deepseek2lite_tiny.json", "deepseek2", false},
    {"deepseek2moe_tiny.gguf", "deepseek2moe_tiny.json", "deepseek2", false},
    {"deepseek2yarn_tiny.gguf", "deepseek2yarn_tiny.json", "deepseek2", false},
    {"deepseek2liteyarn_tiny.gguf", "deepseek2liteyarn_tiny.json", "deepseek2", false},
    {"deepseek3_tiny.gguf", "deepseek3_tiny.json", "deepseek2", false},
};

// log softmax(row)[id], in double.
double LogSoftmaxAt(const nlohmann::json& row, int32_t id) {
  double max = -INFINITY;
  for (const auto& v : row) max = std::max(max, v.get<double>());
  double sum = 0;
  for (const auto& v : row) sum += std::exp(v.get<double>() - max);
  return row[static_cast<size_t>(id)].get<double>() - max - std::log(sum);
}

// The smallest top-1 minus top-2 logit over `rows`.
double MinTopGap(const nlohmann::json& rows) {
  double gap = INFINITY;
  for (const auto& row : rows) {
    std::vector<double> v = row.get<std::vector<double>>();
    std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
    gap = std::min(gap, v[0] - v[1]);
  }
  return gap;
}

v1::GenerateRequest TokenTurn(const std::vector<int32_t>& ids, int max_new_tokens) {
  v1::GenerateRequest req = e2e::TokensTurn(ids, max_new_tokens);  // greedy, ignore_eos
  req.mutable_turn()->set_prompt_logprobs(true);
  return req;
}

// Polls the /metrics series until it reads `want`; the last value read.
double MetricSettlesAt(int port, const std::string& series, double want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  double v = -1;
  while (absl::Now() < deadline) {
    v = e2e::MetricValue(e2e::HttpGet(port, "/metrics"), series);
    if (v == want) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return v;
}

// Each fixture on each backend (--device): the same HF reference and
// tolerance, so a Vulkan kernel that drifts from the CPU's fails here too.
class FamilyServingTest : public ::testing::TestWithParam<std::tuple<FamilyFixture, const char*>> {};

TEST_P(FamilyServingTest, StreamsTransformersGreedyTokensOverTwoTurns) {
  const FamilyFixture& fx = std::get<0>(GetParam());
  const std::string device = std::get<1>(GetParam());
  DECODED_TEST_BACKEND_OR_SKIP(backend, device);
  const std::string device_name = backend->device_name();
  std::ifstream in(testing::TestDataPath(fx.json));
  ASSERT_TRUE(in.good()) << fx.json;
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = ref["generated_ids"].get<std::vector<int32_t>>();
  const nlohmann::json& logits = ref["logits"];  // row k samples greedy[k]
  const int vocab = ref["config"]["vocab_size"].get<int>();
  const int n = static_cast<int>(greedy.size());
  ASSERT_EQ(logits.size(), greedy.size());
  ASSERT_GE(n, 8);

  const double gap = MinTopGap(logits);
  std::printf("[ measured ] %s: smallest HF top-1/top-2 gap over the %d sampled rows %.3g\n", fx.gguf, n, gap);
  ASSERT_GT(gap, 2 * kLogitTolerance) << "HF's argmax is not stable under the tolerance: compare logprobs only";

  const std::string path =
      fx.carries_tokenizer ? testing::TestDataPath(fx.gguf) : CopyWithTestVocabulary(fx.gguf, vocab);
  ASSERT_FALSE(path.empty());
  serving::EngineOptions eo;
  eo.model_path = path;
  eo.workers = 1;
  eo.threads_per_worker = 2;
  eo.max_sessions = 2;
  eo.context_length = 64;
  eo.backend = std::move(backend);
  absl::StatusOr<std::unique_ptr<DecodedServer>> server = e2e::StartServer(eo);
  if (!fx.carries_tokenizer) std::remove(path.c_str());  // mapped: the engine keeps it
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(**server));
  const int metrics_port = (*server)->metrics_port();
  // What the idle engine holds on its device (on a GPU: the weights).
  const double idle_device_bytes = e2e::MetricValue(e2e::HttpGet(metrics_port, "/metrics"),
                                                    "decoded_device_memory_bytes");

  grpc::ClientContext info_ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&info_ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.family(), fx.family);
  EXPECT_EQ(info.backend(), device.substr(0, device.find(':')));
  EXPECT_EQ(info.device(), device_name);
  EXPECT_EQ(info.vocab_size(), vocab);
  EXPECT_EQ(info.n_layers(), ref["config"]["num_hidden_layers"].get<int>());
  EXPECT_EQ(info.tokenizer(), fx.carries_tokenizer ? "sentencepiece" : "byte_level_bpe");
  ASSERT_GE(info.session_context_length(), static_cast<int>(prompt.size()) + n);

  // Turn 1: HF's prompt, the first k greedy tokens. Turn 2 feeds HF's next
  // two greedy tokens as a prompt (a later turn's prefill) and generates the
  // rest, so the whole stream is HF's sequence.
  const int k = n / 2 - 1;
  const std::vector<int32_t> second_prompt = {greedy[k], greedy[k + 1]};
  const int second_new = n - k - 2;
  const EngineCounters before = GetEngineCounters();
  grpc::ClientContext ctx;
  auto stream = stub->Generate(&ctx);
  ASSERT_TRUE(stream->Write(TokenTurn(prompt, k)));
  const e2e::TurnResult t1 = e2e::ReadTurn(stream.get());
  ASSERT_TRUE(t1.ended);
  ASSERT_TRUE(stream->Write(TokenTurn(second_prompt, second_new)));
  const e2e::TurnResult t2 = e2e::ReadTurn(stream.get());
  ASSERT_TRUE(t2.ended);
  const EngineCounters after = GetEngineCounters();

  // The session holds its KV until the stream closes.
  EXPECT_EQ(e2e::MetricValue(e2e::HttpGet(metrics_port, "/metrics"), "decoded_sessions_active"), 1);
  EXPECT_GT(e2e::MetricValue(e2e::HttpGet(metrics_port, "/metrics"), "decoded_kv_bytes"), 0);
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();

  EXPECT_EQ(t1.ids, std::vector<int32_t>(greedy.begin(), greedy.begin() + k));
  EXPECT_EQ(t2.ids, std::vector<int32_t>(greedy.begin() + k + 2, greedy.end()));
  EXPECT_EQ(t1.end.finish_reason(), v1::LENGTH);
  EXPECT_EQ(t2.end.finish_reason(), v1::LENGTH);
  const int p = static_cast<int>(prompt.size());
  EXPECT_EQ(t1.end.usage().prompt_tokens(), p);
  EXPECT_EQ(t1.end.usage().cached_tokens(), 0);
  EXPECT_EQ(t1.end.usage().context_tokens(), p + k);
  EXPECT_EQ(t2.end.usage().cached_tokens(), p + k);
  EXPECT_EQ(t2.end.usage().prefilled_tokens(), 3);  // turn 1's last token, then the two
  EXPECT_EQ(t2.end.usage().context_tokens(), p + n);

  // Log-probabilities of the sampled tokens and of both turns' prompts.
  double worst = 0;
  auto check = [&](double got, double want, const std::string& what) {
    worst = std::max(worst, std::abs(got - want));
    EXPECT_NEAR(got, want, kLogprobTolerance) << what;
  };
  for (size_t j = 0; j < t1.events.size(); ++j) {
    check(t1.events[j].logprob(), LogSoftmaxAt(logits[j], greedy[j]), absl::StrCat("turn 1 token ", j));
  }
  for (size_t j = 0; j < t2.events.size(); ++j) {
    const size_t row = k + 2 + j;
    check(t2.events[j].logprob(), LogSoftmaxAt(logits[row], greedy[row]), absl::StrCat("turn 2 token ", j));
  }
  ASSERT_EQ(t1.end.prompt_logprobs_size(), p - 1);
  for (int i = 0; i + 1 < p; ++i) {
    check(t1.end.prompt_logprobs(i), LogSoftmaxAt(ref["prefill_logits"][i], prompt[i + 1]),
          absl::StrCat("turn 1 prompt position ", i));
  }
  // Turn 2 scores greedy[k] after turn 1's last token (row k), then greedy[k + 1].
  ASSERT_EQ(t2.end.prompt_logprobs_size(), 2);
  for (int i = 0; i < 2; ++i) {
    check(t2.end.prompt_logprobs(i), LogSoftmaxAt(logits[k + i], greedy[k + i]),
          absl::StrCat("turn 2 prompt token ", i));
  }

  // The streamed text is the detokenized ids, and over the test vocabulary
  // its spelling of them.
  for (const e2e::TurnResult* t : {&t1, &t2}) {
    grpc::ClientContext dctx;
    v1::DetokenizeRequest dreq;
    dreq.mutable_ids()->Add(t->ids.begin(), t->ids.end());
    v1::DetokenizeResponse dresp;
    ASSERT_TRUE(stub->Detokenize(&dctx, dreq, &dresp).ok());
    EXPECT_EQ(t->text, dresp.text());
    if (!fx.carries_tokenizer) {
      EXPECT_EQ(t->text, TestVocabText(t->ids));
    }
  }

  // One held decode plan for the session: every decode step after the first
  // reuses it, across the second turn's prefill.
  const int decode_steps = (k - 1) + (second_new - 1);
  EXPECT_EQ(after.rebinds - before.rebinds, decode_steps - 1);

  // Closed: no session, KV byte or binding left.
  EXPECT_TRUE(e2e::EngineDrainsToZero(*(*server)->engine(), absl::Seconds(5)));
  EXPECT_EQ(MetricSettlesAt(metrics_port, "decoded_sessions_active", 0), 0);
  EXPECT_EQ(MetricSettlesAt(metrics_port, "decoded_kv_bytes", 0), 0);
  EXPECT_EQ(MetricSettlesAt(metrics_port, "decoded_sessions_total{outcome=\"ok\"}", 1), 1);
  // Every device byte the session took (its KV cache and held plan) is back.
  EXPECT_EQ(MetricSettlesAt(metrics_port, "decoded_device_memory_bytes", idle_device_bytes), idle_device_bytes);
  EXPECT_EQ(e2e::MetricValue(e2e::HttpGet(metrics_port, "/metrics"), "decoded_device_validation_messages_total"), 0);

  std::printf("[ measured ] %s (%s) on %s: %d streamed tokens as HF, max |logprob - HF| %.3g, graph builds %lld\n",
              fx.gguf, fx.family, device.c_str(), n - 2, worst,
              static_cast<long long>(after.graph_builds - before.graph_builds));
}

std::string FixtureName(const ::testing::TestParamInfo<std::tuple<FamilyFixture, const char*>>& info) {
  std::string name = std::get<0>(info.param).gguf;
  return absl::StrCat(name.substr(0, name.find('.')), "_", std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FamilyServingTest,
                         ::testing::Combine(::testing::ValuesIn(kFixtures), ::testing::Values("cpu", "vulkan")),
                         FixtureName);

// The control: served the same way, a model that is not HF's (llama_tiny with
// rope.freq_base 10000 -> 500) must stream other tokens or other logprobs, so
// the comparison above can fail.
TEST(FamilyServingControlTest, AModelThatIsNotTransformersIsCaught) {
  std::ifstream in(testing::TestDataPath("llama_tiny.json"));
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = ref["generated_ids"].get<std::vector<int32_t>>();
  const std::string path = CopyWithTestVocabulary(
      "llama_tiny.gguf", 96, {{"llama.rope.freq_base", testing::kF32, testing::Enc<float>(500.0f)}});
  ASSERT_FALSE(path.empty());
  serving::EngineOptions eo;
  eo.model_path = path;
  eo.context_length = 64;
  absl::StatusOr<std::unique_ptr<DecodedServer>> server = e2e::StartServer(eo);
  std::remove(path.c_str());
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Decoder::NewStub(e2e::ChannelTo(**server));
  const e2e::TurnResult r = e2e::Solo(*stub, TokenTurn(prompt, static_cast<int>(greedy.size())));
  ASSERT_TRUE(r.ended);
  ASSERT_EQ(r.ids.size(), greedy.size());
  ASSERT_EQ(r.end.prompt_logprobs_size(), static_cast<int>(prompt.size()) - 1);
  double worst = 0;
  for (size_t j = 0; j < r.events.size() && r.ids[j] == greedy[j]; ++j) {
    worst = std::max(worst, std::abs(r.events[j].logprob() - LogSoftmaxAt(ref["logits"][j], greedy[j])));
  }
  for (int i = 0; i + 1 < static_cast<int>(prompt.size()); ++i) {
    worst = std::max(worst, std::abs(r.end.prompt_logprobs(i) - LogSoftmaxAt(ref["prefill_logits"][i], prompt[i + 1])));
  }
  const size_t same = std::mismatch(r.ids.begin(), r.ids.end(), greedy.begin()).first - r.ids.begin();
  std::printf("[ measured ] llama_tiny with rope.freq_base 500: first %zu of %zu tokens as HF, max |logprob - HF| "
              "over the shared prefix and prompt %.3g\n", same, greedy.size(), worst);
  EXPECT_NE(r.ids, greedy);
  EXPECT_GT(worst, 10 * kLogprobTolerance);
}

// The table above covers every family the binary registers, so a family added
// without a serving test fails here.
TEST(FamilyServingCoverageTest, EveryRegisteredFamilyHasAFixture) {
  std::set<std::string> covered;
  for (const FamilyFixture& fx : kFixtures) covered.insert(fx.family);
  const std::vector<std::string> registered = RegisteredFamilies();
  EXPECT_EQ(covered, std::set<std::string>(registered.begin(), registered.end()));
  EXPECT_EQ(covered.size(), 10u);
}

}  // namespace
}  // namespace decoded::server
