// A family's hyper-parameters, read from the GGUF metadata keys
// "<arch>.<key>" (GGUF spec, "LLM" key conventions) of an untrusted file and
// checked before anything is sized or computed with them.
//
// Every number a family reads goes through these accessors:
//   Int / IntOr        an integer in an explicit inclusive range (and, when
//                      asked, a multiple of some step);
//   Float / FloatOr    a finite float in an explicit inclusive range,
//                      optionally with 0 as the key's "off" value;
//   LayerCount         the block count, in [1, kMaxLayers] and equal to the
//                      number of layers whose tensors the file holds;
//   Tensor             a weight whose shape must equal extents derived from
//                      keys (Dim), so a width or head count that disagrees
//                      with the tensors is reported against its key.
// Ranges come from engine/hparam_bounds.h or from keys read before (an upper
// bound that is another key is named in the message).
//
// Errors: INVALID_ARGUMENT, always starting "model file: " and naming the full
// key, e.g.
//   model file: gemma3.block_count = 100000000 is out of range [1, 1024]
//   model file: gemma3.block_count = 19 does not match the 18 layers present
//     (tensors blk.0. .. blk.17.)
//   model file: gemma3.attention.layer_norm_rms_epsilon = nan is not finite
//   model file: tensor blk.0.attn_q.weight has shape [64, 64], but
//     gemma3.attention.head_count = 8 x gemma3.attention.key_length = 16
//     requires 128 rows
// An absent required key is INVALID_ARGUMENT too; a missing tensor is
// NOT_FOUND naming it.
//
// Thread-safety: immutable; views the Weights it was built on, which must
// outlive it.
#ifndef DECODED_ENGINE_HPARAMS_H_
#define DECODED_ENGINE_HPARAMS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/hparam_bounds.h"
#include "engine/weights.h"

namespace decoded {

// Inclusive integer range [lo, hi], within int32 (accessors return int32).
// `hi_source` names where hi comes from when it is another hyper-parameter
// (e.g. "gemma3.context_length"), for messages.
struct IntRange {
  IntRange(int64_t lo, int64_t hi, std::string hi_source = "", int64_t multiple_of = 1)
      : lo(lo), hi(hi), hi_source(std::move(hi_source)), multiple_of(multiple_of) {}
  int64_t lo;
  int64_t hi;
  std::string hi_source;
  int64_t multiple_of;  // the value must also be a multiple of this
};

// Inclusive range [lo, hi] for a finite float; with zero_is_off, exactly 0 is
// accepted too (the key's "feature off" value, e.g. no softcap).
struct FloatRange {
  FloatRange(double lo, double hi, bool zero_is_off = false) : lo(lo), hi(hi), zero_is_off(zero_is_off) {}
  double lo;
  double hi;
  bool zero_is_off;
};

// An expected tensor extent and the keys it was derived from. value < 0
// accepts any extent.
struct Dim {
  int64_t value = -1;
  std::string source;  // e.g. "gemma3.embedding_length = 64"
};
// The product of two extents; its source names both factors.
Dim operator*(const Dim& a, const Dim& b);

class HParams {
 public:
  HParams(const Weights& weights, std::string arch) : weights_(weights), arch_(std::move(arch)) {}

  const Weights& weights() const { return weights_; }

  // "<arch>.<k>".
  std::string key(std::string_view k) const { return arch_ + "." + std::string(k); }

  // A required integer key in `range`.
  absl::StatusOr<int32_t> Int(std::string_view k, const IntRange& range) const;
  // An optional integer key: `fallback` when absent. The fallback is checked
  // against `range` as well (it may be derived from other keys); the message
  // then says it is the default.
  absl::StatusOr<int32_t> IntOr(std::string_view k, int64_t fallback, const IntRange& range) const;
  // A required float key (float32/float64) that is finite and in `range`.
  absl::StatusOr<double> Float(std::string_view k, const FloatRange& range) const;
  // An optional float key: `fallback` when absent, checked against `range` too.
  absl::StatusOr<double> FloatOr(std::string_view k, double fallback, const FloatRange& range) const;

  // The layer count `k` (e.g. "block_count"): in [1, kMaxLayers], the
  // tensors' layer prefixes "blk.N." numbered 0..count-1 without gaps, and
  // their number equal to it.
  absl::StatusOr<int32_t> LayerCount(std::string_view k) const;

  // The extent `value` of key `k`, for Tensor(); says "(default)" when the
  // key is absent.
  Dim dim(std::string_view k, int64_t value) const;

  // The weight `name`, whose shape must be [rows, cols] (GGUF ne = {cols,
  // rows}); the mismatch message names the keys of the failing extent.
  // A 3-D weight is refused here (its plane count is not 1).
  absl::StatusOr<const WeightTensor*> Tensor(std::string_view name, const Dim& rows, const Dim& cols) const;
  // The 3-D weight `name` of shape [planes, rows, cols] (GGUF ne = {cols,
  // rows, planes}), e.g. an MoE layer's experts, one plane each.
  absl::StatusOr<const WeightTensor*> Tensor3(std::string_view name, const Dim& planes, const Dim& rows,
                                              const Dim& cols) const;

 private:
  const Weights& weights_;
  std::string arch_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_HPARAMS_H_
