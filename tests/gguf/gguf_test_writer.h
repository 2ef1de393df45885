// A tiny hand-rolled GGUF writer for tests (format: docs/gguf.md).
//
// It writes bytes exactly as the GGUF spec lays them out, independently of the
// reader under test, and can also write deliberately wrong files (counts,
// offsets, versions) so tests can check the reader's errors.
#ifndef DECODED_TESTS_GGUF_GGUF_TEST_WRITER_H_
#define DECODED_TESTS_GGUF_GGUF_TEST_WRITER_H_

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/gguf/gguf_parser.h"
#include "gtest/gtest.h"

namespace decoded::testing {

// Wire value-type ids from the GGUF spec (kept separate from GgufType on purpose).
enum WireType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kStr = 8, kArr = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// Encodings of single values (no type tag).
template <typename T>
std::string Enc(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
inline std::string EncStr(std::string_view v) { return Enc<uint64_t>(v.size()) + std::string(v); }
// An array value: element type, count, then the pre-encoded elements.
inline std::string EncArr(uint32_t elem_type, const std::vector<std::string>& elems) {
  std::string s = Enc<uint32_t>(elem_type) + Enc<uint64_t>(elems.size());
  for (const std::string& e : elems) s += e;
  return s;
}

class GgufWriter {
 public:
  uint32_t version = 3;
  // Padding used for the data section and tensor placement; set the
  // `general.alignment` key separately (or not) to test mismatches.
  uint64_t alignment = 32;
  std::optional<uint64_t> tensor_count_override;
  std::optional<uint64_t> kv_count_override;

  // Adds a pair whose value is already encoded (see Enc*).
  void Kv(std::string_view key, uint32_t type, std::string encoded_value) {
    kvs_ += EncStr(key) + Enc<uint32_t>(type) + encoded_value;
    ++n_kv_;
  }

  // Adds a tensor info with `data`, placed at the next aligned data offset.
  // Returns the offset (relative to the data section).
  uint64_t Tensor(std::string_view name, const std::vector<uint64_t>& dims, uint32_t ggml_type,
                  const std::string& data) {
    data_.resize(AlignUp(data_.size()), '\0');
    const uint64_t offset = data_.size();
    data_ += data;
    TensorInfo(name, dims, ggml_type, offset);
    return offset;
  }

  // Adds a tensor info only (no data), with an explicit offset.
  void TensorInfo(std::string_view name, const std::vector<uint64_t>& dims, uint32_t ggml_type,
                  uint64_t offset) {
    infos_ += EncStr(name) + Enc<uint32_t>(dims.size());
    for (uint64_t d : dims) infos_ += Enc<uint64_t>(d);
    infos_ += Enc<uint32_t>(ggml_type) + Enc<uint64_t>(offset);
    ++n_tensors_;
  }

  // The whole file. The file ends right after the last tensor's data, so any
  // truncation cuts something the reader needs. `data_start` receives the
  // absolute offset of the data section.
  std::vector<uint8_t> Build(size_t* data_start = nullptr) const {
    std::string f = "GGUF" + Enc<uint32_t>(version) +
                    Enc<uint64_t>(tensor_count_override.value_or(n_tensors_)) +
                    Enc<uint64_t>(kv_count_override.value_or(n_kv_)) + kvs_ + infos_;
    if (n_tensors_ > 0) f.resize(AlignUp(f.size()), '\0');
    if (data_start) *data_start = f.size();
    f += data_;
    return std::vector<uint8_t>(f.begin(), f.end());
  }

  // Offset of the first byte after the tensor infos (before padding).
  size_t MetadataAndInfosEnd() const { return 24 + kvs_.size() + infos_.size(); }

 private:
  uint64_t AlignUp(uint64_t x) const { return (x + alignment - 1) / alignment * alignment; }

  std::string kvs_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

// Writes `bytes` to a fresh file under the test temp dir; returns its path.
inline std::string WriteTempFile(const std::vector<uint8_t>& bytes, std::string_view tag) {
  static int counter = 0;
  std::string path = ::testing::TempDir() + "gguf_test_" + std::string(tag) + "_" +
                     std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".gguf";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Writes `bytes` to a temp file, opens it with GgufFile::Open (the mmap path)
// and removes the file; a mapping stays valid after unlink.
inline absl::StatusOr<std::unique_ptr<GgufFile>> OpenBytes(const std::vector<uint8_t>& bytes,
                                                           std::string_view tag) {
  const std::string path = WriteTempFile(bytes, tag);
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ::unlink(path.c_str());
  return f;
}

// A status message as std::string (gMock prints absl::string_view bytewise).
inline std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Parses the first `n` bytes of `src` from an exact-size heap copy, so that
// AddressSanitizer flags any read past the end (an mmap'd file would hide it
// in the page's zero tail). `bytes` must outlive `file`.
struct ParsedBuffer {
  std::unique_ptr<uint8_t[]> bytes;
  absl::StatusOr<std::unique_ptr<GgufFile>> file;
};
inline ParsedBuffer ParseExact(const std::vector<uint8_t>& src, size_t n) {
  ParsedBuffer out;
  if (n > 0) {
    out.bytes.reset(new uint8_t[n]);
    std::memcpy(out.bytes.get(), src.data(), n);
  }
  out.file = GgufParser::Parse(out.bytes.get(), n, "mem.gguf");
  return out;
}
inline ParsedBuffer ParseExact(const std::vector<uint8_t>& src) { return ParseExact(src, src.size()); }

}  // namespace decoded::testing

#endif  // DECODED_TESTS_GGUF_GGUF_TEST_WRITER_H_
