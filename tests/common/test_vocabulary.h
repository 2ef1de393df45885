// A byte-level test vocabulary for the family fixtures that carry none, so
// they load through Model::Load (which needs a tokenizer) unchanged in their
// weights. <unk> <s> </s> as control tokens (ids 0, 1, 2: the fixtures' HF
// configs use 1 and 2 as BOS and EOS), then one printable ASCII byte per id
// ('!' + id - 3; GPT-2's byte-to-unicode map spells these bytes as
// themselves), no merges. Written into a temporary copy of the fixture's
// metadata (RewriteKvs: tensors byte for byte).
#ifndef DECODED_TESTS_COMMON_TEST_VOCABULARY_H_
#define DECODED_TESTS_COMMON_TEST_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_registry.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded::testing {

// The control tokens the test vocabulary starts with.
inline constexpr int32_t kTestVocabControls = 3;

// The test vocabulary's spelling of `id` (see the file comment).
inline std::string TestVocabPiece(int32_t id) {
  if (id == 0) return "<unk>";
  if (id == 1) return "<s>";
  if (id == 2) return "</s>";
  return std::string(1, static_cast<char>('!' + (id - kTestVocabControls)));
}

// The text a turn streams over the test vocabulary: control tokens spell nothing.
inline std::string TestVocabText(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) {
    if (id >= kTestVocabControls) text += TestVocabPiece(id);
  }
  return text;
}

// A temporary copy of tests/data/`gguf` with the test vocabulary of `vocab`
// ids added, and `extra` metadata edits; "" (with a test failure) when it
// cannot be made.
inline std::string CopyWithTestVocabulary(const std::string& gguf, int vocab, std::vector<KvEdit> extra = {}) {
  // '!' .. '~' are the bytes GPT-2's byte-to-unicode map spells as themselves.
  if (vocab <= kTestVocabControls || vocab - kTestVocabControls > '~' - '!' + 1) {
    ADD_FAILURE() << gguf << ": vocabulary of " << vocab << " does not fit the test vocabulary";
    return "";
  }
  std::vector<std::string> tokens, types;
  for (int32_t id = 0; id < vocab; ++id) {
    tokens.push_back(EncStr(TestVocabPiece(id)));
    types.push_back(Enc<int32_t>(id < kTestVocabControls ? 3 : 1));  // llama.cpp: 3 control, 1 normal
  }
  std::vector<KvEdit> edits = {
      {"tokenizer.ggml.model", kStr, EncStr("gpt2")},
      {"tokenizer.ggml.pre", kStr, EncStr("gpt-2")},
      {"tokenizer.ggml.tokens", kArr, EncArr(kStr, tokens)},
      {"tokenizer.ggml.token_type", kArr, EncArr(kI32, types)},
      {"tokenizer.ggml.merges", kArr, EncArr(kStr, {})},
      {"tokenizer.ggml.bos_token_id", kU32, Enc<uint32_t>(1)},
      {"tokenizer.ggml.eos_token_id", kU32, Enc<uint32_t>(2)}};
  edits.insert(edits.end(), extra.begin(), extra.end());
  const std::vector<uint8_t> bytes = RewriteKvs(ReadFileBytes(TestDataPath(gguf)), edits);
  if (bytes.empty()) return "";
  return WriteTempFile(bytes, "test_vocabulary");
}

// A fixture Model::Load can open: Gemma 3's carry their own vocabulary; the
// others get the test vocabulary (tests/common/test_vocabulary.h) in a copy.
inline std::string LoadableFixturePath(const std::string& fixture) {
  if (fixture.rfind("gemma3", 0) == 0) return TestDataPath(fixture);
  auto file = GgufFile::Open(TestDataPath(fixture));
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return "";
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return "";
  auto family = CreateFamily(*weights);
  EXPECT_TRUE(family.ok()) << family.status();
  if (!family.ok()) return "";
  return CopyWithTestVocabulary(fixture, (*family)->dims().vocab);
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_TEST_VOCABULARY_H_
