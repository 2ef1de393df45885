// Test-only edits of a GGUF file's tensor table (format: docs/gguf.md), the
// tensor-side sibling of RewriteKvs (gguf_test_writer.h): rename a tensor,
// change its dimensions, or overwrite its data, to build the malformed files
// the loaders must refuse. The file is walked with this header's own reading
// of the layout, not the reader under test.
#ifndef DECODED_TESTS_GGUF_GGUF_TENSOR_REWRITE_H_
#define DECODED_TESTS_GGUF_GGUF_TENSOR_REWRITE_H_

#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded::testing {

// One entry of the tensor table as stored.
struct StoredTensor {
  std::string name;
  std::vector<uint64_t> dims;  // GGUF ne: dims[0] is the row length
  uint32_t type = 0;
  uint64_t offset = 0;  // relative to the data section
};

// The walked layout: metadata bytes (the magic, version and counts excluded),
// tensor table, and where the data section starts.
struct GgufLayout {
  uint32_t version = 0;
  uint64_t n_kv = 0;
  std::string kvs;
  std::vector<StoredTensor> tensors;
  uint64_t alignment = 32;
  size_t data_start = 0;
};

// Walks `src`; nullopt, with a test failure, when it does not walk.
inline std::optional<GgufLayout> WalkGguf(const std::vector<uint8_t>& src) {
  size_t pos = 0;
  bool ok = true;
  auto bytes = [&](uint64_t n) {
    std::string v;
    ok = ok && n <= src.size() - pos;
    if (ok) {
      v.assign(reinterpret_cast<const char*>(src.data() + pos), n);
      pos += n;
    }
    return v;
  };
  auto u32 = [&] {
    uint32_t v = 0;
    const std::string b = bytes(4);
    if (ok) std::memcpy(&v, b.data(), 4);
    return v;
  };
  auto u64 = [&] {
    uint64_t v = 0;
    const std::string b = bytes(8);
    if (ok) std::memcpy(&v, b.data(), 8);
    return v;
  };
  auto skip = [&](auto&& self, uint32_t t) -> void {
    static constexpr uint64_t kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t == kStr) {
      bytes(u64());
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
  GgufLayout l;
  if (src.size() < 24 || std::memcmp(src.data(), "GGUF", 4) != 0) {
    ADD_FAILURE() << "WalkGguf: not a GGUF file";
    return std::nullopt;
  }
  pos = 4;
  l.version = u32();
  const uint64_t n_tensors = u64();
  l.n_kv = u64();
  const size_t kv_start = pos;
  for (uint64_t i = 0; ok && i < l.n_kv; ++i) {
    const std::string key = bytes(u64());
    const uint32_t type = u32();
    if (key == "general.alignment" && type == kU32) {
      l.alignment = u32();
    } else {
      skip(skip, type);
    }
  }
  if (ok) l.kvs.assign(reinterpret_cast<const char*>(src.data() + kv_start), pos - kv_start);
  for (uint64_t i = 0; ok && i < n_tensors; ++i) {
    StoredTensor t;
    t.name = bytes(u64());
    const uint32_t n_dims = u32();
    for (uint32_t d = 0; ok && d < n_dims && d < 8; ++d) t.dims.push_back(u64());
    t.type = u32();
    t.offset = u64();
    l.tensors.push_back(std::move(t));
  }
  if (!ok || l.alignment == 0) {
    ADD_FAILURE() << "WalkGguf: truncated or unknown value type near byte " << pos;
    return std::nullopt;
  }
  l.data_start = n_tensors > 0 ? (pos + l.alignment - 1) / l.alignment * l.alignment : pos;
  return l;
}

// One tensor-table change: the tensor `name` gets `new_name` and/or `dims`
// (GGUF ne order) where those are set. Its data stays where it is, so dims
// holding fewer elements keep the file readable.
struct TensorEdit {
  std::string name;
  std::optional<std::string> new_name;
  std::optional<std::vector<uint64_t>> dims;
};

// A copy of `src` with `edits` applied; the data section moves to the new
// aligned end of the table (offsets are relative to it). Empty, with a test
// failure, when `src` does not walk or an edited tensor is absent.
inline std::vector<uint8_t> RewriteTensors(const std::vector<uint8_t>& src, const std::vector<TensorEdit>& edits) {
  std::optional<GgufLayout> l = WalkGguf(src);
  if (!l) return {};
  std::string infos;
  size_t used = 0;
  for (const StoredTensor& t : l->tensors) {
    std::string name = t.name;
    std::vector<uint64_t> dims = t.dims;
    for (const TensorEdit& e : edits) {
      if (e.name != t.name) continue;
      ++used;
      if (e.new_name) name = *e.new_name;
      if (e.dims) dims = *e.dims;
    }
    infos += EncStr(name) + Enc<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) infos += Enc<uint64_t>(d);
    infos += Enc<uint32_t>(t.type) + Enc<uint64_t>(t.offset);
  }
  if (used != edits.size()) {
    ADD_FAILURE() << "RewriteTensors: " << edits.size() - used << " edited tensor(s) not in the file";
    return {};
  }
  std::string out = "GGUF" + Enc<uint32_t>(l->version) + Enc<uint64_t>(l->tensors.size()) + Enc<uint64_t>(l->n_kv) +
                    l->kvs + infos;
  if (!l->tensors.empty()) out.resize((out.size() + l->alignment - 1) / l->alignment * l->alignment, '\0');
  out.append(reinterpret_cast<const char*>(src.data()) + l->data_start, src.size() - l->data_start);
  return std::vector<uint8_t>(out.begin(), out.end());
}

// Overwrites the first bytes of tensor `name`'s data in `bytes` with `data`;
// false, with a test failure, when the tensor is absent or the bytes run past
// the file.
inline bool OverwriteTensorData(std::vector<uint8_t>& bytes, const std::string& name, const std::string& data) {
  std::optional<GgufLayout> l = WalkGguf(bytes);
  if (!l) return false;
  for (const StoredTensor& t : l->tensors) {
    if (t.name != name) continue;
    const size_t at = l->data_start + t.offset;
    if (at > bytes.size() || data.size() > bytes.size() - at) {
      ADD_FAILURE() << "OverwriteTensorData: " << name << " runs past the file";
      return false;
    }
    std::memcpy(bytes.data() + at, data.data(), data.size());
    return true;
  }
  ADD_FAILURE() << "OverwriteTensorData: no tensor " << name;
  return false;
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_GGUF_GGUF_TENSOR_REWRITE_H_
