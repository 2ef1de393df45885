// A family loaded from an edited copy of a committed fixture GGUF: the
// loader tests' way to build malformed or unsupported files (rewritten keys,
// renamed or reshaped tensors, overwritten data) without committing them.
#ifndef DECODED_TESTS_COMMON_EDITED_FIXTURE_H_
#define DECODED_TESTS_COMMON_EDITED_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_registry.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/gguf/gguf_tensor_rewrite.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded::testing {

// The GGUF file `bytes` (named `name` in messages) loaded through the family
// registry: the family's status, or the model.
inline absl::StatusOr<std::unique_ptr<DecodeModel>> LoadFamilyFromBytes(const std::vector<uint8_t>& bytes,
                                                                        const std::string& name) {
  EXPECT_FALSE(bytes.empty()) << name;
  auto file = OpenBytes(bytes, name);
  if (!file.ok()) return file.status();
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  if (!weights.ok()) return weights.status();
  return CreateFamily(*weights);
}

// tests/data/`gguf_name` with `edits` applied to its metadata (RewriteKvs) and
// `tensors` to its tensor table (RewriteTensors), loaded as above.
inline absl::StatusOr<std::unique_ptr<DecodeModel>> LoadEditedFixture(const std::string& gguf_name,
                                                                      const std::vector<KvEdit>& edits,
                                                                      const std::vector<TensorEdit>& tensors = {}) {
  std::vector<uint8_t> bytes = RewriteKvs(ReadFileBytes(TestDataPath(gguf_name)), edits);
  if (!tensors.empty()) bytes = RewriteTensors(bytes, tensors);
  return LoadFamilyFromBytes(bytes, gguf_name);
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_EDITED_FIXTURE_H_
