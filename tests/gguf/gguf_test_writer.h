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
#include <algorithm>
#include <fstream>
#include <iterator>
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

// One metadata change for RewriteKvs: the pair `key` gets `type` and the
// pre-encoded `value` (see Enc*), replacing the stored pair or appended when
// the key is absent; `remove` drops the pair instead.
struct KvEdit {
  std::string key;
  uint32_t type = kU32;
  std::string value;
  bool remove = false;
};

// A copy of the GGUF file `src` with `edits` applied to its metadata. It walks
// `src` with this writer's own reading of the layout (not the reader under
// test); tensor infos and data are kept byte for byte, the data section moved
// to the new aligned end of the infos (tensor offsets are relative to it).
// Returns an empty vector, with a test failure, when `src` does not walk.
inline std::vector<uint8_t> RewriteKvs(const std::vector<uint8_t>& src, const std::vector<KvEdit>& edits) {
  size_t pos = 0;
  bool ok = true;
  auto need = [&](uint64_t n) {
    ok = ok && n <= src.size() - pos;
    return ok;
  };
  auto bytes = [&](uint64_t n) {
    std::string v;
    if (need(n)) {
      v.assign(reinterpret_cast<const char*>(src.data() + pos), n);
      pos += n;
    }
    return v;
  };
  auto u32 = [&] {
    uint32_t v = 0;
    const std::string b = bytes(4);
    std::memcpy(&v, b.data(), b.size());
    return v;
  };
  auto u64 = [&] {
    uint64_t v = 0;
    const std::string b = bytes(8);
    std::memcpy(&v, b.data(), b.size());
    return v;
  };
  auto str = [&] { return bytes(u64()); };
  // Skips one value of wire type `t` (GGUF spec: scalars, strings, arrays).
  auto skip = [&](auto&& self, uint32_t t) -> void {
    static constexpr uint64_t kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == kStr) {
      str();
    } else if (t == kArr) {
      const uint32_t elem = u32();
      const uint64_t n = u64();
      for (uint64_t i = 0; ok && i < n; ++i) self(self, elem);
    } else if (t < std::size(kSize)) {
      bytes(kSize[t]);
    } else {
      ok = false;
    }
  };

  if (!need(24) || std::memcmp(src.data(), "GGUF", 4) != 0) {
    ADD_FAILURE() << "RewriteKvs: not a GGUF file";
    return {};
  }
  pos = 4;
  const uint32_t version = u32();
  const uint64_t n_tensors = u64();
  const uint64_t n_kv = u64();
  uint64_t alignment = 32;
  std::string kvs;
  uint64_t kept = 0;
  std::vector<bool> used(edits.size(), false);
  for (uint64_t i = 0; ok && i < n_kv; ++i) {
    const size_t start = pos;
    const std::string key = str();
    const uint32_t type = u32();
    if (key == "general.alignment" && type == kU32) {
      alignment = u32();
    } else {
      skip(skip, type);
    }
    size_t e = 0;
    while (e < edits.size() && edits[e].key != key) ++e;
    if (e == edits.size()) {
      kvs.append(reinterpret_cast<const char*>(src.data() + start), pos - start);
      ++kept;
    } else {
      used[e] = true;
      if (!edits[e].remove) {
        kvs += EncStr(key) + Enc<uint32_t>(edits[e].type) + edits[e].value;
        ++kept;
      }
    }
  }
  for (size_t e = 0; e < edits.size(); ++e) {
    if (!used[e] && !edits[e].remove) {
      kvs += EncStr(edits[e].key) + Enc<uint32_t>(edits[e].type) + edits[e].value;
      ++kept;
    }
  }
  const size_t infos_start = pos;
  for (uint64_t i = 0; ok && i < n_tensors; ++i) {
    str();
    const uint32_t n_dims = u32();
    bytes(uint64_t{n_dims} * 8 + 4 + 8);  // dims, type, offset
  }
  if (!ok || alignment == 0) {
    ADD_FAILURE() << "RewriteKvs: truncated or unknown value type near byte " << pos;
    return {};
  }
  const std::string infos(reinterpret_cast<const char*>(src.data() + infos_start), pos - infos_start);
  auto align_up = [alignment](uint64_t x) { return (x + alignment - 1) / alignment * alignment; };
  const size_t data_start = n_tensors > 0 ? align_up(pos) : pos;
  std::string out = "GGUF" + Enc<uint32_t>(version) + Enc<uint64_t>(n_tensors) + Enc<uint64_t>(kept) + kvs + infos;
  if (n_tensors > 0) out.resize(align_up(out.size()), '\0');
  out.append(reinterpret_cast<const char*>(src.data()) + std::min(data_start, src.size()),
             src.size() - std::min(data_start, src.size()));
  return std::vector<uint8_t>(out.begin(), out.end());
}

// The bytes of the file at `path` (empty, with a test failure, if unreadable).
inline std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return {};
  }
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

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
