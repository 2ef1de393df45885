// The mixed-step exactness check (BatchDecoder::Step), shared by the CPU
// test (tests/engine/mixed_step_test.cc) and the Vulkan one: a session's
// logits in a mixed step must be byte-identical to the same spans run alone,
// one Step each, with no other session (what the scheduler promises: a
// session's output does not depend on load), and to D1 (a graph built per
// chunk) fed the whole sequence in chunks of a given size. The control
// changes one prompt token of one session: that session's rows must differ,
// and every other session's rows must still match.
#ifndef DECODED_TESTS_ENGINE_MIXED_STEP_CHECK_H_
#define DECODED_TESTS_ENGINE_MIXED_STEP_CHECK_H_

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/runtime.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"

namespace decoded::testing {

// One session's part of one step.
struct Piece {
  int session = 0;
  std::vector<int32_t> tokens;
  SpanLogits logits = SpanLogits::kLast;
};
using Script = std::vector<std::vector<Piece>>;  // steps, each a list of pieces

// Logits rows of one session, keyed by the position of the token they follow.
using Rows = std::map<int32_t, std::vector<float>>;

inline constexpr int kSessions = 4;

// Four sessions over four steps: A prefills alone, then decodes; B's prompt
// arrives in three spans (no logits, no logits, last) beside the others; C
// asks for every prompt row (prompt logprobs); D joins in step 1. Span
// lengths scale with `unit` (1 on fixtures, larger on real models).
inline Script MakeScript(int32_t vocab, int unit, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
  auto ids = [&](int n) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(tok(rng));
    return v;
  };
  enum { A, B, C, D };
  Script s(4);
  s[0] = {{A, ids(5 * unit), SpanLogits::kLast}, {B, ids(7 * unit), SpanLogits::kNone}};
  s[1] = {{D, ids(3 * unit + 2), SpanLogits::kLast},
          {A, ids(1), SpanLogits::kLast},
          {B, ids(6 * unit + 1), SpanLogits::kNone},
          {C, ids(4 + unit), SpanLogits::kAll}};
  s[2] = {{C, ids(1), SpanLogits::kLast},
          {B, ids(2 * unit + 3), SpanLogits::kLast},
          {A, ids(1), SpanLogits::kLast},
          {D, ids(1), SpanLogits::kLast}};
  s[3] = {{B, ids(1), SpanLogits::kLast},
          {D, ids(1), SpanLogits::kLast},
          {C, ids(1), SpanLogits::kLast},
          {A, ids(1), SpanLogits::kLast}};
  return s;
}

inline size_t RowsOf(const Piece& p) {
  return p.logits == SpanLogits::kNone ? 0 : p.logits == SpanLogits::kLast ? 1 : p.tokens.size();
}

// Runs `steps` (each a list of pieces) on fresh contexts, one Step per step,
// through `decoder`; returns every returned logits row per session.
// With `pool`, the contexts' KV caches take their blocks from it.
inline std::vector<Rows> Run(const Model& model, BatchDecoder& decoder, const Script& steps, int32_t capacity,
                             Executor& ex, std::shared_ptr<KvPool> pool = nullptr) {
  std::vector<Rows> out(kSessions);
  std::vector<std::unique_ptr<DecodeContext>> ctx;
  for (int i = 0; i < kSessions; ++i) {
    auto c = model.NewContext(capacity, pool);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    ctx.push_back(*std::move(c));
  }
  const size_t vocab = static_cast<size_t>(model.info().vocab_size);
  for (size_t s = 0; s < steps.size(); ++s) {
    std::vector<StepSpan> spans;
    std::vector<int32_t> first_pos;
    for (const Piece& p : steps[s]) {
      DecodeContext* c = ctx[static_cast<size_t>(p.session)].get();
      first_pos.push_back(c->cached_len());
      spans.push_back(StepSpan{c, p.tokens, p.logits});
    }
    auto logits = decoder.Step(spans, ex);
    EXPECT_TRUE(logits.ok()) << "step " << s << ": " << logits.status();
    if (!logits.ok()) return {};
    size_t row = 0;
    for (size_t k = 0; k < steps[s].size(); ++k) {
      const Piece& p = steps[s][k];
      const size_t n = RowsOf(p);
      for (size_t r = 0; r < n; ++r, ++row) {
        const int32_t pos = first_pos[k] + static_cast<int32_t>(p.logits == SpanLogits::kAll ? r : p.tokens.size() - 1);
        const float* src = logits->data() + row * vocab;
        out[static_cast<size_t>(p.session)][pos].assign(src, src + vocab);
      }
    }
    EXPECT_EQ(row * vocab, logits->size()) << "step " << s << " returned another number of rows";
  }
  return out;
}

// Each session alone: its pieces, one Step each, in script order.
inline std::vector<Rows> RunAlone(const Model& model, const Script& script, int32_t capacity, Executor& ex) {
  std::vector<Rows> out(kSessions);
  // One decoder for all: its plans serve any session (they hold no state of one).
  auto decoder = model.NewBatchDecoder(16, 256);
  EXPECT_TRUE(decoder.ok()) << decoder.status();
  if (!decoder.ok()) return {};
  for (int i = 0; i < kSessions; ++i) {
    Script solo;
    for (const auto& step : script) {
      for (const Piece& p : step) {
        if (p.session == i) solo.push_back({Piece{0, p.tokens, p.logits}});
      }
    }
    std::vector<Rows> rows = Run(model, **decoder, solo, capacity, ex);
    if (rows.empty()) return {};
    out[static_cast<size_t>(i)] = std::move(rows[0]);
  }
  return out;
}

// Each session's whole sequence through D1 in chunks of `chunk` tokens, every
// row's logits kept.
inline std::vector<Rows> RunD1(const Model& model, const Script& script, int32_t capacity, int32_t chunk,
                               Executor& ex, std::shared_ptr<KvPool> pool = nullptr) {
  std::vector<Rows> out(kSessions);
  const size_t vocab = static_cast<size_t>(model.info().vocab_size);
  for (int i = 0; i < kSessions; ++i) {
    std::vector<int32_t> seq;
    for (const auto& step : script) {
      for (const Piece& p : step) {
        if (p.session == i) seq.insert(seq.end(), p.tokens.begin(), p.tokens.end());
      }
    }
    auto ctx = model.NewContext(capacity, pool);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    if (!ctx.ok()) return {};
    for (size_t at = 0; at < seq.size(); at += static_cast<size_t>(chunk)) {
      const size_t n = std::min<size_t>(static_cast<size_t>(chunk), seq.size() - at);
      auto logits = (*ctx)->Prefill(absl::MakeConstSpan(seq).subspan(at, n), /*all_logits=*/true, ex);
      EXPECT_TRUE(logits.ok()) << logits.status();
      if (!logits.ok()) return {};
      for (size_t r = 0; r < n; ++r) {
        const float* src = logits->data() + r * vocab;
        out[static_cast<size_t>(i)][static_cast<int32_t>(at + r)].assign(src, src + vocab);
      }
    }
  }
  return out;
}

// Rows of `got` whose bytes differ from `want`'s row at the same position
// (a row `want` lacks counts as differing), per session.
inline std::vector<int> Mismatches(const std::vector<Rows>& got, const std::vector<Rows>& want) {
  std::vector<int> bad(kSessions, 0);
  for (int i = 0; i < kSessions; ++i) {
    for (const auto& [pos, row] : got[static_cast<size_t>(i)]) {
      auto it = want[static_cast<size_t>(i)].find(pos);
      const bool same = it != want[static_cast<size_t>(i)].end() && it->second.size() == row.size() &&
                        std::memcmp(it->second.data(), row.data(), row.size() * sizeof(float)) == 0;
      bad[static_cast<size_t>(i)] += same ? 0 : 1;
    }
  }
  return bad;
}

// The mixed script on `path`'s model, on `backend` (null: the CPU), against
// each session alone and against D1 in chunks of `d1_chunk` tokens (0: no D1
// run; the control then compares with the sessions alone); then, with
// `control`, the control. `kv_type`: the KV caches' element type.
inline void CheckMixedSteps(const std::string& path, int unit, int32_t capacity, int32_t d1_chunk,
                            std::shared_ptr<Backend> backend = nullptr, bool control = true,
                            DType kv_type = DType::kF32) {
  ModelLoadOptions options;
  options.backend = std::move(backend);
  options.kv_type = kv_type;
  auto model = Model::Load(path, options);
  ASSERT_TRUE(model.ok()) << path << ": " << model.status();
  auto made = (*model)->backend().CreateExecutor(2, nullptr);
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Executor> ex = *std::move(made);
  const Script script = MakeScript((*model)->info().vocab_size, unit, 11);

  auto decoder = (*model)->NewBatchDecoder(16, 256);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const std::vector<Rows> mixed = Run(**model, **decoder, script, capacity, *ex);
  ASSERT_EQ(mixed.size(), static_cast<size_t>(kSessions));
  // Rows returned: A 1 prompt + 3 decode, B 1 + 1, C (4 + unit) + 2, D 1 + 2.
  EXPECT_EQ(mixed[0].size(), 4u);
  EXPECT_EQ(mixed[1].size(), 2u);
  EXPECT_EQ(mixed[2].size(), static_cast<size_t>(4 + unit + 2));
  EXPECT_EQ(mixed[3].size(), 3u);

  const std::vector<Rows> alone = RunAlone(**model, script, capacity, *ex);
  ASSERT_EQ(alone.size(), static_cast<size_t>(kSessions));
  const std::vector<Rows> d1 = d1_chunk > 0 ? RunD1(**model, script, capacity, d1_chunk, *ex) : alone;
  ASSERT_EQ(d1.size(), static_cast<size_t>(kSessions));
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_EQ(Mismatches(mixed, alone)[static_cast<size_t>(i)], 0) << "session " << i << " vs. alone";
    EXPECT_EQ(Mismatches(mixed, d1)[static_cast<size_t>(i)], 0) << "session " << i << " vs. D1";
  }

  if (!control) return;
  // The control: C's first prompt token changed. Its rows move; the others'
  // must not (another session's input never reaches a session's rows).
  Script broken = script;
  for (Piece& p : broken[1]) {
    if (p.session == 2) p.tokens[0] = p.tokens[0] == 3 ? 4 : 3;
  }
  const std::vector<Rows> moved = Run(**model, **decoder, broken, capacity, *ex);
  ASSERT_EQ(moved.size(), static_cast<size_t>(kSessions));
  const std::vector<int> bad = Mismatches(moved, d1);
  EXPECT_EQ(bad[2], static_cast<int>(moved[2].size())) << "a changed prompt token left some of its rows unchanged";
  EXPECT_EQ(bad[0] + bad[1] + bad[3], 0) << "one session's prompt changed another's logits";
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_ENGINE_MIXED_STEP_CHECK_H_
