// general.file_type: what the file's name usually says of its quantization
// ("Q4_K_M"), as opposed to the types its tensors actually have.
//
// The values are llama.cpp's `llama_ftype` (include/llama.h), which the GGUF
// specification names for this key: "an enumerated value describing the type
// of the majority of the tensors in the file".
#ifndef DECODED_ENGINE_GGUF_FILE_TYPE_H_
#define DECODED_ENGINE_GGUF_FILE_TYPE_H_

#include <string>

#include "engine/gguf/gguf_file.h"

namespace decoded {

// "Q4_K_M", "F16", "BF16", ...; "file type N" for a value this build does
// not name; "" when the file has no general.file_type (it is optional).
std::string GgufFileTypeName(const GgufFile& file);

}  // namespace decoded

#endif  // DECODED_ENGINE_GGUF_FILE_TYPE_H_
