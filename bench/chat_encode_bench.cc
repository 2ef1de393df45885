// Cost of a chat turn's start: rendering the whole conversation with the
// model's chat template and tokenizing it (Tokenizer::EncodeChat). The
// scheduler does this when a chat turn starts, under its lock, so this is the
// time other sessions' bookkeeping can wait behind one chat turn.
//
//   build/bench/chat_encode_bench --model ~/.cache/decoded/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "benchmark/benchmark.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model, "", "GGUF file whose tokenizer and chat template to use");

namespace {

std::unique_ptr<decoded::Tokenizer> g_tokenizer;

// A conversation of `turns` user/assistant exchanges of ~60 words each.
std::vector<decoded::ChatMessage> Conversation(int turns) {
  const std::string sentence =
      "The quick brown fox jumps over the lazy dog, and then it runs into the forest to find some food. ";
  std::vector<decoded::ChatMessage> messages = {{"system", "You are a helpful assistant."}};
  for (int i = 0; i < turns; ++i) {
    messages.push_back({"user", sentence + sentence + "What happens next?"});
    messages.push_back({"assistant", sentence + sentence + sentence});
  }
  messages.push_back({"user", "Thanks!"});
  return messages;
}

void BM_EncodeConversation(benchmark::State& state) {
  const std::vector<decoded::ChatMessage> messages = Conversation(static_cast<int>(state.range(0)));
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = g_tokenizer->EncodeChat(messages, /*add_generation_prompt=*/true, /*parse_special_in_content=*/false);
    if (!ids.ok()) {
      state.SkipWithError(std::string(ids.status().message()).c_str());
      return;
    }
    tokens = ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.counters["tokens"] = static_cast<double>(tokens);
}
BENCHMARK(BM_EncodeConversation)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  auto file = decoded::GgufFile::Open(absl::GetFlag(FLAGS_model));
  if (!file.ok()) {
    std::cerr << "chat_encode_bench: " << file.status() << "\n";
    return 1;
  }
  auto tokenizer = decoded::Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) {
    std::cerr << "chat_encode_bench: " << tokenizer.status() << "\n";
    return 1;
  }
  g_tokenizer = *std::move(tokenizer);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
