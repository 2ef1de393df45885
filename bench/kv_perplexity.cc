// Perplexity of a model with its KV cache in one element type (--kv_type):
// what f16 and q8_0 KV cost in quality against f32, computed as llama.cpp's
// llama-perplexity does (engine/perplexity.h) on token ids given in a JSON
// file (tools/gen_kv_perplexity_reference.py's output: the ids llama.cpp's
// tokenizer gave, so both sides score the same ids).
// bench/run_kv_perplexity.py runs it for the three real models and every
// type beside llama.cpp's own figures. Prints one JSON line.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/device_spec.h"
#include "engine/kv_layout.h"
#include "engine/perplexity.h"
#include "engine/runtime.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "GGUF model path");
ABSL_FLAG(std::string, tokens, "",
          "JSON file of tools/gen_kv_perplexity_reference.py: the token ids of models.<--entry>.tokens are scored");
ABSL_FLAG(std::string, entry, "gemma3", "which model's ids in --tokens: gemma3, smollm2, qwen2");
ABSL_FLAG(std::string, kv_type, "f32", "KV cache element type: f32, f16 or q8_0");
ABSL_FLAG(int, n_ctx, 512, "perplexity window (tokens)");
ABSL_FLAG(int, windows, 0, "windows to score (0: all the file holds)");
ABSL_FLAG(int, threads, 1, "compute threads");
ABSL_FLAG(std::string, device, "cpu", "backend: cpu or vulkan[:N]");

namespace decoded {
namespace {

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "kv_perplexity: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

int Main() {
  const std::string type = absl::GetFlag(FLAGS_kv_type);
  ModelLoadOptions options;
  const absl::StatusOr<DType> kv_type = KvTypeFromName(type);
  if (!kv_type.ok()) return Fail("--kv_type", kv_type.status());
  options.kv_type = *kv_type;
  std::ifstream in(absl::GetFlag(FLAGS_tokens));
  if (!in) return Fail("--tokens", absl::NotFoundError(absl::GetFlag(FLAGS_tokens)));
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const std::string entry = absl::GetFlag(FLAGS_entry);
  if (!doc.is_object() || !doc.contains("models") || !doc["models"].contains(entry) ||
      !doc["models"][entry].contains("tokens") || !doc["models"][entry]["tokens"].is_array()) {
    return Fail("--tokens", absl::InvalidArgumentError("no models." + entry + ".tokens array in the file"));
  }
  std::vector<int32_t> tokens;
  for (const auto& t : doc["models"][entry]["tokens"]) {
    if (!t.is_number_integer()) return Fail("--tokens", absl::InvalidArgumentError("a token id is not an integer"));
    tokens.push_back(t.get<int32_t>());
  }
  const int n_ctx = absl::GetFlag(FLAGS_n_ctx);
  if (const int w = absl::GetFlag(FLAGS_windows); w > 0 && static_cast<size_t>(w) * n_ctx < tokens.size()) {
    tokens.resize(static_cast<size_t>(w) * n_ctx);
  }
  auto backend = OpenBackend(absl::GetFlag(FLAGS_device));
  if (!backend.ok()) return Fail("--device", backend.status());
  options.backend = *backend;
  auto model = Model::Load(absl::GetFlag(FLAGS_model), options);
  if (!model.ok()) return Fail("model", model.status());
  auto executor = (*model)->backend().CreateExecutor(absl::GetFlag(FLAGS_threads));
  if (!executor.ok()) return Fail("executor", executor.status());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Perplexity(**model, tokens, n_ctx, **executor);
  if (!r.ok()) return Fail("perplexity", r.status());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto ctx = (*model)->NewContext(n_ctx);
  if (!ctx.ok()) return Fail("context", ctx.status());
  nlohmann::json out = {{"model", (*model)->info().name},
                        {"kv_type", (*model)->info().kv_type},
                        {"n_ctx", n_ctx},
                        {"windows", r->windows},
                        {"scored", r->scored},
                        {"ppl", r->ppl},
                        {"nll", r->nll},
                        {"window_ppl", r->window_ppl},
                        {"kv_bytes_per_token", (*ctx)->kv_bytes() / n_ctx},
                        {"seconds", secs}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace decoded

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return decoded::Main();
}
