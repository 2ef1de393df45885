// GgufFile on truncated and randomly corrupted files: it must return an error
// (or, for a corruption that still forms a valid file, a consistent result),
// never crash or read outside the bytes. Run under ASan+UBSan
// (-DDECODED_SANITIZE=ON): buffers are exact-size heap copies, so any
// over-read is reported.
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf_file.h"
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
using ::testing::HasSubstr;
namespace wt = ::decoded::testing;

// A small valid file touching every parser path: all scalar types, strings,
// flat and nested arrays, an explicit alignment, and three tensors whose data
// runs to the last byte.
std::vector<uint8_t> SmallValidFile(size_t* data_start) {
  GgufWriter w;
  w.alignment = 32;
  w.Kv("general.architecture", wt::kStr, EncStr("tiny"));
  w.Kv("general.alignment", wt::kU32, Enc<uint32_t>(32));
  w.Kv("s.u8", wt::kU8, Enc<uint8_t>(1));
  w.Kv("s.i8", wt::kI8, Enc<int8_t>(-1));
  w.Kv("s.u16", wt::kU16, Enc<uint16_t>(2));
  w.Kv("s.i16", wt::kI16, Enc<int16_t>(-2));
  w.Kv("s.u32", wt::kU32, Enc<uint32_t>(3));
  w.Kv("s.i32", wt::kI32, Enc<int32_t>(-3));
  w.Kv("s.f32", wt::kF32, Enc<float>(0.5f));
  w.Kv("s.bool", wt::kBool, Enc<uint8_t>(1));
  w.Kv("s.u64", wt::kU64, Enc<uint64_t>(4));
  w.Kv("s.i64", wt::kI64, Enc<int64_t>(-4));
  w.Kv("s.f64", wt::kF64, Enc<double>(0.25));
  w.Kv("a.str", wt::kArr, EncArr(wt::kStr, {EncStr("<bos>"), EncStr("hi")}));
  w.Kv("a.f32", wt::kArr, EncArr(wt::kF32, {Enc<float>(1.f), Enc<float>(2.f)}));
  w.Kv("a.nest", wt::kArr,
       EncArr(wt::kArr, {EncArr(wt::kI32, {Enc<int32_t>(5)}), EncArr(wt::kStr, {EncStr("x")})}));
  w.Tensor("blk.0.norm", {4}, 0, std::string(16, '\x11'));
  w.Tensor("blk.0.q8", {32}, 8, std::string(34, '\x22'));
  w.Tensor("blk.0.q4k", {256}, 12, std::string(144, '\x33'));
  return w.Build(data_start);
}

// A parse that succeeded must describe tensors inside the bytes.
void ExpectConsistent(const GgufFile& f, const uint8_t* base, size_t size) {
  for (const GgufTensorInfo& t : f.tensors()) {
    ASSERT_GE(t.data, base);
    ASSERT_LE(t.nbytes, size);
    ASSERT_LE(static_cast<size_t>(t.data - base), size - t.nbytes) << t.name;
    ASSERT_EQ(f.FindTensor(t.name), &t);
    ASSERT_GE(t.n_dims, 1);
    ASSERT_LE(t.n_dims, 4);
  }
  for (const auto& [key, value] : f.metadata()) {
    // Accessors on whatever types survived must answer, not crash.
    (void)f.GetUint(key);
    (void)f.GetInt(key);
    (void)f.GetFloat(key);
    (void)f.GetBool(key);
    (void)f.GetString(key);
    (void)f.GetStringArray(key);
    (void)f.GetFloatArray(key);
    (void)f.GetIntArray(key);
  }
}

TEST(GgufRobustnessTest, SmallValidFileParses) {
  size_t data_start = 0;
  std::vector<uint8_t> bytes = SmallValidFile(&data_start);
  wt::ParsedBuffer p = ParseExact(bytes);
  ASSERT_TRUE(p.file.ok()) << p.file.status();
  EXPECT_EQ((*p.file)->tensors().size(), 3u);
  EXPECT_EQ((*p.file)->metadata().size(), 16u);
  EXPECT_EQ((*p.file)->FindTensor("blk.0.q4k")->data + 144, p.bytes.get() + bytes.size());
}

TEST(GgufRobustnessTest, TruncationAtEveryLengthReportsAnOffset) {
  size_t data_start = 0;
  const std::vector<uint8_t> bytes = SmallValidFile(&data_start);
  for (size_t n = 0; n < bytes.size(); ++n) {
    wt::ParsedBuffer p = ParseExact(bytes, n);
    ASSERT_FALSE(p.file.ok()) << "length " << n;
    EXPECT_EQ(p.file.status().code(), absl::StatusCode::kInvalidArgument) << "length " << n;
    EXPECT_THAT(wt::Msg(p.file.status()), HasSubstr("byte offset")) << "length " << n;
  }
}

TEST(GgufRobustnessTest, TruncatedFilesOnDiskReportErrors) {
  size_t data_start = 0;
  const std::vector<uint8_t> bytes = SmallValidFile(&data_start);
  for (size_t n = 0; n < bytes.size(); n += 7) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    absl::Status s = OpenBytes(prefix, "trunc").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "length " << n;
  }
}

TEST(GgufRobustnessTest, TruncatedKeyErrorNamesPairAndOffset) {
  GgufWriter w;
  w.Kv("a.twenty.byte.key.xx", wt::kU8, Enc<uint8_t>(1));
  // The key's length (8 bytes) is at 24, its text at 32; cut inside the text
  // (late enough that the header's count still fits the remaining bytes).
  wt::ParsedBuffer p = ParseExact(w.Build(), 37);
  EXPECT_THAT(wt::Msg(p.file.status()),
              ::testing::AllOf(HasSubstr("metadata pair #0 at byte offset 24"),
                               HasSubstr("truncated at byte offset 32")));
}

TEST(GgufRobustnessTest, TruncatedTensorInfoNamesTensorAndOffset) {
  GgufWriter w;
  w.TensorInfo("cut.me", {4, 4, 4, 4}, 0, 0);
  const size_t dims_start = 24 + 8 + 6 + 4;  // header, name, n_dims
  // Cut inside ne[2].
  wt::ParsedBuffer p = ParseExact(w.Build(), dims_start + 20);
  EXPECT_THAT(wt::Msg(p.file.status()),
              ::testing::AllOf(HasSubstr("tensor \"cut.me\" (info #0 at byte offset 24)"),
                               HasSubstr("truncated at byte offset " +
                                         std::to_string(dims_start + 16))));
}

TEST(GgufRobustnessTest, RandomCorruptionsNeverCrash) {
  size_t data_start = 0;
  const std::vector<uint8_t> bytes = SmallValidFile(&data_start);
  std::mt19937_64 rng(20240611);
  auto pick = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  int ok = 0, errors = 0;
  constexpr int kCases = 4000;
  for (int i = 0; i < kCases; ++i) {
    std::vector<uint8_t> c = bytes;
    switch (i % 4) {
      case 0:  // one random byte in the header/metadata/tensor-info region
        c[pick(data_start)] = static_cast<uint8_t>(pick(256));
        break;
      case 1:  // one bit flip
        c[pick(data_start)] ^= static_cast<uint8_t>(1u << pick(8));
        break;
      case 2: {  // several scattered bytes
        const int k = 2 + static_cast<int>(pick(7));
        for (int j = 0; j < k; ++j) c[pick(data_start)] = static_cast<uint8_t>(pick(256));
        break;
      }
      case 3: {  // an 8-byte window set to an extreme value (lengths, counts, offsets)
        static constexpr uint64_t kExtremes[] = {0, 1, ~uint64_t{0}, uint64_t{1} << 63,
                                                 uint64_t{1} << 32, 0x7fffffffffffffff, 255};
        uint64_t v = pick(8) == 0 ? rng() : kExtremes[pick(std::size(kExtremes))];
        const size_t at = pick(data_start - 8);
        std::memcpy(c.data() + at, &v, 8);
        break;
      }
    }
    wt::ParsedBuffer p = ParseExact(c);
    if (p.file.ok()) {
      ++ok;
      ExpectConsistent(**p.file, p.bytes.get(), c.size());
    } else {
      ++errors;
      EXPECT_THAT(wt::Msg(p.file.status()), HasSubstr("GGUF")) << "case " << i;
      EXPECT_NE(p.file.status().code(), absl::StatusCode::kOk);
    }
    if (i % 50 == 0) {  // the mmap path as well
      absl::StatusOr<std::unique_ptr<GgufFile>> f = OpenBytes(c, "corrupt");
      EXPECT_EQ(f.ok(), p.file.ok()) << "case " << i;
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Both outcomes occur: corruptions of string bytes or float values still parse.
  EXPECT_GT(errors, kCases / 4);
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace decoded
