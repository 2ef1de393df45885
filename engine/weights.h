// A model's weights, loaded once per process and shared by every session.
//
// Weights view the GGUF mapping in place: quantized tensors stay quantized and
// nothing is copied per session or per graph build. instance_id() comes from a
// never-recycled counter and is part of every held plan's validity key.
#ifndef DECODED_ENGINE_WEIGHTS_H_
#define DECODED_ENGINE_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/graph/graph.h"

namespace decoded {

class Weights {
 public:
  // Views every tensor of `file` (which the Weights keep alive).
  static absl::StatusOr<std::shared_ptr<const Weights>> FromGguf(std::shared_ptr<const GgufFile> file);

  uint64_t instance_id() const { return instance_id_; }
  const GgufFile& file() const { return *file_; }

  // NOT_FOUND naming the tensor if absent; INVALID_ARGUMENT if its shape is
  // not [rows, cols] (GGUF ne = {cols, rows}) when rows/cols are given (>= 0),
  // a 3-D tensor included. Tensors of up to three dimensions are held.
  absl::StatusOr<const WeightTensor*> Get(std::string_view name, int64_t rows = -1, int64_t cols = -1) const;
  const WeightTensor* Find(std::string_view name) const;

 private:
  Weights() = default;
  uint64_t instance_id_ = 0;
  std::shared_ptr<const GgufFile> file_;
  absl::node_hash_map<std::string, WeightTensor> tensors_;  // node map: stable addresses
};

}  // namespace decoded

#endif  // DECODED_ENGINE_WEIGHTS_H_
