#version 460
// out[i] = dequant(table[ids[i]]): the token embedding lookup, for a table of
// type WTYPE. One workgroup per output row; threads take its 32-element units.
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 64) in;
layout(push_constant, scalar) uniform Params {
  uint64_t table, ids, out_;
  uint row_bytes;
  uint cols;  // whole 32-element units unless the type is float
  uint rows;  // output rows (ids)
} p;

void main() {
  const uint i = linear_group();
  if (i >= p.rows) return;
  const uint64_t row = p.table + uint64_t(I32Buf(p.ids).v[i]) * p.row_bytes;
  float v[32];
  for (uint u = gl_LocalInvocationID.x; u < (p.cols + 31) / 32; u += 64) {
    dequant_unit(row, u, p.cols, v);
    for (uint j = 0; j < min(32u, p.cols - 32 * u); ++j) F32Buf(p.out_).v[i * p.cols + 32 * u + j] = v[j];
  }
}
