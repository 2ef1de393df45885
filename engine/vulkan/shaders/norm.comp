#version 460
// RMSNorm (Zhang & Sennrich 2019): out = x * rsqrt(mean(x^2) + eps) * w, and
// LayerNorm (Ba et al. 2016; torch.nn.LayerNorm, biased variance, two passes:
// centre, then square) out = (x - mean) * rsqrt(var + eps) * w [+ b], each
// over every group of `group` elements of a row (group == cols: whole rows;
// group == head_dim: per-head q/k norms). One workgroup per group; partial
// sums reduced in a fixed tree.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant, scalar) uniform Params {
  uint64_t x, w, b, out_;  // b == 0: no bias
  uint group;
  uint n_groups;           // rows * (cols / group)
  float eps;
  uint layer_norm;         // 0: RMSNorm, 1: LayerNorm
} p;

shared float red[64];

float reduce_sum(float v) {
  const uint tid = gl_LocalInvocationID.x;
  red[tid] = v;
  barrier();
  for (uint s = 32; s > 0; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    barrier();
  }
  const float total = red[0];
  barrier();
  return total;
}

void main() {
  const uint g = linear_group();
  if (g >= p.n_groups) return;
  const uint tid = gl_LocalInvocationID.x;
  const uint base = g * p.group;
  const float inv_n = 1.0 / float(p.group);
  float mean = 0.0;
  if (p.layer_norm != 0) {
    float s = 0.0;
    for (uint i = tid; i < p.group; i += 64) s += F32Buf(p.x).v[base + i];
    mean = reduce_sum(s) * inv_n;
  }
  float ss = 0.0;
  for (uint i = tid; i < p.group; i += 64) {
    const float c = F32Buf(p.x).v[base + i] - mean;
    ss += c * c;
  }
  const float r = 1.0 / sqrt(reduce_sum(ss) * inv_n + p.eps);
  for (uint i = tid; i < p.group; i += 64) {
    float o = (F32Buf(p.x).v[base + i] - mean) * r * F32Buf(p.w).v[i];
    if (p.b != 0) o += F32Buf(p.b).v[i];
    F32Buf(p.out_).v[base + i] = o;
  }
}
