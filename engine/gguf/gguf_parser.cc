#include "engine/gguf/gguf_parser.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/dtype.h"
#include "engine/gguf/byte_cursor.h"

namespace decoded {
namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// Smallest encoding of one metadata pair: empty key (8) + type (4) + 1-byte value.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
// Smallest tensor info: empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// Smallest encoded size of one value of type `t`; 0 for an unknown type.
uint64_t MinEncodedSize(uint32_t t) {
  switch (static_cast<GgufType>(t)) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString:  // the length prefix
      return 8;
    case GgufType::kArray:  // element type + length
      return 4 + 8;
  }
  return 0;
}

// Names come from the file: escape them so corrupted bytes cannot garble the
// message, and cut very long ones.
std::string Quoted(absl::string_view s) {
  constexpr size_t kMax = 96;
  if (s.size() > kMax) return absl::StrCat("\"", absl::CHexEscape(s.substr(0, kMax)), "...\"");
  return absl::StrCat("\"", absl::CHexEscape(s), "\"");
}

absl::Status WithContext(const absl::Status& s, absl::string_view context) {
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

template <typename Wire, typename Stored>
absl::StatusOr<GgufValue> ReadScalar(ByteCursor& c, GgufType t) {
  absl::StatusOr<Wire> v = c.Read<Wire>(absl::StrCat(GgufTypeName(t), " value"));
  if (!v.ok()) return v.status();
  return GgufValue{t, static_cast<Stored>(*v)};
}

// Reads one value of wire type `type`; `depth` counts enclosing arrays and
// `array_elements` the array elements read so far in the whole file.
absl::StatusOr<GgufValue> ReadValue(ByteCursor& c, uint32_t type, int depth, uint64_t& array_elements) {
  const size_t at = c.offset();
  switch (static_cast<GgufType>(type)) {
    case GgufType::kUint8: return ReadScalar<uint8_t, uint64_t>(c, GgufType::kUint8);
    case GgufType::kInt8: return ReadScalar<int8_t, int64_t>(c, GgufType::kInt8);
    case GgufType::kUint16: return ReadScalar<uint16_t, uint64_t>(c, GgufType::kUint16);
    case GgufType::kInt16: return ReadScalar<int16_t, int64_t>(c, GgufType::kInt16);
    case GgufType::kUint32: return ReadScalar<uint32_t, uint64_t>(c, GgufType::kUint32);
    case GgufType::kInt32: return ReadScalar<int32_t, int64_t>(c, GgufType::kInt32);
    case GgufType::kUint64: return ReadScalar<uint64_t, uint64_t>(c, GgufType::kUint64);
    case GgufType::kInt64: return ReadScalar<int64_t, int64_t>(c, GgufType::kInt64);
    case GgufType::kFloat32: return ReadScalar<float, double>(c, GgufType::kFloat32);
    case GgufType::kFloat64: return ReadScalar<double, double>(c, GgufType::kFloat64);
    case GgufType::kBool: {
      absl::StatusOr<uint8_t> b = c.Read<uint8_t>("bool value");
      if (!b.ok()) return b.status();
      // The spec calls any other byte invalid.
      if (*b > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("bool at byte offset ", at, " is ", *b, ", not 0 or 1"));
      }
      return GgufValue{GgufType::kBool, *b == 1};
    }
    case GgufType::kString: {
      absl::StatusOr<absl::string_view> s = c.ReadString("string value");
      if (!s.ok()) return s.status();
      return GgufValue{GgufType::kString, std::string(*s)};
    }
    case GgufType::kArray: {
      if (depth >= GgufParser::kMaxArrayDepth) {
        return absl::InvalidArgumentError(absl::StrCat("array at byte offset ", at,
                                                       " is nested deeper than ",
                                                       GgufParser::kMaxArrayDepth));
      }
      absl::StatusOr<uint32_t> elem = c.Read<uint32_t>("array element type");
      if (!elem.ok()) return elem.status();
      const uint64_t min_size = MinEncodedSize(*elem);
      if (min_size == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("array at byte offset ", at, " has unknown element type ", *elem));
      }
      const size_t len_at = c.offset();
      absl::StatusOr<uint64_t> n = c.Read<uint64_t>("array length");
      if (!n.ok()) return n.status();
      // Reject absurd lengths before reserving memory for them.
      if (*n > c.remaining() / min_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "array length ", *n, " at byte offset ", len_at, " cannot fit: ", c.remaining(),
            " bytes remain, each ", GgufTypeName(static_cast<GgufType>(*elem)),
            " element takes at least ", min_size));
      }
      // A parsed element takes sizeof(GgufValue) bytes, far more than its
      // encoding (48 vs 1 for uint8), so the byte check above alone would let
      // a file's metadata grow ~48x in memory.
      if (*n > GgufParser::kMaxArrayElements - array_elements) {
        return absl::InvalidArgumentError(absl::StrCat(
            "array length ", *n, " at byte offset ", len_at, " brings the file's metadata arrays past ",
            GgufParser::kMaxArrayElements, " elements in all (", array_elements, " before it)"));
      }
      array_elements += *n;
      GgufArray arr{static_cast<GgufType>(*elem), {}};
      arr.values.reserve(*n);
      for (uint64_t i = 0; i < *n; ++i) {
        absl::StatusOr<GgufValue> v = ReadValue(c, *elem, depth + 1, array_elements);
        if (!v.ok()) return WithContext(v.status(), absl::StrCat("array element ", i));
        arr.values.push_back(*std::move(v));
      }
      return GgufValue{GgufType::kArray, std::move(arr)};
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown value type ", type, " for the value at byte offset ", at));
}

// Everything parsed, before it moves into the GgufFile.
struct Parsed {
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  absl::flat_hash_map<std::string, GgufValue> kv;
  std::vector<GgufTensorInfo> tensors;
  absl::flat_hash_map<std::string, size_t> tensor_index;
};

absl::Status ParseAlignment(const GgufValue& v, absl::string_view ctx, uint64_t* alignment) {
  std::optional<uint64_t> a;
  if (const uint64_t* u = std::get_if<uint64_t>(&v.value)) a = *u;
  if (const int64_t* i = std::get_if<int64_t>(&v.value); i && *i >= 0) a = *i;
  if (!a.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx, ": holds ", GgufTypeName(v.type), ", not a non-negative integer alignment"));
  }
  if (*a == 0 || (*a & (*a - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, ": alignment ", *a, " is not a nonzero power of two"));
  }
  *alignment = *a;
  return absl::OkStatus();
}

absl::Status ParseMetadata(ByteCursor& c, uint64_t n_kv, Parsed& p) {
  p.kv.reserve(n_kv);
  uint64_t array_elements = 0;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t at = c.offset();
    absl::StatusOr<absl::string_view> key = c.ReadString("key");
    if (!key.ok()) {
      return WithContext(key.status(),
                         absl::StrCat("metadata pair #", i, " at byte offset ", at));
    }
    const std::string ctx =
        absl::StrCat("metadata key ", Quoted(*key), " (pair #", i, " at byte offset ", at, ")");
    absl::StatusOr<uint32_t> type = c.Read<uint32_t>("value type");
    if (!type.ok()) return WithContext(type.status(), ctx);
    const size_t value_at = c.offset();
    absl::StatusOr<GgufValue> value = ReadValue(c, *type, 0, array_elements);
    if (!value.ok()) return WithContext(value.status(), ctx);
    if (*key == "general.alignment") {
      absl::Status s = ParseAlignment(
          *value, absl::StrCat(ctx, " value at byte offset ", value_at), &p.alignment);
      if (!s.ok()) return s;
    }
    if (!p.kv.try_emplace(std::string(*key), *std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, ": duplicate key"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseTensorInfos(ByteCursor& c, uint64_t n_tensors, Parsed& p) {
  p.tensors.reserve(n_tensors);
  p.tensor_index.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const size_t at = c.offset();
    absl::StatusOr<absl::string_view> name = c.ReadString("name");
    if (!name.ok()) {
      return WithContext(name.status(),
                         absl::StrCat("tensor info #", i, " at byte offset ", at));
    }
    const std::string ctx =
        absl::StrCat("tensor ", Quoted(*name), " (info #", i, " at byte offset ", at, ")");
    GgufTensorInfo t;
    t.name = std::string(*name);

    const size_t dims_at = c.offset();
    absl::StatusOr<uint32_t> n_dims = c.Read<uint32_t>("n_dims");
    if (!n_dims.ok()) return WithContext(n_dims.status(), ctx);
    if (*n_dims < 1 || *n_dims > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, ": n_dims ", *n_dims,
                                                     " at byte offset ", dims_at,
                                                     " is outside 1..", kMaxDims));
    }
    t.n_dims = static_cast<int>(*n_dims);
    int64_t n_elements = 1;
    for (int d = 0; d < 4; ++d) t.ne[d] = 1;
    for (int d = 0; d < t.n_dims; ++d) {
      const size_t dim_at = c.offset();
      absl::StatusOr<uint64_t> dim = c.Read<uint64_t>(absl::StrCat("ne[", d, "]"));
      if (!dim.ok()) return WithContext(dim.status(), ctx);
      if (*dim == 0 || *dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat(ctx, ": ne[", d, "] = ", *dim,
                                                       " at byte offset ", dim_at,
                                                       " is not a positive int64"));
      }
      const int64_t ne = static_cast<int64_t>(*dim);
      if (n_elements > std::numeric_limits<int64_t>::max() / ne) {
        return absl::InvalidArgumentError(absl::StrCat(
            ctx, ": element count overflows int64 at ne[", d, "] (byte offset ", dim_at, ")"));
      }
      n_elements *= ne;
      t.ne[d] = ne;
    }

    const size_t type_at = c.offset();
    absl::StatusOr<uint32_t> type = c.Read<uint32_t>("type");
    if (!type.ok()) return WithContext(type.status(), ctx);
    const std::optional<DTypeTraits> traits = LookupDType(*type);
    if (!traits.has_value()) {
      return absl::UnimplementedError(absl::StrCat(ctx, ": GGML type id ", *type,
                                                   " at byte offset ", type_at,
                                                   " is not supported by this build"));
    }
    t.type = static_cast<DType>(*type);
    const std::optional<size_t> row_bytes = RowBytes(t.type, t.ne[0]);
    if (!row_bytes.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          ctx, ": row length ne[0] = ", t.ne[0], " is not a multiple of the ", traits->name,
          " block size ", traits->block_size));
    }
    const uint64_t rows = static_cast<uint64_t>(n_elements / t.ne[0]);
    if (rows > std::numeric_limits<size_t>::max() / *row_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, ": byte size overflows"));
    }
    t.nbytes = rows * *row_bytes;

    const size_t offset_at = c.offset();
    absl::StatusOr<uint64_t> offset = c.Read<uint64_t>("data offset");
    if (!offset.ok()) return WithContext(offset.status(), ctx);
    if (*offset % p.alignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          ctx, ": data offset ", *offset, " at byte offset ", offset_at,
          " is not a multiple of the alignment ", p.alignment));
    }
    t.offset = *offset;
    t.data = nullptr;

    if (!p.tensor_index.try_emplace(t.name, p.tensors.size()).second) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, ": duplicate tensor name"));
    }
    p.tensors.push_back(std::move(t));
  }
  return absl::OkStatus();
}

// Places every tensor inside the data section, which starts at the aligned end
// of the tensor infos.
absl::Status PlaceTensorData(const uint8_t* data, size_t size, size_t infos_end, Parsed& p) {
  if (p.tensors.empty()) return absl::OkStatus();  // no data section to check
  const uint64_t pad = (p.alignment - infos_end % p.alignment) % p.alignment;
  if (pad > size - infos_end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor data section: tensor infos end at byte offset ", infos_end,
        "; aligned to ", p.alignment, " the data would start past the end of the file (",
        size, " bytes)"));
  }
  const size_t data_start = infos_end + pad;
  const size_t section = size - data_start;
  for (GgufTensorInfo& t : p.tensors) {
    if (t.offset > section || t.nbytes > section - t.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(t.name), ": data at section offset ", t.offset, " (byte offset ",
          data_start, " + ", t.offset, ") of ", t.nbytes, " bytes extends past the end of the file (",
          size, " bytes)"));
    }
    t.data = data + data_start + t.offset;
  }
  std::vector<size_t> order(p.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return p.tensors[a].offset < p.tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = p.tensors[order[k - 1]];
    const GgufTensorInfo& cur = p.tensors[order[k]];
    if (prev.offset + prev.nbytes > cur.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(cur.name), ": data at byte offset ", data_start + cur.offset,
          " overlaps tensor ", Quoted(prev.name), " at byte offsets [",
          data_start + prev.offset, ", ", data_start + prev.offset + prev.nbytes, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseAll(const uint8_t* data, size_t size, Parsed& p) {
  ByteCursor c(data, size);
  absl::StatusOr<absl::string_view> magic = c.ReadBytes(4, "magic");
  if (!magic.ok()) return WithContext(magic.status(), "header");
  if (*magic != "GGUF") {
    return absl::InvalidArgumentError(absl::StrCat(
        "header: bad magic at byte offset 0: expected \"GGUF\", found \"",
        absl::CHexEscape(*magic), "\""));
  }
  absl::StatusOr<uint32_t> version = c.Read<uint32_t>("version");
  if (!version.ok()) return WithContext(version.status(), "header");
  // Version 1 used 32-bit counts; a big-endian file reads as 0x03000000 here.
  if (*version != 2 && *version != 3) {
    return absl::InvalidArgumentError(absl::StrCat("header: unsupported version ", *version,
                                                   " at byte offset 4 (supported: 2, 3)"));
  }
  p.version = *version;
  absl::StatusOr<uint64_t> n_tensors = c.Read<uint64_t>("tensor count");
  if (!n_tensors.ok()) return WithContext(n_tensors.status(), "header");
  absl::StatusOr<uint64_t> n_kv = c.Read<uint64_t>("metadata count");
  if (!n_kv.ok()) return WithContext(n_kv.status(), "header");
  if (*n_kv > c.remaining() / kMinKvBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header: metadata count ", *n_kv, " at byte offset 16 cannot fit in the ",
                     c.remaining(), " bytes that follow"));
  }
  if (absl::Status s = ParseMetadata(c, *n_kv, p); !s.ok()) return s;
  if (*n_tensors > c.remaining() / kMinTensorInfoBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header: tensor count ", *n_tensors, " at byte offset 8 cannot fit in the ",
        c.remaining(), " bytes after the metadata (which ends at byte offset ", c.offset(), ")"));
  }
  if (absl::Status s = ParseTensorInfos(c, *n_tensors, p); !s.ok()) return s;
  return PlaceTensorData(data, size, c.offset(), p);
}

}  // namespace

absl::string_view GgufTypeName(GgufType t) {
  switch (t) {
    case GgufType::kUint8: return "uint8";
    case GgufType::kInt8: return "int8";
    case GgufType::kUint16: return "uint16";
    case GgufType::kInt16: return "int16";
    case GgufType::kUint32: return "uint32";
    case GgufType::kInt32: return "int32";
    case GgufType::kFloat32: return "float32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "uint64";
    case GgufType::kInt64: return "int64";
    case GgufType::kFloat64: return "float64";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufParser::Parse(const uint8_t* data, size_t size,
                                                            std::string path) {
  Parsed p;
  if (absl::Status s = ParseAll(data, size, p); !s.ok()) {
    return WithContext(s, absl::StrCat("GGUF ", Quoted(path)));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = std::move(path);
  file->base_ = data;
  file->size_ = size;
  file->version_ = p.version;
  file->alignment_ = p.alignment;
  file->kv_ = std::move(p.kv);
  file->tensors_ = std::move(p.tensors);
  file->tensor_index_ = std::move(p.tensor_index);
  return file;
}

}  // namespace decoded
