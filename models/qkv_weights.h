// A layer's Q, K and V projections in either layout llama.cpp's converter
// writes (llama.cpp: llama_model_base::create_tensor_qkv / build_qkv):
//   separate  blk.N.attn_q.weight [q_dim, hidden], attn_k / attn_v [kv_dim, hidden]
//   fused     blk.N.attn_qkv.weight [q_dim + 2 kv_dim, hidden], rows [Q; K; V]
//             (e.g. Phi-2's original mixer.Wqkv, Phi-3's qkv_proj)
// with biases in the matching layout (attn_{q,k,v}.bias, or attn_qkv.bias
// [1, q_dim + 2 kv_dim]); a fused weight with separate biases is accepted as
// llama.cpp accepts it.
//
// A fused tensor is bound as three row views (models/fused_weights.h), so
// the layer multiplies by Q, K and V exactly as in the separate layout and its
// graph does not depend on the layout.
#ifndef DECODED_MODELS_QKV_WEIGHTS_H_
#define DECODED_MODELS_QKV_WEIGHTS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/hparams.h"
#include "engine/weights.h"
#include "models/fused_weights.h"

namespace decoded {

struct QkvWeights {
  const WeightTensor* wq = nullptr;  // [q_dim, hidden]
  const WeightTensor* wk = nullptr;  // [kv_dim, hidden]
  const WeightTensor* wv = nullptr;  // [kv_dim, hidden]
  const WeightTensor* bq = nullptr;  // f32 [1, q_dim]; all three biases or none
  const WeightTensor* bk = nullptr;  // f32 [1, kv_dim]
  const WeightTensor* bv = nullptr;  // f32 [1, kv_dim]
  bool fused = false;                // bound from attn_qkv.weight
};

enum class QkvBias : uint8_t {
  kNone,      // biases are not modelled: UNIMPLEMENTED naming the tensor if present
  kOptional,  // bound when the layer has them (all three, or the fused one)
  kRequired,  // NOT_FOUND naming the tensor if absent
};

// Binds layer `layer`'s projections ("blk.<layer>."), shapes checked against
// the keys the Dims name. INVALID_ARGUMENT for a layer holding both layouts,
// a fused tensor whose rows are not q_dim + 2 kv_dim, or a fused bias beside
// separate weights or separate biases; NOT_FOUND naming the
// tensor for a missing one (including one of a partial set of separate
// biases); UNIMPLEMENTED for a bias that is not f32, or any bias under
// QkvBias::kNone. Views of a fused tensor go to `views`.
absl::StatusOr<QkvWeights> BindQkv(const HParams& hp, const Weights& weights, int32_t layer, const Dim& q_dim,
                                   const Dim& kv_dim, const Dim& hidden, QkvBias bias, WeightViews& views);

}  // namespace decoded

#endif  // DECODED_MODELS_QKV_WEIGHTS_H_
