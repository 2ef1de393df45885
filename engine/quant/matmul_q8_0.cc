// Q4_0 / Q5_0 / Q8_0 and Q4_1 / Q5_1 weights times Q8_0 activations.
//
// Per 32-element block b the integer dot S_b = sum(qw * qa) is exact; the
// row result is sum_b fp16(dw_b) * fp16(da_b) * S_b accumulated in f32
// (ggml_vec_dot_q*_0_q8_0 numerics).
//
// Q4_1 / Q5_1 (x = d*q + m, q unsigned) add the min term per block:
//   dw*da*S_b + mw*da*A_b,   A_b = sum(qa), computed from the Q8_0 block.
// ggml pairs these types with Q8_1 activations instead, whose s = d*sum(qa)
// is stored as fp16: that rounds the min term (relative 2^-11) and needs a
// second conversion of every activation. Summing the int8 codes here keeps
// A_b an exact integer (both fp16 products are exact in f32, so each block
// adds two singly-rounded terms), costs one more integer dot per block
// against a memory-bound weight stream, and lets matmuls of mixed-type files
// (e.g. Q4_1 q/k beside a Q8_0 v projection) share one conversion per input.
//
// AVX-512 VNNI: two blocks fill one zmm. Weight codes are made unsigned
// (code = q + O with O = 8 / 16 / 128; the _1 types' codes already are) so
// vpdpbusd (u8 x s8) applies; the offset's contribution O * sum(qa) depends
// only on the activation and seeds the integer accumulator.
// AVX2: one block per ymm, sign trick (|qw| x sign(qa, qw)) into maddubs;
// the _1 types' unsigned codes go into maddubs directly; each weight block
// is decoded once for up to 4 activation rows (batched decode, prefill).
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/kernels.h"
#include "engine/quant/prefetch.h"
#include "engine/quant/quant.h"
#include "engine/quant/x86.h"

namespace decoded::quant::internal::DECODED_ISA_NS {
namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)

// Loads the unsigned codes of weight blocks b0 and b0+1 (or of b0 alone, with
// `single`; the upper half is then don't-care because the activation's upper
// half is zero) into one zmm, in element order.
struct Q8_0Pair {
  using Block = BlockQ8_0;
  static constexpr bool kHasMin = false;
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

// 4-bit codes (Q4_0, Q4_1) and 5-bit codes (Q5_0, Q5_1) of a block pair:
// the _0 and _1 blocks share the qh / qs layout behind different headers.
template <typename Block>
inline __m512i NibbleCodes(const Block* b, bool single) {
  return NibblePair(b[0].qs, single ? b[0].qs : b[1].qs, single);
}

template <typename Block>
inline __m512i FiveBitCodes(const Block* b, bool single) {
  const __m512i n = NibbleCodes(b, single);
  const uint64_t hi = single ? 0 : LoadU32(b[1].qh);
  const __mmask64 k = _cvtu64_mask64(LoadU32(b[0].qh) | (hi << 32));
  return _mm512_mask_add_epi8(n, k, n, _mm512_set1_epi8(16));
}

struct Q4_0Pair {
  using Block = BlockQ4_0;
  static constexpr bool kHasMin = false;
  static constexpr int kOffset = 8;
  static __m512i Codes(const Block* b, bool single) { return NibbleCodes(b, single); }
};

struct Q5_0Pair {
  using Block = BlockQ5_0;
  static constexpr bool kHasMin = false;
  static constexpr int kOffset = 16;
  static __m512i Codes(const Block* b, bool single) { return FiveBitCodes(b, single); }
};

struct Q4_1Pair {
  using Block = BlockQ4_1;
  static constexpr bool kHasMin = true;
  static __m512i Codes(const Block* b, bool single) { return NibbleCodes(b, single); }
};

struct Q5_1Pair {
  using Block = BlockQ5_1;
  static constexpr bool kHasMin = true;
  static __m512i Codes(const Block* b, bool single) { return FiveBitCodes(b, single); }
};

// [dw0*da0 x8, dw1*da1 x8] from two fp16 weight scales and the activation
// pair's f32 scales in lanes 0-1 of `da`.
inline __m512 PairScale(uint16_t dw0, uint16_t dw1, __m128 da) {
  const __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dw0 | (static_cast<uint32_t>(dw1) << 16))));
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_mul_ps(dw, da)));
}

// PairScale for the scales and the mins of a _1 pair at once: *ds gets
// [dw0*da0 x8, dw1*da1 x8], *ms [mw0*da0 x8, mw1*da1 x8].
template <typename Block>
inline void PairScaleMin(const Block* b, bool single, __m128 da, __m512* ds, __m512* ms) {
  const uint64_t d = b[0].d | (single ? 0u : static_cast<uint32_t>(b[1].d) << 16);
  const uint64_t m = b[0].m | (single ? 0u : static_cast<uint32_t>(b[1].m) << 16);
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(d | (m << 32))));  // [d0 d1 m0 m1]
  const __m512 prod = _mm512_castps128_ps512(_mm_mul_ps(dm, _mm_movelh_ps(da, da)));
  *ds = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), prod);
  *ms = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2), prod);
}

// Activation pair (blocks b, b+1; b alone with `single`, upper half zero),
// its two f32 scales, and per int32 lane either the offset correction
// -O*sum(qa) (the _0 types and Q8_0) or, for the _1 types, sum(qa) as f32.
struct ActPair {
  __m512i a;
  __m512i negcorr;
  __m512 asum;
  __m128 da;
};

template <typename P>
inline ActPair LoadActPair(const BlockQ8_0* xa, int64_t b, bool single) {
  const __m512i lo = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa[b].qs)));
  ActPair p;
  p.a = single ? lo : _mm512_inserti64x4(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa[b + 1].qs)), 1);
  if constexpr (P::kHasMin) {
    p.negcorr = _mm512_setzero_si512();
    p.asum = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), p.a));
  } else {
    p.negcorr = _mm512_sub_epi32(_mm512_setzero_si512(),
                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(P::kOffset), p.a));
    p.asum = _mm512_setzero_ps();
  }
  const uint32_t bits = xa[b].d | (single ? 0u : static_cast<uint32_t>(xa[b + 1].d) << 16);
  p.da = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
  return p;
}

// acc + this pair's terms, given the pair's unsigned weight codes.
template <typename P>
inline __m512 PairFma(__m512i codes, const typename P::Block* blk, const ActPair& a, bool single, __m512 acc) {
  const __m512i s = _mm512_dpbusd_epi32(a.negcorr, codes, a.a);
  if constexpr (P::kHasMin) {
    __m512 ds, ms;
    PairScaleMin(blk, single, a.da, &ds, &ms);
    return _mm512_fmadd_ps(a.asum, ms, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), ds, acc));
  } else {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), PairScale(blk[0].d, single ? 0 : blk[1].d, a.da), acc);
  }
}

template <typename P>
inline __m512 PairTerm(const typename P::Block* blk, const ActPair& a, bool single, __m512 acc) {
  return PairFma<P>(P::Codes(blk, single), blk, a, single, acc);
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
    for (int i = 0; i < kM; ++i) acc[i] = PairFma<P>(codes, blk + b, LoadActPair<P>(xa[i], b, single), single, acc[i]);
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

// [v0 x8, v1 x8] from the f32 values in lanes 0 and 1 of `v`.
inline __m512 SpreadPair(__m128 v) {
  return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                               _mm512_castps128_ps512(v));
}

// Weight scales (and, for the _1 types, mins) of a block pair as SpreadPair
// vectors; the second block's are 0 with `single`.
template <typename P>
inline void WeightScales(const typename P::Block* b, bool single, __m512* d, __m512* mn) {
  if constexpr (P::kHasMin) {
    const uint64_t dd = b[0].d | (single ? 0u : static_cast<uint32_t>(b[1].d) << 16);
    const uint64_t mm = b[0].m | (single ? 0u : static_cast<uint32_t>(b[1].m) << 16);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(dd | (mm << 32))));  // [d0 d1 m0 m1]
    *d = SpreadPair(dm);
    *mn = SpreadPair(_mm_movehl_ps(dm, dm));
  } else {
    *d = SpreadPair(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(b[0].d | (single ? 0u : static_cast<uint32_t>(b[1].d) << 16)))));
    *mn = _mm512_setzero_ps();
  }
}

// One weight row's block pair, decoded for reuse by every activation row:
// unsigned codes and the SpreadPair scale (and min) vectors.
struct PackedPair {
  __m512i codes;
  __m512 d;
  __m512 m;
};

// Decodes pairs [0, n_pairs) of kRm weight rows into `out[p * kRm + r]`;
// with an odd block count the last pair is the trailing single block.
template <typename P, int kRm>
void PackTile(const uint8_t* w, size_t w_row_bytes, int64_t nb, PackedPair* out) {
  for (int r = 0; r < kRm; ++r) {
    const auto* blk = reinterpret_cast<const typename P::Block*>(w + r * w_row_bytes);
    for (int64_t b = 0; b < nb; b += 2) {
      const bool single = b + 1 == nb;
      PackedPair& pp = out[(b / 2) * kRm + r];
      pp.codes = P::Codes(blk + b, single);
      WeightScales<P>(blk + b, single, &pp.d, &pp.m);
    }
  }
}

// An activation pair as the tiles use it: LoadActPair's values with the
// scales spread (SpreadPair).
struct PreparedAct {
  __m512i a;
  __m512i negcorr;
  __m512 asum;
  __m512 da;
};

template <typename P>
inline PreparedAct PrepareAct(const BlockQ8_0* xa, int64_t b, bool single) {
  const ActPair p = LoadActPair<P>(xa, b, single);
  return PreparedAct{p.a, p.negcorr, p.asum, SpreadPair(p.da)};
}

// A kRm x kRn tile of outputs (weight rows x activation rows) for prefill
// and batched decode, from weight rows packed by PackTile (decoded once per
// tile of weight rows, used by all m activation rows); `act(i, b, single)`
// gives activation row i's pair at block b (PrepareAct's values, computed
// on the spot or read from a table made once per call). Every output runs
// DotRow's float operations in DotRow's order: accumulator 0 takes the even
// full pairs, accumulator 1 the odd ones and then a trailing single block,
// the row result is the reduction of their sum; the scale products are the
// same f32 products PairScale / PairScaleMin form, lane for lane. So an
// output's bits do not depend on m, on the tile it lands in, or on how the
// rows are split across threads. `pf` (optional) advances once per pair step.
template <typename P, int kRm, int kRn, typename ActFn>
void DotTile(const PackedPair* packed, int64_t nb, ActFn act, float* y, int64_t ldy, SpreadPrefetch* pf) {
  __m512 acc[kRm][kRn], acc0[kRm][kRn];
  auto step = [&](int64_t b, bool single) {
    if (pf != nullptr) pf->Step();
    const PackedPair* pp = packed + (b / 2) * kRm;
    for (int i = 0; i < kRn; ++i) {
      const PreparedAct a = act(i, b, single);
      const __m512 da = a.da;
      for (int r = 0; r < kRm; ++r) {
        const __m512i s = _mm512_dpbusd_epi32(a.negcorr, pp[r].codes, a.a);
        if constexpr (P::kHasMin) {
          acc[r][i] = _mm512_fmadd_ps(a.asum, _mm512_mul_ps(pp[r].m, da),
                                      _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(pp[r].d, da), acc[r][i]));
        } else {
          acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(pp[r].d, da), acc[r][i]);
        }
      }
    }
  };
  const int64_t n_pairs = nb / 2;
  for (int phase = 0; phase < 2; ++phase) {
    for (int r = 0; r < kRm; ++r) {
      for (int i = 0; i < kRn; ++i) acc[r][i] = _mm512_setzero_ps();
    }
    for (int64_t p = phase; p < n_pairs; p += 2) step(2 * p, false);
    if (phase == 0) {
      for (int r = 0; r < kRm; ++r) {
        for (int i = 0; i < kRn; ++i) acc0[r][i] = acc[r][i];
      }
    } else if (nb % 2 != 0) {
      step(nb - 1, true);
    }
  }
  for (int r = 0; r < kRm; ++r) {
    for (int i = 0; i < kRn; ++i) y[i * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r][i], acc[r][i]));
  }
}

// Prefill tiles: kTileRows weight rows x kTileActs activation rows. Weight
// rows are the outer loop, packed once (kTileRows * 192 B per 64 elements:
// 24 KiB at k = 2048, L1-resident) while the m activation rows (a few
// hundred KiB at most for m = 128) stream from L2. Rows up to kMaxPackedK
// elements take the tiled path (the pack lives on the stack: no allocation
// per call, which batched decode steps rely on).
constexpr int kTileRows = 4;
constexpr int kTileActs = kMatMulActivationTile;
constexpr int64_t kMaxPackedK = 8192;
// Batched decode steps (m of a few to 64 rows, k of a small model) prepare
// every activation pair once per call instead of once per weight tile, which
// was about a third of the tile's instructions; up to this many pairs (128
// KiB of stack, e.g. 16 rows at k = 2048), larger calls prepare per tile.
constexpr int64_t kMaxPreparedPairs = 512;

template <typename P>
void MatMulImpl(DECODED_QUANT_MATMUL_ARGS) {
  const int64_t nb = k / kQK;
  constexpr int kM = 4;
  int64_t r = r0;
  if (m >= kTileActs && k <= kMaxPackedK) {
    PackedPair packed[kMaxPackedK / (2 * kQK) * kTileRows];
    // Pair index b / 2 of activation row i at prepared[i * n_steps + b / 2]
    // (the trailing single block of an odd nb is the last step).
    const int64_t n_steps = (nb + 1) / 2;
    const int64_t tiled_rows = m - m % kTileActs;
    PreparedAct prepared[kMaxPreparedPairs];
    const bool use_prepared = tiled_rows * n_steps <= kMaxPreparedPairs;
    if (use_prepared) {
      for (int64_t i = 0; i < tiled_rows; ++i) {
        const auto* xa = reinterpret_cast<const BlockQ8_0*>(xq + i * xq_row_bytes);
        for (int64_t st = 0; st < n_steps; ++st) prepared[i * n_steps + st] = PrepareAct<P>(xa, 2 * st, 2 * st + 1 == nb);
      }
    }
    for (; r + kTileRows <= r1; r += kTileRows) {
      const uint8_t* wtile = w + r * w_row_bytes;
      // The next tiles' lines, spread over the first activation tile's steps.
      SpreadPrefetch pf(wtile, kTileRows * w_row_bytes, (nb + 1) / 2);
      PackTile<P, kTileRows>(wtile, w_row_bytes, nb, packed);
      int64_t i = 0;
      for (; i + kTileActs <= m; i += kTileActs) {
        SpreadPrefetch* tile_pf = i == 0 ? &pf : nullptr;
        if (use_prepared) {
          const PreparedAct* rows = prepared + i * n_steps;
          auto act = [rows, n_steps](int a, int64_t b, bool) { return rows[a * n_steps + b / 2]; };
          DotTile<P, kTileRows, kTileActs>(packed, nb, act, y + i * ldy + r, ldy, tile_pf);
        } else {
          const BlockQ8_0* xa[kTileActs];
          for (int a = 0; a < kTileActs; ++a) xa[a] = reinterpret_cast<const BlockQ8_0*>(xq + (i + a) * xq_row_bytes);
          auto act = [&xa](int a, int64_t b, bool single) { return PrepareAct<P>(xa[a], b, single); };
          DotTile<P, kTileRows, kTileActs>(packed, nb, act, y + i * ldy + r, ldy, tile_pf);
        }
      }
      pf.Finish();
      for (; i < m; ++i) {
        const auto* xa = reinterpret_cast<const BlockQ8_0*>(xq + i * xq_row_bytes);
        for (int j = 0; j < kTileRows; ++j) y[i * ldy + r + j] = DotRow<P>(wtile + j * w_row_bytes, nb, xa);
      }
    }
  }
  for (; r < r1; ++r) {
    const uint8_t* wrow = w + r * w_row_bytes;
    PrefetchAhead(wrow, w_row_bytes);
    int64_t i = 0;
    const BlockQ8_0* xa[kM];
    auto rows = [&](int count) {
      for (int j = 0; j < count; ++j) xa[j] = reinterpret_cast<const BlockQ8_0*>(xq + (i + j) * xq_row_bytes);
    };
    for (; i + kM <= m; i += kM) {
      rows(kM);
      DotRowMulti<P, kM>(wrow, nb, xa, y + i * ldy + r, ldy);
    }
    // 2 or 3 rows left (batched decode of 2-3 sessions): decode the weight
    // pair once for them too.
    if (m - i == 3) {
      rows(3);
      DotRowMulti<P, 3>(wrow, nb, xa, y + i * ldy + r, ldy);
    } else if (m - i == 2) {
      rows(2);
      DotRowMulti<P, 2>(wrow, nb, xa, y + i * ldy + r, ldy);
    } else if (m - i == 1) {
      y[i * ldy + r] = DotRow<P>(wrow, nb, reinterpret_cast<const BlockQ8_0*>(xq + i * xq_row_bytes));
    }
  }
}

#elif defined(__AVX2__)

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

// 5-bit codes of a Q5_0 / Q5_1 block, unsigned.
template <typename Block>
inline __m256i FiveBits(const Block& b) {
  return _mm256_or_si256(Nibbles(b.qs), _mm256_and_si256(BitsToBytes(LoadU32(b.qh)), _mm256_set1_epi8(16)));
}

// _0 types and Q8_0: signed values q. _1 types: unsigned codes (0..31).
struct Q8_0Block {
  using Block = BlockQ8_0;
  static constexpr bool kHasMin = false;
  static __m256i Values(const Block& b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }
};
struct Q4_0Block {
  using Block = BlockQ4_0;
  static constexpr bool kHasMin = false;
  static __m256i Values(const Block& b) { return _mm256_sub_epi8(Nibbles(b.qs), _mm256_set1_epi8(8)); }
};
struct Q5_0Block {
  using Block = BlockQ5_0;
  static constexpr bool kHasMin = false;
  static __m256i Values(const Block& b) { return _mm256_sub_epi8(FiveBits(b), _mm256_set1_epi8(16)); }
};
struct Q4_1Block {
  using Block = BlockQ4_1;
  static constexpr bool kHasMin = true;
  static __m256i Values(const Block& b) { return Nibbles(b.qs); }
};
struct Q5_1Block {
  using Block = BlockQ5_1;
  static constexpr bool kHasMin = true;
  static __m256i Values(const Block& b) { return FiveBits(b); }
};

// One weight block decoded for the activation rows that use it: its values
// (P::Values), for the signed types also |values| (for maddubs, which takes
// one unsigned operand: |w| x sign(a, w) = w x a), and
// its scale (and min) as f32.
template <typename P>
struct DecodedBlock {
  __m256i v;
  __m256i v_abs;
  float d;
  float m;
};

template <typename P>
inline DecodedBlock<P> DecodeBlock(const typename P::Block& wb) {
  DecodedBlock<P> db;
  db.v = P::Values(wb);
  db.d = HalfToFloat(wb.d);
  if constexpr (P::kHasMin) {
    db.v_abs = db.v;
    db.m = HalfToFloat(wb.m);
  } else {
    db.v_abs = _mm256_sign_epi8(db.v, db.v);
    db.m = 0.0f;
  }
  return db;
}

// acc + the terms of one decoded weight block with its activation block. The
// _1 types' pair sums in maddubs stay below 2*31*127, far from saturating;
// for the signed types |w| <= 128 and |a| <= 127 keep maddubs' int16 pair
// sums from saturating (sign trick: |w| x sign(a, w)).
template <typename P>
inline __m256 BlockTerm(const DecodedBlock<P>& db, const BlockQ8_0& xa, __m256 acc) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.qs));
  const __m256i ones16 = _mm256_set1_epi16(1);
  const float da = HalfToFloat(xa.d);
  if constexpr (P::kHasMin) {
    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(db.v, a), ones16);
    const __m256i sa = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), a), ones16);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(db.d * da), acc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_set1_ps(db.m * da), acc);
  } else {
    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(db.v_abs, _mm256_sign_epi8(a, db.v)), ones16);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(db.d * da), acc);
  }
}

inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One weight row times kM activation rows: each block is decoded once and
// used kM times. Per activation row the float operations are the one-row
// order (accumulator 0: even blocks and a trailing odd one, 1: odd blocks;
// the result is the sum of the two reduced), so a row's output does not
// depend on how many rows share the call.
template <typename P, int kM>
void DotRowMulti(const typename P::Block* wb, int64_t nb, const BlockQ8_0* const* xa, float* out, int64_t out_stride) {
  __m256 acc0[kM], acc1[kM];
  for (int j = 0; j < kM; ++j) acc0[j] = acc1[j] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    const DecodedBlock<P> d0 = DecodeBlock<P>(wb[b]);
    const DecodedBlock<P> d1 = DecodeBlock<P>(wb[b + 1]);
    for (int j = 0; j < kM; ++j) {
      acc0[j] = BlockTerm<P>(d0, xa[j][b], acc0[j]);
      acc1[j] = BlockTerm<P>(d1, xa[j][b + 1], acc1[j]);
    }
  }
  if (b < nb) {
    const DecodedBlock<P> d0 = DecodeBlock<P>(wb[b]);
    for (int j = 0; j < kM; ++j) acc0[j] = BlockTerm<P>(d0, xa[j][b], acc0[j]);
  }
  for (int j = 0; j < kM; ++j) out[j * out_stride] = Hsum(_mm256_add_ps(acc0[j], acc1[j]));
}

template <typename P>
void MatMulImpl(DECODED_QUANT_MATMUL_ARGS) {
  using Block = typename P::Block;
  const int64_t nb = k / kQK;
  constexpr int kM = 4;
  for (int64_t r = r0; r < r1; ++r) {
    PrefetchAhead(w + r * w_row_bytes, w_row_bytes);
    const auto* wb = reinterpret_cast<const Block*>(w + r * w_row_bytes);
    const BlockQ8_0* xa[kM];
    int64_t i = 0;
    auto rows = [&](int count) {
      for (int j = 0; j < count; ++j) xa[j] = reinterpret_cast<const BlockQ8_0*>(xq + (i + j) * xq_row_bytes);
    };
    for (; i + kM <= m; i += kM) {
      rows(kM);
      DotRowMulti<P, kM>(wb, nb, xa, y + i * ldy + r, ldy);
    }
    rows(static_cast<int>(m - i));
    switch (m - i) {
      case 3:
        DotRowMulti<P, 3>(wb, nb, xa, y + i * ldy + r, ldy);
        break;
      case 2:
        DotRowMulti<P, 2>(wb, nb, xa, y + i * ldy + r, ldy);
        break;
      case 1:
        DotRowMulti<P, 1>(wb, nb, xa, y + i * ldy + r, ldy);
        break;
      default:
        break;
    }
  }
}

#else  // portable

// Unsigned codes of a 4-bit / 5-bit block minus `offset`.
template <typename Block>
void NibbleValues(const Block& b, int offset, int8_t* v) {
  for (int j = 0; j < 16; ++j) {
    v[j] = static_cast<int8_t>((b.qs[j] & 0xF) - offset);
    v[j + 16] = static_cast<int8_t>((b.qs[j] >> 4) - offset);
  }
}
template <typename Block>
void FiveBitValues(const Block& b, int offset, int8_t* v) {
  const uint32_t qh = LoadU32(b.qh);
  for (int j = 0; j < 16; ++j) {
    v[j] = static_cast<int8_t>(((b.qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - offset);
    v[j + 16] = static_cast<int8_t>(((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset);
  }
}

// _0 types and Q8_0: signed values q. _1 types: unsigned codes (0..31).
struct Q8_0Block {
  using Block = BlockQ8_0;
  static constexpr bool kHasMin = false;
  static void Values(const Block& b, int8_t* v) { std::memcpy(v, b.qs, kQK); }
};
struct Q4_0Block {
  using Block = BlockQ4_0;
  static constexpr bool kHasMin = false;
  static void Values(const Block& b, int8_t* v) { NibbleValues(b, 8, v); }
};
struct Q5_0Block {
  using Block = BlockQ5_0;
  static constexpr bool kHasMin = false;
  static void Values(const Block& b, int8_t* v) { FiveBitValues(b, 16, v); }
};
struct Q4_1Block {
  using Block = BlockQ4_1;
  static constexpr bool kHasMin = true;
  static void Values(const Block& b, int8_t* v) { NibbleValues(b, 0, v); }
};
struct Q5_1Block {
  using Block = BlockQ5_1;
  static constexpr bool kHasMin = true;
  static void Values(const Block& b, int8_t* v) { FiveBitValues(b, 0, v); }
};

template <typename P>
void MatMulImpl(DECODED_QUANT_MATMUL_ARGS) {
  using Block = typename P::Block;
  const int64_t nb = k / kQK;
  int8_t v[kQK];
  for (int64_t r = r0; r < r1; ++r) {
    PrefetchAhead(w + r * w_row_bytes, w_row_bytes);
    const auto* wb = reinterpret_cast<const Block*>(w + r * w_row_bytes);
    for (int64_t i = 0; i < m; ++i) {
      const auto* xa = reinterpret_cast<const BlockQ8_0*>(xq + i * xq_row_bytes);
      float sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        P::Values(wb[b], v);
        int s = 0;
        for (int j = 0; j < kQK; ++j) s += v[j] * xa[b].qs[j];
        sum += HalfToFloat(wb[b].d) * HalfToFloat(xa[b].d) * static_cast<float>(s);
        if constexpr (P::kHasMin) {
          int sa = 0;
          for (int j = 0; j < kQK; ++j) sa += xa[b].qs[j];
          sum += HalfToFloat(wb[b].m) * HalfToFloat(xa[b].d) * static_cast<float>(sa);
        }
      }
      y[i * ldy + r] = sum;
    }
  }
}

#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
using Q4_0Kernel = Q4_0Pair;
using Q4_1Kernel = Q4_1Pair;
using Q5_0Kernel = Q5_0Pair;
using Q5_1Kernel = Q5_1Pair;
using Q8_0Kernel = Q8_0Pair;
#else
using Q4_0Kernel = Q4_0Block;
using Q4_1Kernel = Q4_1Block;
using Q5_0Kernel = Q5_0Block;
using Q5_1Kernel = Q5_1Block;
using Q8_0Kernel = Q8_0Block;
#endif

}  // namespace

void MatMulQ4_0(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<Q4_0Kernel>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }
void MatMulQ4_1(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<Q4_1Kernel>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }
void MatMulQ5_0(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<Q5_0Kernel>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }
void MatMulQ5_1(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<Q5_1Kernel>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }
void MatMulQ8_0(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<Q8_0Kernel>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }

}  // namespace decoded::quant::internal::DECODED_ISA_NS
