// Dequantization of GGUF weight rows, 32 elements ("a unit") at a time, for
// the weight type WTYPE (the GGML type id, engine/dtype.h). Block layouts and
// formulas: ggml's ggml-common.h / dequantize_row_* (GGUF specification);
// every type the backend supports has whole units of 32 elements per block
// (the K-quants' 256-element super-blocks hold 8 units).
//
// dequant_unit(row, u, k, v) writes elements [32u, 32u + 32) of the row of k
// elements whose first byte is at address `row` into v; float rows (F32, F16,
// BF16) may end in a partial unit, whose missing elements read as 0.

uint u8_at(uint64_t base, uint i) { return uint(U8Buf(base).v[i]); }
int i8_at(uint64_t base, uint i) { return int(int8_t(U8Buf(base).v[i])); }
float f16_at(uint64_t base, uint i) {
  return unpackHalf2x16(u8_at(base, i) | (u8_at(base, i + 1) << 8)).x;
}

#define F32 0
#define F16 1
#define Q4_0 2
#define Q4_1 3
#define Q5_0 6
#define Q5_1 7
#define Q8_0 8
#define Q4_K 12
#define Q5_K 13
#define Q6_K 14
#define BF16 30

// K-quants: the 6-bit scale and min of sub-block j from the 12 packed bytes
// at `q` (ggml's get_scale_min_k4).
void scale_min_k4(uint64_t q, uint j, out float sc, out float m) {
  if (j < 4) {
    sc = float(u8_at(q, j) & 63u);
    m = float(u8_at(q, j + 4) & 63u);
  } else {
    sc = float((u8_at(q, j + 4) & 0xFu) | ((u8_at(q, j - 4) >> 6) << 4));
    m = float((u8_at(q, j + 4) >> 4) | ((u8_at(q, j) >> 6) << 4));
  }
}

void dequant_unit(uint64_t row, uint u, uint k, out float v[32]) {
#if WTYPE == F32
  for (uint j = 0; j < 32; ++j) v[j] = 32 * u + j < k ? F32Buf(row).v[32 * u + j] : 0.0;
#elif WTYPE == F16
  for (uint j = 0; j < 32; ++j) v[j] = 32 * u + j < k ? unpackHalf2x16(uint(U16Buf(row).v[32 * u + j])).x : 0.0;
#elif WTYPE == BF16
  for (uint j = 0; j < 32; ++j) v[j] = 32 * u + j < k ? uintBitsToFloat(uint(U16Buf(row).v[32 * u + j]) << 16) : 0.0;
#elif WTYPE == Q4_0
  // 18 bytes: d (f16), qs[16]; element j < 16 the low nibble of qs[j], j >= 16 the high one of qs[j - 16].
  const uint64_t b = row + uint64_t(u) * 18;
  const float d = f16_at(b, 0);
  for (uint j = 0; j < 16; ++j) {
    const uint q = u8_at(b, 2 + j);
    v[j] = d * (float(int(q & 0xFu)) - 8.0);
    v[j + 16] = d * (float(int(q >> 4)) - 8.0);
  }
#elif WTYPE == Q4_1
  // 20 bytes: d, m (f16), qs[16]: d * q + m.
  const uint64_t b = row + uint64_t(u) * 20;
  const float d = f16_at(b, 0), m = f16_at(b, 2);
  for (uint j = 0; j < 16; ++j) {
    const uint q = u8_at(b, 4 + j);
    v[j] = d * float(q & 0xFu) + m;
    v[j + 16] = d * float(q >> 4) + m;
  }
#elif WTYPE == Q5_0
  // 22 bytes: d (f16), qh (32 fifth bits, little-endian), qs[16]: d * (q - 16).
  const uint64_t b = row + uint64_t(u) * 22;
  const float d = f16_at(b, 0);
  const uint qh = u8_at(b, 2) | (u8_at(b, 3) << 8) | (u8_at(b, 4) << 16) | (u8_at(b, 5) << 24);
  for (uint j = 0; j < 16; ++j) {
    const uint q = u8_at(b, 6 + j);
    v[j] = d * (float(int((q & 0xFu) | (((qh >> j) & 1u) << 4))) - 16.0);
    v[j + 16] = d * (float(int((q >> 4) | (((qh >> (j + 16)) & 1u) << 4))) - 16.0);
  }
#elif WTYPE == Q5_1
  // 24 bytes: d, m (f16), qh, qs[16]: d * q + m.
  const uint64_t b = row + uint64_t(u) * 24;
  const float d = f16_at(b, 0), m = f16_at(b, 2);
  const uint qh = u8_at(b, 4) | (u8_at(b, 5) << 8) | (u8_at(b, 6) << 16) | (u8_at(b, 7) << 24);
  for (uint j = 0; j < 16; ++j) {
    const uint q = u8_at(b, 8 + j);
    v[j] = d * float((q & 0xFu) | (((qh >> j) & 1u) << 4)) + m;
    v[j + 16] = d * float((q >> 4) | (((qh >> (j + 16)) & 1u) << 4)) + m;
  }
#elif WTYPE == Q8_0
  // 34 bytes: d (f16), qs[32] (i8): d * q.
  const uint64_t b = row + uint64_t(u) * 34;
  const float d = f16_at(b, 0);
  for (uint j = 0; j < 32; ++j) v[j] = d * float(i8_at(b, 2 + j));
#elif WTYPE == Q4_K
  // 144 bytes per 256: d, dmin (f16), scales[12] (6-bit scale/min per 32), qs[128];
  // sub-block s = 2c + h reads the low (h = 0) or high nibbles of qs[32c .. 32c + 32).
  const uint64_t b = row + uint64_t(u / 8) * 144;
  const uint s = u % 8;
  const float d = f16_at(b, 0), dmin = f16_at(b, 2);
  float sc, mn;
  scale_min_k4(b + 4, s, sc, mn);
  const float ds = d * sc, dm = dmin * mn;
  const uint shift = 4 * (s & 1u);
  for (uint l = 0; l < 32; ++l) v[l] = ds * float((u8_at(b, 16 + 32 * (s / 2) + l) >> shift) & 0xFu) - dm;
#elif WTYPE == Q5_K
  // 176 bytes per 256: d, dmin, scales[12], qh[32] (bit s of qh[l] is sub-block s's fifth bit), qs[128].
  const uint64_t b = row + uint64_t(u / 8) * 176;
  const uint s = u % 8;
  const float d = f16_at(b, 0), dmin = f16_at(b, 2);
  float sc, mn;
  scale_min_k4(b + 4, s, sc, mn);
  const float ds = d * sc, dm = dmin * mn;
  const uint shift = 4 * (s & 1u);
  for (uint l = 0; l < 32; ++l) {
    const uint q = ((u8_at(b, 48 + 32 * (s / 2) + l) >> shift) & 0xFu) | (((u8_at(b, 16 + l) >> s) & 1u) << 4);
    v[l] = ds * float(q) - dm;
  }
#elif WTYPE == Q6_K
  // 210 bytes per 256: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (i8, one per 16), d (f16).
  // Half n (128 elements) of quarter t: element l < 32 at 128n + 32t + l.
  const uint64_t b = row + uint64_t(u / 8) * 210;
  const uint n = (u % 8) / 4, t = u % 4;
  const float d = f16_at(b, 208);
  for (uint l = 0; l < 32; ++l) {
    const uint lo = (u8_at(b, 64 * n + l + 32 * (t & 1u)) >> (4 * (t / 2))) & 0xFu;
    const uint hi = (u8_at(b, 128 + 32 * n + l) >> (2 * t)) & 3u;
    const float sc = float(i8_at(b, 192 + 8 * n + l / 16 + 2 * t));
    v[l] = d * sc * float(int(lo | (hi << 4)) - 32);
  }
#else
#error "unsupported WTYPE"
#endif
}
