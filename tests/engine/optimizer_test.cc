#include "engine/graph/optimizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace decoded {
namespace {

WeightTensor F32Weight(const char* name, int64_t rows, int64_t cols, std::vector<float>& storage) {
  storage.assign(static_cast<size_t>(rows * cols), 0.5f);
  return WeightTensor{name, DType::kF32, rows, cols, static_cast<size_t>(cols) * 4,
                      reinterpret_cast<const uint8_t*>(storage.data())};
}

TEST(OptimizerTest, UnreachableNodesAreRemoved) {
  std::vector<float> s1, s2;
  WeightTensor w1 = F32Weight("w1", 8, 8, s1), w2 = F32Weight("w2", 8, 8, s2);
  Graph g;
  const NodeId x = g.constant(DType::kF32, 1, 8, std::vector<uint8_t>(32, 0), "x");
  const NodeId used = g.matmul(g.weight(w1), x, "used");
  g.matmul(g.weight(w2), x, "dead");  // nobody reads it
  g.mark_output(used);
  auto plan = Optimize(g);
  ASSERT_TRUE(plan.ok());
  for (NodeId id : plan->schedule) EXPECT_NE(g.node(id).name, "dead");
  EXPECT_GT(plan->removed_nodes, 0);
}

// A chain of element-wise ops needs two live buffers at a time, not one per node.
TEST(OptimizerTest, ArenaReusesBuffersWhoseReadersHaveRun) {
  Graph g;
  NodeId x = g.constant(DType::kF32, 1, 1024, std::vector<uint8_t>(4096, 0), "x");
  for (int i = 0; i < 20; ++i) x = g.scale(x, 2.0f, "s");
  g.mark_output(x);
  auto plan = Optimize(g);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->schedule.size(), 20u);
  EXPECT_LE(plan->arena_bytes, 2u * 4096u);
}

// No two buffers that are live at the same time overlap.
TEST(OptimizerTest, LiveBuffersNeverOverlap) {
  std::vector<float> s1;
  WeightTensor w = F32Weight("w", 16, 16, s1);
  Graph g;
  const NodeId x = g.constant(DType::kF32, 3, 16, std::vector<uint8_t>(3 * 64, 0), "x");
  NodeId h = x;
  std::vector<NodeId> keep;
  for (int i = 0; i < 6; ++i) {
    h = g.matmul(g.weight(w), h, "mm");
    keep.push_back(h);
  }
  NodeId sum = keep[0];
  for (size_t i = 1; i < keep.size(); ++i) sum = g.add(sum, keep[i], "acc");
  g.mark_output(sum);
  auto plan = Optimize(g);
  ASSERT_TRUE(plan.ok());
  // Live interval of each scheduled buffer: [defining step, last reading step].
  const auto& sched = plan->schedule;
  std::vector<std::pair<size_t, size_t>> live(g.nodes().size(), {SIZE_MAX, 0});
  for (size_t s = 0; s < sched.size(); ++s) {
    live[static_cast<size_t>(sched[s])].first = s;
    live[static_cast<size_t>(sched[s])].second = std::max(live[static_cast<size_t>(sched[s])].second, s);
    for (NodeId src : g.node(sched[s]).src) live[static_cast<size_t>(src)].second = s;
  }
  live[static_cast<size_t>(sum)].second = sched.size();
  for (NodeId a : sched) {
    for (NodeId b : sched) {
      if (a >= b || plan->arena_offset[a] < 0 || plan->arena_offset[b] < 0) continue;
      const auto la = live[a], lb = live[b];
      const bool overlap_time = la.first <= lb.second && lb.first <= la.second;
      const int64_t a0 = plan->arena_offset[a], a1 = a0 + static_cast<int64_t>(plan->node_bytes[a]);
      const int64_t b0 = plan->arena_offset[b], b1 = b0 + static_cast<int64_t>(plan->node_bytes[b]);
      const bool overlap_space = a0 < b1 && b0 < a1;
      EXPECT_FALSE(overlap_time && overlap_space) << g.node(a).name << " and " << g.node(b).name;
    }
  }
}

TEST(OptimizerTest, ANodeReadingALaterNodeIsAnError) {
  Graph g;
  const NodeId x = g.constant(DType::kF32, 1, 8, std::vector<uint8_t>(32, 0), "x");
  const NodeId a = g.scale(x, 2.0f, "a");
  const NodeId b = g.scale(a, 2.0f, "b");
  g.mutable_nodes()[static_cast<size_t>(a)].src[0] = b;
  g.mark_output(b);
  auto plan = Optimize(g);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("not before it"), std::string::npos) << plan.status();
}

}  // namespace
}  // namespace decoded
