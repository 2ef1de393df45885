#include "engine/decode_driver.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/engine_counters.h"
#include "engine/graph/optimizer.h"
#include "engine/kv_rows.h"

namespace decoded {
namespace {

template <typename T>
std::vector<uint8_t> Bytes(const T* p, size_t n) {
  std::vector<uint8_t> b(n * sizeof(T));
  if (n > 0) std::memcpy(b.data(), p, b.size());  // p may be null when n == 0
  return b;
}

absl::Status ValidateTokens(const DecodeModel& model, absl::Span<const int32_t> tokens) {
  const int32_t vocab = model.dims().vocab;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", tokens[i], " at index ", i, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// Buffer sizes of the data slots of a step of `rows` rows, `outputs` of them
// with logits.
size_t SlotBytes(DataSlot slot, const DecodeModel& model, int32_t rows, int32_t outputs) {
  const size_t n = static_cast<size_t>(rows);
  const size_t half = static_cast<size_t>(model.rope_plan().rot_dims() / 2);
  const size_t nr = static_cast<size_t>(std::max(model.rope_plan().n_variants(), 1));
  switch (slot) {
    case DataSlot::kTokenIds: return n * sizeof(int32_t);
    case DataSlot::kRopeCos:
    case DataSlot::kRopeSin: return nr * n * half * sizeof(float);
    case DataSlot::kMask: return static_cast<size_t>(model.mask_plan().n_variants()) * n * 2 * sizeof(int32_t);
    case DataSlot::kKvOffset: return n * sizeof(int32_t);
    case DataSlot::kKvRows: return n * static_cast<size_t>(KvRowStride(model.dims().n_layers)) * sizeof(int64_t);
    case DataSlot::kOutputRows: return static_cast<size_t>(outputs) * sizeof(int32_t);
    case DataSlot::kCount: break;
  }
  return 0;
}

// The KV caches a step's rows address must have the model's geometry (the
// plan's kernels index them with it); the element type is any KV type, as
// each row names its own (engine/kv_rows.h).
absl::Status CheckKvGeometry(const DecodeModel& model, const KvCache& kv) {
  const KvLayout want = model.dims().kv_layout().WithType(kv.layout().type);
  if (kv.n_layers() != model.dims().n_layers || !(kv.layout() == want)) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache of ", kv.n_layers(), " layers x ",
                                                   kv.layout().elements_per_token(), " elements per token does not fit ",
                                                   model.family(), " (", model.dims().n_layers, " layers x ",
                                                   want.elements_per_token(), ")"));
  }
  return absl::OkStatus();
}

PlanResources KvResources(const DecodeModel& model) {
  PlanResources res;
  res.kv_layers = model.dims().n_layers;
  res.kv_layout = model.dims().kv_layout();
  return res;
}

}  // namespace

// ---- the layer services ----

NodeId DecodeLayerInputs::rope(NodeId x, int32_t n_heads, const std::string& name) const {
  const int32_t v = rope_plan_.variant_of(layer);
  if (v < 0) return x;
  return graph.rope(x, data_.rope_cos, data_.rope_sin, v, n_heads, rope_plan_.head_dim(), rope_plan_.rot_dims(),
                    rope_plan_.pairing(), name);
}

NodeId DecodeLayerInputs::attention(NodeId q, NodeId k, NodeId v, const AttentionScoring& scoring) const {
  const std::string blk = absl::StrCat("blk.", layer, ".");
  const KvLayout kl = dims_.kv_layout();
  const NodeId kw = graph.kv_write(k, data_.kv_rows, layer, /*is_v=*/false, kl.n_kv_heads, kl.k_dim,
                                   data_.offset_path, data_.kv_offset, blk + "cache_k");
  const NodeId vw = kl.v_in_k ? kNoNode
                              : graph.kv_write(v, data_.kv_rows, layer, /*is_v=*/true, kl.n_kv_heads, kl.v_dim,
                                               data_.offset_path, data_.kv_offset, blk + "cache_v");
  return graph.attention(q, data_.mask, data_.kv_rows, kw, vw, layer, mask_plan_.variant_of(layer), dims_.n_heads,
                         kl, scoring.scale, scoring.softcap, blk + "attn");
}

// ---- per-token data nodes ----

DecodeTokenNodes PersistentDecodeModel::build_decode_token_data(Graph& g, const DecodeTokenHost& host,
                                                                const RopePlan& rope_plan, const MaskPlan& mask_plan,
                                                                DataMode mode) const {
  DecodeTokenNodes d;
  const int64_t seq = host.seq;
  const int64_t half = rope_plan.rot_dims() / 2;
  const int64_t rope_rows = static_cast<int64_t>(std::max(rope_plan.n_variants(), 1)) * seq;
  const int64_t mask_rows = static_cast<int64_t>(mask_plan.n_variants()) * seq;
  const int64_t kv_cols = seq > 0 ? static_cast<int64_t>(host.kv_rows.size()) / seq : 0;
  d.offset_path = kv_offset_path();
  if (mode == DataMode::kRebindable) {
    d.token_ids = g.input(DataSlot::kTokenIds, DType::kI32, 1, seq, "inp_tokens");
    d.rope_cos = g.input(DataSlot::kRopeCos, DType::kF32, rope_rows, half, "rope_cos");
    d.rope_sin = g.input(DataSlot::kRopeSin, DType::kF32, rope_rows, half, "rope_sin");
    d.mask = g.input(DataSlot::kMask, DType::kI32, mask_rows, 2, "kq_mask");
    d.kv_rows = g.input(DataSlot::kKvRows, DType::kI64, seq, kv_cols, "kv_rows");
    if (d.offset_path == KvOffsetPath::kDeviceOffset) {
      d.kv_offset = g.input(DataSlot::kKvOffset, DType::kI32, 1, seq, "kv_offset");
    }
    if (!host.output_rows.empty()) {
      d.output_rows = g.input(DataSlot::kOutputRows, DType::kI32, 1, static_cast<int64_t>(host.output_rows.size()),
                              "out_rows");
    }
  } else {
    d.token_ids = g.constant(DType::kI32, 1, seq, Bytes(host.token_ids.data(), host.token_ids.size()), "inp_tokens");
    d.rope_cos = g.constant(DType::kF32, rope_rows, half, Bytes(host.rope_cos.data(), host.rope_cos.size()), "rope_cos");
    d.rope_sin = g.constant(DType::kF32, rope_rows, half, Bytes(host.rope_sin.data(), host.rope_sin.size()), "rope_sin");
    d.mask = g.constant(DType::kI32, mask_rows, 2, Bytes(host.mask.data(), host.mask.size()), "kq_mask");
    d.kv_rows = g.constant(DType::kI64, seq, kv_cols, Bytes(host.kv_rows.data(), host.kv_rows.size()), "kv_rows");
    if (d.offset_path == KvOffsetPath::kDeviceOffset) {
      d.kv_offset = g.constant(DType::kI32, 1, seq, Bytes(host.positions.data(), host.positions.size()), "kv_offset");
    }
    if (!host.output_rows.empty()) {
      d.output_rows = g.constant(DType::kI32, 1, static_cast<int64_t>(host.output_rows.size()),
                                 Bytes(host.output_rows.data(), host.output_rows.size()), "out_rows");
    }
  }
  return d;
}

// ---- graph build ----

Graph build_one_token_decode_graph(const DecodeModel& model) {
  DecodeTokenHost host;
  const int32_t token = 0;
  // Cannot fail: one token at position 0.
  compute_decode_token_host(model.mask_plan(), model.rope_plan(), absl::MakeConstSpan(&token, 1), /*pos0=*/0, &host)
      .IgnoreError();
  host.kv_rows.assign(static_cast<size_t>(KvRowStride(model.dims().n_layers)), 0);
  return build_decode_graph(model, host, DataMode::kRebindable, /*all_logits=*/false);
}

Graph build_decode_graph(const DecodeModel& model, const DecodeTokenHost& host, DataMode mode, bool all_logits) {
  counters::AddGraphBuild();
  Graph g;
  const DecodeTokenNodes data =
      model.build_decode_token_data(g, host, model.rope_plan(), model.mask_plan(), mode);
  NodeId x = model.embed(g, data.token_ids);
  for (int32_t il = 0; il < model.dims().n_layers; ++il) {
    DecodeLayerInputs in(g, model.dims(), model.mask_plan(), model.rope_plan(), data, il, host.seq, x);
    x = model.decode_apply_layer(in);
  }
  // Only the rows whose logits are needed reach the vocabulary projection
  // (for a prefill chunk, the last): the others' rows of it are skipped.
  if (data.output_rows != kNoNode) {
    x = g.take_rows(x, data.output_rows, "out_rows");
  } else if (!all_logits && host.seq > 1) {
    x = g.take_last_row(x, "last_row");
  }
  g.mark_output(model.output_logits(g, x));
  return g;
}

// ---- D1 ----

absl::StatusOr<std::vector<float>> forward_with_kv_context(const DecodeModel& model, KvCache& kv,
                                                           absl::Span<const int32_t> tokens, bool all_logits,
                                                           Executor& executor) {
  if (auto s = ValidateTokens(model, tokens); !s.ok()) return s;
  if (auto s = CheckKvGeometry(model, kv); !s.ok()) return s;
  if (auto s = kv.Reserve(static_cast<int32_t>(tokens.size())); !s.ok()) return s;
  DecodeTokenHost host;
  if (auto s = compute_decode_token_host(model.mask_plan(), model.rope_plan(), tokens, kv.write_offset(), &host);
      !s.ok()) {
    return s;
  }
  // Every row of a chunk reads and writes the one cache.
  const int64_t stride = KvRowStride(kv.n_layers());
  host.kv_rows.resize(static_cast<size_t>(host.seq * stride));
  for (int32_t t = 0; t < host.seq; ++t) kv.FillKvRow(host.kv_rows.data() + t * stride);
  Graph g = build_decode_graph(model, host, DataMode::kBaked, all_logits);
  g.set_rows_are_one_sequence(true);
  auto plan = Optimize(g);
  if (!plan.ok()) return plan.status();
  auto compiled = model.backend().Compile(std::move(g), *std::move(plan), KvResources(model));
  if (!compiled.ok()) return compiled.status();
  SymEnv env{.kv_pos = host.positions};
  if (auto s = (*compiled)->Run(executor, env); !s.ok()) return s;
  kv.Commit(static_cast<int32_t>(tokens.size()));
  auto out = (*compiled)->output(0);
  return std::vector<float>(out.begin(), out.end());
}

// ---- D2 ----

PlanKey decode_plan_key(const DecodeModel& model, int32_t rows, int32_t outputs) {
  return PlanKey{
      .family = model.family(),
      .structural_hash = model.structural_hash(),
      .n_mask_variants = model.mask_plan().n_variants(),
      .n_rope_variants = model.rope_plan().n_variants(),
      .offset_path = model.kv_offset_path(),
      .weights_instance = model.weights().instance_id(),
      .kv_layers = model.dims().n_layers,
      .kv_layout = model.dims().kv_layout(),
      .rows = rows,
      .outputs = outputs,
  };
}

void upload_decode_token_data(Backend& backend, const DecodeTokenHost& host, DecodeSession& session) {
  auto up = [&](DataSlot slot, const void* src, size_t bytes) {
    DeviceBuffer* b = session.buffers[static_cast<size_t>(slot)].get();
    if (b != nullptr) backend.Upload(*b, src, bytes);
  };
  up(DataSlot::kTokenIds, host.token_ids.data(), host.token_ids.size() * sizeof(int32_t));
  up(DataSlot::kRopeCos, host.rope_cos.data(), host.rope_cos.size() * sizeof(float));
  up(DataSlot::kRopeSin, host.rope_sin.data(), host.rope_sin.size() * sizeof(float));
  up(DataSlot::kMask, host.mask.data(), host.mask.size() * sizeof(int32_t));
  up(DataSlot::kKvOffset, host.positions.data(), host.positions.size() * sizeof(int32_t));
  up(DataSlot::kKvRows, host.kv_rows.data(), host.kv_rows.size() * sizeof(int64_t));
  up(DataSlot::kOutputRows, host.output_rows.data(), host.output_rows.size() * sizeof(int32_t));
  session.env.kv_pos = host.positions;
}

void drop_decode_session(DecodeSession& session) {
  if (session.bound_nodes != 0) counters::AddBoundNodes(-session.bound_nodes);
  session.bound_nodes = 0;
  session.plan.reset();
  for (auto& b : session.buffers) b.reset();
  session.pad_kv.reset();
  session.key = PlanKey{};
  session.env = SymEnv{};
}

DecodeSession::~DecodeSession() { drop_decode_session(*this); }

namespace {

// The number of logits rows a step of `rows` returns from a plan of
// `plan_rows` rows and `plan_outputs` outputs.
size_t OutputCount(absl::Span<const DecodeRow> rows, int32_t plan_rows, int32_t plan_outputs) {
  if (plan_outputs == plan_rows) return rows.size();
  return static_cast<size_t>(std::count_if(rows.begin(), rows.end(), [](const DecodeRow& r) { return r.logits; }));
}

// The host-side check of a D2 step (before anything runs or is written) and
// the fill of session.host for a plan of `plan_rows` rows and `plan_outputs`
// outputs: the given rows, then padding rows (token 0 at position 0 of the
// session's pad cache); the output rows, then padding outputs (row 0).
absl::Status PrepareStep(const DecodeModel& model, absl::Span<const DecodeRow> rows, int32_t plan_rows,
                         int32_t plan_outputs, DecodeSession& session) {
  if (rows.empty()) return absl::InvalidArgumentError("a decode step needs at least one row");
  if (static_cast<int32_t>(rows.size()) > plan_rows) {
    return absl::InvalidArgumentError(absl::StrCat(rows.size(), " rows exceed the plan's ", plan_rows));
  }
  if (plan_outputs < plan_rows) {
    const size_t wanted = OutputCount(rows, plan_rows, plan_outputs);
    if (wanted > static_cast<size_t>(plan_outputs)) {
      return absl::InvalidArgumentError(
          absl::StrCat(wanted, " rows want logits; the plan computes ", plan_outputs));
    }
  }
  const int32_t vocab = model.dims().vocab;
  DecodeTokenHost& host = session.host;
  host.positions.resize(static_cast<size_t>(plan_rows));
  for (size_t i = 0; i < rows.size(); ++i) {
    const DecodeRow& r = rows[i];
    if (r.kv == nullptr) return absl::InvalidArgumentError(absl::StrCat("row ", i, " has no KV cache"));
    if (r.token < 0 || r.token >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", r.token, " of row ", i, " is outside the vocabulary [0, ", vocab, ")"));
    }
    if (auto s = CheckKvGeometry(model, *r.kv); !s.ok()) return s;
    // The rows on one cache are a span of its sequence: the k-th of them (in
    // row order) appends at write_offset() + k and attends over the k before
    // it too, which this step writes first (a layer's KV write covers every
    // row before its attention reads any).
    int32_t earlier = 0;
    for (size_t j = 0; j < i; ++j) earlier += rows[j].kv->allocation_id() == r.kv->allocation_id() ? 1 : 0;
    if (auto s = r.kv->Reserve(earlier + 1); !s.ok()) return s;
    host.positions[i] = r.kv->write_offset() + earlier;
  }
  const int64_t stride = KvRowStride(model.dims().n_layers);
  host.token_ids.resize(static_cast<size_t>(plan_rows));
  host.kv_rows.resize(static_cast<size_t>(plan_rows * stride));
  for (int32_t i = 0; i < plan_rows; ++i) {
    const bool real = i < static_cast<int32_t>(rows.size());
    KvCache& kv = real ? *rows[static_cast<size_t>(i)].kv : *session.pad_kv;
    host.token_ids[static_cast<size_t>(i)] = real ? rows[static_cast<size_t>(i)].token : 0;
    if (!real) host.positions[static_cast<size_t>(i)] = 0;
    kv.FillKvRow(host.kv_rows.data() + i * stride);
  }
  host.output_rows.clear();  // keeps its capacity: no allocation after the first step
  if (plan_outputs < plan_rows) {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].logits) host.output_rows.push_back(static_cast<int32_t>(i));
    }
    host.output_rows.resize(static_cast<size_t>(plan_outputs), 0);
  }
  // compute_decode_token_host copies ids/positions onto themselves: no-ops.
  return compute_decode_token_host(model.mask_plan(), model.rope_plan(), host.token_ids, host.positions, &host);
}

absl::StatusOr<absl::Span<const float>> RunHeld(absl::Span<const DecodeRow> rows, DecodeSession& session,
                                                Executor& executor, int32_t vocab) {
  const size_t outputs = OutputCount(rows, session.rows(), session.outputs());
  session.env.live_rows = static_cast<int32_t>(rows.size());
  session.env.live_outputs = static_cast<int32_t>(outputs);
  if (auto s = session.plan->Run(executor, session.env); !s.ok()) return s;
  for (const DecodeRow& r : rows) r.kv->Commit(1);
  return session.plan->output(0).subspan(0, outputs * static_cast<size_t>(vocab));
}

}  // namespace

absl::StatusOr<absl::Span<const float>> build_and_realize_first_decode_token(const DecodeModel& model,
                                                                             absl::Span<const DecodeRow> rows,
                                                                             int32_t plan_rows,
                                                                             int32_t plan_outputs,
                                                                             DecodeSession& session,
                                                                             Executor& executor) {
  if (plan_rows < 1) return absl::InvalidArgumentError("a decode plan needs at least one row");
  if (plan_outputs < 1 || plan_outputs > plan_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("a plan of ", plan_rows, " rows computes 1 to ", plan_rows, " rows' logits, not ", plan_outputs));
  }
  drop_decode_session(session);
  Backend& backend = model.backend();
  if (plan_rows > 1) {
    // Padding rows write position 0 of this cache and attend over it alone.
    auto pad = KvCache::Create(backend, model.dims().n_layers, model.dims().kv_layout(), 1);
    if (!pad.ok()) return pad.status();
    session.pad_kv = *std::move(pad);
  }
  if (auto s = PrepareStep(model, rows, plan_rows, plan_outputs, session); !s.ok()) {
    drop_decode_session(session);
    return s;
  }
  Graph g = build_decode_graph(model, session.host, DataMode::kRebindable, /*all_logits=*/true);

  PlanResources res = KvResources(model);
  int64_t bound = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != Op::kInput) continue;
    const auto slot = static_cast<size_t>(n.input_slot);
    auto buf = backend.Allocate(SlotBytes(static_cast<DataSlot>(n.input_slot), model, plan_rows, plan_outputs));
    if (!buf.ok()) return buf.status();
    session.buffers[slot] = *std::move(buf);
    res.inputs[slot] = session.buffers[slot].get();
    ++bound;
  }
  auto plan = Optimize(g);
  if (!plan.ok()) return plan.status();
  auto compiled = backend.Compile(std::move(g), *std::move(plan), res);
  if (!compiled.ok()) return compiled.status();
  session.plan = *std::move(compiled);
  session.key = decode_plan_key(model, plan_rows, plan_outputs);
  session.bound_nodes = bound;
  counters::AddBoundNodes(bound);

  upload_decode_token_data(backend, session.host, session);
  return RunHeld(rows, session, executor, model.dims().vocab);
}

absl::StatusOr<absl::Span<const float>> rebind_and_realize_prebuilt(const DecodeModel& model,
                                                                    absl::Span<const DecodeRow> rows,
                                                                    DecodeSession& session, Executor& executor) {
  if (!session.held()) return absl::FailedPreconditionError("decode session holds no plan");
  if (!(session.key == decode_plan_key(model, session.rows(), session.outputs()))) {
    return absl::FailedPreconditionError("held plan was built for another model");
  }
  if (auto s = PrepareStep(model, rows, session.rows(), session.outputs(), session); !s.ok()) return s;
  upload_decode_token_data(model.backend(), session.host, session);
  auto out = RunHeld(rows, session, executor, model.dims().vocab);
  if (out.ok()) counters::AddRebind();
  return out;
}

absl::StatusOr<absl::Span<const float>> forward_batch_persistent(const DecodeModel& model,
                                                                 absl::Span<const DecodeRow> rows, int32_t plan_rows,
                                                                 int32_t plan_outputs, DecodeSession& session,
                                                                 Executor& executor) {
  if (session.held() && session.key == decode_plan_key(model, plan_rows, plan_outputs)) {
    return rebind_and_realize_prebuilt(model, rows, session, executor);
  }
  if (session.held()) counters::AddHeldPlanRebuild();
  return build_and_realize_first_decode_token(model, rows, plan_rows, plan_outputs, session, executor);
}

absl::StatusOr<absl::Span<const float>> forward_batch_persistent(const DecodeModel& model,
                                                                 absl::Span<const DecodeRow> rows, int32_t plan_rows,
                                                                 DecodeSession& session, Executor& executor) {
  return forward_batch_persistent(model, rows, plan_rows, plan_rows, session, executor);
}

absl::StatusOr<absl::Span<const float>> forward_with_kv_context_persistent(const DecodeModel& model, KvCache& kv,
                                                                           DecodeSession& session, int32_t token,
                                                                           Executor& executor) {
  const DecodeRow row{&kv, token};
  return forward_batch_persistent(model, absl::MakeConstSpan(&row, 1), 1, session, executor);
}

}  // namespace decoded
