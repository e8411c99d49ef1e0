// shown(): what memfit prints from files and flags cannot drive the terminal.
#include "cli/terminal_text.h"

#include <gtest/gtest.h>

#include <string>

namespace memfit::cli {
namespace {

TEST(TerminalText, EscapesControlCharactersAndKeepsText) {
  EXPECT_EQ(shown("gpt2 model, 124M"), "gpt2 model, 124M");
  EXPECT_EQ(shown("two\nlines\tand a tab"), "two\nlines\tand a tab");
  EXPECT_EQ(shown("caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80");
  EXPECT_EQ(shown("x\x1b[2Jy"), "x\\x1b[2Jy");                 // clear screen
  EXPECT_EQ(shown("\x1b]0;title\x07"), "\\x1b]0;title\\x07");  // window title, BEL
  EXPECT_EQ(shown("a\rb"), "a\\x0db");
  EXPECT_EQ(shown(std::string("nul\0here", 8)), "nul\\x00here");
  EXPECT_EQ(shown("del\x7f"), "del\\x7f");
  EXPECT_EQ(shown("csi\xc2\x9b"
                  "31m"),
            "csi\\u009b31m");                           // C1 CSI, as UTF-8
  EXPECT_EQ(shown("raw\x9b"), "raw\\x9b");              // C1 CSI as a raw byte: not UTF-8
  EXPECT_EQ(shown("bad\xc3"), "bad\\xc3");              // truncated sequence
  EXPECT_EQ(shown("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(shown("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
}

TEST(TerminalText, EveryByteAloneComesOutAsPrintableAscii) {
  // Alone, no byte >= 0x80 is UTF-8: every one of the 256 prints as ASCII text.
  for (int b = 0; b < 256; ++b) {
    const std::string out = shown(std::string(1, static_cast<char>(b)));
    for (unsigned char c : out) {
      EXPECT_TRUE(c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f))
          << "byte " << b << " printed as " << out;
    }
    const bool kept = b == '\n' || b == '\t' || (b >= 0x20 && b < 0x7f);
    EXPECT_EQ(out.size(), kept ? 1u : 4u) << "byte " << b;
  }
}

}  // namespace
}  // namespace memfit::cli
