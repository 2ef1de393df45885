// SerializeResponse: the bytes it produces are the message's wire format.
#include "server/response_serializer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/decoded.pb.h"
#include "tests/common/grpc_bytes.h"

namespace decoded::server {
namespace {

using testing::BytesOf;

TEST(ResponseSerializerTest, SmallAndLargeMessagesParseBackEqual) {
  for (int ids : {0, 3, 100000}) {  // empty, one inlined slice, many slices
    v1::TokenizeResponse sent;
    for (int i = 0; i < ids; ++i) sent.add_ids(i * 7);
    grpc::ByteBuffer wire;
    ASSERT_TRUE(SerializeResponse(sent, &wire).ok());
    v1::TokenizeResponse back;
    ASSERT_TRUE(back.ParseFromString(BytesOf(wire)));
    EXPECT_EQ(back.ids_size(), ids);
    EXPECT_EQ(std::vector<int32_t>(back.ids().begin(), back.ids().end()),
              std::vector<int32_t>(sent.ids().begin(), sent.ids().end()));
  }
}

TEST(ResponseSerializerTest, ReplacesWhatTheBufferHeld) {
  grpc::Slice old("stale bytes");
  grpc::ByteBuffer wire(&old, 1);
  v1::DetokenizeResponse sent;
  sent.set_text("caf\xC3\xA9");
  ASSERT_TRUE(SerializeResponse(sent, &wire).ok());
  // field 1, length 5, then the text
  EXPECT_EQ(BytesOf(wire), std::string("\x0A\x05" "caf\xC3\xA9"));
}

}  // namespace
}  // namespace decoded::server
