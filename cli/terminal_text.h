// Text from files and flags, made safe to print on a terminal.
//
//   std::printf("model %s\n", shown(spec.name).c_str());   // "gpt\x1b[2J" prints as gpt\x1b[2J
//
// shown() keeps printable text, UTF-8 included, and line breaks and tabs (messages span lines),
// and writes every other control character as an escape a person can read: C0 controls and DEL
// as \xNN, C1 controls (U+0080..U+009F, which some terminals obey as escapes) as \u00NN, and
// bytes that are not UTF-8 as \xNN. So a model name, a plan's `why` or a YAML value cannot
// move the cursor, clear the screen, set the window title or hide text. Everything memfit
// prints that came from a file, a flag or an error message goes through it: the commands print
// with say() / say_to(), printf's formats whose whole output passes through shown().
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace memfit::cli {

std::string shown(std::string_view text);

// say() prints to stdout unless muted: the ranks of a multi-rank run other than rank 0 are
// (set_say_muted(true)), so a run prints one report. say_to() always prints (errors).
void say(const char* format, ...) __attribute__((format(printf, 1, 2)));
void set_say_muted(bool muted);
bool say_muted();
void say_to(std::FILE* out, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace memfit::cli
