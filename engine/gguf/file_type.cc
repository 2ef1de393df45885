#include "engine/gguf/file_type.h"

#include "absl/strings/str_cat.h"

namespace decoded {
namespace {

// llama_ftype; 4-6 and 33-35 were removed from llama.cpp and never reused.
const char* FileTypeName(uint64_t value) {
  switch (value) {
    case 0: return "F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 7: return "Q8_0";
    case 8: return "Q5_0";
    case 9: return "Q5_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K_S";
    case 12: return "Q3_K_M";
    case 13: return "Q3_K_L";
    case 14: return "Q4_K_S";
    case 15: return "Q4_K_M";
    case 16: return "Q5_K_S";
    case 17: return "Q5_K_M";
    case 18: return "Q6_K";
    case 19: return "IQ2_XXS";
    case 20: return "IQ2_XS";
    case 21: return "Q2_K_S";
    case 22: return "IQ3_XS";
    case 23: return "IQ3_XXS";
    case 24: return "IQ1_S";
    case 25: return "IQ4_NL";
    case 26: return "IQ3_S";
    case 27: return "IQ3_M";
    case 28: return "IQ2_S";
    case 29: return "IQ2_M";
    case 30: return "IQ4_XS";
    case 31: return "IQ1_M";
    case 32: return "BF16";
    case 36: return "TQ1_0";
    case 37: return "TQ2_0";
    default: return nullptr;
  }
}

}  // namespace

std::string GgufFileTypeName(const GgufFile& file) {
  absl::StatusOr<uint64_t> value = file.GetUint("general.file_type");
  if (!value.ok()) return "";
  const char* name = FileTypeName(*value);
  return name != nullptr ? name : absl::StrCat("file type ", *value);
}

}  // namespace decoded
