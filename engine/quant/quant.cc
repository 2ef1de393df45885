// quant.h dispatch: weight type -> activation type, and the kernel of the
// process's tier (engine/cpu_isa.h) for that type.
#include "engine/quant/quant.h"

#include <cstring>
#include <limits>

#include "engine/cpu_isa.h"
#include "engine/quant/kernels.h"

namespace decoded::quant {
namespace {

using MatMulFn = void (*)(const uint8_t*, size_t, int64_t, const uint8_t*, size_t, int64_t, float*, int64_t, int64_t,
                          int64_t);
using QuantizeFn = void (*)(const float*, int64_t, void*);

// One tier's kernels; weight-type order of KernelFor's switch.
struct KernelTable {
  MatMulFn f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k;
  QuantizeFn q8_0_act, q8_k_act;
};

#define DECODED_QUANT_TABLE(ns)                                                                                    \
  KernelTable {                                                                                                    \
    internal::ns::MatMulF32, internal::ns::MatMulF16, internal::ns::MatMulBF16, internal::ns::MatMulQ4_0,          \
        internal::ns::MatMulQ4_1, internal::ns::MatMulQ5_0, internal::ns::MatMulQ5_1, internal::ns::MatMulQ8_0,    \
        internal::ns::MatMulQ4_K, internal::ns::MatMulQ5_K, internal::ns::MatMulQ6_K, internal::ns::QuantizeRowQ8_0, \
        internal::ns::QuantizeRowQ8_K                                                                              \
  }
// Indexed by CpuIsa.
constexpr KernelTable kTables[] = {DECODED_QUANT_TABLE(scalar), DECODED_QUANT_TABLE(avx2),
                                   DECODED_QUANT_TABLE(avx512vnni)};
#undef DECODED_QUANT_TABLE
static_assert(static_cast<int>(CpuIsa::kScalar) == 0 && static_cast<int>(CpuIsa::kAvx2) == 1 &&
              static_cast<int>(CpuIsa::kAvx512Vnni) == 2);

const KernelTable& Kernels() { return kTables[static_cast<int>(ActiveCpuIsa())]; }

MatMulFn KernelFor(const KernelTable& k, DType t) {
  switch (t) {
    case DType::kF32: return k.f32;
    case DType::kF16: return k.f16;
    case DType::kBF16: return k.bf16;
    case DType::kQ4_0: return k.q4_0;
    case DType::kQ4_1: return k.q4_1;
    case DType::kQ5_0: return k.q5_0;
    case DType::kQ5_1: return k.q5_1;
    case DType::kQ8_0: return k.q8_0;
    case DType::kQ4_K: return k.q4_k;
    case DType::kQ5_K: return k.q5_k;
    case DType::kQ6_K: return k.q6_k;
    default: return nullptr;
  }
}

}  // namespace

// Every tier implements the same types.
bool IsSupportedWeightType(DType t) { return KernelFor(kTables[0], t) != nullptr; }

DType ActivationType(DType weight_type) {
  switch (weight_type) {
    case DType::kQ4_0:
    case DType::kQ4_1:  // min term from sums of the Q8_0 codes: matmul_q8_0.cc
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
      return DType::kQ8_0;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return DType::kQ8_K;
    default:
      return DType::kF32;
  }
}

size_t ActivationRowBytes(DType weight_type, int64_t k) {
  const auto bytes = RowBytes(ActivationType(weight_type), k);
  return bytes ? *bytes : 0;
}

void QuantizeActivationRow(DType weight_type, const float* x, int64_t k, void* out) {
  switch (ActivationType(weight_type)) {
    case DType::kQ8_0:
      return Kernels().q8_0_act(x, k, out);
    case DType::kQ8_K:
      return Kernels().q8_k_act(x, k, out);
    default:
      std::memcpy(out, x, static_cast<size_t>(k) * sizeof(float));
      return;
  }
}

void MatMul(DType weight_type, const void* w, size_t w_row_bytes, int64_t k, const void* xq, size_t xq_row_bytes,
            int64_t m, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const MatMulFn fn = KernelFor(Kernels(), weight_type);
  if (fn == nullptr) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = r0; r < r1; ++r) y[i * ldy + r] = std::numeric_limits<float>::quiet_NaN();
    }
    return;
  }
  fn(static_cast<const uint8_t*>(w), w_row_bytes, k, static_cast<const uint8_t*>(xq), xq_row_bytes, m, y, ldy, r0, r1);
}

const char* KernelVariant() { return CpuIsaName(ActiveCpuIsa()); }

}  // namespace decoded::quant
