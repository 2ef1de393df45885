// Q4_0 / Q5_0 / Q8_0 weights times Q8_0 activations.
//
// Per 32-element block b the integer dot S_b = sum(qw * qa) is exact; the
// row result is sum_b fp16(dw_b) * fp16(da_b) * S_b accumulated in f32
// (ggml_vec_dot_q*_0_q8_0 numerics).
//
// AVX-512 VNNI: two blocks fill one zmm. Weight codes are made unsigned
// (code = q + O with O = 8 / 16 / 128) so vpdpbusd (u8 x s8) applies; the
// offset's contribution O * sum(qa) depends only on the activation and
// seeds the integer accumulator.
// AVX2: one block per ymm, sign trick (|qw| x sign(qa, qw)) into maddubs.
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/kernels.h"
#include "engine/quant/x86.h"

namespace decoded::quant::internal {
namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)

// Loads the unsigned codes of weight blocks b0 and b0+1 (or of b0 alone, with
// `single`; the upper half is then don't-care because the activation's upper
// half is zero) into one zmm, in element order.
struct Q8_0Pair {
  using Block = BlockQ8_0;
  static constexpr int kOffset = 128;
  static __m512i Codes(const Block* b, bool single) {
    const __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[0].qs)));
    const __m512i w = single ? lo
                             : _mm512_inserti64x4(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[1].qs)), 1);
    return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};

// Nibble blocks: 16 bytes per block hold elements j (low) and j+16 (high).
// Lanes [qs0, qs0, qs1, qs1] shifted by [0, 4, 0, 4] bits and masked give the
// element order [lo0, hi0, lo1, hi1].
inline __m512i NibblePair(const uint8_t* qs0, const uint8_t* qs1, bool single) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0));
  const __m128i b = single ? a : _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1));
  const __m512i ab = _mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
  const __m512i dup = _mm512_shuffle_i64x2(ab, ab, _MM_SHUFFLE(1, 1, 0, 0));
  const __m512i sh = _mm512_srlv_epi64(dup, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
  return _mm512_and_si512(sh, _mm512_set1_epi8(0x0F));
}

struct Q4_0Pair {
  using Block = BlockQ4_0;
  static constexpr int kOffset = 8;
  static __m512i Codes(const Block* b, bool single) {
    return NibblePair(b[0].qs, single ? b[0].qs : b[1].qs, single);
  }
};

struct Q5_0Pair {
  using Block = BlockQ5_0;
  static constexpr int kOffset = 16;
  static __m512i Codes(const Block* b, bool single) {
    const __m512i n = NibblePair(b[0].qs, single ? b[0].qs : b[1].qs, single);
    const uint64_t hi = single ? 0 : LoadU32(b[1].qh);
    const __mmask64 k = _cvtu64_mask64(LoadU32(b[0].qh) | (hi << 32));
    return _mm512_mask_add_epi8(n, k, n, _mm512_set1_epi8(16));
  }
};

// [dw0*da0 x8, dw1*da1 x8] from two fp16 weight scales and the activation
// pair's f32 scales in lanes 0-1 of `da`.
inline __m512 PairScale(uint16_t dw0, uint16_t dw1, __m128 da) {
  const __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dw0 | (static_cast<uint32_t>(dw1) << 16))));
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_mul_ps(dw, da)));
}

// Activation pair (blocks b, b+1; b alone with `single`, upper half zero),
// its offset correction -O*sum(qa) per int32 lane, and its two f32 scales.
struct ActPair {
  __m512i a;
  __m512i negcorr;
  __m128 da;
};

template <typename P>
inline ActPair LoadActPair(const BlockQ8_0* xa, int64_t b, bool single) {
  const __m512i lo = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa[b].qs)));
  ActPair p;
  p.a = single ? lo : _mm512_inserti64x4(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa[b + 1].qs)), 1);
  p.negcorr = _mm512_sub_epi32(_mm512_setzero_si512(),
                               _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(P::kOffset), p.a));
  const uint32_t bits = xa[b].d | (single ? 0u : static_cast<uint32_t>(xa[b + 1].d) << 16);
  p.da = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
  return p;
}

template <typename P>
inline __m512 PairTerm(const typename P::Block* blk, const ActPair& a, bool single, __m512 acc) {
  const __m512i s = _mm512_dpbusd_epi32(a.negcorr, P::Codes(blk, single), a.a);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), PairScale(blk[0].d, single ? 0 : blk[1].d, a.da), acc);
}

// Dot of one weight row with one Q8_0 activation row. Rows run one at a time:
// on the target (Zen 4) interleaving several rows measured 3x slower on the
// memory-bound 262144-row projection than streaming one row after another.
template <typename P>
float DotRow(const uint8_t* wrow, int64_t nb, const BlockQ8_0* xa) {
  const auto* blk = reinterpret_cast<const typename P::Block*>(wrow);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    acc0 = PairTerm<P>(blk + b, LoadActPair<P>(xa, b, false), false, acc0);
    acc1 = PairTerm<P>(blk + b + 2, LoadActPair<P>(xa, b + 2, false), false, acc1);
  }
  if (b + 2 <= nb) {
    acc0 = PairTerm<P>(blk + b, LoadActPair<P>(xa, b, false), false, acc0);
    b += 2;
  }
  if (b < nb) acc1 = PairTerm<P>(blk + b, LoadActPair<P>(xa, b, true), true, acc1);
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// DotRow for kM activation rows at once (prefill): each weight pair is
// decoded once and used kM times. Accumulation order per activation row is
// DotRow's exactly, so a position's logits do not depend on whether it was
// prefilled in a batch or decoded alone.
template <typename P, int kM>
void DotRowMulti(const uint8_t* wrow, int64_t nb, const BlockQ8_0* const* xa, float* out, int64_t out_stride) {
  const auto* blk = reinterpret_cast<const typename P::Block*>(wrow);
  __m512 acc0[kM], acc1[kM];
  for (int i = 0; i < kM; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  auto term = [&](int64_t b, bool single, __m512* acc) {
    const __m512i codes = P::Codes(blk + b, single);
    for (int i = 0; i < kM; ++i) {
      const ActPair a = LoadActPair<P>(xa[i], b, single);
      const __m512i s = _mm512_dpbusd_epi32(a.negcorr, codes, a.a);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), PairScale(blk[b].d, single ? 0 : blk[b + 1].d, a.da), acc[i]);
    }
  };
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    term(b, false, acc0);
    term(b + 2, false, acc1);
  }
  if (b + 2 <= nb) {
    term(b, false, acc0);
    b += 2;
  }
  if (b < nb) term(b, true, acc1);
  for (int i = 0; i < kM; ++i) out[i * out_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
}

template <typename P>
void MatMulImpl(DECODED_QUANT_MATMUL_ARGS) {
  const int64_t nb = k / kQK;
  constexpr int kM = 4;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wrow = w + r * w_row_bytes;
    int64_t i = 0;
    for (; i + kM <= m; i += kM) {
      const BlockQ8_0* xa[kM];
      for (int j = 0; j < kM; ++j) xa[j] = reinterpret_cast<const BlockQ8_0*>(xq + (i + j) * xq_row_bytes);
      DotRowMulti<P, kM>(wrow, nb, xa, y + i * ldy + r, ldy);
    }
    for (; i < m; ++i) {
      y[i * ldy + r] = DotRow<P>(wrow, nb, reinterpret_cast<const BlockQ8_0*>(xq + i * xq_row_bytes));
    }
  }
}

#elif defined(__AVX2__)

// Sum of the 32 products of signed int8 vectors, as 8 int32 lanes; |x| <= 128
// and |y| <= 127 keep maddubs' int16 pair sums from saturating.
inline __m256i DotS8(__m256i x, __m256i y) {
  const __m256i ax = _mm256_sign_epi8(x, x);
  const __m256i sy = _mm256_sign_epi8(y, x);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

inline __m256i Nibbles(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Byte j = 0xFF where bit j of `bits` is set.
inline __m256i BitsToBytes(uint32_t bits) {
  const __m256i v = _mm256_set1_epi32(static_cast<int>(bits));
  const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                          0x0303030303030303);
  const __m256i bytes = _mm256_shuffle_epi8(v, shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
}

struct Q8_0Block {
  using Block = BlockQ8_0;
  static __m256i Values(const Block& b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }
};
struct Q4_0Block {
  using Block = BlockQ4_0;
  static __m256i Values(const Block& b) { return _mm256_sub_epi8(Nibbles(b.qs), _mm256_set1_epi8(8)); }
};
struct Q5_0Block {
  using Block = BlockQ5_0;
  static __m256i Values(const Block& b) {
    const __m256i hb = _mm256_and_si256(BitsToBytes(LoadU32(b.qh)), _mm256_set1_epi8(16));
    return _mm256_sub_epi8(_mm256_or_si256(Nibbles(b.qs), hb), _mm256_set1_epi8(16));
  }
};

inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <typename P>
void MatMulImpl(DECODED_QUANT_MATMUL_ARGS) {
  using Block = typename P::Block;
  const int64_t nb = k / kQK;
  for (int64_t r = r0; r < r1; ++r) {
    const auto* wb = reinterpret_cast<const Block*>(w + r * w_row_bytes);
    for (int64_t i = 0; i < m; ++i) {
      const auto* xa = reinterpret_cast<const BlockQ8_0*>(xq + i * xq_row_bytes);
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      int64_t b = 0;
      for (; b + 1 < nb; b += 2) {
        const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa[b].qs));
        const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa[b + 1].qs));
        const __m256i s0 = DotS8(P::Values(wb[b]), a0);
        const __m256i s1 = DotS8(P::Values(wb[b + 1]), a1);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(HalfToFloat(wb[b].d) * HalfToFloat(xa[b].d)), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1),
                               _mm256_set1_ps(HalfToFloat(wb[b + 1].d) * HalfToFloat(xa[b + 1].d)), acc1);
      }
      if (b < nb) {
        const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa[b].qs));
        const __m256i s0 = DotS8(P::Values(wb[b]), a0);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(HalfToFloat(wb[b].d) * HalfToFloat(xa[b].d)), acc0);
      }
      y[i * ldy + r] = Hsum(_mm256_add_ps(acc0, acc1));
    }
  }
}

#else  // portable

struct Q8_0Block {
  using Block = BlockQ8_0;
  static void Values(const Block& b, int8_t* v) { std::memcpy(v, b.qs, kQK); }
};
struct Q4_0Block {
  using Block = BlockQ4_0;
  static void Values(const Block& b, int8_t* v) {
    for (int j = 0; j < 16; ++j) {
      v[j] = static_cast<int8_t>((b.qs[j] & 0xF) - 8);
      v[j + 16] = static_cast<int8_t>((b.qs[j] >> 4) - 8);
    }
  }
};
struct Q5_0Block {
  using Block = BlockQ5_0;
  static void Values(const Block& b, int8_t* v) {
    const uint32_t qh = LoadU32(b.qh);
    for (int j = 0; j < 16; ++j) {
      v[j] = static_cast<int8_t>(((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
      v[j + 16] = static_cast<int8_t>(((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
  }
};

template <typename P>
void MatMulImpl(DECODED_QUANT_MATMUL_ARGS) {
  using Block = typename P::Block;
  const int64_t nb = k / kQK;
  int8_t v[kQK];
  for (int64_t r = r0; r < r1; ++r) {
    const auto* wb = reinterpret_cast<const Block*>(w + r * w_row_bytes);
    for (int64_t i = 0; i < m; ++i) {
      const auto* xa = reinterpret_cast<const BlockQ8_0*>(xq + i * xq_row_bytes);
      float sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        P::Values(wb[b], v);
        int s = 0;
        for (int j = 0; j < kQK; ++j) s += v[j] * xa[b].qs[j];
        sum += HalfToFloat(wb[b].d) * HalfToFloat(xa[b].d) * static_cast<float>(s);
      }
      y[i * ldy + r] = sum;
    }
  }
}

#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
using Q4_0Kernel = Q4_0Pair;
using Q5_0Kernel = Q5_0Pair;
using Q8_0Kernel = Q8_0Pair;
#else
using Q4_0Kernel = Q4_0Block;
using Q5_0Kernel = Q5_0Block;
using Q8_0Kernel = Q8_0Block;
#endif

}  // namespace

void MatMulQ4_0(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<Q4_0Kernel>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }
void MatMulQ5_0(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<Q5_0Kernel>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }
void MatMulQ8_0(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<Q8_0Kernel>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }

const char* KernelVariant() {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  return "avx512vnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace decoded::quant::internal
