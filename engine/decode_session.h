// A held decode plan and what it is bound to (seed: DecodeSession).
#ifndef DECODED_ENGINE_DECODE_SESSION_H_
#define DECODED_ENGINE_DECODE_SESSION_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/decode_model.h"
#include "engine/decode_token_host.h"

namespace decoded {

// When a held plan may be reused: structure AND identity, never geometry
// alone. A plan built over one KV cache must never run over another cache of
// the same shape (its pointers address the first one), and a plan built over
// one weights instance must never run over another.
struct PlanKey {
  std::string family;
  uint64_t structural_hash = 0;
  int32_t n_mask_variants = 0;
  int32_t n_rope_variants = 0;
  KvOffsetPath offset_path = KvOffsetPath::kDeviceOffset;
  uint64_t weights_instance = 0;
  uint64_t kv_allocation = 0;

  bool operator==(const PlanKey&) const = default;
};

// Owned by one decode context. Holds the compiled one-token plan, the device
// buffers its kInput nodes are bound to (stable across tokens), and the host
// staging data. Movable, not copyable; drop_decode_session() (also run by the
// destructor) releases every binding.
struct DecodeSession {
  DecodeSession() = default;
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  bool held() const { return plan != nullptr; }

  std::unique_ptr<CompiledPlan> plan;
  PlanKey key;
  DecodeTokenHost host;
  std::array<std::unique_ptr<DeviceBuffer>, static_cast<size_t>(DataSlot::kCount)> buffers;
  int64_t bound_nodes = 0;  // kInput nodes of the held plan
  SymEnv env;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_DECODE_SESSION_H_
