// The tiny GGUF fixture of every family variant under tests/data (one per
// architecture path: Gemma 3 sliding window, softcap and f16; Llama with and
// without Llama-3 RoPE scaling and YaRN; Qwen2/2-YaRN/3/3-MoE; Phi-3, Phi-2;
// SmolLM3; GLM-4; DeepSeek-V2 MHA/Lite/MoE, DeepSeek-V3), for suites that
// check a property on all of them:
//   INSTANTIATE_TEST_SUITE_P(Fixtures, MyTest, ::testing::ValuesIn(testing::kFamilyFixtures),
//                            testing::FixtureTestName);
#ifndef DECODED_TESTS_COMMON_FAMILY_FIXTURES_H_
#define DECODED_TESTS_COMMON_FAMILY_FIXTURES_H_

#include <string>

#include "gtest/gtest.h"

namespace decoded::testing {

inline constexpr const char* kFamilyFixtures[] = {
    "gemma3_tiny_swa.gguf", "gemma3_tiny_softcap.gguf", "gemma3_tiny_f16.gguf", "llama_tiny.gguf",
    "llama3rope_tiny.gguf", "llamayarn_tiny.gguf",      "qwen2_tiny.gguf",      "qwen2yarn_tiny.gguf",
    "qwen3_tiny.gguf",      "qwen3moe_tiny.gguf",       "phi3_tiny.gguf",       "phi2_tiny.gguf",
    "smollm3_tiny.gguf",    "glm4_tiny.gguf",           "deepseek2_tiny.gguf",  "deepseek2lite_tiny.gguf",
    "deepseek2moe_tiny.gguf", "deepseek3_tiny.gguf",
};

// The test name of a fixture parameter: its file name without ".gguf".
inline std::string FixtureTestName(const ::testing::TestParamInfo<const char*>& info) {
  const std::string name = info.param;
  return name.substr(0, name.find('.'));
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_FAMILY_FIXTURES_H_
