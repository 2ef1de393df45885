// The optimizer: runs exactly once per graph build (D1 per step, D2 once per
// held plan) and turns a built Graph into a schedule plus a memory plan.
//
// Passes, in order:
//   1. validation: every node reads only nodes before it;
//   2. dead-node removal: only nodes reachable from the outputs are scheduled;
//   3. buffer liveness planning: every intermediate gets an offset in one
//      preallocated arena; a buffer is reused once its last reader has run
//      (first-fit over freed ranges, 64-byte aligned). Outputs stay live to the end.
// Weights, inputs and constants live outside the arena. Nothing here depends
// on a backend: which weight types a matmul supports, and any conversion of
// its activations, are checked and lowered by the backend's Compile.
#ifndef DECODED_ENGINE_GRAPH_OPTIMIZER_H_
#define DECODED_ENGINE_GRAPH_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/graph/graph.h"

namespace decoded {

struct MemoryPlan {
  std::vector<NodeId> schedule;        // live compute nodes, topological order
  std::vector<int64_t> arena_offset;   // per node id; -1 when not in the arena
  std::vector<size_t> node_bytes;      // per node id; output bytes
  size_t arena_bytes = 0;
  int32_t removed_nodes = 0;           // by dead-node removal
};

// Schedules `graph` and plans its memory; the graph itself is left as built.
// INVALID_ARGUMENT if the graph is malformed (a node reads a node not before it).
absl::StatusOr<MemoryPlan> Optimize(const Graph& graph);

// Number of Optimize() calls in this process (plans-once accounting).
int64_t OptimizerRuns();

}  // namespace decoded

#endif  // DECODED_ENGINE_GRAPH_OPTIMIZER_H_
