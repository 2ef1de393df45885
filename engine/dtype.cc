#include "engine/dtype.h"

#include <array>

namespace decoded {
namespace {

struct Entry {
  uint32_t id;
  DTypeTraits traits;
};

// Block layouts from ggml-common.h: QK4_0 = QK5_0 = QK8_0 = 32, QK_K = 256.
// Checked against llama.cpp's gguf-py table by tests/engine/dtype_test.cc.
constexpr std::array<Entry, 20> kTable = {{
    {0, {"f32", 1, 4}},
    {1, {"f16", 1, 2}},
    {2, {"q4_0", 32, 2 + 16}},
    {3, {"q4_1", 32, 2 + 2 + 16}},
    {6, {"q5_0", 32, 2 + 4 + 16}},
    {7, {"q5_1", 32, 2 + 2 + 4 + 16}},
    {8, {"q8_0", 32, 2 + 32}},
    {9, {"q8_1", 32, 2 + 2 + 32}},
    {10, {"q2_K", 256, 256 / 16 + 256 / 4 + 2 + 2}},
    {11, {"q3_K", 256, 256 / 8 + 256 / 4 + 12 + 2}},
    {12, {"q4_K", 256, 2 + 2 + 12 + 256 / 2}},
    {13, {"q5_K", 256, 2 + 2 + 12 + 256 / 8 + 256 / 2}},
    {14, {"q6_K", 256, 256 / 2 + 256 / 4 + 256 / 16 + 2}},
    {15, {"q8_K", 256, 4 + 256 + 256 / 16 * 2}},
    {24, {"i8", 1, 1}},
    {25, {"i16", 1, 2}},
    {26, {"i32", 1, 4}},
    {27, {"i64", 1, 8}},
    {28, {"f64", 1, 8}},
    {30, {"bf16", 1, 2}},
}};

}  // namespace

std::optional<DTypeTraits> LookupDType(uint32_t ggml_type_id) {
  for (const Entry& e : kTable) {
    if (e.id == ggml_type_id) return e.traits;
  }
  return std::nullopt;
}

const DTypeTraits& Traits(DType t) {
  for (const Entry& e : kTable) {
    if (e.id == static_cast<uint32_t>(t)) return e.traits;
  }
  return kTable[0].traits;  // unreachable for valid enumerators
}

std::optional<size_t> RowBytes(DType t, int64_t n) {
  const DTypeTraits& tr = Traits(t);
  if (n < 0 || n % tr.block_size != 0) return std::nullopt;
  return static_cast<size_t>(n / tr.block_size) * tr.block_bytes;
}

}  // namespace decoded
