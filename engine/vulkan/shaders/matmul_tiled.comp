#version 460
// out[i, r] = dot(W[r], x[i]) for activation rows i < m and weight rows r < n,
// as matmul.comp, tiled through shared memory for many activation rows: the
// mat-mat of a prefill chunk. W is a GGUF weight of type WTYPE
// (dequant.glsl), x and out f32; not grouped (Graph::head_matmul stays on
// matmul.comp).
//
// A workgroup computes one 64 x 64 tile of out (64 activation rows by 64
// weight rows), stepping over k one 32-element unit at a time: 64 of its
// invocations each dequantize one weight row's unit into shared memory while
// the other 192 copy the 64 activation rows' 32 columns beside it; after a
// barrier every invocation multiplies its 4 x 4 outputs over the 32 columns.
// So each weight unit is dequantized once per 64 activation rows (matmul.comp:
// once per 8) and each activation element is read from memory once per 64
// weight rows (matmul.comp: once per weight row).
//
// Each output sums its k products in order 0..k-1, whatever m and the tile:
// a row's result does not depend on the other rows. It does differ in the
// last bits from matmul.comp's (lanes' strided partials, then subgroupAdd),
// so the plan uses this kernel only for a graph whose rows are one sequence's
// (Graph::rows_are_one_sequence: a prefill chunk), never for the rows of a
// batched decode step, whose sessions must each get their solo logits.
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 256) in;
layout(push_constant, scalar) uniform Params {
  uint64_t w, x, out_;
  uint w_row_bytes;
  uint k;             // weight columns (whole 32-element units unless the type is float)
  uint m;             // activation rows
  uint n;             // weight rows = output columns
  uint x_row_stride;  // floats between activation rows
} p;

const uint kTile = 64;  // activation rows and weight rows per workgroup
const uint kUnit = 32;  // columns per step: one dequantization unit
const uint kCopiers = 256 - kTile;

// [row][column], one float of padding per row so that the 16 invocations
// reading one column of 16 consecutive rows hit distinct banks. 2 x 8448
// bytes (the plan checks maxComputeSharedMemorySize).
shared float ws[kTile][kUnit + 1];
shared float xs[kTile][kUnit + 1];

void main() {
  const uint tiles_n = (p.n + kTile - 1) / kTile;
  const uint tile = linear_group();
  // The grid may hold a few more workgroups than tiles (engine/vulkan: 2-D grid).
  if (tile >= tiles_n * ((p.m + kTile - 1) / kTile)) return;
  const uint i0 = (tile / tiles_n) * kTile;
  const uint r0 = (tile % tiles_n) * kTile;
  const uint t = gl_LocalInvocationIndex;
  // Invocation t owns outputs (i0 + ty + 16 a, r0 + tx + 16 b) for a, b < 4.
  const uint tx = t % 16, ty = t / 16;
  const uint units = (p.k + kUnit - 1) / kUnit;

  float acc[4][4];
  for (uint a = 0; a < 4; ++a) {
    for (uint b = 0; b < 4; ++b) acc[a][b] = 0.0;
  }
  float wv[32];
  for (uint u = 0; u < units; ++u) {
    if (t < kTile) {
      // Dequantize weight row r0 + t's unit u (zeros past the last row).
      if (r0 + t < p.n) {
        dequant_unit(p.w + uint64_t(r0 + t) * p.w_row_bytes, u, p.k, wv);
      } else {
        for (uint j = 0; j < kUnit; ++j) wv[j] = 0.0;
      }
      for (uint j = 0; j < kUnit; ++j) ws[t][j] = wv[j];
    } else {
      // Copy x[i0 .. i0 + 64, 32u .. 32u + 32): consecutive invocations read
      // consecutive columns; zeros past the last row or column.
      for (uint e = t - kTile; e < kTile * kUnit; e += kCopiers) {
        const uint row = e / kUnit, col = e % kUnit;
        const uint c = u * kUnit + col;
        xs[row][col] = i0 + row < p.m && c < p.k ? F32Buf(p.x).v[(i0 + row) * p.x_row_stride + c] : 0.0;
      }
    }
    barrier();
    for (uint j = 0; j < kUnit; ++j) {
      float xa[4], wb[4];
      for (uint a = 0; a < 4; ++a) xa[a] = xs[ty + 16 * a][j];
      for (uint b = 0; b < 4; ++b) wb[b] = ws[tx + 16 * b][j];
      for (uint a = 0; a < 4; ++a) {
        for (uint b = 0; b < 4; ++b) acc[a][b] += xa[a] * wb[b];
      }
    }
    // The next unit overwrites the tiles only once every invocation is done.
    barrier();
  }
  for (uint a = 0; a < 4; ++a) {
    const uint i = i0 + ty + 16 * a;
    if (i >= p.m) continue;
    for (uint b = 0; b < 4; ++b) {
      const uint r = r0 + tx + 16 * b;
      if (r < p.n) F32Buf(p.out_).v[i * p.n + r] = acc[a][b];
    }
  }
}
