#version 460
// out[i, r] = dot(W[r], x[i]) for every activation row i < m and weight row
// r < n: the mat-vec of decode (m = the batch) and the mat-mat of prefill.
// W is a GGUF weight of type WTYPE (dequant.glsl), x and out f32.
//
// One workgroup per weight row: its 64 threads take the row's 32-element
// units round-robin, dequantize each once and multiply it into up to
// kTile activation rows, then sum their partials in a fixed tree. Row i's
// arithmetic does not depend on m or on the other rows, so a session's logits
// in a batch equal its logits alone (the batch invariance the CPU keeps too).
//
// Grouped (Graph::head_matmul): the weight's rows are n_groups blocks of
// `per` rows, and block g multiplies columns [g * k, (g + 1) * k) of x.
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 64) in;
layout(push_constant, scalar) uniform Params {
  uint64_t w, x, out_;
  uint w_row_bytes;
  uint k;             // weight columns (whole 32-element units unless the type is float)
  uint m;             // activation rows
  uint n;             // weight rows = output columns
  uint x_row_stride;  // floats between activation rows
  uint per;           // weight rows per group (n when not grouped)
} p;

const uint kTile = 8;
shared float red[kTile][64];

void main() {
  const uint r = linear_group();
  if (r >= p.n) return;
  const uint tid = gl_LocalInvocationID.x;
  const uint64_t row = p.w + uint64_t(r) * p.w_row_bytes;
  const uint x_col0 = (r / p.per) * p.k;
  // Float weights may end in a partial unit (quantized rows never do).
  const uint units = (p.k + 31) / 32;
  float wv[32];
  for (uint i0 = 0; i0 < p.m; i0 += kTile) {
    const uint tile = min(kTile, p.m - i0);
    float acc[kTile];
    for (uint i = 0; i < kTile; ++i) acc[i] = 0.0;
    for (uint u = tid; u < units; u += 64) {
      dequant_unit(row, u, p.k, wv);
      const uint jn = min(32u, p.k - 32 * u);
      for (uint i = 0; i < tile; ++i) {
        const uint xb = (i0 + i) * p.x_row_stride + x_col0 + 32 * u;
        float s = 0.0;
        for (uint j = 0; j < jn; ++j) s += wv[j] * F32Buf(p.x).v[xb + j];
        acc[i] += s;
      }
    }
    for (uint i = 0; i < kTile; ++i) red[i][tid] = acc[i];
    barrier();
    for (uint s = 32; s > 0; s >>= 1) {
      if (tid < s) {
        for (uint i = 0; i < tile; ++i) red[i][tid] += red[i][tid + s];
      }
      barrier();
    }
    if (tid < tile) F32Buf(p.out_).v[(i0 + tid) * p.n + r] = red[tid][0];
    barrier();
  }
}
