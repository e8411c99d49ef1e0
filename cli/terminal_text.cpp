#include "cli/terminal_text.h"

#include <cstdarg>
#include <cstdint>
#include <cstdio>

namespace memfit::cli {

namespace {

void vsay(std::FILE* out, const char* format, std::va_list args) {
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  if (n > 0) {
    std::string text(static_cast<std::size_t>(n) + 1, '\0');
    std::vsnprintf(text.data(), text.size(), format, again);
    text.pop_back();
    std::fputs(shown(text).c_str(), out);
  }
  va_end(again);
}

void escape(std::string& out, const char* fmt, unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, fmt, v);
  out += buf;
}

// The length of the UTF-8 sequence at s[i] and its code point; 0 when it is not valid UTF-8
// (a stray continuation byte, a truncated or overlong sequence, a surrogate, past U+10FFFF).
std::size_t utf8_at(std::string_view s, std::size_t i, std::uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  std::size_t n;
  std::uint32_t v;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    n = 2, v = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, v = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, v = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

}  // namespace

std::string shown(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    std::uint32_t cp = 0;
    const std::size_t n = utf8_at(text, i, &cp);
    if (n == 0) {
      escape(out, "\\x%02x", static_cast<unsigned char>(text[i]));
      i += 1;
    } else if ((cp < 0x20 && cp != '\n' && cp != '\t') || cp == 0x7F) {
      escape(out, "\\x%02x", cp);
      i += 1;
    } else if (cp >= 0x80 && cp <= 0x9F) {
      escape(out, "\\u%04x", cp);
      i += n;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

namespace {
bool g_muted = false;  // one process, one command: set once before the command prints
}  // namespace

void set_say_muted(bool muted) { g_muted = muted; }
bool say_muted() { return g_muted; }

void say(const char* format, ...) {
  if (g_muted) return;
  std::va_list args;
  va_start(args, format);
  vsay(stdout, format, args);
  va_end(args);
}

void say_to(std::FILE* out, const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  vsay(out, format, args);
  va_end(args);
}

}  // namespace memfit::cli
