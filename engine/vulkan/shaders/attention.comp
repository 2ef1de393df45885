#version 460
// Scaled dot-product attention (Vaswani et al. 2017) of query row t, head h
// against keys [lo_t, hi_t) (bounds, i32 [seq, 2], already offset to the
// layer's mask variant) of layer `layer` of row t's own KV cache (the KV
// binding table, engine/kv_rows.h). GQA: head h reads kv head h / (n_heads /
// n_kv_heads). The K pool is [n_blocks, n_kv_heads, block_tokens] rows of
// k_dim and the V pool the same of v_stride elements of the row's KV type (f32,
// f16 or q8_0: kv_types.glsl, decoded exactly to f32), read through the
// cache's block table, of which each row's first v_dim elements are the value
// (the K pool itself, v_stride = k_dim, when the table's V address is 0:
// MLA's latent). softcap > 0 caps the scaled scores as softcap * tanh(s / softcap).
//
// One workgroup per (row, head). Keys go in tiles of 64, one score per
// thread; the tile's maximum rescales the running sums (online softmax,
// Milakov & Gimelshein 2018) and each thread accumulates its own value
// dimensions over the tile in key order. Every step is in a fixed order, so a
// row's output depends neither on the other rows nor on the batch.
#include "common.glsl"
#include "kv_types.glsl"

layout(local_size_x = 64) in;
layout(push_constant, scalar) uniform Params {
  uint64_t q, bounds, kv_rows, out_;
  uint seq, n_heads, n_kv_heads, k_dim, v_dim, v_stride, layer, stride;
  float scale, softcap;
} p;

const uint kMaxValueDim = 1024;  // as the CPU kernel (engine/cpu/kernels.h)
const uint kPerThread = kMaxValueDim / 64;
shared float qs[kMaxValueDim];
shared float prob[64];

float stable_tanh(float u) {
  const float e = exp(-2.0 * abs(u));
  return sign(u) * (1.0 - e) / (1.0 + e);
}

// Pool row of position `pos` of kv head `kvh` (engine/kv_rows.h).
uint64_t key_row(uint64_t table, uint bt, uint kvh, uint pos) {
  const uint block = uint(I32Buf(table).v[pos / bt]);
  return (uint64_t(block) * p.n_kv_heads + kvh) * bt + pos % bt;
}

void main() {
  const uint item = linear_group();
  if (item >= p.seq * p.n_heads) return;
  const uint tid = gl_LocalInvocationID.x;
  const uint t = item / p.n_heads, h = item % p.n_heads;
  const uint kvh = h / (p.n_heads / p.n_kv_heads);
  const uint row = t * p.stride;
  const uint bt = uint(I64Buf(p.kv_rows).v[row + 1]);
  const uint type = uint(I64Buf(p.kv_rows).v[row + 2]);
  const uint entry = row + 4 + 3 * p.layer;  // the layer's table, K and V (KvRowLayerEntry)
  const uint64_t table = uint64_t(I64Buf(p.kv_rows).v[entry]);
  const uint64_t k_base = uint64_t(I64Buf(p.kv_rows).v[entry + 1]);
  const uint64_t v_addr = uint64_t(I64Buf(p.kv_rows).v[entry + 2]);
  const uint k_rb = kv_row_bytes(type, p.k_dim), v_rb = kv_row_bytes(type, p.v_stride);
  const uint64_t v_base = v_addr != 0 ? v_addr : k_base;
  const int lo = I32Buf(p.bounds).v[2 * t], hi = I32Buf(p.bounds).v[2 * t + 1];

  for (uint i = tid; i < p.k_dim; i += 64) qs[i] = F32Buf(p.q).v[item * p.k_dim + i];
  barrier();

  float acc[kPerThread];
  for (uint c = 0; c < kPerThread; ++c) acc[c] = 0.0;
  float m = -1.0 / 0.0;  // -inf
  float l = 0.0;
  for (int j0 = lo; j0 < hi; j0 += 64) {
    const int n = min(64, hi - j0);
    float s = -1.0 / 0.0;
    if (int(tid) < n) {
      const uint64_t krow = k_base + key_row(table, bt, kvh, uint(j0) + tid) * k_rb;
      s = 0.0;
      if (type == kKvF32) {
        for (uint i = 0; i < p.k_dim; ++i) s += qs[i] * F32Buf(krow).v[i];
      } else {
        for (uint i = 0; i < p.k_dim; ++i) s += qs[i] * kv_elem(type, krow, i);
      }
      s *= p.scale;
      if (p.softcap > 0.0) s = p.softcap * stable_tanh(s / p.softcap);
    }
    prob[tid] = s;
    barrier();
    float tile_max = prob[0];
    for (int j = 1; j < n; ++j) tile_max = max(tile_max, prob[j]);
    const float m_new = max(m, tile_max);
    const float corr = exp(m - m_new);  // 0 on the first tile (m = -inf)
    barrier();
    if (int(tid) < n) prob[tid] = exp(s - m_new);
    barrier();
    float tile_sum = 0.0;
    for (int j = 0; j < n; ++j) tile_sum += prob[j];
    l = l * corr + tile_sum;
    for (uint c = 0; c < kPerThread; ++c) {
      const uint d = tid + 64 * c;
      if (d >= p.v_dim) break;
      float a = acc[c] * corr;
      for (int j = 0; j < n; ++j) {
        a += prob[j] * kv_elem(type, v_base + key_row(table, bt, kvh, uint(j0 + j)) * v_rb, d);
      }
      acc[c] = a;
    }
    m = m_new;
    barrier();
  }
  const float inv = l > 0.0 ? 1.0 / l : 0.0;
  for (uint c = 0; c < kPerThread; ++c) {
    const uint d = tid + 64 * c;
    if (d >= p.v_dim) break;
    F32Buf(p.out_).v[item * p.v_dim + d] = acc[c] * inv;
  }
}
