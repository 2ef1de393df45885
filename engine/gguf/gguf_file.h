// GGUF v3 reader: reads a model file into memory (or maps it) and exposes its
// metadata and tensors.
//
// Format: GGUF specification (ggml/docs/gguf.md), summarised in docs/gguf.md.
// Header, metadata key/value pairs and tensor infos are parsed eagerly and fully
// bounds-checked; tensor data stays in the read-only file image (quantized
// tensors stay quantized: callers get a pointer to the raw blocks).
//
// The file image is one of (GgufLoad):
//   kCopy  the file read into anonymous memory (the default). What happens to
//          the file afterwards (truncated, overwritten, replaced) changes
//          nothing: the copy stays what was validated.
//   kMap   a read-only private mapping of the file (llama.cpp's default):
//          pages are shared with the page cache and other processes mapping
//          the file, and loading reads nothing until a tensor is touched.
//          The price: a file truncated while mapped makes a later read of a
//          lost page raise SIGBUS, and one overwritten in place changes the
//          weights under the reader (MAP_PRIVATE copies only pages the
//          process writes, and it writes none).
//
// Errors: Open() returns
//   NOT_FOUND            the file cannot be opened,
//   INVALID_ARGUMENT     bad magic, unsupported version, truncated or corrupt
//                        header/metadata/tensor info (the message names the key
//                        or tensor and the byte offset), tensor data outside the
//                        file, misaligned tensor offset, overlapping tensors,
//                        duplicate names,
//   UNIMPLEMENTED        a tensor of a GGML type this build does not know.
// It never reads outside the mapping.
//
// Thread-safety: a GgufFile is immutable after Open(); any thread may read it.
// Tensor pointers live as long as the GgufFile.
#ifndef DECODED_ENGINE_GGUF_GGUF_FILE_H_
#define DECODED_ENGINE_GGUF_GGUF_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/dtype.h"

namespace decoded {

// Metadata value types, numbered as in the GGUF specification.
enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5,
  kFloat32 = 6, kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11,
  kFloat64 = 12,
};

struct GgufValue;
struct GgufArray {
  GgufType elem_type;
  std::vector<GgufValue> values;  // nested arrays allowed by the spec
};

// One metadata value. Integers keep their declared type (GgufType tells which).
struct GgufValue {
  GgufType type;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> value;
};

struct GgufTensorInfo {
  std::string name;
  DType type;
  int n_dims;
  // GGML order: ne[0] is the contiguous (row) dimension; unused dims are 1.
  int64_t ne[4];
  uint64_t offset;         // from the start of the tensor-data section
  size_t nbytes;
  const uint8_t* data;     // into the mapping, aligned to the file's alignment
};

class GgufParser;  // engine/gguf/gguf_parser.h: parses a byte range into a GgufFile

// How GgufFile::Open holds the file (see the file comment).
enum class GgufLoad { kCopy, kMap };

class GgufFile {
 public:
  // kCopy adds one error: INVALID_ARGUMENT when the file shrinks while it is
  // read.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path, GgufLoad load = GgufLoad::kCopy);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }

  // All metadata, keyed by name.
  const absl::flat_hash_map<std::string, GgufValue>& metadata() const { return kv_; }
  const GgufValue* Find(std::string_view key) const;

  // Frees the metadata; the tensors stay. After it every key reads as absent
  // (Find nullptr, the accessors NOT_FOUND). For the owner of a loaded model
  // once all that reads metadata has (the family, the tokenizer, ModelInfo):
  // a 262,144-token vocabulary is ~800k small heap objects (36 MB resident for
  // Gemma 3) whose freeing at exit, cache-cold, took 0.3-0.9 s on a loaded
  // 2-core VM and ran the daemon past --drain_seconds.
  void DropMetadata();

  // Typed accessors. NOT_FOUND if absent, INVALID_ARGUMENT (naming the key) if
  // the stored type cannot represent the requested one (any integer type that
  // fits converts; a float accessor accepts float32/float64).
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  // Arrays of strings / numbers, converted element-wise.
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;

  absl::Span<const GgufTensorInfo> tensors() const { return tensors_; }
  // nullptr if absent.
  const GgufTensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  friend class GgufParser;

  // Unmaps the read-only file image of `size` bytes (a copy or a mapping).
  struct Unmapper {
    size_t size;
    void operator()(const uint8_t* p) const;
  };

  std::string path_;
  // Owns the mapping when opened from a file; null when parsed from a caller's
  // buffer (GgufParser::Parse), whose storage then outlives this object.
  std::unique_ptr<const uint8_t, Unmapper> mapping_{nullptr, Unmapper{0}};
  const uint8_t* base_ = nullptr;  // start of the file bytes, read-only
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  absl::flat_hash_map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_GGUF_GGUF_FILE_H_
