// Multi-turn chat over one Generate stream on the instruction-tuned models,
// through the real server: sensible replies, the template's end-of-turn
// token ends each reply, and the context after N turns is the rendering of
// the whole conversation at once (compared with a fresh stream that sends
// the whole conversation in one turn, and with the tokenizer's own
// rendering of it, loaded in-process from the same file).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/decoded.grpc.pb.h"
#include "server/server.h"
#include "tests/common/model_path.h"
#include "tests/server/e2e_support.h"

namespace decoded::server {
namespace {

using e2e::ReadTurn;
using e2e::TurnResult;

struct ChatModel {
  const char* name;
  const char* env_var;
  const char* file;
};

class ChatE2eTest : public ::testing::TestWithParam<ChatModel> {
 protected:
  void SetUp() override {
    model_ = testing::NamedModelPath(GetParam().env_var, GetParam().file);
    if (!std::filesystem::exists(model_.path)) {
      if (model_.required || testing::RealModelRequired()) FAIL() << "model missing at " << model_.path;
      GTEST_SKIP() << "model missing at " << model_.path;
    }
    serving::EngineOptions eo;
    eo.model_path = model_.path;
    eo.workers = 1;
    eo.threads_per_worker = 2;
    eo.context_length = 1024;
    auto server = e2e::StartServer(eo);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Decoder::NewStub(e2e::ChannelTo(*server_));
    auto file = GgufFile::Open(model_.path);
    ASSERT_TRUE(file.ok()) << file.status();
    auto tokenizer = Tokenizer::FromGguf(**file);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  static v1::GenerateRequest Chat(const std::vector<ChatMessage>& messages, int max_new_tokens) {
    v1::GenerateRequest req;
    for (const ChatMessage& m : messages) {
      v1::ChatMessage* pm = req.mutable_turn()->mutable_messages()->add_messages();
      pm->set_role(m.role);
      pm->set_content(m.content);
    }
    req.mutable_turn()->mutable_stopping()->set_max_new_tokens(max_new_tokens);
    req.mutable_turn()->mutable_sampling()->set_temperature(0);  // greedy
    req.mutable_turn()->mutable_sampling()->set_top_logprobs(0);
    return req;
  }

  testing::NamedModel model_;
  std::unique_ptr<DecodedServer> server_;
  std::unique_ptr<v1::Decoder::Stub> stub_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_P(ChatE2eTest, MultiTurnChatOverOneStreamIsTheWholeConversation) {
  grpc::ClientContext info_ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&info_ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.tokenizer(), "byte_level_bpe");
  EXPECT_FALSE(info.chat_template().empty());
  EXPECT_EQ(info.chat_template_error(), "");
  const int32_t im_end = tokenizer_->PieceToId("<|im_end|>");
  ASSERT_GE(im_end, 0);
  EXPECT_TRUE(tokenizer_->IsEndOfGeneration(im_end));

  const std::vector<std::pair<std::vector<ChatMessage>, std::string>> turns = {
      {{{"system", "You are a helpful assistant. Answer in one short sentence."},
        {"user", "What is the capital of France?"}},
       "Paris"},
      {{{"user", "And what is the capital of Germany?"}}, "Berlin"},
      {{{"user", "Which of the two cities is larger?"}}, ""},
  };
  grpc::ClientContext ctx;
  auto stream = stub_->Generate(&ctx);
  std::vector<ChatMessage> conversation;
  for (const auto& [messages, expected] : turns) {
    ASSERT_TRUE(stream->Write(Chat(messages, 48)));
    TurnResult r = ReadTurn(stream.get());
    ASSERT_TRUE(r.ended);
    // The reply ends at the template's end-of-turn token, not at the limit.
    EXPECT_EQ(r.end.finish_reason(), v1::STOP_TOKEN) << r.text;
    ASSERT_FALSE(r.ids.empty());
    EXPECT_EQ(r.ids.back(), im_end) << r.text;
    EXPECT_TRUE(absl::StrContains(r.text, expected)) << GetParam().name << " replied: " << r.text;
    EXPECT_FALSE(absl::StrContains(r.text, "<|im_")) << r.text;
    conversation.insert(conversation.end(), messages.begin(), messages.end());
    conversation.push_back({"assistant", r.text + r.end.text()});
    std::cout << GetParam().name << ": " << r.text << "\n";
  }

  // One more user message, prefill only: the context now holds exactly the
  // template's rendering of the whole conversation with its generation prompt.
  const ChatMessage last = {"user", "Thanks!"};
  ASSERT_TRUE(stream->Write(Chat({last}, 0)));
  TurnResult prefill_only = ReadTurn(stream.get());
  ASSERT_TRUE(prefill_only.ended);
  conversation.push_back(last);
  absl::StatusOr<std::vector<int32_t>> whole = tokenizer_->EncodeChat(conversation, true, false);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(prefill_only.end.usage().context_tokens(), static_cast<int32_t>(whole->size()));
  // The turn reused the context up to the last reply's end, recomputing none of it.
  EXPECT_GE(prefill_only.end.usage().cached_tokens(), static_cast<int32_t>(whole->size()) - 12);

  // The next reply equals that of a fresh stream given the whole
  // conversation in one turn: same context, same greedy tokens.
  const ChatMessage next = {"user", "Name one famous landmark in the larger one."};
  ASSERT_TRUE(stream->Write(Chat({next}, 16)));
  TurnResult continued = ReadTurn(stream.get());
  conversation.push_back(next);
  grpc::ClientContext fresh_ctx;
  auto fresh_stream = stub_->Generate(&fresh_ctx);
  ASSERT_TRUE(fresh_stream->Write(Chat(conversation, 16)));
  TurnResult fresh = ReadTurn(fresh_stream.get());
  ASSERT_TRUE(continued.ended && fresh.ended);
  EXPECT_EQ(continued.end.usage().context_tokens(), fresh.end.usage().context_tokens());
  EXPECT_EQ(continued.ids, fresh.ids) << continued.text << " | " << fresh.text;
  ASSERT_EQ(continued.events.size(), fresh.events.size());
  for (size_t i = 0; i < continued.events.size(); ++i) {
    // Prefill chunking differs between the two, so logits agree to rounding.
    EXPECT_NEAR(continued.events[i].logprob(), fresh.events[i].logprob(), 1e-3) << i;
  }
  stream->WritesDone();
  fresh_stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(fresh_stream->Finish().ok());
}

INSTANTIATE_TEST_SUITE_P(
    InstructModels, ChatE2eTest,
    ::testing::Values(ChatModel{"SmolLM2", "DECODED_SMOLLM2_PATH", "smollm2-135m-instruct-q4_1.gguf"},
                      ChatModel{"Qwen2", "DECODED_QWEN2_PATH", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}),
    [](const ::testing::TestParamInfo<ChatModel>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace decoded::server
