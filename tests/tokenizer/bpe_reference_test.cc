// Real byte-level BPE vocabularies against Hugging Face and llama.cpp
// (tests/data/{smollm2,qwen2}_tokenizer_reference.json, written by
// tools/gen_bpe_tokenizer_reference.py). Only the GGUF's tokenizer keys are
// read (the tensors stay unmapped pages).
//
// Models: DECODED_SMOLLM2_PATH (SmolLM2-135M-Instruct Q4_1, pre "smollm") and
// DECODED_QWEN2_PATH (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, pre "qwen2"), else
// ~/.cache/decoded/; skipped when absent unless the variable is set.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"
#include "tests/tokenizer/hex.h"

namespace decoded {
namespace {

using ::decoded::testing::FromHex;
using ::decoded::testing::NamedModel;
using ::decoded::testing::NamedModelPath;
using ::decoded::testing::TestDataPath;
using ::decoded::testing::ToHex;

struct BpeModel {
  const char* name;
  const char* env_var;
  const char* file_name;
  const char* reference;
};

void PrintTo(const BpeModel& model, std::ostream* os) { *os << model.name; }

const BpeModel kModels[] = {
    {"smollm2", "DECODED_SMOLLM2_PATH", "smollm2-135m-instruct-q4_1.gguf", "smollm2_tokenizer_reference.json"},
    {"qwen2", "DECODED_QWEN2_PATH", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2_tokenizer_reference.json"},
};

// One tokenizer per model for the whole binary (nullptr, with a failure
// recorded, when it does not load).
const Tokenizer* LoadTokenizer(const BpeModel& model) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto it = loaded.find(model.name);
  if (it != loaded.end()) return it->second.get();
  std::unique_ptr<Tokenizer> result;
  auto file = GgufFile::Open(NamedModelPath(model.env_var, model.file_name).path);
  if (!file.ok()) {
    ADD_FAILURE() << file.status();
  } else if (auto t = Tokenizer::FromGguf(**file); !t.ok()) {
    ADD_FAILURE() << t.status();
  } else {
    result = *std::move(t);
  }
  return (loaded[model.name] = std::move(result)).get();
}

nlohmann::json LoadReference(const BpeModel& model) {
  std::ifstream in(TestDataPath(model.reference));
  EXPECT_TRUE(in.good()) << "missing tests/data/" << model.reference;
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

class BpeReferenceTest : public ::testing::TestWithParam<BpeModel> {
 protected:
  void SetUp() override {
    const NamedModel path = NamedModelPath(GetParam().env_var, GetParam().file_name);
    DECODED_REQUIRE_NAMED_MODEL(path);
    tokenizer_ = LoadTokenizer(GetParam());
    ASSERT_NE(tokenizer_, nullptr);
    ref_ = LoadReference(GetParam());
    ASSERT_FALSE(ref_.is_discarded());
    ASSERT_GE(ref_["cases"].size(), 200u);
  }

  const Tokenizer* tokenizer_ = nullptr;
  nlohmann::json ref_;
};

std::string Describe(const nlohmann::json& c) {
  return c["label"].get<std::string>() + " text=" + c["text"].dump() + " hex=" +
         c["text_hex"].get<std::string>() + " parse_special=" + (c["parse_special"].get<bool>() ? "1" : "0");
}

TEST_P(BpeReferenceTest, VocabularyMatchesTheReference) {
  const Tokenizer* t = tokenizer_;
  EXPECT_EQ(t->model(), "gpt2");
  EXPECT_EQ(t->pre_tokenizer(), ref_["tokenizer_pre"].get<std::string>());
  EXPECT_EQ(t->vocab_size(), ref_["vocab_size"].get<int>());
  EXPECT_EQ(t->bos_id(), ref_["bos_id"].get<int>());
  EXPECT_EQ(t->eos_id(), ref_["eos_id"].get<int>());
  EXPECT_EQ(t->prompt_bos_id() >= 0, ref_["add_bos"].get<bool>());
  EXPECT_TRUE(t->IsEndOfGeneration(t->eos_id()));
  const int32_t im_end = t->PieceToId("<|im_end|>");
  ASSERT_GE(im_end, 0);
  EXPECT_TRUE(t->IsEndOfGeneration(im_end));
  EXPECT_EQ(t->type(im_end), TokenType::kControl);
}

// The committed ids: where HF and llama.cpp agree (most cases) both, else
// the side the file names (tools/gen_bpe_tokenizer_reference.py says why).
TEST_P(BpeReferenceTest, EncodeMatchesHfAndLlamaCpp) {
  int agreed = 0;
  int mismatches = 0;
  std::map<std::string, int> follows;
  for (const nlohmann::json& c : ref_["cases"]) {
    const std::string text = FromHex(c["text_hex"].get<std::string>());
    const bool special = c["parse_special"].get<bool>();
    const std::vector<int32_t> expected = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tokenizer_->Encode(text, /*add_bos=*/false, special);
    EXPECT_EQ(got, expected) << Describe(c) << " (follows " << c["follows"].get<std::string>() << ")";
    // These vocabularies do not ask for a BOS, so add_bos changes nothing.
    EXPECT_EQ(tokenizer_->Encode(text, /*add_bos=*/true, special), got) << Describe(c);
    if (got != expected) ++mismatches;
    if (c["follows"] == "both") {
      ++agreed;
    } else {
      EXPECT_TRUE(c.contains("note")) << Describe(c) << ": a disagreement without its reason";
    }
    ++follows[c["follows"].get<std::string>()];
  }
  std::printf("%s: %zu cases, %d where HF and llama.cpp agree, %d mismatches", GetParam().name,
              ref_["cases"].size(), agreed, mismatches);
  for (const auto& [side, n] : follows) std::printf(", follows %s: %d", side.c_str(), n);
  std::printf("\n");
  EXPECT_EQ(mismatches, 0);
}

// Any thread may encode: each keeps its own regex match state.
TEST_P(BpeReferenceTest, EncodesFromSeveralThreadsAtOnce) {
  const nlohmann::json& cases = ref_["cases"];
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (const nlohmann::json& c : cases) {
        const std::string text = FromHex(c["text_hex"].get<std::string>());
        if (tokenizer_->Encode(text, false, c["parse_special"].get<bool>()) != c["ids"].get<std::vector<int32_t>>()) {
          ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST_P(BpeReferenceTest, DecodeMatchesLlamaCpp) {
  for (const nlohmann::json& c : ref_["cases"]) {
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    absl::StatusOr<std::string> plain = tokenizer_->Decode(ids, /*render_special=*/false);
    absl::StatusOr<std::string> rendered = tokenizer_->Decode(ids, /*render_special=*/true);
    ASSERT_TRUE(plain.ok() && rendered.ok()) << plain.status() << rendered.status();
    EXPECT_EQ(ToHex(*plain), c["decode_hex"].get<std::string>()) << Describe(c);
    EXPECT_EQ(ToHex(*rendered), c["decode_special_hex"].get<std::string>()) << Describe(c);
  }
}

// Byte-level BPE loses nothing: decoding the ids gives the text back, with
// special tokens rendered; invalid UTF-8 comes back as its repair. The one
// exception (the reference marks it) is a byte the vocabulary has no piece
// for.
TEST_P(BpeReferenceTest, EncodeThenDecodeRoundTripsText) {
  int lossy = 0;
  for (const nlohmann::json& c : ref_["cases"]) {
    if (!c["round_trips"].get<bool>()) {
      ++lossy;
      continue;
    }
    const std::string text = FromHex(c["text_hex"].get<std::string>());
    const bool special = c["parse_special"].get<bool>();
    const std::vector<int32_t> ids = tokenizer_->Encode(text, false, special);
    const std::string expected = ToValidUtf8PerByte(text);
    absl::StatusOr<std::string> decoded = tokenizer_->Decode(ids, /*render_special=*/true);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(ToHex(*decoded), ToHex(expected)) << Describe(c);
    absl::StatusOr<std::string> detokenized = tokenizer_->Detokenize(ids, /*render_special=*/true);
    ASSERT_TRUE(detokenized.ok()) << detokenized.status();
    EXPECT_EQ(ToHex(*detokenized), ToHex(expected)) << Describe(c);
  }
  EXPECT_LE(lossy, 2);
}

TEST_P(BpeReferenceTest, VocabularyLoadsQuickly) {
  auto file = GgufFile::Open(NamedModelPath(GetParam().env_var, GetParam().file_name).path);
  ASSERT_TRUE(file.ok()) << file.status();
  const auto start = std::chrono::steady_clock::now();
  auto t = Tokenizer::FromGguf(**file);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(t.ok()) << t.status();
  RecordProperty("from_gguf_ms", std::to_string(ms));
  std::printf("%s Tokenizer::FromGguf: %.1f ms for %d pieces\n", GetParam().name, ms, (*t)->vocab_size());
  // A few hundred ms for 152k pieces + 151k merges; the bound leaves room for a loaded shared machine.
  EXPECT_LT(ms, 3000.0);
}

INSTANTIATE_TEST_SUITE_P(RealVocabularies, BpeReferenceTest, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<BpeModel>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace decoded
