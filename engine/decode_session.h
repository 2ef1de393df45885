// A held decode plan and what it is bound to (seed: DecodeSession).
//
// A held plan steps a fixed number of token rows (`rows`, its batch-size
// bucket): one row per decode session in the step. Which sessions fill the
// rows, and so which KV caches they read and write, is per-step data
// (DataSlot::kKvRows), rebound with the token ids, RoPE tables, masks and
// write offsets; the plan itself is bound only to the weights, its data
// buffers and its arena. So one held plan serves any sessions of the model:
// a session's own plan (rows = 1, DecodeContext::Decode) and a worker's
// plans per bucket (engine/batch_decoder.h) are the same object.
#ifndef DECODED_ENGINE_DECODE_SESSION_H_
#define DECODED_ENGINE_DECODE_SESSION_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/decode_model.h"
#include "engine/decode_token_host.h"
#include "engine/kv_cache.h"

namespace decoded {

// When a held plan may be reused: the model's structure AND identity (a plan
// built over one weights instance must never run over another), the KV
// geometry its rows address, its row count and how many of them reach the
// output head.
struct PlanKey {
  std::string family;
  uint64_t structural_hash = 0;
  int32_t n_mask_variants = 0;
  int32_t n_rope_variants = 0;
  KvOffsetPath offset_path = KvOffsetPath::kDeviceOffset;
  uint64_t weights_instance = 0;
  int32_t kv_layers = 0;
  KvLayout kv_layout;
  int32_t rows = 0;
  int32_t outputs = 0;  // rows with logits per step; == rows: every row, no gather

  bool operator==(const PlanKey&) const = default;
};

// Holds the compiled plan of a `rows`-row decode step, the device buffers its
// kInput nodes are bound to (stable across steps), the host staging data and
// a one-position KV cache for padding rows (a step with fewer sessions than
// rows fills the rest with a dummy token that writes and reads only this
// cache). Movable, not copyable; drop_decode_session() (also run by the
// destructor) releases every binding.
struct DecodeSession {
  DecodeSession() = default;
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  bool held() const { return plan != nullptr; }
  int32_t rows() const { return key.rows; }
  int32_t outputs() const { return key.outputs; }

  std::unique_ptr<CompiledPlan> plan;
  PlanKey key;
  DecodeTokenHost host;
  std::array<std::unique_ptr<DeviceBuffer>, static_cast<size_t>(DataSlot::kCount)> buffers;
  std::unique_ptr<KvCache> pad_kv;
  int64_t bound_nodes = 0;  // kInput nodes of the held plan
  SymEnv env;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_DECODE_SESSION_H_
