// The pickle reader and writer: round trips, pickles written by CPython in every protocol,
// and hostile input (code-running opcodes, truncation, nesting, memo blow-ups) refused.
#include "profiler/pickle.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "memory/error.h"

namespace memfit {
namespace {

// A literal with embedded NULs, whole.
template <std::size_t N>
std::string B(const char (&s)[N]) {
  return std::string(s, N - 1);
}

std::string unhex(std::string_view h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
    out += static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16));
  }
  return out;
}

// What the CPython pickles below hold: `base` (plus bytes from protocol 3, a set and a
// frozenset from protocol 4), written by /usr/bin/python3 3.11 with pickle.dumps(d, protocol=p):
//   shared = ['x', 'y']
//   base = {'ints': [0, 1, 255, 256, 65535, 65536, -1, -2**31, 2**31, 2**40, -2**63, 2**63-1],
//           'f': [3.5, -0.0, 1e300], 'n': None, 't': True, 'fa': False,
//           's': 'h\u00e9llo \u4e16\U0001F600',
//           'tup': [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)], 'a': shared, 'b': shared,
//           'nested': {'k': {'k2': []}}}
//   if p >= 3: d['bytes'] = b'by\x00\xff'
//   if p >= 4: d['set'] = {7}; d['fs'] = frozenset([8])
const char* const kPythonPickles[] = {
    // protocol 0
    "286470300a56696e74730a70310a286c70320a49300a6149310a61493235350a61493235360a614936353533"
    "350a614936353533360a61492d310a61492d323134373438333634380a614c323134373438333634384c0a61"
    "4c313039393531313632373737364c0a614c2d393232333337323033363835343737353830384c0a614c3932"
    "32333337323033363835343737353830374c0a617356660a70330a286c70340a46332e350a61462d302e300a"
    "614631652b3330300a6173566e0a70350a4e7356740a70360a4930310a735666610a70370a4930300a735673"
    "0a70380a5668e96c6c6f205c75346531365c5530303031663630300a70390a73567475700a7031300a286c70"
    "31310a2874612849310a747031320a612849310a49320a747031330a612849310a49320a49330a747031340a"
    "612849310a49320a49330a49340a747031350a617356610a7031360a286c7031370a56780a7031380a615679"
    "0a7031390a617356620a7032300a6731370a73566e65737465640a7032310a28647032320a566b0a7032330a"
    "28647032340a566b320a7032350a286c7032360a7373732e",
    // protocol 1
    "7d7100285804000000696e747371015d7102284b004b014bff4d00014dffff4a000001004affffffff4a0000"
    "00804c323134373438333634384c0a4c313039393531313632373737364c0a4c2d3932323333373230333638"
    "35343737353830384c0a4c393232333337323033363835343737353830374c0a6558010000006671035d7104"
    "2847400c000000000000478000000000000000477e37e43c8800759c6558010000006e71054e580100000074"
    "71064930310a5802000000666171074930300a5801000000737108580e00000068c3a96c6c6f20e4b896f09f"
    "988071095803000000747570710a5d710b2829284b0174710c284b014b0274710d284b014b024b0374710e28"
    "4b014b024b034b0474710f6558010000006171105d7111285801000000787112580100000079711365580100"
    "0000627114681158060000006e657374656471157d711658010000006b71177d711858020000006b3271195d"
    "711a7373752e",
    // protocol 2
    "80027d7100285804000000696e747371015d7102284b004b014bff4d00014dffff4a000001004affffffff4a"
    "000000808a0500000080008a060000000000018a0800000000000000808a08ffffffffffffff7f6558010000"
    "006671035d71042847400c000000000000478000000000000000477e37e43c8800759c6558010000006e7105"
    "4e580100000074710688580200000066617107895801000000737108580e00000068c3a96c6c6f20e4b896f0"
    "9f988071095803000000747570710a5d710b28294b0185710c4b014b0286710d4b014b024b0387710e284b01"
    "4b024b034b0474710f6558010000006171105d71112858010000007871125801000000797113655801000000"
    "627114681158060000006e657374656471157d711658010000006b71177d711858020000006b3271195d711a"
    "7373752e",
    // protocol 3
    "80037d7100285804000000696e747371015d7102284b004b014bff4d00014dffff4a000001004affffffff4a"
    "000000808a0500000080008a060000000000018a0800000000000000808a08ffffffffffffff7f6558010000"
    "006671035d71042847400c000000000000478000000000000000477e37e43c8800759c6558010000006e7105"
    "4e580100000074710688580200000066617107895801000000737108580e00000068c3a96c6c6f20e4b896f0"
    "9f988071095803000000747570710a5d710b28294b0185710c4b014b0286710d4b014b024b0387710e284b01"
    "4b024b034b0474710f6558010000006171105d71112858010000007871125801000000797113655801000000"
    "627114681158060000006e657374656471157d711658010000006b71177d711858020000006b3271195d711a"
    "737358050000006279746573711b4304627900ff711c752e",
    // protocol 4
    "80049513010000000000007d94288c04696e7473945d94284b004b014bff4d00014dffff4a000001004affff"
    "ffff4a000000808a0500000080008a060000000000018a0800000000000000808a08ffffffffffffff7f658c"
    "0166945d942847400c000000000000478000000000000000477e37e43c8800759c658c016e944e8c01749488"
    "8c02666194898c0173948c0e68c3a96c6c6f20e4b896f09f9880948c03747570945d9428294b0185944b014b"
    "0286944b014b024b038794284b014b024b034b047494658c0161945d94288c0178948c017994658c01629468"
    "118c066e6573746564947d948c016b947d948c026b32945d9473738c056279746573944304627900ff948c03"
    "736574948f94284b07908c02667394284b089194752e",
    // protocol 5
    "80059513010000000000007d94288c04696e7473945d94284b004b014bff4d00014dffff4a000001004affff"
    "ffff4a000000808a0500000080008a060000000000018a0800000000000000808a08ffffffffffffff7f658c"
    "0166945d942847400c000000000000478000000000000000477e37e43c8800759c658c016e944e8c01749488"
    "8c02666194898c0173948c0e68c3a96c6c6f20e4b896f09f9880948c03747570945d9428294b0185944b014b"
    "0286944b014b024b038794284b014b024b034b047494658c0161945d94288c0178948c017994658c01629468"
    "118c066e6573746564947d948c016b947d948c026b32945d9473738c056279746573944304627900ff948c03"
    "736574948f94284b07908c02667394284b089194752e",
};

PickleValue I(std::int64_t i) { return PickleValue::integer(i); }
PickleValue S(std::string s) { return PickleValue::str(std::move(s)); }

PickleValue expected_python_value(int protocol) {
  PickleValue ints = PickleValue::list();
  for (std::int64_t v :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{255}, std::int64_t{256}, std::int64_t{65535},
        std::int64_t{65536}, std::int64_t{-1}, std::int64_t{INT32_MIN}, std::int64_t{1} << 31,
        std::int64_t{1} << 40, std::numeric_limits<std::int64_t>::min(),
        std::numeric_limits<std::int64_t>::max()}) {
    ints.append(I(v));
  }
  PickleValue tups = PickleValue::list();
  tups.append(PickleValue::tuple());
  tups.append(PickleValue::tuple({I(1)}));
  tups.append(PickleValue::tuple({I(1), I(2)}));
  tups.append(PickleValue::tuple({I(1), I(2), I(3)}));
  tups.append(PickleValue::tuple({I(1), I(2), I(3), I(4)}));
  PickleValue shared = PickleValue::list({S("x"), S("y")});
  PickleValue d = PickleValue::dict();
  d.add("ints", ints);
  d.add("f", PickleValue::list(
                 {PickleValue::real(3.5), PickleValue::real(-0.0), PickleValue::real(1e300)}));
  d.add("n", PickleValue::none());
  d.add("t", PickleValue::boolean(true));
  d.add("fa", PickleValue::boolean(false));
  d.add("s", S("h\xc3\xa9llo \xe4\xb8\x96\xf0\x9f\x98\x80"));
  d.add("tup", tups);
  d.add("a", shared);
  d.add("b", shared);
  d.add("nested", PickleValue::dict().add("k", PickleValue::dict().add("k2", PickleValue::list())));
  if (protocol >= 3) d.add("bytes", PickleValue::bytes(std::string("by\0\xff", 4)));
  if (protocol >= 4) {
    d.add("set", PickleValue::list({I(7)}));
    d.add("fs", PickleValue::list({I(8)}));
  }
  return d;
}

TEST(PickleRead, EveryProtocolCPythonWrites) {
  for (int p = 0; p <= 5; ++p) {
    SCOPED_TRACE("protocol " + std::to_string(p));
    const PickleValue v = read_pickle(unhex(kPythonPickles[p]), "python.pickle");
    EXPECT_EQ(v, expected_python_value(p));
    // -0.0 keeps its sign through the text (protocol 0) and binary forms.
    EXPECT_TRUE(std::signbit(v.find("f")->items()[1].as_float()));
  }
}

TEST(PickleWrite, RoundTripsThroughTheReader) {
  for (int p = 2; p <= 5; ++p) {
    const PickleValue v = expected_python_value(p);
    const std::string bytes = write_pickle(v);
    EXPECT_EQ(read_pickle(bytes), v);
    EXPECT_EQ(bytes[0], '\x80');
    EXPECT_EQ(bytes[1], p >= 3 ? '\x03' : '\x02');  // bytes need protocol 3
    EXPECT_EQ(bytes.back(), '.');
  }
}

TEST(PickleWrite, IntegersAtEveryEncodingBoundary) {
  PickleValue l = PickleValue::list();
  for (std::int64_t base :
       {std::int64_t{0}, std::int64_t{255}, std::int64_t{65535}, std::int64_t{INT32_MAX},
        std::int64_t{INT32_MIN}, std::int64_t{1} << 39, -(std::int64_t{1} << 39),
        std::int64_t{1} << 55, std::numeric_limits<std::int64_t>::max() - 1,
        std::numeric_limits<std::int64_t>::min() + 1}) {
    for (std::int64_t d : {-1, 0, 1}) l.append(I(base + d));
  }
  EXPECT_EQ(read_pickle(write_pickle(l)), l);
}

TEST(PickleWrite, RepeatedStringsComeFromTheMemo) {
  PickleValue l = PickleValue::list();
  for (int i = 0; i < 300; ++i) l.append(PickleValue::dict().add("action", S("alloc")));
  const std::string bytes = write_pickle(l);
  EXPECT_EQ(bytes.find("action"), bytes.rfind("action"));  // written once
  EXPECT_LT(bytes.size(), 300u * 8);
  EXPECT_EQ(read_pickle(bytes), l);
  // Over 1000 items: APPENDS batches (as CPython's _BATCHSIZE) still read back whole.
  PickleValue big = PickleValue::list();
  for (int i = 0; i < 2501; ++i) big.append(I(i));
  EXPECT_EQ(read_pickle(write_pickle(big)), big);
}

// Over the threshold the writer switches to protocol 4 as CPython writes it: PROTO 4, then
// FRAMEs (8-byte length) of whole opcodes of about 64 KiB, short strings as SHORT_BINUNICODE
// and memoized with MEMOIZE. Each frame's length must be exact, or Python's unpickler fails.
TEST(PickleWrite, LargePicklesAreProtocol4InFramesOfWholeOpcodes) {
  PickleValue big = PickleValue::list();
  for (int i = 0; i < 20000; ++i) {
    big.append(PickleValue::dict()
                   .add("action", S(i % 2 ? "alloc" : "free_completed"))
                   .add("addr", I(std::int64_t{1} << 40 | i))
                   .add("frames", PickleValue::list({S("f" + std::to_string(i % 300))})));
  }
  big.append(S(std::string(200 << 10, 'x')));  // a str over a frame's size: a frame of its own
  const std::string p4 = write_pickle(big);
  ASSERT_EQ(p4.substr(0, 2), B("\x80\x04"));
  std::size_t at = 2, frames = 0;
  while (at < p4.size()) {  // the frames tile the rest of the file exactly
    ASSERT_EQ(p4[at], '\x95') << "at byte " << at;
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= std::uint64_t(std::uint8_t(p4[at + 1 + i])) << (8 * i);
    at += 9 + n;
    ++frames;
  }
  EXPECT_EQ(at, p4.size());
  EXPECT_GT(frames, 5u);
  EXPECT_EQ(p4.back(), '.');
  EXPECT_NE(p4.find(B("\x8c\x05"
                      "alloc\x94")),
            std::string::npos);
  EXPECT_EQ(read_pickle(p4), big);
  // Below the threshold, protocol 2; the threshold is an option.
  const std::string p2 = write_pickle(big, {.protocol4_above = SIZE_MAX});
  EXPECT_EQ(p2.substr(0, 2), B("\x80\x02"));
  EXPECT_EQ(read_pickle(p2), big);
  EXPECT_EQ(write_pickle(PickleValue::list({I(1)}), {.protocol4_above = 0}).substr(0, 3),
            B("\x80\x04\x95"));
}

TEST(PickleRead, MemoSharesObjectsLikePython) {
  // x = []; y = [x, x]; x.append(1): both places see [1] (APPEND after the BINGET).
  const std::string p =
      B("\x80\x02]q\x00(]q\x01h\x01"
        "eh\x01K\x01"
        "a0.");
  // Stack: outer [x, x], then x fetched again, 1 appended to it, popped; STOP returns outer.
  const PickleValue v = read_pickle(p);
  ASSERT_EQ(v.items().size(), 2u);
  EXPECT_EQ(v.items()[0], PickleValue::list({I(1)}));
  EXPECT_EQ(v.items()[1], PickleValue::list({I(1)}));
}

TEST(PickleRead, IntsBeyond64BitsAreKeptNotRefused) {
  // A Python int past int64 (2**64-1: older tools write SIZE_MAX so; PyTorch 2.x itself writes
  // max_split_size as -1) pickles as LONG1 of 9 bytes, and protocol 0 as decimal text. Both
  // read as the same bytes and write back the same.
  const PickleValue binary =
      read_pickle(B("\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."));
  const PickleValue text = read_pickle("L18446744073709551615L\n.");
  ASSERT_EQ(binary.kind(), PickleValue::Kind::kBigInt);
  EXPECT_EQ(binary, text);
  EXPECT_EQ(read_pickle(write_pickle(binary)), binary);
  EXPECT_THROW(binary.as_int(), InvalidArgument);
  EXPECT_EQ(read_pickle("I-9223372036854775809\n.").big_int_bytes(),
            B("\xff\xff\xff\xff\xff\xff\xff\x7f\xff"));
  EXPECT_EQ(read_pickle("I-9223372036854775808\n.").as_int(), INT64_MIN);
}

TEST(PickleRead, DictKeepsTheLastValueOfARepeatedKey) {
  const std::string p = B("\x80\x02}(X\x01\x00\x00\x00kK\x01X\x01\x00\x00\x00kK\x02u.");
  const PickleValue v = read_pickle(p);
  EXPECT_EQ(v.dict_size(), 1u);
  EXPECT_EQ(v.find("k")->as_int(), 2);
}

// ---- hostile input --------------------------------------------------------------------------

void expect_refused(const std::string& data, const std::vector<std::string>& parts,
                    const PickleLimits& limits = {}) {
  try {
    read_pickle(data, "evil.pickle", limits);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("evil.pickle"), std::string::npos) << msg;
    for (const std::string& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

TEST(PickleRead, RefusesEveryCodeRunningOpcodeByName) {
  const std::pair<char, const char*> refused[] = {{'c', "GLOBAL"},
                                                  {'\x93', "STACK_GLOBAL"},
                                                  {'R', "REDUCE"},
                                                  {'b', "BUILD"},
                                                  {'i', "INST"},
                                                  {'o', "OBJ"},
                                                  {'\x81', "NEWOBJ"},
                                                  {'\x92', "NEWOBJ_EX"},
                                                  {'P', "PERSID"},
                                                  {'Q', "BINPERSID"},
                                                  {'\x82', "EXT1"},
                                                  {'\x83', "EXT2"},
                                                  {'\x84', "EXT4"},
                                                  {'\x97', "NEXT_BUFFER"},
                                                  {'\x98', "READONLY_BUFFER"}};
  for (const auto& [op, name] : refused) {
    // After PROTO 2 and two empty tuples (what REDUCE/BUILD/OBJ would consume): offset 4.
    expect_refused(std::string("\x80\x02))") + op + "XXXX.",
                   {"byte 4", std::string("opcode ") + name, "plain data only"});
  }
  expect_refused("\x80\x02\xff.", {"byte 2", "unknown opcode 0xff"});
}

TEST(PickleRead, ClassicExploitsAreRefusedWithoutSideEffects) {
  const std::string marker = testing::TempDir() + "pickle_pwned_" + std::to_string(::getpid());
  ::unlink(marker.c_str());
  // Protocol 0: os.system('touch marker') as pickletools shows the classic payload.
  expect_refused("cos\nsystem\n(S'touch " + marker + "'\ntR.", {"byte 0", "GLOBAL"});
  // Protocol 2, what pickle.dumps writes for an object whose __reduce__ returns
  // (os.system, ('touch marker',)).
  std::string cmd = "touch " + marker;
  expect_refused(std::string("\x80\x02") + "cposix\nsystem\nq\x00X" +
                     std::string(1, char(cmd.size())) + std::string("\0\0\0", 3) + cmd +
                     "q\x01\x85q\x02Rq\x03.",
                 {"byte 2", "GLOBAL"});
  // Protocol 4: STACK_GLOBAL after two strings, then REDUCE.
  expect_refused(
      std::string("\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94") + "\x8c\x04" + "true\x85R.",
      {"byte 16", "STACK_GLOBAL"});
  EXPECT_NE(::access(marker.c_str(), F_OK), 0) << "the payload ran";
}

TEST(PickleRead, TruncatedInputIsRefusedAtEveryLength) {
  const std::string full = unhex(kPythonPickles[4]);
  for (std::size_t n = 0; n < full.size(); ++n) {
    try {
      read_pickle(full.substr(0, n), "cut.pickle");
      ADD_FAILURE() << "accepted a pickle cut at " << n;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("cut.pickle: byte "), std::string::npos) << e.what();
    }
  }
  expect_refused(B("\x80\x02X\x10\x00\x00\x00"
                   "abc"),
                 {"byte 2", "truncated", "BINUNICODE", "ends at byte 10"});
  expect_refused("\x80\x02]", {"byte 3", "without a STOP"});
}

TEST(PickleRead, CorruptBytesNeverCrash) {
  // Every single-byte change of a real pickle either reads or is refused with InvalidArgument
  // (under ASan this is also the memory-safety check).
  const std::string full = unhex(kPythonPickles[2]);
  for (std::size_t i = 0; i < full.size(); ++i) {
    for (int b : {0x00, 0x28, 0x2e, 0x61, 0x68, 0x75, 0x8a, 0xff}) {
      std::string bad = full;
      bad[i] = static_cast<char>(b);
      try {
        read_pickle(bad);
      } catch (const InvalidArgument&) {
      }
    }
  }
}

TEST(PickleRead, DeepNestingIsRefusedByTheDepthLimit) {
  auto nested = [](int depth) {
    std::string p = "\x80\x02";
    for (int i = 0; i < depth; ++i) p += ']';
    for (int i = 1; i < depth; ++i) p += 'a';
    return p + '.';
  };
  PickleLimits limits;
  limits.max_depth = 50;
  EXPECT_NO_THROW(read_pickle(nested(50), "ok", limits));
  expect_refused(nested(51), {"deeper than 50"}, limits);
  expect_refused(nested(100'000), {"deeper than 100"});  // no C++ recursion while parsing
}

TEST(PickleRead, MemoExpansionIsRefusedByTheElementLimit) {
  // "Billion laughs": level k is a list of 10 references to level k-1; 9 levels are 10^9 values.
  std::string p = "\x80\x02](";
  for (int i = 0; i < 10; ++i) p += "K\x01";
  p += B("eq\x00");
  for (int level = 1; level < 9; ++level) {
    p += "](";
    for (int i = 0; i < 10; ++i) p += "h" + std::string(1, char(level - 1));
    p += "eq" + std::string(1, char(level));
  }
  p += ".";
  PickleLimits limits;
  limits.max_elements = 100'000;
  expect_refused(p, {"element limit"}, limits);
  expect_refused(p, {"element limit"});  // the default limit too
}

// A walk of the result is bounded by the input's size: the ~230-byte "billion laughs" above
// is refused where its expansion passes the walk bound (64 values per input byte, at least
// 2^18), at the list that passes it, in linear time and without building anything (it took
// 1.05 GB and 11 s under ASan against an absolute limit alone).
TEST(PickleRead, ExpansionIsBoundedByTheInputSize) {
  const PickleLimits dflt;
  std::string p = "\x80\x02](";
  for (int i = 0; i < 10; ++i) p += "K\x01";
  p += B("eq\x00");
  std::vector<std::size_t> level_at{2};
  for (int level = 1; level < 9; ++level) {
    level_at.push_back(p.size());
    p += "](";
    for (int i = 0; i < 10; ++i) p += "h" + std::string(1, char(level - 1));
    p += "eq" + std::string(1, char(level));
  }
  p += ".";
  // Level k holds 1 + 10 * (values of level k-1): level 5 is the first over 2^18.
  ASSERT_LT(p.size() * dflt.elements_per_byte, dflt.min_elements);
  const auto t0 = std::chrono::steady_clock::now();
  expect_refused(p, {"byte " + std::to_string(level_at[5]) + ": this list expands to more than " +
                         std::to_string(dflt.min_elements) + " values",
                     "element limit for a " + std::to_string(p.size()) + "-byte pickle",
                     std::to_string(dflt.elements_per_byte) + " per input byte"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  // Strings too: a 64 KiB string referenced 2000 times is a 131 MB walk of a 70 KB file.
  const std::size_t len = 64 << 10;
  std::string s =
      "\x80\x02](X" + std::string("\x00\x00\x01\x00", 4) + std::string(len, 'z') + B("q\x00");
  for (int i = 0; i < 1999; ++i) s += B("h\x00");
  s += "e.";
  const std::size_t walk_limit =
      std::max(dflt.min_string_bytes, dflt.string_bytes_per_byte * s.size());
  ASSERT_GT(2000 * len, walk_limit);
  expect_refused(
      s, {"this list expands to more than " + std::to_string(walk_limit) + " bytes of strings",
          "string-size limit"});
  // Sharing within the bound reads.
  std::string ok = "\x80\x02](";
  for (int i = 0; i < 100; ++i) ok += "K\x07";
  ok +=
      B("eq\x00](h\x00h\x00h\x00"
        "e.");
  const PickleValue v = read_pickle(ok);
  ASSERT_EQ(v.items().size(), 3u);
  EXPECT_EQ(v.items()[2].items()[99].as_int(), 7);
}

// A memo'd value is held once, whatever the number of places it appears: PyTorch's traceback
// frames are memo references, and copying each place made real snapshots expand 40-fold.
TEST(PickleRead, MemoValuesAreSharedNotCopied) {
  // One 1 MiB string and one 3-item list, each referenced 500 times: a 500 MiB walk, held once.
  const std::size_t len = 1 << 20;
  std::string p = "\x80\x02](X" + std::string("\x00\x00\x10\x00", 4) + std::string(len, 's') +
                  B("q\x00](K\x01K\x02K\x03"
                    "eq\x01");
  for (int i = 0; i < 499; ++i) p += B("h\x00h\x01");
  p += "e.";
  PickleReadStats stats;
  const auto t0 = std::chrono::steady_clock::now();
  const PickleValue v = read_pickle(p, "shared.pickle", {}, &stats);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  ASSERT_EQ(v.items().size(), 1000u);
  for (std::size_t i = 0; i + 2 < v.items().size(); i += 2) {
    EXPECT_TRUE(v.items()[i].shares_storage_with(v.items()[i + 2]));
    EXPECT_TRUE(v.items()[i + 1].shares_storage_with(v.items()[i + 3]));
  }
  EXPECT_EQ(v.items()[998].as_str().size(), len);
  EXPECT_EQ(stats.input_bytes, p.size());
  EXPECT_EQ(stats.distinct_values, 6u);         // the outer list, the string, the list, 3 ints
  EXPECT_EQ(stats.places, 1u + 500 * (1 + 4));  // the outer list, 500 x (string + list of 3)
  EXPECT_EQ(stats.walk_string_bytes, 500 * len);
}

// Sharing is invisible to a user of the builder API: changing one place copies it first.
TEST(PickleValue, ChangingOneSharedPlaceLeavesTheOthers) {
  // [x, x, d, d] with x = [1, 2] and d = {}
  const std::string p =
      B("\x80\x02](]q\x00(K\x01K\x02"
        "eh\x00}q\x01h\x01"
        "e.");
  PickleValue v = read_pickle(p);
  ASSERT_EQ(v.items().size(), 4u);
  ASSERT_TRUE(v.items()[0].shares_storage_with(v.items()[1]));
  v.items()[0].append(I(3));
  v.items()[2].add("k", I(4));
  EXPECT_EQ(v.items()[0], PickleValue::list({I(1), I(2), I(3)}));
  EXPECT_EQ(v.items()[1], PickleValue::list({I(1), I(2)}));
  EXPECT_EQ(v.items()[2].dict_size(), 1u);
  EXPECT_EQ(v.items()[3].dict_size(), 0u);
  // Copies share until one changes.
  PickleValue a = PickleValue::list({S("x")});
  PickleValue b = a;
  EXPECT_TRUE(a.shares_storage_with(b));
  b.items()[0] = S("y");
  EXPECT_EQ(a.items()[0].as_str(), "x");
  EXPECT_EQ(b.items()[0].as_str(), "y");
  PickleValue d = PickleValue::dict().add("k", I(1));
  PickleValue e = d;
  e.value(0) = I(2);
  e.set(S("k2"), I(3));
  EXPECT_EQ(d.find("k")->as_int(), 1);
  EXPECT_EQ(d.dict_size(), 1u);
  EXPECT_EQ(e.find("k")->as_int(), 2);
  EXPECT_EQ(e.find("k2")->as_int(), 3);
}

// The depth limit holds at every place a shared value appears, not only at its first.
TEST(PickleRead, ASharedValueNestedDeeperAtASecondPlaceIsRefused) {
  auto chain = [](int n) {  // n nested lists, the outermost memo'd as 0
    std::string c;
    for (int i = 0; i < n; ++i) c += ']';
    for (int i = 1; i < n; ++i) c += 'a';
    return c + B("q\x00");
  };
  PickleLimits limits;
  limits.max_depth = 50;
  // [deep, [[... 20 levels ... deep]]]: deep has 40 levels; at its second place it is at 60.
  std::string p = "\x80\x02](" + chain(40);
  std::string wrap;
  for (int i = 0; i < 20; ++i) wrap += ']';
  wrap += B("h\x00");
  for (int i = 0; i < 20; ++i) wrap += 'a';
  expect_refused(p + wrap + "e.", {"deeper than 50"}, limits);
  std::string shallow;
  for (int i = 0; i < 5; ++i) shallow += ']';
  shallow += B("h\x00");
  for (int i = 0; i < 5; ++i) shallow += 'a';
  EXPECT_NO_THROW(read_pickle(p + shallow + "e.", "ok", limits));
}

TEST(PickleRead, SelfReferenceIsRefused) {
  expect_refused(B("\x80\x02]q\x00h\x00"
                   "a."),
                 {"contains itself"});
}

TEST(PickleRead, HugeLengthsAndMemoIdsAreRefusedBeforeAllocating) {
  expect_refused("\x80\x02X\xff\xff\xff\x7f", {"byte 2", "over the limit"});
  expect_refused(std::string("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f"),
                 {"BINUNICODE8", "over the limit"});
  expect_refused("\x80\x02Nr\xff\xff\xff\xff.", {"LONG_BINPUT", "memo limit"});
  expect_refused("\x80\x02h\x05.", {"no such memo entry"});
  expect_refused("\x80\x06N.", {"protocol 6"});
  expect_refused("\x80\x02K\x01K\x02u.", {"without a MARK"});
  expect_refused(
      "\x80\x02K\x01K\x02"
      "a.",
      {"APPEND", "int"});
  expect_refused("", {"empty input"});
}

TEST(PickleFile, MissingFileIsAnIoErrorNamingIt) {
  EXPECT_THROW(load_pickle_file("/nonexistent/dir/x.pickle"), IoError);
  PickleLimits tiny;
  tiny.max_input_bytes = 4;
  const std::string path = testing::TempDir() + "pickle_big_" + std::to_string(::getpid());
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string bytes = write_pickle(PickleValue::list({I(1), I(2), I(3)}));
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  EXPECT_EQ(load_pickle_file(path).items().size(), 3u);
  try {
    load_pickle_file(path, tiny);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit"), std::string::npos);
  }
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace memfit
