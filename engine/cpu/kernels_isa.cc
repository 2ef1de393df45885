// The f32 op kernels of kernels.h, compiled once per tier of engine/cpu_isa.h
// into namespace cpu::<tier> (kernels_isa.h). Plain C++ that the compiler
// vectorizes for the tier's -march: the fixed 16-lane partial sums keep the
// summation order the same on every tier, and nothing is contracted into an
// FMA (-ffp-contract=off, CMakeLists.txt), so these kernels give the same bits
// on every tier and at every -O level. The attention kernel is in
// attention_isa.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_isa.h"
#include "engine/exp_poly.h"
#include "engine/kv_layout.h"
#include "engine/kv_rows.h"
#include "engine/quant/blocks.h"
#include "engine/quant/quant.h"

namespace decoded::cpu::DECODED_ISA_NS {
namespace {
// Elementwise ops on a single decode row are too small to split: one thread
// does them and the others go straight to the barrier.
constexpr int64_t kMinSplit = 4096;

inline void ElementShare(int64_t n, int ith, int nth, int64_t* b, int64_t* e) {
  if (n < kMinSplit) {
    *b = 0;
    *e = ith == 0 ? n : 0;
    return;
  }
  Share(n, ith, nth, b, e);
}

// The share of `items` items of `item_size` elements each: split like
// ElementShare by total size, but never inside an item.
inline void ItemShare(int64_t items, int64_t item_size, int ith, int nth, int64_t* b, int64_t* e) {
  if (items * item_size < kMinSplit) {
    *b = 0;
    *e = ith == 0 ? items : 0;
    return;
  }
  Share(items, ith, nth, b, e);
}

// e^x, x clamped to [-87, 88] (engine/exp_poly.h): branch-free, so loops over
// it vectorize for the tier (glibc's tanhf / expm1f calls did not, and cost a
// sixth of Gemma 3's prefill).
inline float ExpF(float x) { return ExpPoly(std::min(std::max(x, -87.0f), 88.0f)); }

// tanh(u) = sign(u) (1 - e) / (1 + e), e = e^(-2|u|) in (0, 1]: no overflow;
// absolute error a few 2^-24, which is what GELU's 1 + tanh(u) needs (near
// u = 0 the relative error of tanh itself grows: not for other uses).
inline float TanhF(float u) {
  const float e = ExpF(-2.0f * std::fabs(u));
  return std::copysign((1.0f - e) / (1.0f + e), u);
}

// SiLU (HF ACT2FN["silu"], ggml_silu_f32): x sigmoid(x) = x / (1 + e^-x), e^-x
// by ExpF (clamped: x below -88 gives x / e^88, some 1e-37, where the true
// value is smaller still; above 87, x). Relative error a few 2^-24; libm's
// expf, called per element, did not vectorize and cost 3-4% of a prefill.
inline float SiluF(float x) { return x / (1.0f + ExpF(-x)); }

// GELU, tanh approximation (HF gelu_pytorch_tanh / gelu_new; ggml_gelu_f32's
// formula): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + TanhF(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// Sum in 16 independent lanes, as DotF32.
float SumF32(const float* a, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i];
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0] + tail;
}
}  // namespace

float DotF32(const float* a, const float* b, int64_t n) {
  // 16 independent partial sums in a fixed order: vectorizes without
  // -ffast-math and stays deterministic.
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0] + tail;
}

void RmsNormRows(const float* x, const float* w, float* out, int64_t rows, int64_t cols, int64_t group,
                 float eps, int ith, int nth) {
  const int64_t groups = rows * (cols / group);
  int64_t b, e;
  if (groups * group < kMinSplit) {
    b = 0;
    e = ith == 0 ? groups : 0;
  } else {
    Share(groups, ith, nth, &b, &e);
  }
  for (int64_t g = b; g < e; ++g) {
    const float* xs = x + g * group;
    float* o = out + g * group;
    const float ms = DotF32(xs, xs, group) / static_cast<float>(group);
    const float r = 1.0f / std::sqrt(ms + eps);
    for (int64_t i = 0; i < group; ++i) o[i] = xs[i] * r * w[i];
  }
}

void LayerNormRows(const float* x, const float* w, const float* b, float* out, int64_t rows, int64_t cols,
                   int64_t group, float eps, int ith, int nth) {
  int64_t gb, ge;
  ItemShare(rows * (cols / group), group, ith, nth, &gb, &ge);
  const float inv_n = 1.0f / static_cast<float>(group);
  for (int64_t g = gb; g < ge; ++g) {
    const float* xs = x + g * group;
    float* o = out + g * group;
    const float mean = SumF32(xs, group) * inv_n;
    for (int64_t i = 0; i < group; ++i) o[i] = xs[i] - mean;
    // Two passes (centre, then square) as torch does: no cancellation in
    // E[x^2] - E[x]^2 for rows far from zero mean.
    const float r = 1.0f / std::sqrt(DotF32(o, o, group) * inv_n + eps);
    if (b != nullptr) {
      for (int64_t i = 0; i < group; ++i) o[i] = o[i] * r * w[i] + b[i];
    } else {
      for (int64_t i = 0; i < group; ++i) o[i] = o[i] * r * w[i];
    }
  }
}

void GeluMul(const float* a, const float* b, float* out, int64_t n, int ith, int nth) {
  int64_t s, e;
  ElementShare(n, ith, nth, &s, &e);
  for (int64_t i = s; i < e; ++i) out[i] = GeluTanh(a[i]) * b[i];
}

void Gelu(const float* x, float* out, int64_t n, int ith, int nth) {
  int64_t s, e;
  ElementShare(n, ith, nth, &s, &e);
  for (int64_t i = s; i < e; ++i) out[i] = GeluTanh(x[i]);
}

void SiluMul(const float* a, const float* b, float* out, int64_t n, int ith, int nth) {
  int64_t s, e;
  ElementShare(n, ith, nth, &s, &e);
  for (int64_t i = s; i < e; ++i) out[i] = SiluF(a[i]) * b[i];
}

void AddRow(const float* x, const float* bias, float* out, int64_t rows, int64_t cols, int ith, int nth) {
  int64_t s, e;
  ElementShare(rows * cols, ith, nth, &s, &e);
  for (int64_t i = s; i < e; ++i) out[i] = x[i] + bias[i % cols];
}

void Add(const float* a, const float* b, float* out, int64_t n, int ith, int nth) {
  int64_t s, e;
  ElementShare(n, ith, nth, &s, &e);
  for (int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
}

void Scale(const float* x, float sc, float* out, int64_t n, int ith, int nth) {
  int64_t s, e;
  ElementShare(n, ith, nth, &s, &e);
  for (int64_t i = s; i < e; ++i) out[i] = x[i] * sc;
}

void Softcap(const float* x, float cap, float* out, int64_t n, int ith, int nth) {
  int64_t s, e;
  Share(n, ith, nth, &s, &e);
  const float inv = 1.0f / cap;
  for (int64_t i = s; i < e; ++i) out[i] = cap * std::tanh(x[i] * inv);
}

void RopeNeox(const float* x, const float* cos, const float* sin, float* out, int64_t seq, int32_t n_heads,
              int32_t head_dim, int32_t rot_dim, int ith, int nth) {
  int64_t b, e;
  ItemShare(seq * n_heads, head_dim, ith, nth, &b, &e);
  const int32_t half = rot_dim / 2;
  for (int64_t it = b; it < e; ++it) {
    const int64_t t = it / n_heads;
    const float* xs = x + it * head_dim;
    float* o = out + it * head_dim;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int32_t d = 0; d < half; ++d) {
      const float x0 = xs[d];
      const float x1 = xs[d + half];
      o[d] = x0 * c[d] - x1 * s[d];
      o[d + half] = x0 * s[d] + x1 * c[d];
    }
    for (int32_t d = rot_dim; d < head_dim; ++d) o[d] = xs[d];
  }
}

void RopeAdjacent(const float* x, const float* cos, const float* sin, float* out, int64_t seq, int32_t n_heads,
                  int32_t head_dim, int32_t rot_dim, int ith, int nth) {
  int64_t b, e;
  ItemShare(seq * n_heads, head_dim, ith, nth, &b, &e);
  const int32_t half = rot_dim / 2;
  for (int64_t it = b; it < e; ++it) {
    const int64_t t = it / n_heads;
    const float* xs = x + it * head_dim;
    float* o = out + it * head_dim;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int32_t i = 0; i < half; ++i) {
      const float x0 = xs[2 * i];
      const float x1 = xs[2 * i + 1];
      o[2 * i] = x0 * c[i] - x1 * s[i];
      o[2 * i + 1] = x0 * s[i] + x1 * c[i];
    }
    for (int32_t d = rot_dim; d < head_dim; ++d) o[d] = xs[d];
  }
}

void HeadSlice(const float* x, float* out, int64_t rows, int32_t n_groups, int32_t width, int32_t begin,
               int32_t count, int ith, int nth) {
  int64_t b, e;
  Share(rows * n_groups, ith, nth, &b, &e);
  for (int64_t it = b; it < e; ++it) {
    std::memcpy(out + it * count, x + it * width + begin, static_cast<size_t>(count) * sizeof(float));
  }
}

void HeadConcat(const float* a, const float* b, float* out, int64_t rows, int32_t n_groups, int32_t wa, int32_t wb,
                int ith, int nth) {
  int64_t lo, hi;
  Share(rows * n_groups, ith, nth, &lo, &hi);
  for (int64_t it = lo; it < hi; ++it) {
    float* o = out + it * (wa + wb);
    std::memcpy(o, a + it * wa, static_cast<size_t>(wa) * sizeof(float));
    std::memcpy(o + wa, b + it * wb, static_cast<size_t>(wb) * sizeof(float));
  }
}

void MoeRoute(const float* logits, const float* bias, const MoeRouting& r, float* scratch, int32_t* experts,
              float* weights) {
  const int32_t n = r.n_expert;
  float* p = scratch;      // gating probabilities: the weights come from these
  float* sel = p + n;      // selection scores: -inf once ineligible or taken
  if (r.gating == MoeGating::kSigmoid) {
    for (int32_t e = 0; e < n; ++e) p[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    float mx = -std::numeric_limits<float>::infinity();
    for (int32_t e = 0; e < n; ++e) mx = std::max(mx, logits[e]);
    float sum = 0.0f;
    for (int32_t e = 0; e < n; ++e) sum += std::exp(logits[e] - mx);
    const float inv = 1.0f / sum;
    for (int32_t e = 0; e < n; ++e) p[e] = std::exp(logits[e] - mx) * inv;
  }
  for (int32_t e = 0; e < n; ++e) sel[e] = bias != nullptr ? p[e] + bias[e] : p[e];
  constexpr float kOut = -std::numeric_limits<float>::infinity();
  // Selection by repeated scans: k, n_group and n_expert are small (k <= 16,
  // n_expert <= a few hundred), and the strict > keeps the lower index on ties.
  auto argmax = [](const float* v, int32_t count) {
    int32_t best = 0;
    for (int32_t i = 1; i < count; ++i) {
      if (v[i] > v[best]) best = i;
    }
    return best;
  };
  if (r.n_group > 1) {
    const int32_t per = n / r.n_group;
    float* group = sel + n;        // group scores, -inf once kept
    float* kept = group + r.n_group;  // 1 for the topk_group kept groups
    for (int32_t g = 0; g < r.n_group; ++g) {
      const float* v = sel + ptrdiff_t{g} * per;
      const int32_t top = argmax(v, per);
      float score = v[top];
      if (r.group_score == MoeGroupScore::kTop2Sum && per >= 2) {
        int32_t second = top == 0 ? 1 : 0;
        for (int32_t i = 0; i < per; ++i) {
          if (i != top && v[i] > v[second]) second = i;
        }
        score += v[second];
      }
      group[g] = score;
      kept[g] = 0.0f;
    }
    for (int32_t j = 0; j < r.topk_group; ++j) {
      const int32_t best = argmax(group, r.n_group);
      kept[best] = 1.0f;
      group[best] = kOut;
    }
    for (int32_t g = 0; g < r.n_group; ++g) {
      if (kept[g] == 0.0f) std::fill(sel + ptrdiff_t{g} * per, sel + ptrdiff_t{g + 1} * per, kOut);
    }
  }
  for (int32_t j = 0; j < r.k; ++j) {
    const int32_t best = argmax(sel, n);
    experts[j] = best;
    weights[j] = p[best];
    sel[best] = kOut;
  }
  if (r.norm_topk_prob) {
    float total = 0.0f;
    for (int32_t j = 0; j < r.k; ++j) total += weights[j];
    for (int32_t j = 0; j < r.k; ++j) weights[j] /= total;
  }
  if (r.scale != 1.0f) {
    for (int32_t j = 0; j < r.k; ++j) weights[j] *= r.scale;
  }
}

namespace {

constexpr size_t kWorkspaceAlign = 64;
size_t AlignWs(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

// Where each part of the MoE workspace lives; `pairs` = rows * k.
struct MoeWorkspace {
  size_t experts = 0, weights = 0, route = 0, xq_gate = 0, xq_up = 0, gate = 0, up = 0, hq = 0, down = 0, total = 0;
  size_t xq_gate_row = 0, xq_up_row = 0, hq_row = 0;
  bool shared_xq = false;  // gate and up take the same activation type

  explicit MoeWorkspace(const MoeFfnArgs& a) {
    const size_t pairs = static_cast<size_t>(a.rows) * static_cast<size_t>(a.routing.k);
    const size_t hidden = static_cast<size_t>(a.gate.cols), ffn = static_cast<size_t>(a.gate.rows);
    xq_gate_row = quant::ActivationRowBytes(a.gate.type, a.gate.cols);
    xq_up_row = quant::ActivationRowBytes(a.up.type, a.up.cols);
    hq_row = quant::ActivationRowBytes(a.down.type, a.down.cols);
    shared_xq = quant::ActivationType(a.gate.type) == quant::ActivationType(a.up.type);
    size_t at = 0;
    auto take = [&at](size_t bytes) {
      const size_t off = at;
      at += AlignWs(bytes);
      return off;
    };
    experts = take(pairs * sizeof(int32_t));
    weights = take(pairs * sizeof(float));
    route = take(static_cast<size_t>(a.rows) * static_cast<size_t>(MoeRouteScratchFloats(a.routing)) * sizeof(float));
    xq_gate = take(static_cast<size_t>(a.rows) * xq_gate_row);
    xq_up = shared_xq ? xq_gate : take(static_cast<size_t>(a.rows) * xq_up_row);
    gate = take(pairs * ffn * sizeof(float));
    up = take(pairs * ffn * sizeof(float));
    hq = take(pairs * hq_row);
    down = take(pairs * hidden * sizeof(float));
    total = at;
  }
};

const uint8_t* Plane(const MoeExpertMatrix& m, int32_t e) {
  return m.data + static_cast<size_t>(e) * static_cast<size_t>(m.rows) * m.row_bytes;
}

}  // namespace

size_t MoeFfnWorkspaceBytes(const MoeFfnArgs& a) { return MoeWorkspace(a).total; }

void MoeFfn(const MoeFfnArgs& a, int ith, int nth, absl::FunctionRef<void()> barrier) {
  const MoeWorkspace ws(a);
  auto* base = static_cast<uint8_t*>(a.workspace);
  auto* experts = reinterpret_cast<int32_t*>(base + ws.experts);
  auto* weights = reinterpret_cast<float*>(base + ws.weights);
  auto* route = reinterpret_cast<float*>(base + ws.route);
  const int32_t k = a.routing.k, n_expert = a.routing.n_expert;
  const int64_t route_floats = MoeRouteScratchFloats(a.routing);
  uint8_t* xq_gate = base + ws.xq_gate;
  uint8_t* xq_up = base + ws.xq_up;
  auto* gate = reinterpret_cast<float*>(base + ws.gate);
  auto* up = reinterpret_cast<float*>(base + ws.up);
  uint8_t* hq = base + ws.hq;
  auto* down = reinterpret_cast<float*>(base + ws.down);
  const int64_t hidden = a.gate.cols, ffn = a.gate.rows, pairs = a.rows * k;
  int64_t b, e;

  // Routing and the activation conversions, one row per item.
  Share(a.rows, ith, nth, &b, &e);
  for (int64_t r = b; r < e; ++r) {
    MoeRoute(a.router_logits + r * n_expert, a.selection_bias, a.routing, route + r * route_floats, experts + r * k,
             weights + r * k);
    quant::QuantizeActivationRow(a.gate.type, a.x + r * hidden, hidden, xq_gate + r * ws.xq_gate_row);
    if (!ws.shared_xq) quant::QuantizeActivationRow(a.up.type, a.x + r * hidden, hidden, xq_up + r * ws.xq_up_row);
  }
  barrier();

  // gate and up rows of each selected expert, split by output row.
  Share(ffn, ith, nth, &b, &e);
  if (b < e) {
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t r = p / k;
      const int32_t ex = experts[p];
      quant::MatMul(a.gate.type, Plane(a.gate, ex), a.gate.row_bytes, hidden, xq_gate + r * ws.xq_gate_row,
                    ws.xq_gate_row, 1, gate + p * ffn, ffn, b, e);
      quant::MatMul(a.up.type, Plane(a.up, ex), a.up.row_bytes, hidden, xq_up + r * ws.xq_up_row, ws.xq_up_row, 1,
                    up + p * ffn, ffn, b, e);
    }
  }
  barrier();

  // silu(gate) * up, converted for the down projection, one pair per item.
  Share(pairs, ith, nth, &b, &e);
  for (int64_t p = b; p < e; ++p) {
    float* g = gate + p * ffn;
    const float* u = up + p * ffn;
    for (int64_t i = 0; i < ffn; ++i) g[i] = SiluF(g[i]) * u[i];
    quant::QuantizeActivationRow(a.down.type, g, ffn, hq + p * ws.hq_row);
  }
  barrier();

  Share(hidden, ith, nth, &b, &e);
  if (b < e) {
    for (int64_t p = 0; p < pairs; ++p) {
      quant::MatMul(a.down.type, Plane(a.down, experts[p]), a.down.row_bytes, ffn, hq + p * ws.hq_row, ws.hq_row, 1,
                    down + p * hidden, hidden, b, e);
    }
  }
  barrier();

  // The weighted sum over each row's experts, in routing order.
  Share(a.rows * hidden, ith, nth, &b, &e);
  for (int64_t i = b; i < e; ++i) {
    const int64_t r = i / hidden, c = i % hidden;
    float acc = 0.0f;
    for (int32_t j = 0; j < k; ++j) acc += weights[r * k + j] * down[(r * k + j) * hidden + c];
    a.out[i] = acc;
  }
}

}  // namespace decoded::cpu::DECODED_ISA_NS
