#version 460
// Writes row t of x [rows, n_kv_heads * head_dim] into the K (is_v = 0) or
// V buffer of layer `layer` of row t's KV cache, at row t's offset. Caches
// come from the step's KV binding table (engine/kv_rows.h: i64 [rows,
// stride], row t = capacity, then the K and V device addresses of every
// layer); offsets from an i32 [rows] buffer (the device-offset data node, or
// the plan's copy of the host symbols on the symbol path). An offset outside
// the cache sets *fault and writes nothing. One invocation per element.
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
  const uint64_t dst = uint64_t(I64Buf(p.kv_rows).v[row + 1 + 2 * p.layer + p.is_v]);
  const int off = I32Buf(p.offsets).v[t];
  if (dst == 0 || off < 0 || int64_t(off) >= capacity) {
    U32Buf(p.fault).v[0] = 1u;
    return;
  }
  const uint64_t index = (uint64_t(h) * uint64_t(capacity) + uint64_t(off)) * p.head_dim + d;
  F32Buf(dst + index * 4).v[0] = F32Buf(p.x).v[e];
}
