// grpc::ByteBuffer <-> std::string for tests that speak raw wire bytes.
#ifndef DECODED_TESTS_COMMON_GRPC_BYTES_H_
#define DECODED_TESTS_COMMON_GRPC_BYTES_H_

#include <string>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"

namespace decoded::testing {

// The bytes of `buffer`, its slices concatenated.
inline std::string BytesOf(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes;
}

// A one-slice buffer holding a copy of `bytes`.
inline grpc::ByteBuffer BufferOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_GRPC_BYTES_H_
