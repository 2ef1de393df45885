#version 460
// Strided copies of column ranges, one invocation per copied element:
// for r < rows, g < groups, c < count:
//   out[r * dst_row + g * dst_group + dst_off + c] = x[r * src_row + g * src_group + src_off + c]
// take_last_row, head_slice and each half of head_concat are instances.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant, scalar) uniform Params {
  uint64_t x, out_;
  uint rows, groups, count;
  uint src_row, src_group, src_off;
  uint dst_row, dst_group, dst_off;
} p;

void main() {
  const uint i = linear_group() * 256 + gl_LocalInvocationID.x;
  if (i >= p.rows * p.groups * p.count) return;
  const uint c = i % p.count;
  const uint g = (i / p.count) % p.groups;
  const uint r = i / (p.count * p.groups);
  F32Buf(p.out_).v[r * p.dst_row + g * p.dst_group + p.dst_off + c] =
      F32Buf(p.x).v[r * p.src_row + g * p.src_group + p.src_off + c];
}
