// Parses the bytes of a GGUF file into a GgufFile (engine/gguf/gguf_file.h).
//
// GgufFile::Open maps the file and calls Parse; tests call Parse directly on an
// exact-size heap buffer so that AddressSanitizer catches any read past the
// end (a read past the end of an mmap'd file would land in the page's zero
// tail unnoticed).
//
// Checks, in file order (format: docs/gguf.md):
//   header       magic "GGUF", version 2 or 3, tensor and metadata counts no
//                larger than the remaining bytes could encode;
//   metadata     each key (unique), value type 0..12, values of every type
//                incl. nested arrays (depth <= kMaxArrayDepth), bools 0 or 1,
//                array lengths no larger than the remaining bytes could encode
//                and at most kMaxArrayElements array elements in all;
//                `general.alignment`, when present, an unsigned integer that is
//                a nonzero power of two (default 32);
//   tensor infos name (unique), n_dims 1..4, dims in 1..INT64_MAX with an
//                overflow-checked element count, a known GGML type
//                (UNIMPLEMENTED otherwise), ne[0] a multiple of the block size,
//                an offset that is a multiple of the alignment;
//   data         the section starts at the aligned end of the tensor infos;
//                each tensor's [offset, offset + nbytes) lies inside the file
//                and overlaps no other tensor.
// Every error message starts with `GGUF "<path>": ` and names the key or the
// tensor and the byte offset of the failed field.
#ifndef DECODED_ENGINE_GGUF_GGUF_PARSER_H_
#define DECODED_ENGINE_GGUF_GGUF_PARSER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/gguf/gguf_file.h"

namespace decoded {

// GGUF spelling of a metadata value type ("uint32", "string", ...), or
// "unknown" for an out-of-range enumerator.
absl::string_view GgufTypeName(GgufType t);

class GgufParser {
 public:
  // Deepest nesting of arrays accepted (an array of arrays is depth 2). The
  // spec sets no limit; this one bounds recursion on corrupted input.
  static constexpr int kMaxArrayDepth = 8;
  // Most metadata array elements accepted in one file, nested ones included.
  // The spec sets no limit; this one bounds the parsed metadata's memory
  // (each element is a 48-byte GgufValue, whatever its encoded size) to
  // under 1 GiB. Real files hold ~1M: a 262144-entry vocabulary's tokens,
  // scores and types, plus up to ~300k BPE merges.
  static constexpr uint64_t kMaxArrayElements = uint64_t{1} << 24;

  // Parses `size` bytes at `data` (null allowed when size is 0). The result
  // points into `data`, which must outlive it; it does not own the bytes.
  // `path` is reported by GgufFile::path() and in error messages.
  // Errors: as GgufFile::Open, except NOT_FOUND.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size,
                                                         std::string path);
};

}  // namespace decoded

#endif  // DECODED_ENGINE_GGUF_GGUF_PARSER_H_
