// Process-wide engine counters (graph builds, rebinds, bound nodes, KV bytes,
// CPU activation quantizations).
// Lock-free atomics; read with GetEngineCounters() (engine/runtime.h).
#ifndef DECODED_ENGINE_ENGINE_COUNTERS_H_
#define DECODED_ENGINE_ENGINE_COUNTERS_H_

#include <cstdint>

namespace decoded {

// Process-wide engine counters, for metrics and tests.
struct EngineCounters {
  int64_t graph_builds;      // decode/prefill graphs built (D1 and D2)
  int64_t optimizer_runs;    // optimizer passes run (one per build)
  int64_t rebinds;           // D2 steps that reused a held plan
  int64_t held_plan_rebuilds;// held plans rebuilt because their key no longer matched
  int64_t bound_nodes;       // data-node bindings currently held by live contexts
  int64_t kv_bytes;          // KV bytes currently held by live contexts
  int64_t live_contexts;
  // Activation quantizations lowered into compiled CPU plans: one per distinct
  // (input, activation type) a plan's matmuls read, however many share it.
  int64_t cpu_activation_quantizations;
};
EngineCounters GetEngineCounters();

}  // namespace decoded

namespace decoded::counters {

void AddGraphBuild();
void AddRebind();
void AddHeldPlanRebuild();
void AddBoundNodes(int64_t delta);
void AddKvBytes(int64_t delta);
void AddLiveContexts(int64_t delta);
void AddCpuActivationQuantizations(int64_t n);

int64_t GraphBuilds();
int64_t Rebinds();

}  // namespace decoded::counters

#endif  // DECODED_ENGINE_ENGINE_COUNTERS_H_
