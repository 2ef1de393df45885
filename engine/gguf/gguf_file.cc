#include "engine/gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/gguf/gguf_parser.h"

namespace decoded {
namespace {

// Closes a descriptor on scope exit; the mapping outlives it.
struct ScopedFd {
  int fd;
  ~ScopedFd() { ::close(fd); }
};

absl::Status OpenError(const std::string& path, absl::string_view what) {
  return absl::NotFoundError(
      absl::StrCat("GGUF \"", path, "\": ", what, ": ", std::strerror(errno)));
}

// The public API takes std::string_view; the packaged Abseil has its own view type.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string KeyContext(std::string_view key) {
  return absl::StrCat("metadata key \"", AbslView(key), "\"");
}

bool IsInteger(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kUint16:
    case GgufType::kInt16: case GgufType::kUint32: case GgufType::kInt32:
    case GgufType::kUint64: case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

bool IsFloat(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

// `ctx` names the key (and element) for error messages.
absl::StatusOr<uint64_t> ToUint(const GgufValue& v, absl::string_view ctx) {
  if (const uint64_t* u = std::get_if<uint64_t>(&v.value)) return *u;
  if (const int64_t* i = std::get_if<int64_t>(&v.value)) {
    if (*i >= 0) return static_cast<uint64_t>(*i);
    return absl::InvalidArgumentError(absl::StrCat(ctx, " holds ", GgufTypeName(v.type), " ",
                                                   *i, ", which does not fit uint64"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(ctx, " holds ", GgufTypeName(v.type), ", not an integer"));
}

absl::StatusOr<int64_t> ToInt(const GgufValue& v, absl::string_view ctx) {
  if (const int64_t* i = std::get_if<int64_t>(&v.value)) return *i;
  if (const uint64_t* u = std::get_if<uint64_t>(&v.value)) {
    if (*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(*u);
    }
    return absl::InvalidArgumentError(absl::StrCat(ctx, " holds ", GgufTypeName(v.type), " ",
                                                   *u, ", which does not fit int64"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(ctx, " holds ", GgufTypeName(v.type), ", not an integer"));
}

absl::StatusOr<double> ToFloat(const GgufValue& v, absl::string_view ctx) {
  if (const double* d = std::get_if<double>(&v.value)) return *d;
  return absl::InvalidArgumentError(
      absl::StrCat(ctx, " holds ", GgufTypeName(v.type), ", not float32/float64"));
}

// The array stored at `key`, whose elements satisfy `elem_ok` (described by
// `wanted` in the error).
absl::StatusOr<const GgufArray*> ArrayOf(const GgufValue* v, std::string_view key,
                                         bool (*elem_ok)(GgufType), absl::string_view wanted) {
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(KeyContext(key), " is absent"));
  const GgufArray* arr = std::get_if<GgufArray>(&v->value);
  if (arr == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(KeyContext(key), " holds ",
                                                   GgufTypeName(v->type), ", not an array of ",
                                                   wanted));
  }
  if (!elem_ok(arr->elem_type)) {
    return absl::InvalidArgumentError(absl::StrCat(KeyContext(key), " holds an array of ",
                                                   GgufTypeName(arr->elem_type), ", not of ",
                                                   wanted));
  }
  return arr;
}

}  // namespace

void GgufFile::Unmapper::operator()(const uint8_t* p) const {
  ::munmap(const_cast<uint8_t*>(p), size);
}

GgufFile::~GgufFile() = default;

namespace {

// The whole file in anonymous memory, read-only once filled.
absl::Status CopyInto(int fd, const std::string& path, uint8_t* dst, size_t size) {
  size_t done = 0;
  while (done < size) {
    const size_t chunk = std::min<size_t>(size - done, size_t{64} << 20);
    const ssize_t n = ::pread(fd, dst + done, chunk, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return OpenError(path, "cannot read");
    if (n == 0) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF \"", path, "\": the file shrank to ", done,
                                                     " bytes while it was read (", size, " at open)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path, GgufLoad load) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OpenError(path, "cannot open");
  ScopedFd closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return OpenError(path, "cannot stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("GGUF \"", path, "\": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  std::unique_ptr<const uint8_t, Unmapper> mapping(nullptr, Unmapper{size});
  // mmap rejects length 0; an empty file parses as truncated at byte offset 0.
  if (size > 0 && load == GgufLoad::kMap) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return OpenError(path, "cannot mmap");
    mapping.reset(static_cast<const uint8_t*>(p));
  } else if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return OpenError(path, "cannot allocate memory for");
    mapping.reset(static_cast<const uint8_t*>(p));
    // Transparent huge pages where the kernel offers them: the weights are
    // streamed every token, and 2 MiB pages need far fewer TLB entries.
    ::madvise(p, size, MADV_HUGEPAGE);
    if (absl::Status copied = CopyInto(fd, path, static_cast<uint8_t*>(p), size); !copied.ok()) return copied;
    // Nothing writes the weights: a stray write faults instead.
    ::mprotect(p, size, PROT_READ);
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufParser::Parse(mapping.get(), size, path);
  if (!file.ok()) return file.status();
  (*file)->mapping_ = std::move(mapping);
  return file;
}

void GgufFile::DropMetadata() {
  // swap, not clear(): clear() keeps the table's own allocation.
  absl::flat_hash_map<std::string, GgufValue>().swap(kv_);
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_.find(AbslView(key));
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(AbslView(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(KeyContext(key), " is absent"));
  return ToUint(*v, KeyContext(key));
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(KeyContext(key), " is absent"));
  return ToInt(*v, KeyContext(key));
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(KeyContext(key), " is absent"));
  return ToFloat(*v, KeyContext(key));
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(KeyContext(key), " is absent"));
  if (const bool* b = std::get_if<bool>(&v->value)) return *b;
  return absl::InvalidArgumentError(
      absl::StrCat(KeyContext(key), " holds ", GgufTypeName(v->type), ", not bool"));
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(KeyContext(key), " is absent"));
  if (const std::string* s = std::get_if<std::string>(&v->value)) return *s;
  return absl::InvalidArgumentError(
      absl::StrCat(KeyContext(key), " holds ", GgufTypeName(v->type), ", not string"));
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  absl::StatusOr<const GgufArray*> arr = ArrayOf(
      Find(key), key, [](GgufType t) { return t == GgufType::kString; }, "string");
  if (!arr.ok()) return arr.status();
  std::vector<std::string> out;
  out.reserve((*arr)->values.size());
  for (const GgufValue& v : (*arr)->values) out.push_back(std::get<std::string>(v.value));
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  absl::StatusOr<const GgufArray*> arr = ArrayOf(Find(key), key, IsFloat, "float32/float64");
  if (!arr.ok()) return arr.status();
  std::vector<float> out;
  out.reserve((*arr)->values.size());
  for (const GgufValue& v : (*arr)->values) {
    out.push_back(static_cast<float>(std::get<double>(v.value)));
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  absl::StatusOr<const GgufArray*> arr = ArrayOf(Find(key), key, IsInteger, "integers");
  if (!arr.ok()) return arr.status();
  std::vector<int64_t> out;
  out.reserve((*arr)->values.size());
  for (size_t i = 0; i < (*arr)->values.size(); ++i) {
    absl::StatusOr<int64_t> x =
        ToInt((*arr)->values[i], absl::StrCat(KeyContext(key), " element ", i));
    if (!x.ok()) return x.status();
    out.push_back(*x);
  }
  return out;
}

}  // namespace decoded
