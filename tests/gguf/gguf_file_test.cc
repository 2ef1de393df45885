// GgufFile on the real model, checked against facts dumped by the upstream
// Python `gguf` package (tools/gen_gguf_reference.py ->
// tests/data/gemma3_270m_gguf_reference.json) and against the model card facts.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"

namespace decoded {
namespace {

using ::decoded::testing::RealModelPath;
using ::decoded::testing::TestDataPath;
using json = nlohmann::json;

class GgufRealModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(RealModelPath())) return;
    absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(RealModelPath());
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = f->release();
    std::ifstream in(TestDataPath("gemma3_270m_gguf_reference.json"));
    ASSERT_TRUE(in.good()) << "missing reference JSON; run tools/gen_gguf_reference.py";
    ref_ = new json(json::parse(in));
  }
  static void TearDownTestSuite() {
    delete file_;
    delete ref_;
    file_ = nullptr;
    ref_ = nullptr;
  }
  void SetUp() override {
    DECODED_REQUIRE_REAL_MODEL();
    ASSERT_NE(file_, nullptr);
    ASSERT_NE(ref_, nullptr);
  }

  static GgufFile* file_;
  static json* ref_;
};

GgufFile* GgufRealModelTest::file_ = nullptr;
json* GgufRealModelTest::ref_ = nullptr;

TEST_F(GgufRealModelTest, HeaderMatchesModelCard) {
  EXPECT_EQ(file_->version(), 3u);
  EXPECT_EQ(file_->tensors().size(), 236u);
  EXPECT_EQ(file_->metadata().size(), 33u);
  EXPECT_EQ(file_->alignment(), 32u);
  EXPECT_EQ(*file_->GetString("general.architecture"), "gemma3");
  EXPECT_EQ(*file_->GetUint("gemma3.block_count"), 18u);

  const GgufTensorInfo* emb = file_->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, DType::kQ8_0);
  EXPECT_EQ(emb->n_dims, 2);
  EXPECT_EQ(emb->ne[0], 640);
  EXPECT_EQ(emb->ne[1], 262144);
  EXPECT_EQ(emb->nbytes, size_t{262144} * 640 / 32 * 34);

  const GgufTensorInfo* wo = file_->FindTensor("blk.0.attn_output.weight");
  ASSERT_NE(wo, nullptr);
  EXPECT_EQ(wo->type, DType::kQ4_K);
  EXPECT_EQ(wo->ne[0], 1024);
  EXPECT_EQ(wo->ne[1], 640);
  EXPECT_EQ(wo->nbytes, size_t{640} * 1024 / 256 * 144);

  EXPECT_EQ(file_->GetStringArray("tokenizer.ggml.tokens")->size(), 262144u);
  EXPECT_EQ(file_->GetFloatArray("tokenizer.ggml.scores")->size(), 262144u);
  EXPECT_EQ(file_->GetIntArray("tokenizer.ggml.token_type")->size(), 262144u);
}

TEST_F(GgufRealModelTest, HeaderMatchesPythonGguf) {
  const json& r = *ref_;
  EXPECT_EQ(file_->file_size(), r["file_size"].get<size_t>());
  EXPECT_EQ(file_->version(), r["version"].get<uint32_t>());
  EXPECT_EQ(file_->tensors().size(), r["tensor_count"].get<size_t>());
  EXPECT_EQ(file_->metadata().size(), r["kv_count"].get<size_t>());
  EXPECT_EQ(file_->alignment(), r["alignment"].get<uint64_t>());
}

// Compares one scalar (or array element) against its JSON value.
void ExpectValueEquals(const GgufValue& v, GgufType type, const json& expected,
                       const std::string& where) {
  SCOPED_TRACE(where);
  ASSERT_EQ(v.type, type);
  switch (type) {
    case GgufType::kString:
      EXPECT_EQ(std::get<std::string>(v.value), expected.get<std::string>());
      break;
    case GgufType::kBool:
      EXPECT_EQ(std::get<bool>(v.value), expected.get<bool>());
      break;
    case GgufType::kFloat32:
    case GgufType::kFloat64:
      // float32 widens to double exactly on both sides: compare exactly.
      EXPECT_EQ(std::get<double>(v.value), expected.get<double>());
      break;
    case GgufType::kUint8: case GgufType::kUint16: case GgufType::kUint32:
    case GgufType::kUint64:
      EXPECT_EQ(std::get<uint64_t>(v.value), expected.get<uint64_t>());
      break;
    case GgufType::kInt8: case GgufType::kInt16: case GgufType::kInt32:
    case GgufType::kInt64:
      EXPECT_EQ(std::get<int64_t>(v.value), expected.get<int64_t>());
      break;
    default:
      ADD_FAILURE() << "unexpected type " << GgufTypeName(type);
  }
}

GgufType TypeFromName(const std::string& name) {
  for (uint32_t t = 0; t <= 12; ++t) {
    if (GgufTypeName(static_cast<GgufType>(t)) == name) return static_cast<GgufType>(t);
  }
  ADD_FAILURE() << "unknown type name " << name;
  return GgufType::kUint8;
}

TEST_F(GgufRealModelTest, MetadataMatchesPythonGguf) {
  for (const auto& [key, e] : (*ref_)["kv"].items()) {
    SCOPED_TRACE(key);
    const GgufValue* v = file_->Find(key);
    ASSERT_NE(v, nullptr);
    const std::string type = e["type"];
    if (type != "array") {
      ExpectValueEquals(*v, TypeFromName(type), e["value"], key);
      continue;
    }
    ASSERT_EQ(v->type, GgufType::kArray);
    const GgufArray& arr = std::get<GgufArray>(v->value);
    const GgufType elem = TypeFromName(e["elem_type"]);
    EXPECT_EQ(arr.elem_type, elem);
    const size_t n = e["length"];
    ASSERT_EQ(arr.values.size(), n);
    const json& head = e["head"];
    for (size_t i = 0; i < head.size(); ++i) {
      ExpectValueEquals(arr.values[i], elem, head[i], "head " + std::to_string(i));
    }
    const json& tail = e["tail"];
    for (size_t i = 0; i < tail.size(); ++i) {
      const size_t idx = n - tail.size() + i;
      ExpectValueEquals(arr.values[idx], elem, tail[i], "index " + std::to_string(idx));
    }
    for (const auto& [idx, val] : e["samples"].items()) {
      ExpectValueEquals(arr.values[std::stoul(idx)], elem, val, "index " + idx);
    }
  }
}

TEST_F(GgufRealModelTest, TensorInfosMatchPythonGguf) {
  const json& tensors = (*ref_)["tensors"];
  ASSERT_EQ(file_->tensors().size(), tensors.size());
  // Every tensor sits at the same section start: data - offset is constant.
  const uint8_t* section = file_->tensors()[0].data - file_->tensors()[0].offset;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const json& e = tensors[i];
    const GgufTensorInfo& t = file_->tensors()[i];  // file order
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, e["name"].get<std::string>());
    EXPECT_EQ(static_cast<uint32_t>(t.type), e["type_id"].get<uint32_t>());
    const std::vector<int64_t> ne = e["ne"];
    ASSERT_EQ(t.n_dims, static_cast<int>(ne.size()));
    for (int d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < t.n_dims ? ne[d] : 1) << "dim " << d;
    EXPECT_EQ(t.offset, e["offset"].get<uint64_t>());
    EXPECT_EQ(t.nbytes, e["nbytes"].get<size_t>());
    EXPECT_EQ(t.data - t.offset, section);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u);
    const std::string head(reinterpret_cast<const char*>(t.data), 16);
    EXPECT_EQ(absl::BytesToHexString(head), e["head_hex"].get<std::string>());
    EXPECT_EQ(file_->FindTensor(t.name), &t);
  }
}

}  // namespace
}  // namespace decoded
