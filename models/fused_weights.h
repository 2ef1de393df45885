// Weights that llama.cpp's converter stores fused, split back into the
// per-projection weights a layer multiplies by: attn_qkv holds [q; k; v] rows
// (Phi-3, and any architecture converted with fused QKV), Phi-3's ffn_up holds
// [gate; up] rows (HF gate_up_proj, unsplit).
//
// Each part is a WeightTensor viewing consecutive rows of the fused tensor's
// bytes in place. Rows are independent in every GGUF type (a quantized row is
// whole blocks), so a part is a weight like any other: the same matmul kernels
// run on it, nothing is copied, and the parts' products are exactly the
// columns of the fused product.
#ifndef DECODED_MODELS_FUSED_WEIGHTS_H_
#define DECODED_MODELS_FUSED_WEIGHTS_H_

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/graph/graph.h"
#include "engine/hparams.h"

namespace decoded {

// One part of a fused weight: its name ("q", "gate") and its row count with
// the keys it derives from.
struct FusedPart {
  std::string name;
  Dim rows;
};

// Binds the fused weight `name` through hp.Tensor: its rows must be the sum of
// the parts' rows (the message names every part's keys), its columns `cols`.
// Appends one view per part to `views`, named "<name>[<part>]", and returns
// pointers to them in part order; they live as long as `views` (a deque keeps
// them in place as it grows) and the Weights the tensor came from.
// NOT_FOUND / INVALID_ARGUMENT as HParams::Tensor.
absl::StatusOr<std::vector<const WeightTensor*>> BindFusedRows(const HParams& hp, std::string_view name,
                                                               absl::Span<const FusedPart> parts, const Dim& cols,
                                                               std::deque<WeightTensor>& views);

}  // namespace decoded

#endif  // DECODED_MODELS_FUSED_WEIGHTS_H_
