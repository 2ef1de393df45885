// The shared persistent-decode driver (seed: module persistent_decode).
//
// One build function, two data modes:
//   D1  forward_with_kv_context: build the step graph with per-token data
//       baked as constants, optimize, run, discard. Used for prefill chunks
//       and as the oracle.
//   D2  forward_with_kv_context_persistent: the first decode step builds the
//       same graph with re-bindable data nodes, optimizes it ONCE and holds it
//       in a DecodeSession (build_and_realize_first_decode_token); every
//       later step recomputes the per-token host data and re-runs the held
//       plan (rebind_and_realize_prebuilt): no graph build, no optimizer run,
//       no heap allocation.
// D2 logits are byte-identical to D1's: the same nodes feed the same kernels,
// only where the per-token bytes live differs.
//
// A D2 step decodes one token for each of up to session.rows() decode
// sessions at once (batched decode): every matmul reads each weight block
// once for all rows, each row attends over its own KV cache at its own
// position. Every kernel keeps a row's arithmetic independent of the other
// rows, so a session's logits in a batch are byte-identical to the same
// session decoded alone. The single-session step is the one-row case of the
// same code.
//
// A row is one token of one sequence. Several rows may name one cache: they
// are a span of that sequence, appended at consecutive positions in row
// order (a prefill chunk riding in a decode step); each attends over the rows
// before it, so a span's logits are byte-identical to its tokens decoded one
// step each.
//
// Every step checks on the host, before anything runs, each row's KV cache
// (geometry == the model's, a free position for every row on it:
// RESOURCE_EXHAUSTED otherwise) and token id (INVALID_ARGUMENT).
// A held plan whose PlanKey no longer matches (another weights instance,
// another row or output count) is rebuilt, never reused.
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
// the last row [1, vocab], or of every row [seq, vocab] if all_logits.
Graph build_decode_graph(const DecodeModel& model, const DecodeTokenHost& host, DataMode mode, bool all_logits);

// The one-token decode graph (kRebindable) with no cache bound: what a
// backend is checked against and prepares its weights from at load.
Graph build_one_token_decode_graph(const DecodeModel& model);

// D1. Appends `tokens` to `kv` and returns their logits (last row, or all rows).
absl::StatusOr<std::vector<float>> forward_with_kv_context(const DecodeModel& model, KvCache& kv,
                                                           absl::Span<const int32_t> tokens, bool all_logits,
                                                           Executor& executor);

// One row of a D2 step: a sequence's KV cache and the token it appends there:
// at kv->write_offset() + k, k the number of earlier rows of the step on the
// same cache.
struct DecodeRow {
  KvCache* kv = nullptr;
  int32_t token = 0;
  // Whether the step returns this row's logits (the last row of a prefill
  // chunk does, the others need none). Only a plan of fewer outputs than
  // rows skips any; one with as many returns every row's.
  bool logits = true;
};

// D2. Appends each row's token to its cache through the held plan of
// `session` (building it for `plan_rows` rows and `plan_outputs` outputs if
// absent or stale; plan_rows >= rows.size(), the rest being padding) and
// returns logits, row-major, valid until the next call on the session: with
// plan_outputs == plan_rows, every row's [rows.size(), vocab]; with fewer,
// only the rows with `logits` set, in row order [n, vocab] (the others never
// reach the output head: for Gemma 3 270M its 262,144-row projection is most
// of a row's work). INVALID_ARGUMENT: no rows, more rows than plan_rows, more
// logits rows than plan_outputs, plan_outputs outside [1, plan_rows], a bad
// token, a cache of another geometry; RESOURCE_EXHAUSTED: a cache without
// room for its rows. Nothing is written on error.
absl::StatusOr<absl::Span<const float>> forward_batch_persistent(const DecodeModel& model,
                                                                 absl::Span<const DecodeRow> rows, int32_t plan_rows,
                                                                 int32_t plan_outputs, DecodeSession& session,
                                                                 Executor& executor);
// Every row's logits: plan_outputs == plan_rows.
absl::StatusOr<absl::Span<const float>> forward_batch_persistent(const DecodeModel& model,
                                                                 absl::Span<const DecodeRow> rows, int32_t plan_rows,
                                                                 DecodeSession& session, Executor& executor);

// The one-session step: forward_batch_persistent with one row and a one-row
// plan. Returns [vocab].
absl::StatusOr<absl::Span<const float>> forward_with_kv_context_persistent(const DecodeModel& model, KvCache& kv,
                                                                           DecodeSession& session, int32_t token,
                                                                           Executor& executor);

// D2 build: mint the held graph for `plan_rows` rows (`plan_outputs` of them
// with logits) with re-bindable data nodes, optimize it once, populate
// `session`, run it for `rows`.
absl::StatusOr<absl::Span<const float>> build_and_realize_first_decode_token(const DecodeModel& model,
                                                                             absl::Span<const DecodeRow> rows,
                                                                             int32_t plan_rows,
                                                                             int32_t plan_outputs,
                                                                             DecodeSession& session,
                                                                             Executor& executor);

// One persistent-decode step on an already-built session: recompute the
// per-row data, rebind (upload), run the held plan, advance the caches.
// FAILED_PRECONDITION if the session holds no plan or its key does not match
// the model (or rows.size() exceeds its rows).
absl::StatusOr<absl::Span<const float>> rebind_and_realize_prebuilt(const DecodeModel& model,
                                                                    absl::Span<const DecodeRow> rows,
                                                                    DecodeSession& session, Executor& executor);

// Uploads one step's host data into the session's bound buffers. Allocation-free.
void upload_decode_token_data(Backend& backend, const DecodeTokenHost& host, DecodeSession& session);

// Releases the held plan and every binding of `session`.
void drop_decode_session(DecodeSession& session);

// The key a plan of `rows` rows, `outputs` of them with logits, for `model`
// must carry to be reused.
PlanKey decode_plan_key(const DecodeModel& model, int32_t rows, int32_t outputs);

}  // namespace decoded

#endif  // DECODED_ENGINE_DECODE_DRIVER_H_
