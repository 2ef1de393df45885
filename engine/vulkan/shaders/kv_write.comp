#version 460
// Writes row t of x [rows, n_kv_heads * head_dim] into the K (is_v = 0) or
// V pool of layer `layer` of row t's KV cache, at row t's offset, through the
// cache's block table. Caches come from the step's KV binding table
// (engine/kv_rows.h: i64 [rows, stride], row t = capacity, block_tokens, the
// block table's address, then the K and V pool addresses of every layer);
// offsets from an i32 [rows] buffer (the device-offset data node, or the
// plan's copy of the host symbols on the symbol path). An offset outside the
// cache or in an unmapped block sets *fault and writes nothing. One
// invocation per element.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant, scalar) uniform Params {
  uint64_t x, kv_rows, offsets, fault;
  uint rows, n_kv_heads, head_dim, layer, stride, is_v;
} p;

void main() {
  const uint e = linear_group() * 256 + gl_LocalInvocationID.x;
  const uint per_row = p.n_kv_heads * p.head_dim;
  if (e >= p.rows * per_row) return;
  const uint t = e / per_row, h = (e % per_row) / p.head_dim, d = e % p.head_dim;
  const uint row = t * p.stride;
  const int64_t capacity = I64Buf(p.kv_rows).v[row];
  const int block_tokens = int(I64Buf(p.kv_rows).v[row + 1]);
  const uint64_t table = uint64_t(I64Buf(p.kv_rows).v[row + 2]);
  const uint64_t dst = uint64_t(I64Buf(p.kv_rows).v[row + 3 + 2 * p.layer + p.is_v]);
  const int off = I32Buf(p.offsets).v[t];
  const int block = dst == 0 || off < 0 || int64_t(off) >= capacity ? -1 : I32Buf(table).v[off / block_tokens];
  if (block < 0) {
    U32Buf(p.fault).v[0] = 1u;
    return;
  }
  const uint64_t index =
      ((uint64_t(block) * p.n_kv_heads + h) * uint64_t(block_tokens) + uint64_t(off % block_tokens)) * p.head_dim + d;
  F32Buf(dst + index * 4).v[0] = F32Buf(p.x).v[e];
}
