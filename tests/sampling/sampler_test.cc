#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/counting_allocator.h"
#include "tests/common/per_cpu_isa.h"

namespace decoded {
namespace {

SamplingParams Params(float temperature, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

// Logits whose softmax is exactly `probs` (up to float rounding).
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::vector<float> PseudoRandomLogits(int n, uint32_t seed) {
  std::vector<float> l(n);
  uint32_t s = seed;
  for (float& v : l) {
    s = s * 1664525u + 1013904223u;  // Numerical Recipes LCG: independent of the sampler's RNG
    v = static_cast<float>(s >> 8) / static_cast<float>(1 << 24) * 8.0f - 4.0f;
  }
  return l;
}

std::vector<int32_t> Draws(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p, static_cast<int32_t>(logits.size()));
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.Sample(logits).id);
  return out;
}

TEST(SamplerTest, GreedyPicksTheLargestLogit) {
  Sampler s(Params(0.0f), 5);
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 2.5f, -1.0f, 2.4f, 0.0f}).id, 1);
  EXPECT_EQ(s.Sample(std::vector<float>{-3.0f, -2.0f, -9.0f}).id, 1);
}

TEST(SamplerTest, GreedyBreaksTiesTowardTheLowerId) {
  Sampler s(Params(0.0f), 4);
  EXPECT_EQ(s.Sample(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}).id, 1);
}

TEST(SamplerTest, GreedyOnVocabularySizedRowFindsPlantedMaximum) {
  std::vector<float> logits = PseudoRandomLogits(262144, 7);
  logits[200001] = 5.0f;  // above the generator's range [-4, 4)
  Sampler s(Params(0.0f), 262144);
  EXPECT_EQ(s.Sample(logits).id, 200001);
}

// 1e-40 is a float subnormal: 1 / T is inf, and a draw at that temperature
// found an end-of-text token far down the row (an outside tester's report).
// Below kGreedyTemperature a draw is the argmax, whatever the seed.
TEST(SamplerTest, SubnormalAndTinyTemperaturesAreGreedy) {
  const std::vector<float> logits = PseudoRandomLogits(5000, 13);
  Sampler greedy(Params(0.0f), 5000);
  const int32_t argmax = greedy.Sample(logits).id;
  for (float t : {1e-40f, 1e-30f, 9e-6f}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      SamplingParams p = Params(t);
      p.seed = seed;
      Sampler s(p, 5000);
      EXPECT_EQ(s.Sample(logits).id, argmax) << t << " seed " << seed;
    }
  }
}

TEST(SamplerTest, NanLogitsAreNeverChosen) {
  const float nan = std::nanf("");
  Sampler s(Params(0.0f), 3);
  EXPECT_EQ(s.Sample(std::vector<float>{nan, 1.0f, nan}).id, 1);
  const std::vector<int32_t> draws = Draws(Params(1.0f), {nan, 0.0f, nan, 0.0f}, 200);
  for (int32_t id : draws) EXPECT_TRUE(id == 1 || id == 3) << id;
}

TEST(SamplerTest, SameSeedGivesSameSequence) {
  const std::vector<float> logits = PseudoRandomLogits(1000, 3);
  EXPECT_EQ(Draws(Params(1.0f, 42), logits, 64), Draws(Params(1.0f, 42), logits, 64));
}

TEST(SamplerTest, DifferentSeedsGiveDifferentSequences) {
  const std::vector<float> logits(1000, 0.0f);  // uniform: 64 equal draws have chance 1000^-64
  EXPECT_NE(Draws(Params(1.0f, 42), logits, 64), Draws(Params(1.0f, 43), logits, 64));
}

TEST(SamplerTest, TopKOfOneEqualsGreedy) {
  const std::vector<float> logits = PseudoRandomLogits(5000, 11);
  Sampler greedy(Params(0.0f), 5000);
  const int32_t argmax = greedy.Sample(logits).id;
  SamplingParams p = Params(1.5f, 9);
  p.top_k = 1;
  for (int32_t id : Draws(p, logits, 200)) EXPECT_EQ(id, argmax);
}

// top_k at or above the vocabulary size filters nothing: draws follow the
// unfiltered distribution, same seed, same tokens.
TEST(SamplerTest, TopKAtLeastTheVocabularyIsNoFilter) {
  const std::vector<float> logits = PseudoRandomLogits(300, 4);
  SamplingParams off = Params(1.0f, 21);
  const std::vector<int32_t> want = Draws(off, logits, 200);
  for (int32_t k : {300, 301, 1 << 30}) {
    SamplingParams p = off;
    p.top_k = k;
    EXPECT_EQ(Draws(p, logits, 200), want) << "top_k " << k;
  }
}

TEST(SamplerTest, TopKRestrictsDrawsToTheKBest) {
  // Flat logits except three clear leaders; top_k = 3 must never leave them.
  std::vector<float> logits(100, 0.0f);
  logits[10] = 0.3f;
  logits[50] = 0.2f;
  logits[90] = 0.1f;
  SamplingParams p = Params(1.0f, 5);
  p.top_k = 3;
  std::vector<int> seen(100, 0);
  for (int32_t id : Draws(p, logits, 3000)) ++seen[id];
  for (int i = 0; i < 100; ++i) {
    if (i == 10 || i == 50 || i == 90) {
      EXPECT_GT(seen[i], 0) << i;
    } else {
      EXPECT_EQ(seen[i], 0) << i;
    }
  }
}

TEST(SamplerTest, TinyTopPKeepsOnlyTheTopToken) {
  const std::vector<float> logits = PseudoRandomLogits(262144, 5);
  Sampler greedy(Params(0.0f), 262144);
  const int32_t argmax = greedy.Sample(logits).id;
  SamplingParams p = Params(1.0f, 3);
  p.top_p = 1e-6f;
  for (int32_t id : Draws(p, logits, 20)) EXPECT_EQ(id, argmax);
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  const std::vector<float> logits = LogitsOf({0.05, 0.5, 0.15, 0.3});  // sorted: 1, 3, 2, 0
  SamplingParams p = Params(1.0f, 8);
  p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.8 -> {1, 3}
  std::vector<int> seen(4, 0);
  for (int32_t id : Draws(p, logits, 4000)) ++seen[id];
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[3], 0);
  EXPECT_EQ(seen[2], 0);
  EXPECT_EQ(seen[0], 0);
  p.top_p = 0.85f;  // 0.8 < 0.85 <= 0.95 -> {1, 3, 2}
  seen.assign(4, 0);
  for (int32_t id : Draws(p, logits, 4000)) ++seen[id];
  EXPECT_GT(seen[2], 0);
  EXPECT_EQ(seen[0], 0);
}

TEST(SamplerTest, TopPWithoutTopKOnLargeVocabularyKeepsAWideNucleus) {
  // 262144 equal logits: top_p = 0.5 keeps the first half (ties -> lower ids),
  // which needs several growth rounds of the sorted prefix.
  const std::vector<float> logits(262144, 0.0f);
  SamplingParams p = Params(1.0f, 21);
  p.top_p = 0.5f;
  for (int32_t id : Draws(p, logits, 10)) EXPECT_LT(id, 131073);
}

TEST(SamplerTest, MinPDropsTokensBelowTheFractionOfTheBest) {
  const std::vector<float> logits = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = Params(1.0f, 4);
  p.min_p = 0.2f;  // threshold 0.1: keeps 0, 1, 2
  std::vector<int> seen(4, 0);
  for (int32_t id : Draws(p, logits, 4000)) ++seen[id];
  EXPECT_GT(seen[2], 0);
  EXPECT_EQ(seen[3], 0);
  p.min_p = 0.5f;  // threshold 0.25: keeps 0, 1
  seen.assign(4, 0);
  for (int32_t id : Draws(p, logits, 4000)) ++seen[id];
  EXPECT_GT(seen[1], 0);
  EXPECT_EQ(seen[2], 0);
  EXPECT_EQ(seen[3], 0);
}

// Pearson chi-square of `n` draws against the softmax of logits / temperature,
// the expected probabilities computed here in double with std::exp.
double ChiSquare(const std::vector<float>& logits, float temperature, float draw_temperature, int n,
                 uint64_t seed) {
  std::vector<double> expected(logits.size());
  double z = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) z += expected[i] = std::exp(logits[i] / temperature);
  std::vector<int> seen(logits.size(), 0);
  for (int32_t id : Draws(Params(draw_temperature, seed), logits, n)) ++seen[id];
  double chi2 = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = n * expected[i] / z;
    chi2 += (seen[i] - e) * (seen[i] - e) / e;
  }
  return chi2;
}

// 6 categories -> 5 degrees of freedom; the 0.9999 quantile of chi^2(5) is
// 25.745 (standard tables, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4), so a
// correct sampler fails this with probability 1e-4 per seed, and the seeds are
// fixed. A sampler at the wrong temperature scores in the thousands (checked
// below), so the bound is far from what distinguishes right from wrong.
constexpr double kChi2Df5Quantile9999 = 25.745;

TEST(SamplerTest, EmpiricalFrequenciesAtTemperatureOneMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f};
  EXPECT_LT(ChiSquare(logits, 1.0f, 1.0f, 200000, 12345), kChi2Df5Quantile9999);
}

TEST(SamplerTest, EmpiricalFrequenciesAtTemperatureHalfMatchSharpenedSoftmax) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f};
  EXPECT_LT(ChiSquare(logits, 0.5f, 0.5f, 200000, 777), kChi2Df5Quantile9999);
}

TEST(SamplerTest, ChiSquareDetectsAWrongTemperature) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f};
  EXPECT_GT(ChiSquare(logits, 1.0f, 0.8f, 200000, 12345), 100 * kChi2Df5Quantile9999);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 2.0f;
  Sampler s(p, 4);
  s.Accept(0);
  s.Accept(1);
  s.Accept(1);  // count does not matter for the repetition penalty
  std::vector<float> logits = {3.0f, -1.5f, 1.0f, -2.0f};
  s.ApplyPenalties(absl::MakeSpan(logits));
  EXPECT_EQ(logits, (std::vector<float>{1.5f, -3.0f, 1.0f, -2.0f}));
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesSubtractPerCount) {
  SamplingParams p = Params(0.0f);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 3);
  s.Accept(0);
  s.Accept(2);
  s.Accept(2);
  s.Accept(2);
  std::vector<float> logits = {1.0f, 1.0f, 1.0f};
  s.ApplyPenalties(absl::MakeSpan(logits));
  // id 0: 1 - 0.5 - 0.25*1; id 2: 1 - 0.5 - 0.25*3.
  EXPECT_EQ(logits, (std::vector<float>{0.25f, 1.0f, -0.25f}));
}

// Prompt tokens get the repetition penalty (HF, vLLM) but not presence or
// frequency penalties, which count sampled tokens (OpenAI's formula, vLLM).
TEST(SamplerTest, PromptTokensGetOnlyTheRepetitionPenalty) {
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 4);
  s.AcceptPrompt(0);
  s.AcceptPrompt(0);
  s.AcceptPrompt(1);
  s.Accept(1);
  s.Accept(2);
  s.AcceptPrompt(2);  // after Accept: still counted once
  std::vector<float> logits = {3.0f, -1.5f, 1.0f, 1.0f};
  s.ApplyPenalties(absl::MakeSpan(logits));
  // id 0: 3 / 2; id 1: -1.5 * 2 - 0.5 - 0.25; id 2: 1 / 2 - 0.5 - 0.25; id 3 unseen.
  EXPECT_EQ(logits, (std::vector<float>{1.5f, -3.75f, -0.25f, 1.0f}));
  // Only presence and frequency set: the prompt's tokens keep their logits.
  SamplingParams q = Params(0.0f);
  q.presence_penalty = 2.0f;
  q.frequency_penalty = 2.0f;
  Sampler t(q, 2);
  for (int i = 0; i < 5; ++i) t.AcceptPrompt(0);
  EXPECT_EQ(t.Sample(std::vector<float>{3.0f, 2.0f}).id, 0);
  t.Accept(0);
  EXPECT_EQ(t.Sample(std::vector<float>{3.0f, 2.0f}).id, 1);  // 3 - 2 - 2 < 2
}

TEST(SamplerTest, PenaltiesChangeTheGreedyChoice) {
  SamplingParams p = Params(0.0f);
  p.frequency_penalty = 0.6f;
  Sampler s(p, 2);
  const std::vector<float> logits = {3.0f, 2.0f};
  EXPECT_EQ(s.Sample(logits).id, 0);
  s.Accept(0);
  EXPECT_EQ(s.Sample(logits).id, 0);  // 2.4 > 2
  s.Accept(0);
  EXPECT_EQ(s.Sample(logits).id, 1);  // 1.8 < 2
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmaxEvenWithPenalties) {
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 3.0f;
  p.top_logprobs = 3;
  Sampler s(p, 5);
  s.Accept(3);
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 2.5f, 1.0f};
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  const SampleResult r = s.Sample(logits);
  EXPECT_EQ(r.id, 2);  // 2.5 / 3 < 2.0
  EXPECT_NEAR(r.logprob, 2.0 - std::log(z), 1e-5);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].id, 3);
  EXPECT_NEAR(r.top[0].logprob, 2.5 - std::log(z), 1e-5);
  EXPECT_EQ(r.top[1].id, 2);
  EXPECT_EQ(r.top[2].id, 4);
  EXPECT_NEAR(r.top[2].logprob, 1.0 - std::log(z), 1e-5);
}

// OpenAI's logit_bias, added before the penalties as llama.cpp's sampler
// chain does: with the other order the greedy choice below would be id 0.
TEST(SamplerTest, LogitBiasIsAddedBeforeThePenalties) {
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{0, 2.0f}, {7, 50.0f}};  // id 7 lies beyond the row: ignored
  Sampler s(p, 2);
  s.Accept(0);
  std::vector<float> logits = {4.0f, 3.5f};
  s.ApplyLogitBias(absl::MakeSpan(logits));
  EXPECT_EQ(logits, (std::vector<float>{6.0f, 3.5f}));
  // (4 + 2) / 2 = 3 < 3.5; penalty first would give 4 / 2 + 2 = 4 > 3.5.
  const std::vector<float> row = {4.0f, 3.5f};
  EXPECT_EQ(s.Sample(row).id, 1);
}

TEST(SamplerTest, LogitBiasOfPlusOrMinusOneHundredForcesOrBansAToken) {
  const std::vector<float> logits = PseudoRandomLogits(1000, 7);  // within [-4, 4)
  SamplingParams forced = Params(1.0f, 11);
  forced.logit_bias = {{123, 100.0f}};
  for (int32_t id : Draws(forced, logits, 200)) EXPECT_EQ(id, 123);
  const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  SamplingParams banned = Params(0.0f);
  banned.logit_bias = {{best, -100.0f}};
  Sampler s(banned, 1000);
  const SampleResult r = s.Sample(logits);
  EXPECT_NE(r.id, best);
  std::vector<float> rest = logits;
  rest[best] = -1e30f;
  EXPECT_EQ(r.id, std::max_element(rest.begin(), rest.end()) - rest.begin());
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmaxEvenWithALogitBias) {
  SamplingParams p = Params(0.0f);
  p.top_logprobs = 2;
  p.logit_bias = {{1, 5.0f}};
  Sampler s(p, 3);
  const std::vector<float> logits = {2.0f, 0.0f, 1.0f};
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  const SampleResult r = s.Sample(logits);
  EXPECT_EQ(r.id, 1);
  EXPECT_NEAR(r.logprob, 0.0 - std::log(z), 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].id, 0);
  EXPECT_EQ(r.top[1].id, 2);
}

TEST(SamplerTest, LogprobOverVocabularySizedRowMatchesDoubleReference) {
  const std::vector<float> logits = PseudoRandomLogits(262144, 99);
  double max = -1e30;
  for (float l : logits) max = std::max<double>(max, l);
  double z = 0.0;
  for (float l : logits) z += std::exp(l - max);
  Sampler s(Params(1.0f, 2), 262144);
  const SampleResult r = s.Sample(logits);
  EXPECT_NEAR(r.logprob, logits[r.id] - max - std::log(z), 1e-5);
}

TEST(SamplerTest, SampleDoesNotAllocateAfterTheFirstCall) {
  const std::vector<float> logits = PseudoRandomLogits(262144, 1);
  for (float temperature : {0.0f, 0.8f}) {
    SamplingParams p = Params(temperature, 5);
    p.top_k = 40;
    p.top_p = 0.9f;
    p.min_p = 0.05f;
    p.repetition_penalty = 1.1f;
    Sampler s(p, 262144);
    s.Accept(3);
    s.Sample(logits);
    const int64_t before = testing::HeapAllocations();
    for (int i = 0; i < 5; ++i) s.Sample(logits);
    EXPECT_EQ(testing::HeapAllocations() - before, 0) << "temperature " << temperature;
  }
}

TEST(SamplerTest, EmptyLogitsYieldNoToken) {
  Sampler s(Params(1.0f), 0);
  EXPECT_EQ(s.Sample({}).id, -1);
}

// Edge rows against plain reference loops, on every kernel tier: the sampler
// reads the row through per-tier kernels (row_kernels.h), so ties, NaN, -inf,
// +inf, lengths around the kernels' vector (16) and block (128) sizes and
// hits at consecutive ids are checked on each.
class SamplerEdgeRows : public testing::PerCpuIsaTest {};
DECODED_INSTANTIATE_PER_CPU_ISA(SamplerEdgeRows);

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr size_t kEdgeLengths[] = {1, 2, 15, 16, 17, 31, 127, 128, 129, 255, 256, 257, 1000};

// Rows of few distinct values (many ties), with NaN / -inf / +inf sprinkled
// in according to `kind` (0: none, 1: NaN and -inf, 2: also +inf).
std::vector<float> TieHeavyRow(size_t n, uint32_t seed, int kind) {
  std::vector<float> l(n);
  uint32_t s = seed;
  for (float& v : l) {
    s = s * 1664525u + 1013904223u;
    const uint32_t r = s >> 24;  // 0..255
    v = static_cast<float>(static_cast<int>(r % 7) - 3);
    if (kind >= 1 && r >= 230 && r < 243) v = std::nanf("");
    if (kind >= 1 && r >= 243 && r < 252) v = -kInfF;
    if (kind >= 2 && r >= 252) v = kInfF;
  }
  return l;
}

float Sanitized(float v) { return std::isnan(v) ? -kInfF : v; }

// Ids best first, lower id first among equal values, NaN as -inf.
std::vector<int32_t> RankedIds(const std::vector<float>& x) {
  std::vector<int32_t> ids(x.size());
  for (size_t i = 0; i < x.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return Sanitized(x[a]) > Sanitized(x[b]); });
  return ids;
}

int32_t PlainArgmax(const std::vector<float>& x) {
  int32_t best = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    if (Sanitized(x[i]) > Sanitized(x[best])) best = static_cast<int32_t>(i);
  }
  return best;
}

TEST_P(SamplerEdgeRows, GreedyIsThePlainFirstArgmax) {
  for (size_t n : kEdgeLengths) {
    for (int kind : {0, 1, 2}) {
      for (uint32_t seed = 1; seed <= 5; ++seed) {
        const std::vector<float> x = TieHeavyRow(n, seed * 31 + static_cast<uint32_t>(n), kind);
        Sampler s(Params(0.0f), static_cast<int32_t>(n));
        EXPECT_EQ(s.Sample(x).id, PlainArgmax(x)) << "n " << n << " kind " << kind << " seed " << seed;
      }
    }
  }
}

TEST_P(SamplerEdgeRows, PlusInfinityWinsAtAnyTemperatureLowestIdFirst) {
  for (size_t n : {size_t{3}, size_t{17}, size_t{300}}) {
    std::vector<float> x(n, 1.0f);
    x[0] = std::nanf("");
    x[n - 1] = kInfF;
    x[n / 2] = kInfF;
    for (float t : {0.0f, 1.0f}) {
      SamplingParams p = Params(t, 3);
      p.top_k = t > 0.0f ? 2 : 0;
      Sampler s(p, static_cast<int32_t>(n));
      for (int i = 0; i < 5; ++i) EXPECT_EQ(s.Sample(x).id, static_cast<int32_t>(n / 2)) << n << " T " << t;
    }
  }
}

TEST_P(SamplerEdgeRows, EveryLogitNanOrMinusInfinityGivesIdZero) {
  const float nan = std::nanf("");
  for (size_t n : {size_t{1}, size_t{16}, size_t{33}, size_t{300}}) {
    std::vector<float> all_nan(n, nan), all_neg(n, -kInfF), mixed(n, nan);
    for (size_t i = 1; i < n; i += 2) mixed[i] = -kInfF;
    for (const std::vector<float>* x : {&all_nan, &all_neg, &mixed}) {
      for (float t : {0.0f, 0.7f}) {
        for (int k : {0, 2}) {
          for (bool penalised : {false, true}) {
            SamplingParams p = Params(t, 4);
            p.top_k = k;
            p.top_p = 0.9f;
            p.repetition_penalty = penalised ? 1.3f : 1.0f;
            Sampler s(p, static_cast<int32_t>(n));
            s.Accept(0);
            const SampleResult r = s.Sample(*x);
            EXPECT_EQ(r.id, 0) << n << " T " << t << " k " << k << " penalised " << penalised;
            EXPECT_EQ(r.logprob, -kInfF);
          }
        }
      }
    }
  }
}

// Draws under top-k cover exactly the k best ids (lower ids first at the k-th
// value), with ties placed at vector/block boundaries and next to each other.
TEST_P(SamplerEdgeRows, TopKKeepsExactlyTheKBestWithLowestIdsAtTheKthValue) {
  for (size_t n : {size_t{20}, size_t{129}, size_t{300}, size_t{1000}}) {
    for (int kind : {0, 1}) {
      std::vector<float> x = TieHeavyRow(n, 77 + static_cast<uint32_t>(n), kind);
      // Consecutive hits across a 128-element block edge and a 16-lane edge.
      for (size_t at : {size_t{15}, size_t{16}, size_t{127}, size_t{128}, size_t{129}}) {
        if (at < n) x[at] = 3.0f;
      }
      const std::vector<int32_t> ranked = RankedIds(x);
      for (size_t k : {size_t{1}, size_t{3}, size_t{7}, n / 3}) {
        if (k == 0 || k >= n) continue;
        std::vector<int> want(n, 0);
        for (size_t j = 0; j < k; ++j) {
          if (Sanitized(x[ranked[j]]) > -kInfF) want[ranked[j]] = 1;  // -inf has weight 0
        }
        SamplingParams p = Params(1000.0f, 9);  // nearly uniform over the kept ids
        p.top_k = static_cast<int32_t>(k);
        std::vector<int> seen(n, 0);
        for (int32_t id : Draws(p, x, 4000 + 200 * static_cast<int>(k))) ++seen[id];
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(seen[i] > 0, want[i] == 1) << "n " << n << " kind " << kind << " k " << k << " id " << i;
        }
      }
    }
  }
}

// top: the first `want` ids of the plain ranking of the raw row (NaN as -inf,
// lower id first on ties), with and without penalties; logprob of the chosen
// id against a double-precision log-normaliser.
TEST_P(SamplerEdgeRows, TopLogprobsAreThePlainRankingOfTheRawRow) {
  for (size_t n : kEdgeLengths) {
    for (int kind : {0, 1, 2}) {
      std::vector<float> x = TieHeavyRow(n, 5 + static_cast<uint32_t>(n), kind);
      if (kind == 1 && n > 4) {
        for (size_t i = 0; i < 4; ++i) x[i] = std::nanf("");  // the initial fill is all -inf
      }
      double max = -kInfF;
      for (float v : x) max = std::max<double>(max, Sanitized(v));
      double z = 0.0;
      for (float v : x) z += std::exp(Sanitized(v) - max);
      const double log_z = max + std::log(z);
      const std::vector<int32_t> ranked = RankedIds(x);
      for (int want : {1, 4, 20}) {
        for (bool penalised : {false, true}) {
          SamplingParams p = Params(0.0f);
          p.top_logprobs = want;
          p.repetition_penalty = penalised ? 2.0f : 1.0f;  // must not change what is reported
          Sampler s(p, static_cast<int32_t>(n));
          s.Accept(ranked[0]);
          const SampleResult r = s.Sample(x);
          const std::string where = "n " + std::to_string(n) + " kind " + std::to_string(kind) + " want " +
                                    std::to_string(want) + (penalised ? " penalised" : "");
          if (std::isfinite(log_z)) {
            EXPECT_NEAR(r.logprob, Sanitized(x[r.id]) - log_z, 1e-5) << where;
          }
          ASSERT_EQ(r.top.size(), std::min<size_t>(want, n)) << where;
          for (size_t j = 0; j < r.top.size(); ++j) {
            EXPECT_EQ(r.top[j].id, ranked[j]) << where << " rank " << j;
            const double v = Sanitized(x[ranked[j]]);
            if (std::isfinite(log_z) && std::isfinite(v)) {
              EXPECT_NEAR(r.top[j].logprob, v - log_z, 1e-5) << where << " rank " << j;
            }
          }
        }
      }
    }
  }
}

// Penalties rewrite a copy: the caller's row is untouched and the next call
// starts again from the raw values (no penalty applied twice).
TEST_P(SamplerEdgeRows, PenaltiesDoNotAccumulateAcrossCalls) {
  SamplingParams p = Params(0.0f);
  p.presence_penalty = 1.5f;
  Sampler s(p, 40);
  std::vector<float> x(40, 0.0f);
  x[3] = 2.0f;   // 0.5 after the penalty
  x[37] = 1.0f;  // unpenalised runner-up
  x[20] = std::nanf("");
  const std::vector<float> copy = x;
  s.Accept(3);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.Sample(x).id, 37) << i;
  for (size_t i = 0; i < x.size(); ++i) {
    if (i != 20) {
      EXPECT_EQ(x[i], copy[i]) << i;
    }
  }
  EXPECT_TRUE(std::isnan(x[20]));
}

// The in-place paths (no NaN, no penalties) and the copy paths alike reuse
// the scratch of the first call, also for a later shorter row.
TEST_P(SamplerEdgeRows, NoAllocationAfterTheFirstCallOnEveryPath) {
  const std::vector<float> clean = PseudoRandomLogits(4099, 2);
  std::vector<float> with_nan = clean;
  with_nan[7] = std::nanf("");
  with_nan[4098] = std::nanf("");
  struct Case {
    float t;
    int k;
    float top_p;
    float min_p;
  };
  for (const Case& c : {Case{0.0f, 0, 1.0f, 0.0f}, Case{0.9f, 0, 1.0f, 0.0f}, Case{0.9f, 50, 1.0f, 0.0f},
                        Case{0.9f, 0, 0.8f, 0.0f}, Case{0.9f, 0, 1.0f, 0.1f}}) {
    SamplingParams p = Params(c.t, 6);
    p.top_k = c.k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    Sampler s(p, 4099);
    s.Sample(clean);
    const int64_t before = testing::HeapAllocations();
    s.Sample(clean);
    s.Sample(with_nan);
    s.Sample(absl::MakeConstSpan(with_nan.data(), 100));
    EXPECT_EQ(testing::HeapAllocations() - before, 0) << "T " << c.t << " k " << c.k << " p " << c.top_p;
  }
}

struct InvalidCase {
  const char* field;
  void (*corrupt)(SamplingParams&);
};

TEST(ValidateSamplingParamsTest, DefaultsAreValid) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  SamplingParams edge;
  edge.temperature = 2.0f;
  edge.top_k = 50;
  edge.top_p = 1.0f;
  edge.min_p = 0.0f;
  edge.presence_penalty = -2.0f;
  edge.frequency_penalty = 2.0f;
  edge.top_logprobs = 20;
  edge.logit_bias.assign(kMaxLogitBias, {5, -100.0f});
  edge.logit_bias[0].second = 100.0f;
  EXPECT_TRUE(ValidateSamplingParams(edge).ok());
}

TEST(ValidateSamplingParamsTest, EachInvalidFieldIsNamed) {
  const InvalidCase cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = INFINITY; }},
      {"temperature", [](SamplingParams& p) { p.temperature = NAN; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -1; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = NAN; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = -1.0f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = NAN; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -2.01f; }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = -1; }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = 21; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{3, 100.5f}}; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{3, -101.0f}}; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{3, NAN}}; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{3, -INFINITY}}; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias.assign(kMaxLogitBias + 1, {3, 1.0f}); }},
  };
  for (const InvalidCase& c : cases) {
    SamplingParams p;
    c.corrupt(p);
    const absl::Status st = ValidateSamplingParams(p);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(std::string(st.message()).find(c.field), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace decoded
