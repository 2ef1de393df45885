#include "engine/engine_counters.h"

#include <atomic>

#include "engine/graph/optimizer.h"
#include "engine/runtime.h"

namespace decoded {
namespace {
std::atomic<int64_t> g_graph_builds{0}, g_rebinds{0}, g_rebuilds{0}, g_bound{0}, g_kv{0}, g_live{0},
    g_cpu_act_quant{0};
}  // namespace

namespace counters {
void AddGraphBuild() { g_graph_builds.fetch_add(1, std::memory_order_relaxed); }
void AddRebind() { g_rebinds.fetch_add(1, std::memory_order_relaxed); }
void AddHeldPlanRebuild() { g_rebuilds.fetch_add(1, std::memory_order_relaxed); }
void AddBoundNodes(int64_t d) { g_bound.fetch_add(d, std::memory_order_relaxed); }
void AddKvBytes(int64_t d) { g_kv.fetch_add(d, std::memory_order_relaxed); }
void AddLiveContexts(int64_t d) { g_live.fetch_add(d, std::memory_order_relaxed); }
void AddCpuActivationQuantizations(int64_t n) { g_cpu_act_quant.fetch_add(n, std::memory_order_relaxed); }
int64_t GraphBuilds() { return g_graph_builds.load(std::memory_order_relaxed); }
int64_t Rebinds() { return g_rebinds.load(std::memory_order_relaxed); }
}  // namespace counters

EngineCounters GetEngineCounters() {
  return EngineCounters{
      .graph_builds = g_graph_builds.load(std::memory_order_relaxed),
      .optimizer_runs = OptimizerRuns(),
      .rebinds = g_rebinds.load(std::memory_order_relaxed),
      .held_plan_rebuilds = g_rebuilds.load(std::memory_order_relaxed),
      .bound_nodes = g_bound.load(std::memory_order_relaxed),
      .kv_bytes = g_kv.load(std::memory_order_relaxed),
      .live_contexts = g_live.load(std::memory_order_relaxed),
      .cpu_activation_quantizations = g_cpu_act_quant.load(std::memory_order_relaxed),
  };
}

}  // namespace decoded
