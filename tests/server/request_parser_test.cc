// ParseRequest over every request message of decoded.proto. The string fields
// are enumerated from the descriptors (a new field is covered without editing
// this file); ill-formed text and its offsets come from the UTF-8 definition
// written as data in tests/common/utf8_cases.h, and malformed wire bytes are
// written by hand.
#include "server/request_parser.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/decoded.pb.h"
#include "tests/common/grpc_bytes.h"
#include "tests/common/utf8_cases.h"

namespace decoded::server {
namespace {

namespace pb = google::protobuf;
using FieldPath = std::vector<const pb::FieldDescriptor*>;

// The input types of the Decoder service's methods.
std::vector<const pb::Descriptor*> RequestTypes() {
  const pb::ServiceDescriptor* service = v1::TokenizeRequest::descriptor()->file()->FindServiceByName("Decoder");
  std::vector<const pb::Descriptor*> types;
  for (int i = 0; i < service->method_count(); ++i) types.push_back(service->method(i)->input_type());
  return types;
}

void CollectStringFields(const pb::Descriptor& type, FieldPath& prefix, std::set<const pb::Descriptor*>& on_path,
                         std::vector<FieldPath>& out) {
  on_path.insert(&type);
  for (int i = 0; i < type.field_count(); ++i) {
    const pb::FieldDescriptor* f = type.field(i);
    prefix.push_back(f);
    if (f->type() == pb::FieldDescriptor::TYPE_STRING) out.push_back(prefix);
    if (f->type() == pb::FieldDescriptor::TYPE_MESSAGE && !on_path.count(f->message_type())) {
      CollectStringFields(*f->message_type(), prefix, on_path, out);
    }
    prefix.pop_back();
  }
  on_path.erase(&type);
}

// Every string field reachable from `type`, as the fields leading to it.
std::vector<FieldPath> StringFields(const pb::Descriptor& type) {
  FieldPath prefix;
  std::set<const pb::Descriptor*> on_path;
  std::vector<FieldPath> out;
  CollectStringFields(type, prefix, on_path, out);
  return out;
}

// The path a client reads in the error: field names joined by '.', and "[1]"
// after repeated fields (SetAlong puts the value at index 1).
std::string PathName(const FieldPath& path) {
  std::string name;
  for (const pb::FieldDescriptor* f : path) {
    absl::StrAppend(&name, name.empty() ? "" : ".", f->name(), f->is_repeated() ? "[1]" : "");
  }
  return name;
}

// Sets the string at the end of `path` to `value`. Every repeated field on
// the way gets element 0 (holding "ok" at the same place) before element 1,
// which leads to `value`, so the error must count the index.
void SetAlong(pb::Message* m, const FieldPath& path, size_t i, const std::string& value) {
  const pb::FieldDescriptor* f = path[i];
  const pb::Reflection* r = m->GetReflection();
  if (i + 1 == path.size()) {
    if (f->is_repeated()) {
      r->AddString(m, f, "ok");
      r->AddString(m, f, value);
    } else {
      r->SetString(m, f, value);
    }
    return;
  }
  if (f->is_repeated()) {
    SetAlong(r->AddMessage(m, f), path, i + 1, "ok");
    SetAlong(r->AddMessage(m, f), path, i + 1, value);
  } else {
    SetAlong(r->MutableMessage(m, f), path, i + 1, value);
  }
}

std::unique_ptr<pb::Message> NewMessage(const pb::Descriptor& type) {
  return std::unique_ptr<pb::Message>(pb::MessageFactory::generated_factory()->GetPrototype(&type)->New());
}

// Wire bytes of a `type` message whose string at `path` holds `text`, which
// may be ill-formed: the message is serialized with a same-length placeholder
// (protobuf only logs when serializing bad UTF-8, but the placeholder keeps
// the test independent of that) whose bytes are then overwritten.
std::string WireWithText(const pb::Descriptor& type, const FieldPath& path, const std::string& text) {
  std::unique_ptr<pb::Message> m = NewMessage(type);
  const std::string placeholder(text.size(), '#');
  SetAlong(m.get(), path, 0, placeholder);
  std::string wire = m->SerializeAsString();
  if (text.empty()) return wire;
  const size_t at = wire.find(placeholder);
  EXPECT_NE(at, std::string::npos);
  EXPECT_EQ(at, wire.rfind(placeholder)) << "placeholder not unique";
  wire.replace(at, text.size(), text);
  return wire;
}

TEST(RequestParserTest, EnumeratesTheKnownStringFields) {
  std::set<std::string> names;
  for (const pb::Descriptor* type : RequestTypes()) {
    for (const FieldPath& path : StringFields(*type)) names.insert(absl::StrCat(type->name(), ":", PathName(path)));
  }
  for (const char* known : {"GenerateRequest:turn.text", "GenerateRequest:turn.messages.messages[1].role",
                            "GenerateRequest:turn.messages.messages[1].content",
                            "GenerateRequest:turn.stopping.stop_sequences[1]", "TokenizeRequest:text"}) {
    EXPECT_TRUE(names.count(known)) << known;
  }
}

TEST(RequestParserTest, IllFormedTextInAnyStringFieldNamesTheFieldAndTheByte) {
  int checked = 0;
  for (const pb::Descriptor* type : RequestTypes()) {
    for (const FieldPath& path : StringFields(*type)) {
      for (const testing::IllFormedUtf8Case& c : testing::IllFormedUtf8Cases()) {
        SCOPED_TRACE(absl::StrCat(type->full_name(), " ", PathName(path), " ", c.name));
        ASSERT_EQ(testing::ReferenceWellFormedPrefix(c.bytes), c.offset) << "case table disagrees with Table 3-7";
        std::unique_ptr<pb::Message> out = NewMessage(*type);
        absl::Status s = ParseRequest(testing::BufferOf(WireWithText(*type, path, c.bytes)), out.get());
        ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
        // The defect comes from the case table; only its wording is the checker's.
        const std::string expected = absl::StrFormat(
            "%s is not valid UTF-8: byte %d (0x%02X) of %d %s (RFC 3629)", PathName(path), c.offset,
            static_cast<uint8_t>(c.bytes[c.offset]), c.bytes.size(), std::string(Utf8DefectDescription(c.defect)));
        EXPECT_EQ(s.message(), expected);
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 5 * static_cast<int>(testing::IllFormedUtf8Cases().size()));
}

TEST(RequestParserTest, WellFormedTextInAnyStringFieldParses) {
  for (const pb::Descriptor* type : RequestTypes()) {
    for (const FieldPath& path : StringFields(*type)) {
      for (const std::string& text : testing::WellFormedUtf8Cases()) {
        SCOPED_TRACE(absl::StrCat(type->full_name(), " ", PathName(path), " '", text, "'"));
        std::unique_ptr<pb::Message> sent = NewMessage(*type);
        SetAlong(sent.get(), path, 0, text);
        std::unique_ptr<pb::Message> out = NewMessage(*type);
        ASSERT_TRUE(ParseRequest(testing::BufferOf(sent->SerializeAsString()), out.get()).ok());
        EXPECT_TRUE(pb::util::MessageDifferencer::Equals(*sent, *out));
      }
    }
  }
}

TEST(RequestParserTest, TheAnswerDoesNotDependOnHowTheBytesAreSliced) {
  v1::GenerateRequest valid;
  valid.mutable_turn()->set_text("h\xC3\xA9llo \xF0\x9F\x98\x80");
  const std::string good = valid.SerializeAsString();
  std::string bad = good;
  bad[bad.size() - 1] = 'x';  // cuts the four-byte sequence short
  for (size_t cut = 0; cut <= good.size(); ++cut) {
    const std::string* variants[] = {&good, &bad};
    for (const std::string* bytes : variants) {
      grpc::Slice slices[2] = {grpc::Slice(bytes->substr(0, cut)), grpc::Slice(bytes->substr(cut))};
      grpc::ByteBuffer wire(slices, 2);
      v1::GenerateRequest out;
      absl::Status s = ParseRequest(wire, &out);
      if (bytes == &good) {
        ASSERT_TRUE(s.ok()) << "cut " << cut << ": " << s;
        EXPECT_EQ(out.turn().text(), valid.turn().text());
      } else {
        ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "cut " << cut;
        EXPECT_TRUE(absl::StartsWith(s.message(), "turn.text is not valid UTF-8: byte 7 (0xF0) of 11 "))
            << s.message();
      }
    }
  }
}

TEST(RequestParserTest, EmptyAndMissingPayloadsAreTheEmptyMessage) {
  v1::TokenizeRequest out;
  out.set_text("stale");
  ASSERT_TRUE(ParseRequest(testing::BufferOf(""), &out).ok());
  EXPECT_EQ(out.text(), "");
  out.set_text("stale");
  ASSERT_TRUE(ParseRequest(grpc::ByteBuffer(), &out).ok());
  EXPECT_EQ(out.text(), "");
}

// Protobuf skips fields it does not know, and known fields sent with another
// (valid) wire type, without looking inside; ParseRequest accepts what
// protobuf accepts.
TEST(RequestParserTest, UnknownFieldsAndMismatchedWireTypesAreSkippedLikeProtobufDoes) {
  v1::TokenizeRequest out;
  // field 9 (unknown), length 1, byte 0xE9; then text = "ok".
  EXPECT_TRUE(ParseRequest(testing::BufferOf("\x4A\x01\xE9\x0A\x02ok"), &out).ok());
  EXPECT_EQ(out.text(), "ok");
  // text (field 1) as a varint.
  EXPECT_TRUE(ParseRequest(testing::BufferOf("\x08\x01"), &out).ok());
  EXPECT_EQ(out.text(), "");
}

struct MalformedCase {
  const char* name;
  const pb::Descriptor* type;
  std::string wire;
  std::string expected;  // the whole message
};

TEST(RequestParserTest, MalformedWireIsInvalidArgumentNamingTheDefect) {
  const pb::Descriptor* tokenize = v1::TokenizeRequest::descriptor();
  const pb::Descriptor* generate = v1::GenerateRequest::descriptor();
  const pb::Descriptor* detokenize = v1::DetokenizeRequest::descriptor();
  const std::vector<MalformedCase> cases = {
      {"truncated_varint", tokenize, std::string("\x10\x80", 2),
       "malformed decoded.v1.TokenizeRequest: field 2 (add_bos): truncated varint"},
      {"truncated_tag", tokenize, std::string("\x0A\x00\x80", 3),
       "malformed decoded.v1.TokenizeRequest: truncated tag"},
      {"length_past_end", tokenize, std::string("\x0A\x05" "ab", 4),
       "malformed decoded.v1.TokenizeRequest: field 1 (text): length 5 runs past the end of the message (2 bytes "
       "left)"},
      {"truncated_length", tokenize, std::string("\x0A\x85", 2),
       "malformed decoded.v1.TokenizeRequest: field 1 (text): truncated length"},
      {"length_past_end_nested", generate, std::string("\x0A\x04\x0A\x05" "ab", 6),
       "malformed decoded.v1.GenerateRequest: in turn, field 1 (text): length 5 runs past the end of turn (2 "
       "bytes left)"},
      {"truncated_varint_nested", generate, std::string("\x0A\x04\x2A\x02\x08\x80", 6),
       "malformed decoded.v1.GenerateRequest: in turn.stopping, field 1 (max_new_tokens): truncated varint"},
      {"wire_type_7", tokenize, std::string("\x0F", 1),
       "malformed decoded.v1.TokenizeRequest: field 1 (text): bad wire type 7"},
      {"wire_type_6_unknown_field", tokenize, std::string("\x4E", 1),
       "malformed decoded.v1.TokenizeRequest: field 9 (unknown): bad wire type 6"},
      {"end_group_without_start", tokenize, std::string("\x0C", 1),
       "malformed decoded.v1.TokenizeRequest: field 1 (text): end-group tag with no open group"},
      {"unclosed_group", tokenize, std::string("\x7B\x08\x01", 3),
       "malformed decoded.v1.TokenizeRequest: field 15 (unknown): group that is not closed"},
      {"truncated_fixed32", tokenize, std::string("\x7D\x01\x02", 3),
       "malformed decoded.v1.TokenizeRequest: field 15 (unknown): truncated 4-byte value"},
      {"field_number_0", tokenize, std::string("\x00\x01", 2),
       "malformed decoded.v1.TokenizeRequest: field number 0"},
      {"packed_ids_truncated", detokenize, std::string("\x0A\x02\x05\x80", 4),
       "malformed decoded.v1.DetokenizeRequest: field 1 (ids): packed elements end in a truncated varint"},
  };
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<pb::Message> out = NewMessage(*c.type);
    absl::Status s = ParseRequest(testing::BufferOf(c.wire), out.get());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message(), c.expected);
  }
}

}  // namespace
}  // namespace decoded::server
