#version 460
// The expert mat-vecs of a mixture-of-experts FFN (Graph::moe_ffn): for each
// (row, slot) pair p < m, out[p, r] = dot(W[e_p][r], x[p / x_div]) with e_p =
// ids[p], the expert the routing chose (moe.comp), W a 3-D GGUF weight of
// `planes` experts of n rows each, of type WTYPE. x_div = k for the gate and
// up projections (every slot of a row reads that row), 1 for the down
// projection (each pair has its own input).
//
// As matmul.comp: a subgroup per weight row, lanes over the row's 32-element
// units, subgroupAdd; but every pair has its own expert, so each dequantized
// unit serves one activation row. A pair's arithmetic depends on nothing but
// its expert and input, so batched rows equal their solo decode.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 64) in;
layout(push_constant, scalar) uniform Params {
  uint64_t w, x, out_, ids;
  uint64_t plane_bytes;  // bytes of one expert's matrix
  uint w_row_bytes;
  uint k;             // weight columns (whole 32-element units)
  uint m;             // (row, slot) pairs
  uint n;             // weight rows per expert = output columns
  uint x_row_stride;  // floats between input rows
  uint x_div;
  uint rows_per_group;
} p;

void main() {
  const uint r0 = linear_group() * p.rows_per_group;
  const uint r_end = min(r0 + p.rows_per_group, p.n);
  const uint lane = gl_SubgroupInvocationID;
  const uint units = (p.k + 31) / 32;
  float wv[32];
  for (uint r = r0 + gl_SubgroupID; r < r_end; r += gl_NumSubgroups) {
    for (uint pair = 0; pair < p.m; ++pair) {
      const uint e = uint(I32Buf(p.ids).v[pair]);
      const uint64_t row = p.w + uint64_t(e) * p.plane_bytes + uint64_t(r) * p.w_row_bytes;
      const uint xb0 = (pair / p.x_div) * p.x_row_stride;
      float acc = 0.0;
      for (uint u = lane; u < units; u += gl_SubgroupSize) {
        dequant_unit(row, u, p.k, wv);
        const uint jn = min(32u, p.k - 32 * u);
        float s = 0.0;
        for (uint j = 0; j < jn; ++j) s += wv[j] * F32Buf(p.x).v[xb0 + 32 * u + j];
        acc += s;
      }
      const float total = subgroupAdd(acc);
      if (lane == 0) F32Buf(p.out_).v[pair * p.n + r] = total;
    }
  }
}
