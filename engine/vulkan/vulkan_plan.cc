#include "engine/vulkan/vulkan_plan.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/kv_rows.h"
#include "engine/vulkan/kernels.h"
#include "engine/vulkan/vulkan_buffer.h"
#include "engine/vulkan/vulkan_executor.h"

namespace decoded::vulkan {
namespace {

std::atomic<int64_t> g_recordings{0}, g_submissions{0}, g_dispatches{0}, g_tiled_matmuls{0};

constexpr uint32_t kMaxGroupsX = 65535;
constexpr uint32_t kUnit = 32;            // elements per dequantization unit (dequant.glsl)
constexpr int32_t kMaxHeadWidth = 1024;   // attention.comp's shared q row and value registers

struct Dispatch {
  Kernel kernel = Kernel::kCount;
  uint32_t groups = 0;  // workgroups (linear; spread over x and y)
  uint32_t push_bytes = 0;
  alignas(8) uint8_t push[kPushConstantBytes] = {};
};

template <typename P>
Dispatch MakeDispatch(Kernel k, uint32_t groups, const P& params) {
  static_assert(sizeof(P) <= kPushConstantBytes);
  Dispatch d;
  d.kernel = k;
  d.groups = groups;
  d.push_bytes = sizeof(P);
  std::memcpy(d.push, &params, sizeof(P));
  return d;
}

uint32_t GroupsFor(int64_t items, uint32_t per_group) {
  return static_cast<uint32_t>((items + per_group - 1) / per_group);
}

// Where one MoE FFN's intermediates live in the plan's MoE workspace
// (reused by every MoE node of the plan, which run one after another):
// pairs = rows * k (row, chosen expert) pairs.
struct MoeWorkspace {
  size_t ids = 0, weights = 0, scratch = 0, gate = 0, up = 0, down = 0, total = 0;
  explicit MoeWorkspace(const Graph& g, const Node& n) {
    const Node& gate_w = g.node(n.src[2]);
    const size_t rows = static_cast<size_t>(n.rows), pairs = rows * static_cast<size_t>(n.moe.k);
    const size_t ffn = static_cast<size_t>(gate_w.rows), hidden = static_cast<size_t>(gate_w.cols);
    auto take = [this](size_t bytes) {
      const size_t at = total;
      total += (bytes + 63) / 64 * 64;
      return at;
    };
    ids = take(pairs * 4);
    weights = take(pairs * 4);
    scratch = take(rows * (2 * static_cast<size_t>(n.moe.n_expert) + 2 * static_cast<size_t>(n.moe.n_group)) * 4);
    gate = take(pairs * ffn * 4);
    up = take(pairs * ffn * 4);
    down = take(pairs * hidden * 4);
  }
};

absl::Status Unsupported(const Node& n, const std::string& why) {
  return absl::UnimplementedError(absl::StrCat("the Vulkan backend cannot run ", OpName(n.op), " node ", n.name, ": ",
                                               why));
}

absl::Status CheckWeightKernel(const Graph& g, const Node& n, bool get_rows) {
  const Node& w = g.node(n.src[0]);
  const auto kernel = get_rows ? GetRowsKernel(w.dtype) : MatMulKernel(w.dtype);
  if (!kernel) return Unsupported(n, absl::StrCat("no kernel for weight type ", DTypeName(w.dtype)));
  const bool float_type = w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16;
  if (!float_type && w.cols % kUnit != 0) {
    return Unsupported(n, absl::StrCat("weight ", w.name, " has ", w.cols, " columns, not whole units of ", kUnit));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TiledMatMulMinRows(const Device& device) { return device.is_cpu() ? 48 : 16; }
bool TiledMatMulAvailable(const Device& device) { return device.shared_memory_bytes() >= kTiledMatMulSharedBytes; }

PlanStats GetPlanStats() {
  return {g_recordings.load(), g_submissions.load(), g_dispatches.load(), g_tiled_matmuls.load()};
}

absl::Status CheckGraphSupported(const Graph& graph) {
  for (const Node& n : graph.nodes()) {
    switch (n.op) {
      case Op::kMoeFfn:
        for (size_t j = 2; j <= 4; ++j) {
          const Node& w = graph.node(n.src[j]);
          if (!MoeMatMulKernel(w.dtype)) return Unsupported(n, absl::StrCat("no kernel for expert weight type ", DTypeName(w.dtype)));
          const bool float_type = w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16;
          if (!float_type && w.cols % kUnit != 0) {
            return Unsupported(n, absl::StrCat("expert weight ", w.name, " has ", w.cols, " columns, not whole units of ",
                                               kUnit));
          }
        }
        break;
      case Op::kGetRows:
        if (auto s = CheckWeightKernel(graph, n, true); !s.ok()) return s;
        break;
      case Op::kMatMul:
      case Op::kHeadMatMul:
        if (auto s = CheckWeightKernel(graph, n, false); !s.ok()) return s;
        break;
      case Op::kAttention:
        if (n.attention.k_dim > kMaxHeadWidth || n.attention.v_dim > kMaxHeadWidth) {
          return Unsupported(n, absl::StrCat("heads of ", n.attention.k_dim, "/", n.attention.v_dim,
                                             " exceed ", kMaxHeadWidth));
        }
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

namespace {

class Plan final : public CompiledPlan {
 public:
  Plan(std::shared_ptr<Device> device, Graph graph, MemoryPlan plan, const PlanOptions& options)
      : device_(std::move(device)), graph_(std::move(graph)), plan_(std::move(plan)), options_(options) {}

  ~Plan() override {
    if (pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(device_->device(), pool_, nullptr);
  }

  absl::Status Init(WeightStore& weights, const PlanResources& res) {
    if (auto s = CheckGraphSupported(graph_); !s.ok()) return s;
    const auto& nodes = graph_.nodes();

    // Constants (D1's baked per-token data) in one buffer, 64-byte aligned each.
    std::vector<size_t> const_offset(nodes.size(), 0);
    size_t const_bytes = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].op != Op::kConst) continue;
      const_offset[i] = const_bytes;
      const_bytes += (nodes[i].const_bytes.size() + 63) / 64 * 64;
    }
    auto consts = Buffer::Create(device_, const_bytes, Device::Memory::kUpload);
    if (!consts.ok()) return consts.status();
    consts_ = *std::move(consts);
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].op == Op::kConst && !nodes[i].const_bytes.empty()) {
        std::memcpy(static_cast<uint8_t*>(consts_->data()) + const_offset[i], nodes[i].const_bytes.data(),
                    nodes[i].const_bytes.size());
      }
    }
    // Intermediates stay on the device; the outputs (logits) are copied into
    // a host-read buffer at the end of each run.
    auto arena = Buffer::Create(device_, plan_.arena_bytes, Device::Memory::kDeviceOnly);
    if (!arena.ok()) return arena.status();
    arena_ = *std::move(arena);
    size_t readback_bytes = 0;
    for (NodeId id : graph_.outputs()) {
      readback_offset_.push_back(readback_bytes);
      readback_bytes += (graph_.node(id).bytes() + 63) / 64 * 64;
    }
    auto readback = Buffer::Create(device_, readback_bytes, Device::Memory::kReadback);
    if (!readback.ok()) return readback.status();
    readback_ = *std::move(readback);

    // Control words: [0] the KV fault flag, then from 16 the symbol path's
    // write offsets (one per token row).
    int64_t sym_rows = 0;
    for (NodeId id : plan_.schedule) {
      const Node& n = nodes[static_cast<size_t>(id)];
      if (n.op == Op::kKvWrite && n.kv_write.offset_path == KvOffsetPath::kSymbol) {
        sym_rows = std::max(sym_rows, nodes[static_cast<size_t>(n.src[0])].rows);
      }
    }
    sym_rows_ = sym_rows;
    auto control = Buffer::Create(device_, (kSymWord + static_cast<size_t>(sym_rows)) * sizeof(int32_t),
                                  Device::Memory::kUpload);
    if (!control.ok()) return control.status();
    control_ = *std::move(control);
    size_t moe_bytes = 0;
    for (NodeId id : plan_.schedule) {
      const Node& n = nodes[static_cast<size_t>(id)];
      if (n.op == Op::kMoeFfn) moe_bytes = std::max(moe_bytes, MoeWorkspace(graph_, n).total);
    }
    if (moe_bytes > 0) {
      auto ws = Buffer::Create(device_, moe_bytes, Device::Memory::kDeviceOnly);
      if (!ws.ok()) return ws.status();
      moe_workspace_ = *std::move(ws);
    }

    // Every node's device address.
    std::vector<uint64_t> addr(nodes.size(), 0);
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      switch (n.op) {
        case Op::kWeight: {
          auto a = weights.Address(*n.weight);
          if (!a.ok()) return a.status();
          addr[i] = *a;
          break;
        }
        case Op::kInput: {
          const auto* b = dynamic_cast<const Buffer*>(res.inputs[static_cast<size_t>(n.input_slot)]);
          if (b == nullptr || b->size() < n.bytes()) {
            return absl::InvalidArgumentError(absl::StrCat("input node ", n.name, " needs a buffer of this device of ",
                                                           n.bytes(), " bytes"));
          }
          addr[i] = b->device_address();
          break;
        }
        case Op::kConst: addr[i] = consts_->device_address() + const_offset[i]; break;
        case Op::kKvWrite: break;
        default:
          if (plan_.arena_offset[i] >= 0) addr[i] = arena_->device_address() + static_cast<uint64_t>(plan_.arena_offset[i]);
          break;
      }
    }

    for (NodeId id : plan_.schedule) {
      if (auto s = Lower(nodes[static_cast<size_t>(id)], addr, res); !s.ok()) return s;
    }

    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = device_->queue_family();
    if (auto s = device_->Check(vkCreateCommandPool(device_->device(), &pi, nullptr, &pool_), "vkCreateCommandPool");
        !s.ok()) {
      return s;
    }
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    if (auto s = device_->Check(vkAllocateCommandBuffers(device_->device(), &ai, &cb_), "vkAllocateCommandBuffers");
        !s.ok()) {
      return s;
    }
    // Pipelines now (compiled once per process): the first token pays for
    // its shaders here, never a later one.
    for (const Dispatch& d : dispatches_) {
      if (auto p = device_->pipelines().Get(d.kernel); !p.ok()) return p.status();
    }
    return absl::OkStatus();
  }

  absl::Status Run(decoded::Executor& executor, const SymEnv& env) override {
    auto* vk = dynamic_cast<Executor*>(&executor);
    if (vk == nullptr || &vk->device() != device_.get()) {
      return absl::InvalidArgumentError("a Vulkan plan needs an executor of its own device");
    }
    auto* control = static_cast<int32_t*>(control_->data());
    if (sym_rows_ > 0) {
      if (static_cast<int64_t>(env.kv_pos.size()) < sym_rows_) {
        return absl::InternalError("KV write offset outside the cache at run time");
      }
      std::memcpy(control + kSymWord, env.kv_pos.data(), static_cast<size_t>(sym_rows_) * sizeof(int32_t));
    }
    control[kFaultWord] = 0;
    if (!recorded_ || options_.record_every_run) {
      if (auto s = Record(); !s.ok()) return s;
    }
    if (auto s = vk->SubmitAndWait(cb_); !s.ok()) return s;
    g_submissions.fetch_add(1, std::memory_order_relaxed);
    if (control[kFaultWord] != 0) return absl::InternalError("KV write offset outside the cache at run time");
    return absl::OkStatus();
  }

  absl::Span<const float> output(size_t i) const override {
    const NodeId id = graph_.outputs()[i];
    const Node& n = graph_.node(id);
    const auto* p = reinterpret_cast<const float*>(static_cast<const uint8_t*>(readback_->data()) +
                                                   readback_offset_[i]);
    return absl::MakeConstSpan(p, static_cast<size_t>(n.rows * n.cols));
  }
  const Graph& graph() const override { return graph_; }
  size_t arena_bytes() const override { return plan_.arena_bytes; }

 private:
  static constexpr size_t kFaultWord = 0;
  static constexpr size_t kSymWord = 16;

  // The tiled mat-mat for a prefill chunk of many rows (matmul_tiled.comp:
  // why never for a batched decode step's rows), where the device has the
  // shared memory it needs (VulkanBackend::prefill_depends_on_chunk_rows
  // says the same).
  bool UseTiledMatMul(const Node& n, const Node& x) const {
    return n.op == Op::kMatMul && graph_.rows_are_one_sequence() && x.rows >= TiledMatMulMinRows(*device_) &&
           TiledMatMulAvailable(*device_);
  }

  // Weight rows per 64-invocation workgroup of the mat-vec kernels: one per
  // subgroup on a GPU; on a CPU device 8 per subgroup, since each workgroup
  // there costs tens of microseconds.
  uint32_t MatVecRowsPerGroup() const { return 64 / device_->subgroup_size() * (device_->is_cpu() ? 8 : 1); }

  uint64_t ControlAddress(size_t word) const { return control_->device_address() + word * sizeof(int32_t); }

  absl::Status Lower(const Node& n, const std::vector<uint64_t>& addr, const PlanResources& res) {
    const auto& nodes = graph_.nodes();
    auto src = [&](size_t j) { return addr[static_cast<size_t>(n.src[j])]; };
    auto src_node = [&](size_t j) -> const Node& { return nodes[static_cast<size_t>(n.src[j])]; };
    const uint64_t out = addr[static_cast<size_t>(&n - nodes.data())];
    const int64_t count = n.rows * n.cols;
    auto eltwise = [&](EltwiseOp op, uint64_t b, float f, uint32_t cols) {
      dispatches_.push_back(MakeDispatch(Kernel::kEltwise, GroupsFor(count, 256),
                                         EltwiseParams{src(0), b, out, static_cast<uint32_t>(count), op, f, cols}));
    };
    switch (n.op) {
      case Op::kGetRows: {
        const Node& w = src_node(0);
        dispatches_.push_back(MakeDispatch(*GetRowsKernel(w.dtype), static_cast<uint32_t>(n.rows),
                                           GetRowsParams{src(0), src(1), out, static_cast<uint32_t>(w.weight->row_bytes),
                                                         static_cast<uint32_t>(n.cols), static_cast<uint32_t>(n.rows)}));
        break;
      }
      case Op::kRmsNorm:
      case Op::kLayerNorm: {
        const int64_t group = src_node(1).cols;
        if (group <= 0 || n.cols % group != 0) {
          return absl::InvalidArgumentError(absl::StrCat(n.name, ": weight of ", group, " does not divide ", n.cols));
        }
        const uint64_t bias = n.op == Op::kLayerNorm && n.src.size() > 2 ? src(2) : 0;
        const int64_t groups = n.rows * (n.cols / group);
        dispatches_.push_back(MakeDispatch(Kernel::kNorm, static_cast<uint32_t>(groups),
                                           NormParams{src(0), src(1), bias, out, static_cast<uint32_t>(group),
                                                      static_cast<uint32_t>(groups), n.scalar,
                                                      n.op == Op::kLayerNorm ? 1u : 0u}));
        break;
      }
      case Op::kMatMul:
      case Op::kHeadMatMul: {
        const Node& w = src_node(0);
        const Node& x = src_node(1);
        const int64_t groups = n.op == Op::kHeadMatMul ? n.n_groups : 1;
        if (groups <= 0 || w.rows % groups != 0 || x.cols != groups * w.cols) {
          return absl::InvalidArgumentError(absl::StrCat(n.name, ": ", groups, " groups do not split weight [", w.rows,
                                                         ", ", w.cols, "] and input of ", x.cols, " columns"));
        }
        if (UseTiledMatMul(n, x)) {
          g_tiled_matmuls.fetch_add(1, std::memory_order_relaxed);
          const uint32_t tiles = GroupsFor(w.rows, kTiledMatMulTile) * GroupsFor(x.rows, kTiledMatMulTile);
          dispatches_.push_back(MakeDispatch(
              *TiledMatMulKernel(w.dtype), tiles,
              TiledMatMulParams{src(0), src(1), out, static_cast<uint32_t>(w.weight->row_bytes),
                                static_cast<uint32_t>(w.cols), static_cast<uint32_t>(x.rows),
                                static_cast<uint32_t>(w.rows), static_cast<uint32_t>(x.cols)}));
          break;
        }
        const uint32_t rows_per_group = MatVecRowsPerGroup();
        dispatches_.push_back(MakeDispatch(
            *MatMulKernel(w.dtype), static_cast<uint32_t>((w.rows + rows_per_group - 1) / rows_per_group),
            MatMulParams{src(0), src(1), out, static_cast<uint32_t>(w.weight->row_bytes),
                         static_cast<uint32_t>(w.cols), static_cast<uint32_t>(x.rows), static_cast<uint32_t>(w.rows),
                         static_cast<uint32_t>(x.cols), static_cast<uint32_t>(w.rows / groups), rows_per_group}));
        break;
      }
      case Op::kAdd: eltwise(EltwiseOp::kAdd, src(1), 0.0f, 0); break;
      case Op::kScale: eltwise(EltwiseOp::kScale, 0, n.scalar, 0); break;
      case Op::kGeluMul: eltwise(EltwiseOp::kGeluMul, src(1), 0.0f, 0); break;
      case Op::kGelu: eltwise(EltwiseOp::kGelu, 0, 0.0f, 0); break;
      case Op::kSwiGlu: eltwise(EltwiseOp::kSwiGlu, src(1), 0.0f, 0); break;
      case Op::kAddRow: eltwise(EltwiseOp::kAddRow, src(1), 0.0f, static_cast<uint32_t>(n.cols)); break;
      case Op::kSoftcap: eltwise(EltwiseOp::kSoftcap, 0, n.scalar, 0); break;
      case Op::kTakeLastRow: {
        const uint32_t cols = static_cast<uint32_t>(n.cols);
        const uint32_t last = static_cast<uint32_t>((src_node(0).rows - 1) * n.cols);
        dispatches_.push_back(MakeDispatch(Kernel::kCopy, GroupsFor(n.cols, 256),
                                           CopyParams{src(0), out, 1, 1, cols, 0, 0, last, 0, 0, 0}));
        break;
      }
      case Op::kTakeRows: {
        // get_rows.comp over an f32 "table": the activation, row by row.
        const uint32_t cols = static_cast<uint32_t>(n.cols);
        dispatches_.push_back(MakeDispatch(*GetRowsKernel(DType::kF32), static_cast<uint32_t>(n.rows),
                                           GetRowsParams{src(0), src(1), out, cols * 4, cols,
                                                         static_cast<uint32_t>(n.rows)}));
        break;
      }
      case Op::kHeadSlice: {
        const HeadSliceAttrs& a = n.head_slice;
        const uint32_t g = static_cast<uint32_t>(a.n_groups), w = static_cast<uint32_t>(a.width),
                       c = static_cast<uint32_t>(a.count);
        dispatches_.push_back(MakeDispatch(
            Kernel::kCopy, GroupsFor(count, 256),
            CopyParams{src(0), out, static_cast<uint32_t>(n.rows), g, c, g * w, w, static_cast<uint32_t>(a.begin),
                       g * c, c, 0}));
        break;
      }
      case Op::kHeadConcat: {
        const uint32_t g = static_cast<uint32_t>(n.n_groups);
        const uint32_t wa = static_cast<uint32_t>(src_node(0).cols / g), wb = static_cast<uint32_t>(src_node(1).cols / g);
        const uint32_t rows = static_cast<uint32_t>(n.rows);
        dispatches_.push_back(MakeDispatch(Kernel::kCopy, GroupsFor(int64_t{rows} * g * wa, 256),
                                           CopyParams{src(0), out, rows, g, wa, g * wa, wa, 0, g * (wa + wb), wa + wb, 0}));
        dispatches_.push_back(MakeDispatch(Kernel::kCopy, GroupsFor(int64_t{rows} * g * wb, 256),
                                           CopyParams{src(1), out, rows, g, wb, g * wb, wb, 0, g * (wa + wb), wa + wb, wa}));
        break;
      }
      case Op::kRope: {
        const RopeAttrs& a = n.rope;
        const uint64_t row0 = static_cast<uint64_t>(a.variant) * static_cast<uint64_t>(n.rows) *
                              static_cast<uint64_t>(a.rot_dims / 2) * sizeof(float);
        dispatches_.push_back(MakeDispatch(
            Kernel::kRope, GroupsFor(count, 256),
            RopeParams{src(0), src(1) + row0, src(2) + row0, out, static_cast<uint32_t>(n.rows),
                       static_cast<uint32_t>(a.n_heads), static_cast<uint32_t>(a.head_dim),
                       static_cast<uint32_t>(a.rot_dims), a.pairing == RopePairing::kAdjacent ? 1u : 0u}));
        break;
      }
      case Op::kKvWrite: {
        const KvWriteAttrs& a = n.kv_write;
        const Node& x = src_node(0);
        if (auto s = CheckKvTable(n, src_node(1), x.rows, a.layer, res); !s.ok()) return s;
        const KvLayout& kl = res.kv_layout;
        if (a.n_kv_heads != kl.n_kv_heads || a.head_dim != (a.is_v ? kl.v_dim : kl.k_dim) || (a.is_v && kl.v_in_k)) {
          return absl::InvalidArgumentError(absl::StrCat(n.name, ": KV geometry mismatch"));
        }
        uint64_t offsets = ControlAddress(kSymWord);
        if (a.offset_path == KvOffsetPath::kDeviceOffset) {
          const Node& off = src_node(2);
          if (off.dtype != DType::kI32 || off.rows * off.cols != x.rows) {
            return absl::InvalidArgumentError(absl::StrCat(n.name, ": offset node ", off.name, " is not i32 [1, ",
                                                           x.rows, "]"));
          }
          offsets = src(2);
        }
        dispatches_.push_back(MakeDispatch(
            Kernel::kKvWrite, GroupsFor(x.rows * a.n_kv_heads * a.head_dim, 256),
            KvWriteParams{src(0), src(1), offsets, ControlAddress(kFaultWord), static_cast<uint32_t>(x.rows),
                          static_cast<uint32_t>(a.n_kv_heads), static_cast<uint32_t>(a.head_dim),
                          static_cast<uint32_t>(a.layer), static_cast<uint32_t>(KvRowStride(res.kv_layers)),
                          a.is_v ? 1u : 0u}));
        break;
      }
      case Op::kAttention: {
        const AttentionAttrs& a = n.attention;
        if (auto s = CheckKvTable(n, src_node(2), n.rows, a.layer, res); !s.ok()) return s;
        const KvLayout& kl = res.kv_layout;
        if (a.n_kv_heads != kl.n_kv_heads || a.k_dim != kl.k_dim || a.v_dim != kl.v_dim || a.v_in_k != kl.v_in_k ||
            a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0) {
          return absl::InvalidArgumentError(absl::StrCat(n.name, ": KV geometry mismatch"));
        }
        const uint64_t bounds = src(1) + static_cast<uint64_t>(a.variant) * static_cast<uint64_t>(n.rows) * 2 * 4;
        dispatches_.push_back(MakeDispatch(
            Kernel::kAttention, static_cast<uint32_t>(n.rows * a.n_heads),
            AttentionParams{src(0), bounds, src(2), out, static_cast<uint32_t>(n.rows),
                            static_cast<uint32_t>(a.n_heads), static_cast<uint32_t>(a.n_kv_heads),
                            static_cast<uint32_t>(a.k_dim), static_cast<uint32_t>(a.v_dim),
                            static_cast<uint32_t>(a.v_in_k ? a.k_dim : a.v_dim), static_cast<uint32_t>(a.layer),
                            static_cast<uint32_t>(KvRowStride(res.kv_layers)), a.scale, a.softcap}));
        break;
      }
      case Op::kMoeFfn: {
        const MoeRouting& r = n.moe;
        const Node& gate_w = src_node(2);
        const Node& up_w = src_node(3);
        const Node& down_w = src_node(4);
        const int64_t per = r.n_group > 0 ? r.n_expert / r.n_group : 0;
        if (r.k < 1 || r.k > r.n_expert || r.n_group < 1 || r.n_expert % r.n_group != 0 || r.topk_group < 1 ||
            r.topk_group > r.n_group || r.k > r.topk_group * per || src_node(1).cols != r.n_expert ||
            gate_w.weight->planes != r.n_expert || up_w.weight->planes != r.n_expert ||
            down_w.weight->planes != r.n_expert || up_w.rows != gate_w.rows || down_w.cols != gate_w.rows ||
            down_w.rows != gate_w.cols || (r.has_bias && (n.src.size() < 6 || src_node(5).cols != r.n_expert))) {
          return absl::InvalidArgumentError(absl::StrCat(n.name, ": inconsistent routing or expert shapes"));
        }
        const MoeWorkspace ws(graph_, n);
        const uint64_t base = moe_workspace_->device_address();
        const uint32_t rows = static_cast<uint32_t>(n.rows), k = static_cast<uint32_t>(r.k);
        const uint32_t pairs = rows * k, ffn = static_cast<uint32_t>(gate_w.rows),
                       hidden = static_cast<uint32_t>(gate_w.cols);
        MoeParams route{src(1), r.has_bias ? src(5) : 0, base + ws.ids, base + ws.weights, base + ws.scratch,
                        base + ws.down, out, rows, static_cast<uint32_t>(r.n_expert), k,
                        r.gating == MoeGating::kSigmoid ? 1u : 0u, r.norm_topk_prob ? 1u : 0u,
                        static_cast<uint32_t>(r.n_group), static_cast<uint32_t>(r.topk_group),
                        r.group_score == MoeGroupScore::kTop2Sum ? 1u : 0u, r.has_bias ? 1u : 0u, 0u, hidden,
                        r.scale};
        dispatches_.push_back(MakeDispatch(Kernel::kMoe, GroupsFor(rows, 64), route));
        const uint32_t rows_per_group = MatVecRowsPerGroup();
        auto experts = [&](const Node& w, uint64_t x, uint64_t dst, uint32_t x_stride, uint32_t x_div) {
          const WeightTensor& wt = *w.weight;
          dispatches_.push_back(MakeDispatch(
              *MoeMatMulKernel(w.dtype), GroupsFor(w.rows, rows_per_group),
              MoeMatMulParams{addr[static_cast<size_t>(&w - nodes.data())], x, dst, base + ws.ids,
                              static_cast<uint64_t>(wt.rows) * wt.row_bytes, static_cast<uint32_t>(wt.row_bytes),
                              static_cast<uint32_t>(w.cols), pairs, static_cast<uint32_t>(w.rows), x_stride, x_div,
                              rows_per_group}));
        };
        experts(gate_w, src(0), base + ws.gate, hidden, k);
        experts(up_w, src(0), base + ws.up, hidden, k);
        dispatches_.push_back(MakeDispatch(Kernel::kEltwise, GroupsFor(int64_t{pairs} * ffn, 256),
                                           EltwiseParams{base + ws.gate, base + ws.up, base + ws.gate, pairs * ffn,
                                                         EltwiseOp::kSwiGlu, 0.0f, 0}));
        experts(down_w, base + ws.gate, base + ws.down, ffn, 1);
        MoeParams combine = route;
        combine.mode = 1;
        dispatches_.push_back(MakeDispatch(Kernel::kMoe, GroupsFor(int64_t{rows} * hidden, 64), combine));
        break;
      }
      case Op::kWeight:
      case Op::kInput:
      case Op::kConst:
        break;
    }
    return absl::OkStatus();
  }

  static absl::Status CheckKvTable(const Node& n, const Node& table, int64_t rows, int32_t layer,
                                   const PlanResources& res) {
    if (layer < 0 || layer >= res.kv_layers) {
      return absl::InvalidArgumentError(absl::StrCat(n.name, ": layer ", layer, " outside the KV caches' ",
                                                     res.kv_layers));
    }
    if (table.dtype != DType::kI64 || table.cols != KvRowStride(res.kv_layers) || table.rows != rows) {
      return absl::InvalidArgumentError(absl::StrCat(n.name, ": KV binding table ", table.name, " is not i64 [", rows,
                                                     ", ", KvRowStride(res.kv_layers), "]"));
    }
    return absl::OkStatus();
  }

  absl::Status Record() {
    auto layout = device_->pipelines().Layout();
    if (!layout.ok()) return layout.status();
    if (auto s = device_->Check(vkResetCommandPool(device_->device(), pool_, 0), "vkResetCommandPool"); !s.ok()) {
      return s;
    }
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    if (auto s = device_->Check(vkBeginCommandBuffer(cb_, &bi), "vkBeginCommandBuffer"); !s.ok()) return s;
    VkMemoryBarrier between{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    between.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    between.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    Kernel bound = Kernel::kCount;
    for (size_t i = 0; i < dispatches_.size(); ++i) {
      const Dispatch& d = dispatches_[i];
      if (d.kernel != bound) {
        auto pipeline = device_->pipelines().Get(d.kernel);
        if (!pipeline.ok()) return pipeline.status();
        vkCmdBindPipeline(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, *pipeline);
        bound = d.kernel;
      }
      vkCmdPushConstants(cb_, *layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, d.push_bytes, d.push);
      const uint32_t gx = std::min(d.groups, kMaxGroupsX);
      const uint32_t gy = (d.groups + gx - 1) / gx;
      if (d.groups > 0) vkCmdDispatch(cb_, gx, gy, 1);
      if (i + 1 < dispatches_.size()) {
        vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                             &between, 0, nullptr, 0, nullptr);
      }
    }
    // The outputs into the host-read buffer, then the host reads them (and
    // the fault word) after the wait.
    VkMemoryBarrier to_copy{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    to_copy.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    to_copy.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT;
    vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &to_copy, 0,
                         nullptr, 0, nullptr);
    for (size_t i = 0; i < graph_.outputs().size(); ++i) {
      const NodeId id = graph_.outputs()[i];
      VkBufferCopy region{static_cast<VkDeviceSize>(plan_.arena_offset[static_cast<size_t>(id)]), readback_offset_[i],
                          graph_.node(id).bytes()};
      vkCmdCopyBuffer(cb_, arena_->buffer(), readback_->buffer(), 1, &region);
    }
    VkMemoryBarrier to_host{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    to_host.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    to_host.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &to_host, 0, nullptr, 0, nullptr);
    if (auto s = device_->Check(vkEndCommandBuffer(cb_), "vkEndCommandBuffer"); !s.ok()) return s;
    recorded_ = true;
    g_recordings.fetch_add(1, std::memory_order_relaxed);
    g_dispatches.fetch_add(static_cast<int64_t>(dispatches_.size()), std::memory_order_relaxed);
    return absl::OkStatus();
  }

  std::shared_ptr<Device> device_;
  Graph graph_;
  MemoryPlan plan_;
  PlanOptions options_;
  std::unique_ptr<Buffer> consts_, arena_, control_;
  std::unique_ptr<Buffer> moe_workspace_;  // MoE intermediates (MoeWorkspace), when the graph has MoE nodes
  std::unique_ptr<Buffer> readback_;       // the outputs, copied from the arena at the end of each run
  std::vector<size_t> readback_offset_;    // per graph output
  int64_t sym_rows_ = 0;
  std::vector<Dispatch> dispatches_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cb_ = VK_NULL_HANDLE;
  bool recorded_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CompiledPlan>> CompilePlan(std::shared_ptr<Device> device, WeightStore& weights,
                                                          Graph graph, MemoryPlan plan,
                                                          const PlanResources& resources, const PlanOptions& options) {
  auto p = std::make_unique<Plan>(std::move(device), std::move(graph), std::move(plan), options);
  if (auto s = p->Init(weights, resources); !s.ok()) return s;
  return std::unique_ptr<CompiledPlan>(std::move(p));
}

}  // namespace decoded::vulkan
