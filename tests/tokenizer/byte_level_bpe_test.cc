// Byte-level BPE ("gpt2") behaviour on small hand-built vocabularies; expected
// ids follow from the rules stated in tokenizer.h, worked by hand.
#include <string>
#include <utility>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_parser.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded {
namespace {

using Ids = std::vector<int32_t>;
using ::decoded::testing::Enc;
using ::decoded::testing::EncArr;
using ::decoded::testing::EncStr;
using ::decoded::testing::GgufWriter;

// GPT-2's bytes_to_unicode(), written out: printable Latin-1 bytes spell
// themselves, the others U+0100, U+0101, ... in byte order.
std::string ByteSpelling(int b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int cp = b;
  if (!printable) {
    cp = 0x100;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++cp;
    }
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

struct Extra {
  std::string piece;  // byte-level spelling (or raw text for special tokens)
  TokenType type = TokenType::kNormal;
};

// Ids 0..255: the piece of each byte (id == byte value); then `extra` from 256.
TokenizerVocab MakeVocab(const std::vector<Extra>& extra, std::vector<std::string> merges,
                         std::string pre = "gpt-2") {
  TokenizerVocab v;
  v.model = "gpt2";
  v.pre = std::move(pre);
  for (int b = 0; b < 256; ++b) {
    v.pieces.push_back(ByteSpelling(b));
    v.types.push_back(TokenType::kNormal);
  }
  for (const Extra& e : extra) {
    v.pieces.push_back(e.piece);
    v.types.push_back(e.type);
  }
  v.merges = std::move(merges);
  v.add_bos = false;
  return v;
}

std::unique_ptr<Tokenizer> Make(const std::vector<Extra>& extra, std::vector<std::string> merges,
                                std::string pre = "gpt-2") {
  auto t = Tokenizer::FromVocab(MakeVocab(extra, std::move(merges), std::move(pre)));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

TEST(ByteLevelBpeTest, TheLowestRankedPairMergesFirst) {
  // ab=256 bc=257
  auto bc_first = Make({{"ab"}, {"bc"}}, {"b c", "a b"});
  EXPECT_EQ(bc_first->Encode("abc", false, false), (Ids{'a', 257}));
  auto ab_first = Make({{"ab"}, {"bc"}}, {"a b", "b c"});
  EXPECT_EQ(ab_first->Encode("abc", false, false), (Ids{256, 'c'}));
}

TEST(ByteLevelBpeTest, EqualRanksMergeTheLeftmostPair) {
  auto t = Make({{"aa"}}, {"a a"});
  EXPECT_EQ(t->Encode("aaa", false, false), (Ids{256, 'a'}));
  EXPECT_EQ(t->Encode("aaaa", false, false), (Ids{256, 256}));
}

TEST(ByteLevelBpeTest, MergesChainThroughIntermediatePieces) {
  // he=256 ll=257 hell=258 hello=259
  auto t = Make({{"he"}, {"ll"}, {"hell"}, {"hello"}}, {"h e", "l l", "he ll", "hell o"});
  EXPECT_EQ(t->Encode("hello", false, false), (Ids{259}));
  EXPECT_EQ(t->Encode("hell", false, false), (Ids{258}));
  EXPECT_EQ(t->Encode("helo", false, false), (Ids{256, 'l', 'o'}));
}

TEST(ByteLevelBpeTest, SpacesAndControlBytesAreSpelledInTheByteAlphabet) {
  // U+0120 "Ġ" spells the space, U+010A "Ċ" the newline.
  EXPECT_EQ(ByteSpelling(' '), "\xC4\xA0");
  EXPECT_EQ(ByteSpelling('\n'), "\xC4\x8A");
  auto t = Make({{"\xC4\xA0" "b"}}, {"\xC4\xA0 b"});  // "Ġb" = 256
  EXPECT_EQ(t->Encode("a b\n", false, false), (Ids{'a', 256, '\n'}));
  EXPECT_EQ(*t->Decode({'a', 256, '\n'}), "a b\n");
  EXPECT_EQ(*t->Decode({0, 0x7F, 0xAD, 0xFF}), std::string("\x00\x7F\xAD\xFF", 4));
}

TEST(ByteLevelBpeTest, MultiByteCharactersAreMergedFromTheirBytes) {
  // "é" is C3 A9, spelled "Ã" (U+00C3) + "©" (U+00A9).
  auto t = Make({{"\xC3\x83\xC2\xA9"}}, {"\xC3\x83 \xC2\xA9"});
  EXPECT_EQ(t->Encode("\xC3\xA9t\xC3\xA9", false, false), (Ids{256, 't', 256}));
  EXPECT_EQ(*t->Decode({256, 't', 256}), "\xC3\xA9t\xC3\xA9");
  // Without the merge, the bytes stay separate pieces.
  auto bare = Make({}, {});
  EXPECT_EQ(bare->Encode("\xC3\xA9", false, false), (Ids{0xC3, 0xA9}));
}

TEST(ByteLevelBpeTest, MergesNeverCrossPreTokenizerWords) {
  // gpt-2 splits "a-b" into "a", "-", "b": the merge "a -" never applies.
  auto t = Make({{"a-"}}, {"a -"});
  EXPECT_EQ(t->Encode("a-b", false, false), (Ids{'a', '-', 'b'}));
  // ...but within "--" it does for "- -".
  auto dash = Make({{"--"}}, {"- -"});
  EXPECT_EQ(dash->Encode("a--", false, false), (Ids{'a', 256}));
}

TEST(ByteLevelBpeTest, Llama3StyleVocabulariesTakeWholeWordPieces) {
  // "abc" is a piece with no merges leading to it.
  EXPECT_EQ(Make({{"abc"}}, {}, "gpt-2")->Encode("abc", false, false), (Ids{'a', 'b', 'c'}));
  EXPECT_EQ(Make({{"abc"}}, {}, "llama-bpe")->Encode("abc", false, false), (Ids{256}));
  EXPECT_EQ(Make({{"abc"}}, {}, "glm4")->Encode("x abc", false, false), (Ids{'x', ' ', 'a', 'b', 'c'}));
  EXPECT_EQ(Make({{"\xC4\xA0" "abc"}}, {}, "glm4")->Encode("x abc", false, false), (Ids{'x', 256}));
}

TEST(ByteLevelBpeTest, ControlTokensAreSplitOutOnlyWithParseSpecial) {
  // <|end|>=256 control, <tool>=257 user-defined.
  auto t = Make({{"<|end|>", TokenType::kControl}, {"<tool>", TokenType::kUserDefined}}, {});
  EXPECT_EQ(t->Encode("a<|end|>", false, true), (Ids{'a', 256}));
  const Ids plain = t->Encode("a<|end|>", false, false);
  EXPECT_EQ(plain, (Ids{'a', '<', '|', 'e', 'n', 'd', '|', '>'}));
  // User-defined tokens are split out either way.
  EXPECT_EQ(t->Encode("a<tool>b", false, false), (Ids{'a', 257, 'b'}));
  EXPECT_EQ(t->Encode("a<tool>b", false, true), (Ids{'a', 257, 'b'}));
}

TEST(ByteLevelBpeTest, DecodeRendersSpecialAndUnusedPiecesByType) {
  auto t = Make({{"<|end|>", TokenType::kControl},
                 {"<tool>", TokenType::kUserDefined},
                 {"[PAD258]", TokenType::kUnused},
                 {"\xE2\x82\xAC"}},  // "€": a normal piece outside the byte alphabet
                {});
  EXPECT_EQ(*t->Decode({'a', 256, 257, 258}), "a<tool>");
  EXPECT_EQ(*t->Decode({'a', 256, 257, 258}, true), "a<|end|><tool>");
  EXPECT_EQ(*t->Decode({259}), "\xE2\x82\xAC");
  EXPECT_EQ(t->Decode({260}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ByteLevelBpeTest, InvalidUtf8BecomesOneReplacementCharacterPerByte) {
  auto t = Make({}, {});
  // E4 B8 is a cut-short sequence: two U+FFFD (EF BF BD each), as in llama.cpp.
  EXPECT_EQ(t->Encode("\xE4\xB8" "a", false, false), (Ids{0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD, 'a'}));
  // Overlong C0 AF is two bytes that begin nothing well-formed, not "/".
  EXPECT_EQ(t->Encode("\xC0\xAF", false, false), (Ids{0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD}));
  EXPECT_EQ(*t->Decode(t->Encode("x\xFF", false, false)), "x\xEF\xBF\xBD");
}

TEST(ByteLevelBpeTest, BosOnlyWhenTheVocabularyAsks) {
  TokenizerVocab v = MakeVocab({{"<s>", TokenType::kControl}}, {});
  v.bos_id = 256;
  v.add_bos = true;
  auto t = Tokenizer::FromVocab(v);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->Encode("a", true, false), (Ids{256, 'a'}));
  EXPECT_EQ((*t)->Encode("<s>a", true, true), (Ids{256, 'a'}));
  v.add_bos = false;
  t = Tokenizer::FromVocab(v);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->Encode("a", true, false), (Ids{'a'}));
}

TEST(ByteLevelBpeTest, BytesWithoutAPieceAreDroppedButKeepTheirNeighboursApart) {
  // No piece for byte 0x04 (its spelling is renamed away); "()"=257 merges
  // from "(" and ")".
  TokenizerVocab v = MakeVocab({{"()"}}, {"( )"});
  v.pieces[0x04] = "<unused 0x04>";
  v.types[0x04] = TokenType::kUnused;
  auto t = Tokenizer::FromVocab(std::move(v));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Encode("()", false, false), (Ids{256}));
  // "(\x04)" is one pre-tokenizer word; the missing byte sits between the
  // parentheses, which therefore do not merge.
  EXPECT_EQ((*t)->Encode("(\x04)", false, false), (Ids{'(', ')'}));
  EXPECT_EQ((*t)->Encode("\x04", false, false), (Ids{}));
}

void ExpectError(TokenizerVocab v, absl::StatusCode code, const std::string& needle) {
  auto t = Tokenizer::FromVocab(std::move(v));
  ASSERT_FALSE(t.ok()) << needle;
  EXPECT_EQ(t.status().code(), code) << t.status();
  EXPECT_NE(std::string(t.status().message()).find(needle), std::string::npos) << t.status();
}

TEST(ByteLevelBpeTest, MalformedVocabulariesAreRejectedNamingTheKey) {
  using absl::StatusCode;
  ExpectError(MakeVocab({{"ab"}}, {"ab"}), StatusCode::kInvalidArgument, "tokenizer.ggml.merges[0]");
  ExpectError(MakeVocab({{"ab"}}, {"a b", "a zz"}), StatusCode::kInvalidArgument, "tokenizer.ggml.merges[1]");
  // The merge result must be a piece too.
  ExpectError(MakeVocab({}, {"a b"}), StatusCode::kInvalidArgument, "tokenizer.ggml.merges[0]");
  TokenizerVocab prefixed = MakeVocab({}, {});
  prefixed.add_space_prefix = true;
  ExpectError(prefixed, StatusCode::kInvalidArgument, "tokenizer.ggml.add_space_prefix");
  ExpectError(MakeVocab({}, {}, "tekken"), StatusCode::kUnimplemented, "\"tekken\"");
  TokenizerVocab other = MakeVocab({}, {});
  other.model = "bert";
  ExpectError(other, StatusCode::kUnimplemented, "\"bert\"");
  TokenizerVocab spm_with_merges = MakeVocab({{"ab"}}, {"a b"});
  spm_with_merges.model = "llama";
  ExpectError(spm_with_merges, StatusCode::kInvalidArgument, "tokenizer.ggml.merges");
}

// A GGUF holding only tokenizer keys, as the converter writes them.
std::vector<uint8_t> TokenizerGguf(const TokenizerVocab& v, bool with_pre, bool with_merges) {
  GgufWriter w;
  w.Kv("tokenizer.ggml.model", testing::kStr, EncStr("gpt2"));
  if (with_pre) w.Kv("tokenizer.ggml.pre", testing::kStr, EncStr(v.pre));
  std::vector<std::string> tokens, types, merges;
  for (size_t i = 0; i < v.pieces.size(); ++i) {
    tokens.push_back(EncStr(v.pieces[i]));
    types.push_back(Enc<int32_t>(static_cast<int32_t>(v.types[i])));
  }
  for (const std::string& m : v.merges) merges.push_back(EncStr(m));
  w.Kv("tokenizer.ggml.tokens", testing::kArr, EncArr(testing::kStr, tokens));
  w.Kv("tokenizer.ggml.token_type", testing::kArr, EncArr(testing::kI32, types));
  if (with_merges) w.Kv("tokenizer.ggml.merges", testing::kArr, EncArr(testing::kStr, merges));
  if (v.pieces.size() > 256) w.Kv("tokenizer.ggml.eos_token_id", testing::kU32, Enc<uint32_t>(256));
  return w.Build();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> FromGgufBytes(const std::vector<uint8_t>& bytes) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufParser::Parse(bytes.data(), bytes.size(), "tokenizer.gguf");
  if (!file.ok()) return file.status();
  return Tokenizer::FromGguf(**file);
}

TEST(ByteLevelBpeTest, FromGgufReadsMergesAndThePreTokenizer) {
  const TokenizerVocab v = MakeVocab({{"<|endoftext|>", TokenType::kControl}, {"ab"}}, {"a b"}, "qwen2");
  auto t = FromGgufBytes(TokenizerGguf(v, true, true));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->model(), "gpt2");
  EXPECT_EQ((*t)->pre_tokenizer(), "qwen2");
  EXPECT_EQ((*t)->eos_id(), 256);
  EXPECT_EQ((*t)->bos_id(), -1);
  EXPECT_EQ((*t)->prompt_bos_id(), -1);
  EXPECT_EQ((*t)->Encode("ab<|endoftext|>", true, true), (Ids{257, 256}));
  EXPECT_TRUE((*t)->IsEndOfGeneration(256));
}

TEST(ByteLevelBpeTest, FromGgufDefaultsAMissingPreTokenizerAsLlamaCppDoes) {
  TokenizerVocab v = MakeVocab({}, {});
  auto t = FromGgufBytes(TokenizerGguf(v, false, true));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->pre_tokenizer(), "default");
}

TEST(ByteLevelBpeTest, FromGgufRefusesAnUnknownPreTokenizerNamingIt) {
  TokenizerVocab v = MakeVocab({}, {}, "superbpe");
  auto t = FromGgufBytes(TokenizerGguf(v, true, true));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
  const std::string message(t.status().message());
  EXPECT_NE(message.find("\"superbpe\""), std::string::npos) << message;
  EXPECT_NE(message.find("qwen2"), std::string::npos) << message;
}

TEST(ByteLevelBpeTest, FromGgufNeedsMerges) {
  auto t = FromGgufBytes(TokenizerGguf(MakeVocab({}, {}), true, false));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(t.status().message()).find("tokenizer.ggml.merges"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace decoded
