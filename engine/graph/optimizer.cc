#include "engine/graph/optimizer.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace decoded {
namespace {

std::atomic<int64_t> g_optimizer_runs{0};

constexpr size_t kAlign = 64;
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool LivesInArena(Op op) {
  return op != Op::kWeight && op != Op::kInput && op != Op::kConst && op != Op::kKvWrite;
}

absl::Status ValidateSourceOrder(const Graph& graph) {
  const auto& nodes = graph.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (NodeId s : nodes[i].src) {
      if (s < 0 || static_cast<size_t>(s) >= i) {
        return absl::InvalidArgumentError(
            absl::StrCat("graph node ", i, " (", nodes[i].name, ") reads node ", s, " not before it"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t OptimizerRuns() { return g_optimizer_runs.load(std::memory_order_relaxed); }

absl::StatusOr<MemoryPlan> Optimize(const Graph& graph) {
  g_optimizer_runs.fetch_add(1, std::memory_order_relaxed);
  if (auto s = ValidateSourceOrder(graph); !s.ok()) return s;
  MemoryPlan plan;

  const auto& nodes = graph.nodes();
  const size_t n = nodes.size();

  // Dead-node removal: mark what the outputs reach.
  std::vector<char> live(n, 0);
  for (NodeId o : graph.outputs()) live[static_cast<size_t>(o)] = 1;
  for (size_t i = n; i-- > 0;) {
    if (!live[i]) continue;
    for (NodeId s : nodes[i].src) live[static_cast<size_t>(s)] = 1;
  }

  plan.arena_offset.assign(n, -1);
  plan.node_bytes.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = nodes[i];
    plan.node_bytes[i] = node.bytes();
    if (!live[i]) {
      ++plan.removed_nodes;
      continue;
    }
    if (node.op != Op::kWeight && node.op != Op::kInput && node.op != Op::kConst) {
      plan.schedule.push_back(static_cast<NodeId>(i));
    }
  }

  // Liveness: index in the schedule of each buffer's last reader.
  std::vector<int64_t> last_use(n, -1);
  for (size_t step = 0; step < plan.schedule.size(); ++step) {
    for (NodeId s : nodes[static_cast<size_t>(plan.schedule[step])].src) {
      last_use[static_cast<size_t>(s)] = static_cast<int64_t>(step);
    }
  }
  for (NodeId o : graph.outputs()) last_use[static_cast<size_t>(o)] = INT64_MAX;

  // First-fit allocation over a free list of [offset, size) ranges.
  std::map<size_t, size_t> free_ranges;  // offset -> size
  size_t arena_end = 0;
  std::vector<std::vector<NodeId>> release_at(plan.schedule.size());
  auto allocate = [&](size_t bytes) -> size_t {
    bytes = AlignUp(std::max<size_t>(bytes, 1));
    for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it) {
      if (it->second >= bytes) {
        const size_t off = it->first;
        const size_t rest = it->second - bytes;
        free_ranges.erase(it);
        if (rest > 0) free_ranges.emplace(off + bytes, rest);
        return off;
      }
    }
    const size_t off = arena_end;
    arena_end += bytes;
    return off;
  };
  auto release = [&](size_t off, size_t bytes) {
    bytes = AlignUp(std::max<size_t>(bytes, 1));
    auto it = free_ranges.emplace(off, bytes).first;
    // Coalesce with neighbours.
    if (auto next = std::next(it); next != free_ranges.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_ranges.erase(next);
    }
    if (it != free_ranges.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_ranges.erase(it);
      }
    }
  };

  for (size_t step = 0; step < plan.schedule.size(); ++step) {
    const size_t id = static_cast<size_t>(plan.schedule[step]);
    if (LivesInArena(nodes[id].op)) {
      plan.arena_offset[id] = static_cast<int64_t>(allocate(plan.node_bytes[id]));
      const int64_t lu = last_use[id];
      // A buffer nobody reads (and not an output) is freed right after its step.
      const size_t rel = lu < 0 ? step : static_cast<size_t>(lu);
      if (lu != INT64_MAX && rel < plan.schedule.size()) release_at[rel].push_back(static_cast<NodeId>(id));
    }
    // Release inputs whose last reader is this step (after allocating the
    // output, so an op never writes over its own inputs).
    for (NodeId r : release_at[step]) {
      release(static_cast<size_t>(plan.arena_offset[static_cast<size_t>(r)]), plan.node_bytes[static_cast<size_t>(r)]);
    }
  }
  plan.arena_bytes = arena_end;
  return plan;
}

}  // namespace decoded
