#version 460
// Element-wise ops, one invocation per output element (`op` selects):
//   0 add       out = a + b
//   1 scale     out = a * f
//   2 gelu_mul  out = gelu_tanh(a) * b   (Hendrycks & Gimpel 2016; HF gelu_pytorch_tanh)
//   3 gelu      out = gelu_tanh(a)
//   4 swiglu    out = silu(a) * b, silu(x) = x / (1 + e^-x)  (Shazeer 2020)
//   5 add_row   out = a + b[i % cols]    (a bias row added to every row)
//   6 softcap   out = f * tanh(a / f)    (Gemma 2/3)
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant, scalar) uniform Params {
  uint64_t a, b, out_;
  uint n;
  uint op;
  float f;
  uint cols;
} p;

// tanh through e^(-2|u|): no overflow for large |u| (GLSL's tanh may be
// computed as a ratio of exponentials that overflows).
float stable_tanh(float u) {
  const float e = exp(-2.0 * abs(u));
  return sign(u) * (1.0 - e) / (1.0 + e);
}

float gelu_tanh(float x) {
  const float kSqrt2OverPi = 0.7978845608028654;
  return 0.5 * x * (1.0 + stable_tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

void main() {
  const uint i = linear_group() * 256 + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  const float a = F32Buf(p.a).v[i];
  float o;
  switch (p.op) {
    case 0: o = a + F32Buf(p.b).v[i]; break;
    case 1: o = a * p.f; break;
    case 2: o = gelu_tanh(a) * F32Buf(p.b).v[i]; break;
    case 3: o = gelu_tanh(a); break;
    case 4: o = a / (1.0 + exp(-a)) * F32Buf(p.b).v[i]; break;
    case 5: o = a + F32Buf(p.b).v[i % p.cols]; break;
    default: o = p.f * stable_tanh(a / p.f); break;
  }
  F32Buf(p.out_).v[i] = o;
}
