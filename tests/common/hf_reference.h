// Running a family on a tiny Hugging Face fixture (tests/data/<name>.gguf +
// .json, written by tools/make_llama_fixture.py and its siblings) and
// comparing with the logits transformers recorded: what every family's
// reference test does, kept once.
//
// The JSON layout: prompt_ids, decode_ids (HF's greedy tokens, fed back
// teacher-forced), prefill_logits[i] (prompt position i) and logits[0]
// (last prompt position), logits[k] (decode step k).
#ifndef DECODED_TESTS_COMMON_HF_REFERENCE_H_
#define DECODED_TESTS_COMMON_HF_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/decode_driver.h"
#include "engine/engine_counters.h"
#include "engine/graph/optimizer.h"
#include "engine/kv_cache.h"
#include "engine/model_registry.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"

namespace decoded::testing {

struct HfFixture {
  nlohmann::json ref;
  std::shared_ptr<const Weights> weights;
  std::unique_ptr<DecodeModel> model;  // null (with a test failure) if the family refused the file
};

// Loads the GGUF at `gguf_path` through the family registry and the reference
// tests/data/`json_name`; `offset_path` overrides the family's KV-write path.
inline HfFixture LoadHfGguf(const std::string& gguf_path, const std::string& json_name,
                            std::optional<KvOffsetPath> offset_path = std::nullopt) {
  HfFixture f;
  std::ifstream in(TestDataPath(json_name));
  EXPECT_TRUE(in.good()) << json_name;
  f.ref = nlohmann::json::parse(in);
  auto file = GgufFile::Open(gguf_path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return f;
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return f;
  f.weights = *weights;
  FamilyOptions opts;
  opts.kv_offset_path = offset_path;
  auto model = CreateFamily(f.weights, opts);
  EXPECT_TRUE(model.ok()) << model.status();
  if (model.ok()) f.model = *std::move(model);
  return f;
}

// tests/data/<name>_tiny.{gguf,json}.
inline HfFixture LoadHfFixture(const std::string& name, std::optional<KvOffsetPath> offset_path = std::nullopt) {
  return LoadHfGguf(TestDataPath(name + "_tiny.gguf"), name + "_tiny.json", offset_path);
}

// Max |ours - reference| over every prompt row (D1, all logits) and every
// decode step (D2, teacher-forced with decode_ids). 1e9 if a step fails.
inline double MaxAbsErrorVsHf(const DecodeModel& model, const nlohmann::json& ref) {
  CpuExecutor ex(2);
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> forced = ref["decode_ids"].get<std::vector<int32_t>>();
  const int32_t vocab = model.dims().vocab;
  auto kv = KvCache::Create(model.backend(), model.dims().n_layers, model.dims().kv_layout(), 64);
  EXPECT_TRUE(kv.ok());
  if (!kv.ok()) return 1e9;
  double worst = 0;
  auto compare = [&](absl::Span<const float> got, const nlohmann::json& want) {
    EXPECT_EQ(static_cast<int32_t>(want.size()), vocab);
    for (int32_t i = 0; i < vocab; ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(got[static_cast<size_t>(i)]) - want[i].get<double>()));
    }
  };
  auto prefill = forward_with_kv_context(model, **kv, prompt, /*all_logits=*/true, ex);
  EXPECT_TRUE(prefill.ok()) << prefill.status();
  if (!prefill.ok()) return 1e9;
  for (size_t row = 0; row < prompt.size(); ++row) {
    compare(absl::MakeConstSpan(*prefill).subspan(row * vocab, vocab), ref["prefill_logits"][row]);
  }
  compare(absl::MakeConstSpan(*prefill).subspan((prompt.size() - 1) * vocab, vocab), ref["logits"][0]);
  DecodeSession session;
  for (size_t k = 0; k < forced.size(); ++k) {
    auto step = forward_with_kv_context_persistent(model, **kv, session, forced[k], ex);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return 1e9;
    compare(*step, ref["logits"][k + 1]);
  }
  drop_decode_session(session);
  return worst;
}

// `n` greedy decode steps from token `first`, through D2 (`persistent`, the
// session's held plan) or D1 (a fresh graph per token); every step's logits,
// concatenated.
inline std::vector<float> DecodeSteps(const DecodeModel& m, KvCache& kv, DecodeSession& s, Executor& ex,
                                      int32_t first, int n, bool persistent) {
  std::vector<float> all;
  int32_t tok = first;
  for (int i = 0; i < n; ++i) {
    // D1 returns an owning vector, D2 a view of the held plan's output.
    std::vector<float> logits;
    if (persistent) {
      auto r = forward_with_kv_context_persistent(m, kv, s, tok, ex);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return all;
      logits.assign(r->begin(), r->end());
    } else {
      auto r = forward_with_kv_context(m, kv, std::vector<int32_t>{tok}, false, ex);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return all;
      logits = *std::move(r);
    }
    all.insert(all.end(), logits.begin(), logits.end());
    tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  return all;
}

// The held-plan contract on a fixture: after HF's prompt, `n` decode steps
// through D2 (one session's held plan) give logits byte-identical to D1
// (a graph rebuilt per token), with exactly one graph build and one optimizer
// run for the D2 session against n for D1.
inline void ExpectHeldPlanEqualsRebuildWithOneBuild(const HfFixture& f, int n) {
  ASSERT_NE(f.model, nullptr);
  const DecodeModel& m = *f.model;
  CpuExecutor ex(2);
  const std::vector<int32_t> prompt = f.ref["prompt_ids"].get<std::vector<int32_t>>();
  auto kv1 = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().kv_layout(), 64);
  auto kv2 = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().kv_layout(), 64);
  ASSERT_TRUE(forward_with_kv_context(m, *kv1, prompt, false, ex).ok());
  ASSERT_TRUE(forward_with_kv_context(m, *kv2, prompt, false, ex).ok());
  DecodeSession unused, session;
  const int64_t b0 = GetEngineCounters().graph_builds, o0 = OptimizerRuns();
  const std::vector<float> d1 = DecodeSteps(m, *kv1, unused, ex, 5, n, /*persistent=*/false);
  const int64_t b1 = GetEngineCounters().graph_builds, o1 = OptimizerRuns();
  const std::vector<float> d2 = DecodeSteps(m, *kv2, session, ex, 5, n, /*persistent=*/true);
  const int64_t b2 = GetEngineCounters().graph_builds, o2 = OptimizerRuns();
  ASSERT_EQ(d1.size(), d2.size());
  ASSERT_EQ(d1.size(), static_cast<size_t>(n) * m.dims().vocab);
  EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)), 0);
  EXPECT_EQ(b1 - b0, n);  // the control rebuilds every token
  EXPECT_EQ(o1 - o0, n);
  EXPECT_EQ(b2 - b1, 1);
  EXPECT_EQ(o2 - o1, 1);
  drop_decode_session(session);
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_HF_REFERENCE_H_
