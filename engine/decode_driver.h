// The shared persistent-decode driver (seed: module persistent_decode).
//
// One build function, two data modes:
//   D1  forward_with_kv_context: build the step graph with per-token data
//       baked as constants, optimize, run, discard. Used for prefill chunks
//       and as the oracle.
//   D2  forward_with_kv_context_persistent: the first decode token builds the
//       same graph with re-bindable data nodes, optimizes it ONCE and holds it
//       in the DecodeSession (build_and_realize_first_decode_token); every
//       later token recomputes the per-token host data and re-runs the held
//       plan (rebind_and_realize_prebuilt): no graph build, no optimizer run,
//       no heap allocation.
// D2 logits are byte-identical to D1's: the same nodes feed the same kernels,
// only where the per-token bytes live differs.
//
// Every step checks on the host that its KV rows fit before anything runs
// (RESOURCE_EXHAUSTED otherwise), and validates token ids (INVALID_ARGUMENT).
// A held plan whose PlanKey no longer matches (another KV cache, another
// weights instance) is rebuilt for that token, never reused.
#ifndef DECODED_ENGINE_DECODE_DRIVER_H_
#define DECODED_ENGINE_DECODE_DRIVER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/decode_model.h"
#include "engine/decode_session.h"
#include "engine/kv_cache.h"

namespace decoded {

// Builds the step graph for `host` (shared by D1 and D2). Outputs: logits of
// the last token [1, vocab], or of every token [seq, vocab] if all_logits.
Graph build_decode_graph(const DecodeModel& model, const DecodeTokenHost& host, DataMode mode, bool all_logits);

// D1. Appends `tokens` to `kv` and returns their logits (last row, or all rows).
absl::StatusOr<std::vector<float>> forward_with_kv_context(const DecodeModel& model, KvCache& kv,
                                                           absl::Span<const int32_t> tokens, bool all_logits,
                                                           Executor& executor);

// D2. Appends one token to `kv` through the session's held plan (building it
// if absent or stale) and returns its logits [vocab], valid until the next
// call on the session.
absl::StatusOr<absl::Span<const float>> forward_with_kv_context_persistent(const DecodeModel& model, KvCache& kv,
                                                                           DecodeSession& session, int32_t token,
                                                                           Executor& executor);

// D2 build: mint the held graph with re-bindable data nodes, optimize it
// once, populate `session`, run it for `token`.
absl::StatusOr<absl::Span<const float>> build_and_realize_first_decode_token(const DecodeModel& model, KvCache& kv,
                                                                             DecodeSession& session, int32_t token,
                                                                             Executor& executor);

// One persistent-decode step on an already-built session: recompute the
// per-token data, rebind (upload), run the held plan, advance the cache.
// FAILED_PRECONDITION if the session holds no plan or its key does not match
// (model, kv).
absl::StatusOr<absl::Span<const float>> rebind_and_realize_prebuilt(const DecodeModel& model, KvCache& kv,
                                                                    DecodeSession& session, int32_t token,
                                                                    Executor& executor);

// Uploads one step's host data into the session's bound buffers. Allocation-free.
void upload_decode_token_data(Backend& backend, const DecodeTokenHost& host, DecodeSession& session);

// Releases the held plan and every binding of `session`.
void drop_decode_session(DecodeSession& session);

// The key a plan for (model, kv) must carry to be reused.
PlanKey decode_plan_key(const DecodeModel& model, const KvCache& kv);

}  // namespace decoded

#endif  // DECODED_ENGINE_DECODE_DRIVER_H_
