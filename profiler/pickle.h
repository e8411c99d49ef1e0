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
// a call to codecs.encode, which the reader refuses). A large pickle (over
// PickleWriteOptions::protocol4_above bytes, 64 KiB by default, or holding a str over 4 GiB)
// is written as protocol 4, as CPython's pickle.dump writes PyTorch's own snapshots: FRAMEs
// of about 64 KiB (each FRAME + 8-byte length + whole opcodes; the PROTO before the first),
// SHORT_BINUNICODE, MEMOIZE, and the 8-byte length forms past 4 GiB. Never protocol 5:
// memory_viz reads 2-4 (a protocol 5 file shows nothing there; torchtitan #3375).
//
// Reader: a stack machine over the opcodes of protocols 0-5 that build those types (incl.
// FRAME, the memo opcodes, the protocol 0 text forms), with Python's reference semantics for
// the memo (a list fetched from the memo is the same list, even if appended to later). Every
// other opcode (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID,
// BINPERSID, EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER, unknown bytes) is refused with
// InvalidArgument naming the source, the byte offset and the opcode: nothing is imported,
// called or executed, whatever the file says. A structure that contains itself is refused (a
// tree cannot hold it). Truncated input is refused with the offset where it ended.
//
// Sharing. A value fetched from the memo (or DUP'd) is shared, not copied: strings and
// containers live in reference-counted storage, so the result holds each distinct value once
// and its memory is linear in the input (every distinct value costs at least one opcode
// byte; PickleLimits::max_elements bounds their number). PyTorch's snapshots need this: each
// trace entry's frames are memo references to one dict per source line, and a 2.4 MB file
// expands to 77 MB of strings when each place is counted. Copies of a PickleValue share too
// (copying is O(1)); the builder API (append, add, set, value(i) and items() non-const)
// copies a shared container first (copy-on-write), so a PickleValue behaves as a plain value:
// changing one place never changes another. (A reference from a non-const accessor is valid
// until the value is next copied or changed through another call.)
//
// Walk bound. A consumer walks the result as a tree, visiting a shared value once per place
// it appears, so the reader also bounds the places (values a full walk visits) and the bytes
// of str/bytes such a walk reads, as multiples of the input's size (PickleLimits): a small
// file of nested memo references ("billion laughs") is refused, in time linear in the file,
// before anything is built, with the error naming the limit and the byte offset of the first
// (innermost) value that passes it. Measured on the 16 real PyTorch snapshots in
// ../shared/real-snapshots (tests/profiler/real_snapshots_test.cpp prints these): at most
// 3.4 places per input byte (Maphsge4...snapshot.pickle) and 43.5 string bytes per input
// byte (MercuryB1...cuda_memory_snapshot.pickle), against limits of 64 and 1024.
//
// Not thread-safe per value (two threads may read one value; changing it needs the only
// reference); the functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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
  std::vector<PickleValue>& items();              // copy-on-write: unshares first
  PickleValue& append(PickleValue v);             // list or tuple; returns *this

  // Dict: entries in insertion order.
  std::size_t dict_size() const;
  const PickleValue& key(std::size_t i) const;
  const PickleValue& value(std::size_t i) const;
  PickleValue& value(std::size_t i);  // copy-on-write: unshares first
  // Appends key/value (no duplicate check: for building); returns *this for chaining.
  PickleValue& add(PickleValue key, PickleValue v);
  PickleValue& add(std::string key, PickleValue v) {
    return add(str(std::move(key)), std::move(v));
  }
  // Python's d[key] = v: replaces the value of an equal key, else appends.
  void set(PickleValue key, PickleValue v);
  // The value under the str key `key`; nullptr when absent (or not a dict).
  const PickleValue* find(std::string_view key) const;

  // Whether two values hold the same storage (a memo'd value read twice, or a copy): equal
  // without looking inside. Scalars share nothing.
  bool shares_storage_with(const PickleValue& o) const { return rep_ && rep_ == o.rep_; }

  bool operator==(const PickleValue& o) const;  // deep, ordered (dicts compare in order)

 private:
  struct Rep;  // str/bytes/big-int text, or list/tuple items, or dict key0, value0, ...
  const Rep& rep() const;
  Rep& own();  // the storage, unshared first (copy-on-write)

  Kind kind_ = Kind::kNone;
  std::int64_t num_ = 0;      // bool (0/1), int, or a float's bits
  std::shared_ptr<Rep> rep_;  // str, bytes, big int and containers; null: empty
};

// "None", "bool", "int", "int beyond 64 bits", "float", "str", "bytes", "list", "tuple", "dict".
const char* pickle_kind_name(PickleValue::Kind k);

struct PickleLimits {
  // The whole file (load_pickle_file).
  std::size_t max_input_bytes = std::size_t{2} << 30;
  std::size_t max_depth = 100;               // nesting of containers in the result
  std::size_t max_elements = 20'000'000;     // distinct values built (each held once)
  std::size_t max_string_bytes = 64u << 20;  // one str or bytes
  std::size_t max_memo = 10'000'000;         // memo entries (and the highest memo index + 1)
  std::size_t max_stack = 10'000'000;        // values on the stack (incl. under marks)
  // The walk bound: a walk of the result as a tree (a shared value once per place it
  // appears) may visit at most max(min_elements, elements_per_byte x input bytes) values and
  // read max(min_string_bytes, string_bytes_per_byte x input bytes) bytes of str/bytes. Real
  // snapshots reach 3.4 and 43.5 (see the header comment): the limits leave a margin of 19x
  // and 23x, and still refuse a "billion laughs" file, in time linear in the file.
  std::size_t elements_per_byte = 64;
  std::size_t min_elements = std::size_t{1} << 18;
  std::size_t string_bytes_per_byte = 1024;
  std::size_t min_string_bytes = std::size_t{16} << 20;
};

// What a read built and what a walk of it would visit (for limits and benchmarks).
struct PickleReadStats {
  std::size_t input_bytes = 0;
  std::size_t distinct_values = 0;    // values built, each shared one once
  std::size_t places = 0;             // values a walk visits, a shared one per place
  std::size_t walk_string_bytes = 0;  // bytes of str/bytes such a walk reads
};

// Errors are InvalidArgument: "<source>: byte <offset>: <what>". `stats`, when given, is
// filled on success.
PickleValue read_pickle(std::string_view data, std::string_view source = "pickle",
                        const PickleLimits& limits = {}, PickleReadStats* stats = nullptr);
// Reads the whole file first (IoError naming it if it cannot be read; InvalidArgument if it is
// larger than limits.max_input_bytes), then read_pickle with the path as the source.
PickleValue load_pickle_file(const std::string& path, const PickleLimits& limits = {},
                             PickleReadStats* stats = nullptr);

struct PickleWriteOptions {
  std::size_t protocol4_above = std::size_t{64} << 10;  // bytes; see the header comment
};
std::string write_pickle(const PickleValue& v, const PickleWriteOptions& options = {});

// The name of a pickle opcode byte ("GLOBAL", "BINUNICODE", ...); nullptr for a byte that is
// no opcode of protocols 0-5.
const char* pickle_opcode_name(std::uint8_t op);

}  // namespace memfit
