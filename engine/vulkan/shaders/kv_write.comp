#version 460
// Writes row t of x [rows, n_kv_heads * head_dim] into the K (is_v = 0) or
// V pool of layer `layer` of row t's KV cache, at row t's offset, through the
// cache's block table. Caches come from the step's KV binding table
// (engine/kv_rows.h: i64 [rows, stride], row t = capacity, block_tokens, KV
// type, the block table's address, then the K and V pool addresses of every
// layer); offsets from an i32 [rows] buffer (the device-offset data node, or
// the plan's copy of the host symbols on the symbol path). An offset outside
// the cache or in an unmapped block sets *fault and writes nothing. One
// invocation per element, which it stores as the cache's type: f32, f16
// (nearest even) or q8_0 (each invocation finds its 32-element block's scale
// d = amax / 127, as ggml's quantize_row_q8_0_ref, and stores its code
// round(x / d), half away from zero; the block's first also stores d).
#include "common.glsl"
#include "kv_types.glsl"

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
  const uint type = uint(I64Buf(p.kv_rows).v[row + 2]);
  const uint entry = row + 4 + 3 * p.layer;  // the layer's table, K and V (KvRowLayerEntry)
  const uint64_t table = uint64_t(I64Buf(p.kv_rows).v[entry]);
  const uint64_t dst = uint64_t(I64Buf(p.kv_rows).v[entry + 1 + p.is_v]);
  const int off = I32Buf(p.offsets).v[t];
  const int block = dst == 0 || off < 0 || int64_t(off) >= capacity ? -1 : I32Buf(table).v[off / block_tokens];
  if (block < 0) {
    U32Buf(p.fault).v[0] = 1u;
    return;
  }
  const uint64_t slot_row = (uint64_t(block) * p.n_kv_heads + h) * uint64_t(block_tokens) + uint64_t(off % block_tokens);
  const uint64_t row_addr = dst + slot_row * kv_row_bytes(type, p.head_dim);
  const float x = F32Buf(p.x).v[e];
  if (type == kKvF16) {
    U16Buf(row_addr + 2u * d).v[0] = uint16_t(f32_to_f16(x));
  } else if (type == kKvQ8_0) {
    const uint first = e - d % 32u;
    float amax = 0.0;
    for (uint j = 0; j < 32u; ++j) amax = max(amax, abs(F32Buf(p.x).v[first + j]));
    const float dq = amax / 127.0;
    const float id = dq != 0.0 ? 1.0 / dq : 0.0;
    const float a = abs(x * id);
    const float fl = floor(a);
    const float r = fl + floor((a - fl) + (a - fl));  // half away from zero, exact
    const uint64_t blk = row_addr + 34u * (d / 32u);
    U8Buf(blk + 2u + d % 32u).v[0] = uint8_t(int8_t(int(x * id < 0.0 ? -r : r)));
    if (d % 32u == 0u) U16Buf(blk).v[0] = uint16_t(f32_to_f16(dq));
  } else {
    F32Buf(row_addr + 4u * d).v[0] = x;
  }
}
