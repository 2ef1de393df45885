// The attention kernel of kernels.h, compiled once per tier of
// engine/cpu_isa.h (as kernels_isa.cc).
//
// Flash-attention's loop on a CPU (Dao et al. 2022; the online softmax of
// Milakov & Gimelshein 2018): keys go in tiles of 16 at absolute positions
// (multiples of 16), and each tile is one vector step for a query: 16 scores,
// one rescale of the running sums, 16 exponentials in one vector, then the
// weighted values. A work item is a few query vectors of one kv head (GQA's
// heads that share it, and consecutive rows of one cache: a prefill span), so
// each key and value tile is read from memory once and from L1 by all of
// them; inside the item, up to eight vectors (four on avx2) with the same
// key range in a tile share each load into registers (register blocking: one
// vector alone does a load per FMA, and a core that loads one 512-bit vector
// per cycle then runs at half its FMA rate on 256-wide heads). Keys stored
// in panels (engine/cpu/key_panels.h) put a tile's 16 keys in the lanes, so
// q.k needs no reduction across lanes; other caches are read as rows, with
// the same arithmetic per key.
//
// Exactness: a query vector's arithmetic depends only on its own q row and
// key range, never on the item it shares (tiles sit at absolute positions,
// its own lanes are masked, the others' rows never enter its sums), on the
// chunk, batch, block size or thread count. So D1, held plans, batches,
// mixed steps and paged caches give the same bytes, as the serving tests
// require. Its operations are engine/cpu/simd16.h's, fixed per tier and
// independent of the optimization level.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_isa.h"
#include "engine/cpu/key_panels.h"
#include "engine/cpu/simd16.h"
#include "engine/kv_layout.h"
#include "engine/kv_rows.h"
#include "engine/quant/blocks.h"

namespace decoded::cpu::DECODED_ISA_NS {
namespace {

using simd::F32x16;

constexpr int32_t kTile = 16;        // keys per tile (the lanes of F32x16)
// Most query vectors (row, head) in one work item: three groups of eight
// (kMaxGroup). 16 left SmolLM2's 3-head spans in groups of 8 and 7, measured
// 3-4% slower; the items' key and value tiles stay in L1 either way.
constexpr int32_t kItemVectors = 24;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int32_t RoundUp16(int32_t n) { return (n + 15) / 16 * 16; }

// The first n elements of a KV row of `type` as f32 into buf (exact: f16 ->
// f32 is exact; q8_0 is d * q per element, ggml's dequantize_row_q8_0).
void DecodeKvRow(DType type, const uint8_t* row, int32_t n, float* buf) {
  namespace qi = quant::internal;
  if (type == DType::kF16) {
    int32_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i))));
    }
#endif
    for (; i < n; ++i) buf[i] = qi::HalfToFloat(qi::LoadU16(row + 2 * i));
  } else if (type == DType::kQ8_0) {
    for (int32_t b = 0; b < n / 32; ++b) {
      const uint8_t* blk = row + 34 * b;
      const float d = qi::HalfToFloat(qi::LoadU16(blk));
      const auto* q = reinterpret_cast<const int8_t*>(blk + 2);
      for (int32_t j = 0; j < 32; ++j) buf[32 * b + j] = d * static_cast<float>(q[j]);
    }
  } else {
    std::memcpy(buf, row, static_cast<size_t>(n) * sizeof(float));
  }
}

// A tile's 16 key or value rows, row jj at base + jj * stride bytes, of
// elements E: float (f32), or uint16_t (IEEE half, read and widened
// exactly in the loop). Either straight from the cache, where the tile lies
// in one block and every row is needed, or a decoded f32 copy (TileBuffer).
template <typename E>
struct TileRows {
  const uint8_t* base;
  int64_t stride;
  const E* row(int32_t jj) const { return reinterpret_cast<const E*>(base + jj * stride); }
};

inline F32x16 LoadRow(const float* p) { return simd::Load(p); }
inline F32x16 LoadRow(const uint16_t* p) { return simd::LoadHalf(p); }

// Floats that only grow, their contents not kept when they do. Not a
// std::vector: its out-of-line members would be emitted in this per-tier
// object as weak symbols any baseline caller could bind to (at -O1 they
// are; tests/isa_symbols_check.cmake).
class FloatBuffer {
 public:
  FloatBuffer() = default;
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  ~FloatBuffer() { std::free(data_); }
  float* data() const { return data_; }
  void Grow(size_t n) {
    if (n <= size_) return;
    std::free(data_);
    // Cache-line aligned: a 64-byte vector load or store at a misaligned
    // address touches two lines.
    data_ = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
    if (data_ == nullptr) std::abort();  // a few hundred KiB at most (kMaxKeyDim, kMaxValueDim)
    size_ = n;
  }

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
};

// The f32 copy of a tile's rows: [16, padded width], zeros past the width
// and in the rows of positions no vector reads.
class TileBuffer {
 public:
  void Reset(int32_t width) {
    width_ = width;
    padded_ = RoundUp16(width);
    buf_.Grow(static_cast<size_t>(kTile * padded_));
  }
  int32_t padded() const { return padded_; }
  void Set(int32_t jj, DType type, const uint8_t* row) {
    float* b = Row(jj);
    DecodeKvRow(type, row, width_, b);
    std::fill(b + width_, b + padded_, 0.0f);
  }
  void SetZero(int32_t jj) { std::fill(Row(jj), Row(jj) + padded_, 0.0f); }
  TileRows<float> rows() const {
    return {reinterpret_cast<const uint8_t*>(buf_.data()), static_cast<int64_t>(padded_) * 4};
  }

 private:
  float* Row(int32_t jj) { return buf_.data() + static_cast<size_t>(jj) * padded_; }
  int32_t width_ = 0, padded_ = 0;
  FloatBuffer buf_;
};

struct Scratch {
  TileBuffer k, v;
  FloatBuffer acc;  // [kItemVectors, padded v_dim]
  FloatBuffer qt;   // an item's q vectors transposed for key panels: [padded k_dim, kItemVectors]
};

Scratch& ThreadScratch() {
  static thread_local Scratch s;
  return s;
}

// One query vector's running state.
struct QueryState {
  const float* q = nullptr;
  float* out = nullptr;
  float* acc = nullptr;  // padded v_dim
  int32_t lo = 0, hi = 0;
  float m = kNegInf;
  // The softmax denominator, lane j summing the weights of the keys at
  // positions j mod 16; summed across lanes once, at the end (a horizontal
  // sum and a scalar FMA per tile cost 2-11% of the kernel's time).
  F32x16 l;
};

// The largest group of query vectors (of one item, with the same key range
// in a tile) that share each key and value load: eight where the tier has 32
// vector registers, so an f16 key or value vector (whose widening costs two
// uops on the FMA ports of the cores measured here) feeds eight FMAs, not
// four; four on avx2, whose F32x16 takes two of its 16 registers.
constexpr int kMaxGroup = simd::kRegistersPerVector == 1 ? 8 : 4;
// TileScores' largest group: its q chunks and sums fill the registers at 4.
constexpr int kMaxRowsGroup = 4;

// q . k for the 16 keys of a tile into lane j, for each of NV query vectors
// q[v]: per key, 16 partial sums (lane l of the width takes elements l,
// l + 16, ...: one FMA chain over the chunks in order), then simd16.h's
// tree across the lanes (ReduceSum4, FinishSum16). Rows are `chunks` x 16
// wide; q's last chunk holds k_dim - 16 (chunks - 1) elements (the rows are
// zero past k_dim). KC > 0 fixes chunks at compile time, so q's chunks stay
// in registers.
//
// Each key chunk is loaded once for the NV vectors (register blocking: a
// lone vector does one load per FMA, which is what bounds it on a core
// that loads one 512-bit vector per cycle); a vector's own arithmetic is
// the same for any NV, so its bytes do not depend on the group it is in.
template <int NV, int KC, typename E>
void TileScores(const float* const* q, TileRows<E> rows, int32_t chunks, int32_t k_dim, F32x16* scores) {
  if constexpr (KC > 0) chunks = KC;
  // q in registers while they hold it with the accumulators: KC x NV of q
  // and NV x keys-per-step of sums. Otherwise q is read from L1 per chunk.
  constexpr bool kQInRegs = KC > 0 && KC * NV <= 16;
  // Keys per step: enough independent FMA chains (NV x keys) to cover the
  // FMA latency, few enough to stay in registers.
  constexpr int kKeys = NV >= 3 && kQInRegs ? 2 : 4;
  F32x16 qv[kQInRegs ? NV : 1][kQInRegs ? KC : 1];
  if constexpr (kQInRegs) {
    for (int v = 0; v < NV; ++v) {
      for (int32_t c = 0; c < KC; ++c) qv[v][c] = simd::Load(q[v] + 16 * c);
    }
  }
  // The keys in the tree's groups of four (simd::kSum4Keys), each group
  // taken through the tree's first levels as soon as it is computed: a
  // vector holds 4 partial results instead of 16 sums (which did not fit
  // in registers with q and were stored and reloaded).
  simd::Sum4 sums[NV][4];
  for (int i = 0; i < 4; ++i) {
    const int* keys = simd::kSum4Keys[i];
    F32x16 a[NV][4];
    for (int k0 = 0; k0 < 4; k0 += kKeys) {
      for (int v = 0; v < NV; ++v) {
        for (int k = k0; k < k0 + kKeys; ++k) a[v][k] = simd::Set1(0.0f);
      }
      for (int32_t c = 0; c < chunks; ++c) {
        F32x16 qc[NV];
        for (int v = 0; v < NV; ++v) {
          if constexpr (kQInRegs) {
            qc[v] = qv[v][c];
          } else {
            qc[v] = 16 * c + 16 <= k_dim ? simd::Load(q[v] + 16 * c) : simd::LoadFirst(q[v] + 16 * c, k_dim - 16 * c);
          }
        }
        for (int k = k0; k < k0 + kKeys; ++k) {
          const F32x16 kr = LoadRow(rows.row(keys[k]) + 16 * c);
          for (int v = 0; v < NV; ++v) a[v][k] = simd::Fma(qc[v], kr, a[v][k]);
        }
      }
    }
    for (int v = 0; v < NV; ++v) sums[v][i] = simd::ReduceSum4(a[v][0], a[v][1], a[v][2], a[v][3]);
  }
  for (int v = 0; v < NV; ++v) scores[v] = simd::FinishSum16(sums[v]);
}

template <int NV, typename E>
void TileScoresAnyWidth(const float* const* q, TileRows<E> rows, int32_t chunks, int32_t k_dim, F32x16* scores) {
  if (k_dim == 16 * chunks) {  // the common head sizes: chunks fixed at compile time (q in registers where it fits)
    if (chunks == 4) return TileScores<NV, 4>(q, rows, chunks, k_dim, scores);
    if (chunks == 8) return TileScores<NV, 8>(q, rows, chunks, k_dim, scores);
  }
  TileScores<NV, 0>(q, rows, chunks, k_dim, scores);
}

template <typename E>
void GroupScores(int nv, const float* const* q, TileRows<E> rows, int32_t chunks, int32_t k_dim, F32x16* scores) {
  if (nv > kMaxRowsGroup) {  // in groups of four (a vector's bytes do not depend on its group)
    GroupScores(kMaxRowsGroup, q, rows, chunks, k_dim, scores);
    return GroupScores(nv - kMaxRowsGroup, q + kMaxRowsGroup, rows, chunks, k_dim, scores + kMaxRowsGroup);
  }
  switch (nv) {
    case 1: return TileScoresAnyWidth<1>(q, rows, chunks, k_dim, scores);
    case 2: return TileScoresAnyWidth<2>(q, rows, chunks, k_dim, scores);
    case 3: return TileScoresAnyWidth<3>(q, rows, chunks, k_dim, scores);
    default: return TileScoresAnyWidth<4>(q, rows, chunks, k_dim, scores);
  }
}

// TileScores' scores from a tile of key panels (engine/cpu/key_panels.h:
// panel.row(slot) = one element of the 16 keys), with no reduction across
// lanes: TileScores' lane l (the FMA chain over elements l, l + 16, ...) is
// a vector over the 16 keys here, q's element broadcast, and its tree
// (lanes l + l+8, then + l+4, + l+2, + l+1) adds whole vectors. The same
// operations in the same order on each key, so the same bytes as
// TileScores on rows (a cache's layout must not change a row's result): 15
// adds per vector and tile where the tree on rows costs 15 adds and 30
// shuffles. k_dim = 16 * chunks; KC > 0 fixes chunks at compile time. qt:
// the group's first vector in the item's transposed q (Scratch::qt),
// element e of vector v at qt[e * kItemVectors + v].
template <int NV, int KC, typename E>
void PanelScores(const float* qt, TileRows<E> panel, int32_t chunks, F32x16* scores) {
  if constexpr (KC > 0) chunks = KC;
  // quad(l): the tree's second-level sum of lane classes l, l+8, l+4 and
  // l+12, (l + l+8) + (l+4 + l+12). Their FMA chains run kPass classes at a
  // time: as many as keep the NV x kPass accumulators within 3/4 of the
  // tier's vector registers (the rest hold a key vector and q's broadcast):
  // all four on avx512 up to six vectors, two for seven and eight; on avx2,
  // whose F32x16 takes two of its 16, fewer.
  constexpr int kAccRegisters = simd::kVectorRegisters * 3 / 4;
  constexpr int kPass = NV * 4 * simd::kRegistersPerVector <= kAccRegisters   ? 4
                        : NV * 2 * simd::kRegistersPerVector <= kAccRegisters ? 2
                                                                              : 1;
  // Panel rows are 16 elements apart; with KC fixed every address below is
  // a constant offset from one of two pointers.
  const E* keys = panel.row(0);
  auto quad = [&](int l, F32x16* out) __attribute__((always_inline)) {
    constexpr int kClass[4] = {0, 8, 4, 12};
    // The pair sums (l + l+8) and (l+4 + l+12), each formed as soon as its
    // two chains are done (a pass of two then holds NV sums, not 2 NV chains).
    F32x16 pair[NV][2], first[NV];
#pragma GCC unroll 4
    for (int k0 = 0; k0 < 4; k0 += kPass) {
      // A chain starts with its first product, not an FMA on zero (which
      // made GCC copy the key vector into each accumulator first); the two
      // differ only in the sign of an exactly zero sum, which nothing below
      // tells apart (0 * scale, exp(0 - m), max and == treat -0 as 0).
      F32x16 a[NV][kPass];
#pragma GCC unroll 4
      for (int k = 0; k < kPass; ++k) {
        const int cls = kClass[k0 + k];
        const F32x16 kt = LoadRow(keys + (4 * l + cls / 4) * kTile);
        const float* qe = qt + (l + cls) * kItemVectors;
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) a[v][k] = simd::Mul(simd::Set1(qe[v]), kt);
      }
#pragma GCC unroll 16
      for (int32_t c = 1; c < chunks; ++c) {
#pragma GCC unroll 4
        for (int k = 0; k < kPass; ++k) {
          const int cls = kClass[k0 + k];
          // Element 16c + l + cls: its panel row (PanelSlot) and its q column.
          const F32x16 kt = LoadRow(keys + (16 * c + 4 * l + cls / 4) * kTile);
          const float* qe = qt + (16 * c + l + cls) * kItemVectors;
#pragma GCC unroll 8
          for (int v = 0; v < NV; ++v) a[v][k] = simd::Fma(simd::Set1(qe[v]), kt, a[v][k]);
        }
      }
      for (int v = 0; v < NV; ++v) {
        if constexpr (kPass == 4) {
          pair[v][0] = simd::Add(a[v][0], a[v][1]);
          pair[v][1] = simd::Add(a[v][2], a[v][3]);
        } else if constexpr (kPass == 2) {
          pair[v][k0 / 2] = simd::Add(a[v][0], a[v][1]);
        } else if (k0 % 2 == 0) {
          first[v] = a[v][0];
        } else {
          pair[v][k0 / 2] = simd::Add(first[v], a[v][0]);
        }
      }
    }
    for (int v = 0; v < NV; ++v) out[v] = simd::Add(pair[v][0], pair[v][1]);
  };
  F32x16 x[NV], y[NV], h[NV];
  quad(0, x);
  quad(2, y);
  for (int v = 0; v < NV; ++v) h[v] = simd::Add(x[v], y[v]);  // third level, lanes 0 + 2
  quad(1, x);
  quad(3, y);
  for (int v = 0; v < NV; ++v) scores[v] = simd::Add(h[v], simd::Add(x[v], y[v]));  // (1 + 3), then the fourth
}

template <int NV, typename E>
void PanelScoresAnyWidth(const float* qt, TileRows<E> panel, int32_t chunks, F32x16* scores) {
  switch (chunks) {  // the common head sizes (64, 128, 256) unrolled
    case 4: return PanelScores<NV, 4>(qt, panel, chunks, scores);
    case 8: return PanelScores<NV, 8>(qt, panel, chunks, scores);
    case 16: return PanelScores<NV, 16>(qt, panel, chunks, scores);
    default: return PanelScores<NV, 0>(qt, panel, chunks, scores);
  }
}

template <typename E>
void GroupPanelScores(int nv, const float* qt, TileRows<E> panel, int32_t chunks, F32x16* scores) {
  switch (nv) {
    case 1: return PanelScoresAnyWidth<1>(qt, panel, chunks, scores);
    case 2: return PanelScoresAnyWidth<2>(qt, panel, chunks, scores);
    case 3: return PanelScoresAnyWidth<3>(qt, panel, chunks, scores);
    case 4: return PanelScoresAnyWidth<4>(qt, panel, chunks, scores);
  }
  if constexpr (kMaxGroup > 4) {
    switch (nv) {
      case 5: return PanelScoresAnyWidth<5>(qt, panel, chunks, scores);
      case 6: return PanelScoresAnyWidth<6>(qt, panel, chunks, scores);
      case 7: return PanelScoresAnyWidth<7>(qt, panel, chunks, scores);
      default: return PanelScoresAnyWidth<8>(qt, panel, chunks, scores);
    }
  }
}

// For each of NV vectors: acc[v][0, 16 chunks) = acc[v] * corr[v] + sum over
// keys [a, b) of p[v][jj] * v[jj], in key order per element; kPass chunks at
// a time (independent chains), each value chunk loaded once for the NV.
template <int NV, typename E>
void AccumulateValues(float* const* acc, const float* corr, const float (*p)[kTile], int32_t a, int32_t b,
                      TileRows<E> rows, int32_t chunks) {
  // Four chunks of sums per vector while NV x 4 leave registers for the
  // values; two above six vectors. An element's sum is the same either way.
  constexpr int kPass = NV <= 6 ? 4 : 2;
  // acc * 1 is acc: the multiply is skipped then, bits unchanged.
  auto scaled = [&](int v, const float* x) {
    return corr[v] == 1.0f ? simd::Load(x) : simd::Mul(simd::Load(x), simd::Set1(corr[v]));
  };
  int32_t d = 0;
  const int32_t padded = 16 * chunks;
  for (; d + 16 * kPass <= padded; d += 16 * kPass) {
    F32x16 s[NV][kPass];
    for (int v = 0; v < NV; ++v) {
      for (int i = 0; i < kPass; ++i) s[v][i] = scaled(v, acc[v] + d + 16 * i);
    }
    for (int32_t jj = a; jj < b; ++jj) {
      const E* vj = rows.row(jj) + d;
      F32x16 r[kPass];
      for (int i = 0; i < kPass; ++i) r[i] = LoadRow(vj + 16 * i);
      for (int v = 0; v < NV; ++v) {
        const F32x16 pj = simd::Set1(p[v][jj]);
        for (int i = 0; i < kPass; ++i) s[v][i] = simd::Fma(pj, r[i], s[v][i]);
      }
    }
    for (int v = 0; v < NV; ++v) {
      for (int i = 0; i < kPass; ++i) simd::Store(acc[v] + d + 16 * i, s[v][i]);
    }
  }
  for (; d < padded; d += 16) {
    F32x16 s[NV];
    for (int v = 0; v < NV; ++v) s[v] = scaled(v, acc[v] + d);
    for (int32_t jj = a; jj < b; ++jj) {
      const F32x16 r = LoadRow(rows.row(jj) + d);
      for (int v = 0; v < NV; ++v) s[v] = simd::Fma(simd::Set1(p[v][jj]), r, s[v]);
    }
    for (int v = 0; v < NV; ++v) simd::Store(acc[v] + d, s[v]);
  }
}

template <typename E>
void GroupValues(int nv, float* const* acc, const float* corr, const float (*p)[kTile], int32_t a, int32_t b,
                 TileRows<E> rows, int32_t chunks) {
  switch (nv) {
    case 1: return AccumulateValues<1>(acc, corr, p, a, b, rows, chunks);
    case 2: return AccumulateValues<2>(acc, corr, p, a, b, rows, chunks);
    case 3: return AccumulateValues<3>(acc, corr, p, a, b, rows, chunks);
    case 4: return AccumulateValues<4>(acc, corr, p, a, b, rows, chunks);
  }
  if constexpr (kMaxGroup > 4) {
    switch (nv) {
      case 5: return AccumulateValues<5>(acc, corr, p, a, b, rows, chunks);
      case 6: return AccumulateValues<6>(acc, corr, p, a, b, rows, chunks);
      case 7: return AccumulateValues<7>(acc, corr, p, a, b, rows, chunks);
      default: return AccumulateValues<8>(acc, corr, p, a, b, rows, chunks);
    }
  }
}

struct Geometry {
  int32_t n_heads, n_kv_heads, group, k_dim, v_dim, v_stride;
  float scale, softcap;
};

// Rows [t0, t1) (one cache) x query heads [h0, h1) (one kv head).
void RunItem(const float* q, const int32_t* bounds, const KvRowView& cache, float* out, int32_t t0, int32_t t1,
             int32_t h0, int32_t h1, const Geometry& g, Scratch& s) {
  const int32_t kvh = h0 / g.group;
  const int32_t v_padded = RoundUp16(g.v_dim);
  QueryState st[kItemVectors];
  int32_t n = 0;
  int32_t lo_all = std::numeric_limits<int32_t>::max(), hi_all = 0;
  for (int32_t t = t0; t < t1; ++t) {
    for (int32_t h = h0; h < h1; ++h, ++n) {
      QueryState& v = st[n];
      v.q = q + (int64_t{t} * g.n_heads + h) * g.k_dim;
      v.out = out + (int64_t{t} * g.n_heads + h) * g.v_dim;
      v.acc = s.acc.data() + static_cast<size_t>(n) * v_padded;
      std::fill(v.acc, v.acc + v_padded, 0.0f);
      v.l = simd::Set1(0.0f);
      v.lo = bounds[2 * t];
      v.hi = bounds[2 * t + 1];
      if (v.lo < v.hi) {
        lo_all = std::min(lo_all, v.lo);
        hi_all = std::max(hi_all, v.hi);
      }
    }
  }
  const DType type = cache.type;
  const int64_t k_rb = KvRowBytes(type, g.k_dim), v_rb = KvRowBytes(type, g.v_stride);
  const int32_t bt = cache.block_tokens;
  const int32_t k_chunks = RoundUp16(g.k_dim) / 16, v_chunks = v_padded / 16;
  // f32 or f16 rows of whole chunks are read straight from the cache (f16
  // widened in the load, once per group of vectors: measured faster than
  // decoding each tile into an f32 copy once per item, even for items of 16
  // vectors); other types and widths, and tiles that span blocks or that no
  // vector reads whole, are decoded into a copy first. Either way the values
  // are the same.
  const bool direct_ok = (type == DType::kF32 || type == DType::kF16) && g.k_dim % 16 == 0 && g.v_dim % 16 == 0;
  // Keys in panels are read in place for every tile (a tile lies in one
  // block: blocks are whole panels); lanes of positions no vector reads hold
  // whatever the cache holds there, and their scores are masked below.
  const bool panels = KeysInPanels(type, cache.v != cache.k, bt, g.k_dim);
  if (panels) {
    // Element e of vector i at qt[e * kItemVectors + i]: a group's q.k then
    // broadcasts its elements at fixed offsets from one pointer (a pointer
    // per vector left too few general registers for eight of them).
    for (int32_t i = 0; i < n; ++i) {
      for (int32_t e = 0; e < g.k_dim; ++e) s.qt.data()[e * kItemVectors + i] = st[i].q[e];
    }
  }
  float p[kMaxGroup][kTile];
  for (int32_t base = lo_all / kTile * kTile; base < hi_all; base += kTile) {
    // The positions of this tile some vector reads.
    int32_t need_lo = base + kTile, need_hi = base;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t a = std::max(st[i].lo, base), b = std::min(st[i].hi, base + kTile);
      if (a < b) {
        need_lo = std::min(need_lo, a);
        need_hi = std::max(need_hi, b);
      }
    }
    if (need_lo >= need_hi) continue;
    auto row_at = [&](int32_t pos, const uint8_t* pool, int64_t rb) {
      return pool + cache.block_base(cache.block_of(pos), kvh, g.n_kv_heads, rb) + (pos % bt) * rb;
    };
    const bool direct = direct_ok && need_lo == base && need_hi == base + kTile && base % bt + kTile <= bt;
    TileRows<float> kf{}, vf{};
    TileRows<uint16_t> kh{}, vh{};
    if (direct) {
      if (type == DType::kF32) {
        kf = {row_at(base, cache.k, k_rb), k_rb};
        vf = {row_at(base, cache.v, v_rb), v_rb};
      } else {
        kh = {row_at(base, cache.k, k_rb), k_rb};
        vh = {row_at(base, cache.v, v_rb), v_rb};
      }
    } else {
      for (int32_t jj = 0; jj < kTile; ++jj) {
        const int32_t pos = base + jj;
        if (pos < need_lo || pos >= need_hi) {
          if (!panels) s.k.SetZero(jj);
          s.v.SetZero(jj);
        } else {
          if (!panels) s.k.Set(jj, type, row_at(pos, cache.k, k_rb));
          s.v.Set(jj, type, row_at(pos, cache.v, v_rb));
        }
      }
      kf = s.k.rows();
      vf = s.v.rows();
    }
    const bool half = direct && type == DType::kF16;
    TileRows<float> panel_f{};
    TileRows<uint16_t> panel_h{};
    if (panels) {
      const uint8_t* p0 = row_at(base, cache.k, k_rb);  // the panel: where its 16 rows would start
      if (type == DType::kF16) {
        panel_h = {p0, kTile * 2};
      } else {
        panel_f = {p0, kTile * 4};
      }
    }
    // Runs of up to kMaxGroup consecutive vectors with the same key range in
    // this tile (a row's GQA heads; whole rows where the tile is below all
    // of them) share each key and value load.
    for (int32_t i = 0, i_end = 0; i < n; i = i_end) {
      const int32_t a = std::max(st[i].lo, base) - base, b = std::min(st[i].hi, base + kTile) - base;
      i_end = i + 1;
      while (i_end < n && i_end - i < kMaxGroup && std::max(st[i_end].lo, base) - base == a &&
             std::min(st[i_end].hi, base + kTile) - base == b) {
        ++i_end;
      }
      if (a >= b) continue;
      const int nv = i_end - i;
      F32x16 sc[kMaxGroup];
      if (panels) {
        if (type == DType::kF16) {
          GroupPanelScores(nv, s.qt.data() + i, panel_h, k_chunks, sc);
        } else {
          GroupPanelScores(nv, s.qt.data() + i, panel_f, k_chunks, sc);
        }
      } else {
        const float* qs[kMaxGroup];  // rows read q through a pointer per vector
        for (int j = 0; j < nv; ++j) qs[j] = st[i + j].q;
        if (half) {
          GroupScores(nv, qs, kh, k_chunks, g.k_dim, sc);
        } else {
          GroupScores(nv, qs, kf, k_chunks, g.k_dim, sc);
        }
      }
      // The online softmax, per vector; the vectors with any finite score
      // go on to the values.
      float* accs[kMaxGroup];
      float corr[kMaxGroup];
      int live = 0;
      for (int j = 0; j < nv; ++j) {
        QueryState& v = st[i + j];
        F32x16 x = simd::Mul(sc[j], simd::Set1(g.scale));
        if (g.softcap > 0.0f) {
          float lanes[kTile];
          simd::Store(lanes, x);
          for (float& y : lanes) y = g.softcap * std::tanh(y / g.softcap);
          x = simd::Load(lanes);
        }
        x = simd::KeepLanes(x, a, b, kNegInf);
        const float m_new = std::max(v.m, simd::ReduceMax(x));
        if (m_new == kNegInf) continue;  // every score -inf: nothing to add
        // The running sums' rescale (0 on the first tile: m = -inf; exactly
        // 1, and skipped, while the maximum stays) and the tile's weights,
        // each through the same vector exp.
        corr[live] = m_new == v.m ? 1.0f : simd::Lane0(simd::ExpNonPositive(simd::Set1(v.m - m_new)));
        const F32x16 w = simd::ExpNonPositive(simd::Sub(x, simd::Set1(m_new)));
        simd::Store(p[live], w);
        v.l = simd::Fma(v.l, simd::Set1(corr[live]), w);
        v.m = m_new;
        accs[live++] = v.acc;
      }
      if (live == 0) continue;
      if (half) {
        GroupValues(live, accs, corr, p, a, b, vh, v_chunks);
      } else {
        GroupValues(live, accs, corr, p, a, b, vf, v_chunks);
      }
    }
  }
  for (int32_t i = 0; i < n; ++i) {
    const QueryState& v = st[i];
    const float l = simd::ReduceSum(v.l);
    const F32x16 inv = simd::Set1(l > 0.0f ? 1.0f / l : 0.0f);
    int32_t d = 0;
    for (; d + 16 <= g.v_dim; d += 16) simd::Store(v.out + d, simd::Mul(simd::Load(v.acc + d), inv));
    if (d < g.v_dim) simd::StoreFirst(v.out + d, simd::Mul(simd::Load(v.acc + d), inv), g.v_dim - d);
  }
}

// Rows t and u address the same cache in `layer` (the same geometry, block
// table and pools: engine/kv_rows.h).
bool SameCache(const int64_t* kv_rows, int64_t stride, int64_t t, int64_t u, int32_t layer) {
  const int64_t* a = kv_rows + t * stride;
  const int64_t* b = kv_rows + u * stride;
  const int64_t e = KvRowLayerEntry(layer);
  return std::equal(a, a + 3, b) && std::equal(a + e, a + e + 3, b + e);
}

}  // namespace

void Attention(const float* q, const int32_t* bounds, const int64_t* kv_rows, int64_t kv_row_stride, int32_t layer,
               float* out, int64_t seq, int32_t n_heads, int32_t n_kv_heads, int32_t k_dim, int32_t v_dim,
               int32_t v_stride, float scale, float softcap, int ith, int nth) {
  const Geometry g{n_heads, n_kv_heads, n_heads / n_kv_heads, k_dim, v_dim, v_stride, scale, softcap};
  // Item shape: all of a kv head's query heads and as many rows as fill
  // kItemVectors; on one thread items stay whole, their vectors sharing
  // loads. The shape changes only which vectors share tile loads.
  int32_t heads = std::min(g.group, kItemVectors);
  int32_t rows = std::max(1, kItemVectors / heads);
  Scratch& s = ThreadScratch();
  s.k.Reset(k_dim);
  s.v.Reset(v_dim);
  s.acc.Grow(static_cast<size_t>(kItemVectors) * RoundUp16(v_dim));
  s.qt.Grow(static_cast<size_t>(kItemVectors) * RoundUp16(k_dim));
  // Items in order (per run of rows reading one cache: kv heads, then
  // blocks of rows, then blocks of heads), each costing
  // its (vector, key) pairs. Every thread walks the same list twice: once
  // for the total, once running the items whose cost midpoint falls in its
  // share. So a thread takes a contiguous run: the items that read one
  // cache (a decode row's head blocks, a span's rows) mostly land on the
  // same thread and its second read of the keys and values comes from L2,
  // where a round-robin deal had every thread stream every session's cache
  // from memory; and a long span's costlier late rows still spread evenly.
  //
  // Within the rows that read one cache, items go kv head by kv head: the
  // next item then reads the keys and values of the same kv head again, which
  // a long span's item after item finds in L2 (row blocks first would cycle
  // through every kv head's keys in between, more than L2 holds at a few
  // thousand positions).
  auto for_each_item = [&](auto&& fn) {
    for (int64_t r0 = 0, r1 = 0; r0 < seq; r0 = r1) {
      r1 = r0 + 1;
      while (r1 < seq && SameCache(kv_rows, kv_row_stride, r0, r1, layer)) ++r1;
      for (int32_t kvh = 0; kvh < n_kv_heads; ++kvh) {
        for (int64_t t0 = r0, t1 = r0; t0 < r1; t0 = t1) {
          t1 = std::min<int64_t>(t0 + rows, r1);
          int64_t keys = 0;
          for (int64_t t = t0; t < t1; ++t) keys += std::max(0, bounds[2 * t + 1] - bounds[2 * t]);
          for (int32_t h0 = kvh * g.group; h0 < (kvh + 1) * g.group; h0 += heads) {
            const int32_t h1 = std::min(h0 + heads, (kvh + 1) * g.group);
            // + 1 per vector: an item with no keys still writes its rows.
            fn(t0, t1, h0, h1, (keys + (t1 - t0)) * (h1 - h0));
          }
        }
      }
    }
  };
  // On several threads the shape is halved (rows first, then heads) until
  // the items are a whole multiple of the threads or at least two per
  // thread. Halving further only splits a kv head's vectors into items that
  // each stream its keys and values again: a Gemma 3 decode row (4 heads, 1
  // kv head) on 2 threads runs as 2 items of 2 heads at 1.5x the rate of 4
  // items of one head.
  auto item_count = [&] {
    int64_t count = 0;
    for_each_item([&](int64_t, int64_t, int32_t, int32_t, int64_t) { ++count; });
    return count;
  };
  for (int64_t count = nth > 1 ? item_count() : 0;
       nth > 1 && (count < nth || (count < 2 * nth && count % nth != 0)) && (rows > 1 || heads > 1);
       count = item_count()) {
    if (rows > 1) {
      rows /= 2;
    } else {
      heads = (heads + 1) / 2;
    }
  }
  int64_t total = 0;
  for_each_item([&](int64_t, int64_t, int32_t, int32_t, int64_t cost) { total += cost; });
  int64_t before = 0;
  for_each_item([&](int64_t t0, int64_t t1, int32_t h0, int32_t h1, int64_t cost) {
    // The item's midpoint, 2 * before + cost over 2 * total, picks its thread.
    const int64_t owner = (2 * before + cost) * nth / (2 * total);
    before += cost;
    if (owner != ith) return;
    const KvRowView cache = ReadKvRow(kv_rows, kv_row_stride, t0, layer);
    RunItem(q, bounds, cache, out, static_cast<int32_t>(t0), static_cast<int32_t>(t1), h0, h1, g, s);
  });
}

}  // namespace decoded::cpu::DECODED_ISA_NS
