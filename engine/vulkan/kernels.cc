// The embedded SPIR-V of every kernel (kernels.h). The .inc files are
// glslc's `-mfmt=num` output (comma-separated words), generated into the
// build tree by engine/vulkan/CMakeLists.txt.
#include "engine/vulkan/kernels.h"

namespace decoded::vulkan {
namespace {

constexpr uint32_t k_matmul_f32[] = {
#include "engine/vulkan/spirv/matmul_f32.inc"
};
constexpr uint32_t k_matmul_f16[] = {
#include "engine/vulkan/spirv/matmul_f16.inc"
};
constexpr uint32_t k_matmul_bf16[] = {
#include "engine/vulkan/spirv/matmul_bf16.inc"
};
constexpr uint32_t k_matmul_q4_0[] = {
#include "engine/vulkan/spirv/matmul_q4_0.inc"
};
constexpr uint32_t k_matmul_q4_1[] = {
#include "engine/vulkan/spirv/matmul_q4_1.inc"
};
constexpr uint32_t k_matmul_q5_0[] = {
#include "engine/vulkan/spirv/matmul_q5_0.inc"
};
constexpr uint32_t k_matmul_q5_1[] = {
#include "engine/vulkan/spirv/matmul_q5_1.inc"
};
constexpr uint32_t k_matmul_q8_0[] = {
#include "engine/vulkan/spirv/matmul_q8_0.inc"
};
constexpr uint32_t k_matmul_q4_k[] = {
#include "engine/vulkan/spirv/matmul_q4_k.inc"
};
constexpr uint32_t k_matmul_q5_k[] = {
#include "engine/vulkan/spirv/matmul_q5_k.inc"
};
constexpr uint32_t k_matmul_q6_k[] = {
#include "engine/vulkan/spirv/matmul_q6_k.inc"
};
constexpr uint32_t k_get_rows_f32[] = {
#include "engine/vulkan/spirv/get_rows_f32.inc"
};
constexpr uint32_t k_get_rows_f16[] = {
#include "engine/vulkan/spirv/get_rows_f16.inc"
};
constexpr uint32_t k_get_rows_bf16[] = {
#include "engine/vulkan/spirv/get_rows_bf16.inc"
};
constexpr uint32_t k_get_rows_q4_0[] = {
#include "engine/vulkan/spirv/get_rows_q4_0.inc"
};
constexpr uint32_t k_get_rows_q4_1[] = {
#include "engine/vulkan/spirv/get_rows_q4_1.inc"
};
constexpr uint32_t k_get_rows_q5_0[] = {
#include "engine/vulkan/spirv/get_rows_q5_0.inc"
};
constexpr uint32_t k_get_rows_q5_1[] = {
#include "engine/vulkan/spirv/get_rows_q5_1.inc"
};
constexpr uint32_t k_get_rows_q8_0[] = {
#include "engine/vulkan/spirv/get_rows_q8_0.inc"
};
constexpr uint32_t k_get_rows_q4_k[] = {
#include "engine/vulkan/spirv/get_rows_q4_k.inc"
};
constexpr uint32_t k_get_rows_q5_k[] = {
#include "engine/vulkan/spirv/get_rows_q5_k.inc"
};
constexpr uint32_t k_get_rows_q6_k[] = {
#include "engine/vulkan/spirv/get_rows_q6_k.inc"
};
constexpr uint32_t k_moe_matmul_f32[] = {
#include "engine/vulkan/spirv/moe_matmul_f32.inc"
};
constexpr uint32_t k_moe_matmul_f16[] = {
#include "engine/vulkan/spirv/moe_matmul_f16.inc"
};
constexpr uint32_t k_moe_matmul_bf16[] = {
#include "engine/vulkan/spirv/moe_matmul_bf16.inc"
};
constexpr uint32_t k_moe_matmul_q4_0[] = {
#include "engine/vulkan/spirv/moe_matmul_q4_0.inc"
};
constexpr uint32_t k_moe_matmul_q4_1[] = {
#include "engine/vulkan/spirv/moe_matmul_q4_1.inc"
};
constexpr uint32_t k_moe_matmul_q5_0[] = {
#include "engine/vulkan/spirv/moe_matmul_q5_0.inc"
};
constexpr uint32_t k_moe_matmul_q5_1[] = {
#include "engine/vulkan/spirv/moe_matmul_q5_1.inc"
};
constexpr uint32_t k_moe_matmul_q8_0[] = {
#include "engine/vulkan/spirv/moe_matmul_q8_0.inc"
};
constexpr uint32_t k_moe_matmul_q4_k[] = {
#include "engine/vulkan/spirv/moe_matmul_q4_k.inc"
};
constexpr uint32_t k_moe_matmul_q5_k[] = {
#include "engine/vulkan/spirv/moe_matmul_q5_k.inc"
};
constexpr uint32_t k_moe_matmul_q6_k[] = {
#include "engine/vulkan/spirv/moe_matmul_q6_k.inc"
};
constexpr uint32_t k_matmul_tiled_f32[] = {
#include "engine/vulkan/spirv/matmul_tiled_f32.inc"
};
constexpr uint32_t k_matmul_tiled_f16[] = {
#include "engine/vulkan/spirv/matmul_tiled_f16.inc"
};
constexpr uint32_t k_matmul_tiled_bf16[] = {
#include "engine/vulkan/spirv/matmul_tiled_bf16.inc"
};
constexpr uint32_t k_matmul_tiled_q4_0[] = {
#include "engine/vulkan/spirv/matmul_tiled_q4_0.inc"
};
constexpr uint32_t k_matmul_tiled_q4_1[] = {
#include "engine/vulkan/spirv/matmul_tiled_q4_1.inc"
};
constexpr uint32_t k_matmul_tiled_q5_0[] = {
#include "engine/vulkan/spirv/matmul_tiled_q5_0.inc"
};
constexpr uint32_t k_matmul_tiled_q5_1[] = {
#include "engine/vulkan/spirv/matmul_tiled_q5_1.inc"
};
constexpr uint32_t k_matmul_tiled_q8_0[] = {
#include "engine/vulkan/spirv/matmul_tiled_q8_0.inc"
};
constexpr uint32_t k_matmul_tiled_q4_k[] = {
#include "engine/vulkan/spirv/matmul_tiled_q4_k.inc"
};
constexpr uint32_t k_matmul_tiled_q5_k[] = {
#include "engine/vulkan/spirv/matmul_tiled_q5_k.inc"
};
constexpr uint32_t k_matmul_tiled_q6_k[] = {
#include "engine/vulkan/spirv/matmul_tiled_q6_k.inc"
};
constexpr uint32_t k_norm[] = {
#include "engine/vulkan/spirv/norm.inc"
};
constexpr uint32_t k_eltwise[] = {
#include "engine/vulkan/spirv/eltwise.inc"
};
constexpr uint32_t k_copy[] = {
#include "engine/vulkan/spirv/copy.inc"
};
constexpr uint32_t k_rope[] = {
#include "engine/vulkan/spirv/rope.inc"
};
constexpr uint32_t k_kv_write[] = {
#include "engine/vulkan/spirv/kv_write.inc"
};
constexpr uint32_t k_attention[] = {
#include "engine/vulkan/spirv/attention.inc"
};
constexpr uint32_t k_moe[] = {
#include "engine/vulkan/spirv/moe.inc"
};

struct KernelEntry {
  const char* name;
  const uint32_t* words;
  size_t count;
  uint32_t local_size;
};

#define DECODED_KERNEL(array, local) {#array + 2, array, sizeof(array) / sizeof(array[0]), local}
constexpr KernelEntry kKernels[] = {
    DECODED_KERNEL(k_matmul_f32, 64),
    DECODED_KERNEL(k_matmul_f16, 64),
    DECODED_KERNEL(k_matmul_bf16, 64),
    DECODED_KERNEL(k_matmul_q4_0, 64),
    DECODED_KERNEL(k_matmul_q4_1, 64),
    DECODED_KERNEL(k_matmul_q5_0, 64),
    DECODED_KERNEL(k_matmul_q5_1, 64),
    DECODED_KERNEL(k_matmul_q8_0, 64),
    DECODED_KERNEL(k_matmul_q4_k, 64),
    DECODED_KERNEL(k_matmul_q5_k, 64),
    DECODED_KERNEL(k_matmul_q6_k, 64),
    DECODED_KERNEL(k_get_rows_f32, 64),
    DECODED_KERNEL(k_get_rows_f16, 64),
    DECODED_KERNEL(k_get_rows_bf16, 64),
    DECODED_KERNEL(k_get_rows_q4_0, 64),
    DECODED_KERNEL(k_get_rows_q4_1, 64),
    DECODED_KERNEL(k_get_rows_q5_0, 64),
    DECODED_KERNEL(k_get_rows_q5_1, 64),
    DECODED_KERNEL(k_get_rows_q8_0, 64),
    DECODED_KERNEL(k_get_rows_q4_k, 64),
    DECODED_KERNEL(k_get_rows_q5_k, 64),
    DECODED_KERNEL(k_get_rows_q6_k, 64),
    DECODED_KERNEL(k_moe_matmul_f32, 64),
    DECODED_KERNEL(k_moe_matmul_f16, 64),
    DECODED_KERNEL(k_moe_matmul_bf16, 64),
    DECODED_KERNEL(k_moe_matmul_q4_0, 64),
    DECODED_KERNEL(k_moe_matmul_q4_1, 64),
    DECODED_KERNEL(k_moe_matmul_q5_0, 64),
    DECODED_KERNEL(k_moe_matmul_q5_1, 64),
    DECODED_KERNEL(k_moe_matmul_q8_0, 64),
    DECODED_KERNEL(k_moe_matmul_q4_k, 64),
    DECODED_KERNEL(k_moe_matmul_q5_k, 64),
    DECODED_KERNEL(k_moe_matmul_q6_k, 64),
    DECODED_KERNEL(k_matmul_tiled_f32, 256),
    DECODED_KERNEL(k_matmul_tiled_f16, 256),
    DECODED_KERNEL(k_matmul_tiled_bf16, 256),
    DECODED_KERNEL(k_matmul_tiled_q4_0, 256),
    DECODED_KERNEL(k_matmul_tiled_q4_1, 256),
    DECODED_KERNEL(k_matmul_tiled_q5_0, 256),
    DECODED_KERNEL(k_matmul_tiled_q5_1, 256),
    DECODED_KERNEL(k_matmul_tiled_q8_0, 256),
    DECODED_KERNEL(k_matmul_tiled_q4_k, 256),
    DECODED_KERNEL(k_matmul_tiled_q5_k, 256),
    DECODED_KERNEL(k_matmul_tiled_q6_k, 256),
    DECODED_KERNEL(k_norm, 64),
    DECODED_KERNEL(k_eltwise, 256),
    DECODED_KERNEL(k_copy, 256),
    DECODED_KERNEL(k_rope, 256),
    DECODED_KERNEL(k_kv_write, 256),
    DECODED_KERNEL(k_attention, 64),
    DECODED_KERNEL(k_moe, 64),
};
#undef DECODED_KERNEL
static_assert(sizeof(kKernels) / sizeof(kKernels[0]) == static_cast<size_t>(Kernel::kCount));

}  // namespace

const char* KernelName(Kernel k) { return kKernels[static_cast<size_t>(k)].name; }
absl::Span<const uint32_t> KernelSpirv(Kernel k) {
  const KernelEntry& e = kKernels[static_cast<size_t>(k)];
  return absl::MakeConstSpan(e.words, e.count);
}
uint32_t KernelLocalSize(Kernel k) { return kKernels[static_cast<size_t>(k)].local_size; }

std::optional<Kernel> MatMulKernel(DType t) {
  switch (t) {
    case DType::kF32: return Kernel::kMatMulF32;
    case DType::kF16: return Kernel::kMatMulF16;
    case DType::kBF16: return Kernel::kMatMulBF16;
    case DType::kQ4_0: return Kernel::kMatMulQ4_0;
    case DType::kQ4_1: return Kernel::kMatMulQ4_1;
    case DType::kQ5_0: return Kernel::kMatMulQ5_0;
    case DType::kQ5_1: return Kernel::kMatMulQ5_1;
    case DType::kQ8_0: return Kernel::kMatMulQ8_0;
    case DType::kQ4_K: return Kernel::kMatMulQ4_K;
    case DType::kQ5_K: return Kernel::kMatMulQ5_K;
    case DType::kQ6_K: return Kernel::kMatMulQ6_K;
    default: return std::nullopt;
  }
}

std::optional<Kernel> GetRowsKernel(DType t) {
  switch (t) {
    case DType::kF32: return Kernel::kGetRowsF32;
    case DType::kF16: return Kernel::kGetRowsF16;
    case DType::kBF16: return Kernel::kGetRowsBF16;
    case DType::kQ4_0: return Kernel::kGetRowsQ4_0;
    case DType::kQ4_1: return Kernel::kGetRowsQ4_1;
    case DType::kQ5_0: return Kernel::kGetRowsQ5_0;
    case DType::kQ5_1: return Kernel::kGetRowsQ5_1;
    case DType::kQ8_0: return Kernel::kGetRowsQ8_0;
    case DType::kQ4_K: return Kernel::kGetRowsQ4_K;
    case DType::kQ5_K: return Kernel::kGetRowsQ5_K;
    case DType::kQ6_K: return Kernel::kGetRowsQ6_K;
    default: return std::nullopt;
  }
}

std::optional<Kernel> MoeMatMulKernel(DType t) {
  const std::optional<Kernel> m = MatMulKernel(t);
  if (!m) return std::nullopt;
  return static_cast<Kernel>(static_cast<int32_t>(Kernel::kMoeMatMulF32) + static_cast<int32_t>(*m) -
                             static_cast<int32_t>(Kernel::kMatMulF32));
}

std::optional<Kernel> TiledMatMulKernel(DType t) {
  const std::optional<Kernel> m = MatMulKernel(t);
  if (!m) return std::nullopt;
  return static_cast<Kernel>(static_cast<int32_t>(Kernel::kMatMulTiledF32) + static_cast<int32_t>(*m) -
                             static_cast<int32_t>(Kernel::kMatMulF32));
}

}  // namespace decoded::vulkan
