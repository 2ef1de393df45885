#include "server/request_parser.h"

#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/utf8_validation.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace decoded::server {
namespace {

namespace pb = google::protobuf;
using pb::internal::WireFormatLite;

// Protobuf's default recursion limit: deeper input fails its parse.
constexpr int kMaxDepth = 100;

// The diagnosis pass: reads the wire format of one message against its
// Descriptor, accepting what protobuf's parser accepts (unknown fields, known
// fields with a mismatched wire type, which protobuf keeps as unknown) and
// reporting the first thing it refuses.
class Diagnosis {
 public:
  explicit Diagnosis(const pb::Descriptor& root) : root_(root) {}

  // Walks one message up to the stream's current limit. `path` names the
  // message ("" for the root, else e.g. "turn.messages.messages[1]").
  absl::Status Walk(pb::io::CodedInputStream& in, const pb::Descriptor& type, const std::string& path, int depth) {
    if (depth > kMaxDepth) return Malformed(path, absl::StrCat("nested deeper than ", kMaxDepth, " messages"));
    std::map<int, int> seen;  // field number -> occurrences so far, for repeated-field indices
    while (in.BytesUntilLimit() > 0) {
      uint32_t tag;
      if (!in.ReadVarint32(&tag)) return Malformed(path, "truncated tag");
      const int number = WireFormatLite::GetTagFieldNumber(tag);
      const int wire_type = static_cast<int>(tag & 7);
      const pb::FieldDescriptor* field = type.FindFieldByNumber(number);
      const std::string where = FieldName(number, field);
      if (number == 0) return Malformed(path, "field number 0");
      if (wire_type > WireFormatLite::WIRETYPE_FIXED32) {
        return Malformed(path, absl::StrCat(where, ": bad wire type ", wire_type));
      }
      if (wire_type == WireFormatLite::WIRETYPE_END_GROUP) {
        return Malformed(path, absl::StrCat(where, ": end-group tag with no open group"));
      }
      const int index = seen[number]++;
      if (field != nullptr && wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        std::string field_path = path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
        if (field->is_repeated()) absl::StrAppend(&field_path, "[", index, "]");
        if (absl::Status s = LengthDelimited(in, *field, path, field_path, depth); !s.ok()) return s;
        continue;
      }
      // Unknown fields and mismatched wire types: protobuf skips them too.
      if (!WireFormatLite::SkipField(&in, tag)) return Malformed(path, absl::StrCat(where, ": ", Truncated(wire_type)));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status LengthDelimited(pb::io::CodedInputStream& in, const pb::FieldDescriptor& field,
                               const std::string& parent, const std::string& field_path, int depth) {
    const std::string where = FieldName(field.number(), &field);
    uint32_t length;
    if (!in.ReadVarint32(&length)) return Malformed(parent, absl::StrCat(where, ": truncated length"));
    const int left = in.BytesUntilLimit();
    if (length > static_cast<uint32_t>(left)) {
      return Malformed(parent, absl::StrCat(where, ": length ", length, " runs past the end of ",
                                            parent.empty() ? "the message" : parent, " (", left, " bytes left)"));
    }
    const int size = static_cast<int>(length);
    if (field.type() == pb::FieldDescriptor::TYPE_STRING &&
        field.file()->syntax() == pb::FileDescriptor::SYNTAX_PROTO3) {
      std::string bytes;
      in.ReadString(&bytes, size);
      if (std::optional<Utf8Error> error = FindInvalidUtf8(bytes)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s is not valid UTF-8: byte %d (0x%02X) of %d %s (RFC 3629)", field_path, error->offset,
            static_cast<uint8_t>(bytes[error->offset]), bytes.size(), Utf8DefectDescription(error->defect)));
      }
      return absl::OkStatus();
    }
    const pb::io::CodedInputStream::Limit limit = in.PushLimit(size);
    absl::Status status;
    if (field.type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      status = Walk(in, *field.message_type(), field_path, depth + 1);
    } else if (field.is_packable()) {
      status = Packed(in, field, parent);
    } else {
      in.Skip(size);
    }
    in.PopLimit(limit);
    return status;
  }

  // A packed repeated scalar: elements back to back up to the limit.
  absl::Status Packed(pb::io::CodedInputStream& in, const pb::FieldDescriptor& field, const std::string& parent) {
    const auto element = WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(field.type()));
    while (in.BytesUntilLimit() > 0) {
      bool ok;
      if (element == WireFormatLite::WIRETYPE_VARINT) {
        uint64_t v;
        ok = in.ReadVarint64(&v);
      } else if (element == WireFormatLite::WIRETYPE_FIXED32) {
        uint32_t v;
        ok = in.ReadLittleEndian32(&v);
      } else {
        uint64_t v;
        ok = in.ReadLittleEndian64(&v);
      }
      if (!ok) {
        return Malformed(parent, absl::StrCat(FieldName(field.number(), &field), ": packed elements end in a ",
                                              Truncated(element)));
      }
    }
    return absl::OkStatus();
  }

  static std::string FieldName(int number, const pb::FieldDescriptor* field) {
    return field == nullptr ? absl::StrCat("field ", number, " (unknown)")
                            : absl::StrCat("field ", number, " (", field->name(), ")");
  }

  static const char* Truncated(int wire_type) {
    switch (wire_type) {
      case WireFormatLite::WIRETYPE_VARINT:
        return "truncated varint";
      case WireFormatLite::WIRETYPE_FIXED64:
        return "truncated 8-byte value";
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED:
        return "truncated length or value";
      case WireFormatLite::WIRETYPE_START_GROUP:
        return "group that is not closed";
      case WireFormatLite::WIRETYPE_FIXED32:
        return "truncated 4-byte value";
    }
    return "bad value";
  }

  absl::Status Malformed(const std::string& path, const std::string& what) const {
    return absl::InvalidArgumentError(
        path.empty() ? absl::StrCat("malformed ", root_.full_name(), ": ", what)
                     : absl::StrCat("malformed ", root_.full_name(), ": in ", path, ", ", what));
  }

  const pb::Descriptor& root_;
};

std::string Flatten(const grpc::ByteBuffer& wire) {
  std::string bytes;
  std::vector<grpc::Slice> slices;
  if (!wire.Valid() || !wire.Dump(&slices).ok()) return bytes;
  bytes.reserve(wire.Length());
  for (const grpc::Slice& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes;
}

}  // namespace

absl::Status ParseRequest(const grpc::ByteBuffer& wire, google::protobuf::Message* out) {
  out->Clear();
  if (!wire.Valid()) return absl::OkStatus();
  const pb::Descriptor& type = *out->GetDescriptor();
  if (wire.Length() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", type.full_name(), ": larger than 2 GiB"));
  }
  {
    // ProtoBufferReader wants a mutable buffer; the copy shares the slices.
    grpc::ByteBuffer shared(wire);
    grpc::ProtoBufferReader reader(&shared);
    // A string field that is not UTF-8 makes protobuf log an error line per
    // request; the status below says more, and a client must not be able to
    // flood the daemon's log.
    pb::LogSilencer quiet;
    if (out->ParseFromZeroCopyStream(&reader)) return absl::OkStatus();
  }
  const std::string bytes = Flatten(wire);
  pb::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size()));
  absl::Status diagnosis = Diagnosis(type).Walk(in, type, "", 0);
  if (!diagnosis.ok()) return diagnosis;
  return absl::InvalidArgumentError(absl::StrCat("malformed ", type.full_name(), ": the message does not parse"));
}

}  // namespace decoded::server
