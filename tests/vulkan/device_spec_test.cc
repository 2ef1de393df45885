// --device spellings (engine/device_spec.h): what opens, and the precise
// status of what does not.
#include "engine/device_spec.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/common/test_backend.h"

namespace decoded {
namespace {

TEST(DeviceSpecTest, CpuIsTheProcessWideCpuBackend) {
  absl::StatusOr<std::shared_ptr<Backend>> b = OpenBackend("cpu");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->get(), &CpuBackend());
  EXPECT_EQ((*b)->name(), "cpu");
  EXPECT_EQ((*b)->memory_capacity_bytes(), 0);
}

TEST(DeviceSpecTest, OtherSpellingsAreInvalidAndListWhatIsAccepted) {
  for (const char* spec : {"cuda", "gpu", "Vulkan", "vulkan:", "vulkan:x", "vulkan:-1", "vulkan:1x", "vulkan0", "",
                           "vulkan:01", "vulkan:00", "vulkan:+1", " vulkan", "vulkan:0 "}) {
    absl::StatusOr<std::shared_ptr<Backend>> b = OpenBackend(spec);
    ASSERT_FALSE(b.ok()) << spec;
    EXPECT_TRUE(absl::IsInvalidArgument(b.status())) << spec << ": " << b.status();
    EXPECT_NE(b.status().message().find("cpu, vulkan, vulkan:N"), std::string::npos) << b.status();
  }
}

TEST(DeviceSpecTest, AVulkanDevicePastTheMachinesIsNotFoundNamingThoseThereAre) {
  DECODED_TEST_BACKEND_OR_SKIP(first, "vulkan");
  absl::StatusOr<std::shared_ptr<Backend>> b = OpenBackend("vulkan:7");
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(absl::IsNotFound(b.status())) << b.status();
  EXPECT_NE(b.status().message().find("vulkan:0 " + first->device_name()), std::string::npos) << b.status();
}

TEST(DeviceSpecTest, AnIndexPastIntIsNotFoundAsItIsSpelled) {
  absl::StatusOr<std::shared_ptr<Backend>> b = OpenBackend("vulkan:99999999999");
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(absl::IsNotFound(b.status())) << b.status();
  EXPECT_NE(b.status().message().find("no Vulkan device 99999999999"), std::string::npos) << b.status();
}

TEST(DeviceSpecTest, BackendsOnOneDeviceAreDistinctButShareIt) {
  DECODED_TEST_BACKEND_OR_SKIP(a, "vulkan");
  DECODED_TEST_BACKEND_OR_SKIP(b, "vulkan");
  EXPECT_NE(a.get(), b.get()) << "a backend holds one model's weights";
  EXPECT_EQ(a->device_name(), b->device_name());
  // One VkDevice: a buffer of one backend counts in the other's gauge too.
  const int64_t before = b->allocated_bytes();
  auto buffer = a->Allocate(1 << 20);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(b->allocated_bytes() - before, 1 << 20);
}

}  // namespace
}  // namespace decoded
