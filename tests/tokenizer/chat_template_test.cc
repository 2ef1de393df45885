// Expected strings are Gemma's Hugging Face chat template
// (google/gemma-3-270m-it tokenizer_config.json) rendered by hand.
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/tokenizer/real_tokenizer.h"
#include "tests/tokenizer/test_vocab.h"

namespace decoded {
namespace {

using ::decoded::testing::MakeTokenizer;

TEST(ChatTemplateTest, SingleUserTurnWithGenerationPrompt) {
  auto t = MakeTokenizer({});
  absl::StatusOr<std::string> s = t->ApplyChatTemplate({{"user", "Hello"}}, true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplateTest, SystemTextIsFoldedIntoTheFirstUserTurn) {
  auto t = MakeTokenizer({});
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", "  Hi  "}, {"assistant", "Hello!\n"}, {"user", "Bye"}};
  absl::StatusOr<std::string> s = t->ApplyChatTemplate(messages, false);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n");
}

TEST(ChatTemplateTest, ModelRoleIsAcceptedAsAssistant) {
  auto t = MakeTokenizer({});
  absl::StatusOr<std::string> s = t->ApplyChatTemplate({{"user", "a"}, {"model", "b"}}, false);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\nb<end_of_turn>\n");
}

TEST(ChatTemplateTest, BadRolesAreRejected) {
  auto t = MakeTokenizer({});
  EXPECT_EQ(t->ApplyChatTemplate({{"tool", "x"}}, true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->ApplyChatTemplate({{"user", "x"}, {"system", "y"}}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->ApplyChatTemplate({{"system", "y"}}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, VocabularyWithoutTurnTokensHasNoTemplate) {
  TokenizerVocab v;
  v.pieces = {"<unk>", "<s>", "</s>", "a"};
  v.types = {TokenType::kControl, TokenType::kControl, TokenType::kControl, TokenType::kNormal};
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  auto t = Tokenizer::FromVocab(v);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->ApplyChatTemplate({{"user", "x"}}, true).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(ChatTemplateTest, RenderedPromptEncodesWithASingleBosAndTurnTokens) {
  DECODED_REQUIRE_REAL_MODEL();
  const Tokenizer* t = ::decoded::testing::RealTokenizer();
  ASSERT_NE(t, nullptr);
  absl::StatusOr<std::string> s = t->ApplyChatTemplate({{"user", "Hello"}}, true);
  ASSERT_TRUE(s.ok());
  const std::vector<int32_t> ids = t->Encode(*s, true, true);
  const int32_t sot = t->PieceToId("<start_of_turn>");
  const int32_t eot = t->PieceToId("<end_of_turn>");
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids[0], t->bos_id());
  EXPECT_NE(ids[1], t->bos_id());
  EXPECT_EQ(ids[1], sot);
  int sots = 0, eots = 0;
  for (int32_t id : ids) {
    sots += id == sot;
    eots += id == eot;
  }
  EXPECT_EQ(sots, 2);
  EXPECT_EQ(eots, 1);
  // Rendering a leading "<bos>" as text must not double it either.
  EXPECT_EQ(t->Encode("<bos>" + *s, true, true), ids);
}

}  // namespace
}  // namespace decoded
