// Element types of tensors the engine stores and computes with.
//
// The numeric values are the GGML type ids of the GGUF specification
// (ggml/include/ggml.h `enum ggml_type`), so a GGUF tensor-info `type` field maps
// onto DType without a table. Quantized types are stored in blocks: a row of
// `n` elements occupies n / block_size(t) blocks of block_bytes(t) bytes.
#ifndef DECODED_ENGINE_DTYPE_H_
#define DECODED_ENGINE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>

namespace decoded {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct DTypeTraits {
  const char* name;        // GGML spelling: "q4_K", "f32", ...
  int64_t block_size;      // elements per block (1 for plain types)
  size_t block_bytes;      // bytes per block
};

// Traits of a GGML type id, or nullopt for ids this build does not know (the
// GGUF reader reports those as an error naming the tensor).
std::optional<DTypeTraits> LookupDType(uint32_t ggml_type_id);

// Traits of a known type. Precondition: `t` is one of the enumerators above.
const DTypeTraits& Traits(DType t);

inline const char* DTypeName(DType t) { return Traits(t).name; }

// Bytes of one row of `n` elements; nullopt if n is not a multiple of the
// block size (a malformed tensor shape).
std::optional<size_t> RowBytes(DType t, int64_t n);

}  // namespace decoded

#endif  // DECODED_ENGINE_DTYPE_H_
