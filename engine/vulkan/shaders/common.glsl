// Shared declarations of every decoded compute shader.
//
// No descriptor sets: every buffer is reached through its device address
// (VK_KHR_buffer_device_address), passed in the push constants. A recorded
// command buffer therefore names only addresses that stay valid for the
// plan's life; per-token data changes the bytes behind them, never the
// recording. Layouts are scalar (C-like packing), so the push-constant
// structs in engine/vulkan/kernels.h mirror these blocks member for member.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_scalar_block_layout : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require

layout(buffer_reference, scalar, buffer_reference_align = 4) buffer F32Buf { float v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer I32Buf { int v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer U32Buf { uint v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 8) buffer I64Buf { int64_t v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 1) buffer U8Buf { uint8_t v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 2) buffer U16Buf { uint16_t v[]; };

// Work items are spread over a 2-D grid of workgroups (at most 65535 per
// dimension): the linear workgroup index.
uint linear_group() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

float f32_at(uint64_t base, uint i) { return F32Buf(base).v[i]; }
