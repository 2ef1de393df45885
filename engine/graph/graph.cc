#include "engine/graph/graph.h"

#include <utility>

namespace decoded {

const char* OpName(Op op) {
  switch (op) {
    case Op::kWeight: return "weight";
    case Op::kInput: return "input";
    case Op::kConst: return "const";
    case Op::kGetRows: return "get_rows";
    case Op::kRmsNorm: return "rms_norm";
    case Op::kLayerNorm: return "layer_norm";
    case Op::kMatMul: return "matmul";
    case Op::kAdd: return "add";
    case Op::kScale: return "scale";
    case Op::kGeluMul: return "gelu_mul";
    case Op::kGelu: return "gelu";
    case Op::kSwiGlu: return "swiglu";
    case Op::kAddRow: return "add_row";
    case Op::kSoftcap: return "softcap";
    case Op::kTakeLastRow: return "take_last_row";
    case Op::kTakeRows: return "take_rows";
    case Op::kRope: return "rope";
    case Op::kKvWrite: return "kv_write";
    case Op::kAttention: return "attention";
    case Op::kMoeFfn: return "moe_ffn";
    case Op::kHeadSlice: return "head_slice";
    case Op::kHeadConcat: return "head_concat";
    case Op::kHeadMatMul: return "head_matmul";
  }
  return "?";
}

size_t Node::bytes() const {
  if (op == Op::kWeight) {
    return weight ? weight->row_bytes * static_cast<size_t>(weight->rows) * static_cast<size_t>(weight->planes) : 0;
  }
  auto rb = RowBytes(dtype, cols);
  return rb ? *rb * static_cast<size_t>(rows) : 0;
}

NodeId Graph::push(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<NodeId>(nodes_.size() - 1);
}

NodeId Graph::weight(const WeightTensor& w) {
  Node n;
  n.op = Op::kWeight;
  n.dtype = w.type;
  n.rows = w.rows;
  n.cols = w.cols;
  n.name = w.name;
  n.weight = &w;
  return push(std::move(n));
}

NodeId Graph::input(DataSlot slot, DType dtype, int64_t rows, int64_t cols, std::string name) {
  Node n;
  n.op = Op::kInput;
  n.dtype = dtype;
  n.rows = rows;
  n.cols = cols;
  n.input_slot = static_cast<int32_t>(slot);
  n.name = std::move(name);
  return push(std::move(n));
}

NodeId Graph::constant(DType dtype, int64_t rows, int64_t cols, std::vector<uint8_t> bytes,
                       std::string name) {
  Node n;
  n.op = Op::kConst;
  n.dtype = dtype;
  n.rows = rows;
  n.cols = cols;
  n.const_bytes = std::move(bytes);
  n.name = std::move(name);
  return push(std::move(n));
}

namespace {
Node F32Node(Op op, int64_t rows, int64_t cols, std::vector<NodeId> src, std::string name) {
  Node n;
  n.op = op;
  n.rows = rows;
  n.cols = cols;
  n.src = std::move(src);
  n.name = std::move(name);
  return n;
}
}  // namespace

NodeId Graph::get_rows(NodeId table, NodeId ids, std::string name) {
  return push(F32Node(Op::kGetRows, node(ids).cols, node(table).cols, {table, ids}, std::move(name)));
}

NodeId Graph::rms_norm(NodeId x, NodeId w, float eps, std::string name) {
  Node n = F32Node(Op::kRmsNorm, node(x).rows, node(x).cols, {x, w}, std::move(name));
  n.scalar = eps;
  return push(std::move(n));
}

NodeId Graph::layer_norm(NodeId x, NodeId w, NodeId b, float eps, std::string name) {
  std::vector<NodeId> src = {x, w};
  if (b != kNoNode) src.push_back(b);
  Node n = F32Node(Op::kLayerNorm, node(x).rows, node(x).cols, std::move(src), std::move(name));
  n.scalar = eps;
  return push(std::move(n));
}

NodeId Graph::matmul(NodeId w, NodeId x, std::string name) {
  return push(F32Node(Op::kMatMul, node(x).rows, node(w).rows, {w, x}, std::move(name)));
}

NodeId Graph::add(NodeId a, NodeId b, std::string name) {
  return push(F32Node(Op::kAdd, node(a).rows, node(a).cols, {a, b}, std::move(name)));
}

NodeId Graph::scale(NodeId x, float s, std::string name) {
  Node n = F32Node(Op::kScale, node(x).rows, node(x).cols, {x}, std::move(name));
  n.scalar = s;
  return push(std::move(n));
}

NodeId Graph::gelu_mul(NodeId gate, NodeId up, std::string name) {
  return push(F32Node(Op::kGeluMul, node(gate).rows, node(gate).cols, {gate, up}, std::move(name)));
}

NodeId Graph::gelu(NodeId x, std::string name) {
  return push(F32Node(Op::kGelu, node(x).rows, node(x).cols, {x}, std::move(name)));
}

NodeId Graph::swiglu(NodeId gate, NodeId up, std::string name) {
  return push(F32Node(Op::kSwiGlu, node(gate).rows, node(gate).cols, {gate, up}, std::move(name)));
}

NodeId Graph::add_row(NodeId x, NodeId bias, std::string name) {
  return push(F32Node(Op::kAddRow, node(x).rows, node(x).cols, {x, bias}, std::move(name)));
}

NodeId Graph::softcap(NodeId x, float cap, std::string name) {
  Node n = F32Node(Op::kSoftcap, node(x).rows, node(x).cols, {x}, std::move(name));
  n.scalar = cap;
  return push(std::move(n));
}

NodeId Graph::take_last_row(NodeId x, std::string name) {
  return push(F32Node(Op::kTakeLastRow, 1, node(x).cols, {x}, std::move(name)));
}

NodeId Graph::take_rows(NodeId x, NodeId idx, std::string name) {
  return push(F32Node(Op::kTakeRows, node(idx).cols, node(x).cols, {x, idx}, std::move(name)));
}

NodeId Graph::rope(NodeId x, NodeId cos, NodeId sin, int32_t variant, int32_t n_heads,
                   int32_t head_dim, int32_t rot_dims, RopePairing pairing, std::string name) {
  Node n = F32Node(Op::kRope, node(x).rows, node(x).cols, {x, cos, sin}, std::move(name));
  n.rope = {n_heads, head_dim, variant, pairing, rot_dims};
  return push(std::move(n));
}

NodeId Graph::kv_write(NodeId x, NodeId kv_rows, int32_t layer, bool is_v, int32_t n_kv_heads, int32_t head_dim,
                       KvOffsetPath path, NodeId offset, std::string name) {
  std::vector<NodeId> src = {x, kv_rows};
  if (path == KvOffsetPath::kDeviceOffset) src.push_back(offset);
  Node n = F32Node(Op::kKvWrite, 0, 0, std::move(src), std::move(name));
  n.kv_write = {layer, is_v, n_kv_heads, head_dim, path};
  return push(std::move(n));
}

NodeId Graph::attention(NodeId q, NodeId mask, NodeId kv_rows, NodeId kwrite, NodeId vwrite, int32_t layer,
                        int32_t variant, int32_t n_heads, const KvLayout& layout, float scale, float softcap,
                        std::string name) {
  std::vector<NodeId> src = {q, mask, kv_rows, kwrite};
  if (vwrite != kNoNode) src.push_back(vwrite);
  Node n = F32Node(Op::kAttention, node(q).rows, static_cast<int64_t>(n_heads) * layout.v_dim, std::move(src),
                   std::move(name));
  n.attention = {.layer = layer, .variant = variant, .n_heads = n_heads, .n_kv_heads = layout.n_kv_heads,
                 .k_dim = layout.k_dim, .v_dim = layout.v_dim, .v_in_k = layout.v_in_k, .scale = scale,
                 .softcap = softcap};
  return push(std::move(n));
}

NodeId Graph::head_slice(NodeId x, int32_t n_groups, int32_t begin, int32_t count, std::string name) {
  Node n = F32Node(Op::kHeadSlice, node(x).rows, static_cast<int64_t>(n_groups) * count, {x}, std::move(name));
  n.head_slice = {n_groups, static_cast<int32_t>(node(x).cols / n_groups), begin, count};
  return push(std::move(n));
}

NodeId Graph::head_concat(NodeId a, NodeId b, int32_t n_groups, std::string name) {
  Node n = F32Node(Op::kHeadConcat, node(a).rows, node(a).cols + node(b).cols, {a, b}, std::move(name));
  n.n_groups = n_groups;
  return push(std::move(n));
}

NodeId Graph::head_matmul(NodeId w, NodeId x, int32_t n_groups, std::string name) {
  Node n = F32Node(Op::kHeadMatMul, node(x).rows, node(w).rows, {w, x}, std::move(name));
  n.n_groups = n_groups;
  return push(std::move(n));
}

NodeId Graph::moe_ffn(NodeId x, NodeId router_logits, NodeId gate_exps, NodeId up_exps, NodeId down_exps,
                      NodeId selection_bias, MoeRouting routing, std::string name) {
  std::vector<NodeId> src = {x, router_logits, gate_exps, up_exps, down_exps};
  if (selection_bias != kNoNode) src.push_back(selection_bias);
  Node n = F32Node(Op::kMoeFfn, node(x).rows, node(down_exps).rows, std::move(src), std::move(name));
  routing.n_expert = static_cast<int32_t>(node(router_logits).cols);
  routing.has_bias = selection_bias != kNoNode;
  n.moe = routing;
  return push(std::move(n));
}

void Graph::mark_output(NodeId id) { outputs_.push_back(id); }

}  // namespace decoded
