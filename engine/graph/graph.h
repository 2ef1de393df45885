// The graph IR of one forward step (a prefill chunk or one decode token).
//
// A Graph is a topologically ordered list of nodes; every non-weight node
// produces one row-major 2-D tensor [rows, cols] (f32 unless noted). Model
// families describe their layers with the builder methods below; the decode
// driver (engine/decode_driver.h) adds the per-token data nodes, the layer
// loop and the output; the optimizer (optimizer.h) prunes and plans memory;
// a backend (engine/backend.h) compiles the result into an executable plan.
//
// Per-token data enters a graph in one of two ways (seed: "two data modes"):
//   kInput  a re-bindable data node: its bytes live in a buffer owned by the
//           decode session and are rewritten before each step (D2);
//   kConst  the same bytes baked into the graph (D1, the oracle).
// Both feed the same kernels, so D1 and D2 produce byte-identical results.
//
// Node names follow GGUF tensor names (`blk.{il}.attn_q`) so D1/D2 dumps and
// debug output line up.
#ifndef DECODED_ENGINE_GRAPH_GRAPH_H_
#define DECODED_ENGINE_GRAPH_GRAPH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "engine/dtype.h"
#include "engine/kv_layout.h"
#include "engine/moe_routing.h"

namespace decoded {

using NodeId = int32_t;
inline constexpr NodeId kNoNode = -1;

// A model weight, viewed in place (never copied): `planes` matrices of `rows`
// rows of `cols` elements of `type`, row r of plane p at
// data + (p * rows + r) * row_bytes. GGUF ne = {cols, rows, planes}; a 2-D
// weight has one plane, a 3-D one (the experts of an MoE layer,
// `ffn_{gate,up,down}_exps`) one plane per expert.
struct WeightTensor {
  std::string name;
  DType type = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  const uint8_t* data = nullptr;
  int64_t planes = 1;
};

enum class Op : uint8_t {
  kWeight,       // a WeightTensor
  kInput,        // re-bindable per-token data (D2); bytes in a session buffer
  kConst,        // per-token data baked into the graph (D1)
  kGetRows,      // out[i] = dequant(table[ids[i]])       src: table(weight), ids(i32 [1, n])
  kRmsNorm,      // out = x * rsqrt(mean(x^2) + eps) * w  per group of w.cols  src: x, w
  kLayerNorm,    // out = (x - mean) * rsqrt(var + eps) * w [+ b]  per group of w.cols  src: x, w [, b]
  kMatMul,       // out[i, r] = dot(W[r], x[i])           src: W(weight), x f32
  kAdd,          // out = a + b                           src: a, b (same shape)
  kScale,        // out = x * f0                          src: x
  kGeluMul,      // out = gelu_tanh(a) * b                src: a, b
  kGelu,         // out = gelu_tanh(x)                    src: x
  kSwiGlu,       // out = silu(a) * b                     src: a, b
  kAddRow,       // out[r] = x[r] + b[0]                  src: x, b (f32 weight [1, x.cols])
  kSoftcap,      // out = f0 * tanh(x / f0)               src: x
  kTakeLastRow,  // out[0] = x[rows - 1]                  src: x
  kRope,         // rotary embedding of each head's first rope.rot_dims, paired per rope.pairing; src: x, cos, sin
  kKvWrite,      // writes row t of x into row t's KV cache at row t's offset; src: x, kv_rows [, offset]
  kAttention,    // causal/windowed attention of row t over row t's KV cache; src: q, mask, kv_rows, kwrite [, vwrite]
  kMoeFfn,       // routed SwiGLU experts: see Graph::moe_ffn; src: x, router_logits, gate_exps, up_exps, down_exps[, bias]
  kHeadSlice,    // out[r, g*count + c] = x[r, g*width + begin + c]   src: x
  kHeadConcat,   // per group g: out row = [a's group g, b's group g]  src: a, b
  kHeadMatMul,   // per group g: out[i, g*n + r] = dot(W[g*n + r], x[i] group g)  src: W(weight), x f32
  kTakeRows,     // out[i] = x[idx[i]]                    src: x f32, idx (i32 [1, n])
};

const char* OpName(Op op);

// Which dimensions of a head RoPE rotates together (pair i uses frequency i).
// llama.cpp's GGUF for arch "llama" stores Q/K rows permuted so that its
// LLAMA_ROPE_TYPE_NORM pairing reproduces HF's rotate-half on the original rows.
enum class RopePairing : uint8_t {
  kNeox,      // d pairs with d + head_dim/2 (HF rotate_half; llama.cpp NEOX)
  kAdjacent,  // 2i pairs with 2i + 1 (RoFormer's layout; llama.cpp NORM)
};

// Where a KV write takes its row offset from (seed: the two KV-write offset paths).
enum class KvOffsetPath : uint8_t {
  kDeviceOffset,  // an i32 [1, seq] data node (one offset per token row) read by the kernel at launch (capture-safe)
  kSymbol,        // the host symbols SymEnv::kv_pos (one per token row), bound per step
};

struct RopeAttrs {
  int32_t n_heads = 0;
  int32_t head_dim = 0;
  int32_t variant = 0;  // rows [variant * seq, (variant + 1) * seq) of the cos/sin tables
  RopePairing pairing = RopePairing::kNeox;
  int32_t rot_dims = 0;  // the first rot_dims of each head rotate (even, <= head_dim); the rest pass through
};

struct KvWriteAttrs {
  int32_t layer = 0;
  bool is_v = false;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  KvOffsetPath offset_path = KvOffsetPath::kDeviceOffset;
};

struct AttentionAttrs {
  int32_t layer = 0;
  int32_t variant = 0;  // rows [variant * seq, (variant + 1) * seq) of the mask
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;  // GQA: head h reads kv head h / (n_heads / n_kv_heads)
  int32_t k_dim = 0;       // q and K width per head
  int32_t v_dim = 0;       // value (and output) width per head
  bool v_in_k = false;     // the value is the first v_dim columns of the K row (no V slot)
  float scale = 0.0f;      // multiplies q.k
  float softcap = 0.0f;    // > 0: scores become softcap * tanh(score / softcap)
};

// A mixture-of-experts SwiGLU FFN (Shazeer et al. 2017; Qwen3-MoE, Mixtral,
// DeepSeek-V2/V3): per row the routing of engine/moe_routing.h picks k
// experts and their weights w_j, and out = sum_j w_j * down_e(silu(gate_e x) * up_e x)
// over the selected experts only.
using MoeAttrs = MoeRouting;

// Per-group column ranges (kHeadSlice): x's columns are n_groups groups of
// `width`; each keeps [begin, begin + count).
struct HeadSliceAttrs {
  int32_t n_groups = 0;
  int32_t width = 0;
  int32_t begin = 0;
  int32_t count = 0;
};

struct Node {
  Op op = Op::kConst;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<NodeId> src;
  std::string name;

  // Op attributes, one typed group per op that has any (the others ignore them).
  float scalar = 0.0f;        // kRmsNorm: eps; kScale: factor; kSoftcap: cap
  RopeAttrs rope;             // kRope
  KvWriteAttrs kv_write;      // kKvWrite
  AttentionAttrs attention;   // kAttention
  MoeAttrs moe;               // kMoeFfn
  HeadSliceAttrs head_slice;  // kHeadSlice
  int32_t n_groups = 0;       // kHeadConcat, kHeadMatMul

  const WeightTensor* weight = nullptr;  // kWeight
  int32_t input_slot = -1;               // kInput: index into the session's bindings
  std::vector<uint8_t> const_bytes;      // kConst

  size_t bytes() const;  // output size
};

// Identifies a per-token data slot of a decode step.
enum class DataSlot : int32_t {
  kTokenIds = 0,   // i32 [1, seq]
  kRopeCos = 1,    // f32 [n_rope_variants * seq, rot_dims / 2]
  kRopeSin = 2,    // f32 [n_rope_variants * seq, rot_dims / 2]
  kMask = 3,       // i32 [n_mask_variants * seq, 2]: visible key range [lo, hi) per query row
  kKvOffset = 4,   // i32 [1, seq]: the KV row each token row writes (device-offset path only)
  kKvRows = 5,     // i64 [seq, KvRowStride(n_layers)]: each token row's KV cache (engine/kv_rows.h)
  kOutputRows = 6, // i32 [1, n_outputs]: the token rows whose logits the step computes, in output order
  kCount = 7,
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  // ---- leaves ----
  NodeId weight(const WeightTensor& w);
  // A re-bindable data node for `slot`, shape [rows, cols] of `dtype`.
  NodeId input(DataSlot slot, DType dtype, int64_t rows, int64_t cols, std::string name);
  // Baked data; `bytes` must hold rows * cols elements of `dtype`.
  NodeId constant(DType dtype, int64_t rows, int64_t cols, std::vector<uint8_t> bytes, std::string name);

  // ---- ops (all produce f32 [rows, cols] unless stated) ----
  // [n, table.cols]; ids is i32 [1, n].
  NodeId get_rows(NodeId table, NodeId ids, std::string name);
  // x [r, c]; w f32 weight [1, g] with c % g == 0: every group of g elements is
  // normalized on its own (g == c: whole rows; g == head_dim: per-head q/k norm).
  NodeId rms_norm(NodeId x, NodeId w, float eps, std::string name);
  // LayerNorm over the same groups: x [r, c]; w and b f32 weights [1, g]
  // with c % g == 0; b == kNoNode for a LayerNorm without bias.
  NodeId layer_norm(NodeId x, NodeId w, NodeId b, float eps, std::string name);
  // x f32 [m, k] times weight W [n, k]^T -> [m, n]. Which weight types a
  // backend takes, and any conversion of x its kernels need (the CPU's Q8_0 /
  // Q8_K activation rows), are its Compile's lowering, not nodes.
  NodeId matmul(NodeId w, NodeId x, std::string name);
  NodeId add(NodeId a, NodeId b, std::string name);
  NodeId scale(NodeId x, float s, std::string name);
  NodeId gelu_mul(NodeId gate, NodeId up, std::string name);
  // gelu_tanh(x) (HF "gelu_new" / "gelu_pytorch_tanh"): an ungated GELU FFN.
  NodeId gelu(NodeId x, std::string name);
  // silu(gate) * up, silu(x) = x / (1 + e^-x): the SwiGLU FFN (Shazeer 2020).
  NodeId swiglu(NodeId gate, NodeId up, std::string name);
  // x [r, c] plus the f32 weight row `bias` [1, c] added to every row.
  NodeId add_row(NodeId x, NodeId bias, std::string name);
  NodeId softcap(NodeId x, float cap, std::string name);
  NodeId take_last_row(NodeId x, std::string name);
  // x [r, c], idx i32 [1, n] of row numbers in [0, r): [n, c], row i = x[idx[i]]
  // (llama.cpp's inp_out_ids: only the rows whose logits a step needs reach
  // the output head).
  NodeId take_rows(NodeId x, NodeId idx, std::string name);
  // x [seq, n_heads * head_dim]; cos/sin [n_variants * seq, rot_dims / 2];
  // uses rows [variant * seq, (variant + 1) * seq) and rotates the first
  // rot_dims (even, <= head_dim) of each head. Attributes: Node::rope.
  NodeId rope(NodeId x, NodeId cos, NodeId sin, int32_t variant, int32_t n_heads,
              int32_t head_dim, int32_t rot_dims, RopePairing pairing, std::string name);
  // Writes row t of x [seq, n_kv_heads * head_dim] into layer `layer`'s K
  // (is_v = false) or V buffer of row t's cache (kv_rows, i64
  // [seq, KvRowStride]: engine/kv_rows.h) at row t's offset. `offset` is the
  // i32 [1, seq] data node of the device-offset path, kNoNode for the symbol
  // path. Attributes: Node::kv_write. Output: [0, 0] (an effect).
  NodeId kv_write(NodeId x, NodeId kv_rows, int32_t layer, bool is_v, int32_t n_kv_heads, int32_t head_dim,
                  KvOffsetPath path, NodeId offset, std::string name);
  // Row t of q [seq, n_heads * layout.k_dim] against layer `layer` of row t's
  // cache (kv_rows), over the key rows named by mask row variant * seq + t;
  // output [seq, n_heads * layout.v_dim]. Reads after kwrite and vwrite
  // (kNoNode when layout.v_in_k: the value is then the first v_dim columns of
  // the K row). layout.n_kv_heads divides n_heads (GQA). Attributes:
  // Node::attention (softcap 0 = none).
  NodeId attention(NodeId q, NodeId mask, NodeId kv_rows, NodeId kwrite, NodeId vwrite, int32_t layer,
                   int32_t variant, int32_t n_heads, const KvLayout& layout, float scale, float softcap,
                   std::string name);

  // ---- per-group (per-head) column ops ----
  // x [r, n_groups * width] -> [r, n_groups * count]: columns
  // [begin, begin + count) of every group (q's nope / rope parts per head).
  NodeId head_slice(NodeId x, int32_t n_groups, int32_t begin, int32_t count, std::string name);
  // a [r, n_groups * wa], b [r, n_groups * wb] -> [r, n_groups * (wa + wb)],
  // group g of the output being a's group g followed by b's.
  NodeId head_concat(NodeId a, NodeId b, int32_t n_groups, std::string name);
  // A block-diagonal matmul: weight W [n_groups * n, k] holds one [n, k]
  // matrix per group; x [m, n_groups * k] -> [m, n_groups * n], group g of
  // the output being x's group g times W's matrix g transposed. k must be
  // whole blocks of W's type (groups of the converted activation row then
  // start on block boundaries).
  NodeId head_matmul(NodeId w, NodeId x, int32_t n_groups, std::string name);

  // x f32 [rows, hidden]; router_logits f32 [rows, n_expert]; gate_exps and
  // up_exps weights of n_expert planes [ffn, hidden], down_exps of n_expert
  // planes [hidden, ffn], each of any matmul weight type; selection_bias an
  // f32 weight [1, n_expert] or kNoNode. Routing (engine/moe_routing.h;
  // routing.n_expert and has_bias are set from the nodes) is read from
  // router_logits when the op runs, so a held plan serves every token's
  // routing; only the k selected experts' rows are multiplied.
  // -> f32 [rows, hidden]. Attributes: Node::moe.
  NodeId moe_ffn(NodeId x, NodeId router_logits, NodeId gate_exps, NodeId up_exps, NodeId down_exps,
                 NodeId selection_bias, MoeRouting routing, std::string name);

  void mark_output(NodeId id);

  // Whether every row is a position of one sequence (a prefill chunk through
  // one KV cache) rather than one row per decode session. A backend may give
  // such a graph kernels whose arithmetic depends on the row count (Vulkan's
  // tiled mat-mat for many rows); the rows of distinct sessions must each get
  // arithmetic that does not depend on the others (engine/decode_driver.h:
  // a session's logits in a batch equal its logits alone). Default false.
  void set_rows_are_one_sequence(bool one_sequence) { rows_are_one_sequence_ = one_sequence; }
  bool rows_are_one_sequence() const { return rows_are_one_sequence_; }

  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  const Node& node(NodeId id) const { return nodes_[static_cast<size_t>(id)]; }
  const std::vector<NodeId>& outputs() const { return outputs_; }
  std::vector<NodeId>& mutable_outputs() { return outputs_; }

 private:
  NodeId push(Node n);
  std::vector<Node> nodes_;
  std::vector<NodeId> outputs_;
  bool rows_are_one_sequence_ = false;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_GRAPH_GRAPH_H_
