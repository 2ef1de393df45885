// server/http/openai_request.h on bodies an outside tester sent to take the
// daemon down (a number beyond a double, a non-string response_format type,
// a prompt nested 100,000 deep, megabytes of empty objects) and on the
// fields it found refused or accepted wrongly: each is a 400 naming its
// field, never an exception or a crash.
#include "server/http/openai_request.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace decoded::server::http {
namespace {

constexpr char kChat[] = R"("model": "m", "messages": [{"role": "user", "content": "hi"}])";

// The status of parsing `body` as a chat request; its param in *param.
absl::StatusCode Chat(const std::string& body, std::string* param = nullptr) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(body, OpenAiEndpoint::kChatCompletions);
  if (param != nullptr) *param = r.ok() ? "" : ErrorParam(r.status());
  return r.status().code();
}

absl::StatusCode Completion(const std::string& body, std::string* param = nullptr) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(body, OpenAiEndpoint::kCompletions);
  if (param != nullptr) *param = r.ok() ? "" : ErrorParam(r.status());
  return r.status().code();
}

TEST(OpenAiRequestTest, ANumberBeyondADoubleIsMalformedJson) {
  for (const char* n : {"-1e999", "1e400", "1E+99999"}) {
    std::string param;
    absl::StatusOr<OpenAiRequest> r =
        ParseOpenAiRequest(absl::StrCat("{", kChat, R"(, "foo": )", n, "}"), OpenAiEndpoint::kChatCompletions);
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_EQ(ErrorParam(r.status()), "body") << n;
    EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos) << r.status();
  }
}

TEST(OpenAiRequestTest, AResponseFormatTypeThatIsNotAStringIsRefused) {
  for (const char* type : {"null", "5", "[\"text\"]", "{}", "\"json_object\""}) {
    std::string param;
    EXPECT_EQ(Chat(absl::StrCat("{", kChat, R"(, "response_format": {"type": )", type, "}}"), &param),
              absl::StatusCode::kInvalidArgument)
        << type;
    EXPECT_EQ(param, "response_format") << type;
  }
  EXPECT_EQ(Chat(absl::StrCat("{", kChat, R"(, "response_format": {"type": "text"}})")), absl::StatusCode::kOk);
}

TEST(OpenAiRequestTest, DeepNestingIsRefusedBeforeAnythingWalksIt) {
  std::string param;
  const int depth = 100000;
  const std::string deep = std::string(depth, '[') + "1" + std::string(depth, ']');
  absl::StatusOr<OpenAiRequest> r =
      ParseOpenAiRequest(absl::StrCat(R"({"model": "m", "prompt": )", deep, "}"), OpenAiEndpoint::kCompletions);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ErrorParam(r.status()), "body");
  EXPECT_NE(r.status().message().find("nested deeper than 64"), std::string::npos) << r.status();
  // Within the limit, a prompt nested beyond a batch of one is the prompt's
  // error.
  EXPECT_EQ(Completion(R"({"model": "m", "prompt": [[[1, 2]]]})", &param), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(param, "prompt");
  EXPECT_EQ(Completion(R"({"model": "m", "prompt": [[1, 2]]})"), absl::StatusCode::kOk);
  EXPECT_EQ(Completion(R"({"model": "m", "prompt": ["text"]})"), absl::StatusCode::kOk);
}

TEST(OpenAiRequestTest, MoreValuesThanAnyRequestHoldsAreRefused) {
  std::string body = R"({"model": "m", "prompt": "x", "junk": [)";
  for (int i = 0; i < (1 << 20) + 1; ++i) body += i == 0 ? "{}" : ",{}";
  body += "]}";
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(body, OpenAiEndpoint::kCompletions);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 1048576 values"), std::string::npos) << r.status();
  // A context's worth of token ids is far below it.
  std::string ids = R"({"model": "m", "prompt": [1)";
  for (int i = 1; i < 131072; ++i) ids += ",1";
  ids += "]}";
  EXPECT_EQ(Completion(ids), absl::StatusCode::kOk);
}

TEST(OpenAiRequestTest, FieldsTheTesterFoundMisjudged) {
  std::string param;
  // An empty tool_calls list is no tool call.
  EXPECT_EQ(Chat(R"({"model": "m", "messages": [{"role": "assistant", "content": "a", "tool_calls": []},
                 {"role": "user", "content": "b"}]})"),
            absl::StatusCode::kOk);
  EXPECT_EQ(Chat(R"({"model": "m", "messages": [{"role": "assistant", "content": "a", "tool_calls": [{}]}]})",
                 &param),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(param, "messages[0].tool_calls");
  // min_p 1 is outside the sampler's [0, 1): refused here, naming it.
  EXPECT_EQ(Chat(absl::StrCat("{", kChat, R"(, "min_p": 1})"), &param), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(param, "min_p");
  EXPECT_EQ(Chat(absl::StrCat("{", kChat, R"(, "min_p": 0.99})")), absl::StatusCode::kOk);
  // Streamed, the echo chunk goes before the prompt's logprobs exist.
  EXPECT_EQ(Completion(R"({"model": "m", "prompt": "x", "echo": true, "logprobs": 1, "stream": true})", &param),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(param, "echo");
  EXPECT_EQ(Completion(R"({"model": "m", "prompt": "x", "echo": true, "logprobs": 1})"), absl::StatusCode::kOk);
  // A huge max_tokens written as a float: the message gives the range.
  absl::StatusOr<OpenAiRequest> r =
      ParseOpenAiRequest(absl::StrCat("{", kChat, R"(, "max_tokens": 1e23})"), OpenAiEndpoint::kChatCompletions);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ErrorParam(r.status()), "max_tokens");
  EXPECT_NE(r.status().message().find("[0, 2147483647]"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace decoded::server::http
