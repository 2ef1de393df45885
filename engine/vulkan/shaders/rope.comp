#version 460
// Rotary embedding (Su et al. 2021, RoFormer) of the first rot_dims of every
// head; dimensions [rot_dims, head_dim) pass through (partial rotary). With
// NeoX pairing (HF rotate_half) element d pairs with d + rot_dims / 2 and uses
// frequency d; with adjacent pairing (llama.cpp NORM) 2i pairs with 2i + 1
// and uses frequency i. x, out [seq, n_heads * head_dim]; cos, sin
// [seq, rot_dims / 2], already offset to the layer's variant rows.
// One invocation per output element.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant, scalar) uniform Params {
  uint64_t x, cos_, sin_, out_;
  uint seq, n_heads, head_dim, rot_dims;
  uint adjacent;
} p;

void main() {
  const uint e = linear_group() * 256 + gl_LocalInvocationID.x;
  if (e >= p.seq * p.n_heads * p.head_dim) return;
  const uint d = e % p.head_dim;
  const uint head = e - d;  // first element of this head
  const uint t = e / (p.n_heads * p.head_dim);
  const uint half_ = p.rot_dims / 2;
  float o;
  if (d >= p.rot_dims) {
    o = F32Buf(p.x).v[e];
  } else if (p.adjacent != 0) {
    const uint i = d / 2;
    const float x0 = F32Buf(p.x).v[head + 2 * i], x1 = F32Buf(p.x).v[head + 2 * i + 1];
    const float c = F32Buf(p.cos_).v[t * half_ + i], s = F32Buf(p.sin_).v[t * half_ + i];
    o = (d & 1u) == 0 ? x0 * c - x1 * s : x0 * s + x1 * c;
  } else {
    const uint i = d < half_ ? d : d - half_;
    const float x0 = F32Buf(p.x).v[head + i], x1 = F32Buf(p.x).v[head + i + half_];
    const float c = F32Buf(p.cos_).v[t * half_ + i], s = F32Buf(p.sin_).v[t * half_ + i];
    o = d < half_ ? x0 * c - x1 * s : x0 * s + x1 * c;
  }
  F32Buf(p.out_).v[e] = o;
}
