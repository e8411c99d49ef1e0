// PickleValue and the protocol 2 writer. The reader is in pickle_reader.cpp.
#include "profiler/pickle.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/error.h"

namespace memfit {

namespace {

[[noreturn]] void wrong_kind(const char* wanted, PickleValue::Kind found) {
  throw InvalidArgument(std::string("pickle value: expected ") + wanted + ", found " +
                        pickle_kind_name(found));
}

}  // namespace

const char* pickle_kind_name(PickleValue::Kind k) {
  switch (k) {
    case PickleValue::Kind::kNone:
      return "None";
    case PickleValue::Kind::kBool:
      return "bool";
    case PickleValue::Kind::kInt:
      return "int";
    case PickleValue::Kind::kBigInt:
      return "int beyond 64 bits";
    case PickleValue::Kind::kFloat:
      return "float";
    case PickleValue::Kind::kStr:
      return "str";
    case PickleValue::Kind::kBytes:
      return "bytes";
    case PickleValue::Kind::kList:
      return "list";
    case PickleValue::Kind::kTuple:
      return "tuple";
    case PickleValue::Kind::kDict:
      return "dict";
  }
  return "invalid";
}

struct PickleValue::Rep {
  std::string text;                // str (UTF-8), bytes, or a big int's bytes
  std::vector<PickleValue> items;  // list/tuple items; dict: key0, value0, key1, value1, ...
};

const PickleValue::Rep& PickleValue::rep() const {
  static const Rep kEmpty;
  return rep_ ? *rep_ : kEmpty;
}

PickleValue::Rep& PickleValue::own() {
  if (!rep_) {
    rep_ = std::make_shared<Rep>();
  } else if (rep_.use_count() > 1) {
    rep_ = std::make_shared<Rep>(*rep_);  // one level: the items still share their storage
  }
  return *rep_;
}

PickleValue PickleValue::boolean(bool b) {
  PickleValue v;
  v.kind_ = Kind::kBool;
  v.num_ = b ? 1 : 0;
  return v;
}

PickleValue PickleValue::integer(std::int64_t i) {
  PickleValue v;
  v.kind_ = Kind::kInt;
  v.num_ = i;
  return v;
}

PickleValue PickleValue::big_int(std::string le_bytes) {
  PickleValue v;
  v.kind_ = Kind::kBigInt;
  v.own().text = std::move(le_bytes);
  return v;
}

PickleValue PickleValue::real(double d) {
  PickleValue v;
  v.kind_ = Kind::kFloat;
  v.num_ = std::bit_cast<std::int64_t>(d);
  return v;
}

PickleValue PickleValue::str(std::string s) {
  PickleValue v;
  v.kind_ = Kind::kStr;
  if (!s.empty()) v.own().text = std::move(s);
  return v;
}

PickleValue PickleValue::bytes(std::string b) {
  PickleValue v;
  v.kind_ = Kind::kBytes;
  if (!b.empty()) v.own().text = std::move(b);
  return v;
}

PickleValue PickleValue::list(std::vector<PickleValue> items) {
  PickleValue v;
  v.kind_ = Kind::kList;
  if (!items.empty()) v.own().items = std::move(items);
  return v;
}

PickleValue PickleValue::tuple(std::vector<PickleValue> items) {
  PickleValue v;
  v.kind_ = Kind::kTuple;
  if (!items.empty()) v.own().items = std::move(items);
  return v;
}

PickleValue PickleValue::dict() {
  PickleValue v;
  v.kind_ = Kind::kDict;
  return v;
}

bool PickleValue::as_bool() const {
  if (kind_ != Kind::kBool) wrong_kind("bool", kind_);
  return num_ != 0;
}

std::int64_t PickleValue::as_int() const {
  if (kind_ == Kind::kBool) return num_ != 0 ? 1 : 0;
  if (kind_ != Kind::kInt) wrong_kind("int", kind_);
  return num_;
}

double PickleValue::as_float() const {
  if (kind_ == Kind::kInt) return static_cast<double>(num_);
  if (kind_ != Kind::kFloat) wrong_kind("float", kind_);
  return std::bit_cast<double>(num_);
}

const std::string& PickleValue::as_str() const {
  if (kind_ != Kind::kStr) wrong_kind("str", kind_);
  return rep().text;
}

const std::string& PickleValue::as_bytes() const {
  if (kind_ != Kind::kBytes) wrong_kind("bytes", kind_);
  return rep().text;
}

const std::string& PickleValue::big_int_bytes() const {
  if (kind_ != Kind::kBigInt) wrong_kind("int beyond 64 bits", kind_);
  return rep().text;
}

const std::vector<PickleValue>& PickleValue::items() const {
  if (!is_sequence()) wrong_kind("list or tuple", kind_);
  return rep().items;
}

std::vector<PickleValue>& PickleValue::items() {
  if (!is_sequence()) wrong_kind("list or tuple", kind_);
  return own().items;
}

PickleValue& PickleValue::append(PickleValue v) {
  items().push_back(std::move(v));
  return *this;
}

std::size_t PickleValue::dict_size() const {
  if (kind_ != Kind::kDict) wrong_kind("dict", kind_);
  return rep().items.size() / 2;
}

const PickleValue& PickleValue::key(std::size_t i) const {
  if (i >= dict_size()) throw InvalidArgument("pickle value: dict entry index out of range");
  return rep().items[2 * i];
}

const PickleValue& PickleValue::value(std::size_t i) const {
  if (i >= dict_size()) throw InvalidArgument("pickle value: dict entry index out of range");
  return rep().items[2 * i + 1];
}

PickleValue& PickleValue::value(std::size_t i) {
  if (i >= dict_size()) throw InvalidArgument("pickle value: dict entry index out of range");
  return own().items[2 * i + 1];
}

PickleValue& PickleValue::add(PickleValue key, PickleValue v) {
  if (kind_ != Kind::kDict) wrong_kind("dict", kind_);
  std::vector<PickleValue>& items = own().items;
  items.push_back(std::move(key));
  items.push_back(std::move(v));
  return *this;
}

void PickleValue::set(PickleValue key, PickleValue v) {
  if (kind_ != Kind::kDict) wrong_kind("dict", kind_);
  const std::vector<PickleValue>& items = rep().items;
  for (std::size_t i = 0; i < items.size(); i += 2) {
    if (items[i] == key) {
      own().items[i + 1] = std::move(v);
      return;
    }
  }
  add(std::move(key), std::move(v));
}

const PickleValue* PickleValue::find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  // The last equal key: a hand-written file may repeat one, and Python keeps the last value.
  const std::vector<PickleValue>& items = rep().items;
  for (std::size_t i = items.size(); i >= 2; i -= 2) {
    const PickleValue& k = items[i - 2];
    if (k.kind_ == Kind::kStr && k.rep().text == key) return &items[i - 1];
  }
  return nullptr;
}

bool PickleValue::operator==(const PickleValue& o) const {
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
    case Kind::kInt:
      return num_ == o.num_;
    case Kind::kFloat: {
      const double a = std::bit_cast<double>(num_), b = std::bit_cast<double>(o.num_);
      return a == b || (a != a && b != b);  // NaN equals NaN for round trips
    }
    case Kind::kBigInt:
    case Kind::kStr:
    case Kind::kBytes:
      return shares_storage_with(o) || rep().text == o.rep().text;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kDict:
      return shares_storage_with(o) || rep().items == o.rep().items;
  }
  return false;
}

// ---- writer ---------------------------------------------------------------------------------

namespace {

// Opcodes the writer emits (names as in CPython's Lib/pickle.py).
constexpr char kProto = '\x80', kStop = '.', kMark = '(', kNone = 'N', kNewTrue = '\x88',
               kNewFalse = '\x89', kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kLong1 = '\x8a',
               kBinFloat = 'G', kBinUnicode = 'X', kShortBinBytes = 'C', kBinBytes = 'B',
               kEmptyList = ']', kAppends = 'e', kEmptyDict = '}', kSetItems = 'u',
               kEmptyTuple = ')', kTuple = 't', kTuple1 = '\x85', kTuple2 = '\x86',
               kTuple3 = '\x87', kBinPut = 'q', kLongBinPut = 'r', kBinGet = 'h', kLongBinGet = 'j',
               kAppend = 'a', kSetItem = 's', kShortBinUnicode = '\x8c', kBinUnicode8 = '\x8d',
               kBinBytes8 = '\x8e', kMemoize = '\x94', kFrame = '\x95';

// CPython's _FRAME_SIZE_TARGET: a protocol 4 frame closes once it holds this much.
constexpr std::size_t kFrameTarget = std::size_t{64} << 10;

// CPython's Pickler._BATCHSIZE: APPENDS / SETITEMS carry at most this many items each.
constexpr std::size_t kBatch = 1000;

bool has_bytes(const PickleValue& v) {
  if (v.kind() == PickleValue::Kind::kBytes) return true;
  if (v.is_sequence()) {
    for (const PickleValue& x : v.items())
      if (has_bytes(x)) return true;
  } else if (v.is_dict()) {
    for (std::size_t i = 0; i < v.dict_size(); ++i)
      if (has_bytes(v.key(i)) || has_bytes(v.value(i))) return true;
  }
  return false;
}

class Writer {
 public:
  // protocol4: SHORT_BINUNICODE, MEMOIZE and the 8-byte forms, with frame cuts recorded.
  Writer(std::string& out, bool protocol4) : out_(out), protocol4_(protocol4) {}

  // Where a frame closes: offsets into `out`, each at an opcode boundary.
  const std::vector<std::size_t>& frame_cuts() const { return cuts_; }

  void value(const PickleValue& v) {
    if (protocol4_ && out_.size() - frame_start_ >= kFrameTarget) {
      cuts_.push_back(out_.size());
      frame_start_ = out_.size();
    }
    switch (v.kind()) {
      case PickleValue::Kind::kNone:
        out_ += kNone;
        return;
      case PickleValue::Kind::kBool:
        out_ += v.as_bool() ? kNewTrue : kNewFalse;
        return;
      case PickleValue::Kind::kInt:
        integer(v.as_int());
        return;
      case PickleValue::Kind::kBigInt:
        out_ += kLong1;
        if (v.big_int_bytes().size() > 255)
          throw InvalidArgument("write_pickle: an int over 255 bytes");
        out_ += static_cast<char>(v.big_int_bytes().size());
        out_ += v.big_int_bytes();
        return;
      case PickleValue::Kind::kFloat:
        out_ += kBinFloat;
        be64(std::bit_cast<std::uint64_t>(v.as_float()));
        return;
      case PickleValue::Kind::kStr:
        str(v.as_str());
        return;
      case PickleValue::Kind::kBytes:
        bytes(v.as_bytes());
        return;
      case PickleValue::Kind::kList:
        out_ += kEmptyList;
        batches(v.items().size(), kAppend, kAppends, [&](std::size_t i) { value(v.items()[i]); });
        return;
      case PickleValue::Kind::kTuple:
        tuple(v.items());
        return;
      case PickleValue::Kind::kDict:
        out_ += kEmptyDict;
        batches(v.dict_size(), kSetItem, kSetItems, [&](std::size_t i) {
          value(v.key(i));
          value(v.value(i));
        });
        return;
    }
  }

 private:
  void le(std::uint64_t x, int n) {
    for (int i = 0; i < n; ++i) out_ += static_cast<char>((x >> (8 * i)) & 0xff);
  }

  void be64(std::uint64_t x) {  // BINFLOAT is big-endian
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>((x >> (8 * i)) & 0xff);
  }

  void integer(std::int64_t i) {
    if (i >= 0 && i <= 0xff) {
      out_ += kBinInt1;
      le(static_cast<std::uint64_t>(i), 1);
    } else if (i >= 0 && i <= 0xffff) {
      out_ += kBinInt2;
      le(static_cast<std::uint64_t>(i), 2);
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
      out_ += kBinInt;
      le(static_cast<std::uint64_t>(i), 4);
    } else {
      // Shortest two's complement little-endian form, as Python's encode_long.
      int n = 8;
      while (n > 1) {
        const std::int64_t shifted = i >> (8 * (n - 1) - 1);  // top byte + the next sign bit
        if (shifted != 0 && shifted != -1) break;
        --n;
      }
      out_ += kLong1;
      out_ += static_cast<char>(n);
      le(static_cast<std::uint64_t>(i), n);
    }
  }

  // Equal strings go through the memo: the first is stored, later ones fetched.
  void str(const std::string& s) {
    auto it = memo_.find(s);
    if (it != memo_.end()) {
      if (it->second < 256) {
        out_ += kBinGet;
        le(it->second, 1);
      } else {
        out_ += kLongBinGet;
        le(it->second, 4);
      }
      return;
    }
    if (protocol4_ && s.size() < 256) {
      out_ += kShortBinUnicode;
      le(s.size(), 1);
    } else if (s.size() <= UINT32_MAX) {
      out_ += kBinUnicode;
      le(s.size(), 4);
    } else if (protocol4_) {
      out_ += kBinUnicode8;
      le(s.size(), 8);
    } else {
      throw InvalidArgument("write_pickle: a str over 4 GiB needs protocol 4");
    }
    out_ += s;
    const auto id = static_cast<std::uint32_t>(memo_.size());
    if (id == UINT32_MAX) return;  // memo full: write later copies in full
    memo_.emplace(s, id);
    if (protocol4_) {
      out_ += kMemoize;  // the next memo index, which is id: only strings are memoized
    } else if (id < 256) {
      out_ += kBinPut;
      le(id, 1);
    } else {
      out_ += kLongBinPut;
      le(id, 4);
    }
  }

  void bytes(const std::string& b) {
    if (b.size() < 256) {
      out_ += kShortBinBytes;
      le(b.size(), 1);
    } else if (b.size() <= UINT32_MAX) {
      out_ += kBinBytes;
      le(b.size(), 4);
    } else if (protocol4_) {
      out_ += kBinBytes8;
      le(b.size(), 8);
    } else {
      throw InvalidArgument("write_pickle: a bytes over 4 GiB needs protocol 4");
    }
    out_ += b;
  }

  void tuple(const std::vector<PickleValue>& items) {
    static constexpr char kSmall[] = {kEmptyTuple, kTuple1, kTuple2, kTuple3};
    if (items.size() <= 3) {
      for (const PickleValue& x : items) value(x);
      out_ += kSmall[items.size()];
      return;
    }
    out_ += kMark;
    for (const PickleValue& x : items) value(x);
    out_ += kTuple;
  }

  // CPython's _batch_appends / _batch_setitems: one item alone with the single opcode, more
  // in MARK ... APPENDS/SETITEMS groups of kBatch.
  template <typename Emit>
  void batches(std::size_t n, char single, char multi, Emit emit) {
    for (std::size_t start = 0; start < n; start += kBatch) {
      const std::size_t end = std::min(n, start + kBatch);
      if (end - start == 1) {
        emit(start);
        out_ += single;
        continue;
      }
      out_ += kMark;
      for (std::size_t i = start; i < end; ++i) emit(i);
      out_ += multi;
    }
  }

  std::string& out_;
  const bool protocol4_;
  std::unordered_map<std::string, std::uint32_t> memo_;
  std::vector<std::size_t> cuts_;
  std::size_t frame_start_ = 0;
};

}  // namespace

std::string write_pickle(const PickleValue& v, const PickleWriteOptions& options) {
  // Protocol 4 first: its body says whether the pickle is large.
  std::string body;
  Writer w4(body, true);
  w4.value(v);
  body += kStop;
  if (body.size() <= options.protocol4_above && body.size() <= UINT32_MAX) {
    std::string out;
    out += kProto;
    out += has_bytes(v) ? '\x03' : '\x02';
    Writer w(out, false);
    w.value(v);
    out += kStop;
    return out;
  }
  // PROTO 4, then the body in frames: each FRAME + 8-byte length + whole opcodes.
  std::string out;
  out.reserve(body.size() + 9 * (w4.frame_cuts().size() + 1) + 2);
  out += kProto;
  out += '\x04';
  std::size_t from = 0;
  auto frame = [&](std::size_t to) {
    out += kFrame;
    for (int i = 0; i < 8; ++i) out += static_cast<char>(((to - from) >> (8 * i)) & 0xff);
    out.append(body, from, to - from);
    from = to;
  };
  for (std::size_t cut : w4.frame_cuts()) frame(cut);
  frame(body.size());
  return out;
}

// clang-format off
const char* pickle_opcode_name(std::uint8_t op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

// clang-format on

}  // namespace memfit
