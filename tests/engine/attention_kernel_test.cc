// The CPU attention kernel (cpu::Attention, engine/cpu/attention_isa.cc) on
// every tier:
//   - against softmax attention written out here in double (Vaswani et al.
//     2017, with Gemma 2's score softcap) over the values the cache holds,
//     for the head geometries of the families (GQA groups, head sizes that
//     are not multiples of 16, MLA's value inside the key row), sliding
//     windows, empty ranges, f32 and f16 caches, paged caches whose blocks
//     are shuffled and smaller than the kernel's key tile;
//   - the property the serving tests rest on: a query row's output depends
//     only on its q row and key range, so the same row computed in another
//     step (alone, in another order, among other caches' rows, with another
//     thread count, from a cache with other block sizes, in another group
//     of vectors sharing loads) has the same bytes;
//   - the avx2 and avx512vnni tiers give the same bytes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/key_panels.h"
#include "engine/cpu_isa.h"
#include "engine/dtype.h"
#include "engine/kv_layout.h"
#include "engine/kv_rows.h"
#include "engine/quant/blocks.h"
#include "gtest/gtest.h"
#include "tests/common/per_cpu_isa.h"

namespace decoded::cpu {
namespace {

class AttentionKernelTest : public testing::PerCpuIsaTest {};
DECODED_INSTANTIATE_PER_CPU_ISA(AttentionKernelTest);

struct Heads {
  int32_t n_heads, n_kv_heads, k_dim, v_dim;
  bool v_in_k = false;  // the value is the first v_dim elements of the key row (MLA)
};

// One cache of `cap` positions: K (and V) pools of `n_blocks` blocks of
// `bt` positions, mapped through a block table in the order `order` gives,
// holding values drawn from `seed` and stored as `type`. value(p, h, d)
// reads back what a position holds, decoded.
class TestCache {
 public:
  TestCache(const Heads& g, DType type, int32_t cap, int32_t bt, uint32_t seed, bool shuffle)
      : g_(g), type_(type), cap_(cap), bt_(bt) {
    const int32_t n_blocks = (cap + bt - 1) / bt;
    table_.resize(static_cast<size_t>(n_blocks));
    std::iota(table_.begin(), table_.end(), 0);
    std::mt19937 order(seed + 1000);  // its own generator: the values do not depend on the layout
    if (shuffle) std::shuffle(table_.begin(), table_.end(), order);
    std::mt19937 rng(seed);
    k_rb_ = KvRowBytes(type, g.k_dim);
    v_rb_ = KvRowBytes(type, g.v_dim);
    k_.assign(static_cast<size_t>(n_blocks) * g.n_kv_heads * bt * k_rb_, 0);
    if (!g.v_in_k) v_.assign(static_cast<size_t>(n_blocks) * g.n_kv_heads * bt * v_rb_, 0);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int32_t p = 0; p < cap; ++p) {
      for (int32_t h = 0; h < g.n_kv_heads; ++h) {
        for (int32_t d = 0; d < g.k_dim; ++d) Store(Key(p, h, d), nd(rng));
        if (!g.v_in_k) {
          for (int32_t d = 0; d < g.v_dim; ++d) Store(Value(p, h, d), nd(rng));
        }
      }
    }
  }
  double key(int32_t p, int32_t h, int32_t d) const { return Load(Key(p, h, d)); }
  double value(int32_t p, int32_t h, int32_t d) const { return Load(g_.v_in_k ? Key(p, h, d) : Value(p, h, d)); }
  // This cache's row of a KV binding table of one layer.
  void AppendRow(std::vector<int64_t>* rows) const {
    const auto addr = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(p)); };
    for (int64_t x : {int64_t{cap_}, int64_t{bt_}, static_cast<int64_t>(type_), int64_t{0}, addr(table_.data()),
                      addr(k_.data()), g_.v_in_k ? int64_t{0} : addr(v_.data())}) {
      rows->push_back(x);
    }
  }

 private:
  // The bytes of element d of position p, kv head h: rows (engine/kv_rows.h),
  // or for keys the CPU's 16-position panels where they apply
  // (engine/cpu/key_panels.h), as the KV write stores them.
  uint8_t* Element(const std::vector<uint8_t>& pool, int64_t rb, int32_t dim, bool panels, int32_t p, int32_t h,
                   int32_t d) const {
    const int64_t block = table_[static_cast<size_t>(p / bt_)];
    const int64_t es = type_ == DType::kF16 ? 2 : 4;
    const int64_t e = panels ? cpu::PanelElement(p % bt_, dim, d) : int64_t{p % bt_} * dim + d;
    return const_cast<uint8_t*>(pool.data()) + (block * g_.n_kv_heads + h) * bt_ * rb + e * es;
  }
  uint8_t* Key(int32_t p, int32_t h, int32_t d) const {
    return Element(k_, k_rb_, g_.k_dim, cpu::KeysInPanels(type_, !g_.v_in_k, bt_, g_.k_dim), p, h, d);
  }
  uint8_t* Value(int32_t p, int32_t h, int32_t d) const { return Element(v_, v_rb_, g_.v_dim, false, p, h, d); }
  void Store(uint8_t* at, float x) const {
    if (type_ == DType::kF16) {
      const uint16_t h = quant::internal::FloatToHalf(x);
      std::memcpy(at, &h, 2);
    } else {
      std::memcpy(at, &x, 4);
    }
  }
  double Load(const uint8_t* at) const {
    if (type_ == DType::kF16) {
      uint16_t h;
      std::memcpy(&h, at, 2);
      return quant::internal::HalfToFloat(h);
    }
    float x;
    std::memcpy(&x, at, 4);
    return x;
  }

  Heads g_;
  DType type_;
  int32_t cap_, bt_;
  int64_t k_rb_ = 0, v_rb_ = 0;
  std::vector<int32_t> table_;
  std::vector<uint8_t> k_, v_;
};

// A step: rows, each reading one of `caches` over [lo, hi).
struct Step {
  std::vector<const TestCache*> cache;
  std::vector<int32_t> bounds;  // [rows, 2]
  std::vector<float> q;         // [rows, n_heads * k_dim]
  int64_t rows() const { return static_cast<int64_t>(cache.size()); }
};

std::vector<float> RunStep(const Step& s, const Heads& g, float scale, float softcap, int threads) {
  std::vector<int64_t> kv_rows;
  for (const TestCache* c : s.cache) c->AppendRow(&kv_rows);
  std::vector<float> out(static_cast<size_t>(s.rows()) * g.n_heads * g.v_dim, -7.0f);
  struct Ctx {
    const Step& s;
    const Heads& g;
    const int64_t* kv_rows;
    float* out;
    float scale, softcap;
  } ctx{s, g, kv_rows.data(), out.data(), scale, softcap};
  CpuExecutor ex(threads);
  ex.Parallel(
      [](void* p, int ith, int nth) {
        const Ctx& c = *static_cast<const Ctx*>(p);
        Attention(c.s.q.data(), c.s.bounds.data(), c.kv_rows, KvRowStride(1), 0, c.out, c.s.rows(), c.g.n_heads,
                  c.g.n_kv_heads, c.g.k_dim, c.g.v_dim, c.g.v_in_k ? c.g.k_dim : c.g.v_dim, c.scale, c.softcap, ith,
                  nth);
      },
      &ctx);
  return out;
}

// Row t of the step in double: softmax over its range of (q . k) * scale
// (softcap * tanh(score / softcap) first when softcap > 0), times the values.
std::vector<double> Reference(const Step& s, const Heads& g, float scale, float softcap, int64_t t) {
  std::vector<double> out(static_cast<size_t>(g.n_heads) * g.v_dim, 0.0);
  const int32_t lo = s.bounds[2 * t], hi = s.bounds[2 * t + 1];
  if (lo >= hi) return out;
  const TestCache& c = *s.cache[static_cast<size_t>(t)];
  for (int32_t h = 0; h < g.n_heads; ++h) {
    const int32_t kvh = h / (g.n_heads / g.n_kv_heads);
    const float* q = s.q.data() + (t * g.n_heads + h) * g.k_dim;
    std::vector<double> w;
    double mx = -1e300;
    for (int32_t j = lo; j < hi; ++j) {
      double dot = 0;
      for (int32_t d = 0; d < g.k_dim; ++d) dot += q[d] * c.key(j, kvh, d);
      double sc = dot * scale;
      if (softcap > 0) sc = softcap * std::tanh(sc / softcap);
      w.push_back(sc);
      mx = std::max(mx, sc);
    }
    double z = 0;
    for (double& x : w) z += (x = std::exp(x - mx));
    for (int32_t d = 0; d < g.v_dim; ++d) {
      double acc = 0;
      for (int32_t j = lo; j < hi; ++j) acc += w[static_cast<size_t>(j - lo)] / z * c.value(j, kvh, d);
      out[static_cast<size_t>(h) * g.v_dim + d] = acc;
    }
  }
  return out;
}

std::vector<float> RandomQ(int64_t rows, const Heads& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(rows) * g.n_heads * g.k_dim);
  for (float& x : q) x = nd(rng);
  return q;
}

// A prefill span of `n` rows of `c` ending at position `end` (causal, with
// an optional sliding window), then one decode row of each of `others`.
Step MixedStep(const Heads& g, const TestCache& c, int32_t n, int32_t end, int32_t window,
               const std::vector<const TestCache*>& others, int32_t other_len, uint32_t seed) {
  Step s;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = end - n + i;
    s.cache.push_back(&c);
    s.bounds.push_back(window > 0 ? std::max(0, pos + 1 - window) : 0);
    s.bounds.push_back(pos + 1);
  }
  for (const TestCache* o : others) {
    s.cache.push_back(o);
    s.bounds.push_back(0);
    s.bounds.push_back(other_len);
  }
  s.q = RandomQ(s.rows(), g, seed);
  return s;
}

void ExpectMatchesReference(const Heads& g, DType type, int32_t bt, float softcap, int32_t window) {
  SCOPED_TRACE(::testing::Message() << "heads " << g.n_heads << "/" << g.n_kv_heads << " k " << g.k_dim << " v "
                                  << g.v_dim << (g.v_in_k ? " (v in k)" : "") << " " << DTypeName(type) << " block "
                                  << bt << " softcap " << softcap << " window " << window);
  constexpr int32_t kCap = 150;
  const TestCache a(g, type, kCap, bt, 11, true), b(g, type, kCap, bt, 12, true);
  Step s = MixedStep(g, a, 40, 140, window, {&b, &b}, 97, 13);
  s.bounds[2 * 3] = s.bounds[2 * 3 + 1] = 9;  // an empty range: zeros
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.k_dim));
  const std::vector<float> out = RunStep(s, g, scale, softcap, 2);
  double worst = 0;
  for (int64_t t = 0; t < s.rows(); ++t) {
    const std::vector<double> want = Reference(s, g, scale, softcap, t);
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs(out[static_cast<size_t>(t) * want.size() + i] - want[i]));
    }
  }
  // f32 arithmetic over <= 140 keys of O(1) values: a few 1e-7.
  EXPECT_LT(worst, 2e-6);
}

TEST_P(AttentionKernelTest, MatchesDoubleSoftmaxAttention) {
  for (DType type : {DType::kF32, DType::kF16}) {
    ExpectMatchesReference({9, 3, 64, 64}, type, 16, 0.0f, 0);     // SmolLM2
    ExpectMatchesReference({14, 2, 64, 64}, type, 16, 0.0f, 0);    // Qwen2.5 0.5B
    ExpectMatchesReference({4, 1, 256, 256}, type, 16, 0.0f, 0);   // Gemma 3 270M, global layer
    ExpectMatchesReference({4, 1, 256, 256}, type, 16, 0.0f, 33);  // ... a sliding window
    ExpectMatchesReference({8, 8, 80, 80}, type, 5, 0.0f, 0);      // Phi-2's head size, blocks smaller than a tile
    ExpectMatchesReference({8, 8, 80, 80}, type, 32, 0.0f, 0);     // ... keys in panels (engine/cpu/key_panels.h)
    ExpectMatchesReference({6, 2, 40, 24}, type, 7, 50.0f, 0);     // ragged widths, Gemma 2's softcap
    ExpectMatchesReference({4, 1, 48, 32, true}, type, 16, 0.0f, 0);  // the value inside the key row (MLA)
  }
}

// The same query rows, computed in other steps, give the same bytes.
void ExpectRowsIndependentOfTheirStep(const Heads& g, DType type, int32_t window) {
  SCOPED_TRACE(::testing::Message() << "heads " << g.n_heads << "/" << g.n_kv_heads << " k " << g.k_dim << " "
                                  << DTypeName(type) << " window " << window);
  constexpr int32_t kCap = 300;
  const TestCache a(g, type, kCap, 16, 21, true), b(g, type, kCap, 16, 22, true);
  // The same positions in a cache of other blocks: 32-position blocks in
  // order, and one block of the whole capacity (a contiguous cache; 300
  // positions are no whole number of 16-position panels, so its keys are
  // rows where the others' are in panels: engine/cpu/key_panels.h).
  const TestCache a32(g, type, kCap, 32, 21, false), a_contiguous(g, type, kCap, kCap, 21, false);
  const Step whole = MixedStep(g, a, 128, 290, window, {&b, &b, &b}, 250, 23);
  const float scale = 0.125f;
  const std::vector<float> want = RunStep(whole, g, scale, 0.0f, 2);
  const size_t width = static_cast<size_t>(g.n_heads) * g.v_dim;
  auto row_of = [&](const std::vector<float>& v, int64_t t) {
    return std::vector<float>(v.begin() + t * width, v.begin() + (t + 1) * width);
  };
  // Each row alone (a decode step of one row), on one thread.
  for (int64_t t = 0; t < whole.rows(); t += 7) {
    Step one;
    one.cache = {whole.cache[static_cast<size_t>(t)]};
    one.bounds = {whole.bounds[2 * t], whole.bounds[2 * t + 1]};
    one.q.assign(whole.q.begin() + t * g.n_heads * g.k_dim, whole.q.begin() + (t + 1) * g.n_heads * g.k_dim);
    EXPECT_EQ(RunStep(one, g, scale, 0.0f, 1), row_of(want, t)) << "row " << t << " alone";
  }
  // The rows in reverse order, on three threads.
  Step reversed;
  for (int64_t t = whole.rows() - 1; t >= 0; --t) {
    reversed.cache.push_back(whole.cache[static_cast<size_t>(t)]);
    reversed.bounds.push_back(whole.bounds[2 * t]);
    reversed.bounds.push_back(whole.bounds[2 * t + 1]);
    reversed.q.insert(reversed.q.end(), whole.q.begin() + t * g.n_heads * g.k_dim,
                      whole.q.begin() + (t + 1) * g.n_heads * g.k_dim);
  }
  const std::vector<float> rev = RunStep(reversed, g, scale, 0.0f, 3);
  for (int64_t t = 0; t < whole.rows(); ++t) {
    EXPECT_EQ(row_of(rev, whole.rows() - 1 - t), row_of(want, t)) << "row " << t << " reversed";
  }
  // The span from caches of other block sizes.
  for (const TestCache* other : {&a32, &a_contiguous}) {
    Step s = whole;
    for (int64_t t = 0; t < 128; ++t) s.cache[static_cast<size_t>(t)] = other;
    const std::vector<float> got = RunStep(s, g, scale, 0.0f, 2);
    for (int64_t t = 0; t < 128; ++t) EXPECT_EQ(row_of(got, t), row_of(want, t)) << "row " << t << " other blocks";
  }
}

TEST_P(AttentionKernelTest, ARowDependsOnlyOnItsQueryAndKeyRange) {
  for (DType type : {DType::kF32, DType::kF16}) {
    for (int32_t window : {0, 45}) {  // a sliding window: ranges that start anywhere
      ExpectRowsIndependentOfTheirStep({9, 3, 64, 64}, type, window);
      ExpectRowsIndependentOfTheirStep({4, 1, 256, 256}, type, window);
      ExpectRowsIndependentOfTheirStep({6, 2, 40, 24}, type, window);
      // Groups of vectors that share loads: 7 heads per kv head (a run of 7
      // in a row alone on avx512, of 4 and 3 on avx2; runs of 8 across rows
      // of a span), and one head per kv head (a group is then rows of a
      // span, and a row alone is a group of one).
      ExpectRowsIndependentOfTheirStep({14, 2, 64, 64}, type, window);
      ExpectRowsIndependentOfTheirStep({8, 8, 80, 80}, type, window);
      // 128-wide heads: keys in panels of 8 x 16 elements (other widths
      // above: 4 and 16, and 5 through the kernel's any-width path).
      ExpectRowsIndependentOfTheirStep({4, 2, 128, 128}, type, window);
    }
  }
}

TEST(AttentionKernelTiersTest, Avx2AndAvx512GiveTheSameBytes) {
  if (!CpuSupports(CpuIsa::kAvx512Vnni) || !CpuSupports(CpuIsa::kAvx2)) GTEST_SKIP() << "needs both tiers";
  const CpuIsa saved = ActiveCpuIsa();
  for (const Heads& g : {Heads{9, 3, 64, 64}, Heads{4, 1, 256, 256}, Heads{6, 2, 40, 24}}) {
    const TestCache a(g, DType::kF16, 200, 16, 31, true), b(g, DType::kF16, 200, 16, 32, true);
    const Step s = MixedStep(g, a, 64, 190, 0, {&b}, 150, 33);
    ASSERT_TRUE(SetActiveCpuIsa(CpuIsa::kAvx2).ok());
    const std::vector<float> avx2 = RunStep(s, g, 0.125f, 0.0f, 2);
    ASSERT_TRUE(SetActiveCpuIsa(CpuIsa::kAvx512Vnni).ok());
    const std::vector<float> avx512 = RunStep(s, g, 0.125f, 0.0f, 2);
    EXPECT_EQ(avx2, avx512) << "k_dim " << g.k_dim;
  }
  ASSERT_TRUE(SetActiveCpuIsa(saved).ok());
}

}  // namespace
}  // namespace decoded::cpu
