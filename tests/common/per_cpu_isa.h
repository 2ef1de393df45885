// Value-parameterized tests run once per kernel tier (engine/cpu_isa.h): each
// test switches the process to its tier with SetActiveCpuIsa, so one binary
// checks every tier this CPU supports. A tier the CPU lacks is reported as
// skipped, naming it, rather than silently passing.
//
//   class MyKernelTest : public decoded::testing::PerCpuIsaTest {};
//   TEST_P(MyKernelTest, ...) { ... }
//   DECODED_INSTANTIATE_PER_CPU_ISA(MyKernelTest);
#ifndef DECODED_TESTS_COMMON_PER_CPU_ISA_H_
#define DECODED_TESTS_COMMON_PER_CPU_ISA_H_

#include "engine/cpu_isa.h"
#include "gtest/gtest.h"

namespace decoded::testing {

class PerCpuIsaTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam())) GTEST_SKIP() << "this CPU cannot run the " << CpuIsaName(GetParam()) << " tier";
    saved_ = ActiveCpuIsa();
    ASSERT_TRUE(SetActiveCpuIsa(GetParam()).ok());
    ASSERT_EQ(ActiveCpuIsa(), GetParam());
  }
  void TearDown() override {
    if (CpuSupports(GetParam())) {
      EXPECT_TRUE(SetActiveCpuIsa(saved_).ok());
    }
  }

 private:
  CpuIsa saved_ = CpuIsa::kScalar;
};

inline std::string CpuIsaParamName(const ::testing::TestParamInfo<CpuIsa>& info) { return CpuIsaName(info.param); }

}  // namespace decoded::testing

#define DECODED_INSTANTIATE_PER_CPU_ISA(suite)                                       \
  INSTANTIATE_TEST_SUITE_P(Isa, suite, ::testing::ValuesIn(::decoded::kCpuIsas), \
                           ::decoded::testing::CpuIsaParamName)

#endif  // DECODED_TESTS_COMMON_PER_CPU_ISA_H_
