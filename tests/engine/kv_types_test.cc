// KV caches of f16 and q8_0 elements (--kv_type; engine/kv_layout.h) on the
// CPU:
//   - Size: a token's KV bytes are half of f32's in f16 and 34/128 of them in
//     q8_0 (GGUF spec: a Q8_0 block is an fp16 scale and 32 int8 codes).
//   - Bad types are refused with INVALID_ARGUMENT: q8_0 on rows that are not
//     whole 32-element blocks, or a type that is no KV type.
//   - Write: the rows a step stores are the f32 rows converted: fp16 nearest
//     even (against numpy's float16 conversion rules, spelled out below), and
//     ggml's reference Q8_0 quantizer (quant::QuantizeActivationRow, checked
//     against gguf-py's in tests/quant).
//   - Read: attention over such a cache equals softmax attention computed in
//     double over the decoded values (fp16 and Q8_0 decoded here by their
//     definitions, not with the engine's helpers).
//   - Exactness per type: D2 == D1 byte for byte (the held decode plan and a
//     graph built per token), the mixed-step script equal to each session
//     alone and to D1, and paged caches equal to contiguous ones: f16 on every
//     family fixture (all have 16-wide heads, which q8_0 refuses) and both
//     types on the three real models.
// The quality cost of each type is measured against llama.cpp's own by
// tests/models/kv_type_perplexity_test.cc.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/key_panels.h"
#include "engine/decode_driver.h"
#include "engine/kv_cache.h"
#include "engine/kv_pool.h"
#include "engine/kv_rows.h"
#include "engine/model_registry.h"
#include "engine/quant/quant.h"
#include "engine/runtime.h"
#include "gtest/gtest.h"
#include "tests/common/family_fixtures.h"
#include "tests/common/kv_type_reference.h"
#include "tests/common/model_path.h"
#include "tests/common/test_vocabulary.h"
#include "tests/engine/mixed_step_check.h"
#include "tests/engine/paged_kv_check.h"

namespace decoded {
namespace {

using testing::DecodeQ8_0;
using testing::HalfValue;
using testing::NearestHalf;

std::shared_ptr<Backend> Cpu() { return SharedCpuBackend(); }

std::vector<float> Random(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>((s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
  }
  return v;
}

TEST(KvTypesTest, BytesPerTokenHalveInF16AndAreAboutAQuarterInQ8_0) {
  const KvLayout f32 = KvLayout::Separate(3, 64);
  EXPECT_EQ(f32.bytes_per_token(), 3 * (64 + 64) * 4);
  EXPECT_EQ(f32.WithType(DType::kF16).bytes_per_token(), 3 * (64 + 64) * 2);
  EXPECT_EQ(f32.WithType(DType::kQ8_0).bytes_per_token(), 3 * (2 * 34 + 2 * 34));
  // MLA's latent: one K row, no V slot.
  EXPECT_EQ(KvLayout::SharedLatent(576, 512).WithType(DType::kQ8_0).bytes_per_token(), 576 / 32 * 34);
  for (const DType t : {DType::kF32, DType::kF16, DType::kQ8_0}) {
    auto pool = KvPool::Create(*Cpu(), /*n_layers=*/2, f32.WithType(t), /*block_tokens=*/16, /*n_blocks=*/5);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ((*pool)->bytes(), 2 * 5 * 16 * f32.WithType(t).bytes_per_token()) << DTypeName(t);
  }
}

TEST(KvTypesTest, TypesACacheCannotHoldAreRefused) {
  auto q8 = KvPool::Create(*Cpu(), 1, KvLayout::Separate(2, 16).WithType(DType::kQ8_0), 16, 4);
  ASSERT_FALSE(q8.ok());
  EXPECT_EQ(q8.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q8.status().message().find("multiples of 32"), std::string::npos) << q8.status();
  auto q4 = KvCache::Create(*Cpu(), 1, KvLayout::Separate(2, 32).WithType(DType::kQ4_0), 8);
  ASSERT_FALSE(q4.ok());
  EXPECT_EQ(q4.status().code(), absl::StatusCode::kInvalidArgument);

  // Through the model: every fixture has 16-wide heads.
  ModelLoadOptions options;
  options.kv_type = DType::kQ8_0;
  auto model = Model::Load(testing::LoadableFixturePath("llama_tiny.gguf"), options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("q8_0"), std::string::npos) << model.status();
  options.kv_type = DType::kBF16;
  model = Model::Load(testing::LoadableFixturePath("llama_tiny.gguf"), options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  options.kv_type = DType::kF16;
  model = Model::Load(testing::LoadableFixturePath("llama_tiny.gguf"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->info().kv_type, "f16");
}

// One cache of one kv head, `cap` positions of k_dim = v_dim = 64, filled
// with `keys` / `values` stored as `type`; attention of two query rows over
// ranges of it against double softmax attention over the decoded values.
void CheckAttentionReads(DType type) {
  constexpr int32_t heads = 2, dim = 64, cap = 40, seq = 2;
  constexpr float scale = 0.125f;
  const std::vector<float> keys = Random(cap * dim, 1), values = Random(cap * dim, 2), q = Random(seq * heads * dim, 3);
  const int64_t rb = KvRowBytes(type, dim);
  std::vector<uint8_t> kbytes(static_cast<size_t>(cap * rb)), vbytes(kbytes.size());
  std::vector<double> kdec, vdec;
  for (int32_t p = 0; p < cap; ++p) {
    for (auto [src, dst, dec] : {std::tuple{&keys, &kbytes, &kdec}, std::tuple{&values, &vbytes, &vdec}}) {
      const float* x = src->data() + p * dim;
      uint8_t* row = dst->data() + p * rb;
      if (type == DType::kF16) {
        for (int32_t i = 0; i < dim; ++i) {
          const uint16_t h = NearestHalf(x[i]);
          std::memcpy(row + 2 * i, &h, 2);
          dec->push_back(HalfValue(h));
        }
      } else {
        quant::QuantizeActivationRow(DType::kQ8_0, x, dim, row);
        const std::vector<double> d = DecodeQ8_0(row, dim);
        dec->insert(dec->end(), d.begin(), d.end());
      }
    }
  }
  const int32_t table[] = {0};
  const auto addr = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(p)); };
  const int64_t row[] = {cap, cap, static_cast<int64_t>(type), 0, addr(table), addr(kbytes.data()),
                         addr(vbytes.data())};
  const int64_t kv_rows[] = {row[0], row[1], row[2], row[3], row[4], row[5], row[6],
                             row[0], row[1], row[2], row[3], row[4], row[5], row[6]};
  const int32_t bounds[] = {0, 17, 5, 40};
  std::vector<float> out(seq * heads * dim, -1.0f);
  cpu::Attention(q.data(), bounds, kv_rows, KvRowStride(1), 0, out.data(), seq, heads, 1, dim, dim, dim, scale, 0.0f,
                 0, 1);
  double worst = 0, worst_vs_f32 = 0;
  for (int32_t t = 0; t < seq; ++t) {
    for (int32_t h = 0; h < heads; ++h) {
      const float* qh = q.data() + (t * heads + h) * dim;
      for (const bool decoded : {true, false}) {
        std::vector<double> s;
        double mx = -1e300, z = 0;
        for (int32_t j = bounds[2 * t]; j < bounds[2 * t + 1]; ++j) {
          double dot = 0;
          for (int32_t d = 0; d < dim; ++d) dot += qh[d] * (decoded ? kdec[j * dim + d] : keys[j * dim + d]);
          s.push_back(dot * scale);
          mx = std::max(mx, s.back());
        }
        for (double& v : s) z += (v = std::exp(v - mx));
        for (int32_t d = 0; d < dim; ++d) {
          double want = 0;
          for (size_t i = 0; i < s.size(); ++i) {
            const int64_t j = bounds[2 * t] + static_cast<int64_t>(i);
            want += s[i] / z * (decoded ? vdec[j * dim + d] : values[j * dim + d]);
          }
          const double err = std::fabs(out[(t * heads + h) * dim + d] - want);
          (decoded ? worst : worst_vs_f32) = std::max(decoded ? worst : worst_vs_f32, err);
        }
      }
    }
  }
  EXPECT_LT(worst, 2e-6) << DTypeName(type) << ": attention does not compute over the decoded cache";
  // The control: against the f32 values the stored type's rounding shows
  // (so the comparison above sees what the kernel read).
  EXPECT_GT(worst_vs_f32, 10 * worst) << DTypeName(type);
}

TEST(KvTypesTest, AttentionReadsF16Rows) { CheckAttentionReads(DType::kF16); }
TEST(KvTypesTest, AttentionReadsQ8_0Rows) { CheckAttentionReads(DType::kQ8_0); }

struct Family {
  std::shared_ptr<const Weights> weights;
  std::unique_ptr<DecodeModel> model;
};

Family LoadFamily(const std::string& path) {
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return {};
  auto model = CreateFamily(*weights, FamilyOptions{});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  return {*weights, *std::move(model)};
}

std::unique_ptr<KvCache> NewKv(const DecodeModel& m, DType type, int32_t capacity) {
  auto kv = KvCache::Create(m.backend(), m.dims().n_layers, m.dims().kv_layout().WithType(type), capacity);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return kv.ok() ? *std::move(kv) : nullptr;
}

// Layer 0's K and V rows depend only on the prompt's embeddings, so after
// one prefill chunk they are the same f32 values in an f32 and a `type`
// cache: the `type` cache must hold exactly their conversion.
void CheckWrittenRows(const std::string& path, DType type) {
  Family f = LoadFamily(path);
  ASSERT_NE(f.model, nullptr);
  const KvLayout layout = f.model->dims().kv_layout();
  constexpr int32_t cap = 16;
  auto ref = NewKv(*f.model, DType::kF32, cap), kv = NewKv(*f.model, type, cap);
  ASSERT_TRUE(ref && kv);
  CpuExecutor ex(2);
  const std::vector<int32_t> prompt = {1, 17, 23, 5, 9, 31, 2, 8, 11};
  ASSERT_TRUE(forward_with_kv_context(*f.model, *ref, prompt, false, ex).ok());
  ASSERT_TRUE(forward_with_kv_context(*f.model, *kv, prompt, false, ex).ok());
  int mismatched = 0;
  for (const bool is_v : {false, true}) {
    if (is_v && layout.v_in_k) continue;  // MLA: the value is part of the K row
    const int32_t dim = is_v ? layout.v_dim : layout.k_dim;
    const auto* src = static_cast<const float*>(is_v ? ref->v(0) : ref->k(0));
    const auto* dst = static_cast<const uint8_t*>(is_v ? kv->v(0) : kv->k(0));
    const int64_t rb = KvRowBytes(type, dim);
    // Keys may be in 16-position panels (engine/cpu/key_panels.h), in the
    // f32 cache and in the `type` one alike.
    const auto panels = [&](DType t) { return !is_v && cpu::KeysInPanels(t, !layout.v_in_k, cap, dim); };
    std::vector<float> x(static_cast<size_t>(dim));
    std::vector<uint8_t> want(static_cast<size_t>(rb)), got(want.size());
    for (int32_t h = 0; h < layout.n_kv_heads; ++h) {
      for (int32_t p = 0; p < static_cast<int32_t>(prompt.size()); ++p) {
        // Contiguous: one block of [n_kv_heads, capacity] positions (engine/kv_rows.h).
        const int64_t head = int64_t{h} * cap * dim;  // elements
        for (int32_t i = 0; i < dim; ++i) {
          x[i] = src[head + (panels(DType::kF32) ? cpu::PanelElement(p, dim, i) : int64_t{p} * dim + i)];
        }
        if (type == DType::kF16) {
          for (int32_t i = 0; i < dim; ++i) {
            const uint16_t v = NearestHalf(x[i]);
            std::memcpy(want.data() + 2 * i, &v, 2);
            const int64_t e = panels(type) ? cpu::PanelElement(p, dim, i) : int64_t{p} * dim + i;
            std::memcpy(got.data() + 2 * i, dst + 2 * (head + e), 2);
          }
        } else {
          quant::QuantizeActivationRow(DType::kQ8_0, x.data(), dim, want.data());
          std::memcpy(got.data(), dst + (int64_t{h} * cap + p) * rb, got.size());
        }
        mismatched += want != got;
      }
    }
  }
  EXPECT_EQ(mismatched, 0) << path << ": rows not stored as " << DTypeName(type);
}

int32_t Argmax(absl::Span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// D2 == D1 for `type`: a held decode plan and a graph built per token give
// the same logits bytes, prefill and 6 decode steps.
void CheckD2MatchesD1(const std::string& path, DType type) {
  Family f = LoadFamily(path);
  ASSERT_NE(f.model, nullptr);
  auto kv1 = NewKv(*f.model, type, 64), kv2 = NewKv(*f.model, type, 64);
  ASSERT_TRUE(kv1 && kv2);
  CpuExecutor ex(2);
  const std::vector<int32_t> prompt = {1, 5, 9, 14, 3, 27, 8};
  auto l1 = forward_with_kv_context(*f.model, *kv1, prompt, false, ex);
  auto l2 = forward_with_kv_context(*f.model, *kv2, prompt, false, ex);
  ASSERT_TRUE(l1.ok() && l2.ok());
  int32_t tok = Argmax(*l1);
  DecodeSession session;
  for (int i = 0; i < 6; ++i) {
    auto d1 = forward_with_kv_context(*f.model, *kv1, std::vector<int32_t>{tok}, false, ex);
    auto d2 = forward_with_kv_context_persistent(*f.model, *kv2, session, tok, ex);
    ASSERT_TRUE(d1.ok() && d2.ok());
    ASSERT_EQ(d1->size(), d2->size());
    EXPECT_EQ(std::memcmp(d1->data(), d2->data(), d1->size() * sizeof(float)), 0)
        << path << " " << DTypeName(type) << ": D1 and D2 differ at decode step " << i;
    tok = Argmax(*d2);
  }
  drop_decode_session(session);
}

class KvTypeFixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(KvTypeFixtureTest, F16RowsAreTheF32RowsRoundedToNearestEven) {
  CheckWrittenRows(testing::LoadableFixturePath(GetParam()), DType::kF16);
}

TEST_P(KvTypeFixtureTest, F16D2MatchesD1) { CheckD2MatchesD1(testing::LoadableFixturePath(GetParam()), DType::kF16); }

TEST_P(KvTypeFixtureTest, F16MixedStepsMatchAloneAndD1) {
  testing::CheckMixedSteps(testing::LoadableFixturePath(GetParam()), /*unit=*/1, /*capacity=*/64, kMaxPrefillChunk,
                           nullptr, /*control=*/false, DType::kF16);
}

TEST_P(KvTypeFixtureTest, F16PagedMatchesContiguous) {
  testing::CheckPagedMatchesContiguous(testing::LoadableFixturePath(GetParam()), /*unit=*/1, /*capacity=*/64,
                                       /*d1_chunk=*/7, /*block_tokens=*/5, nullptr, DType::kF16);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvTypeFixtureTest, ::testing::ValuesIn(testing::kFamilyFixtures),
                         testing::FixtureTestName);

// The three real models, both types. Under the sanitizers only Gemma 3 (the
// other two run the same engine code).
#if defined(__SANITIZE_ADDRESS__)
#define DECODED_RELEASE_ONLY() GTEST_SKIP() << "the Release build runs it; Gemma3 runs here"
#else
#define DECODED_RELEASE_ONLY() (void)0
#endif

struct RealCase {
  const char* name;
  const char* env;   // nullptr: the default model
  const char* file;
  DType type;
};

class KvTypeRealModelTest : public ::testing::TestWithParam<RealCase> {};

TEST_P(KvTypeRealModelTest, RowsD2D1MixedAndPagedExactness) {
  const RealCase& c = GetParam();
  std::string path;
  if (c.env != nullptr) {
    DECODED_RELEASE_ONLY();
    const testing::NamedModel m = testing::NamedModelPath(c.env, c.file);
    DECODED_REQUIRE_NAMED_MODEL(m);
    path = m.path;
  } else {
    DECODED_REQUIRE_REAL_MODEL();
    path = testing::RealModelPath();
  }
  CheckWrittenRows(path, c.type);
  CheckD2MatchesD1(path, c.type);
  testing::CheckMixedSteps(path, /*unit=*/6, /*capacity=*/256, kMaxPrefillChunk, nullptr, /*control=*/false, c.type);
  testing::CheckPagedMatchesContiguous(path, /*unit=*/6, /*capacity=*/256, /*d1_chunk=*/0, /*block_tokens=*/16,
                                       nullptr, c.type);
}

INSTANTIATE_TEST_SUITE_P(
    RealModels, KvTypeRealModelTest,
    ::testing::Values(RealCase{"gemma3_f16", nullptr, nullptr, DType::kF16},
                      RealCase{"gemma3_q8_0", nullptr, nullptr, DType::kQ8_0},
                      RealCase{"smollm2_f16", "DECODED_SMOLLM2_PATH", "smollm2-135m-instruct-q4_1.gguf", DType::kF16},
                      RealCase{"smollm2_q8_0", "DECODED_SMOLLM2_PATH", "smollm2-135m-instruct-q4_1.gguf",
                               DType::kQ8_0},
                      RealCase{"qwen2_f16", "DECODED_QWEN2_PATH", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                               DType::kF16},
                      RealCase{"qwen2_q8_0", "DECODED_QWEN2_PATH", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                               DType::kQ8_0}),
    [](const ::testing::TestParamInfo<RealCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace decoded
