// engine/dtype's block table against llama.cpp's (tests/data/ggml_type_sizes.json,
// written by tools/gen_ggml_type_sizes.py from llama.cpp's gguf-py): a wrong
// block size would make the GGUF reader compute wrong tensor extents and
// offsets for files that contain that type.
#include <cctype>
#include <fstream>
#include <string>

#include "engine/dtype.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"

namespace decoded {
namespace {

nlohmann::json LoadTypes() {
  std::ifstream in(testing::TestDataPath("ggml_type_sizes.json"));
  return nlohmann::json::parse(in)["types"];
}

TEST(DTypeTest, EveryKnownTypeHasLlamaCppBlockLayout) {
  int known = 0;
  for (const auto& t : LoadTypes()) {
    const auto traits = LookupDType(t["id"].get<uint32_t>());
    if (!traits) continue;  // a type this build does not read: refused by id
    ++known;
    SCOPED_TRACE(t["name"].get<std::string>());
    EXPECT_EQ(traits->block_size, t["block_size"].get<int64_t>());
    EXPECT_EQ(traits->block_bytes, t["block_bytes"].get<size_t>());
  }
  EXPECT_EQ(known, 20);  // every entry of the table met a reference row
}

TEST(DTypeTest, NamesAreGgmlSpellings) {
  for (const auto& t : LoadTypes()) {
    const auto traits = LookupDType(t["id"].get<uint32_t>());
    if (!traits) continue;
    std::string ref = t["name"];
    for (char& c : ref) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string ours = traits->name;
    for (char& c : ours) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(ours, ref);
  }
}

TEST(DTypeTest, RowBytesRejectsPartialBlocks) {
  EXPECT_EQ(RowBytes(DType::kQ8_1, 64), 72u);
  EXPECT_FALSE(RowBytes(DType::kQ4_K, 255).has_value());
  EXPECT_FALSE(RowBytes(DType::kF32, -1).has_value());
}

}  // namespace
}  // namespace decoded
