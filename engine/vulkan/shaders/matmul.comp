#version 460
// out[i, r] = dot(W[r], x[i]) for every activation row i < m and weight row
// r < n: the mat-vec of decode (m = the batch) and the mat-mat of prefill.
// W is a GGUF weight of type WTYPE (dequant.glsl), x and out f32.
//
// A subgroup per weight row: its lanes take the row's 32-element units
// round-robin, dequantize each once and multiply it into up to kTile
// activation rows, then subgroupAdd their partials. A workgroup covers
// `rows_per_group` consecutive weight rows, its subgroups taking them in turn
// (the host picks one row per subgroup on a GPU, many on a CPU device, where
// each workgroup costs far more than a row). No barrier and no shared memory.
// Row r's arithmetic depends only on the device's subgroup size, never on m,
// on rows_per_group or on the other rows, so a session's logits in a batch
// equal its logits alone (the batch invariance the CPU keeps too).
//
// Grouped (Graph::head_matmul): the weight's rows are n_groups blocks of
// `per` rows, and block g multiplies columns [g * k, (g + 1) * k) of x.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
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
  uint rows_per_group;
} p;

const uint kTile = 8;

void main() {
  const uint r0 = linear_group() * p.rows_per_group;
  const uint r_end = min(r0 + p.rows_per_group, p.n);
  const uint lane = gl_SubgroupInvocationID;
  const uint lanes = gl_SubgroupSize;
  // Float weights may end in a partial unit (quantized rows never do).
  const uint units = (p.k + 31) / 32;
  float wv[32];
  // r is uniform across the subgroup, so subgroupAdd runs in uniform control flow.
  for (uint r = r0 + gl_SubgroupID; r < r_end; r += gl_NumSubgroups) {
    const uint64_t row = p.w + uint64_t(r) * p.w_row_bytes;
    const uint x_col0 = (r / p.per) * p.k;
    for (uint i0 = 0; i0 < p.m; i0 += kTile) {
      const uint tile = min(kTile, p.m - i0);
      float acc[kTile];
      for (uint i = 0; i < kTile; ++i) acc[i] = 0.0;
      for (uint u = lane; u < units; u += lanes) {
        dequant_unit(row, u, p.k, wv);
        const uint jn = min(32u, p.k - 32 * u);
        for (uint i = 0; i < tile; ++i) {
          const uint xb = (i0 + i) * p.x_row_stride + x_col0 + 32 * u;
          float s = 0.0;
          for (uint j = 0; j < jn; ++j) s += wv[j] * F32Buf(p.x).v[xb + j];
          acc[i] += s;
        }
      }
      for (uint i = 0; i < tile; ++i) {
        const float total = subgroupAdd(acc[i]);
        if (lane == 0) F32Buf(p.out_).v[(i0 + i) * p.n + r] = total;
      }
    }
  }
}
