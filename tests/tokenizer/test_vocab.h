// A small SentencePiece-style vocabulary for tokenizer tests that need no model.
#ifndef DECODED_TESTS_TOKENIZER_TEST_VOCAB_H_
#define DECODED_TESTS_TOKENIZER_TEST_VOCAB_H_

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace decoded::testing {

struct PieceSpec {
  std::string piece;
  float score;
  TokenType type;
};

// Ids: 0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, 4 <start_of_turn>, 5 <end_of_turn>,
// 6..261 <0x00>..<0xFF>, then `extra` in order (first extra id = 262).
inline TokenizerVocab MakeVocab(const std::vector<PieceSpec>& extra, bool add_space_prefix = false) {
  TokenizerVocab v;
  auto add = [&](std::string piece, float score, TokenType type) {
    v.pieces.push_back(std::move(piece));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<pad>", 0, TokenType::kControl);
  add("<eos>", 0, TokenType::kControl);
  add("<bos>", 0, TokenType::kControl);
  add("<unk>", 0, TokenType::kControl);
  add("<start_of_turn>", 0, TokenType::kControl);
  add("<end_of_turn>", 0, TokenType::kControl);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    add(name, 0, TokenType::kByte);
  }
  for (const PieceSpec& p : extra) add(p.piece, p.score, p.type);
  v.pad_id = 0;
  v.eos_id = 1;
  v.bos_id = 2;
  v.unk_id = 3;
  v.add_bos = true;
  v.add_space_prefix = add_space_prefix;
  return v;
}

constexpr int32_t kFirstExtra = 262;
constexpr int32_t ByteId(int b) { return 6 + b; }

inline std::unique_ptr<Tokenizer> MakeTokenizer(const std::vector<PieceSpec>& extra,
                                                bool add_space_prefix = false) {
  auto t = Tokenizer::FromVocab(MakeVocab(extra, add_space_prefix));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_TOKENIZER_TEST_VOCAB_H_
