#include "engine/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace decoded::cpu {
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

inline float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
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
  for (int64_t i = s; i < e; ++i) {
    const float x = a[i];
    out[i] = x / (1.0f + std::exp(-x)) * b[i];
  }
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

void Attention(const float* q, const int32_t* bounds, const float* k, const float* v, float* out, int64_t seq,
               int32_t n_heads, int32_t n_kv_heads, int32_t k_dim, int32_t v_dim, int32_t v_stride,
               int32_t capacity, float scale, float softcap, int ith, int nth) {
  const int32_t group = n_heads / n_kv_heads;
  const int64_t items = seq * n_heads;
  int64_t b, e;
  Share(items, ith, nth, &b, &e);
  float acc[kMaxValueDim];
  for (int64_t it = b; it < e; ++it) {
    const int64_t t = it / n_heads;
    const int32_t h = static_cast<int32_t>(it % n_heads);
    const int32_t kvh = h / group;
    const float* qh = q + it * k_dim;
    const float* kh = k + static_cast<int64_t>(kvh) * capacity * k_dim;
    const float* vh = v + static_cast<int64_t>(kvh) * capacity * v_stride;
    const int32_t lo = bounds[2 * t];
    const int32_t hi = bounds[2 * t + 1];
    float m = -std::numeric_limits<float>::infinity();
    float l = 0.0f;
    std::fill(acc, acc + v_dim, 0.0f);
    for (int32_t j = lo; j < hi; ++j) {
      float s = DotF32(qh, kh + static_cast<int64_t>(j) * k_dim, k_dim) * scale;
      if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
      const float* vj = vh + static_cast<int64_t>(j) * v_stride;
      if (s > m) {
        const float corr = std::exp(m - s);  // 0 on the first key
        for (int32_t d = 0; d < v_dim; ++d) acc[d] = acc[d] * corr + vj[d];
        l = l * corr + 1.0f;
        m = s;
      } else {
        const float p = std::exp(s - m);
        for (int32_t d = 0; d < v_dim; ++d) acc[d] += p * vj[d];
        l += p;
      }
    }
    float* o = out + it * v_dim;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int32_t d = 0; d < v_dim; ++d) o[d] = acc[d] * inv;
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

}  // namespace decoded::cpu
