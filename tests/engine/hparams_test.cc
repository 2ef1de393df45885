// HParams on small synthetic GGUF files (tests/gguf/gguf_test_writer.h): each
// accessor's range checks, its messages (key, value, range), the layer count
// against the blk.N. tensors, and tensor shapes against the keys they derive
// from. Family-level coverage is tests/models/gemma3_hparams_test.cc.
#include "engine/hparams.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::HasSubstr;
using wt::Enc;

// Keeps the parsed bytes alive for as long as the weights view them.
struct Loaded {
  wt::ParsedBuffer parsed;
  std::shared_ptr<const Weights> weights;
};

std::unique_ptr<Loaded> Load(const wt::GgufWriter& w) {
  auto out = std::make_unique<Loaded>();
  out->parsed = wt::ParseExact(w.Build());
  EXPECT_TRUE(out->parsed.file.ok()) << out->parsed.file.status();
  std::shared_ptr<const GgufFile> file(std::move(*out->parsed.file));
  auto weights = Weights::FromGguf(file);
  EXPECT_TRUE(weights.ok()) << weights.status();
  out->weights = *std::move(weights);
  return out;
}

// An f32 tensor of ne = {cols, rows}.
void F32Tensor(wt::GgufWriter& w, const std::string& name, uint64_t rows, uint64_t cols) {
  w.Tensor(name, {cols, rows}, 0, std::string(rows * cols * 4, '\0'));
}

TEST(HParamsTest, IntAcceptsEveryIntegerWidthInRange) {
  wt::GgufWriter w;
  w.Kv("a.u8", wt::kU8, Enc<uint8_t>(7));
  w.Kv("a.i16", wt::kI16, Enc<int16_t>(7));
  w.Kv("a.u64", wt::kU64, Enc<uint64_t>(7));
  w.Kv("a.i64", wt::kI64, Enc<int64_t>(7));
  auto l = Load(w);
  HParams hp(*l->weights, "a");
  for (const char* k : {"u8", "i16", "u64", "i64"}) {
    auto v = hp.Int(k, {1, 10});
    ASSERT_TRUE(v.ok()) << k << ": " << v.status();
    EXPECT_EQ(*v, 7) << k;
  }
}

TEST(HParamsTest, IntOutOfRangeNamesKeyValueAndRange) {
  wt::GgufWriter w;
  w.Kv("a.neg", wt::kI32, Enc<int32_t>(-1));
  w.Kv("a.big", wt::kU64, Enc<uint64_t>(~uint64_t{0}));
  w.Kv("a.odd", wt::kU32, Enc<uint32_t>(9));
  w.Kv("a.f", wt::kF32, Enc<float>(3.0f));
  auto l = Load(w);
  HParams hp(*l->weights, "a");
  auto neg = hp.Int("neg", {1, 10});
  EXPECT_EQ(neg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wt::Msg(neg.status()), "model file: a.neg = -1 is out of range [1, 10]");
  EXPECT_EQ(wt::Msg(hp.Int("big", {1, 10}).status()),
            "model file: a.big = 18446744073709551615 is out of range [1, 10]");
  EXPECT_EQ(*hp.Int("odd", {1, 10, "a.limit"}), 9);
  EXPECT_EQ(wt::Msg(hp.Int("odd", {1, 8, "a.limit"}).status()),
            "model file: a.odd = 9 is out of range [1, 8] (the upper bound is a.limit)");
  EXPECT_EQ(wt::Msg(hp.Int("odd", {2, 16, "", 2}).status()), "model file: a.odd = 9 is not a multiple of 2");
  EXPECT_EQ(wt::Msg(hp.Int("f", {1, 10}).status()), "model file: a.f holds float32, not an integer");
  EXPECT_EQ(wt::Msg(hp.Int("missing", {1, 10}).status()), "model file: a.missing is absent");
}

TEST(HParamsTest, IntOrChecksTheDefaultToo) {
  wt::GgufWriter w;
  w.Kv("a.present", wt::kU32, Enc<uint32_t>(3));
  auto l = Load(w);
  HParams hp(*l->weights, "a");
  EXPECT_EQ(*hp.IntOr("present", 5, {1, 10}), 3);
  EXPECT_EQ(*hp.IntOr("absent", 5, {1, 10}), 5);
  EXPECT_EQ(wt::Msg(hp.IntOr("absent", 12, {1, 10}).status()),
            "model file: a.absent = 12 (default; the key is absent) is out of range [1, 10]");
}

TEST(HParamsTest, FloatMustBeFiniteAndInRange) {
  wt::GgufWriter w;
  w.Kv("a.nan", wt::kF32, Enc<float>(std::numeric_limits<float>::quiet_NaN()));
  w.Kv("a.inf", wt::kF64, Enc<double>(-std::numeric_limits<double>::infinity()));
  w.Kv("a.neg", wt::kF32, Enc<float>(-0.5f));
  w.Kv("a.zero", wt::kF32, Enc<float>(0.0f));
  w.Kv("a.half", wt::kF64, Enc<double>(0.5));
  w.Kv("a.int", wt::kU32, Enc<uint32_t>(1));
  auto l = Load(w);
  HParams hp(*l->weights, "a");
  EXPECT_EQ(wt::Msg(hp.Float("nan", {0, 1}).status()), "model file: a.nan = nan is not finite");
  EXPECT_EQ(wt::Msg(hp.Float("inf", {0, 1}).status()), "model file: a.inf = -inf is not finite");
  EXPECT_EQ(wt::Msg(hp.Float("neg", {0, 1}).status()), "model file: a.neg = -0.5 is out of range [0, 1]");
  EXPECT_EQ(wt::Msg(hp.Float("neg", {1, 2, true}).status()),
            "model file: a.neg = -0.5 is out of range [1, 2] or 0 (off)");
  EXPECT_EQ(*hp.Float("half", {0, 1}), 0.5);
  // zero_is_off admits exactly 0 beside the range, and nothing else below it.
  EXPECT_EQ(*hp.Float("zero", {1, 2, true}), 0.0);
  EXPECT_FALSE(hp.Float("zero", {1, 2}).ok());
  EXPECT_FALSE(hp.Float("half", {1, 2, true}).ok());
  EXPECT_EQ(wt::Msg(hp.Float("int", {0, 1}).status()), "model file: a.int holds uint32, not a float");
  EXPECT_EQ(*hp.FloatOr("absent", 0.25, {0, 1}), 0.25);
  EXPECT_FALSE(hp.FloatOr("absent", 3, {0, 1}).ok());
}

TEST(HParamsTest, LayerCountMustMatchTheLayersPresent) {
  wt::GgufWriter w;
  w.Kv("a.n2", wt::kU32, Enc<uint32_t>(2));
  w.Kv("a.n3", wt::kU32, Enc<uint32_t>(3));
  w.Kv("a.huge", wt::kU32, Enc<uint32_t>(2147483647));
  F32Tensor(w, "blk.0.w", 1, 4);
  F32Tensor(w, "blk.0.v", 1, 4);
  F32Tensor(w, "blk.1.w", 1, 4);
  F32Tensor(w, "blk.x.w", 1, 4);          // not a layer prefix
  F32Tensor(w, "blk.1234567890.w", 1, 4);  // too many digits to be a layer index
  F32Tensor(w, "output.weight", 1, 4);
  auto l = Load(w);
  HParams hp(*l->weights, "a");
  EXPECT_EQ(*hp.LayerCount("n2"), 2);
  EXPECT_EQ(wt::Msg(hp.LayerCount("n3").status()),
            "model file: a.n3 = 3 does not match the 2 layers present (tensors blk.0. .. blk.1.)");
  EXPECT_EQ(wt::Msg(hp.LayerCount("huge").status()), "model file: a.huge = 2147483647 is out of range [1, 1024]");
}

TEST(HParamsTest, LayerCountRejectsAGapInTheLayers) {
  wt::GgufWriter w;
  w.Kv("a.n", wt::kU32, Enc<uint32_t>(2));
  F32Tensor(w, "blk.0.w", 1, 4);
  F32Tensor(w, "blk.2.w", 1, 4);
  auto l = Load(w);
  HParams hp(*l->weights, "a");
  auto n = hp.LayerCount("n");
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wt::Msg(n.status()), HasSubstr("skip blk.1. (the next layer present is blk.2.)"));
  EXPECT_THAT(wt::Msg(n.status()), HasSubstr("a.n"));
}

TEST(HParamsTest, TensorShapeMismatchNamesTheKeys) {
  wt::GgufWriter w;
  w.Kv("a.heads", wt::kU32, Enc<uint32_t>(3));
  F32Tensor(w, "q.weight", 8, 4);  // rows 8, cols 4
  auto l = Load(w);
  HParams hp(*l->weights, "a");
  const Dim heads = hp.dim("heads", 3);
  const Dim head_dim = hp.dim("head_dim", 2);  // absent: a default
  auto ok = hp.Tensor("q.weight", Dim{}, Dim{4, "width"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->rows, 8);
  EXPECT_EQ(wt::Msg(hp.Tensor("q.weight", heads * head_dim, Dim{4, "width"}).status()),
            "model file: tensor q.weight has shape [8, 4], but a.heads = 3 x a.head_dim (default) = 2 requires 6 "
            "rows");
  EXPECT_EQ(wt::Msg(hp.Tensor("q.weight", Dim{}, heads).status()),
            "model file: tensor q.weight has shape [8, 4], but a.heads = 3 requires 3 columns");
  EXPECT_EQ(hp.Tensor("k.weight", Dim{}, Dim{}).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace decoded
