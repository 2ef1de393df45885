#include "engine/cpu/kernels.h"

#include <algorithm>
#include <cmath>
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

void GeluMul(const float* a, const float* b, float* out, int64_t n, int ith, int nth) {
  int64_t s, e;
  ElementShare(n, ith, nth, &s, &e);
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = s; i < e; ++i) {
    const float x = a[i];
    const float g = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
    out[i] = g * b[i];
  }
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
              int32_t head_dim, int ith, int nth) {
  const int64_t items = seq * n_heads;
  int64_t b, e;
  if (items * head_dim < kMinSplit) {
    b = 0;
    e = ith == 0 ? items : 0;
  } else {
    Share(items, ith, nth, &b, &e);
  }
  const int32_t half = head_dim / 2;
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
  }
}

void RopeAdjacent(const float* x, const float* cos, const float* sin, float* out, int64_t seq, int32_t n_heads,
                  int32_t head_dim, int ith, int nth) {
  const int64_t items = seq * n_heads;
  int64_t b, e;
  if (items * head_dim < kMinSplit) {
    b = 0;
    e = ith == 0 ? items : 0;
  } else {
    Share(items, ith, nth, &b, &e);
  }
  const int32_t half = head_dim / 2;
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
  }
}

void Attention(const float* q, const int32_t* bounds, const float* k, const float* v, float* out, int64_t seq,
               int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t capacity, float scale,
               float softcap, int ith, int nth) {
  constexpr int32_t kMaxHeadDim = 1024;
  const int32_t group = n_heads / n_kv_heads;
  const int64_t items = seq * n_heads;
  int64_t b, e;
  Share(items, ith, nth, &b, &e);
  float acc[kMaxHeadDim];
  for (int64_t it = b; it < e; ++it) {
    const int64_t t = it / n_heads;
    const int32_t h = static_cast<int32_t>(it % n_heads);
    const int32_t kvh = h / group;
    const float* qh = q + it * head_dim;
    const float* kh = k + static_cast<int64_t>(kvh) * capacity * head_dim;
    const float* vh = v + static_cast<int64_t>(kvh) * capacity * head_dim;
    const int32_t lo = bounds[2 * t];
    const int32_t hi = bounds[2 * t + 1];
    float m = -std::numeric_limits<float>::infinity();
    float l = 0.0f;
    std::fill(acc, acc + head_dim, 0.0f);
    for (int32_t j = lo; j < hi; ++j) {
      float s = DotF32(qh, kh + static_cast<int64_t>(j) * head_dim, head_dim) * scale;
      if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
      const float* vj = vh + static_cast<int64_t>(j) * head_dim;
      if (s > m) {
        const float corr = std::exp(m - s);  // 0 on the first key
        for (int32_t d = 0; d < head_dim; ++d) acc[d] = acc[d] * corr + vj[d];
        l = l * corr + 1.0f;
        m = s;
      } else {
        const float p = std::exp(s - m);
        for (int32_t d = 0; d < head_dim; ++d) acc[d] += p * vj[d];
        l += p;
      }
    }
    float* o = out + it * head_dim;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int32_t d = 0; d < head_dim; ++d) o[d] = acc[d] * inv;
  }
}

}  // namespace decoded::cpu
