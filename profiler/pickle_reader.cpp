// The safe pickle reader (profiler/pickle.h).
//
// Two passes. The first runs the opcodes on a stack of node indices into an arena, so memo
// entries and DUP share nodes the way Python shares objects (a list fetched from the memo and
// appended to later is one list), and nothing recurses: a deeply nested file costs no C++
// stack. Then, once the file is whole, the walk bound is measured (each node once, memoized:
// what a tree walk below it would visit, and how deep its containers nest, refusing a node
// that contains itself), and the root node becomes a PickleValue, each node converted once
// and shared by every place it appears. Opcode semantics follow CPython's Lib/pickle.py
// (_Unpickler.load_*); only the data-building ones exist here.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/error.h"
#include "profiler/pickle.h"
#include "profiler/read_file.h"

namespace memfit {

namespace {

using Kind = PickleValue::Kind;

struct Node {
  Kind kind = Kind::kNone;
  bool b = false;
  std::int64_t i = 0;
  double d = 0;
  std::string s;
  std::vector<std::uint32_t> kids;  // list/tuple items; dict: key, value, key, value, ...
  std::size_t at = 0;               // the byte offset of the opcode that made it
};

std::string hex_byte(std::uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

// Latin-1 bytes (protocol 0/1 py2 strings, raw-unicode-escape's plain bytes) to UTF-8.
void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::string latin1_to_utf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (char c : in) append_utf8(out, static_cast<std::uint8_t>(c));
  return out;
}

class Reader {
 public:
  Reader(std::string_view data, std::string_view source, const PickleLimits& limits)
      : data_(data), source_(source), limits_(limits) {}

  PickleValue run(PickleReadStats* stats) {
    const std::uint32_t root = execute();
    on_path_.assign(nodes_.size(), 0);
    expanded_.assign(nodes_.size(), Size{});
    const auto scaled = [&](std::size_t per_byte, std::size_t floor) {
      const std::size_t n = data_.size() > SIZE_MAX / per_byte ? SIZE_MAX : data_.size() * per_byte;
      return std::max(floor, n);
    };
    max_places_ = scaled(limits_.elements_per_byte, limits_.min_elements);
    max_walk_bytes_ = scaled(limits_.string_bytes_per_byte, limits_.min_string_bytes);
    const Size whole = measure(root);  // refuses a result over the walk bound or max_depth
    converted_.assign(nodes_.size(), PickleValue());
    done_.assign(nodes_.size(), 0);
    PickleValue out = convert(root);
    if (stats != nullptr) {
      stats->input_bytes = data_.size();
      stats->distinct_values = nodes_.size();
      stats->places = static_cast<std::size_t>(whole.values);
      stats->walk_string_bytes = static_cast<std::size_t>(whole.bytes);
    }
    return out;
  }

 private:
  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    throw InvalidArgument(std::string(source_) + ": byte " + std::to_string(at) + ": " + what);
  }

  // ---- input ----
  std::string_view take(std::size_t n) {
    if (n > data_.size() - pos_) {
      fail(op_at_, std::string("truncated: ") + op_name_ + " needs " + std::to_string(n) +
                       " more bytes, the input ends at byte " + std::to_string(data_.size()));
    }
    std::string_view r = data_.substr(pos_, n);
    pos_ += n;
    return r;
  }
  std::uint64_t le(std::size_t n) {
    std::string_view b = take(n);
    std::uint64_t x = 0;
    for (std::size_t k = 0; k < n; ++k) x |= std::uint64_t(std::uint8_t(b[k])) << (8 * k);
    return x;
  }
  std::string_view line() {  // protocol 0 argument: up to '\n', which is consumed
    const std::size_t nl = data_.find('\n', pos_);
    if (nl == std::string_view::npos) {
      fail(op_at_, std::string("truncated: ") + op_name_ + " has no end of line before byte " +
                       std::to_string(data_.size()));
    }
    std::string_view r = data_.substr(pos_, nl - pos_);
    if (r.size() > limits_.max_string_bytes) too_long(r.size());
    pos_ = nl + 1;
    return r;
  }
  std::size_t length(std::uint64_t n) {
    if (n > limits_.max_string_bytes) too_long(n);
    return static_cast<std::size_t>(n);
  }
  [[noreturn]] void too_long(std::uint64_t n) const {
    fail(op_at_, std::string(op_name_) + " of " + std::to_string(n) +
                     " bytes is over the limit of " + std::to_string(limits_.max_string_bytes));
  }

  // ---- nodes and stack ----
  std::uint32_t make(Kind k) {
    if (nodes_.size() >= limits_.max_elements) {
      fail(op_at_,
           "more than " + std::to_string(limits_.max_elements) + " values: over the element limit");
    }
    nodes_.emplace_back();
    nodes_.back().kind = k;
    nodes_.back().at = op_at_;
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }
  void push(std::uint32_t n) {
    if (stack_.size() >= limits_.max_stack) {
      fail(op_at_, "more than " + std::to_string(limits_.max_stack) + " values on the stack");
    }
    stack_.push_back(n);
  }
  std::uint32_t pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) {
      fail(op_at_, std::string(op_name_) + " on an empty stack: not a valid pickle");
    }
    const std::uint32_t n = stack_.back();
    stack_.pop_back();
    return n;
  }
  std::uint32_t top() {
    const std::uint32_t n = pop();
    stack_.push_back(n);
    return n;
  }
  // Pops everything above the innermost MARK and the mark itself.
  std::vector<std::uint32_t> pop_mark() {
    if (marks_.empty()) fail(op_at_, std::string(op_name_) + " without a MARK: not a valid pickle");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<std::uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  void push_int(std::int64_t v) {
    const std::uint32_t n = make(Kind::kInt);
    nodes_[n].i = v;
    push(n);
  }
  void push_string(Kind k, std::string s) {
    const std::uint32_t n = make(k);
    nodes_[n].s = std::move(s);
    push(n);
  }
  void push_container(Kind k, std::vector<std::uint32_t> kids = {}) {
    const std::uint32_t n = make(k);
    nodes_[n].kids = std::move(kids);
    push(n);
  }
  Node& container(std::uint32_t n, Kind want) {
    if (nodes_[n].kind != want) {
      fail(op_at_, std::string(op_name_) + " applied to a " + pickle_kind_name(nodes_[n].kind) +
                       ", not a " + pickle_kind_name(want) + ": memfit reads plain data only");
    }
    return nodes_[n];
  }
  void add_items(std::uint32_t target, Kind want, const std::vector<std::uint32_t>& items) {
    if (want == Kind::kDict && items.size() % 2 != 0) {
      fail(op_at_, std::string(op_name_) + " with an odd number of items: not a valid pickle");
    }
    Node& c = container(target, want);
    c.kids.insert(c.kids.end(), items.begin(), items.end());
  }

  // ---- memo ----
  void put(std::uint64_t id) {
    if (stack_.empty()) fail(op_at_, std::string(op_name_) + " on an empty stack");
    if (id >= limits_.max_memo || (memo_.size() >= limits_.max_memo && !memo_.count(id))) {
      fail(op_at_, std::string(op_name_) + " " + std::to_string(id) + ": over the memo limit of " +
                       std::to_string(limits_.max_memo) + " entries");
    }
    memo_[id] = stack_.back();
  }
  void get(std::uint64_t id) {
    auto it = memo_.find(id);
    if (it == memo_.end()) {
      fail(op_at_, std::string(op_name_) + " " + std::to_string(id) +
                       ": no such memo entry: not a valid pickle");
    }
    push(it->second);
  }
  std::uint64_t decimal(std::string_view text) {
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || p != text.data() + text.size()) {
      fail(op_at_, std::string(op_name_) + " has a malformed argument");
    }
    return v;
  }

  // ---- protocol 0 text forms ----
  std::string quoted_string(std::string_view t) {  // STRING: a Python 2 str repr
    if (t.size() < 2 || (t.front() != '\'' && t.front() != '"') || t.back() != t.front()) {
      fail(op_at_, "STRING argument is not a quoted string");
    }
    t = t.substr(1, t.size() - 2);
    std::string raw;
    for (std::size_t k = 0; k < t.size(); ++k) {
      if (t[k] != '\\' || k + 1 == t.size()) {
        raw += t[k];
        continue;
      }
      const char e = t[++k];
      switch (e) {
        case 'n':
          raw += '\n';
          break;
        case 'r':
          raw += '\r';
          break;
        case 't':
          raw += '\t';
          break;
        case 'a':
          raw += '\a';
          break;
        case 'b':
          raw += '\b';
          break;
        case 'f':
          raw += '\f';
          break;
        case 'v':
          raw += '\v';
          break;
        case '\\':
        case '\'':
        case '"':
          raw += e;
          break;
        case '\n':
          break;
        case 'x': {
          unsigned v = 0;
          if (k + 2 >= t.size()) fail(op_at_, "STRING: bad \\x escape");
          auto [p, ec] = std::from_chars(t.data() + k + 1, t.data() + k + 3, v, 16);
          if (ec != std::errc() || p != t.data() + k + 3) fail(op_at_, "STRING: bad \\x escape");
          raw += static_cast<char>(v);
          k += 2;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            unsigned v = 0;
            std::size_t n = 0;
            while (n < 3 && k + n < t.size() && t[k + n] >= '0' && t[k + n] <= '7') {
              v = v * 8 + unsigned(t[k + n] - '0');
              ++n;
            }
            raw += static_cast<char>(v & 0xff);
            k += n - 1;
          } else {
            raw += '\\';
            raw += e;
          }
      }
    }
    return latin1_to_utf8(raw);
  }
  std::string raw_unicode_escape(std::string_view t) {  // UNICODE
    std::string out;
    for (std::size_t k = 0; k < t.size(); ++k) {
      if (t[k] == '\\' && k + 1 < t.size() && (t[k + 1] == 'u' || t[k + 1] == 'U')) {
        const std::size_t n = t[k + 1] == 'u' ? 4 : 8;
        std::uint32_t cp = 0;
        if (k + 2 + n > t.size()) fail(op_at_, "UNICODE: truncated \\u escape");
        auto [p, ec] = std::from_chars(t.data() + k + 2, t.data() + k + 2 + n, cp, 16);
        if (ec != std::errc() || p != t.data() + k + 2 + n || cp > 0x10ffff) {
          fail(op_at_, "UNICODE: bad \\u escape");
        }
        append_utf8(out, cp);
        k += 1 + n;
      } else {
        append_utf8(out, static_cast<std::uint8_t>(t[k]));
      }
    }
    return out;
  }

  // LONG1/LONG4: two's complement, little-endian; beyond int64 it stays bytes (kBigInt).
  void push_long(std::string_view b) {
    // The shortest form (as Python's encode_long), so equal ints read as equal bytes.
    while (b.size() > 1) {
      const auto last = std::uint8_t(b.back()), prev = std::uint8_t(b[b.size() - 2]);
      if (!((last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80)))) break;
      b.remove_suffix(1);
    }
    if (b.empty()) return push_int(0);
    const bool negative = (std::uint8_t(b.back()) & 0x80) != 0;
    for (std::size_t k = 8; k < b.size(); ++k) {
      if (std::uint8_t(b[k]) != (negative ? 0xff : 0x00))
        return push_string(Kind::kBigInt, std::string(b));
    }
    std::uint64_t x = negative ? ~std::uint64_t{0} : 0;
    const std::size_t n = std::min<std::size_t>(b.size(), 8);
    for (std::size_t k = 0; k < n; ++k) {
      x &= ~(std::uint64_t{0xff} << (8 * k));
      x |= std::uint64_t(std::uint8_t(b[k])) << (8 * k);
    }
    const std::int64_t v = static_cast<std::int64_t>(x);
    if (b.size() >= 8 && ((v < 0) != negative)) return push_string(Kind::kBigInt, std::string(b));
    push_int(v);
  }

  // Protocol 0's decimal text (INT, LONG): int64 when it fits, else its two's complement
  // bytes, made by schoolbook base conversion (bounded: the line is at most 1000 digits).
  void push_text_int(std::string_view t) {
    if (!t.empty() && t.back() == 'L') t.remove_suffix(1);
    if (!t.empty() && t.front() == '+') t.remove_prefix(1);
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec == std::errc() && p == t.data() + t.size() && !t.empty()) return push_int(v);
    const bool negative = !t.empty() && t.front() == '-';
    if (negative) t.remove_prefix(1);
    if (t.empty() || t.size() > 1000 ||
        t.find_first_not_of("0123456789") != std::string_view::npos) {
      fail(op_at_, std::string(op_name_) + " has a malformed integer");
    }
    std::vector<std::uint8_t> mag{0};  // little-endian magnitude
    for (char c : t) {
      unsigned carry = unsigned(c - '0');
      for (std::uint8_t& byte : mag) {
        const unsigned x = unsigned(byte) * 10 + carry;
        byte = std::uint8_t(x & 0xff);
        carry = x >> 8;
      }
      if (carry) mag.push_back(std::uint8_t(carry));
    }
    mag.push_back(0);  // room for the sign bit
    if (negative) {    // two's complement: invert and add one
      unsigned carry = 1;
      for (std::uint8_t& byte : mag) {
        const unsigned x = unsigned(std::uint8_t(~byte)) + carry;
        byte = std::uint8_t(x & 0xff);
        carry = x >> 8;
      }
    }
    push_long(std::string_view(reinterpret_cast<const char*>(mag.data()), mag.size()));
  }

  [[noreturn]] void refuse(std::uint8_t op) {
    const char* name = pickle_opcode_name(op);
    if (name == nullptr) {
      fail(op_at_, "unknown opcode " + hex_byte(op) +
                       ": not a pickle memfit can read (memfit reads plain data only)");
    }
    fail(op_at_, std::string("opcode ") + name + " (" + hex_byte(op) +
                     ") refused: memfit reads plain data only (None, bool, int, float, str, "
                     "bytes, list, tuple, dict, set); this pickle would import or call Python "
                     "code or objects, which memfit never does");
  }

  // What a walk of a node's subtree as a tree visits, saturating, and how many levels of
  // containers it nests; each node is measured once, so a memo "billion laughs" is refused in
  // time linear in the file.
  struct Size {
    std::uint64_t values = 0;  // 0: not measured yet
    std::uint64_t bytes = 0;
    std::size_t levels = 0;  // containers on the longest path down, this one included
  };
  static std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
  }
  Size measure(std::uint32_t root) {
    // An explicit stack: a node's kids are measured before it (no C++ recursion, so the
    // nesting is refused by the depth limit, not by the stack).
    struct Frame {
      std::uint32_t node;
      std::size_t next_kid;
    };
    std::vector<Frame> path{{root, 0}};
    on_path_[root] = 1;
    while (!path.empty()) {
      Frame& f = path.back();
      const Node& node = nodes_[f.node];
      if (f.next_kid < node.kids.size()) {
        const std::uint32_t kid = node.kids[f.next_kid++];
        if (expanded_[kid].values != 0) continue;
        if (on_path_[kid]) {
          fail(data_.size(), std::string("a ") + pickle_kind_name(nodes_[kid].kind) +
                                 " that contains itself: memfit reads tree-shaped data only");
        }
        if (nodes_[kid].kids.empty()) {  // a leaf: nothing below it to visit first
          finish(kid);
          continue;
        }
        if (path.size() >= limits_.max_depth) depth_error();
        on_path_[kid] = 1;
        path.push_back({kid, 0});
        continue;
      }
      finish(f.node);
      on_path_[f.node] = 0;
      path.pop_back();
    }
    return expanded_[root];
  }
  [[noreturn]] void depth_error() const {
    fail(data_.size(), "containers nested deeper than " + std::to_string(limits_.max_depth) +
                           " levels: over the depth limit");
  }
  // The node's figures from its (measured) kids; the first (innermost) value to pass a limit
  // is named, at the opcode that made it.
  void finish(std::uint32_t n) {
    const Node& node = nodes_[n];
    Size s{1, node.s.size(), 0};
    const bool container =
        node.kind == Kind::kList || node.kind == Kind::kTuple || node.kind == Kind::kDict;
    for (std::uint32_t kid : node.kids) {
      const Size& k = expanded_[kid];
      s.values = sat_add(s.values, k.values);
      s.bytes = sat_add(s.bytes, k.bytes);
      s.levels = std::max(s.levels, k.levels);
    }
    if (container && ++s.levels > limits_.max_depth) depth_error();
    if (s.values > max_places_) {
      fail(node.at, std::string("this ") + pickle_kind_name(node.kind) + " expands to more than " +
                        std::to_string(max_places_) +
                        " values (a walk of the result visits a shared value once per place it "
                        "appears): over the element limit for a " +
                        std::to_string(data_.size()) + "-byte pickle (" +
                        std::to_string(limits_.elements_per_byte) + " per input byte, at least " +
                        std::to_string(limits_.min_elements) + ")");
    }
    if (s.bytes > max_walk_bytes_) {
      fail(node.at, std::string("this ") + pickle_kind_name(node.kind) + " expands to more than " +
                        std::to_string(max_walk_bytes_) +
                        " bytes of strings (a walk of the result reads a shared value once per "
                        "place it appears): over the string-size limit for a " +
                        std::to_string(data_.size()) + "-byte pickle (" +
                        std::to_string(limits_.string_bytes_per_byte) +
                        " per input byte, at least " + std::to_string(limits_.min_string_bytes) +
                        ")");
    }
    expanded_[n] = s;
  }

  std::uint32_t execute();
  PickleValue convert(std::uint32_t n);

  std::string_view data_;
  std::string_view source_;
  const PickleLimits& limits_;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  const char* op_name_ = "";
  std::vector<Node> nodes_;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, std::uint32_t> memo_;
  std::vector<std::uint8_t> on_path_;
  std::vector<Size> expanded_;
  std::size_t max_places_ = 0;  // the walk bound for this input (run)
  std::size_t max_walk_bytes_ = 0;
  std::vector<PickleValue> converted_;  // each node's value, once built (shared after that)
  std::vector<std::uint8_t> done_;
};

// One case per opcode, kept one line each where it fits: the table reads like pickle.py's.
// clang-format off
std::uint32_t Reader::execute() {
  if (data_.empty()) fail(0, "empty input: not a pickle");
  while (true) {
    if (pos_ >= data_.size()) {
      fail(data_.size(), "the input ends without a STOP opcode (truncated?)");
    }
    op_at_ = pos_;
    const auto op = static_cast<std::uint8_t>(data_[pos_++]);
    op_name_ = pickle_opcode_name(op) ? pickle_opcode_name(op) : "?";
    switch (op) {
      case 0x80: {  // PROTO
        const auto v = le(1);
        if (v > 5) fail(op_at_, "protocol " + std::to_string(v) + " is newer than 5");
        break;
      }
      case 0x95: {  // FRAME: framing is transparent; the length must fit the input
        const auto n = le(8);
        if (n > data_.size() - pos_) {
          fail(op_at_, "truncated: FRAME of " + std::to_string(n) + " bytes, the input ends at byte " +
                           std::to_string(data_.size()));
        }
        break;
      }
      case '.':  // STOP
        if (stack_.empty()) fail(op_at_, "STOP on an empty stack: not a valid pickle");
        return stack_.back();
      case '(':
        if (marks_.size() >= limits_.max_stack) fail(op_at_, "too many MARKs");
        marks_.push_back(stack_.size());
        break;
      case '0':  // POP: an empty frame pops the mark, as CPython does
        if (!marks_.empty() && stack_.size() == marks_.back()) {
          marks_.pop_back();
        } else {
          pop();
        }
        break;
      case '1': pop_mark(); break;
      case '2': push(top()); break;
      case 'N': push(make(Kind::kNone)); break;
      case 0x88:
      case 0x89: {
        const std::uint32_t n = make(Kind::kBool);
        nodes_[n].b = op == 0x88;
        push(n);
        break;
      }
      case 'I': {  // "I01\n" / "I00\n" are protocol 0's True / False
        const std::string_view t = line();
        if (t == "01" || t == "00") {
          const std::uint32_t n = make(Kind::kBool);
          nodes_[n].b = t == "01";
          push(n);
        } else {
          push_text_int(t);
        }
        break;
      }
      case 'L': push_text_int(line()); break;
      case 'J': push_int(static_cast<std::int32_t>(static_cast<std::uint32_t>(le(4)))); break;
      case 'K': push_int(static_cast<std::int64_t>(le(1))); break;
      case 'M': push_int(static_cast<std::int64_t>(le(2))); break;
      case 0x8a: push_long(take(length(le(1)))); break;
      case 0x8b: {
        const auto n = static_cast<std::int32_t>(static_cast<std::uint32_t>(le(4)));
        if (n < 0) fail(op_at_, "LONG4 with a negative length");
        push_long(take(length(static_cast<std::uint64_t>(n))));
        break;
      }
      case 'F': {
        const std::string_view t = line();
        double v = 0;
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
        if (ec != std::errc() || p != t.data() + t.size()) fail(op_at_, "FLOAT has a malformed number");
        const std::uint32_t n = make(Kind::kFloat);
        nodes_[n].d = v;
        push(n);
        break;
      }
      case 'G': {
        std::string_view b = take(8);
        std::uint64_t x = 0;
        for (char c : b) x = (x << 8) | std::uint8_t(c);
        const std::uint32_t n = make(Kind::kFloat);
        std::memcpy(&nodes_[n].d, &x, sizeof x);
        push(n);
        break;
      }
      case 'S': push_string(Kind::kStr, quoted_string(line())); break;
      case 'V': push_string(Kind::kStr, raw_unicode_escape(line())); break;
      case 'T': {
        const auto n = static_cast<std::int32_t>(static_cast<std::uint32_t>(le(4)));
        if (n < 0) fail(op_at_, "BINSTRING with a negative length");
        push_string(Kind::kStr, latin1_to_utf8(take(length(static_cast<std::uint64_t>(n)))));
        break;
      }
      case 'U': push_string(Kind::kStr, latin1_to_utf8(take(length(le(1))))); break;
      case 0x8c: push_string(Kind::kStr, std::string(take(length(le(1))))); break;
      case 'X': push_string(Kind::kStr, std::string(take(length(le(4))))); break;
      case 0x8d: push_string(Kind::kStr, std::string(take(length(le(8))))); break;
      case 'C': push_string(Kind::kBytes, std::string(take(length(le(1))))); break;
      case 'B': push_string(Kind::kBytes, std::string(take(length(le(4))))); break;
      case 0x8e:
      case 0x96: push_string(Kind::kBytes, std::string(take(length(le(8))))); break;
      case ']': push_container(Kind::kList); break;
      case '}': push_container(Kind::kDict); break;
      case ')': push_container(Kind::kTuple); break;
      case 0x8f: push_container(Kind::kList); break;  // EMPTY_SET: sets read as lists
      case 'l':
      case 0x91: push_container(Kind::kList, pop_mark()); break;  // LIST, FROZENSET
      case 't': push_container(Kind::kTuple, pop_mark()); break;
      case 'd': {
        std::vector<std::uint32_t> kv = pop_mark();
        if (kv.size() % 2 != 0) fail(op_at_, "DICT with an odd number of items");
        push_container(Kind::kDict, std::move(kv));
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {
        std::vector<std::uint32_t> kids(op - 0x84);
        for (std::size_t k = kids.size(); k-- > 0;) kids[k] = pop();
        push_container(Kind::kTuple, std::move(kids));
        break;
      }
      case 'a': {
        const std::uint32_t v = pop();
        add_items(top(), Kind::kList, {v});
        break;
      }
      case 'e':
      case 0x90: {  // APPENDS, ADDITEMS
        std::vector<std::uint32_t> items = pop_mark();
        add_items(top(), Kind::kList, items);
        break;
      }
      case 's': {
        const std::uint32_t v = pop();
        const std::uint32_t k = pop();
        add_items(top(), Kind::kDict, {k, v});
        break;
      }
      case 'u': {
        std::vector<std::uint32_t> items = pop_mark();
        add_items(top(), Kind::kDict, items);
        break;
      }
      case 'p': put(decimal(line())); break;
      case 'q': put(le(1)); break;
      case 'r': put(le(4)); break;
      case 0x94: put(memo_.size()); break;
      case 'g': get(decimal(line())); break;
      case 'h': get(le(1)); break;
      case 'j': get(le(4)); break;
      default: refuse(op);
    }
  }
}

// clang-format on

// Recursion is bounded by max_depth (measure() refused deeper nesting, and cycles).
PickleValue Reader::convert(std::uint32_t n) {
  if (done_[n]) return converted_[n];  // a memo'd value: shared, not copied
  Node& node = nodes_[n];
  PickleValue out;
  switch (node.kind) {
    case Kind::kNone:
      break;
    case Kind::kBool:
      out = PickleValue::boolean(node.b);
      break;
    case Kind::kInt:
      out = PickleValue::integer(node.i);
      break;
    case Kind::kBigInt:
      out = PickleValue::big_int(std::move(node.s));
      break;
    case Kind::kFloat:
      out = PickleValue::real(node.d);
      break;
    case Kind::kStr:
      out = PickleValue::str(std::move(node.s));
      break;
    case Kind::kBytes:
      out = PickleValue::bytes(std::move(node.s));
      break;
    case Kind::kDict: {
      out = PickleValue::dict();
      // Python keeps one entry per key, with the last value: a hash of the scalar keys (the
      // only ones real snapshots have) keeps that linear; tuple keys are kept as written.
      std::unordered_map<std::string, std::size_t> seen;
      for (std::size_t k = 0; k + 1 < node.kids.size(); k += 2) {
        PickleValue key = convert(node.kids[k]);
        if (key.kind() == Kind::kList || key.kind() == Kind::kDict) {
          fail(data_.size(), std::string("a dict key that is a ") + pickle_kind_name(key.kind()) +
                                 " (unhashable in Python): not a valid pickle");
        }
        PickleValue value = convert(node.kids[k + 1]);
        std::string canon;
        if (key.is_str()) canon = "s" + key.as_str();
        if (key.is_int()) canon = "i" + std::to_string(key.as_int());
        if (!canon.empty()) {
          auto [it, fresh] = seen.emplace(std::move(canon), out.dict_size());
          if (!fresh) {
            out.value(it->second) = std::move(value);
            continue;
          }
        }
        out.add(std::move(key), std::move(value));
      }
      break;
    }
    case Kind::kList:
    case Kind::kTuple: {
      std::vector<PickleValue> items;
      items.reserve(node.kids.size());
      for (std::uint32_t kid : node.kids) items.push_back(convert(kid));
      out = node.kind == Kind::kTuple ? PickleValue::tuple(std::move(items))
                                      : PickleValue::list(std::move(items));
      break;
    }
  }
  std::vector<std::uint32_t>().swap(node.kids);  // the arena shrinks as the result grows
  converted_[n] = out;
  done_[n] = 1;
  return out;
}

}  // namespace

PickleValue read_pickle(std::string_view data, std::string_view source, const PickleLimits& limits,
                        PickleReadStats* stats) {
  return Reader(data, source, limits).run(stats);
}

PickleValue load_pickle_file(const std::string& path, const PickleLimits& limits,
                             PickleReadStats* stats) {
  BoundedRead r = try_read_file_bounded(path, limits.max_input_bytes, "pickle");
  if (r.refused) throw InvalidArgument(r.error);
  if (!r.error.empty()) throw IoError(r.error);
  return read_pickle(r.bytes, path, limits, stats);
}

}  // namespace memfit
