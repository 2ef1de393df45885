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

#endif  // DECODED_TESTS_COMMON_MODEL_PATH_H_
