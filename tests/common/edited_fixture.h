// A family loaded from an edited copy of a committed fixture GGUF: the
// loader tests' way to build malformed or unsupported files (rewritten keys,
// renamed tensors) without committing them.
#ifndef DECODED_TESTS_COMMON_EDITED_FIXTURE_H_
#define DECODED_TESTS_COMMON_EDITED_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_registry.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded::testing {

// tests/data/`gguf_name` with `edits` and `renames` applied (RewriteKvs),
// loaded through the family registry: the family's status, or the model.
inline absl::StatusOr<std::unique_ptr<DecodeModel>> LoadEditedFixture(const std::string& gguf_name,
                                                                      const std::vector<KvEdit>& edits,
                                                                      const std::vector<TensorRename>& renames = {}) {
  const std::vector<uint8_t> bytes = RewriteKvs(ReadFileBytes(TestDataPath(gguf_name)), edits, renames);
  EXPECT_FALSE(bytes.empty()) << gguf_name;
  auto file = OpenBytes(bytes, gguf_name);
  if (!file.ok()) return file.status();
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  if (!weights.ok()) return weights.status();
  return CreateFamily(*weights);
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_EDITED_FIXTURE_H_
