// What a model family gives the shared decode driver (engine/decode_driver.h).
//
// A family is a short description of its layers: it reads its
// hyper-parameters, names its weights, builds ONE layer given the layer
// inputs, and states its DecodeDims, MaskPlan and RopePlan. It never loops
// over layers, writes the KV cache, builds a mask or a RoPE table, or
// samples: the driver does those, once, for every family.
#ifndef DECODED_ENGINE_DECODE_MODEL_H_
#define DECODED_ENGINE_DECODE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/decode_plans.h"
#include "engine/decode_token_host.h"
#include "engine/graph/graph.h"
#include "engine/weights.h"

namespace decoded {

// How per-token data enters a graph.
enum class DataMode : uint8_t {
  kBaked,       // D1: constants in the graph
  kRebindable,  // D2: kInput nodes bound to session buffers
};

// The data nodes of one step, as built by PersistentDecodeModel.
struct DecodeTokenNodes {
  NodeId token_ids = kNoNode;  // i32 [1, seq]
  NodeId rope_cos = kNoNode;   // f32 [n_rope_variants * seq, rot_dims / 2]
  NodeId rope_sin = kNoNode;
  NodeId mask = kNoNode;       // i32 [n_mask_variants * seq, 2]
  KvOffsetPath offset_path = KvOffsetPath::kDeviceOffset;
  NodeId kv_offset = kNoNode;  // i32 [1, seq]; kNoNode on the symbol path
  NodeId kv_rows = kNoNode;    // i64 [seq, KvRowStride(n_layers)]: each row's KV cache
  NodeId output_rows = kNoNode;  // i32 [1, n_outputs]; kNoNode: every row's logits (or the last's)
};

// The per-layer arguments of DecodeBackbone::decode_apply_layer, with the two
// services a layer needs from the driver: RoPE with this layer's RopePlan
// variant, and attention (KV write + windowed attention) with this layer's
// MaskPlan variant.
class DecodeLayerInputs {
 public:
  DecodeLayerInputs(Graph& g, const DecodeDims& dims, const MaskPlan& mask_plan, const RopePlan& rope_plan,
                    const DecodeTokenNodes& data, int32_t layer, int32_t seq, NodeId x)
      : graph(g), layer(layer), seq(seq), x(x), dims_(dims), mask_plan_(mask_plan), rope_plan_(rope_plan),
        data_(data) {}

  Graph& graph;
  const int32_t layer;
  const int32_t seq;
  const NodeId x;  // residual stream entering the layer, f32 [seq, hidden]

  // x [seq, n_heads * head_dim] rotated with this layer's RoPE variant (the
  // first RopePlan::rot_dims of each head); returned unchanged on a NoPE layer.
  NodeId rope(NodeId x, int32_t n_heads, const std::string& name) const;

  // How a family scores q against k: `scale` multiplies q.k (usually
  // 1 / sqrt(head_dim)); `softcap` > 0 caps the scaled scores as
  // softcap * tanh(s / softcap) (Gemma 2/3 option), 0 leaves them.
  struct AttentionScoring {
    float scale = 1.0f;
    float softcap = 0.0f;
  };

  // Writes k ([seq, n_kv_heads * k_dim]) and v ([seq, n_kv_heads * v_dim])
  // into this layer's cache at the step's offset and attends q
  // ([seq, n_heads * k_dim]) over the visible keys, scored as `scoring` says;
  // returns [seq, n_heads * v_dim]. Widths from DecodeDims::kv_layout(); when
  // the layout keeps the value inside the K row (MLA), v is ignored (pass
  // kNoNode) and only k is written.
  NodeId attention(NodeId q, NodeId k, NodeId v, const AttentionScoring& scoring) const;

 private:
  const DecodeDims& dims_;
  const MaskPlan& mask_plan_;
  const RopePlan& rope_plan_;
  const DecodeTokenNodes& data_;
};

// Everything the shared build path needs from one model family.
class DecodeBackbone {
 public:
  virtual ~DecodeBackbone() = default;
  virtual const DecodeDims& dims() const = 0;
  virtual const MaskPlan& mask_plan() const = 0;
  virtual const RopePlan& rope_plan() const = 0;
  // token ids i32 [1, seq] -> residual stream f32 [seq, hidden].
  virtual NodeId embed(Graph& g, NodeId token_ids) const = 0;
  // One transformer layer: returns the residual stream leaving it.
  virtual NodeId decode_apply_layer(const DecodeLayerInputs& in) const = 0;
  // Final hidden [rows, hidden] -> logits f32 [rows, vocab].
  virtual NodeId output_logits(Graph& g, NodeId hidden) const = 0;
};

// The per-model variation points of one persistent-decode step: how its
// per-token data enters the graph, in particular which KV-write offset path
// it rides. The driver never inspects which path it got.
class PersistentDecodeModel {
 public:
  virtual ~PersistentDecodeModel() = default;
  virtual KvOffsetPath kv_offset_path() const = 0;
  // Builds the data nodes of a step from `host` (shapes only in kRebindable
  // mode; bytes baked in kBaked mode). The default implementation serves
  // every family whose data is ids + RoPE + mask + offset + KV binding table.
  virtual DecodeTokenNodes build_decode_token_data(Graph& g, const DecodeTokenHost& host, const RopePlan& rope_plan,
                                                   const MaskPlan& mask_plan, DataMode mode) const;
};

// A loaded family: both traits plus identity.
class DecodeModel : public DecodeBackbone, public PersistentDecodeModel {
 public:
  virtual const std::string& family() const = 0;
  // Hash of the structural configuration (everything that shapes the graph).
  virtual uint64_t structural_hash() const = 0;
  virtual const Weights& weights() const = 0;
  virtual Backend& backend() const = 0;
  // Context length the model was trained for (tokens).
  virtual int32_t trained_context_length() const = 0;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_DECODE_MODEL_H_
