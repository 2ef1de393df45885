// f32 CPU kernels of the graph ops other than matmul (engine/quant does the
// quantized dot products). Each kernel computes the share [ith of nth] of its
// output; every output element is computed by exactly one thread with a fixed
// summation order, so results do not depend on the thread count. Each call
// runs the copy compiled for the process's instruction-set tier
// (engine/cpu_isa.h; kernels_isa.cc).
#ifndef DECODED_ENGINE_CPU_KERNELS_H_
#define DECODED_ENGINE_CPU_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "engine/dtype.h"
#include "engine/moe_routing.h"
#include "engine/isa_namespace.h"

namespace decoded::cpu {

// Share is compiled into every tier's kernels and into baseline code: one
// symbol per tier (engine/isa_namespace.h).
inline namespace DECODED_ISA_NS {
// Contiguous share [begin, end) of `n` items for thread ith of nth.
inline void Share(int64_t n, int ith, int nth, int64_t* begin, int64_t* end) {
  const int64_t per = (n + nth - 1) / nth;
  *begin = per * ith < n ? per * ith : n;
  *end = *begin + per < n ? *begin + per : n;
}
}  // inline namespace DECODED_ISA_NS

float DotF32(const float* a, const float* b, int64_t n);

// x, out [rows, cols]; w [group]; each group of `group` elements normalized:
// out = x * rsqrt(mean(x^2) + eps) * w. (Zhang & Sennrich 2019, RMSNorm.)
void RmsNormRows(const float* x, const float* w, float* out, int64_t rows, int64_t cols,
                 int64_t group, float eps, int ith, int nth);

// x, out [rows, cols]; w, b [group] (b may be null: no bias); each group of
// `group` elements normalized to zero mean and unit (biased) variance:
// out = (x - mean) * rsqrt(var + eps) * w + b. (Ba et al. 2016, LayerNorm;
// torch.nn.LayerNorm.)
void LayerNormRows(const float* x, const float* w, const float* b, float* out, int64_t rows, int64_t cols,
                   int64_t group, float eps, int ith, int nth);

// gelu_tanh(a) * b: GELU with the tanh approximation (Hendrycks & Gimpel 2016),
// as HF's "gelu_pytorch_tanh".
void GeluMul(const float* a, const float* b, float* out, int64_t n, int ith, int nth);

// gelu_tanh(x) alone: HF's "gelu_new" (Phi, GPT-2) and "gelu_pytorch_tanh",
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
void Gelu(const float* x, float* out, int64_t n, int ith, int nth);

// silu(a) * b with silu(x) = x * sigmoid(x): the SwiGLU FFN (Shazeer 2020),
// as HF's LlamaMLP act_fn "silu".
void SiluMul(const float* a, const float* b, float* out, int64_t n, int ith, int nth);

// out[r] = x[r] + bias for each of `rows` rows of `cols` elements.
void AddRow(const float* x, const float* bias, float* out, int64_t rows, int64_t cols, int ith, int nth);

void Add(const float* a, const float* b, float* out, int64_t n, int ith, int nth);
void Scale(const float* x, float s, float* out, int64_t n, int ith, int nth);
void Softcap(const float* x, float cap, float* out, int64_t n, int ith, int nth);

// Rotary embedding (Su et al. 2021, RoFormer) of the first `rot_dim` dimensions
// of every head; dimensions [rot_dim, head_dim) pass through unchanged
// (partial rotary, e.g. Phi-2; rot_dim == head_dim rotates the whole head).
// NeoX/HF "rotate_half" pairing: within the rotated dimensions, element d
// pairs with d + rot_dim/2 and uses frequency d. x, out [seq, n_heads *
// head_dim]; cos, sin [seq, rot_dim / 2] (already offset to the variant's rows).
void RopeNeox(const float* x, const float* cos, const float* sin, float* out, int64_t seq,
              int32_t n_heads, int32_t head_dim, int32_t rot_dim, int ith, int nth);
// The same rotation with RoFormer's adjacent pairing: element 2i pairs with
// 2i + 1 and uses frequency i (llama.cpp's LLAMA_ROPE_TYPE_NORM).
void RopeAdjacent(const float* x, const float* cos, const float* sin, float* out, int64_t seq,
                  int32_t n_heads, int32_t head_dim, int32_t rot_dim, int ith, int nth);

// Scaled dot-product attention (Vaswani et al. 2017) for query rows [seq],
// row t against rows [lo_t, hi_t) (`bounds`, [seq, 2] i32) of layer `layer`
// of ITS OWN cache, kv_rows row t (engine/kv_rows.h, int64 [seq,
// kv_row_stride]: a prefill chunk's rows share one cache, a batched decode
// step's rows each have their own). One-pass online softmax (Milakov &
// Gimelshein 2018). q [seq, n_heads * k_dim]; out [seq, n_heads * v_dim]; a
// cache's K pool is [n_blocks, n_kv_heads, block_tokens] rows of k_dim and its
// V pool the same of v_stride elements of the cache's KV type (f32, f16 or
// q8_0, decoded exactly to f32 before use), read through the cache's block
// table, of which each row's first v_dim elements are the value
// (v_stride == v_dim for a V slot; the K pool and v_stride == k_dim when the
// value lives inside the K row, MLA's latent). Keys go in position order, so
// the result does not depend on the block size or on which blocks hold them. v_dim <= kMaxValueDim. softcap > 0 applies
// cap * tanh(score / cap) to the scaled scores (Gemma 2). Keys go in tiles of
// 16 at absolute positions, flash-attention style (engine/cpu/attention_isa.cc);
// each (row, head) is computed by one thread in a fixed order: a row's output
// depends only on its q row and key range, not on seq, the other rows, the
// block size or the thread count.
inline constexpr int32_t kMaxValueDim = 1024;
// Largest k_dim of a cache that is not f32 (its key rows are decoded on the stack).
inline constexpr int32_t kMaxKeyDim = 4096;
void Attention(const float* q, const int32_t* bounds, const int64_t* kv_rows, int64_t kv_row_stride, int32_t layer,
               float* out, int64_t seq, int32_t n_heads, int32_t n_kv_heads, int32_t k_dim, int32_t v_dim,
               int32_t v_stride, float scale, float softcap, int ith, int nth);

// out[r, g*count + c] = x[r, g*width + begin + c] for g < n_groups.
void HeadSlice(const float* x, float* out, int64_t rows, int32_t n_groups, int32_t width, int32_t begin,
               int32_t count, int ith, int nth);

// Group g of each out row = a's group g ([wa]) followed by b's ([wb]).
void HeadConcat(const float* a, const float* b, float* out, int64_t rows, int32_t n_groups, int32_t wa, int32_t wb,
                int ith, int nth);

// One routing decision of a mixture-of-experts layer (Graph::moe_ffn), as
// engine/moe_routing.h states it: `logits` [r.n_expert]; `bias` the
// selection bias [r.n_expert] or null; `scratch` MoeRouteScratchFloats(r). The
// k selected experts in descending selection score (ties: the lower index)
// go to experts[0..k), their weights to weights[0..k). Softmax is
// max-subtracted, in f32; the renormalization sum is accumulated in routing
// order. The caller has checked r (k <= eligible experts, groups dividing
// n_expert, groups of >= 2 for kTop2Sum).
inline int64_t MoeRouteScratchFloats(const MoeRouting& r) { return 2 * int64_t{r.n_expert} + 2 * int64_t{r.n_group}; }
void MoeRoute(const float* logits, const float* bias, const MoeRouting& r, float* scratch, int32_t* experts,
              float* weights);

// The expert matrices of one MoE projection: n_expert planes of `rows` rows of
// `cols` elements of `type` (quant::MatMul's weight types), row_bytes apart,
// plane e starting at data + e * rows * row_bytes.
struct MoeExpertMatrix {
  DType type = DType::kF32;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct MoeFfnArgs {
  const float* x = nullptr;              // f32 [rows, hidden]
  const float* router_logits = nullptr;  // f32 [rows, n_expert]
  MoeExpertMatrix gate, up;              // planes [ffn, hidden]
  MoeExpertMatrix down;                  // planes [hidden, ffn]
  float* out = nullptr;                  // f32 [rows, hidden]
  int64_t rows = 0;
  MoeRouting routing;                    // routing.has_bias: selection_bias is given
  const float* selection_bias = nullptr;  // f32 [n_expert] or null
  void* workspace = nullptr;  // MoeFfnWorkspaceBytes(...) bytes, 64-byte aligned
};

// Scratch the MoE kernel needs for `rows` rows: routing, converted
// activations and the selected experts' intermediate rows.
size_t MoeFfnWorkspaceBytes(const MoeFfnArgs& a);

// The MoE SwiGLU FFN of Graph::moe_ffn for all rows: route every row
// (MoeRoute), then per (row, selected expert) gate and up rows of that
// expert's plane only, silu(gate) * up, its down projection, and
// out[r] = sum over the row's experts, in routing order, of weight * down.
// Thread ith of nth computes its share of each phase and calls `barrier`
// between phases (every member the same number of times); each output element
// is computed by one thread in a fixed order, so results do not depend on nth.
void MoeFfn(const MoeFfnArgs& a, int ith, int nth, absl::FunctionRef<void()> barrier);

}  // namespace decoded::cpu

#endif  // DECODED_ENGINE_CPU_KERNELS_H_
