#include "memory/size.h"

#include <gtest/gtest.h>

#include <limits>

#include "memory/error.h"

namespace memfit {
namespace {

TEST(ParseSize, PlainNumbersAreBytes) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("  17 "), 17u);
  EXPECT_EQ(parse_size("18446744073709551615"), std::numeric_limits<std::size_t>::max());
}

TEST(ParseSize, BinaryAndDecimalUnits) {
  EXPECT_EQ(parse_size("1KiB"), 1024u);
  EXPECT_EQ(parse_size("512MiB"), 512u * 1024 * 1024);
  EXPECT_EQ(parse_size("24GiB"), 24ull << 30);
  EXPECT_EQ(parse_size("24gib"), 24ull << 30);
  EXPECT_EQ(parse_size("2 TiB"), 2ull << 40);
  EXPECT_EQ(parse_size("1G"), 1ull << 30);
  EXPECT_EQ(parse_size("1GB"), 1000000000u);
  EXPECT_EQ(parse_size("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_size("1.5KiB"), 1536u);
  EXPECT_EQ(parse_size("3B"), 3u);
}

TEST(ParseSize, BadInputNamesTextAndUnits) {
  for (const char* bad : {"", "GiB", "-1", "12XB", "1.2.3", "abc", "1e9"}) {
    try {
      parse_size(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("GiB"), std::string::npos) << msg;
    }
  }
}

TEST(ParseSize, OverflowIsAnError) {
  EXPECT_THROW(parse_size("18446744073709551616"), InvalidArgument);
  EXPECT_THROW(parse_size("20000000TiB"), InvalidArgument);
}

TEST(FormatBytes, PicksLargestUnit) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3u << 20), "3.00 MiB");
  EXPECT_EQ(format_bytes(24ull << 30), "24.00 GiB");
}

TEST(CheckedArithmetic, ThrowsOnOverflow) {
  EXPECT_EQ(checked_mul(1u << 20, 1u << 20), 1ull << 40);
  EXPECT_EQ(checked_add(5, 7), 12u);
  const std::size_t big = std::numeric_limits<std::size_t>::max() / 2 + 1;
  EXPECT_THROW(checked_mul(big, 2, "tensor bytes"), InvalidArgument);
  EXPECT_THROW(checked_add(big, big), InvalidArgument);
  try {
    checked_mul(big, 4, "tensor bytes");
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tensor bytes"), std::string::npos);
  }
}

}  // namespace
}  // namespace memfit
