// Utf8LeadOf and FindInvalidUtf8 against the UTF-8 definition written as
// data (Table 3-7, tests/common/utf8_cases.h): exhaustively over short
// strings, and by name on hand-picked cases.
#include "engine/utf8_validation.h"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "gtest/gtest.h"
#include "tests/common/utf8_cases.h"

namespace decoded {
namespace {

using testing::ReferenceWellFormedPrefix;

// The offset FindInvalidUtf8 reports, or the length when it finds nothing.
size_t CheckerPrefix(std::string_view s) {
  std::optional<Utf8Error> error = FindInvalidUtf8(s);
  return error ? error->offset : s.size();
}

// Utf8LeadOf is the rule the validator and the tokenizer's repair share:
// each byte's sequence length and second-byte range must be Table 3-7's.
TEST(Utf8ValidationTest, LeadOfEveryByteIsTheTablesRow) {
  for (int b = 0; b < 256; ++b) {
    const Utf8Lead lead = Utf8LeadOf(static_cast<uint8_t>(b));
    int rows = 0;
    int lo = 256, hi = -1;  // union of the second-byte ranges of the rows b starts
    for (const testing::Table37Row& row : testing::kTable37) {
      if (b < row.bytes[0].lo || b > row.bytes[0].hi) continue;
      ++rows;
      EXPECT_EQ(lead.length, row.length) << std::hex << b;
      if (row.length >= 2) {
        lo = std::min<int>(lo, row.bytes[1].lo);
        hi = std::max<int>(hi, row.bytes[1].hi);
      }
    }
    if (rows == 0) {
      EXPECT_EQ(lead.length, 0) << std::hex << b;
    }
    if (lead.length >= 2) {
      EXPECT_EQ(lead.second_lo, lo) << std::hex << b;
      EXPECT_EQ(lead.second_hi, hi) << std::hex << b;
    }
  }
}

TEST(Utf8ValidationTest, AgreesWithTheTableOnEveryOneAndTwoByteString) {
  char b[2];
  for (int x = 0; x < 256; ++x) {
    b[0] = static_cast<char>(x);
    ASSERT_EQ(CheckerPrefix({b, 1}), ReferenceWellFormedPrefix({b, 1})) << std::hex << x;
    for (int y = 0; y < 256; ++y) {
      b[1] = static_cast<char>(y);
      ASSERT_EQ(CheckerPrefix({b, 2}), ReferenceWellFormedPrefix({b, 2})) << std::hex << x << " " << y;
    }
  }
}

// Strings starting with an ASCII or continuation byte reduce to the two-byte
// case above, so the three-byte sweep starts at the first lead byte.
TEST(Utf8ValidationTest, AgreesWithTheTableOnEveryThreeByteStringStartingWithALeadByte) {
  char b[3];
  for (int x = 0xC0; x < 256; ++x) {
    b[0] = static_cast<char>(x);
    for (int y = 0; y < 256; ++y) {
      b[1] = static_cast<char>(y);
      for (int z = 0; z < 256; ++z) {
        b[2] = static_cast<char>(z);
        ASSERT_EQ(CheckerPrefix({b, 3}), ReferenceWellFormedPrefix({b, 3}))
            << std::hex << x << " " << y << " " << z;
      }
    }
  }
}

// Four-byte leads with every second byte, and the continuation-range edges
// (and one byte past each) as third and fourth bytes.
TEST(Utf8ValidationTest, AgreesWithTheTableOnFourByteSequences) {
  const int edges[] = {0x7F, 0x80, 0xBF, 0xC0};
  char b[4];
  for (int x = 0xF0; x < 256; ++x) {
    b[0] = static_cast<char>(x);
    for (int y = 0; y < 256; ++y) {
      b[1] = static_cast<char>(y);
      for (int z : edges) {
        b[2] = static_cast<char>(z);
        for (int w : edges) {
          b[3] = static_cast<char>(w);
          ASSERT_EQ(CheckerPrefix({b, 4}), ReferenceWellFormedPrefix({b, 4}))
              << std::hex << x << " " << y << " " << z << " " << w;
        }
      }
    }
  }
}

TEST(Utf8ValidationTest, NamesTheOffsetAndTheDefectOfEachIllFormedCase) {
  for (const testing::IllFormedUtf8Case& c : testing::IllFormedUtf8Cases()) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(ReferenceWellFormedPrefix(c.bytes), c.offset) << "the case table disagrees with Table 3-7";
    std::optional<Utf8Error> error = FindInvalidUtf8(c.bytes);
    ASSERT_TRUE(error.has_value());
    EXPECT_EQ(error->offset, c.offset);
    EXPECT_EQ(error->defect, c.defect);
  }
}

TEST(Utf8ValidationTest, AcceptsWellFormedText) {
  for (const std::string& s : testing::WellFormedUtf8Cases()) {
    ASSERT_EQ(ReferenceWellFormedPrefix(s), s.size()) << "the case table disagrees with Table 3-7";
    EXPECT_FALSE(FindInvalidUtf8(s).has_value()) << s;
  }
}

}  // namespace
}  // namespace decoded
