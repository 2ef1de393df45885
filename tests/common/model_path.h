// Locating the real model for tests (see tests/CMakeLists.txt).
#ifndef DECODED_TESTS_COMMON_MODEL_PATH_H_
#define DECODED_TESTS_COMMON_MODEL_PATH_H_

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace decoded::testing {

inline std::string RealModelPath() {
  if (const char* p = std::getenv("DECODED_MODEL_PATH"); p && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/decoded/gemma-3-270m-q4_k_m.gguf";
}

inline bool RealModelRequired() {
  const char* r = std::getenv("DECODED_REQUIRE_MODEL");
  return r && std::string(r) == "1";
}

// A further real model whose path `env_var` names (e.g. DECODED_SMOLLM2_PATH),
// else ~/.cache/decoded/`file_name`. `required`: the variable is set, so a
// missing file is a failure, not a skip (CI sets the variables once it
// fetches the file).
struct NamedModel {
  std::string path;
  bool required;
};

inline NamedModel NamedModelPath(const char* env_var, const char* file_name) {
  if (const char* p = std::getenv(env_var); p && *p) return {p, true};
  const char* home = std::getenv("HOME");
  return {std::string(home ? home : "/root") + "/.cache/decoded/" + file_name, false};
}

// Data files committed under tests/data.
inline std::string TestDataPath(const std::string& name) {
  return std::string(DECODED_TEST_DATA_DIR) + "/" + name;
}

}  // namespace decoded::testing

// Skips the test when the real model is absent, fails when it is required.
#define DECODED_REQUIRE_REAL_MODEL()                                                   \
  do {                                                                               \
    if (!std::filesystem::exists(::decoded::testing::RealModelPath())) {             \
      if (::decoded::testing::RealModelRequired()) {                                 \
        FAIL() << "real model missing at " << ::decoded::testing::RealModelPath();   \
      }                                                                              \
      GTEST_SKIP() << "real model missing at " << ::decoded::testing::RealModelPath(); \
    }                                                                                \
  } while (0)

// Skips the test when the NamedModel `model` is absent, fails when it is required.
#define DECODED_REQUIRE_NAMED_MODEL(model)                                        \
  do {                                                                          \
    if (!std::filesystem::exists((model).path)) {                               \
      if ((model).required) FAIL() << "model missing at " << (model).path;      \
      GTEST_SKIP() << "model missing at " << (model).path;                      \
    }                                                                           \
  } while (0)

#endif  // DECODED_TESTS_COMMON_MODEL_PATH_H_
