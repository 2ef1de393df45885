// The CPU kernels of the FFN, norm, bias, RoPE, MoE and per-head (MLA) ops
// against their formulas written out independently here (papers / HF
// modeling code), in double; and the CPU backend's lowering of matmuls into
// activation quantization plus the quantized kernel.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/kernels.h"
#include "engine/engine_counters.h"
#include "engine/graph/optimizer.h"
#include "engine/kv_rows.h"
#include "engine/quant/quant.h"
#include "gtest/gtest.h"
#include "tests/common/per_cpu_isa.h"

namespace decoded::cpu {
namespace {

// Every kernel test runs once per instruction-set tier this CPU supports.
class CpuKernelsTest : public testing::PerCpuIsaTest {};
class MoeKernelTest : public testing::PerCpuIsaTest {};
class CpuPlanTest : public testing::PerCpuIsaTest {};
DECODED_INSTANTIATE_PER_CPU_ISA(CpuKernelsTest);
DECODED_INSTANTIATE_PER_CPU_ISA(MoeKernelTest);
DECODED_INSTANTIATE_PER_CPU_ISA(CpuPlanTest);

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST_P(CpuKernelsTest, SiluMulIsSiluOfGateTimesUp) {
  const int64_t n = 5000;  // above the split threshold: two threads share it
  std::vector<float> a = Random(n, 1), b = Random(n, 2);
  // Past the exponential's clamps (e^-x overflows f32 below -88.7) and at 0.
  const float extremes[] = {-1000.0f, -150.0f, -88.5f, -87.5f, -30.0f, 0.0f, 30.0f, 87.5f, 88.5f, 150.0f, 1000.0f};
  std::copy(std::begin(extremes), std::end(extremes), a.begin());
  std::vector<float> out(n, -1.0f);
  for (int ith = 0; ith < 2; ++ith) SiluMul(a.data(), b.data(), out.data(), n, ith, 2);
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i];
    const double want = x * (1.0 / (1.0 + std::exp(-x))) * b[i];  // HF ACT2FN["silu"](gate) * up
    ASSERT_NEAR(out[i], want, 1e-5 * (1.0 + std::abs(want))) << i;
  }
}

// HF "gelu_new" (activations.py NewGELUActivation), used by Phi-2's MLP.
TEST_P(CpuKernelsTest, GeluIsHfGeluNew) {
  const int64_t n = 5000;
  std::vector<float> x = Random(n, 7);
  x[0] = 0.0f;
  x[1] = -30.0f;
  x[2] = 30.0f;
  std::vector<float> out(n, -1.0f);
  for (int ith = 0; ith < 2; ++ith) Gelu(x.data(), out.data(), n, ith, 2);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double inner = std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * std::pow(v, 3.0));
    const double want = 0.5 * v * (1.0 + std::tanh(inner));
    ASSERT_NEAR(out[i], want, 1e-5 * (1.0 + std::abs(want))) << i;
  }
}

// torch.nn.LayerNorm: (x - E[x]) / sqrt(Var[x] + eps) * weight + bias, with
// the biased variance, per group; rows with a large mean must not cancel.
TEST_P(CpuKernelsTest, LayerNormRowsIsTorchLayerNorm) {
  const int64_t rows = 3, cols = 2048, group = 1024;  // above the split threshold: two threads share it
  std::vector<float> x = Random(rows * cols, 8);
  for (int64_t i = 0; i < rows * cols; ++i) x[i] += 100.0f * static_cast<float>(i / group);
  const std::vector<float> w = Random(group, 9), b = Random(group, 10);
  const float eps = 1e-5f;
  for (const bool with_bias : {true, false}) {
    std::vector<float> out(x.size(), -1.0f);
    for (int ith = 0; ith < 2; ++ith) {
      LayerNormRows(x.data(), w.data(), with_bias ? b.data() : nullptr, out.data(), rows, cols, group, eps, ith, 2);
    }
    for (int64_t g = 0; g < rows * cols / group; ++g) {
      const float* xs = x.data() + g * group;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < group; ++i) mean += xs[i];
      mean /= group;
      for (int64_t i = 0; i < group; ++i) var += (xs[i] - mean) * (xs[i] - mean);
      var /= group;
      for (int64_t i = 0; i < group; ++i) {
        const double want = (xs[i] - mean) / std::sqrt(var + eps) * w[i] + (with_bias ? b[i] : 0.0);
        ASSERT_NEAR(out[g * group + i], want, 1e-4 * (1.0 + std::abs(want))) << g << " " << i << " " << with_bias;
      }
    }
  }
}

TEST_P(CpuKernelsTest, AddRowBroadcastsTheBiasOverRows) {
  const int64_t rows = 3, cols = 7;
  const std::vector<float> x = Random(rows * cols, 3), bias = Random(cols, 4);
  std::vector<float> out(rows * cols);
  AddRow(x.data(), bias.data(), out.data(), rows, cols, 0, 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(out[r * cols + c], x[r * cols + c] + bias[c]);
  }
}

// cos/sin tables [seq, half] for positions 0..seq-1 (the driver's layout).
void Tables(int64_t seq, int32_t head_dim, double base, std::vector<float>* cos, std::vector<float>* sin) {
  const int32_t half = head_dim / 2;
  for (int64_t t = 0; t < seq; ++t) {
    for (int32_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * std::pow(base, -2.0 * i / head_dim);
      cos->push_back(static_cast<float>(std::cos(angle)));
      sin->push_back(static_cast<float>(std::sin(angle)));
    }
  }
}

TEST_P(CpuKernelsTest, RopeAdjacentRotatesNeighbouringPairsAsRoFormer) {
  const int64_t seq = 3;
  const int32_t heads = 2, hd = 8, half = hd / 2;
  std::vector<float> cos, sin;
  Tables(seq, hd, 10000.0, &cos, &sin);
  const std::vector<float> x = Random(seq * heads * hd, 5);
  std::vector<float> out(x.size());
  RopeAdjacent(x.data(), cos.data(), sin.data(), out.data(), seq, heads, hd, hd, 0, 1);
  for (int64_t t = 0; t < seq; ++t) {
    for (int32_t h = 0; h < heads; ++h) {
      const float* xs = x.data() + (t * heads + h) * hd;
      const float* o = out.data() + (t * heads + h) * hd;
      for (int32_t i = 0; i < half; ++i) {
        const double th = static_cast<double>(t) * std::pow(10000.0, -2.0 * i / hd);
        EXPECT_NEAR(o[2 * i], xs[2 * i] * std::cos(th) - xs[2 * i + 1] * std::sin(th), 1e-5);
        EXPECT_NEAR(o[2 * i + 1], xs[2 * i] * std::sin(th) + xs[2 * i + 1] * std::cos(th), 1e-5);
      }
    }
  }
}

// HF's apply_rotary_pos_emb (rotate_half) on original rows equals adjacent
// pairing on rows permuted as llama.cpp's converter permutes Q/K for arch
// llama: permuted[2i + j] = original[j * half + i].
TEST_P(CpuKernelsTest, AdjacentPairingOnConverterPermutedRowsEqualsHfRotateHalf) {
  const int64_t seq = 4;
  const int32_t heads = 3, hd = 16, half = hd / 2;
  std::vector<float> cos, sin;
  Tables(seq, hd, 500.0, &cos, &sin);
  const std::vector<float> x = Random(seq * heads * hd, 6);
  std::vector<float> permuted(x.size());
  for (int64_t row = 0; row < seq * heads; ++row) {
    for (int32_t i = 0; i < half; ++i) {
      for (int32_t j = 0; j < 2; ++j) permuted[row * hd + 2 * i + j] = x[row * hd + j * half + i];
    }
  }
  std::vector<float> neox(x.size()), adjacent(x.size());
  RopeNeox(x.data(), cos.data(), sin.data(), neox.data(), seq, heads, hd, hd, 0, 1);
  RopeAdjacent(permuted.data(), cos.data(), sin.data(), adjacent.data(), seq, heads, hd, hd, 0, 1);
  for (int64_t row = 0; row < seq * heads; ++row) {
    const int64_t t = row / heads;
    for (int32_t d = 0; d < hd; ++d) {
      // HF: q * cos + rotate_half(q) * sin, cos/sin repeated over both halves.
      const int32_t i = d % half;
      const double th = static_cast<double>(t) * std::pow(500.0, -2.0 * i / hd);
      const double rot = d < half ? -x[row * hd + d + half] : x[row * hd + d - half];
      const double want = x[row * hd + d] * std::cos(th) + rot * std::sin(th);
      EXPECT_NEAR(neox[row * hd + d], want, 1e-5);
      EXPECT_NEAR(adjacent[row * hd + 2 * i + d / half], want, 1e-5);
    }
  }
}

// HF Phi's partial rotary (modeling_phi.py PhiAttention.forward): the first
// rotary_ndims of each head go through apply_rotary_pos_emb (rotate_half
// within them, inv_freq over rotary_ndims), the rest are concatenated back
// unchanged. The adjacent pairing rotates (2i, 2i + 1) of the same leading
// dimensions (llama.cpp NORM with n_rot < head size).
TEST_P(CpuKernelsTest, PartialRotaryRotatesTheLeadingDimsAndPassesTheRest) {
  const int64_t seq = 5;
  const int32_t heads = 3, hd = 16, rot = 6, half = rot / 2;
  std::vector<float> cos, sin;
  Tables(seq, rot, 1e4, &cos, &sin);  // frequencies over the rotated dims
  const std::vector<float> x = Random(seq * heads * hd, 11);
  std::vector<float> neox(x.size(), -1.0f), adjacent(x.size(), -1.0f);
  RopeNeox(x.data(), cos.data(), sin.data(), neox.data(), seq, heads, hd, rot, 0, 1);
  RopeAdjacent(x.data(), cos.data(), sin.data(), adjacent.data(), seq, heads, hd, rot, 0, 1);
  for (int64_t row = 0; row < seq * heads; ++row) {
    const int64_t t = row / heads;
    const float* xs = x.data() + row * hd;
    for (int32_t d = 0; d < hd; ++d) {
      if (d >= rot) {  // query_pass
        EXPECT_EQ(neox[row * hd + d], xs[d]);
        EXPECT_EQ(adjacent[row * hd + d], xs[d]);
        continue;
      }
      const int32_t i = d % half;
      const double th = static_cast<double>(t) * std::pow(1e4, -2.0 * i / rot);
      const double rot_half = d < half ? -xs[d + half] : xs[d - half];
      EXPECT_NEAR(neox[row * hd + d], xs[d] * std::cos(th) + rot_half * std::sin(th), 1e-5);
      const int32_t p = d / 2;  // adjacent: pair p = (2p, 2p + 1), frequency p
      const double tp = static_cast<double>(t) * std::pow(1e4, -2.0 * p / rot);
      const double want_adj = d % 2 == 0 ? xs[d] * std::cos(tp) - xs[d + 1] * std::sin(tp)
                                         : xs[d - 1] * std::sin(tp) + xs[d] * std::cos(tp);
      EXPECT_NEAR(adjacent[row * hd + d], want_adj, 1e-5);
    }
  }
}


// ---- mixture of experts ----

// The routers of HF Qwen3MoeTopKRouter, DeepseekV2TopkRouter and
// DeepseekV3TopkRouter plus the experts, for one row, in double: softmax or
// sigmoid probs; selection scores probs + bias; with groups, keep the
// topk_group groups of best score (max, or sum of the best two) and pick
// the k best eligible experts (ties: lower index); weights are the unbiased
// probs, optionally renormalized, times scale; sum of w * down(silu(gate x) *
// up x) over the selected experts.
struct MoeCase {
  int64_t rows, hidden, ffn;
  int32_t n_expert, k;
  bool norm;
  std::vector<float> x, logits, gate, up, down;  // gate/up [E, ffn, hidden], down [E, hidden, ffn]
  MoeGating gating = MoeGating::kSoftmax;
  float scale = 1.0f;
  int32_t n_group = 1, topk_group = 1;
  MoeGroupScore group_score = MoeGroupScore::kMax;
  std::vector<float> bias;  // empty: none

  MoeRouting routing() const {
    return {.n_expert = n_expert, .k = k, .gating = gating, .norm_topk_prob = norm, .scale = scale,
            .n_group = n_group, .topk_group = topk_group, .group_score = group_score, .has_bias = !bias.empty()};
  }
};

std::vector<int32_t> ReferenceTopK(const std::vector<double>& score, int32_t k) {
  std::vector<int32_t> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

std::vector<int32_t> ReferenceTopK(const float* logits, int32_t n, int32_t k) {
  return ReferenceTopK(std::vector<double>(logits, logits + n), k);
}

// The row's selected experts and weights.
void ReferenceRoute(const MoeCase& c, const float* lg, std::vector<int32_t>* sel, std::vector<double>* w) {
  const int32_t n = c.n_expert;
  std::vector<double> p(static_cast<size_t>(n));
  if (c.gating == MoeGating::kSigmoid) {
    for (int32_t e = 0; e < n; ++e) p[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(lg[e])));
  } else {
    double mx = lg[0], sum = 0;
    for (int32_t e = 0; e < n; ++e) mx = std::max(mx, static_cast<double>(lg[e]));
    for (int32_t e = 0; e < n; ++e) sum += std::exp(lg[e] - mx);
    for (int32_t e = 0; e < n; ++e) p[e] = std::exp(lg[e] - mx) / sum;
  }
  std::vector<double> s = p;
  if (!c.bias.empty()) {
    for (int32_t e = 0; e < n; ++e) s[e] += c.bias[e];
  }
  if (c.n_group > 1) {
    const int32_t per = n / c.n_group;
    std::vector<double> gs(static_cast<size_t>(c.n_group));
    for (int32_t g = 0; g < c.n_group; ++g) {
      std::vector<double> v(s.begin() + g * per, s.begin() + (g + 1) * per);
      std::sort(v.begin(), v.end(), std::greater<>());
      gs[g] = c.group_score == MoeGroupScore::kMax ? v[0] : v[0] + v[1];
    }
    const std::vector<int32_t> kept = ReferenceTopK(gs, c.topk_group);
    for (int32_t e = 0; e < n; ++e) {
      if (std::find(kept.begin(), kept.end(), e / per) == kept.end()) s[e] = -1e300;
    }
  }
  *sel = ReferenceTopK(s, c.k);
  w->clear();
  for (int32_t e : *sel) w->push_back(p[e]);
  if (c.norm) {
    const double t = std::accumulate(w->begin(), w->end(), 0.0);
    for (double& v : *w) v /= t;
  }
  for (double& v : *w) v *= c.scale;
}

std::vector<double> ReferenceMoe(const MoeCase& c, const std::vector<float>& gate, const std::vector<float>& up,
                                 const std::vector<float>& down) {
  std::vector<double> out(static_cast<size_t>(c.rows * c.hidden), 0.0);
  for (int64_t r = 0; r < c.rows; ++r) {
    std::vector<int32_t> sel;
    std::vector<double> w;
    ReferenceRoute(c, c.logits.data() + r * c.n_expert, &sel, &w);
    for (size_t j = 0; j < sel.size(); ++j) {
      const int64_t e = sel[j];
      std::vector<double> h(static_cast<size_t>(c.ffn));
      for (int64_t f = 0; f < c.ffn; ++f) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < c.hidden; ++i) {
          g += static_cast<double>(gate[(e * c.ffn + f) * c.hidden + i]) * c.x[r * c.hidden + i];
          u += static_cast<double>(up[(e * c.ffn + f) * c.hidden + i]) * c.x[r * c.hidden + i];
        }
        h[f] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t o = 0; o < c.hidden; ++o) {
        double d = 0;
        for (int64_t f = 0; f < c.ffn; ++f) d += static_cast<double>(down[(e * c.hidden + o) * c.ffn + f]) * h[f];
        out[r * c.hidden + o] += w[j] * d;
      }
    }
  }
  return out;
}

MoeCase RandomMoeCase(int64_t rows, int64_t hidden, int64_t ffn, int32_t n_expert, int32_t k, bool norm,
                      uint32_t seed) {
  MoeCase c{rows, hidden, ffn, n_expert, k, norm, {}, {}, {}, {}, {}};
  c.x = Random(static_cast<size_t>(rows * hidden), seed);
  c.logits = Random(static_cast<size_t>(rows * n_expert), seed + 1);
  c.gate = Random(static_cast<size_t>(n_expert * ffn * hidden), seed + 2);
  c.up = Random(static_cast<size_t>(n_expert * ffn * hidden), seed + 3);
  c.down = Random(static_cast<size_t>(n_expert * hidden * ffn), seed + 4);
  for (float& v : c.gate) v *= 0.1f;
  for (float& v : c.up) v *= 0.1f;
  for (float& v : c.down) v *= 0.1f;
  return c;
}

MoeExpertMatrix F32Experts(const std::vector<float>& w, int64_t rows, int64_t cols) {
  return {DType::kF32, reinterpret_cast<const uint8_t*>(w.data()), static_cast<size_t>(cols) * sizeof(float), rows,
          cols};
}

struct Aligned {
  explicit Aligned(size_t n) : p(std::aligned_alloc(64, (n + 63) / 64 * 64 + 64)) {}
  ~Aligned() { std::free(p); }
  void* p;
};

// Runs the kernel on `threads` team members (CpuExecutor, real barriers).
std::vector<float> RunMoe(const MoeCase& c, MoeExpertMatrix gate, MoeExpertMatrix up, MoeExpertMatrix down,
                          int threads) {
  std::vector<float> out(static_cast<size_t>(c.rows * c.hidden), -1.0f);
  MoeFfnArgs a{.x = c.x.data(), .router_logits = c.logits.data(), .gate = gate, .up = up, .down = down,
               .out = out.data(), .rows = c.rows, .routing = c.routing(),
               .selection_bias = c.bias.empty() ? nullptr : c.bias.data()};
  Aligned ws(MoeFfnWorkspaceBytes(a));
  a.workspace = ws.p;
  CpuExecutor ex(threads);
  struct Ctx {
    const MoeFfnArgs* a;
    CpuExecutor* ex;
  } ctx{&a, &ex};
  ex.Parallel(
      [](void* p, int ith, int nth) {
        auto* c = static_cast<Ctx*>(p);
        MoeFfn(*c->a, ith, nth, [c] { c->ex->Barrier(); });
      },
      &ctx);
  return out;
}

void ExpectMoeMatchesReference(const MoeCase& c) {
  const std::vector<double> want = ReferenceMoe(c, c.gate, c.up, c.down);
  const auto g = F32Experts(c.gate, c.ffn, c.hidden), u = F32Experts(c.up, c.ffn, c.hidden),
             d = F32Experts(c.down, c.hidden, c.ffn);
  const std::vector<float> one = RunMoe(c, g, u, d, 1);
  const std::vector<float> two = RunMoe(c, g, u, d, 2);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(one[i], want[i], 1e-4 * (1.0 + std::abs(want[i]))) << "k=" << c.k << " element " << i;
  }
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0) << "thread count changed the result";
}

TEST_P(MoeKernelTest, TopTwoRenormalizedMatchesTheFormula) {
  ExpectMoeMatchesReference(RandomMoeCase(5, 64, 32, 8, 2, /*norm=*/true, 100));
}

TEST_P(MoeKernelTest, TopTwoWithoutRenormalizationMatchesTheFormula) {
  ExpectMoeMatchesReference(RandomMoeCase(5, 64, 32, 8, 2, /*norm=*/false, 200));
}

TEST_P(MoeKernelTest, SingleExpertMatchesTheFormula) {
  ExpectMoeMatchesReference(RandomMoeCase(4, 64, 32, 8, 1, /*norm=*/true, 300));
  ExpectMoeMatchesReference(RandomMoeCase(4, 64, 32, 8, 1, /*norm=*/false, 310));
}

TEST_P(MoeKernelTest, AllExpertsIsTheDenseSoftmaxMixture) {
  ExpectMoeMatchesReference(RandomMoeCase(3, 64, 32, 6, 6, /*norm=*/true, 400));
  ExpectMoeMatchesReference(RandomMoeCase(3, 64, 32, 6, 6, /*norm=*/false, 410));
}

TEST_P(MoeKernelTest, TiesGoToTheLowerExpertIndex) {
  const float logits[] = {1.0f, 3.0f, 3.0f, 3.0f, 0.0f, 3.0f};
  int32_t experts[3];
  float weights[3];
  float scratch[16];
  MoeRoute(logits, nullptr, {.n_expert = 6, .k = 3, .norm_topk_prob = true}, scratch, experts, weights);
  EXPECT_EQ(experts[0], 1);
  EXPECT_EQ(experts[1], 2);
  EXPECT_EQ(experts[2], 3);
  EXPECT_EQ(weights[0], weights[1]);
  EXPECT_FLOAT_EQ(weights[0] + weights[1] + weights[2], 1.0f);
  // Through the whole op: a row of four equal logits takes experts 0 and 1.
  MoeCase c = RandomMoeCase(2, 64, 32, 4, 2, /*norm=*/true, 500);
  std::fill(c.logits.begin(), c.logits.begin() + 4, 0.5f);
  ExpectMoeMatchesReference(c);
  const std::vector<int32_t> sel = ReferenceTopK(c.logits.data(), 4, 2);
  EXPECT_EQ(sel, (std::vector<int32_t>{0, 1}));
}

TEST_P(MoeKernelTest, ConsecutiveRowsRouteToDifferentExperts) {
  MoeCase c = RandomMoeCase(2, 64, 32, 8, 2, /*norm=*/true, 600);
  // Row 0 prefers experts 6 and 2, row 1 experts 0 and 5.
  const float row0[] = {0, 0, 2, 0, 0, 0, 3, 0}, row1[] = {4, 0, 0, 0, 0, 1, 0, 0};
  std::copy(row0, row0 + 8, c.logits.begin());
  std::copy(row1, row1 + 8, c.logits.begin() + 8);
  int32_t e0[2], e1[2];
  float w[2];
  float scratch[32];
  MoeRoute(c.logits.data(), nullptr, c.routing(), scratch, e0, w);
  MoeRoute(c.logits.data() + 8, nullptr, c.routing(), scratch, e1, w);
  EXPECT_EQ((std::vector<int32_t>{e0[0], e0[1]}), (std::vector<int32_t>{6, 2}));
  EXPECT_EQ((std::vector<int32_t>{e1[0], e1[1]}), (std::vector<int32_t>{0, 5}));
  ExpectMoeMatchesReference(c);
}

// Group-limited routing on one hand-made row: 8 experts in 4 groups of 2,
// 2 groups kept, k = 3. Ungrouped top-3 is {0, 4, 2}; DeepSeek-V2's
// best-expert group score keeps groups 0 and 2 -> {0, 4, 1}; DeepSeek-V3's
// top-2 sum keeps groups 1 and 0 -> {0, 2, 3}.
TEST(MoeKernelTest, GroupScoresDecideWhichExpertsAreEligible) {
  const float logits[] = {5.0f, 0.0f, 4.9f, 4.85f, 4.95f, 0.0f, 0.0f, 0.0f};
  int32_t experts[3];
  float weights[3];
  float scratch[32];
  MoeRouting r{.n_expert = 8, .k = 3, .n_group = 1, .topk_group = 1};
  MoeRoute(logits, nullptr, r, scratch, experts, weights);
  EXPECT_EQ((std::vector<int32_t>{experts[0], experts[1], experts[2]}), (std::vector<int32_t>{0, 4, 2}));
  r.n_group = 4;
  r.topk_group = 2;
  MoeRoute(logits, nullptr, r, scratch, experts, weights);
  EXPECT_EQ((std::vector<int32_t>{experts[0], experts[1], experts[2]}), (std::vector<int32_t>{0, 4, 1}));
  r.group_score = MoeGroupScore::kTop2Sum;
  MoeRoute(logits, nullptr, r, scratch, experts, weights);
  EXPECT_EQ((std::vector<int32_t>{experts[0], experts[1], experts[2]}), (std::vector<int32_t>{0, 2, 3}));
}

// Softmax, groups scored by their best expert, no renormalization, weights
// scaled (DeepSeek-V2: 8 groups, 3 kept, routed_scaling_factor 16 there).
TEST(MoeKernelTest, GroupLimitedGreedyWithScalingMatchesTheFormula) {
  MoeCase c = RandomMoeCase(6, 64, 32, 12, 3, /*norm=*/false, 800);
  c.n_group = 4;
  c.topk_group = 2;
  c.scale = 2.5f;
  ExpectMoeMatchesReference(c);
  c.norm = true;
  ExpectMoeMatchesReference(c);
}

// Sigmoid gating, a selection bias that steers the choice but not the
// weights, groups scored by their best two, renormalized and scaled
// (DeepSeek-V3 noaux_tc).
TEST(MoeKernelTest, SigmoidWithSelectionBiasAndTopTwoGroupsMatchesTheFormula) {
  MoeCase c = RandomMoeCase(6, 64, 32, 12, 3, /*norm=*/true, 900);
  c.gating = MoeGating::kSigmoid;
  c.group_score = MoeGroupScore::kTop2Sum;
  c.n_group = 4;
  c.topk_group = 2;
  c.scale = 2.5f;
  c.bias = Random(12, 901);
  for (float& b : c.bias) b *= 0.2f;
  ExpectMoeMatchesReference(c);
  c.norm = false;
  c.n_group = 1;
  c.topk_group = 1;
  ExpectMoeMatchesReference(c);
}

// The bias only selects: a large bias on expert 5 makes it chosen, yet its
// weight is its sigmoid probability.
TEST(MoeKernelTest, SelectionBiasDoesNotEnterTheWeights) {
  const float logits[] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -2.0f};
  const float bias[] = {0, 0, 0, 0, 0, 10.0f};
  int32_t experts[2];
  float weights[2];
  float scratch[16];
  MoeRoute(logits, bias, {.n_expert = 6, .k = 2, .gating = MoeGating::kSigmoid, .has_bias = true}, scratch, experts,
           weights);
  EXPECT_EQ(experts[0], 5);
  EXPECT_EQ(experts[1], 0);
  EXPECT_FLOAT_EQ(weights[0], 1.0f / (1.0f + std::exp(2.0f)));
  EXPECT_FLOAT_EQ(weights[1], 1.0f / (1.0f + std::exp(-2.0f)));
}

// Q8_0 expert weights (the format's blocks, as quant::QuantizeActivationRow
// writes them for weight type Q8_0): the formula on the dequantized weights,
// within the activation-quantization error.
TEST_P(MoeKernelTest, QuantizedExpertsMatchTheFormulaOnDequantizedWeights) {
  const MoeCase c = RandomMoeCase(3, 64, 64, 8, 2, /*norm=*/true, 700);
  auto quantize = [](const std::vector<float>& w, int64_t rows, int64_t cols, std::vector<uint8_t>& q,
                     std::vector<float>& deq) {
    const size_t rb = quant::ActivationRowBytes(DType::kQ8_0, cols);
    q.assign(rb * static_cast<size_t>(rows), 0);
    deq.assign(w.size(), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      quant::QuantizeActivationRow(DType::kQ8_0, w.data() + r * cols, cols, q.data() + r * rb);
      quant::DequantizeRow(DType::kQ8_0, q.data() + r * rb, deq.data() + r * cols, cols);
    }
    return MoeExpertMatrix{DType::kQ8_0, q.data(), rb, 0, cols};
  };
  std::vector<uint8_t> gq, uq, dq;
  std::vector<float> gd, ud, dd;
  MoeExpertMatrix g = quantize(c.gate, c.n_expert * c.ffn, c.hidden, gq, gd);
  MoeExpertMatrix u = quantize(c.up, c.n_expert * c.ffn, c.hidden, uq, ud);
  MoeExpertMatrix d = quantize(c.down, c.n_expert * c.hidden, c.ffn, dq, dd);
  g.rows = u.rows = c.ffn;
  d.rows = c.hidden;
  const std::vector<double> want = ReferenceMoe(c, gd, ud, dd);
  const std::vector<float> one = RunMoe(c, g, u, d, 1), two = RunMoe(c, g, u, d, 2);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(one[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  EXPECT_LT(worst, 0.02 * scale);  // Q8_0 activations: ~1/127 relative per dot product
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

// The per-head column moves of multi-head latent attention: slice columns
// [begin, begin + count) of each group, concatenate two tensors group by group.
TEST_P(CpuKernelsTest, HeadSliceAndHeadConcatMoveEachGroupsColumns) {
  constexpr int64_t rows = 3;
  constexpr int32_t groups = 4, width = 6, begin = 2, count = 3, wb = 2;
  const std::vector<float> x = Random(rows * groups * width, 5);
  std::vector<float> sliced(rows * groups * count, -1.0f);
  HeadSlice(x.data(), sliced.data(), rows, groups, width, begin, count, 0, 1);
  const std::vector<float> b = Random(rows * groups * wb, 6);
  std::vector<float> cat(rows * groups * (count + wb), -1.0f);
  HeadConcat(sliced.data(), b.data(), cat.data(), rows, groups, count, wb, 0, 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t g = 0; g < groups; ++g) {
      for (int32_t c = 0; c < count; ++c) {
        EXPECT_EQ(sliced[(r * groups + g) * count + c], x[(r * groups + g) * width + begin + c]);
        EXPECT_EQ(cat[(r * groups + g) * (count + wb) + c], x[(r * groups + g) * width + begin + c]);
      }
      for (int32_t c = 0; c < wb; ++c) {
        EXPECT_EQ(cat[(r * groups + g) * (count + wb) + count + c], b[(r * groups + g) * wb + c]);
      }
    }
  }
}

// MLA's cache: one row [latent | k_rope] per position, the value being the
// latent (the row's first v_dim columns). Against softmax(scale q.k) . k[:v_dim]
// written out in double, for every head over one shared row.
TEST_P(CpuKernelsTest, AttentionReadsTheValueFromTheLeadingColumnsOfTheKeyRow) {
  constexpr int32_t heads = 3, k_dim = 10, v_dim = 6, capacity = 8, seq = 2;
  constexpr float scale = 0.3f;
  const std::vector<float> k = Random(capacity * k_dim, 7);
  const std::vector<float> q = Random(seq * heads * k_dim, 8);
  const int32_t bounds[] = {0, 4, 1, 5};  // row 0 sees keys [0, 4), row 1 [1, 5)
  std::vector<float> out(seq * heads * v_dim, -1.0f);
  // Both rows address the one cache (layer 0, no V buffer): one block of
  // `capacity` positions (engine/kv_rows.h).
  const int32_t table[] = {0};
  const int64_t t_addr = static_cast<int64_t>(reinterpret_cast<intptr_t>(table));
  const int64_t k_addr = static_cast<int64_t>(reinterpret_cast<intptr_t>(k.data()));
  const int64_t kv_rows[] = {capacity, capacity, 0, 0, t_addr, k_addr, 0, capacity, capacity, 0, 0, t_addr, k_addr, 0};
  Attention(q.data(), bounds, kv_rows, KvRowStride(1), /*layer=*/0, out.data(), seq, heads, /*n_kv_heads=*/1, k_dim,
            v_dim, /*v_stride=*/k_dim, scale, /*softcap=*/0.0f, 0, 1);
  for (int32_t t = 0; t < seq; ++t) {
    for (int32_t h = 0; h < heads; ++h) {
      const float* qh = q.data() + (t * heads + h) * k_dim;
      std::vector<double> s;
      double mx = -1e300;
      for (int32_t j = bounds[2 * t]; j < bounds[2 * t + 1]; ++j) {
        double dot = 0;
        for (int32_t d = 0; d < k_dim; ++d) dot += static_cast<double>(qh[d]) * k[j * k_dim + d];
        s.push_back(dot * scale);
        mx = std::max(mx, s.back());
      }
      double z = 0;
      for (double& v : s) z += (v = std::exp(v - mx));
      for (int32_t d = 0; d < v_dim; ++d) {
        double want = 0;
        for (size_t i = 0; i < s.size(); ++i) want += s[i] / z * k[(bounds[2 * t] + i) * k_dim + d];
        EXPECT_NEAR(out[(t * heads + h) * v_dim + d], want, 1e-5);
      }
    }
  }
}

// ---- CPU plans: a matmul is its activation quantization plus the kernel ----

// A weight of `rows` rows of `cols` elements with its bytes.
struct TestWeight {
  std::vector<uint8_t> bytes;
  WeightTensor tensor;
};

// Q8_0 rows are Q8_0 activation rows; Q4_K rows are random blocks with sane
// fp16 scales; F32 rows are the floats.
std::unique_ptr<TestWeight> MakeWeight(const char* name, DType type, int64_t rows, int64_t cols, uint32_t seed) {
  auto w = std::make_unique<TestWeight>();
  const size_t rb = *RowBytes(type, cols);
  w->bytes.assign(rb * static_cast<size_t>(rows), 0);
  const std::vector<float> f = Random(static_cast<size_t>(rows * cols), seed);
  if (type == DType::kF32) {
    std::memcpy(w->bytes.data(), f.data(), w->bytes.size());
  } else if (type == DType::kQ8_0) {
    for (int64_t r = 0; r < rows; ++r) {
      quant::QuantizeActivationRow(DType::kQ8_0, f.data() + r * cols, cols, w->bytes.data() + r * rb);
    }
  } else {
    EXPECT_EQ(type, DType::kQ4_K);
    std::mt19937 gen(seed);
    for (uint8_t& b : w->bytes) b = static_cast<uint8_t>(gen());
    constexpr size_t kBlock = 144;  // block_q4_K: fp16 d, fp16 dmin, scales[12], qs[128]
    for (size_t b = 0; b < w->bytes.size(); b += kBlock) {
      const uint16_t d = quant::F32ToF16(0.01f), dmin = quant::F32ToF16(0.005f);
      std::memcpy(&w->bytes[b], &d, 2);
      std::memcpy(&w->bytes[b + 2], &dmin, 2);
    }
  }
  w->tensor = WeightTensor{name, type, rows, cols, rb, w->bytes.data()};
  return w;
}

// What a plan's matmul must compute: x quantized for W's type, then
// quant::MatMul, group by group for a block-diagonal (head) matmul.
std::vector<float> ReferenceMatMul(const WeightTensor& w, const std::vector<float>& x, int64_t m, int32_t groups) {
  const int64_t k = w.cols * groups, per = w.rows / groups;
  const size_t rb = quant::ActivationRowBytes(w.type, k);
  std::vector<uint8_t> xq(rb * static_cast<size_t>(m));
  for (int64_t r = 0; r < m; ++r) quant::QuantizeActivationRow(w.type, x.data() + r * k, k, xq.data() + r * rb);
  std::vector<float> y(static_cast<size_t>(m * w.rows));
  for (int32_t g = 0; g < groups; ++g) {
    quant::MatMul(w.type, w.data + static_cast<size_t>(g * per) * w.row_bytes, w.row_bytes, w.cols,
                  xq.data() + g * (rb / groups), rb, m, y.data() + g * per, w.rows, 0, per);
  }
  return y;
}

NodeId F32Const(Graph& g, const std::vector<float>& v, int64_t rows, int64_t cols, const char* name) {
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return g.constant(DType::kF32, rows, cols, std::move(bytes), name);
}

absl::StatusOr<std::unique_ptr<CompiledPlan>> CompileOnCpu(Graph g) {
  auto plan = Optimize(g);
  if (!plan.ok()) return plan.status();
  return CpuBackend().Compile(std::move(g), *std::move(plan), PlanResources{});
}

// q/k/v-style matmuls of one input quantize it once per activation type:
// Q8_0 weights (and a per-head Q8_0 matmul) share one Q8_0 conversion, Q4_K
// takes Q8_K and F32 a copy. A matmul of another input in between leaves the
// shared conversion alone. Every output is byte-identical to the kernel run
// on its own quantization.
TEST_P(CpuPlanTest, MatmulsOfOneInputShareOneQuantizationPerActivationType) {
  constexpr int64_t m = 7, k = 256;
  const auto wq = MakeWeight("q", DType::kQ8_0, 32, k, 1), wk = MakeWeight("k", DType::kQ4_K, 16, k, 2),
             wv = MakeWeight("v", DType::kQ8_0, 16, k, 3), wf = MakeWeight("f", DType::kF32, 8, k, 4),
             wh = MakeWeight("h", DType::kQ8_0, 2 * 12, k / 2, 5);
  const std::vector<float> x = Random(m * k, 10), y = Random(m * k, 11);
  Graph g;
  const NodeId xn = F32Const(g, x, m, k, "x"), yn = F32Const(g, y, m, k, "y");
  g.mark_output(g.matmul(g.weight(wq->tensor), xn, "q"));
  g.mark_output(g.matmul(g.weight(wq->tensor), yn, "other"));
  g.mark_output(g.matmul(g.weight(wk->tensor), xn, "k"));
  g.mark_output(g.matmul(g.weight(wv->tensor), xn, "v"));
  g.mark_output(g.matmul(g.weight(wf->tensor), xn, "f"));
  g.mark_output(g.head_matmul(g.weight(wh->tensor), xn, 2, "heads"));
  const int64_t before = GetEngineCounters().cpu_activation_quantizations;
  auto plan = CompileOnCpu(std::move(g));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // x as Q8_0, Q8_K and F32; y as Q8_0.
  EXPECT_EQ(GetEngineCounters().cpu_activation_quantizations - before, 4);
  CpuExecutor ex(3);
  ASSERT_TRUE((*plan)->Run(ex, SymEnv{}).ok());
  const std::vector<std::vector<float>> want = {
      ReferenceMatMul(wq->tensor, x, m, 1), ReferenceMatMul(wq->tensor, y, m, 1),
      ReferenceMatMul(wk->tensor, x, m, 1), ReferenceMatMul(wv->tensor, x, m, 1),
      ReferenceMatMul(wf->tensor, x, m, 1), ReferenceMatMul(wh->tensor, x, m, 2)};
  for (size_t i = 0; i < want.size(); ++i) {
    const absl::Span<const float> got = (*plan)->output(i);
    ASSERT_EQ(got.size(), want[i].size()) << i;
    EXPECT_EQ(std::memcmp(got.data(), want[i].data(), got.size() * sizeof(float)), 0)
        << (*plan)->graph().node((*plan)->graph().outputs()[i]).name;
  }
}

// A 128-row prefill plan reuses its quantization scratch layer after layer:
// eight layers need no more of it than one.
TEST_P(CpuPlanTest, PrefillQuantizationScratchDoesNotGrowWithLayers) {
  constexpr int64_t m = 128, k = 256;
  const auto w8 = MakeWeight("w8", DType::kQ8_0, k, k, 1), w4 = MakeWeight("w4", DType::kQ4_K, k, k, 2);
  auto scratch = [&](int layers) -> size_t {
    Graph g;
    NodeId h = F32Const(g, Random(m * k, 3), m, k, "x");
    for (int l = 0; l < layers; ++l) {
      const NodeId q = g.matmul(g.weight(w8->tensor), h, "q"), kk = g.matmul(g.weight(w4->tensor), h, "k"),
                   v = g.matmul(g.weight(w8->tensor), h, "v");
      h = g.matmul(g.weight(w8->tensor), g.add(g.add(q, kk, "qk"), v, "qkv"), "o");
    }
    g.mark_output(h);
    auto mem = Optimize(g);
    EXPECT_TRUE(mem.ok());
    const size_t arena = mem->arena_bytes;
    auto plan = CpuBackend().Compile(std::move(g), *std::move(mem), PlanResources{});
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? (*plan)->arena_bytes() - arena : 0;
  };
  const size_t one = scratch(1);
  EXPECT_GE(one, static_cast<size_t>(m) * quant::ActivationRowBytes(DType::kQ8_0, k));
  EXPECT_EQ(scratch(8), one);
}

// A held plan's padding rows (past SymEnv::live_rows / live_outputs) are not
// computed: their output rows keep the previous run's values, and the live
// rows equal a run of the same plan with every row live.
TEST_P(CpuPlanTest, PaddingRowsPastTheLiveCountsAreNotComputed) {
  constexpr int64_t m = 6, n_out = 4, k = 64, vocab = 16;
  const auto table = MakeWeight("table", DType::kF32, vocab, k, 1), wq = MakeWeight("q", DType::kQ8_0, 32, k, 2),
             wh = MakeWeight("head", DType::kQ4_K, 8, 256, 3);
  const auto wup = MakeWeight("up", DType::kQ8_0, 256, 32, 4);
  // Every node is an output, so no two share arena bytes: a row nobody
  // computes keeps its bytes.
  auto build = [&]() {
    Graph g;
    const NodeId ids = g.input(DataSlot::kTokenIds, DType::kI32, 1, m, "ids");
    const NodeId out_rows = g.input(DataSlot::kOutputRows, DType::kI32, 1, n_out, "out_rows");
    const NodeId embd = g.get_rows(g.weight(table->tensor), ids, "embd");
    const NodeId q = g.matmul(g.weight(wq->tensor), embd, "q");
    const NodeId a = g.add(q, q, "a");
    const NodeId take = g.take_rows(a, out_rows, "take");
    const NodeId up = g.matmul(g.weight(wup->tensor), take, "up");
    const NodeId logits = g.matmul(g.weight(wh->tensor), up, "logits");
    for (NodeId n : {a, logits, embd, q, take, up}) g.mark_output(n);
    return g;
  };
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  auto compile = [&]() -> std::unique_ptr<CompiledPlan> {
    PlanResources res;
    for (auto [slot, bytes] : {std::pair{DataSlot::kTokenIds, m * 4}, std::pair{DataSlot::kOutputRows, n_out * 4}}) {
      auto b = CpuBackend().Allocate(static_cast<size_t>(bytes), BufferAccess::kHost);
      EXPECT_TRUE(b.ok());
      res.inputs[static_cast<size_t>(slot)] = b->get();
      buffers.push_back(*std::move(b));
    }
    Graph g = build();
    auto mem = Optimize(g);
    EXPECT_TRUE(mem.ok());
    auto plan = CpuBackend().Compile(std::move(g), *std::move(mem), res);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *std::move(plan) : nullptr;
  };
  auto bind = [&](size_t plan, std::vector<int32_t> ids, std::vector<int32_t> out_rows) {
    std::memcpy(buffers[2 * plan]->data(), ids.data(), ids.size() * 4);
    std::memcpy(buffers[2 * plan + 1]->data(), out_rows.data(), out_rows.size() * 4);
  };
  auto copy = [](absl::Span<const float> s) { return std::vector<float>(s.begin(), s.end()); };
  const std::unique_ptr<CompiledPlan> padded = compile(), full = compile();
  ASSERT_TRUE(padded && full);
  CpuExecutor ex(2);
  bind(0, {1, 2, 3, 4, 5, 6}, {0, 2, 4, 5});
  ASSERT_TRUE(padded->Run(ex, SymEnv{}).ok());
  const std::vector<float> a_before = copy(padded->output(0)), logits_before = copy(padded->output(1));

  // 3 live token rows, 2 live outputs (of those rows); the padding rows' ids
  // and output rows are what a driver fills in (token 0, row 0).
  bind(0, {9, 3, 14, 0, 0, 0}, {2, 0, 0, 0});
  bind(1, {9, 3, 14, 0, 0, 0}, {2, 0, 0, 0});
  ASSERT_TRUE(padded->Run(ex, SymEnv{.kv_pos = {}, .live_rows = 3, .live_outputs = 2}).ok());
  ASSERT_TRUE(full->Run(ex, SymEnv{}).ok());
  const std::vector<float> a = copy(padded->output(0)), logits = copy(padded->output(1));
  const std::vector<float> a_full = copy(full->output(0)), logits_full = copy(full->output(1));
  ASSERT_EQ(a.size(), static_cast<size_t>(m * 32));
  ASSERT_EQ(logits.size(), static_cast<size_t>(n_out * 8));
  const size_t live_a = 3 * 32, live_logits = 2 * 8;
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + live_a, a_full.begin()));
  EXPECT_TRUE(std::equal(a.begin() + live_a, a.end(), a_before.begin() + live_a));
  EXPECT_FALSE(std::equal(a.begin() + live_a, a.end(), a_full.begin() + live_a));  // the full run did compute them
  EXPECT_TRUE(std::equal(logits.begin(), logits.begin() + live_logits, logits_full.begin()));
  EXPECT_TRUE(std::equal(logits.begin() + live_logits, logits.end(), logits_before.begin() + live_logits));
  EXPECT_FALSE(std::equal(logits.begin(), logits.begin() + live_logits, logits_before.begin()));
}

TEST(CpuPlanTest, MatmulOverAnUnsupportedWeightTypeIsRefused) {
  for (const DType type : {DType::kQ2_K, DType::kI32}) {
    WeightTensor w{"w", type, 1, 256, *RowBytes(type, 256), nullptr};
    Graph g;
    const NodeId x = g.constant(DType::kF32, 1, 256, std::vector<uint8_t>(1024, 0), "x");
    g.mark_output(g.matmul(g.weight(w), x, "mm"));
    auto plan = CompileOnCpu(std::move(g));
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << DTypeName(type);
    EXPECT_NE(plan.status().message().find("matmul mm"), std::string::npos) << plan.status();
    EXPECT_NE(plan.status().message().find(DTypeName(type)), std::string::npos) << plan.status();
  }
}

}  // namespace
}  // namespace decoded::cpu
