#include "core/yaml_document.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace memfit {

namespace {

[[noreturn]] void refuse(std::size_t pos, int line, int column, const std::string& msg) {
  YAML::Mark m;
  m.pos = static_cast<int>(pos);
  m.line = line;
  m.column = column;
  throw YAML::ParserException(m, msg);
}

bool space(char c) { return c == ' ' || c == '\t'; }

// One pass over the text: the deepest nesting of block levels (indentation and "- " entries)
// plus open flow brackets, refused past kMaxYamlDepth at the line and column that pass it.
// Conservative where YAML is subtle: it may count a level too few (yaml-cpp's own guard is then
// the backstop), never one too many for text memfit writes or documents.
void check_nesting(std::string_view text) {
  std::vector<std::size_t> block;  // indentation columns of the open block levels
  int flow = 0;                    // open [ and {
  char quote = 0;                  // inside a quoted scalar ('"' or '\''), across lines
  std::size_t scalar_parent = std::string_view::npos;  // inside a block scalar: its key's indent
  int line_no = 0;
  const auto too_deep = [&](std::size_t pos, std::size_t col) {
    refuse(pos, line_no, static_cast<int>(col),
           "nested deeper than " + std::to_string(kMaxYamlDepth) +
               " levels (maps, lists, [ ] and { }); valid: at most " +
               std::to_string(kMaxYamlDepth) + " (memfit's files nest 4 deep)");
  };
  for (std::size_t at = 0; at < text.size(); ++line_no) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view l = text.substr(at, end - at);
    const std::size_t base = at;
    at = end + 1;
    std::size_t indent = 0;
    while (indent < l.size() && l[indent] == ' ') ++indent;
    const bool blank = indent == l.size() || l[indent] == '\r' || l[indent] == '#';
    if (scalar_parent != std::string_view::npos) {
      if (blank || indent > scalar_parent) continue;  // the block scalar's text
      scalar_parent = std::string_view::npos;
    }
    std::size_t i = indent;
    if (quote == 0 && flow == 0) {
      if (blank) continue;
      while (!block.empty() && block.back() >= indent) block.pop_back();
      block.push_back(indent);
      // "- - x": each entry indicator opens a level at the column after it.
      while (i < l.size() && l[i] == '-' && (i + 1 == l.size() || space(l[i + 1]))) {
        ++i;
        while (i < l.size() && space(l[i])) ++i;
        block.push_back(i);
      }
      if (block.size() > static_cast<std::size_t>(kMaxYamlDepth)) too_deep(base + i, i);
    }
    const std::size_t key_indent = indent;
    char prev = ' ';  // the character before i, as a scalar start sees it
    for (; i < l.size(); prev = l[i], ++i) {
      const char c = l[i];
      if (quote == '"') {
        if (c == '\\') {
          if (i + 1 < l.size()) ++i;  // the escaped character
        } else if (c == '"') {
          quote = 0;
        }
        continue;
      }
      if (quote == '\'') {
        if (c == '\'' && i + 1 < l.size() && l[i + 1] == '\'') {
          ++i;
        } else if (c == '\'') {
          quote = 0;
        }
        continue;
      }
      // Where a scalar or a collection may start: after a space; in flow context also right
      // after [ { , : ("[[x]]"). In block context "a[[b" is one plain scalar.
      const bool starts =
          space(prev) || (flow > 0 && (prev == '[' || prev == '{' || prev == ',' || prev == ':'));
      if (c == '#' && space(prev)) break;  // a comment
      if (!starts && flow == 0) continue;  // inside a plain scalar: [ { ' " are text
      if (c == '"' || c == '\'') {
        if (starts) quote = c;
      } else if (c == '[' || c == '{') {
        if (!starts && flow == 0) continue;
        ++flow;
        if (block.size() + static_cast<std::size_t>(flow) >
            static_cast<std::size_t>(kMaxYamlDepth)) {
          too_deep(base + i, i);
        }
      } else if ((c == ']' || c == '}') && flow > 0) {
        --flow;
      } else if ((c == '|' || c == '>') && flow == 0 && starts) {
        // A block scalar when only its indicators (+ - digits) and a comment follow.
        std::size_t k = i + 1;
        while (k < l.size() && (l[k] == '+' || l[k] == '-' || (l[k] >= '0' && l[k] <= '9'))) ++k;
        while (k < l.size() && (space(l[k]) || l[k] == '\r')) ++k;
        if (k == l.size() || l[k] == '#') {
          scalar_parent = key_indent;
          break;
        }
      }
    }
  }
}

// YAML is Unicode; yaml-cpp passes other bytes through into scalars, where they reach JSON
// writers (plans, summaries) that throw on them. Refused at the first bad byte.
void check_utf8(std::string_view t) {
  int line = 0;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < t.size();) {
    const auto b = static_cast<unsigned char>(t[i]);
    if (b == '\n') {
      ++line;
      line_start = i + 1;
    }
    std::size_t n = 0;  // continuation bytes
    std::uint32_t cp = 0;
    if (b < 0x80) {
      n = 0;
    } else if (b >= 0xc2 && b <= 0xdf) {
      n = 1, cp = b & 0x1f;
    } else if (b >= 0xe0 && b <= 0xef) {
      n = 2, cp = b & 0x0f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      n = 3, cp = b & 0x07;
    } else {
      n = SIZE_MAX;
    }
    bool ok = n != SIZE_MAX && i + n < t.size();
    for (std::size_t k = 1; ok && k <= n; ++k) {
      const auto c = static_cast<unsigned char>(t[i + k]);
      ok = (c & 0xc0) == 0x80;
      cp = (cp << 6) | (c & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    if (ok && ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
               (cp >= 0xd800 && cp <= 0xdfff))) {
      ok = false;
    }
    if (!ok) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", b);
      refuse(i, line, static_cast<int>(i - line_start),
             std::string("byte ") + hex + " is not UTF-8; valid: UTF-8 text (YAML is Unicode)");
    }
    i += n + 1;
  }
}

// Records where each document starts and where its root node is; the parser's other events
// are not needed here.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> marks;  // document starts
  std::vector<YAML::Mark> roots;  // root nodes (one per document that has one)
  void node(const YAML::Mark& m) {
    if (roots.size() < marks.size()) roots.push_back(m);
  }
  void OnDocumentStart(const YAML::Mark& m) override {
    if (roots.size() < marks.size()) roots.push_back(m);  // none: keep the indices aligned
    marks.push_back(m);
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(m);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnMapEnd() override {}
};

}  // namespace

YamlDocument load_yaml_document(std::string_view text) {
  if (text.size() > kMaxYamlBytes) {
    refuse(0, 0, 0,
           std::to_string(text.size()) + " bytes, over the limit of " +
               std::to_string(kMaxYamlBytes >> 20) + " MiB for a YAML config; valid: at most that");
  }
  check_utf8(text);
  check_nesting(text);
  const std::string owned(text);
  YamlDocument d;
  try {
    d.root = YAML::Load(owned);
    // Where the documents start. Not YAML::LoadAll: yaml-cpp 0.7's loops forever on a token it
    // cannot start a node with (a ',' in block context: yaml-cpp PR 1319), its parser handing
    // back the same "document" at the same place each time. Three looks tell a second document
    // from that: the stuck one starts where the one before it did.
    std::istringstream in(owned);
    YAML::Parser parser(in);
    DocumentStarts starts;
    for (int k = 0; k < 3 && parser.HandleNextDocument(starts);) {
      ++k;
      const std::size_t n = starts.marks.size();
      if (n >= 2 && starts.marks[n - 1].pos == starts.marks[n - 2].pos) {
        const YAML::Mark& m = starts.marks[n - 1];
        const char c = static_cast<std::size_t>(m.pos) < text.size() ? text[m.pos] : ' ';
        throw YAML::ParserException(m, std::string("unexpected '") + c + "'");
      }
    }
    if (starts.marks.size() > 1) {
      d.more = true;  // at its root node, as YAML::LoadAll's Mark() gave it
      d.second = starts.roots.size() > 1 ? starts.roots[1] : starts.marks[1];
    }
  } catch (const YAML::DeepRecursion& e) {  // the pre-scan's backstop
    throw YAML::ParserException(e.mark,
                                "nested deeper than yaml-cpp's limit of 2000 levels; "
                                "valid: at most " +
                                    std::to_string(kMaxYamlDepth));
  }
  return d;
}

}  // namespace memfit
