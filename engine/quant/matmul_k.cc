// Q4_K / Q5_K / Q6_K weights times Q8_K activations (ggml_vec_dot_q*_K_q8_K
// numerics). Per 256-element super-block, with a = the Q8_K block:
//   Q4_K/Q5_K: d_a * (d * sum_j sc_j * S_j  -  dmin * sum_j m_j * A_j)
//              S_j = sum over sub-block j (32) of q*qa, A_j = its bsums pair;
//   Q6_K:      d_a * d * sum_g sc_g * (S_g - 32 * bsums_g), groups of 16,
//              q the unsigned 6-bit code.
// Integer sums are exact; super-blocks accumulate in f32.
//
// SIMD (AVX2, and AVX-512 VNNI through vpdpbusd on ymm): codes are unsigned
// (0..63) and activations signed, so u8 x s8 products summed four to an int32
// lane stay below 2^15; the sub-block scale is then applied with madd_epi16
// on those lanes (their high halves multiply a zero).
#include <cstring>
#include <type_traits>


#include "engine/quant/blocks.h"
#include "engine/quant/kernels.h"
#include "engine/quant/prefetch.h"
#include "engine/quant/quant.h"
#include "engine/quant/x86.h"

namespace decoded::quant::internal::DECODED_ISA_NS {
namespace {

// sc[0..7] and m[0..7] of a Q4_K/Q5_K block, as two 8-byte arrays: bytes
// 0..7 of `out` are the scales, 8..15 the mins (ScaleMinK4 for all j at once).
inline void UnpackScalesMins(const uint8_t* q, uint32_t out[4]) {
  constexpr uint32_t kLow6 = 0x3F3F3F3F, kLow4 = 0x0F0F0F0F, kLow2 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, q, 12);
  out[0] = u[0] & kLow6;
  out[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  out[2] = u[1] & kLow6;
  out[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
}

#if defined(__AVX2__)

inline __m256i Load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// int32 lanes: sum of 4 u8*s8 products, times `scale` (int32 lanes holding a
// 16-bit two's-complement value in the low half and 0 in the high half).
inline __m256i ScaledDot(__m256i u, __m256i s, __m256i scale) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_madd_epi16(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s), scale);
#else
  // maddubs pairs (<= 2*63*127) fit int16; both int16 halves take the scale.
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_or_si256(scale, _mm256_slli_epi32(scale, 16)));
#endif
}

inline __m256i Scale32(int v) { return _mm256_set1_epi32(v & 0xFFFF); }

inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 int32 lanes summing to sum_j m_j * (bsums[2j] + bsums[2j+1]).
inline __m256i MinsDot(const uint32_t sm[4], const int16_t* bsums) {
  const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&sm[2])));
  const __m256i m16 = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
  return _mm256_madd_epi16(Load256(bsums), m16);
}

// The 4-bit (Q4_K) or 5-bit (Q5_K) codes of one super-block
// as unsigned bytes: lo[c] / hi[c] are sub-blocks 2c / 2c + 1 (32 codes each).
template <bool kHasHigh, typename Block>
inline void UnpackCodesQ45K(const Block& q, __m256i lo[4], __m256i hi[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i qh;
  if constexpr (kHasHigh) qh = Load256(q.qh);
  for (int c = 0; c < 4; ++c) {
    const __m256i raw = Load256(q.qs + 32 * c);
    lo[c] = _mm256_and_si256(raw, low4);
    hi[c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    if constexpr (kHasHigh) {
      const __m256i one = _mm256_set1_epi8(1);
      lo[c] = _mm256_or_si256(lo[c], _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
      hi[c] = _mm256_or_si256(hi[c], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
      qh = _mm256_srli_epi16(qh, 2);
    }
  }
}

template <bool kHasHigh>
float DotQ45K(const uint8_t* wrow, int64_t nb, const BlockQ8_K* xa) {
  using Block = std::conditional_t<kHasHigh, BlockQ5_K, BlockQ4_K>;
  const auto* wb = reinterpret_cast<const Block*>(wrow);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const Block& q = wb[b];
    const BlockQ8_K& a = xa[b];
    uint32_t sm[4];
    UnpackScalesMins(q.scales, sm);
    const auto* sc = reinterpret_cast<const uint8_t*>(sm);
    __m256i lo[4], hi[4];
    UnpackCodesQ45K<kHasHigh>(q, lo, hi);
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      isum = _mm256_add_epi32(isum, ScaledDot(lo[c], Load256(a.qs + 64 * c), Scale32(sc[2 * c])));
      isum = _mm256_add_epi32(isum, ScaledDot(hi[c], Load256(a.qs + 64 * c + 32), Scale32(sc[2 * c + 1])));
    }
    const float d = HalfToFloat(q.d) * a.d;
    const float dmin = HalfToFloat(q.dmin) * a.d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(-dmin), _mm256_cvtepi32_ps(MinsDot(sm, a.bsums)), acc);
  }
  return Hsum(acc);
}

float DotQ6K(const uint8_t* wrow, int64_t nb, const BlockQ8_K* xa) {
  const auto* wb = reinterpret_cast<const BlockQ6_K*>(wrow);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low2 = _mm256_set1_epi8(0x03);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& q = wb[b];
    const BlockQ8_K& a = xa[b];
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = Load256(q.ql + 64 * h);
      const __m256i ql1 = Load256(q.ql + 64 * h + 32);
      const __m256i qh = Load256(q.qh + 32 * h);
      const __m256i codes[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4)),
          _mm256_or_si256(_mm256_and_si256(ql1, low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4)),
      };
      for (int t = 0; t < 4; ++t) {
        const int g = 8 * h + 2 * t;  // 16-element group of the lower half
        const __m256i scale = _mm256_set_m128i(_mm_set1_epi32(q.scales[g + 1] & 0xFFFF), _mm_set1_epi32(q.scales[g] & 0xFFFF));
        isum = _mm256_add_epi32(isum, ScaledDot(codes[t], Load256(a.qs + 128 * h + 32 * t), scale));
      }
    }
    // The -32 code offset: 32 * sum_g sc_g * bsums_g.
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q.scales)));
    const __m256i bias = _mm256_madd_epi16(Load256(a.bsums), sc16);
    isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(bias, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(q.d) * a.d), _mm256_cvtepi32_ps(isum), acc);
  }
  return Hsum(acc);
}


// DotQ45K / DotQ6K for kM activation rows at once (prefill): the weight
// codes of a super-block are unpacked once and used kM times. Per activation
// row the operations run in exactly the single-row order, so batched and
// one-at-a-time results are bit-identical.
template <bool kHasHigh, int kM>
void DotQ45KMulti(const uint8_t* wrow, int64_t nb, const BlockQ8_K* const* xa, float* out, int64_t out_stride) {
  using Block = std::conditional_t<kHasHigh, BlockQ5_K, BlockQ4_K>;
  const auto* wb = reinterpret_cast<const Block*>(wrow);
  __m256 acc[kM];
  for (int i = 0; i < kM; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const Block& q = wb[b];
    uint32_t sm[4];
    UnpackScalesMins(q.scales, sm);
    const auto* sc = reinterpret_cast<const uint8_t*>(sm);
    __m256i lo[4], hi[4];
    UnpackCodesQ45K<kHasHigh>(q, lo, hi);
    const float dw = HalfToFloat(q.d), dminw = HalfToFloat(q.dmin);
    for (int i = 0; i < kM; ++i) {
      const BlockQ8_K& a = xa[i][b];
      __m256i isum = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        isum = _mm256_add_epi32(isum, ScaledDot(lo[c], Load256(a.qs + 64 * c), Scale32(sc[2 * c])));
        isum = _mm256_add_epi32(isum, ScaledDot(hi[c], Load256(a.qs + 64 * c + 32), Scale32(sc[2 * c + 1])));
      }
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), _mm256_cvtepi32_ps(isum), acc[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(-(dminw * a.d)), _mm256_cvtepi32_ps(MinsDot(sm, a.bsums)), acc[i]);
    }
  }
  for (int i = 0; i < kM; ++i) out[i * out_stride] = Hsum(acc[i]);
}

template <int kM>
void DotQ6KMulti(const uint8_t* wrow, int64_t nb, const BlockQ8_K* const* xa, float* out, int64_t out_stride) {
  const auto* wb = reinterpret_cast<const BlockQ6_K*>(wrow);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low2 = _mm256_set1_epi8(0x03);
  __m256 acc[kM];
  for (int i = 0; i < kM; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& q = wb[b];
    __m256i codes[2][4];
    __m256i scale[2][4];
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = Load256(q.ql + 64 * h);
      const __m256i ql1 = Load256(q.ql + 64 * h + 32);
      const __m256i qhv = Load256(q.qh + 32 * h);
      codes[h][0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qhv, low2), 4));
      codes[h][1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 2), low2), 4));
      codes[h][2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 4), low2), 4));
      codes[h][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 6), low2), 4));
      for (int t = 0; t < 4; ++t) {
        const int g = 8 * h + 2 * t;
        scale[h][t] = _mm256_set_m128i(_mm_set1_epi32(q.scales[g + 1] & 0xFFFF), _mm_set1_epi32(q.scales[g] & 0xFFFF));
      }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q.scales)));
    const float dw = HalfToFloat(q.d);
    for (int i = 0; i < kM; ++i) {
      const BlockQ8_K& a = xa[i][b];
      __m256i isum = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        for (int t = 0; t < 4; ++t) {
          isum = _mm256_add_epi32(isum, ScaledDot(codes[h][t], Load256(a.qs + 128 * h + 32 * t), scale[h][t]));
        }
      }
      const __m256i bias = _mm256_madd_epi16(Load256(a.bsums), sc16);
      isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(bias, 5));
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), _mm256_cvtepi32_ps(isum), acc[i]);
    }
  }
  for (int i = 0; i < kM; ++i) out[i * out_stride] = Hsum(acc[i]);
}

constexpr bool kHasMultiRow = true;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)

// Prefill tiles (AVX-512 VNNI): a weight super-block decoded once into
// zmm-wide codes and scales for every activation row. codes[c] holds the 64
// codes matching activation bytes qs[64c .. 64c+63]; scale[c] gives each
// int32 lane the scale of its sub-block (16-bit value in the low half, as
// ScaledDot's); `mins` is MinsDot's m16 (Q4_K/Q5_K) or the int16 scales
// (Q6_K).
struct alignas(64) PackedK {
  __m512i codes[4];
  __m512i scale[4];
  __m256i mins;
  float d, dmin;
};

inline __m512i Join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

template <bool kHasHigh>
void PackQ45K(const uint8_t* wrow, int64_t nb, PackedK* out) {
  using Block = std::conditional_t<kHasHigh, BlockQ5_K, BlockQ4_K>;
  const auto* wb = reinterpret_cast<const Block*>(wrow);
  for (int64_t b = 0; b < nb; ++b) {
    const Block& q = wb[b];
    PackedK& p = out[b];
    uint32_t sm[4];
    UnpackScalesMins(q.scales, sm);
    const auto* sc = reinterpret_cast<const uint8_t*>(sm);
    __m256i lo[4], hi[4];
    UnpackCodesQ45K<kHasHigh>(q, lo, hi);
    for (int c = 0; c < 4; ++c) {
      p.codes[c] = Join(lo[c], hi[c]);
      p.scale[c] = Join(Scale32(sc[2 * c]), Scale32(sc[2 * c + 1]));
    }
    const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&sm[2])));
    p.mins = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
    p.d = HalfToFloat(q.d);
    p.dmin = HalfToFloat(q.dmin);
  }
}

void PackQ6K(const uint8_t* wrow, int64_t nb, PackedK* out) {
  const auto* wb = reinterpret_cast<const BlockQ6_K*>(wrow);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low2 = _mm256_set1_epi8(0x03);
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& q = wb[b];
    PackedK& p = out[b];
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = Load256(q.ql + 64 * h);
      const __m256i ql1 = Load256(q.ql + 64 * h + 32);
      const __m256i qhv = Load256(q.qh + 32 * h);
      const __m256i c0 = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qhv, low2), 4));
      const __m256i c1 = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 2), low2), 4));
      const __m256i c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 4), low2), 4));
      const __m256i c3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qhv, 6), low2), 4));
      p.codes[2 * h] = Join(c0, c1);
      p.codes[2 * h + 1] = Join(c2, c3);
      for (int u = 0; u < 2; ++u) {
        const int g = 8 * h + 4 * u;  // 16-element groups g .. g+3, four int32 lanes each
        p.scale[2 * h + u] = _mm512_set_epi32(
            q.scales[g + 3] & 0xFFFF, q.scales[g + 3] & 0xFFFF, q.scales[g + 3] & 0xFFFF, q.scales[g + 3] & 0xFFFF,
            q.scales[g + 2] & 0xFFFF, q.scales[g + 2] & 0xFFFF, q.scales[g + 2] & 0xFFFF, q.scales[g + 2] & 0xFFFF,
            q.scales[g + 1] & 0xFFFF, q.scales[g + 1] & 0xFFFF, q.scales[g + 1] & 0xFFFF, q.scales[g + 1] & 0xFFFF,
            q.scales[g] & 0xFFFF, q.scales[g] & 0xFFFF, q.scales[g] & 0xFFFF, q.scales[g] & 0xFFFF);
      }
    }
    p.mins = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q.scales)));
    p.d = HalfToFloat(q.d);
    p.dmin = 0.0f;
  }
}

// The scaled integer sum of one packed super-block with one Q8_K block, in
// DotQ45K's / DotQ6K's 8 int32 lanes: the zmm sum's halves hold the same
// byte positions of two chunks, so folding them gives the ymm kernels' lane
// totals exactly (integer sums).
inline __m256i PackedDot(const PackedK& p, const BlockQ8_K& a) {
  __m512i s = _mm512_setzero_si512();
  for (int c = 0; c < 4; ++c) {
    const __m512i x = _mm512_loadu_si512(a.qs + 64 * c);
    s = _mm512_add_epi32(s, _mm512_madd_epi16(_mm512_dpbusd_epi32(_mm512_setzero_si512(), p.codes[c], x), p.scale[c]));
  }
  return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}

// A kRm x kRn tile (packed weight rows x activation rows). Per output the
// float operations are DotQ45K's / DotQ6K's, in their order, so a result does
// not depend on m, on its tile, or on the row split. `pf` (optional) advances
// once per super-block.
template <bool kQ6, int kRm, int kRn>
void DotTileK(const PackedK* packed, int64_t nb, const uint8_t* xq, size_t xq_row_bytes, float* y, int64_t ldy,
              SpreadPrefetch* pf) {
  const BlockQ8_K* xa[kRn];
  for (int i = 0; i < kRn; ++i) xa[i] = reinterpret_cast<const BlockQ8_K*>(xq + i * xq_row_bytes);
  __m256 acc[kRm][kRn];
  for (int r = 0; r < kRm; ++r) {
    for (int i = 0; i < kRn; ++i) acc[r][i] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    if (pf != nullptr) pf->Step();
    for (int i = 0; i < kRn; ++i) {
      const BlockQ8_K& a = xa[i][b];
      const __m256i bsums = Load256(a.bsums);
      for (int r = 0; r < kRm; ++r) {
        const PackedK& p = packed[r * nb + b];
        __m256i isum = PackedDot(p, a);
        if constexpr (kQ6) {
          isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_madd_epi16(bsums, p.mins), 5));
          acc[r][i] = _mm256_fmadd_ps(_mm256_set1_ps(p.d * a.d), _mm256_cvtepi32_ps(isum), acc[r][i]);
        } else {
          acc[r][i] = _mm256_fmadd_ps(_mm256_set1_ps(p.d * a.d), _mm256_cvtepi32_ps(isum), acc[r][i]);
          acc[r][i] = _mm256_fmadd_ps(_mm256_set1_ps(-(p.dmin * a.d)), _mm256_cvtepi32_ps(_mm256_madd_epi16(bsums, p.mins)),
                                      acc[r][i]);
        }
      }
    }
  }
  for (int r = 0; r < kRm; ++r) {
    for (int i = 0; i < kRn; ++i) y[i * ldy + r] = Hsum(acc[r][i]);
  }
}

constexpr bool kHasTiles = true;

#else

constexpr bool kHasTiles = false;
struct PackedK {};

#endif  // AVX-512 VNNI


#else  // portable

template <bool kHasHigh>
float DotQ45K(const uint8_t* wrow, int64_t nb, const BlockQ8_K* xa) {
  using Block = std::conditional_t<kHasHigh, BlockQ5_K, BlockQ4_K>;
  const auto* wb = reinterpret_cast<const Block*>(wrow);
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const Block& q = wb[b];
    const BlockQ8_K& a = xa[b];
    uint32_t sm[4];
    UnpackScalesMins(q.scales, sm);
    const auto* sc = reinterpret_cast<const uint8_t*>(sm);
    const uint8_t* mn = sc + 8;
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      const int c = j / 2;
      const int shift = 4 * (j % 2);
      int s = 0;
      for (int l = 0; l < 32; ++l) {
        int v = (q.qs[32 * c + l] >> shift) & 0xF;
        if constexpr (kHasHigh) v |= ((q.qh[l] >> j) & 1) << 4;
        s += v * a.qs[32 * j + l];
      }
      isum += sc[j] * s;
      msum += mn[j] * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
    }
    sum += a.d * (HalfToFloat(q.d) * static_cast<float>(isum) - HalfToFloat(q.dmin) * static_cast<float>(msum));
  }
  return sum;
}

float DotQ6K(const uint8_t* wrow, int64_t nb, const BlockQ8_K* xa) {
  const auto* wb = reinterpret_cast<const BlockQ6_K*>(wrow);
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& q = wb[b];
    const BlockQ8_K& a = xa[b];
    int32_t isum = 0;
    for (int h = 0; h < 2; ++h) {
      for (int t = 0; t < 4; ++t) {
        for (int half = 0; half < 2; ++half) {
          const int g = 8 * h + 2 * t + half;
          int s = 0;
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const uint8_t lowbyte = q.ql[64 * h + 32 * (t & 1) + l];
            const int low = t < 2 ? (lowbyte & 0xF) : (lowbyte >> 4);
            const int code = low | (((q.qh[32 * h + l] >> (2 * t)) & 3) << 4);
            s += code * a.qs[128 * h + 32 * t + l];
          }
          isum += q.scales[g] * (s - 32 * a.bsums[g]);
        }
      }
    }
    sum += a.d * HalfToFloat(q.d) * static_cast<float>(isum);
  }
  return sum;
}

// The portable build keeps one activation row at a time.
constexpr bool kHasMultiRow = false;
constexpr bool kHasTiles = false;
struct PackedK {};
template <bool kHasHigh, int kM>
void DotQ45KMulti(const uint8_t*, int64_t, const BlockQ8_K* const*, float*, int64_t) {}
template <int kM>
void DotQ6KMulti(const uint8_t*, int64_t, const BlockQ8_K* const*, float*, int64_t) {}

#endif

#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__))
// Tiers without prefill tiles: never called (kHasTiles is false).
template <bool kHasHigh>
void PackQ45K(const uint8_t*, int64_t, PackedK*) {}
inline void PackQ6K(const uint8_t*, int64_t, PackedK*) {}
template <bool kQ6, int kRm, int kRn>
void DotTileK(const PackedK*, int64_t, const uint8_t*, size_t, float*, int64_t, SpreadPrefetch*) {}
#endif

constexpr int kRowBatch = 4;
using MultiDot = void (*)(const uint8_t*, int64_t, const BlockQ8_K* const*, float*, int64_t);
using PackFn = void (*)(const uint8_t*, int64_t, PackedK*);

// Prefill tiles (where kHasTiles): kTileRows packed weight rows x kTileActs
// activation rows, weight rows outer so their packs (576 B per super-block
// and row: 22 KiB at k = 4864) stay in L1 while the activation rows stream
// from L2; rows up to kMaxPackedK elements (stack-resident pack, no
// allocation per call).
constexpr int kTileRows = 2;
constexpr int kTileActs = kMatMulActivationTile;
constexpr int64_t kMaxPackedK = 8192;

// Multi / Multi3 / Multi2: the multi-row dot for kRowBatch / 3 / 2 rows.
template <float (*Dot)(const uint8_t*, int64_t, const BlockQ8_K*), MultiDot Multi, MultiDot Multi3, MultiDot Multi2,
          PackFn Pack, bool kQ6>
void MatMulImpl(DECODED_QUANT_MATMUL_ARGS) {
  const int64_t nb = k / kQKK;
  int64_t r = r0;
  if constexpr (kHasTiles) {
    if (m >= kTileActs && k <= kMaxPackedK) {
      PackedK packed[kMaxPackedK / kQKK * kTileRows];
      for (; r + kTileRows <= r1; r += kTileRows) {
        // The next tiles' lines, spread over the first activation tile's steps.
        SpreadPrefetch pf(w + r * w_row_bytes, kTileRows * w_row_bytes, nb);
        for (int j = 0; j < kTileRows; ++j) Pack(w + (r + j) * w_row_bytes, nb, packed + j * nb);
        int64_t i = 0;
        for (; i + kTileActs <= m; i += kTileActs) {
          DotTileK<kQ6, kTileRows, kTileActs>(packed, nb, xq + i * xq_row_bytes, xq_row_bytes, y + i * ldy + r, ldy,
                                              i == 0 ? &pf : nullptr);
        }
        pf.Finish();
        for (; i < m; ++i) {
          const auto* xa = reinterpret_cast<const BlockQ8_K*>(xq + i * xq_row_bytes);
          for (int j = 0; j < kTileRows; ++j) y[i * ldy + r + j] = Dot(w + (r + j) * w_row_bytes, nb, xa);
        }
      }
    }
  }
  for (; r < r1; ++r) {
    const uint8_t* wrow = w + r * w_row_bytes;
    PrefetchAhead(wrow, w_row_bytes);
    int64_t i = 0;
    if constexpr (kHasMultiRow) {
      const BlockQ8_K* xa[kRowBatch];
      auto rows = [&](int count) {
        for (int j = 0; j < count; ++j) xa[j] = reinterpret_cast<const BlockQ8_K*>(xq + (i + j) * xq_row_bytes);
      };
      for (; i + kRowBatch <= m; i += kRowBatch) {
        rows(kRowBatch);
        Multi(wrow, nb, xa, y + i * ldy + r, ldy);
      }
      // 2 or 3 rows left (batched decode of 2-3 sessions): unpack the
      // super-block once for them too.
      if (m - i == 3) {
        rows(3);
        Multi3(wrow, nb, xa, y + i * ldy + r, ldy);
        i = m;
      } else if (m - i == 2) {
        rows(2);
        Multi2(wrow, nb, xa, y + i * ldy + r, ldy);
        i = m;
      }
    }
    for (; i < m; ++i) {
      y[i * ldy + r] = Dot(wrow, nb, reinterpret_cast<const BlockQ8_K*>(xq + i * xq_row_bytes));
    }
  }
}

}  // namespace

void MatMulQ4_K(DECODED_QUANT_MATMUL_ARGS) {
  MatMulImpl<DotQ45K<false>, DotQ45KMulti<false, kRowBatch>, DotQ45KMulti<false, 3>, DotQ45KMulti<false, 2>,
             PackQ45K<false>, false>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1);
}
void MatMulQ5_K(DECODED_QUANT_MATMUL_ARGS) {
  MatMulImpl<DotQ45K<true>, DotQ45KMulti<true, kRowBatch>, DotQ45KMulti<true, 3>, DotQ45KMulti<true, 2>,
             PackQ45K<true>, false>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1);
}
void MatMulQ6_K(DECODED_QUANT_MATMUL_ARGS) {
  MatMulImpl<DotQ6K, DotQ6KMulti<kRowBatch>, DotQ6KMulti<3>, DotQ6KMulti<2>, PackQ6K, true>(
      w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1);
}

}  // namespace decoded::quant::internal::DECODED_ISA_NS
