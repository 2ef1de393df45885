// Model-scalar geometry and per-layer variation of a decode step.
//
// MaskPlan and RopePlan are the two per-layer axes the seed names: which
// attention window a layer uses (Gemma 3: 5 local sliding-window layers per
// global layer; Qwen2: max_window_layers) and which RoPE base it rotates with
// (Gemma 3: local 10k, global 1M). Each collapses layers that agree into one
// *variant*, so a uniform model carries one mask and one RoPE table per step.
// Both are validated at construction and name the offending layer.
//
// A RopePlan variant's frequencies are plain RoPE (RoFormer, Su et al. 2021,
// eq. 15: base^(-2i / rot_dims)), optionally divided per frequency
// (freq_factors: Llama 3.1) or blended by YaRN (engine/rope_yarn.h), and its
// cos/sin tables are optionally multiplied by an attention factor (YaRN's).
#ifndef DECODED_ENGINE_DECODE_PLANS_H_
#define DECODED_ENGINE_DECODE_PLANS_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/graph/graph.h"
#include "engine/kv_layout.h"
#include "engine/rope_yarn.h"

namespace decoded {

// The scalar geometry the shared build path needs from a family.
struct DecodeDims {
  int32_t n_layers = 0;
  int32_t hidden = 0;      // residual stream width
  int32_t n_heads = 0;     // query heads
  int32_t n_kv_heads = 0;  // key/value heads (GQA when < n_heads)
  int32_t head_dim = 0;
  int32_t vocab = 0;
  // The KV cache row geometry when it is not K and V slots of n_kv_heads x
  // head_dim (left zero then): multi-head latent attention caches one shared
  // latent row (KvLayout::SharedLatent). Read it through kv_layout().
  KvLayout kv;

  KvLayout kv_layout() const { return kv.k_dim > 0 ? kv : KvLayout::Separate(n_kv_heads, head_dim); }
};

class MaskPlan {
 public:
  // window[il] == 0: layer il attends to every earlier position (global);
  // window[il] == w > 0: query at position p sees keys j with p - w < j <= p.
  // INVALID_ARGUMENT naming the layer for a negative window or an empty list.
  static absl::StatusOr<MaskPlan> Create(absl::Span<const int32_t> window_per_layer);

  int32_t n_variants() const { return static_cast<int32_t>(windows_.size()); }
  int32_t variant_of(int32_t layer) const { return layer_variant_[static_cast<size_t>(layer)]; }
  int32_t window(int32_t variant) const { return windows_[static_cast<size_t>(variant)]; }
  int32_t n_layers() const { return static_cast<int32_t>(layer_variant_.size()); }

 private:
  std::vector<int32_t> windows_;        // per variant
  std::vector<int32_t> layer_variant_;  // per layer
};

struct RopeLayer {
  RopeLayer() = default;
  RopeLayer(bool enabled, double base, double freq_scale, std::vector<float> freq_factors = {})
      : enabled(enabled), base(base), freq_scale(freq_scale), freq_factors(std::move(freq_factors)) {}

  bool enabled = true;      // false: a NoPE layer (no rotation)
  double base = 10000.0;    // theta base
  double freq_scale = 1.0;  // linear position scaling: angle uses pos * freq_scale
  // Per-frequency divisors (llama.cpp's rope_freqs / ggml_rope_ext
  // freq_factors): empty, or rot_dims / 2 finite positive values (head_dim / 2
  // without partial rotary), frequency i becoming
  // base^(-2i / rot_dims) / freq_factors[i]. Llama 3.1's "llama3"
  // scaling is one such vector (1 for the kept band, the factor for the
  // divided band, smoothed in between).
  std::vector<float> freq_factors;
  // YaRN frequency interpolation (engine/rope_yarn.h: YarnInvFreq over the
  // rotated dimensions); absent: plain frequencies. Exclusive with
  // freq_factors and with freq_scale != 1 (a file states one scaling).
  std::optional<YarnScaling> yarn;
  // Multiplies every cos and sin of this variant (HF's attention_scaling,
  // ggml's mscale): q.k over the rotated dimensions scales by its square.
  // YaRN's is 0.1 ln(factor) + 1 unless the model states another; 1 otherwise.
  double attention_factor = 1.0;
};

class RopePlan {
 public:
  // INVALID_ARGUMENT naming the layer for a non-positive base or scale,
  // freq_factors of another length than rot_dims / 2 or holding a value that
  // is not finite and positive, an attention_factor that is not finite and
  // positive, YaRN parameters that are not (factor, original_context,
  // beta_fast, beta_slow all finite and positive) or YaRN beside freq_factors
  // or a freq_scale other than 1; or an odd head_dim. `pairing` is the family's
  // (model-scalar): which dimensions every rotating layer rotates together.
  // `rot_dims` (model-scalar too) is how many leading dimensions of each head
  // rotate: 0 means the whole head; fewer is partial rotary (Phi-2), the
  // frequencies then spread over rot_dims as HF's partial_rotary_factor does.
  // INVALID_ARGUMENT unless it is even and at most head_dim.
  static absl::StatusOr<RopePlan> Create(absl::Span<const RopeLayer> per_layer, int32_t head_dim,
                                         RopePairing pairing = RopePairing::kNeox, int32_t rot_dims = 0);

  // Distinct enabled variants (0 if every layer is NoPE).
  int32_t n_variants() const { return static_cast<int32_t>(variants_.size()); }
  // -1 for a NoPE layer.
  int32_t variant_of(int32_t layer) const { return layer_variant_[static_cast<size_t>(layer)]; }
  const RopeLayer& variant(int32_t v) const { return variants_[static_cast<size_t>(v)]; }
  int32_t head_dim() const { return head_dim_; }
  // Leading dimensions of each head that rotate (== head_dim unless partial);
  // the cos/sin tables have rot_dims / 2 columns.
  int32_t rot_dims() const { return rot_dims_; }
  RopePairing pairing() const { return pairing_; }
  // inv_freq[i] = 1 / base^(2i / rot_dims) / freq_factors[i] (no division
  // without factors), or YarnInvFreq(base, rot_dims, yarn) with YaRN,
  // i < rot_dims / 2, for variant v; float32.
  const std::vector<float>& inv_freq(int32_t v) const { return inv_freq_[static_cast<size_t>(v)]; }

 private:
  int32_t head_dim_ = 0;
  int32_t rot_dims_ = 0;
  RopePairing pairing_ = RopePairing::kNeox;
  std::vector<RopeLayer> variants_;
  std::vector<int32_t> layer_variant_;
  std::vector<std::vector<float>> inv_freq_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_DECODE_PLANS_H_
