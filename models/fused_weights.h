// Weights that llama.cpp's converter stores fused, split back into the
// per-projection weights a layer multiplies by: attn_qkv holds [q; k; v] rows
// (Phi-2's mixer.Wqkv, Phi-3's qkv_proj, any architecture converted with
// fused QKV) and attn_qkv.bias the matching [q, k, v] columns; Phi-3's ffn_up
// holds [gate; up] rows (HF gate_up_proj, unsplit).
//
// Each part is a WeightTensor viewing part of the fused tensor's bytes in
// place. Rows are independent in every GGUF type (a quantized row is whole
// blocks), so a row part is a weight like any other: the same matmul kernels
// run on it, nothing is copied, and the parts' products are exactly the
// columns of the fused product. Column parts exist only for single-row f32
// tensors (biases), whose columns are plain floats.
#ifndef DECODED_MODELS_FUSED_WEIGHTS_H_
#define DECODED_MODELS_FUSED_WEIGHTS_H_

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/hparams.h"
#include "engine/weights.h"

namespace decoded {

// Owner of the views a family binds: each is a WeightTensor over part of
// another tensor's bytes (never copied). Graph nodes point at them, so they
// live as long as the family that owns this (a deque keeps them in place as
// it grows) and the Weights the fused tensors came from.
// Not copyable: a copy would leave graph nodes pointing into the original.
class WeightViews {
 public:
  WeightViews() = default;
  WeightViews(const WeightViews&) = delete;
  WeightViews& operator=(const WeightViews&) = delete;

  // Keeps `view` at a stable address.
  const WeightTensor* Add(WeightTensor view);

 private:
  std::deque<WeightTensor> views_;
};

// One part of a fused weight: its name ("q", "gate") and its extent (rows for
// BindFusedRows, columns for BindFusedColumns) with the keys it derives from.
struct FusedPart {
  std::string name;
  Dim extent;
};

// Binds the fused weight `name` through hp.Tensor: its rows must be the sum of
// the parts' rows (the message names every part's keys), its columns `cols`.
// Adds one view per part to `views`, named "<name>[<part>]", and returns them
// in part order. NOT_FOUND / INVALID_ARGUMENT as HParams::Tensor.
absl::StatusOr<std::vector<const WeightTensor*>> BindFusedRows(const HParams& hp, std::string_view name,
                                                               absl::Span<const FusedPart> parts, const Dim& cols,
                                                               WeightViews& views);

// As BindFusedRows for a fused bias: `name` is one f32 row whose columns are
// the sum of the parts' columns, split into one single-row view per part.
// NOT_FOUND / INVALID_ARGUMENT as HParams::Tensor; UNIMPLEMENTED naming the
// tensor if it is not f32.
absl::StatusOr<std::vector<const WeightTensor*>> BindFusedColumns(const HParams& hp, std::string_view name,
                                                                  absl::Span<const FusedPart> parts,
                                                                  WeightViews& views);

}  // namespace decoded

#endif  // DECODED_MODELS_FUSED_WEIGHTS_H_
