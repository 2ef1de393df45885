// Batched decode across sessions: a session's logits in a batch are
// byte-identical to the same session decoded alone by D1 (the oracle: a graph
// rebuilt for its one token; the real model's case uses the one-session D2
// step, shown equal to D1 elsewhere), for every batch size 1..16, with sessions at
// different lengths, sliding windows crossed mid-stream, rows in a different
// order every step, and sessions joining and leaving while the others run.
// Runs on every tiny family fixture and on the real model; plus the host-side
// checks of a batched step and its allocation-free rebind.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/decode_driver.h"
#include "engine/engine_counters.h"
#include "engine/model_registry.h"
#include "engine/runtime.h"
#include "gtest/gtest.h"
#include "tests/common/counting_allocator.h"
#include "tests/common/model_path.h"

namespace decoded {
namespace {

struct Loaded {
  std::shared_ptr<const Weights> weights;
  std::unique_ptr<DecodeModel> model;
};

Loaded Load(const std::string& path) {
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return {};
  auto model = CreateFamily(*weights);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  return {*weights, *std::move(model)};
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

// A stream: its prompt, the global step it joins at, how many tokens it decodes.
struct Stream {
  std::vector<int32_t> prompt;
  int join = 0;
  int steps = 0;
};

// Session i joins at step i and decodes n_streams tokens, so the batch grows
// 1, 2, ..., n_streams and shrinks back to 1: every size occurs. Prompt
// lengths differ (1 .. ~3n tokens, plus `long_extra` on every fourth).
std::vector<Stream> MakeStreams(int n_streams, int32_t vocab, int32_t long_extra, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
  std::vector<Stream> out;
  for (int i = 0; i < n_streams; ++i) {
    Stream s;
    const int32_t len = 1 + (i * 7) % (3 * n_streams) + (i % 4 == 3 ? long_extra : 0);
    for (int32_t j = 0; j < len; ++j) s.prompt.push_back(tok(rng));
    s.join = i;
    s.steps = n_streams;
    out.push_back(std::move(s));
  }
  return out;
}

// Solo D1 oracle: each stream prefilled, then decoded greedily one rebuilt
// graph per token. Returns the logits of every decode step, per stream.
std::vector<std::vector<std::vector<float>>> SoloOracle(const DecodeModel& m, const std::vector<Stream>& streams,
                                                        int32_t capacity, Executor& ex) {
  std::vector<std::vector<std::vector<float>>> out(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    auto kv = NewKv(m, capacity);
    auto first = forward_with_kv_context(m, *kv, streams[i].prompt, false, ex);
    EXPECT_TRUE(first.ok()) << first.status();
    if (!first.ok()) return {};
    int32_t tok = Argmax(*first);
    for (int k = 0; k < streams[i].steps; ++k) {
      auto l = forward_with_kv_context(m, *kv, std::vector<int32_t>{tok}, false, ex);
      EXPECT_TRUE(l.ok()) << l.status();
      if (!l.ok()) return {};
      tok = Argmax(*l);
      out[i].push_back(*std::move(l));
    }
  }
  return out;
}

// Runs the streams batched through forward_batch_persistent with one held
// plan per bucket; compares every row with the oracle. `swap_caches` is the
// broken control: two rows' caches exchanged (their tokens kept). Returns
// the number of rows whose logits differed from the oracle, and records the
// batch sizes that ran.
int RunBatched(const DecodeModel& m, const std::vector<Stream>& streams,
               const std::vector<std::vector<std::vector<float>>>& oracle, int32_t capacity, Executor& ex,
               std::set<int>* sizes, bool swap_caches = false) {
  const std::vector<int32_t> buckets = BatchBuckets(16);
  std::vector<DecodeSession> plans(buckets.size());
  std::vector<std::unique_ptr<KvCache>> kv(streams.size());
  std::vector<int32_t> next(streams.size());
  std::vector<int> done(streams.size(), 0);
  for (size_t i = 0; i < streams.size(); ++i) {
    kv[i] = NewKv(m, capacity);
    auto first = forward_with_kv_context(m, *kv[i], streams[i].prompt, false, ex);
    EXPECT_TRUE(first.ok()) << first.status();
    next[i] = Argmax(*first);
  }
  const int64_t builds0 = GetEngineCounters().graph_builds;
  int mismatches = 0;
  std::set<size_t> buckets_used;
  for (int step = 0;; ++step) {
    std::vector<size_t> active;
    bool more = false;
    for (size_t i = 0; i < streams.size(); ++i) {
      if (streams[i].join <= step && done[i] < streams[i].steps) active.push_back(i);
      if (done[i] < streams[i].steps) more = true;
    }
    if (!more) break;
    if (active.empty()) continue;
    // A different row order every step: a row's result must not depend on it.
    std::rotate(active.begin(), active.begin() + static_cast<ptrdiff_t>(step % active.size()), active.end());
    if (step % 2 == 1) std::reverse(active.begin(), active.end());
    std::vector<DecodeRow> rows;
    for (size_t i : active) rows.push_back(DecodeRow{kv[i].get(), next[i]});
    if (swap_caches && rows.size() >= 2) std::swap(rows[0].kv, rows[1].kv);
    size_t b = 0;
    while (buckets[b] < static_cast<int32_t>(rows.size())) ++b;
    buckets_used.insert(b);
    auto logits = forward_batch_persistent(m, rows, buckets[b], plans[b], ex);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return -1;
    sizes->insert(static_cast<int>(rows.size()));
    const size_t vocab = static_cast<size_t>(m.dims().vocab);
    EXPECT_EQ(logits->size(), rows.size() * vocab);
    for (size_t r = 0; r < active.size(); ++r) {
      const size_t i = active[r];
      const absl::Span<const float> row = logits->subspan(r * vocab, vocab);
      const std::vector<float>& want = oracle[i][static_cast<size_t>(done[i])];
      if (!SameBytes(row, want)) {
        ++mismatches;
        if (!swap_caches) {
          ADD_FAILURE() << "stream " << i << " decode step " << done[i] << " in a batch of " << rows.size()
                        << " (row " << r << ") differs from its solo D1 logits";
        }
      }
      // Follow the oracle's tokens, so a control's divergence stays local.
      next[i] = Argmax(want);
      ++done[i];
    }
  }
  // One graph build per bucket used: every other step only rebinds.
  if (!swap_caches) {
    EXPECT_EQ(GetEngineCounters().graph_builds - builds0, static_cast<int64_t>(buckets_used.size()));
  }
  return mismatches;
}

struct FixtureCase {
  const char* file;
};

class BatchFixtureTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(BatchFixtureTest, EveryRowIsByteIdenticalToItsSoloD1Decode) {
  Loaded l = Load(testing::TestDataPath(GetParam().file));
  ASSERT_NE(l.model, nullptr);
  CpuExecutor ex(2);
  const std::vector<Stream> streams = MakeStreams(16, l.model->dims().vocab, /*long_extra=*/0, 7);
  constexpr int32_t kCapacity = 96;
  const auto oracle = SoloOracle(*l.model, streams, kCapacity, ex);
  ASSERT_EQ(oracle.size(), streams.size());
  std::set<int> sizes;
  EXPECT_EQ(RunBatched(*l.model, streams, oracle, kCapacity, ex, &sizes), 0);
  for (int b = 1; b <= 16; ++b) EXPECT_TRUE(sizes.count(b)) << "no step ran " << b << " rows";
}

constexpr FixtureCase kFixtures[] = {
    {"gemma3_tiny_swa.gguf"},  {"gemma3_tiny_softcap.gguf"}, {"gemma3_tiny_f16.gguf"},    {"llama_tiny.gguf"},
    {"llama3rope_tiny.gguf"},  {"llamayarn_tiny.gguf"},      {"qwen2_tiny.gguf"},         {"qwen2yarn_tiny.gguf"},
    {"qwen3_tiny.gguf"},       {"qwen3moe_tiny.gguf"},       {"phi3_tiny.gguf"},          {"phi2_tiny.gguf"},
    {"smollm3_tiny.gguf"},     {"glm4_tiny.gguf"},           {"deepseek2_tiny.gguf"},     {"deepseek2lite_tiny.gguf"},
    {"deepseek2moe_tiny.gguf"}, {"deepseek3_tiny.gguf"},
};

std::string FixtureName(const ::testing::TestParamInfo<FixtureCase>& info) {
  std::string name = info.param.file;
  name = name.substr(0, name.find('.'));
  return name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchFixtureTest, ::testing::ValuesIn(kFixtures), FixtureName);

// A span: several rows of one step on one cache (a prefill chunk riding in
// a decode step beside other sessions' decode rows). Each of its rows must
// equal that token decoded alone by D1 at its position, byte for byte, and
// the other sessions' rows their solo logits; twice, so the second step runs
// the held plan rebound (spans of other lengths, in other row slots). Then
// the same with a plan of 16 rows and 4 outputs, where only the span's last
// row asks for logits: the step returns the logits rows alone, in row order,
// the same bytes.
TEST_P(BatchFixtureTest, ASpanOfOneSequenceEqualsItsTokensDecodedOneByOne) {
  Loaded l = Load(testing::TestDataPath(GetParam().file));
  ASSERT_NE(l.model, nullptr);
  const DecodeModel& m = *l.model;
  CpuExecutor ex(2);
  constexpr int32_t kCapacity = 64;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(3, m.dims().vocab - 1);
  auto ids = [&](int n) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(tok(rng));
    return v;
  };
  // Sequence A: a prompt, then spans of 9 and 4 tokens; B and C decode one
  // token per step beside it.
  const std::vector<int32_t> prompt_a = ids(6), prompt_b = ids(3), prompt_c = ids(11);
  const std::vector<std::vector<int32_t>> spans = {ids(9), ids(4)};
  const std::vector<int32_t> next_b = ids(2), next_c = ids(2);

  // The oracle: every token through D1, one step each.
  auto solo = [&](const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens) {
    auto kv = NewKv(m, kCapacity);
    std::vector<std::vector<float>> out;
    EXPECT_TRUE(forward_with_kv_context(m, *kv, prompt, false, ex).ok());
    for (int32_t t : tokens) {
      auto logits = forward_with_kv_context(m, *kv, std::vector<int32_t>{t}, false, ex);
      EXPECT_TRUE(logits.ok()) << logits.status();
      out.push_back(logits.ok() ? *std::move(logits) : std::vector<float>{});
    }
    return out;
  };
  std::vector<int32_t> all_a = spans[0];
  all_a.insert(all_a.end(), spans[1].begin(), spans[1].end());
  const auto want_a = solo(prompt_a, all_a), want_b = solo(prompt_b, next_b), want_c = solo(prompt_c, next_c);
  const size_t vocab = static_cast<size_t>(m.dims().vocab);

  for (const int32_t outputs : {16, 4}) {
    SCOPED_TRACE(outputs);
    const bool every_row = outputs == 16;
    auto a = NewKv(m, kCapacity), b = NewKv(m, kCapacity), c = NewKv(m, kCapacity);
    ASSERT_TRUE(forward_with_kv_context(m, *a, prompt_a, false, ex).ok());
    ASSERT_TRUE(forward_with_kv_context(m, *b, prompt_b, false, ex).ok());
    ASSERT_TRUE(forward_with_kv_context(m, *c, prompt_c, false, ex).ok());
    DecodeSession plan;
    const int64_t builds0 = GetEngineCounters().graph_builds;
    size_t a_done = 0;
    for (size_t step = 0; step < spans.size(); ++step) {
      // B first, then A's span, then C (the second step: C, A, B). `want`:
      // the oracle row of each logits row the step returns, in order.
      std::vector<DecodeRow> rows;
      std::vector<const std::vector<float>*> want;
      auto add_a = [&] {
        for (size_t k = 0; k < spans[step].size(); ++k) {
          const bool last = k + 1 == spans[step].size();
          rows.push_back({a.get(), spans[step][k], every_row || last});
          if (every_row || last) want.push_back(&want_a[a_done + k]);
        }
      };
      auto add = [&](KvCache* kv, int32_t token, const std::vector<float>& logits) {
        rows.push_back({kv, token});
        want.push_back(&logits);
      };
      if (step == 0) {
        add(b.get(), next_b[step], want_b[step]);
        add_a();
        add(c.get(), next_c[step], want_c[step]);
      } else {
        add(c.get(), next_c[step], want_c[step]);
        add_a();
        add(b.get(), next_b[step], want_b[step]);
      }
      auto logits = forward_batch_persistent(m, rows, 16, outputs, plan, ex);
      ASSERT_TRUE(logits.ok()) << logits.status();
      ASSERT_EQ(logits->size(), want.size() * vocab);
      for (size_t r = 0; r < want.size(); ++r) {
        EXPECT_TRUE(SameBytes(logits->subspan(r * vocab, vocab), *want[r])) << "step " << step << " output " << r;
      }
      a_done += spans[step].size();
    }
    EXPECT_EQ(a->cached_len(), static_cast<int32_t>(prompt_a.size() + all_a.size()));
    EXPECT_EQ(b->cached_len(), static_cast<int32_t>(prompt_b.size() + next_b.size()));
    EXPECT_EQ(GetEngineCounters().graph_builds - builds0, 1) << "the second step rebuilt the plan";
  }
}

// The control: the same span with its rows in reverse order appends them at
// the other positions, so its logits must differ from the oracle's.
TEST(BatchDecodeTest, ASpanInAnotherOrderIsCaught) {
  Loaded l = Load(testing::TestDataPath("gemma3_tiny_swa.gguf"));
  ASSERT_NE(l.model, nullptr);
  const DecodeModel& m = *l.model;
  CpuExecutor ex(1);
  const std::vector<int32_t> prompt = {5, 9, 14}, span = {21, 7, 33, 12};
  auto oracle = NewKv(m, 16);
  ASSERT_TRUE(forward_with_kv_context(m, *oracle, prompt, false, ex).ok());
  auto want = forward_with_kv_context(m, *oracle, span, /*all_logits=*/true, ex);
  ASSERT_TRUE(want.ok()) << want.status();
  auto kv = NewKv(m, 16);
  ASSERT_TRUE(forward_with_kv_context(m, *kv, prompt, false, ex).ok());
  std::vector<DecodeRow> rows;
  for (auto it = span.rbegin(); it != span.rend(); ++it) rows.push_back({kv.get(), *it});
  DecodeSession plan;
  auto got = forward_batch_persistent(m, rows, 4, plan, ex);
  ASSERT_TRUE(got.ok()) << got.status();
  const size_t vocab = static_cast<size_t>(m.dims().vocab);
  // Row 0 now holds the last token at the first position: not the oracle's last row.
  EXPECT_FALSE(SameBytes(got->subspan(0, vocab), absl::MakeConstSpan(*want).subspan(3 * vocab, vocab)));
  EXPECT_FALSE(SameBytes(got->subspan(3 * vocab, vocab), absl::MakeConstSpan(*want).subspan(3 * vocab, vocab)));
}

// A team that lends threads to host work runs regions narrower
// (EngineOptions::lend_threads_to_host_work); nothing it computes may change,
// or a session's output would depend on what other clients asked for. Here
// the lent count changes all the time on another thread (so regions run 3, 2
// and 1 wide in no set order): the prefills, the D1 decodes and the batched
// steps must all equal the full-width team's byte for byte.
class LentThreadsFixtureTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(LentThreadsFixtureTest, ANarrowerTeamChangesNoLogit) {
  Loaded l = Load(testing::TestDataPath(GetParam().file));
  ASSERT_NE(l.model, nullptr);
  const std::vector<Stream> streams = MakeStreams(6, l.model->dims().vocab, /*long_extra=*/0, 11);
  constexpr int32_t kCapacity = 64;
  CpuExecutor full(3);
  const auto oracle = SoloOracle(*l.model, streams, kCapacity, full);
  ASSERT_EQ(oracle.size(), streams.size());
  std::atomic<int> lent{0};
  std::atomic<bool> stop{false};
  std::thread lender([&] {
    for (int i = 0; !stop.load(); ++i) {
      lent.store(i % 3);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  CpuExecutor lending(3, &lent);
  const auto narrowed = SoloOracle(*l.model, streams, kCapacity, lending);
  std::set<int> sizes;
  const int differing = RunBatched(*l.model, streams, oracle, kCapacity, lending, &sizes);
  stop = true;
  lender.join();
  ASSERT_EQ(narrowed.size(), oracle.size());
  for (size_t i = 0; i < oracle.size(); ++i) {
    ASSERT_EQ(narrowed[i].size(), oracle[i].size());
    for (size_t k = 0; k < oracle[i].size(); ++k) {
      EXPECT_TRUE(SameBytes(narrowed[i][k], oracle[i][k])) << "stream " << i << " step " << k;
    }
  }
  EXPECT_EQ(differing, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LentThreadsFixtureTest, ::testing::ValuesIn(kFixtures), FixtureName);

// The control: two rows' caches exchanged. Their logits must differ from the
// oracle (the comparison can fail, and a row reads the cache its table
// names); the other rows stay exact.
TEST(BatchDecodeTest, RowsWithExchangedCachesAreCaught) {
  Loaded l = Load(testing::TestDataPath("gemma3_tiny_swa.gguf"));
  ASSERT_NE(l.model, nullptr);
  CpuExecutor ex(1);
  const std::vector<Stream> streams = MakeStreams(6, l.model->dims().vocab, 0, 11);
  const auto oracle = SoloOracle(*l.model, streams, 64, ex);
  std::set<int> sizes;
  const int bad = RunBatched(*l.model, streams, oracle, 64, ex, &sizes, /*swap_caches=*/true);
  EXPECT_GT(bad, 0);
}

// The host-side checks run before anything: nothing is written to any cache.
TEST(BatchDecodeTest, BadRowsAreRefusedBeforeAnyWrite) {
  Loaded l = Load(testing::TestDataPath("gemma3_tiny_swa.gguf"));
  ASSERT_NE(l.model, nullptr);
  const DecodeModel& m = *l.model;
  CpuExecutor ex(1);
  auto a = NewKv(m, 16), b = NewKv(m, 16), full = NewKv(m, 2), one_left = NewKv(m, 3);
  ASSERT_TRUE(forward_with_kv_context(m, *full, std::vector<int32_t>{2, 3}, false, ex).ok());
  ASSERT_TRUE(forward_with_kv_context(m, *one_left, std::vector<int32_t>{2, 3}, false, ex).ok());
  DecodeSession plan;
  auto code = [&](std::vector<DecodeRow> rows, int32_t plan_rows) {
    return forward_batch_persistent(m, rows, plan_rows, plan, ex).status().code();
  };
  // A span of two rows on a cache with room for one.
  EXPECT_EQ(code({{a.get(), 2}, {one_left.get(), 3}, {one_left.get(), 4}}, 4), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(code({{a.get(), 2}, {b.get(), m.dims().vocab}}, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{a.get(), 2}, {b.get(), -1}}, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{a.get(), 2}, {full.get(), 3}}, 2), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(code({{a.get(), 2}, {b.get(), 3}}, 1), absl::StatusCode::kInvalidArgument);  // more rows than the plan
  EXPECT_EQ(code({}, 2), absl::StatusCode::kInvalidArgument);
  // Three rows want logits from a plan that computes two.
  EXPECT_EQ(forward_batch_persistent(m, std::vector<DecodeRow>{{a.get(), 2}, {b.get(), 3}, {b.get(), 4}}, 4, 2,
                                     plan, ex)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forward_batch_persistent(m, std::vector<DecodeRow>{{a.get(), 2}}, 4, 5, plan, ex).status().code(),
            absl::StatusCode::kInvalidArgument);  // more outputs than rows
  EXPECT_EQ(code({{a.get(), 2}, {nullptr, 3}}, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->cached_len(), 0);
  EXPECT_EQ(b->cached_len(), 0);
  EXPECT_EQ(full->cached_len(), 2);
  EXPECT_EQ(one_left->cached_len(), 2);
  // And a good step after them works (the refusals left the plan usable).
  EXPECT_TRUE(forward_batch_persistent(m, std::vector<DecodeRow>{{a.get(), 2}, {b.get(), 3}}, 4, plan, ex).ok());
  EXPECT_EQ(a->cached_len(), 1);
  EXPECT_EQ(b->cached_len(), 1);
}

// A batched rebind step is as allocation-free as the one-session step, and
// the padding rows write only the plan's own one-position cache.
TEST(BatchDecodeTest, BatchedRebindStepAllocatesNoHeapMemory) {
  Loaded l = Load(testing::TestDataPath("gemma3_tiny_swa.gguf"));
  ASSERT_NE(l.model, nullptr);
  const DecodeModel& m = *l.model;
  CpuExecutor ex(2);
  std::vector<std::unique_ptr<KvCache>> kv;
  for (int i = 0; i < 5; ++i) kv.push_back(NewKv(m, 64));
  DecodeSession plan;
  std::vector<DecodeRow> rows;
  for (int i = 0; i < 5; ++i) rows.push_back({kv[static_cast<size_t>(i)].get(), 2 + i});
  ASSERT_TRUE(forward_batch_persistent(m, rows, 8, plan, ex).ok());
  const int64_t before = testing::HeapAllocations();
  for (int t = 0; t < 10; ++t) {
    for (DecodeRow& r : rows) r.token = 3 + t;
    ASSERT_TRUE(forward_batch_persistent(m, rows, 8, plan, ex).ok());
  }
  EXPECT_EQ(testing::HeapAllocations() - before, 0);
  for (const auto& c : kv) EXPECT_EQ(c->cached_len(), 11);
  EXPECT_EQ(plan.pad_kv->cached_len(), 0);  // padding never commits
}

// The real model through the runtime API (BatchDecoder, the serving path):
// 16 contexts, two of them prefilled to 512 and 520 tokens so their decoding
// crosses Gemma 3's 512-token sliding window. The oracle is the one-session
// step (DecodeContext::Decode), itself byte-identical to D1 on this model
// (decode_driver_test's RealModelDriverTest); D1 per token over 16 streams
// would make this the slowest test of the suite under the sanitizers.
TEST(RealModelBatchDecodeTest, EveryRowIsByteIdenticalToItsSoloD1Decode) {
  DECODED_REQUIRE_REAL_MODEL();
  auto model = Model::Load(testing::RealModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  auto ex = CreateCpuExecutor(2);
#if defined(__SANITIZE_ADDRESS__)
  // Several times slower under the sanitizers: batch sizes 1..8 and no
  // window crossing there (the Release run covers 1..16 and the window).
  constexpr int kStreams = 8;
  constexpr bool kCrossWindow = false;
#else
  constexpr int kStreams = 16;
  constexpr bool kCrossWindow = true;
#endif
  constexpr int32_t kCapacity = 640;
  std::vector<Stream> streams = MakeStreams(kStreams, (*model)->info().vocab_size, /*long_extra=*/0, 5);
  // Two prompts end at the window (512, 520 tokens): the first decodes across
  // it, the second wholly past it (keys dropping out of local layers).
  for (int i = 7; kCrossWindow && i < kStreams; i += 8) streams[static_cast<size_t>(i)].prompt.resize(505 + i);
  // Session i joins at step i and leaves at step kStreams - 1 + i % 4: the
  // batch grows 1..kStreams, then shrinks as sessions leave mid-stream.
  for (int i = 0; i < kStreams; ++i) streams[static_cast<size_t>(i)].steps = kStreams + i % 4 - i;

  auto prefill = [&](DecodeContext& ctx, const std::vector<int32_t>& prompt) {
    absl::StatusOr<absl::Span<const float>> last;
    for (size_t p = 0; p < prompt.size(); p += kMaxPrefillChunk) {
      const size_t n = std::min<size_t>(kMaxPrefillChunk, prompt.size() - p);
      last = ctx.Prefill(absl::MakeConstSpan(prompt.data() + p, n), false, *ex);
      EXPECT_TRUE(last.ok()) << last.status();
    }
    return Argmax(*last);
  };

  std::vector<std::vector<std::vector<float>>> oracle(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    auto ctx = (*model)->NewContext(kCapacity);
    ASSERT_TRUE(ctx.ok());
    int32_t tok = prefill(**ctx, streams[static_cast<size_t>(i)].prompt);
    for (int k = 0; k < streams[static_cast<size_t>(i)].steps; ++k) {
      auto l = (*ctx)->Decode(tok, *ex);
      ASSERT_TRUE(l.ok()) << l.status();
      oracle[static_cast<size_t>(i)].emplace_back(l->begin(), l->end());
      tok = Argmax(*l);
    }
  }

  auto decoder = (*model)->NewBatchDecoder(kStreams);
  ASSERT_TRUE(decoder.ok());
  std::vector<std::unique_ptr<DecodeContext>> ctx;
  std::vector<int32_t> next;
  for (int i = 0; i < kStreams; ++i) {
    auto c = (*model)->NewContext(kCapacity);
    ASSERT_TRUE(c.ok());
    next.push_back(prefill(**c, streams[static_cast<size_t>(i)].prompt));
    ctx.push_back(*std::move(c));
  }
  std::vector<int> done(kStreams, 0);
  std::set<int> sizes;
  bool crossed = false;
  for (int step = 0;; ++step) {
    std::vector<int> active;
    bool more = false;
    for (int i = 0; i < kStreams; ++i) {
      if (streams[static_cast<size_t>(i)].join <= step && done[i] < streams[static_cast<size_t>(i)].steps) {
        active.push_back(i);
      }
      more |= done[i] < streams[static_cast<size_t>(i)].steps;
    }
    if (!more) break;
    if (active.empty()) continue;
    if (step % 2 == 1) std::reverse(active.begin(), active.end());
    std::vector<DecodeContext*> rows;
    std::vector<int32_t> tokens;
    for (int i : active) {
      rows.push_back(ctx[static_cast<size_t>(i)].get());
      tokens.push_back(next[static_cast<size_t>(i)]);
      crossed |= ctx[static_cast<size_t>(i)]->cached_len() == 512;
    }
    auto logits = (*decoder)->Decode(rows, tokens, *ex);
    ASSERT_TRUE(logits.ok()) << logits.status();
    sizes.insert(static_cast<int>(rows.size()));
    const size_t vocab = static_cast<size_t>((*model)->info().vocab_size);
    for (size_t r = 0; r < active.size(); ++r) {
      const size_t i = static_cast<size_t>(active[r]);
      const std::vector<float>& want = oracle[i][static_cast<size_t>(done[i])];
      EXPECT_TRUE(SameBytes(logits->subspan(r * vocab, vocab), want))
          << "stream " << i << " step " << done[i] << " in a batch of " << rows.size();
      next[i] = Argmax(want);
      ++done[i];
    }
  }
  EXPECT_TRUE(crossed || !kCrossWindow) << "no session decoded across the 512-token window";
  for (int b = 1; b <= kStreams; ++b) EXPECT_TRUE(sizes.count(b)) << "no step ran " << b << " rows";
  EXPECT_GT((*decoder)->bound_nodes(), 0);
  (*decoder)->Release();
  EXPECT_EQ((*decoder)->bound_nodes(), 0);
}

}  // namespace
}  // namespace decoded
