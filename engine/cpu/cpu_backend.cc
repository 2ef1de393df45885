// The CPU backend: host buffers, and plans that run on a CpuExecutor team.
//
// A compiled plan is a flat list of steps with every pointer resolved at
// compile time. Run() enters one parallel region; each team member walks the
// whole list, does its share of each step, and meets the others at a barrier
// between steps.
//
// A matmul lowers to two steps: quantize its f32 input into the weight type's
// activation rows (quant::ActivationType), then the matmul on those rows.
// Matmuls of one input whose weight types share an activation type (q/k/v,
// gate/up) share one quantization.
#include <algorithm>
#include <limits>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "engine/backend.h"
#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/key_panels.h"
#include "engine/engine_counters.h"
#include "engine/kv_layout.h"
#include "engine/kv_rows.h"
#include "engine/quant/quant.h"

namespace decoded {
namespace {

constexpr size_t kBufferAlign = 64;

// Stores one KV row of `n` f32 elements as KV type `type` (engine/kv_layout.h):
// f16 rounds to nearest even; q8_0 is ggml's reference quantizer
// (quantize_row_q8_0_ref, via quant::QuantizeActivationRow), so the bytes
// match what llama.cpp's reference path would store.
void WriteKvRow(DType type, const float* x, int32_t n, uint8_t* dst) {
  switch (type) {
    case DType::kF16:
      for (int32_t i = 0; i < n; ++i) {
        const uint16_t h = quant::F32ToF16(x[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case DType::kQ8_0: quant::QuantizeActivationRow(DType::kQ8_0, x, n, dst); return;
    default: std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float)); return;
  }
}

// Stores one key of `n` f32 elements, at `in_block` of its block, into a
// kv head's block of key panels (engine/cpu/key_panels.h) as `type` (f32 or
// f16, rounded as WriteKvRow).
void WriteKeyToPanel(DType type, const float* x, int32_t n, int32_t in_block, uint8_t* head_block) {
  for (int32_t d = 0; d < n; ++d) {
    const int64_t e = cpu::PanelElement(in_block, n, d);
    if (type == DType::kF16) {
      const uint16_t h = quant::F32ToF16(x[d]);
      std::memcpy(head_block + 2 * e, &h, 2);
    } else {
      std::memcpy(head_block + 4 * e, &x[d], 4);
    }
  }
}

// Buffers of at least this size are mapped straight from the kernel and
// unmapped when freed. glibc's malloc raises its own mmap threshold to the
// largest block freed (up to 32 MiB), after which arenas and KV caches of a
// few MiB would come from the heap and, freed in another order, stay there:
// a daemon whose sessions and batch plans come and go would keep their peak.
constexpr size_t kMapThreshold = size_t{1} << 20;

// Bytes of every live CpuBuffer (Backend::allocated_bytes).
std::atomic<int64_t> g_buffer_bytes{0};

class CpuBuffer final : public DeviceBuffer {
 public:
  static std::unique_ptr<CpuBuffer> Create(size_t bytes) {
    const size_t rounded = (bytes + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
    if (rounded >= kMapThreshold) {
      // Page-aligned, and committed page by page as it is first written, so
      // a session's resident KV grows with its live length.
      void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      return std::unique_ptr<CpuBuffer>(new CpuBuffer(p, bytes, rounded));
    }
    void* p = std::aligned_alloc(kBufferAlign, rounded == 0 ? kBufferAlign : rounded);
    // Not zeroed: every byte is written before it is read (kernels read KV
    // rows below the step's bounds only).
    if (p == nullptr) return nullptr;
    return std::unique_ptr<CpuBuffer>(new CpuBuffer(p, bytes, 0));
  }
  ~CpuBuffer() override {
    g_buffer_bytes.fetch_sub(static_cast<int64_t>(size_), std::memory_order_relaxed);
    if (mapped_ > 0) {
      munmap(data_, mapped_);
    } else {
      std::free(data_);
    }
  }
  void* data() override { return data_; }
  const void* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  CpuBuffer(void* p, size_t n, size_t mapped) : data_(p), size_(n), mapped_(mapped) {
    g_buffer_bytes.fetch_add(static_cast<int64_t>(size_), std::memory_order_relaxed);
  }
  void* data_;
  size_t size_;
  size_t mapped_;  // bytes mapped (0: from malloc)
};

size_t AlignUp(size_t n) { return (n + kBufferAlign - 1) / kBufferAlign * kBufferAlign; }

bool IsMatMul(Op op) { return op == Op::kMatMul || op == Op::kHeadMatMul; }

// Scratch for quantized activations, in slots: a slot is taken by one
// conversion until the last matmul reading it has been emitted, then free for
// the next, and is as large as the largest conversion it holds. A layer's
// conversions run one after another, so a plan needs a slot or two, not one
// buffer per conversion of every layer.
class ScratchSlots {
 public:
  int32_t Acquire(size_t bytes) {
    // The smallest free slot that fits, else the largest free one (grown).
    int32_t pick = -1;
    for (int32_t i = 0; i < static_cast<int32_t>(bytes_.size()); ++i) {
      if (busy_[i]) continue;
      if (pick < 0) {
        pick = i;
        continue;
      }
      const bool fits = bytes_[i] >= bytes, pick_fits = bytes_[pick] >= bytes;
      if (fits != pick_fits ? fits : (fits ? bytes_[i] < bytes_[pick] : bytes_[i] > bytes_[pick])) pick = i;
    }
    if (pick < 0) {
      pick = static_cast<int32_t>(bytes_.size());
      bytes_.push_back(0);
      busy_.push_back(false);
    }
    bytes_[pick] = std::max(bytes_[pick], bytes);
    busy_[pick] = true;
    return pick;
  }
  void Release(int32_t slot) { busy_[slot] = false; }
  // Slot offsets in one buffer, each 64-byte aligned; returns the buffer size.
  size_t Layout(std::vector<size_t>& offsets) const {
    size_t end = 0;
    for (size_t b : bytes_) {
      offsets.push_back(end);
      end += AlignUp(b);
    }
    return end;
  }

 private:
  std::vector<size_t> bytes_;
  std::vector<char> busy_;
};

// Which rows a node's rows are, so a step can skip a held plan's padding
// rows (SymEnv::live_rows): a token row's (embedding rows and everything
// computed row by row from them), an output row's (take_rows and after), or
// neither (every row is computed).
enum class RowRole : uint8_t { kNone, kToken, kOutput };

std::vector<RowRole> RowRoles(const Graph& graph) {
  const auto& nodes = graph.nodes();
  std::vector<RowRole> role(nodes.size(), RowRole::kNone);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    switch (n.op) {
      case Op::kGetRows: role[i] = RowRole::kToken; continue;
      case Op::kTakeRows: role[i] = RowRole::kOutput; continue;
      case Op::kTakeLastRow:
      case Op::kInput:
      case Op::kWeight:
      case Op::kConst: continue;
      default: break;
    }
    // Every other op computes its row r from row r of its activation
    // sources; sources of two roles (none in today's graphs) keep all rows.
    RowRole r = RowRole::kNone;
    bool mixed = false;
    for (NodeId src : n.src) {
      const RowRole sr = role[static_cast<size_t>(src)];
      if (sr == RowRole::kNone) continue;
      mixed |= r != RowRole::kNone && r != sr;
      r = sr;
    }
    role[i] = mixed ? RowRole::kNone : r;
  }
  return role;
}

struct Step {
  Op op = Op::kConst;
  RowRole role = RowRole::kNone;  // of the step's output rows (a quantize step: of its input's)
  const Node* node = nullptr;  // a quantize step's is the first matmul reading it
  float* out = nullptr;
  const void* src[5] = {};
  // quantize: src[0] f32 [rows, k] -> rows of ActivationType(act_weight), xq_row_bytes apart, at out
  bool quantize = false;
  DType act_weight = DType::kF32;
  int32_t scratch_slot = -1;  // quantize: out; matmul: src[1]
  // quantize and matmul
  size_t w_row_bytes = 0;
  size_t xq_row_bytes = 0;
  int64_t k = 0;
  // kv write / attention: the step's KV binding table (engine/kv_rows.h)
  const int64_t* kv_rows = nullptr;
  int64_t kv_row_stride = 0;
  int64_t rows = 0;  // rows of the step's main input
  cpu::MoeFfnArgs moe;  // kMoeFfn, workspace in the plan's moe_workspace_
};

class CpuPlan final : public CompiledPlan {
 public:
  CpuPlan(Graph graph, MemoryPlan plan) : graph_(std::move(graph)), plan_(std::move(plan)) {}

  absl::Status Init(const PlanResources& res) {
    arena_ = CpuBuffer::Create(plan_.arena_bytes);
    if (!arena_) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", plan_.arena_bytes, "-byte arena"));
    const auto& nodes = graph_.nodes();
    auto ptr = [&](NodeId id) -> const void* {
      const Node& n = nodes[static_cast<size_t>(id)];
      switch (n.op) {
        case Op::kWeight: return n.weight->data;
        case Op::kInput: return res.inputs[static_cast<size_t>(n.input_slot)]->data();
        case Op::kConst: return n.const_bytes.data();
        case Op::kKvWrite: return nullptr;
        default: return static_cast<uint8_t*>(arena_->data()) + plan_.arena_offset[static_cast<size_t>(id)];
      }
    };
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      if (n.op == Op::kInput) {
        DeviceBuffer* b = res.inputs[static_cast<size_t>(n.input_slot)];
        if (b == nullptr || b->size() < n.bytes()) {
          return absl::InvalidArgumentError(absl::StrCat("input node ", n.name, " needs ", n.bytes(),
                                                         " bytes; its binding has ", b ? b->size() : 0));
        }
      }
    }
    // Weight types the kernels lack are refused here. And each conversion's
    // last reader: its scratch slot is free once that matmul is emitted.
    using ConversionKey = std::pair<NodeId, DType>;  // (input node, activation type)
    std::map<ConversionKey, size_t> last_reader;     // -> schedule index
    for (size_t i = 0; i < plan_.schedule.size(); ++i) {
      const Node& n = nodes[static_cast<size_t>(plan_.schedule[i])];
      if (!IsMatMul(n.op)) continue;
      const Node& w = nodes[static_cast<size_t>(n.src[0])];
      if (w.op != Op::kWeight) {
        return absl::InvalidArgumentError(absl::StrCat("matmul ", n.name, ": ", w.name, " is not a weight"));
      }
      if (!quant::IsSupportedWeightType(w.dtype)) {
        return absl::InvalidArgumentError(absl::StrCat("matmul ", n.name, ": weight type ", DTypeName(w.dtype),
                                                       " is not supported"));
      }
      last_reader[{n.src[1], quant::ActivationType(w.dtype)}] = i;
    }
    std::map<ConversionKey, int32_t> live_conversions;  // -> scratch slot
    const std::vector<RowRole> roles = RowRoles(graph_);
    ScratchSlots slots;
    int64_t conversions = 0;
    size_t moe_workspace_bytes = 0;
    for (size_t i = 0; i < plan_.schedule.size(); ++i) {
      const NodeId id = plan_.schedule[i];
      const Node& n = nodes[static_cast<size_t>(id)];
      Step s;
      s.op = n.op;
      s.role = roles[static_cast<size_t>(id)];
      s.node = &n;
      if (n.op != Op::kKvWrite) s.out = static_cast<float*>(const_cast<void*>(ptr(id)));
      for (size_t j = 0; j < n.src.size() && j < 5; ++j) s.src[j] = ptr(n.src[j]);
      if (!n.src.empty()) s.rows = nodes[static_cast<size_t>(n.src[0])].rows;
      if (IsMatMul(n.op)) {
        const Node& w = nodes[static_cast<size_t>(n.src[0])];
        const Node& x = nodes[static_cast<size_t>(n.src[1])];
        s.w_row_bytes = w.weight->row_bytes;
        s.k = w.cols;
        s.xq_row_bytes = quant::ActivationRowBytes(w.dtype, x.cols);
        if (n.op == Op::kHeadMatMul) {
          const int64_t g = n.n_groups;
          if (g <= 0 || w.rows % g != 0 || x.cols != g * w.cols ||
              quant::ActivationRowBytes(w.dtype, w.cols) * static_cast<size_t>(g) != s.xq_row_bytes) {
            return absl::InvalidArgumentError(absl::StrCat(n.name, ": ", g, " groups do not split weight [", w.rows,
                                                           ", ", w.cols, "] and input of ", x.cols, " columns"));
          }
        }
      }
      if (n.op == Op::kKvWrite || n.op == Op::kAttention) {
        const int32_t layer = n.op == Op::kKvWrite ? n.kv_write.layer : n.attention.layer;
        if (layer < 0 || layer >= res.kv_layers) {
          return absl::InvalidArgumentError(absl::StrCat(n.name, ": layer ", layer, " outside the KV caches' ",
                                                         res.kv_layers));
        }
        // The binding table: one row per token row, as wide as the layers.
        const NodeId table = n.src[n.op == Op::kKvWrite ? 1 : 2];
        const Node& t = nodes[static_cast<size_t>(table)];
        const Node& x = nodes[static_cast<size_t>(n.src[0])];
        if (t.dtype != DType::kI64 || t.cols != KvRowStride(res.kv_layers) || t.rows != x.rows) {
          return absl::InvalidArgumentError(absl::StrCat(n.name, ": KV binding table ", t.name, " is not i64 [",
                                                         x.rows, ", ", KvRowStride(res.kv_layers), "]"));
        }
        s.kv_rows = static_cast<const int64_t*>(ptr(table));
        s.kv_row_stride = t.cols;
        const KvLayout& kl = res.kv_layout;
        if (n.op == Op::kKvWrite) {
          const KvWriteAttrs& a = n.kv_write;
          if (a.n_kv_heads != kl.n_kv_heads || a.head_dim != (a.is_v ? kl.v_dim : kl.k_dim) ||
              (a.is_v && kl.v_in_k)) {
            return absl::InvalidArgumentError(absl::StrCat(n.name, ": KV geometry mismatch"));
          }
          if (a.offset_path == KvOffsetPath::kDeviceOffset) {
            const Node& off = nodes[static_cast<size_t>(n.src[2])];
            if (off.dtype != DType::kI32 || off.rows * off.cols != x.rows) {
              return absl::InvalidArgumentError(absl::StrCat(n.name, ": offset node ", off.name, " is not i32 [1, ",
                                                             x.rows, "]"));
            }
          }
        } else {
          const AttentionAttrs& a = n.attention;
          if (a.n_kv_heads != kl.n_kv_heads || a.k_dim != kl.k_dim || a.v_dim != kl.v_dim || a.v_in_k != kl.v_in_k ||
              a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0) {
            return absl::InvalidArgumentError(absl::StrCat(n.name, ": KV geometry mismatch"));
          }
          if (a.v_dim > cpu::kMaxValueDim) {
            return absl::InvalidArgumentError(absl::StrCat(n.name, ": value width ", a.v_dim, " exceeds ",
                                                           cpu::kMaxValueDim));
          }
          if (a.k_dim > cpu::kMaxKeyDim) {
            return absl::InvalidArgumentError(absl::StrCat(n.name, ": key width ", a.k_dim, " exceeds ",
                                                           cpu::kMaxKeyDim));
          }
        }
      }
      if (n.op == Op::kMoeFfn) {
        auto expert = [&](size_t j) {
          const WeightTensor& w = *nodes[static_cast<size_t>(n.src[j])].weight;
          return cpu::MoeExpertMatrix{w.type, w.data, w.row_bytes, w.rows, w.cols};
        };
        s.moe = {.x = static_cast<const float*>(s.src[0]),
                 .router_logits = static_cast<const float*>(s.src[1]),
                 .gate = expert(2),
                 .up = expert(3),
                 .down = expert(4),
                 .out = s.out,
                 .rows = n.rows,
                 .routing = n.moe,
                 .selection_bias = n.moe.has_bias ? static_cast<const float*>(ptr(n.src[5])) : nullptr};
        const MoeRouting& r = n.moe;
        const int32_t per = r.n_group > 0 ? r.n_expert / r.n_group : 0;
        if (r.k < 1 || r.k > r.n_expert || r.n_group < 1 || r.n_expert % r.n_group != 0 || r.topk_group < 1 ||
            r.topk_group > r.n_group || r.k > r.topk_group * per ||
            (r.n_group > 1 && r.group_score == MoeGroupScore::kTop2Sum && per < 2) ||
            (r.has_bias && (n.src.size() < 6 || nodes[static_cast<size_t>(n.src[5])].cols != r.n_expert ||
                             nodes[static_cast<size_t>(n.src[5])].dtype != DType::kF32))) {
          return absl::InvalidArgumentError(absl::StrCat(n.name, ": inconsistent routing (", r.n_expert, " experts, k ",
                                                         r.k, ", ", r.n_group, " groups, ", r.topk_group,
                                                         " kept)"));
        }
        moe_workspace_bytes = std::max(moe_workspace_bytes, cpu::MoeFfnWorkspaceBytes(s.moe));
      }
      if (!IsMatMul(n.op)) {
        steps_.push_back(s);
        continue;
      }
      const Node& w = nodes[static_cast<size_t>(n.src[0])];
      const Node& x = nodes[static_cast<size_t>(n.src[1])];
      const ConversionKey key{n.src[1], quant::ActivationType(w.dtype)};
      auto [conv, fresh] = live_conversions.emplace(key, -1);
      if (fresh) {
        Step q;
        q.quantize = true;
        q.role = roles[static_cast<size_t>(n.src[1])];
        q.node = &n;
        q.act_weight = w.dtype;
        q.src[0] = ptr(n.src[1]);
        q.rows = x.rows;
        q.k = x.cols;
        q.xq_row_bytes = s.xq_row_bytes;
        q.scratch_slot = conv->second = slots.Acquire(s.xq_row_bytes * static_cast<size_t>(x.rows));
        steps_.push_back(q);
        ++conversions;
      }
      s.scratch_slot = conv->second;
      steps_.push_back(s);
      if (last_reader[key] == i) {
        slots.Release(conv->second);
        live_conversions.erase(conv);
      }
    }
    std::vector<size_t> slot_offsets;
    scratch_bytes_ = slots.Layout(slot_offsets);
    if (scratch_bytes_ > 0) {
      scratch_ = CpuBuffer::Create(scratch_bytes_);
      if (!scratch_) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", scratch_bytes_,
                                                         " bytes of activation scratch"));
      }
      auto* base = static_cast<uint8_t*>(scratch_->data());
      for (Step& st : steps_) {
        if (st.scratch_slot < 0) continue;
        uint8_t* p = base + slot_offsets[static_cast<size_t>(st.scratch_slot)];
        if (st.quantize) {
          st.out = reinterpret_cast<float*>(p);
        } else {
          st.src[1] = p;
        }
      }
    }
    // One workspace serves every MoE step: steps run one after another.
    if (moe_workspace_bytes > 0) {
      moe_workspace_ = CpuBuffer::Create(moe_workspace_bytes);
      if (!moe_workspace_) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", moe_workspace_bytes,
                                                         "-byte MoE workspace"));
      }
      for (Step& st : steps_) st.moe.workspace = moe_workspace_->data();
    }
    counters::AddCpuActivationQuantizations(conversions);
    return absl::OkStatus();
  }

  absl::Status Run(Executor& executor, const SymEnv& env) override {
    auto* cpu = dynamic_cast<CpuExecutor*>(&executor);
    if (cpu == nullptr) return absl::InvalidArgumentError("a CPU plan needs a CPU executor");
    env_ = &env;
    exec_ = cpu;
    kv_fault_.store(false, std::memory_order_relaxed);
    cpu->Parallel(&CpuPlan::Region, this);
    if (kv_fault_.load(std::memory_order_relaxed)) {
      return absl::InternalError("KV write offset outside the cache at run time");
    }
    return absl::OkStatus();
  }

  absl::Span<const float> output(size_t i) const override {
    const NodeId id = graph_.outputs()[i];
    const Node& n = graph_.node(id);
    const auto* p = reinterpret_cast<const float*>(static_cast<const uint8_t*>(arena_->data()) +
                                                   plan_.arena_offset[static_cast<size_t>(id)]);
    return absl::MakeConstSpan(p, static_cast<size_t>(n.rows * n.cols));
  }
  const Graph& graph() const override { return graph_; }
  // Every intermediate: the optimizer's arena and the activation scratch.
  size_t arena_bytes() const override { return plan_.arena_bytes + scratch_bytes_; }

 private:
  static void Region(void* ctx, int ith, int nth) {
    auto* self = static_cast<CpuPlan*>(ctx);
    const size_t n = self->steps_.size();
    for (size_t i = 0; i < n; ++i) {
      self->RunStep(self->steps_[i], ith, nth);
      self->exec_->Barrier();
    }
  }

  // How many of `rows` rows step `s` computes: all but the step's padding
  // rows (SymEnv::live_rows), which come last; except that 2 or 3 rows past
  // the quantized matmuls' 4-row activation tiles
  // (quant::kMatMulActivationTile) are rounded up to a whole tile where the plan
  // has the padding rows: those kernels take such a tail one row at a time,
  // re-decoding the weights per row, and a whole tile costs less (batched
  // decode, Gemma 3, 2 threads: 7 live rows of the 8-row plan 0.80x the
  // padded plan's rate, 1.02x with the round-up; docs/benchmarks.md). The
  // padding rows are valid rows (token 0 at position 0 of the pad cache), and
  // a row's bits do not depend on the rows beside it.
  int64_t Live(const Step& s, int64_t rows) const {
    const int32_t live = s.role == RowRole::kToken    ? env_->live_rows
                         : s.role == RowRole::kOutput ? env_->live_outputs
                                                      : SymEnv::kAllRows;
    if (live == SymEnv::kAllRows) return rows;
    constexpr int64_t kTile = quant::kMatMulActivationTile;
    int64_t n = std::max(live, 0);
    if (n >= kTile && n % kTile >= 2) n = (n + kTile - 1) / kTile * kTile;
    return std::min(rows, n);
  }

  void RunStep(const Step& s, int ith, int nth) {
    if (s.quantize) {
      int64_t b, e;
      cpu::Share(Live(s, s.rows), ith, nth, &b, &e);
      for (int64_t r = b; r < e; ++r) {
        quant::QuantizeActivationRow(s.act_weight, static_cast<const float*>(s.src[0]) + r * s.k, s.k,
                                     reinterpret_cast<uint8_t*>(s.out) + r * s.xq_row_bytes);
      }
      return;
    }
    const Node& n = *s.node;
    // Row-wise ops run on the live rows; n.rows stays the plan's row count
    // where it locates a row's per-step data (rope tables, mask variants).
    const int64_t rows = Live(s, n.rows);
    const int64_t count = rows * n.cols;
    switch (n.op) {
      case Op::kGetRows: {
        const auto* table = static_cast<const uint8_t*>(s.src[0]);
        const auto* ids = static_cast<const int32_t*>(s.src[1]);
        const WeightTensor& w = *graph_.node(n.src[0]).weight;
        int64_t b, e;
        cpu::Share(rows, ith, nth, &b, &e);
        for (int64_t r = b; r < e; ++r) {
          quant::DequantizeRow(w.type, table + static_cast<size_t>(ids[r]) * w.row_bytes, s.out + r * n.cols, n.cols);
        }
        break;
      }
      case Op::kRmsNorm:
        cpu::RmsNormRows(static_cast<const float*>(s.src[0]), static_cast<const float*>(s.src[1]), s.out, rows,
                         n.cols, graph_.node(n.src[1]).cols, n.scalar, ith, nth);
        break;
      case Op::kLayerNorm:
        cpu::LayerNormRows(static_cast<const float*>(s.src[0]), static_cast<const float*>(s.src[1]),
                           n.src.size() > 2 ? static_cast<const float*>(s.src[2]) : nullptr, s.out, rows, n.cols,
                           graph_.node(n.src[1]).cols, n.scalar, ith, nth);
        break;
      case Op::kMatMul: {
        const Node& w = graph_.node(n.src[0]);
        int64_t b, e;
        cpu::Share(w.rows, ith, nth, &b, &e);
        if (b < e) {
          quant::MatMul(w.dtype, s.src[0], s.w_row_bytes, s.k, s.src[1], s.xq_row_bytes, rows, s.out, n.cols, b, e);
        }
        break;
      }
      case Op::kAdd:
        cpu::Add(static_cast<const float*>(s.src[0]), static_cast<const float*>(s.src[1]), s.out, count, ith, nth);
        break;
      case Op::kScale:
        cpu::Scale(static_cast<const float*>(s.src[0]), n.scalar, s.out, count, ith, nth);
        break;
      case Op::kGeluMul:
        cpu::GeluMul(static_cast<const float*>(s.src[0]), static_cast<const float*>(s.src[1]), s.out, count, ith, nth);
        break;
      case Op::kGelu:
        cpu::Gelu(static_cast<const float*>(s.src[0]), s.out, count, ith, nth);
        break;
      case Op::kSwiGlu:
        cpu::SiluMul(static_cast<const float*>(s.src[0]), static_cast<const float*>(s.src[1]), s.out, count, ith, nth);
        break;
      case Op::kAddRow:
        cpu::AddRow(static_cast<const float*>(s.src[0]), static_cast<const float*>(s.src[1]), s.out, rows, n.cols,
                    ith, nth);
        break;
      case Op::kSoftcap:
        cpu::Softcap(static_cast<const float*>(s.src[0]), n.scalar, s.out, count, ith, nth);
        break;
      case Op::kTakeLastRow:
        if (ith == 0) {
          std::memcpy(s.out, static_cast<const float*>(s.src[0]) + (s.rows - 1) * n.cols, n.cols * sizeof(float));
        }
        break;
      case Op::kTakeRows: {
        // Row numbers come from the driver, checked there; one out of range
        // (a bug) gives NaN rows, which the turn refuses, never another
        // row's logits.
        const auto* x = static_cast<const float*>(s.src[0]);
        const auto* idx = static_cast<const int32_t*>(s.src[1]);
        const int64_t x_rows = graph_.node(n.src[0]).rows;
        for (int64_t i = ith; i < rows; i += nth) {
          float* dst = s.out + i * n.cols;
          if (idx[i] < 0 || idx[i] >= x_rows) {
            std::fill(dst, dst + n.cols, std::numeric_limits<float>::quiet_NaN());
          } else {
            std::memcpy(dst, x + idx[i] * n.cols, static_cast<size_t>(n.cols) * sizeof(float));
          }
        }
        break;
      }
      case Op::kRope: {
        const RopeAttrs& a = n.rope;
        const int64_t half = a.rot_dims / 2;
        const int64_t row0 = static_cast<int64_t>(a.variant) * n.rows;
        const auto* x = static_cast<const float*>(s.src[0]);
        const float* cos = static_cast<const float*>(s.src[1]) + row0 * half;
        const float* sin = static_cast<const float*>(s.src[2]) + row0 * half;
        if (a.pairing == RopePairing::kAdjacent) {
          cpu::RopeAdjacent(x, cos, sin, s.out, rows, a.n_heads, a.head_dim, a.rot_dims, ith, nth);
        } else {
          cpu::RopeNeox(x, cos, sin, s.out, rows, a.n_heads, a.head_dim, a.rot_dims, ith, nth);
        }
        break;
      }
      case Op::kKvWrite: {
        if (ith != 0) break;
        const bool device = n.kv_write.offset_path == KvOffsetPath::kDeviceOffset;
        const auto* offsets = device ? static_cast<const int32_t*>(s.src[2]) : env_->kv_pos.data();
        if (!device && static_cast<int64_t>(env_->kv_pos.size()) < s.rows) {
          kv_fault_.store(true, std::memory_order_relaxed);
          break;
        }
        const auto* x = static_cast<const float*>(s.src[0]);
        const int32_t heads = n.kv_write.n_kv_heads, hd = n.kv_write.head_dim;
        const int64_t written = Live(s, s.rows);
        for (int64_t t = 0; t < written; ++t) {
          const KvRowView cache = ReadKvRow(s.kv_rows, s.kv_row_stride, t, n.kv_write.layer);
          uint8_t* dst = n.kv_write.is_v ? cache.v : cache.k;
          const int32_t off = offsets[t];
          const int32_t block = dst == nullptr || off < 0 || off >= cache.capacity ? -1 : cache.block_of(off);
          if (block < 0) {
            kv_fault_.store(true, std::memory_order_relaxed);
            continue;
          }
          const int32_t in_block = off % cache.block_tokens;
          const int64_t rb = KvRowBytes(cache.type, hd);
          const bool panels =
              !n.kv_write.is_v && cpu::KeysInPanels(cache.type, cache.v != cache.k, cache.block_tokens, hd);
          for (int32_t h = 0; h < heads; ++h) {
            const float* row = x + (t * heads + h) * hd;
            uint8_t* head_block = dst + cache.block_base(block, h, heads, rb);
            if (panels) {
              WriteKeyToPanel(cache.type, row, hd, in_block, head_block);
            } else {
              WriteKvRow(cache.type, row, hd, head_block + int64_t{in_block} * rb);
            }
          }
        }
        break;
      }
      case Op::kAttention: {
        const AttentionAttrs& a = n.attention;
        const auto* bounds = static_cast<const int32_t*>(s.src[1]) + static_cast<int64_t>(a.variant) * n.rows * 2;
        cpu::Attention(static_cast<const float*>(s.src[0]), bounds, s.kv_rows, s.kv_row_stride, a.layer, s.out,
                       rows, a.n_heads, a.n_kv_heads, a.k_dim, a.v_dim, a.v_in_k ? a.k_dim : a.v_dim, a.scale,
                       a.softcap, ith, nth);
        break;
      }
      case Op::kHeadSlice: {
        const HeadSliceAttrs& a = n.head_slice;
        cpu::HeadSlice(static_cast<const float*>(s.src[0]), s.out, rows, a.n_groups, a.width, a.begin, a.count,
                       ith, nth);
        break;
      }
      case Op::kHeadConcat: {
        const int32_t g = n.n_groups;
        cpu::HeadConcat(static_cast<const float*>(s.src[0]), static_cast<const float*>(s.src[1]), s.out, rows, g,
                        static_cast<int32_t>(graph_.node(n.src[0]).cols / g),
                        static_cast<int32_t>(graph_.node(n.src[1]).cols / g), ith, nth);
        break;
      }
      case Op::kHeadMatMul: {
        // Threads share the weight rows of all groups; a thread's range is
        // cut at group boundaries so each piece is one group's matmul.
        const Node& w = graph_.node(n.src[0]);
        const int64_t per = w.rows / n.n_groups;
        const size_t xq_group_bytes = s.xq_row_bytes / static_cast<size_t>(n.n_groups);
        int64_t b, e;
        cpu::Share(w.rows, ith, nth, &b, &e);
        while (b < e) {
          const int64_t g = b / per;
          const int64_t end = std::min(e, (g + 1) * per);
          quant::MatMul(w.dtype, static_cast<const uint8_t*>(s.src[0]) + static_cast<size_t>(g * per) * s.w_row_bytes,
                        s.w_row_bytes, s.k, static_cast<const uint8_t*>(s.src[1]) + g * xq_group_bytes,
                        s.xq_row_bytes, rows, s.out + g * per, n.cols, b - g * per, end - g * per);
          b = end;
        }
        break;
      }
      case Op::kMoeFfn: {
        cpu::MoeFfnArgs args = s.moe;
        args.rows = rows;
        cpu::MoeFfn(args, ith, nth, [this] { exec_->Barrier(); });
        break;
      }
      case Op::kWeight:
      case Op::kInput:
      case Op::kConst:
        break;
    }
  }

  Graph graph_;
  MemoryPlan plan_;
  std::unique_ptr<CpuBuffer> arena_;
  std::unique_ptr<CpuBuffer> moe_workspace_;
  std::unique_ptr<CpuBuffer> scratch_;  // quantized activations (ScratchSlots)
  size_t scratch_bytes_ = 0;
  std::vector<Step> steps_;
  const SymEnv* env_ = nullptr;
  CpuExecutor* exec_ = nullptr;
  std::atomic<bool> kv_fault_{false};
};

class CpuBackendImpl final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<Executor>> CreateExecutor(int threads,
                                                           const std::atomic<int>* lent_threads) override {
    return std::unique_ptr<Executor>(std::make_unique<CpuExecutor>(std::max(threads, 1), lent_threads));
  }
  int64_t allocated_bytes() const override { return g_buffer_bytes.load(std::memory_order_relaxed); }
  absl::Status CheckSupported(const Graph& graph) const override {
    for (const Node& n : graph.nodes()) {
      if (n.op != Op::kMatMul && n.op != Op::kHeadMatMul && n.op != Op::kGetRows) continue;
      const DType t = graph.node(n.src[0]).dtype;
      if (!quant::IsSupportedWeightType(t)) {
        return absl::UnimplementedError(absl::StrCat("the CPU backend has no kernel for ", OpName(n.op), " node ",
                                                     n.name, " over weight type ", DTypeName(t)));
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes, BufferAccess) override {
    auto b = CpuBuffer::Create(bytes);
    if (!b) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    return std::unique_ptr<DeviceBuffer>(std::move(b));
  }
  void Upload(DeviceBuffer& dst, const void* src, size_t bytes, size_t offset) override {
    std::memcpy(static_cast<uint8_t*>(dst.data()) + offset, src, bytes);
  }
  void Discard(DeviceBuffer& buffer, size_t offset, size_t bytes) override {
    // Whole pages inside the range only; a private anonymous mapping reads
    // zeros where its pages were dropped.
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const auto base = reinterpret_cast<uintptr_t>(buffer.data());
    const uintptr_t lo = (base + offset + page - 1) / page * page;
    const uintptr_t hi = (base + offset + bytes) / page * page;
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  }
  absl::StatusOr<std::unique_ptr<CompiledPlan>> Compile(Graph graph, MemoryPlan plan,
                                                       const PlanResources& resources) override {
    auto p = std::make_unique<CpuPlan>(std::move(graph), std::move(plan));
    if (auto s = p->Init(resources); !s.ok()) return s;
    return std::unique_ptr<CompiledPlan>(std::move(p));
  }
};

}  // namespace

Backend& CpuBackend() {
  static CpuBackendImpl* backend = new CpuBackendImpl();
  return *backend;
}

std::shared_ptr<Backend> SharedCpuBackend() { return std::shared_ptr<Backend>(std::shared_ptr<void>(), &CpuBackend()); }

}  // namespace decoded
