#version 460
// The routing and the weighted sum of a mixture-of-experts FFN
// (Graph::moe_ffn; the order of engine/moe_routing.h, as the CPU's
// cpu::MoeRoute computes it):
//
//   mode 0, one invocation per row: probs p = softmax or sigmoid of the
//     router logits; selection s = p + bias; group-limited selection (kept:
//     the topk_group groups of largest max or top-2 sum); the k largest s in
//     descending order, ties to the lower index; weights w_j = p[e_j],
//     normalized when norm_topk_prob, times scale. Writes ids [rows, k] (i32)
//     and weights [rows, k], using `scratch` (2 * n_expert + 2 * n_group
//     floats per row).
//   mode 1, one invocation per output element (row, c): out = sum over j in
//     routing order of w_j * down[row * k + j, c].
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant, scalar) uniform Params {
  uint64_t logits, bias, ids, weights, scratch, down, out_;
  uint rows, n_expert, k, gating, norm_topk, n_group, topk_group, group_score, has_bias, mode, hidden;
  float scale;
} p;

#define kOut uintBitsToFloat(0xff800000u)  // -inf: ineligible or taken

// Index of the largest of count floats at base (strict >: the lower index wins ties).
uint argmax_at(uint64_t base, uint count) {
  uint best = 0;
  for (uint i = 1; i < count; ++i) {
    if (F32Buf(base).v[i] > F32Buf(base).v[best]) best = i;
  }
  return best;
}

void route(uint row) {
  const uint n = p.n_expert;
  const uint64_t pr = p.scratch + uint64_t(row) * (2 * n + 2 * p.n_group) * 4;
  const uint64_t sel = pr + uint64_t(n) * 4;
  const uint64_t logits = p.logits + uint64_t(row) * n * 4;
  if (p.gating == 1) {
    for (uint e = 0; e < n; ++e) F32Buf(pr).v[e] = 1.0 / (1.0 + exp(-F32Buf(logits).v[e]));
  } else {
    float mx = kOut;
    for (uint e = 0; e < n; ++e) mx = max(mx, F32Buf(logits).v[e]);
    float sum = 0.0;
    for (uint e = 0; e < n; ++e) sum += exp(F32Buf(logits).v[e] - mx);
    const float inv = 1.0 / sum;
    for (uint e = 0; e < n; ++e) F32Buf(pr).v[e] = exp(F32Buf(logits).v[e] - mx) * inv;
  }
  for (uint e = 0; e < n; ++e) {
    F32Buf(sel).v[e] = F32Buf(pr).v[e] + (p.has_bias != 0 ? F32Buf(p.bias).v[e] : 0.0);
  }
  if (p.n_group > 1) {
    const uint per = n / p.n_group;
    const uint64_t group = sel + uint64_t(n) * 4;
    const uint64_t kept = group + uint64_t(p.n_group) * 4;
    for (uint g = 0; g < p.n_group; ++g) {
      const uint64_t v = sel + uint64_t(g) * per * 4;
      const uint top = argmax_at(v, per);
      float score = F32Buf(v).v[top];
      if (p.group_score == 1 && per >= 2) {
        uint second = top == 0 ? 1 : 0;
        for (uint i = 0; i < per; ++i) {
          if (i != top && F32Buf(v).v[i] > F32Buf(v).v[second]) second = i;
        }
        score += F32Buf(v).v[second];
      }
      F32Buf(group).v[g] = score;
      F32Buf(kept).v[g] = 0.0;
    }
    for (uint j = 0; j < p.topk_group; ++j) {
      const uint best = argmax_at(group, p.n_group);
      F32Buf(kept).v[best] = 1.0;
      F32Buf(group).v[best] = kOut;
    }
    for (uint g = 0; g < p.n_group; ++g) {
      if (F32Buf(kept).v[g] == 0.0) {
        for (uint i = 0; i < per; ++i) F32Buf(sel).v[g * per + i] = kOut;
      }
    }
  }
  const uint o = row * p.k;
  for (uint j = 0; j < p.k; ++j) {
    const uint best = argmax_at(sel, n);
    I32Buf(p.ids).v[o + j] = int(best);
    F32Buf(p.weights).v[o + j] = F32Buf(pr).v[best];
    F32Buf(sel).v[best] = kOut;
  }
  if (p.norm_topk != 0) {
    float total = 0.0;
    for (uint j = 0; j < p.k; ++j) total += F32Buf(p.weights).v[o + j];
    for (uint j = 0; j < p.k; ++j) F32Buf(p.weights).v[o + j] /= total;
  }
  if (p.scale != 1.0) {
    for (uint j = 0; j < p.k; ++j) F32Buf(p.weights).v[o + j] *= p.scale;
  }
}

void main() {
  const uint i = linear_group() * 64 + gl_LocalInvocationID.x;
  if (p.mode == 0) {
    if (i < p.rows) route(i);
    return;
  }
  if (i >= p.rows * p.hidden) return;
  const uint row = i / p.hidden, c = i % p.hidden;
  float acc = 0.0;
  for (uint j = 0; j < p.k; ++j) {
    acc += F32Buf(p.weights).v[row * p.k + j] * F32Buf(p.down).v[(row * p.k + j) * p.hidden + c];
  }
  F32Buf(p.out_).v[i] = acc;
}
