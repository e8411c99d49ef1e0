// Python pickles of plain data: a value type, a writer and a SAFE reader.
//
//   PickleValue snap = PickleValue::dict();
//   snap.add("segments", PickleValue::list()).add("device_traces", PickleValue::list());
//   std::string bytes = write_pickle(snap);                       // Python: pickle.loads(bytes)
//   PickleValue back = read_pickle(bytes, "snapshot.pickle");     // never runs any code
//   if (const PickleValue* s = back.find("segments")) s->items().size();
//
// PickleValue holds exactly what Python's pickle can express without naming a class: None,
// bool, int (64-bit), float, str (UTF-8), bytes, list, tuple and dict (ordered key/value
// pairs, keys of any of these kinds). Sets and frozensets read as lists. Ints beyond 64 bits
// are kept (kBigInt, as bytes) so a file holding one still reads; as_int() refuses them.
//
// Writer: protocol 2 (PROTO, BININT1/BININT2/BININT/LONG1, BINFLOAT, BINUNICODE, EMPTY_LIST +
// APPENDS and EMPTY_DICT + SETITEMS in batches of 1000 as CPython writes them, EMPTY_TUPLE /
// TUPLE1-3 / TUPLE, NONE, NEWTRUE/NEWFALSE, STOP). Equal strings are written once and
// fetched from the memo (BINPUT/BINGET) after that, as CPython's pickler does for the same
// object, which keeps a snapshot's repeated keys ("action", "addr", ...) small. A value with
// bytes in it is written as protocol 3, the first with a bytes opcode (protocol 2 would need
// a call to codecs.encode, which the reader refuses).
//
// Reader: a stack machine over the opcodes of protocols 0-5 that build those types (incl.
// FRAME, the memo opcodes, the protocol 0 text forms), with Python's reference semantics for
// the memo (a list fetched from the memo is the same list, even if appended to later). Every
// other opcode (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID,
// BINPERSID, EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER, unknown bytes) is refused with
// InvalidArgument naming the source, the byte offset and the opcode: nothing is imported,
// called or executed, whatever the file says. Limits (PickleLimits) bound nesting depth,
// elements, string sizes and the memo, so a hostile or huge file is refused clearly instead of
// exhausting memory; a shared sub-value counts once per place it appears in the result (the
// result is a tree), which is what stops "billion laughs" memo repetition. A structure that
// contains itself is refused (a tree cannot hold it). Truncated input is refused with the
// offset where it ended. The result's size is bounded by a multiple of the input's
// (PickleLimits), with the error naming the limit and the byte offset of the value that
// passes it. Not thread-safe per value; the functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memfit {

class PickleValue {
 public:
  enum class Kind : std::uint8_t {
    kNone,
    kBool,
    kInt,
    kBigInt,
    kFloat,
    kStr,
    kBytes,
    kList,
    kTuple,
    kDict
  };

  PickleValue() = default;  // None
  static PickleValue none() { return {}; }
  static PickleValue boolean(bool b);
  static PickleValue integer(std::int64_t i);
  // An int outside int64 (PyTorch writes SIZE_MAX as max_split_size): its two's complement
  // little-endian bytes, as LONG1 carries them.
  static PickleValue big_int(std::string le_bytes);
  static PickleValue real(double d);
  static PickleValue str(std::string s);
  static PickleValue bytes(std::string b);
  static PickleValue list(std::vector<PickleValue> items = {});
  static PickleValue tuple(std::vector<PickleValue> items = {});
  static PickleValue dict();

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_str() const { return kind_ == Kind::kStr; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }

  // Typed access; the wrong kind throws InvalidArgument ("expected int, found str").
  bool as_bool() const;
  std::int64_t as_int() const;                    // int, or bool as 0/1 (Python's bool is an int)
  double as_float() const;                        // float or int
  const std::string& as_str() const;              // str
  const std::string& as_bytes() const;            // bytes
  const std::string& big_int_bytes() const;       // kBigInt
  const std::vector<PickleValue>& items() const;  // list or tuple
  std::vector<PickleValue>& items();
  PickleValue& append(PickleValue v);  // list or tuple; returns *this

  // Dict: entries in insertion order.
  std::size_t dict_size() const;
  const PickleValue& key(std::size_t i) const;
  const PickleValue& value(std::size_t i) const;
  PickleValue& value(std::size_t i);
  // Appends key/value (no duplicate check: for building); returns *this for chaining.
  PickleValue& add(PickleValue key, PickleValue v);
  PickleValue& add(std::string key, PickleValue v) {
    return add(str(std::move(key)), std::move(v));
  }
  // Python's d[key] = v: replaces the value of an equal key, else appends.
  void set(PickleValue key, PickleValue v);
  // The value under the str key `key`; nullptr when absent (or not a dict).
  const PickleValue* find(std::string_view key) const;

  bool operator==(const PickleValue& o) const;  // deep, ordered (dicts compare in order)

 private:
  Kind kind_ = Kind::kNone;
  bool b_ = false;
  std::int64_t i_ = 0;
  double d_ = 0;
  std::string s_;                   // str (UTF-8) or bytes
  std::vector<PickleValue> items_;  // list/tuple items; dict: key0, value0, key1, value1, ...
};

// "None", "bool", "int", "int beyond 64 bits", "float", "str", "bytes", "list", "tuple", "dict".
const char* pickle_kind_name(PickleValue::Kind k);

struct PickleLimits {
  // The whole file (load_pickle_file), and the bytes of str/bytes in the result.
  std::size_t max_input_bytes = std::size_t{2} << 30;
  std::size_t max_depth = 100;               // nesting of containers in the result
  std::size_t max_elements = 20'000'000;     // values in the result, shared ones per place
  std::size_t max_string_bytes = 64u << 20;  // one str or bytes
  std::size_t max_memo = 10'000'000;         // memo entries (and the highest memo index + 1)
  std::size_t max_stack = 10'000'000;        // values on the stack (incl. under marks)
  // The result may hold at most max(min_elements, elements_per_byte x input bytes) values
  // (and max_elements), and max(min_string_bytes, string_bytes_per_byte x input bytes) bytes
  // of str/bytes (and max_input_bytes): the result's memory is linear in the input's size, so
  // a small file of shared memo references ("billion laughs") is refused, in time linear in
  // the file, before anything is copied. Real memory_viz snapshots expand to under one value
  // per byte; PyTorch's shared traceback frames stay well within 8.
  std::size_t elements_per_byte = 8;
  std::size_t min_elements = std::size_t{1} << 18;
  std::size_t string_bytes_per_byte = 8;
  std::size_t min_string_bytes = std::size_t{16} << 20;
};

// Errors are InvalidArgument: "<source>: byte <offset>: <what>".
PickleValue read_pickle(std::string_view data, std::string_view source = "pickle",
                        const PickleLimits& limits = {});
// Reads the whole file first (IoError naming it if it cannot be read; InvalidArgument if it is
// larger than limits.max_input_bytes), then read_pickle with the path as the source.
PickleValue load_pickle_file(const std::string& path, const PickleLimits& limits = {});

std::string write_pickle(const PickleValue& v);

// The name of a pickle opcode byte ("GLOBAL", "BINUNICODE", ...); nullptr for a byte that is
// no opcode of protocols 0-5.
const char* pickle_opcode_name(std::uint8_t op);

}  // namespace memfit
