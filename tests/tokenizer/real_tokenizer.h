// Loads the real Gemma 3 tokenizer once per test binary.
#ifndef DECODED_TESTS_TOKENIZER_REAL_TOKENIZER_H_
#define DECODED_TESTS_TOKENIZER_REAL_TOKENIZER_H_

#include <memory>

#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/common/model_path.h"

namespace decoded::testing {

// nullptr (with a test failure recorded) if the model cannot be loaded.
inline const Tokenizer* RealTokenizer() {
  static const Tokenizer* tokenizer = []() -> const Tokenizer* {
    auto file = GgufFile::Open(RealModelPath());
    if (!file.ok()) {
      ADD_FAILURE() << file.status();
      return nullptr;
    }
    auto t = Tokenizer::FromGguf(**file);
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      return nullptr;
    }
    return t->release();  // lives for the whole test binary
  }();
  return tokenizer;
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_TOKENIZER_REAL_TOKENIZER_H_
