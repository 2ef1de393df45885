// KV cache element types (engine/kv_layout.h): the DType ids a KV binding
// table row names (engine/kv_rows.h), a slot row's bytes, and reading and
// writing one element. Include after common.glsl.
const uint kKvF32 = 0u, kKvF16 = 1u, kKvQ8_0 = 8u;

// Bytes of a slot row of `dim` elements (KvRowBytes).
uint kv_row_bytes(uint type, uint dim) {
  if (type == kKvF16) return 2u * dim;
  if (type == kKvQ8_0) return dim / 32u * 34u;
  return 4u * dim;
}

// Element i of the slot row at `row`, decoded exactly to f32 (fp16 -> f32 is
// exact; q8_0 is d * q: ggml's dequantize_row_q8_0).
float kv_elem(uint type, uint64_t row, uint i) {
  if (type == kKvF16) return unpackHalf2x16(uint(U16Buf(row + 2u * i).v[0])).x;
  if (type == kKvQ8_0) {
    const uint64_t blk = row + 34u * (i / 32u);
    const float d = unpackHalf2x16(uint(U16Buf(blk).v[0])).x;
    return d * float(int(int8_t(U8Buf(blk + 2u + i % 32u).v[0])));
  }
  return F32Buf(row + 4u * i).v[0];
}

// binary32 -> binary16 rounding to nearest even, overflow to inf, NaN to a
// quiet NaN: the CPU's F32ToF16 bit for bit (packHalf2x16 leaves the
// rounding to the implementation).
uint f32_to_f16(float f) {
  uint x = floatBitsToUint(f);
  const uint sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u);
  if (x >= 0x477FF000u) return sign | 0x7C00u;
  if (x < 0x38800000u) {
    // |f| < 2^-14: adding 0.5 puts the half-subnormal ulp at the float ulp of
    // 0.5, so the add's round-to-nearest-even does the rounding.
    const float a = uintBitsToFloat(x) + 0.5;
    return sign | (floatBitsToUint(a) - 0x3F000000u);
  }
  const uint odd = (x >> 13) & 1u;
  x += 0xC8000FFFu + odd;
  return sign | ((x >> 13) & 0xFFFFu);
}
