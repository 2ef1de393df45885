// GgufFile on small files written by the hand-rolled writer: every metadata
// type, nested arrays, alignment, block sizes, and the errors of malformed
// files (messages must name the key or tensor and the byte offset).
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded {
namespace {

using ::decoded::testing::Enc;
using ::decoded::testing::EncArr;
using ::decoded::testing::EncStr;
using ::decoded::testing::GgufWriter;
using ::decoded::testing::ParseExact;
using ::decoded::testing::OpenBytes;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace wt = ::decoded::testing;

// GGML type ids (ggml.h), written literally so the test does not lean on DType.
constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ5_0 = 6, kGgmlQ5_1 = 7,
                   kGgmlQ8_0 = 8, kGgmlQ4_K = 12, kGgmlQ5_K = 13, kGgmlQ6_K = 14, kGgmlQ8_K = 15,
                   kGgmlBF16 = 30, kGgmlIQ2_XXS = 16;

std::unique_ptr<GgufFile> OpenOrDie(const std::vector<uint8_t>& bytes) {
  absl::StatusOr<std::unique_ptr<GgufFile>> f = OpenBytes(bytes, "ok");
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *std::move(f) : nullptr;
}

absl::Status OpenStatus(const std::vector<uint8_t>& bytes) {
  // Check both entry points: the mmap'd file and the exact-size heap buffer.
  absl::Status via_file = OpenBytes(bytes, "bad").status();
  wt::ParsedBuffer heap = ParseExact(bytes);
  EXPECT_EQ(via_file.code(), heap.file.status().code());
  return via_file;
}

GgufWriter AllTypesWriter() {
  GgufWriter w;
  w.Kv("t.u8", wt::kU8, Enc<uint8_t>(200));
  w.Kv("t.i8", wt::kI8, Enc<int8_t>(-100));
  w.Kv("t.u16", wt::kU16, Enc<uint16_t>(60000));
  w.Kv("t.i16", wt::kI16, Enc<int16_t>(-30000));
  w.Kv("t.u32", wt::kU32, Enc<uint32_t>(4000000000u));
  w.Kv("t.i32", wt::kI32, Enc<int32_t>(-2000000000));
  w.Kv("t.f32", wt::kF32, Enc<float>(1.5f));
  w.Kv("t.bool_true", wt::kBool, Enc<uint8_t>(1));
  w.Kv("t.bool_false", wt::kBool, Enc<uint8_t>(0));
  w.Kv("t.str", wt::kStr, EncStr("h\xc3\xa9llo"));
  w.Kv("t.empty_str", wt::kStr, EncStr(""));
  w.Kv("t.u64", wt::kU64, Enc<uint64_t>((uint64_t{1} << 63) + 5));
  w.Kv("t.i64", wt::kI64, Enc<int64_t>(-(int64_t{1} << 62)));
  w.Kv("t.i64_pos", wt::kI64, Enc<int64_t>(123));
  w.Kv("t.f64", wt::kF64, Enc<double>(3.141592653589793));
  w.Kv("t.arr_u32", wt::kArr, EncArr(wt::kU32, {Enc<uint32_t>(7), Enc<uint32_t>(8)}));
  w.Kv("t.arr_i16", wt::kArr, EncArr(wt::kI16, {Enc<int16_t>(-3), Enc<int16_t>(4)}));
  w.Kv("t.arr_str", wt::kArr, EncArr(wt::kStr, {EncStr("a"), EncStr(""), EncStr("ccc")}));
  w.Kv("t.arr_f32", wt::kArr, EncArr(wt::kF32, {Enc<float>(0.25f), Enc<float>(-2.0f)}));
  w.Kv("t.arr_f64", wt::kArr, EncArr(wt::kF64, {Enc<double>(0.1)}));
  w.Kv("t.arr_u64_big", wt::kArr, EncArr(wt::kU64, {Enc<uint64_t>(~uint64_t{0})}));
  w.Kv("t.arr_bool", wt::kArr, EncArr(wt::kBool, {Enc<uint8_t>(1), Enc<uint8_t>(0)}));
  w.Kv("t.arr_empty", wt::kArr, EncArr(wt::kI8, {}));
  return w;
}

TEST(GgufSyntheticTest, EveryMetadataTypeRoundTrips) {
  std::unique_ptr<GgufFile> f = OpenOrDie(AllTypesWriter().Build());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 23u);
  EXPECT_TRUE(f->tensors().empty());

  EXPECT_EQ(f->Find("t.u8")->type, GgufType::kUint8);
  EXPECT_EQ(f->Find("t.i8")->type, GgufType::kInt8);
  EXPECT_EQ(f->Find("t.u16")->type, GgufType::kUint16);
  EXPECT_EQ(f->Find("t.i16")->type, GgufType::kInt16);
  EXPECT_EQ(f->Find("t.u32")->type, GgufType::kUint32);
  EXPECT_EQ(f->Find("t.i32")->type, GgufType::kInt32);
  EXPECT_EQ(f->Find("t.f32")->type, GgufType::kFloat32);
  EXPECT_EQ(f->Find("t.bool_true")->type, GgufType::kBool);
  EXPECT_EQ(f->Find("t.str")->type, GgufType::kString);
  EXPECT_EQ(f->Find("t.arr_u32")->type, GgufType::kArray);
  EXPECT_EQ(f->Find("t.u64")->type, GgufType::kUint64);
  EXPECT_EQ(f->Find("t.i64")->type, GgufType::kInt64);
  EXPECT_EQ(f->Find("t.f64")->type, GgufType::kFloat64);

  EXPECT_EQ(*f->GetUint("t.u8"), 200u);
  EXPECT_EQ(*f->GetInt("t.u8"), 200);
  EXPECT_EQ(*f->GetInt("t.i8"), -100);
  EXPECT_EQ(*f->GetUint("t.u16"), 60000u);
  EXPECT_EQ(*f->GetInt("t.i16"), -30000);
  EXPECT_EQ(*f->GetUint("t.u32"), 4000000000u);
  EXPECT_EQ(*f->GetInt("t.i32"), -2000000000);
  EXPECT_EQ(*f->GetFloat("t.f32"), 1.5);
  EXPECT_TRUE(*f->GetBool("t.bool_true"));
  EXPECT_FALSE(*f->GetBool("t.bool_false"));
  EXPECT_EQ(*f->GetString("t.str"), "h\xc3\xa9llo");
  EXPECT_EQ(*f->GetString("t.empty_str"), "");
  EXPECT_EQ(*f->GetUint("t.u64"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(*f->GetInt("t.i64"), -(int64_t{1} << 62));
  EXPECT_EQ(*f->GetUint("t.i64_pos"), 123u);
  EXPECT_EQ(*f->GetFloat("t.f64"), 3.141592653589793);

  EXPECT_THAT(*f->GetIntArray("t.arr_u32"), ElementsAre(7, 8));
  EXPECT_THAT(*f->GetIntArray("t.arr_i16"), ElementsAre(-3, 4));
  EXPECT_THAT(*f->GetStringArray("t.arr_str"), ElementsAre("a", "", "ccc"));
  EXPECT_THAT(*f->GetFloatArray("t.arr_f32"), ElementsAre(0.25f, -2.0f));
  EXPECT_THAT(*f->GetFloatArray("t.arr_f64"), ElementsAre(0.1f));
  EXPECT_TRUE(f->GetIntArray("t.arr_empty")->empty());
  const auto& bools = std::get<GgufArray>(f->Find("t.arr_bool")->value);
  ASSERT_EQ(bools.values.size(), 2u);
  EXPECT_EQ(bools.elem_type, GgufType::kBool);
  EXPECT_TRUE(std::get<bool>(bools.values[0].value));
  EXPECT_FALSE(std::get<bool>(bools.values[1].value));
}

TEST(GgufSyntheticTest, AccessorsRejectTypesThatCannotRepresentTheValue) {
  std::unique_ptr<GgufFile> f = OpenOrDie(AllTypesWriter().Build());
  ASSERT_NE(f, nullptr);
  auto expect_invalid = [](const absl::Status& s, const char* key) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(wt::Msg(s), HasSubstr(key));
  };
  expect_invalid(f->GetUint("t.i8").status(), "t.i8");          // negative
  expect_invalid(f->GetInt("t.u64").status(), "t.u64");         // > INT64_MAX
  expect_invalid(f->GetUint("t.str").status(), "t.str");
  expect_invalid(f->GetFloat("t.u32").status(), "t.u32");       // floats only
  expect_invalid(f->GetBool("t.u8").status(), "t.u8");
  expect_invalid(f->GetString("t.u8").status(), "t.u8");
  expect_invalid(f->GetStringArray("t.arr_u32").status(), "t.arr_u32");
  expect_invalid(f->GetFloatArray("t.arr_u32").status(), "t.arr_u32");
  expect_invalid(f->GetIntArray("t.str").status(), "t.str");
  expect_invalid(f->GetIntArray("t.arr_u64_big").status(), "t.arr_u64_big");
  EXPECT_EQ(f->GetUint("no.such.key").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f->GetStringArray("no.such.key").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f->Find("no.such.key"), nullptr);
}

TEST(GgufSyntheticTest, NestedArraysRoundTrip) {
  GgufWriter w;
  const std::string inner_a = EncArr(wt::kI32, {Enc<int32_t>(1), Enc<int32_t>(2)});
  const std::string inner_b = EncArr(wt::kI32, {Enc<int32_t>(3)});
  const std::string inner_c = EncArr(wt::kI32, {});
  w.Kv("n.ints", wt::kArr, EncArr(wt::kArr, {inner_a, inner_b, inner_c}));
  w.Kv("n.strs", wt::kArr,
       EncArr(wt::kArr, {EncArr(wt::kStr, {EncStr("x"), EncStr("yz")})}));
  w.Kv("n.after", wt::kU8, Enc<uint8_t>(9));  // parsing resumes after the nest
  std::unique_ptr<GgufFile> f = OpenOrDie(w.Build());
  ASSERT_NE(f, nullptr);

  const GgufArray& outer = std::get<GgufArray>(f->Find("n.ints")->value);
  EXPECT_EQ(outer.elem_type, GgufType::kArray);
  ASSERT_EQ(outer.values.size(), 3u);
  std::vector<std::vector<int64_t>> got;
  for (const GgufValue& v : outer.values) {
    const GgufArray& in = std::get<GgufArray>(v.value);
    EXPECT_EQ(in.elem_type, GgufType::kInt32);
    got.emplace_back();
    for (const GgufValue& x : in.values) got.back().push_back(std::get<int64_t>(x.value));
  }
  EXPECT_THAT(got, ElementsAre(ElementsAre(1, 2), ElementsAre(3), ElementsAre()));

  const GgufArray& s_outer = std::get<GgufArray>(f->Find("n.strs")->value);
  ASSERT_EQ(s_outer.values.size(), 1u);
  const GgufArray& s_in = std::get<GgufArray>(s_outer.values[0].value);
  ASSERT_EQ(s_in.values.size(), 2u);
  EXPECT_EQ(std::get<std::string>(s_in.values[1].value), "yz");
  EXPECT_EQ(*f->GetUint("n.after"), 9u);
  // Element-wise accessors do not flatten nests.
  EXPECT_EQ(f->GetIntArray("n.ints").status().code(), absl::StatusCode::kInvalidArgument);
}

std::string NestedArray(int depth) {
  std::string v = EncArr(wt::kU8, {Enc<uint8_t>(1)});
  for (int d = 1; d < depth; ++d) v = EncArr(wt::kArr, {v});
  return v;
}

TEST(GgufSyntheticTest, TotalArrayElementsAreBounded) {
  // 10 elements, then one more than the remaining allowance: the second
  // array is refused before anything is reserved for it, though its bytes
  // are all there (one uint8 each).
  const uint64_t rest = GgufParser::kMaxArrayElements - 10 + 1;
  GgufWriter w;
  w.Kv("a.small", wt::kArr, EncArr(wt::kU8, std::vector<std::string>(10, Enc<uint8_t>(1))));
  w.Kv("a.big", wt::kArr, Enc<uint32_t>(wt::kU8) + Enc<uint64_t>(rest) + std::string(rest, '\x01'));
  wt::ParsedBuffer p = ParseExact(w.Build());
  ASSERT_FALSE(p.file.ok());
  EXPECT_EQ(p.file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wt::Msg(p.file.status()),
              AllOf(HasSubstr("a.big"), HasSubstr(absl::StrCat("array length ", rest)),
                    HasSubstr("past 16777216 elements in all (10 before it)")));
}

TEST(GgufSyntheticTest, NestingDepthIsBounded) {
  GgufWriter ok;
  ok.Kv("deep.ok", wt::kArr, NestedArray(GgufParser::kMaxArrayDepth));
  EXPECT_TRUE(ParseExact(ok.Build()).file.ok());

  GgufWriter bad;
  bad.Kv("deep.bad", wt::kArr, NestedArray(GgufParser::kMaxArrayDepth + 1));
  absl::Status s = OpenStatus(bad.Build());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wt::Msg(s), AllOf(HasSubstr("deep.bad"), HasSubstr("nested deeper"),
                                 HasSubstr("byte offset")));
}

TEST(GgufSyntheticTest, AlignmentIsHonoured) {
  GgufWriter w;
  w.alignment = 64;
  w.Kv("general.alignment", wt::kU32, Enc<uint32_t>(64));
  std::string a(12, '\0'), b(34 * 2, '\0');
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i + 1);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(0x80 + i);
  const uint64_t off_a = w.Tensor("a", {3}, kGgmlF32, a);
  const uint64_t off_b = w.Tensor("b", {32, 2}, kGgmlQ8_0, b);
  size_t data_start = 0;
  std::vector<uint8_t> bytes = w.Build(&data_start);
  ASSERT_EQ(data_start % 64, 0u);
  ASSERT_EQ(off_b, 64u);

  std::unique_ptr<GgufFile> f = OpenOrDie(bytes);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->file_size(), bytes.size());
  const GgufTensorInfo* ta = f->FindTensor("a");
  const GgufTensorInfo* tb = f->FindTensor("b");
  ASSERT_NE(ta, nullptr);
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(ta->offset, off_a);
  EXPECT_EQ(tb->offset, off_b);
  // The mapping is page-aligned, so address alignment equals file-offset alignment.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta->data) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tb->data) % 64, 0u);
  EXPECT_EQ(tb->data - ta->data, 64);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ta->data), a.size()), a);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(tb->data), b.size()), b);
  EXPECT_EQ(tb->type, DType::kQ8_0);
  EXPECT_EQ(tb->n_dims, 2);
  EXPECT_EQ(tb->ne[0], 32);
  EXPECT_EQ(tb->ne[1], 2);
  EXPECT_EQ(tb->ne[2], 1);
  EXPECT_EQ(tb->ne[3], 1);
  EXPECT_EQ(f->FindTensor("c"), nullptr);
}

// Model::Load drops the metadata once read: the keys go, the tensors and
// their bytes stay.
TEST(GgufSyntheticTest, DropMetadataKeepsTheTensors) {
  GgufWriter w = AllTypesWriter();
  const std::string a = "0123456789ab";
  w.Tensor("a", {3}, kGgmlF32, a);
  std::unique_ptr<GgufFile> f = OpenOrDie(w.Build());
  ASSERT_NE(f, nullptr);
  ASSERT_NE(f->Find("t.arr_str"), nullptr);
  f->DropMetadata();
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_EQ(f->Find("t.arr_str"), nullptr);
  EXPECT_EQ(f->GetString("t.str").status().code(), absl::StatusCode::kNotFound);
  const GgufTensorInfo* ta = f->FindTensor("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(ta->data), a.size()), a);
}

TEST(GgufSyntheticTest, DefaultAlignmentIs32AndVersion2IsAccepted) {
  GgufWriter w;
  w.version = 2;
  w.Kv("k", wt::kU8, Enc<uint8_t>(1));
  w.Tensor("a", {1}, kGgmlF32, std::string(4, '\1'));
  w.Tensor("b", {1}, kGgmlF32, std::string(4, '\2'));
  std::unique_ptr<GgufFile> f = OpenOrDie(w.Build());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->FindTensor("b")->offset, 32u);
  EXPECT_EQ(f->FindTensor("b")->data[0], 2);
}

// Byte sizes from ggml-common.h's block structs (see docs/gguf.md).
TEST(GgufSyntheticTest, TensorByteSizesFollowBlockLayouts) {
  struct Case {
    const char* name;
    uint32_t type;
    std::vector<uint64_t> dims;
    size_t nbytes;
  };
  const std::vector<Case> cases = {
      {"f32", kGgmlF32, {4, 3}, 4 * 12},
      {"f16", kGgmlF16, {4}, 2 * 4},
      {"bf16", kGgmlBF16, {4}, 2 * 4},
      {"q4_0", kGgmlQ4_0, {64}, 2 * 18},
      {"q4_1", kGgmlQ4_1, {64, 3}, 6 * 20},
      {"q5_0", kGgmlQ5_0, {64}, 2 * 22},
      {"q5_1", kGgmlQ5_1, {96}, 3 * 24},
      {"q8_0", kGgmlQ8_0, {64, 2}, 4 * 34},
      {"q4_K", kGgmlQ4_K, {256, 2}, 2 * 144},
      {"q5_K", kGgmlQ5_K, {512}, 2 * 176},
      {"q6_K", kGgmlQ6_K, {256, 1, 2}, 2 * 210},
      {"q8_K", kGgmlQ8_K, {256, 1, 1, 3}, 3 * 292},
  };
  GgufWriter w;
  for (const Case& c : cases) w.Tensor(c.name, c.dims, c.type, std::string(c.nbytes, 'x'));
  std::unique_ptr<GgufFile> f = OpenOrDie(w.Build());
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->tensors().size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const GgufTensorInfo& t = f->tensors()[i];
    EXPECT_EQ(t.name, cases[i].name);
    EXPECT_EQ(static_cast<uint32_t>(t.type), cases[i].type) << t.name;
    EXPECT_EQ(t.nbytes, cases[i].nbytes) << t.name;
    EXPECT_EQ(t.n_dims, static_cast<int>(cases[i].dims.size())) << t.name;
  }
}

// --- Malformed files: each error names what is wrong and where. ---

void ExpectError(const std::vector<uint8_t>& bytes, absl::StatusCode code,
                 std::vector<std::string> substrings) {
  absl::Status s = OpenStatus(bytes);
  EXPECT_EQ(s.code(), code) << s;
  for (const std::string& sub : substrings) EXPECT_THAT(wt::Msg(s), HasSubstr(sub));
}

TEST(GgufSyntheticTest, BadMagicReportsOffsetZero) {
  std::vector<uint8_t> bytes = AllTypesWriter().Build();
  bytes[0] = 'g';
  ExpectError(bytes, absl::StatusCode::kInvalidArgument, {"bad magic", "byte offset 0"});
}

TEST(GgufSyntheticTest, UnsupportedVersionsAreRejected) {
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    GgufWriter w = AllTypesWriter();
    w.version = v;
    ExpectError(w.Build(), absl::StatusCode::kInvalidArgument,
                {"unsupported version " + std::to_string(v), "byte offset 4"});
  }
}

TEST(GgufSyntheticTest, BadAlignmentNamesKeyAndOffset) {
  for (uint32_t a : {0u, 48u, 3u}) {
    GgufWriter w;
    w.Kv("x", wt::kU8, Enc<uint8_t>(1));
    w.Kv("general.alignment", wt::kU32, Enc<uint32_t>(a));
    // "x" takes 8+1 + 4 + 1 bytes after the 24-byte header; the alignment pair follows.
    ExpectError(w.Build(), absl::StatusCode::kInvalidArgument,
                {"general.alignment", "byte offset 38", "not a nonzero power of two"});
  }
  GgufWriter w;
  w.Kv("general.alignment", wt::kStr, EncStr("32"));
  ExpectError(w.Build(), absl::StatusCode::kInvalidArgument,
              {"general.alignment", "byte offset 24", "string"});
}

TEST(GgufSyntheticTest, InvalidBoolAndUnknownValueTypeNameTheKey) {
  GgufWriter w;
  w.Kv("b.bad", wt::kBool, Enc<uint8_t>(2));
  ExpectError(w.Build(), absl::StatusCode::kInvalidArgument, {"b.bad", "not 0 or 1"});
  GgufWriter u;
  u.Kv("u.bad", 13, Enc<uint32_t>(0));
  ExpectError(u.Build(), absl::StatusCode::kInvalidArgument,
              {"u.bad", "unknown value type 13", "byte offset 24"});
  GgufWriter ae;
  ae.Kv("a.bad", wt::kArr, Enc<uint32_t>(99) + Enc<uint64_t>(0));
  ExpectError(ae.Build(), absl::StatusCode::kInvalidArgument,
              {"a.bad", "unknown element type 99"});
}

TEST(GgufSyntheticTest, DuplicateKeysAndTensorNamesAreRejected) {
  GgufWriter w;
  w.Kv("dup", wt::kU8, Enc<uint8_t>(1));
  w.Kv("dup", wt::kU8, Enc<uint8_t>(2));
  ExpectError(w.Build(), absl::StatusCode::kInvalidArgument, {"\"dup\"", "duplicate key"});
  GgufWriter t;
  t.Tensor("w", {1}, kGgmlF32, std::string(4, '\0'));
  t.Tensor("w", {1}, kGgmlF32, std::string(4, '\0'));
  ExpectError(t.Build(), absl::StatusCode::kInvalidArgument, {"\"w\"", "duplicate tensor"});
}

TEST(GgufSyntheticTest, AbsurdCountsAreRejectedBeforeAllocating) {
  GgufWriter kv = AllTypesWriter();
  kv.kv_count_override = uint64_t{1} << 60;
  ExpectError(kv.Build(), absl::StatusCode::kInvalidArgument,
              {"metadata count", "byte offset 16", "cannot fit"});
  GgufWriter tc = AllTypesWriter();
  tc.tensor_count_override = ~uint64_t{0};
  ExpectError(tc.Build(), absl::StatusCode::kInvalidArgument,
              {"tensor count", "byte offset 8", "cannot fit"});
  GgufWriter arr;
  arr.Kv("big.array", wt::kArr, Enc<uint32_t>(wt::kStr) + Enc<uint64_t>(uint64_t{1} << 62));
  ExpectError(arr.Build(), absl::StatusCode::kInvalidArgument,
              {"big.array", "array length", "byte offset 49", "cannot fit"});
}

TEST(GgufSyntheticTest, UnknownTensorTypeIsUnimplementedNamingTensorAndType) {
  GgufWriter w;
  w.Tensor("blk.0.weird", {256}, kGgmlIQ2_XXS, std::string(66, '\0'));
  ExpectError(w.Build(), absl::StatusCode::kUnimplemented,
              {"blk.0.weird", "GGML type id 16", "byte offset"});
}

TEST(GgufSyntheticTest, MalformedShapesNameTheTensor) {
  GgufWriter dims0;
  dims0.TensorInfo("no_dims", {}, kGgmlF32, 0);
  ExpectError(dims0.Build(), absl::StatusCode::kInvalidArgument,
              {"no_dims", "n_dims 0", "byte offset"});
  GgufWriter dims5;
  dims5.TensorInfo("five", {1, 1, 1, 1, 1}, kGgmlF32, 0);
  ExpectError(dims5.Build(), absl::StatusCode::kInvalidArgument, {"five", "n_dims 5"});
  GgufWriter zero;
  zero.TensorInfo("zero", {4, 0}, kGgmlF32, 0);
  ExpectError(zero.Build(), absl::StatusCode::kInvalidArgument, {"zero", "ne[1] = 0"});
  GgufWriter overflow;
  overflow.TensorInfo("huge", {uint64_t{1} << 40, uint64_t{1} << 40}, kGgmlF32, 0);
  ExpectError(overflow.Build(), absl::StatusCode::kInvalidArgument, {"huge", "overflows"});
  GgufWriter row;
  row.TensorInfo("ragged", {33, 2}, kGgmlQ8_0, 0);
  ExpectError(row.Build(), absl::StatusCode::kInvalidArgument,
              {"ragged", "not a multiple of the q8_0 block size 32"});
}

TEST(GgufSyntheticTest, MisalignedTensorOffsetIsRejected) {
  GgufWriter w;
  w.TensorInfo("odd", {1}, kGgmlF32, 4);
  ExpectError(w.Build(), absl::StatusCode::kInvalidArgument,
              {"odd", "data offset 4", "not a multiple of the alignment 32"});
}

TEST(GgufSyntheticTest, TensorOutsideFileIsRejected) {
  GgufWriter w;
  w.Tensor("inside", {8}, kGgmlF32, std::string(32, '\0'));
  w.TensorInfo("outside", {8}, kGgmlF32, 32);  // no bytes behind it
  ExpectError(w.Build(), absl::StatusCode::kInvalidArgument,
              {"outside", "byte offset", "extends past the end of the file"});
  GgufWriter far;
  far.Tensor("a", {1}, kGgmlF32, std::string(4, '\0'));
  far.TensorInfo("far", {1}, kGgmlF32, uint64_t{1} << 63);
  ExpectError(far.Build(), absl::StatusCode::kInvalidArgument, {"far", "extends past the end"});
}

TEST(GgufSyntheticTest, OverlappingTensorsAreRejected) {
  GgufWriter w;
  w.Tensor("first", {16}, kGgmlF32, std::string(64, '\0'));
  w.TensorInfo("second", {8}, kGgmlF32, 32);  // inside first's [0, 64)
  ExpectError(w.Build(), absl::StatusCode::kInvalidArgument,
              {"second", "overlaps tensor \"first\"", "byte offset"});
}

TEST(GgufSyntheticTest, MissingOrEmptyFiles) {
  absl::StatusOr<std::unique_ptr<GgufFile>> missing = GgufFile::Open("/nonexistent/x.gguf");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(wt::Msg(missing.status()), HasSubstr("/nonexistent/x.gguf"));
  EXPECT_EQ(GgufFile::Open(::testing::TempDir()).status().code(), absl::StatusCode::kNotFound);
  absl::Status empty = OpenBytes({}, "empty").status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wt::Msg(empty), AllOf(HasSubstr("magic"), HasSubstr("byte offset 0")));
}

}  // namespace
}  // namespace decoded
