// BindQkv (models/qkv_weights.h) on the phi2 fixtures, whose two files hold
// the same Q/K/V separately and fused: the fused views are the separate
// tensors' bytes, and each bias policy accepts or refuses what it should.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/qkv_weights.h"
#include "tests/common/model_path.h"
#include "tests/gguf/gguf_tensor_rewrite.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::HasSubstr;

std::shared_ptr<const Weights> Load(const std::string& name, const std::vector<wt::TensorEdit>& renames = {}) {
  std::vector<uint8_t> bytes = wt::ReadFileBytes(wt::TestDataPath(name));
  if (!renames.empty()) bytes = wt::RewriteTensors(bytes, renames);
  auto file = wt::OpenBytes(bytes, name);
  EXPECT_TRUE(file.ok()) << file.status();
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  EXPECT_TRUE(weights.ok()) << weights.status();
  return *weights;
}

// The fixture: 2 heads of 16, no GQA, hidden 32.
absl::StatusOr<QkvWeights> Bind(const Weights& w, QkvBias bias, WeightViews& views) {
  HParams hp(w, "phi2");
  const Dim q{32, "q"}, kv{32, "kv"}, hidden{32, "hidden"};
  return BindQkv(hp, w, 0, q, kv, hidden, bias, views);
}

bool SameBytes(const WeightTensor& a, const WeightTensor& b) {
  return a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes &&
         std::memcmp(a.data, b.data, a.row_bytes * static_cast<size_t>(a.rows)) == 0;
}

TEST(QkvWeightsTest, FusedViewsAreTheSeparateTensorsBytes) {
  auto sep = Load("phi2_tiny.gguf");
  auto fused = Load("phi2_tiny_fused.gguf");
  WeightViews vs, vf;
  auto a = Bind(*sep, QkvBias::kRequired, vs);
  auto b = Bind(*fused, QkvBias::kRequired, vf);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(a->fused);
  EXPECT_TRUE(b->fused);
  EXPECT_EQ(b->wk->name, "blk.0.attn_qkv.weight[k]");
  for (auto m : {&QkvWeights::wq, &QkvWeights::wk, &QkvWeights::wv, &QkvWeights::bq, &QkvWeights::bk,
                 &QkvWeights::bv}) {
    ASSERT_NE((*a).*m, nullptr);
    ASSERT_NE((*b).*m, nullptr);
    EXPECT_TRUE(SameBytes(*((*a).*m), *((*b).*m))) << ((*b).*m)->name;
  }
}

TEST(QkvWeightsTest, OptionalBiasesMayBeAbsentAsAWhole) {
  auto w = Load("phi2_tiny_fused.gguf", {{"blk.0.attn_qkv.bias", "blk.0.attn_qkv.bias_"}});
  WeightViews views;
  auto b = Bind(*w, QkvBias::kOptional, views);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->bq, nullptr);
  EXPECT_EQ(b->bv, nullptr);
  auto r = Bind(*w, QkvBias::kRequired, views);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(wt::Msg(r.status()), HasSubstr("blk.0.attn_qkv.bias"));
}

TEST(QkvWeightsTest, BiasesAreRefusedWhereTheLayerHasNone) {
  auto w = Load("phi2_tiny.gguf", {{"blk.0.attn_q.bias", "blk.0.attn_q.bias_"}});
  WeightViews views;
  auto b = Bind(*w, QkvBias::kNone, views);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(wt::Msg(b.status()), HasSubstr("blk.0.attn_k.bias"));  // the first one present
}

}  // namespace
}  // namespace decoded
