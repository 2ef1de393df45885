// The compute kernels of the Vulkan backend: GLSL in engine/vulkan/shaders,
// compiled to SPIR-V by glslc at build time and embedded in the binary.
//
// Every kernel reaches its buffers by device address through push constants
// (shaders/common.glsl), so one pipeline layout (128 bytes of push constants,
// no descriptor sets) serves them all. The structs below mirror each shader's
// `Params` block in scalar layout, member for member.
#ifndef DECODED_ENGINE_VULKAN_KERNELS_H_
#define DECODED_ENGINE_VULKAN_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/types/span.h"
#include "engine/dtype.h"

namespace decoded::vulkan {

enum class Kernel : int32_t {
  kMatMulF32, kMatMulF16, kMatMulBF16, kMatMulQ4_0, kMatMulQ4_1, kMatMulQ5_0, kMatMulQ5_1, kMatMulQ8_0,
  kMatMulQ4_K, kMatMulQ5_K, kMatMulQ6_K,
  kGetRowsF32, kGetRowsF16, kGetRowsBF16, kGetRowsQ4_0, kGetRowsQ4_1, kGetRowsQ5_0, kGetRowsQ5_1, kGetRowsQ8_0,
  kGetRowsQ4_K, kGetRowsQ5_K, kGetRowsQ6_K,
  kMoeMatMulF32, kMoeMatMulF16, kMoeMatMulBF16, kMoeMatMulQ4_0, kMoeMatMulQ4_1, kMoeMatMulQ5_0, kMoeMatMulQ5_1,
  kMoeMatMulQ8_0, kMoeMatMulQ4_K, kMoeMatMulQ5_K, kMoeMatMulQ6_K,
  kMatMulTiledF32, kMatMulTiledF16, kMatMulTiledBF16, kMatMulTiledQ4_0, kMatMulTiledQ4_1, kMatMulTiledQ5_0,
  kMatMulTiledQ5_1, kMatMulTiledQ8_0, kMatMulTiledQ4_K, kMatMulTiledQ5_K, kMatMulTiledQ6_K,
  kNorm, kEltwise, kCopy, kRope, kKvWrite, kAttention, kMoe,
  kCount,
};

const char* KernelName(Kernel k);
// The SPIR-V words of `k`.
absl::Span<const uint32_t> KernelSpirv(Kernel k);
// Workgroup size (x) the shader declares.
uint32_t KernelLocalSize(Kernel k);

// The mat-vec / get-rows kernel for weight type `t`; nullopt for a type the
// backend has no kernel for.
std::optional<Kernel> MatMulKernel(DType t);
std::optional<Kernel> GetRowsKernel(DType t);
// The routed-expert mat-vec (moe_matmul.comp) for expert weights of type `t`.
std::optional<Kernel> MoeMatMulKernel(DType t);
// The shared-memory tiled mat-mat (matmul_tiled.comp) for weights of type `t`.
std::optional<Kernel> TiledMatMulKernel(DType t);
// Output tile of the tiled mat-mat (activation rows x weight rows per
// workgroup) and the shared memory it needs: two 64 x 33 float tiles.
inline constexpr uint32_t kTiledMatMulTile = 64;
inline constexpr uint32_t kTiledMatMulSharedBytes = 2 * kTiledMatMulTile * 33 * 4;

inline constexpr size_t kPushConstantBytes = 128;

struct MatMulParams {
  uint64_t w, x, out;
  uint32_t w_row_bytes, k, m, n, x_row_stride, per, rows_per_group;
};
struct TiledMatMulParams {
  uint64_t w, x, out;
  uint32_t w_row_bytes, k, m, n, x_row_stride;
};
struct MoeMatMulParams {
  uint64_t w, x, out, ids, plane_bytes;
  uint32_t w_row_bytes, k, m, n, x_row_stride, x_div, rows_per_group;
};
struct MoeParams {
  uint64_t logits, bias, ids, weights, scratch, down, out;
  uint32_t rows, n_expert, k, gating, norm_topk, n_group, topk_group, group_score, has_bias, mode, hidden;
  float scale;
};
struct GetRowsParams {
  uint64_t table, ids, out;
  uint32_t row_bytes, cols, rows;
};
struct NormParams {
  uint64_t x, w, b, out;
  uint32_t group, n_groups;
  float eps;
  uint32_t layer_norm;
};
enum class EltwiseOp : uint32_t { kAdd = 0, kScale, kGeluMul, kGelu, kSwiGlu, kAddRow, kSoftcap };
struct EltwiseParams {
  uint64_t a, b, out;
  uint32_t n;
  EltwiseOp op;
  float f;
  uint32_t cols;
};
struct CopyParams {
  uint64_t x, out;
  uint32_t rows, groups, count;
  uint32_t src_row, src_group, src_off;
  uint32_t dst_row, dst_group, dst_off;
};
struct RopeParams {
  uint64_t x, cos, sin, out;
  uint32_t seq, n_heads, head_dim, rot_dims, adjacent;
};
struct KvWriteParams {
  uint64_t x, kv_rows, offsets, fault;
  uint32_t rows, n_kv_heads, head_dim, layer, stride, is_v;
};
struct AttentionParams {
  uint64_t q, bounds, kv_rows, out;
  uint32_t seq, n_heads, n_kv_heads, k_dim, v_dim, v_stride, layer, stride;
  float scale, softcap;
};

}  // namespace decoded::vulkan

#endif  // DECODED_ENGINE_VULKAN_KERNELS_H_
