// Pre-tokenizer splits against HF tokenizers' regex engine
// (tests/data/bpe_pretokenizer_reference.json, written by
// tools/gen_bpe_tokenizer_reference.py: a Sequence of Split(Regex, "isolated")
// over llama.cpp's regexes for each tokenizer.ggml.pre), for every supported
// name, including those without a real model here.
#include "engine/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"

namespace decoded {
namespace {

using ::decoded::testing::TestDataPath;

std::vector<std::string> Split(const PreTokenizer& pre, std::string_view text) {
  std::vector<std::string_view> pieces;
  pre.Split(text, pieces);
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

TEST(PreTokenizerTest, SplitsMatchHfTokenizers) {
  std::ifstream in(TestDataPath("bpe_pretokenizer_reference.json"));
  ASSERT_TRUE(in.good()) << "missing tests/data/bpe_pretokenizer_reference.json";
  const nlohmann::json ref = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(ref.is_discarded());
  std::vector<std::string> covered;
  for (const auto& [name, spec] : ref["pretokenizers"].items()) {
    absl::StatusOr<std::unique_ptr<PreTokenizer>> pre = PreTokenizer::Create(name);
    ASSERT_TRUE(pre.ok()) << pre.status();
    ASSERT_GE(spec["cases"].size(), 20u);
    for (const nlohmann::json& c : spec["cases"]) {
      const std::string text = c["text"].get<std::string>();
      EXPECT_EQ(Split(**pre, text), c["pieces"].get<std::vector<std::string>>())
          << name << " on " << c["text"].dump();
    }
    covered.push_back(name);
  }
  // Every supported name has reference splits.
  for (std::string_view name : PreTokenizer::SupportedNames()) {
    EXPECT_NE(std::find(covered.begin(), covered.end(), name), covered.end()) << name;
  }
}

TEST(PreTokenizerTest, SupportsTheNamesOfTheFamiliesWeServe) {
  const std::vector<std::string_view> expected = {"default", "gpt-2",  "phi-2",       "llama-bpe", "glm4",
                                                  "qwen2",   "smollm", "deepseek-llm"};
  const absl::Span<const std::string_view> names = PreTokenizer::SupportedNames();
  EXPECT_EQ(std::vector<std::string_view>(names.begin(), names.end()), expected);
}

// Phi-2's GGUF files name GPT-2's split "phi-2" (llama.cpp maps it to GPT2).
TEST(PreTokenizerTest, Phi2SplitsAsGpt2) {
  auto phi2 = PreTokenizer::Create("phi-2");
  auto gpt2 = PreTokenizer::Create("gpt-2");
  ASSERT_TRUE(phi2.ok() && gpt2.ok());
  for (const char* text : {"Hello world, it's 2024!", "  def f(x):\n\treturn x  ", "\xE4\xB8\xAD\xE6\x96\x87 ok"}) {
    EXPECT_EQ(Split(**phi2, text), Split(**gpt2, text)) << text;
  }
}

TEST(PreTokenizerTest, UnknownNameIsRefusedNamingItAndTheSupportedOnes) {
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre = PreTokenizer::Create("tekken");
  ASSERT_FALSE(pre.ok());
  EXPECT_EQ(pre.status().code(), absl::StatusCode::kUnimplemented);
  const std::string message(pre.status().message());
  EXPECT_NE(message.find("\"tekken\""), std::string::npos) << message;
  for (std::string_view name : PreTokenizer::SupportedNames()) {
    EXPECT_NE(message.find(name), std::string::npos) << message;
  }
}

TEST(PreTokenizerTest, OnlyLlama3StyleNamesTakeWholeWordPieces) {
  for (std::string_view name : PreTokenizer::SupportedNames()) {
    auto pre = PreTokenizer::Create(name);
    ASSERT_TRUE(pre.ok());
    EXPECT_EQ((*pre)->ignore_merges(), name == "llama-bpe" || name == "glm4") << name;
  }
}

// Expected splits worked by hand from the regexes (the same inputs are in the
// reference file where HF's engine agrees).
TEST(PreTokenizerTest, WhitespaceIsUnicodeWhiteSpaceWithoutU180E) {
  auto gpt2 = PreTokenizer::Create("gpt-2");
  ASSERT_TRUE(gpt2.ok());
  // U+180E MONGOLIAN VOWEL SEPARATOR is no longer White_Space (Unicode 6.3):
  // it is a symbol here, glued to the space before it. U+0085 and U+3000 are
  // white space: a run before a letter leaves its last character to the word.
  EXPECT_EQ(Split(**gpt2, "a \xE1\xA0\x8E"), (std::vector<std::string>{"a", " \xE1\xA0\x8E"}));
  EXPECT_EQ(Split(**gpt2, "a\xC2\x85\xE3\x80\x80 b"),
            (std::vector<std::string>{"a", "\xC2\x85\xE3\x80\x80", " b"}));
}

TEST(PreTokenizerTest, LettersAndNumbersOfUnicode15Count) {
  auto qwen2 = PreTokenizer::Create("qwen2");
  ASSERT_TRUE(qwen2.ok());
  // U+31350 (CJK extension H, Unicode 15.0) is a letter: one word with a and b.
  EXPECT_EQ(Split(**qwen2, "a\xF0\xB1\x8D\x90" "b"), (std::vector<std::string>{"a\xF0\xB1\x8D\x90" "b"}));
  // U+1D2C0 (Kaktovik numeral, Unicode 15.0) is a number: alone, like a digit.
  EXPECT_EQ(Split(**qwen2, "x\xF0\x9D\x8B\x80"), (std::vector<std::string>{"x", "\xF0\x9D\x8B\x80"}));
}

TEST(PreTokenizerTest, ContractionsMatchAsciiCaseOnly) {
  auto llama3 = PreTokenizer::Create("llama-bpe");
  ASSERT_TRUE(llama3.ok());
  EXPECT_EQ(Split(**llama3, "WE'LL"), (std::vector<std::string>{"WE", "'LL"}));
  // "'" + U+017F LATIN SMALL LETTER LONG S: no contraction (llama.cpp), so
  // the apostrophe prefixes the letter run.
  EXPECT_EQ(Split(**llama3, "it'\xC5\xBFt"), (std::vector<std::string>{"it", "'\xC5\xBFt"}));
}

TEST(PreTokenizerTest, EachPieceIsMatchedOnItsOwn) {
  auto smollm = PreTokenizer::Create("smollm");
  ASSERT_TRUE(smollm.ok());
  // Digits are split off first; the GPT-2 regex then sees " and  " alone, so
  // \s+(?!\S) takes both spaces at the end of that piece (over the whole text
  // it would leave one space to " 9").
  EXPECT_EQ(Split(**smollm, " 2024 and  99"),
            (std::vector<std::string>{" ", "2", "0", "2", "4", " and", "  ", "9", "9"}));
}

TEST(PreTokenizerTest, LongRunsSplitWithinTheMatchLimits) {
  auto qwen2 = PreTokenizer::Create("qwen2");
  ASSERT_TRUE(qwen2.ok());
  const std::string spaces(1 << 20, ' ');
  const std::vector<std::string> pieces = Split(**qwen2, spaces + "x");
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].size(), spaces.size() - 1);
  EXPECT_EQ(pieces[1], " x");
  const std::string letters(1 << 20, 'a');
  EXPECT_EQ(Split(**qwen2, letters).size(), 1u);
}

}  // namespace
}  // namespace decoded
