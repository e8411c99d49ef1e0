#include "policies/train_state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "memory/error.h"
#include "memory/size.h"
#include "profiler/atomic_file.h"
#include "profiler/read_file.h"

namespace memfit {

static_assert(std::endian::native == std::endian::little,
              "train-state files are little-endian; a big-endian host needs byte swaps here");

namespace {

constexpr char kMagic[8] = {'M', 'F', 'S', 'T', 'A', 'T', 'E', '1'};
constexpr char kEndMagic[8] = {'M', 'F', 'S', 'T', 'E', 'N', 'D', '1'};
constexpr std::size_t kPrefixBytes = 24;  // magic, version, H, D
constexpr std::size_t kSuffixBytes = 16;  // checksum, end magic
constexpr std::size_t kAlign = 64;

// xxHash64's primes (Collet, xxhash.h).
constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr std::uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr std::uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr std::uint64_t kP5 = 0x27D4EB2F165667C5ull;

std::uint64_t load64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
std::uint32_t load32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
std::uint64_t round64(std::uint64_t acc, std::uint64_t in) {
  return std::rotl(acc + in * kP2, 31) * kP1;
}
std::uint64_t merge64(std::uint64_t acc, std::uint64_t v) {
  acc ^= round64(0, v);
  return acc * kP1 + kP4;
}

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw TrainStateError("training state '" + path + "': " + what);
}

std::string sys_error(const char* op) { return std::string(op) + ": " + std::strerror(errno); }

nlohmann::json shape_json(const Shape& s) {
  nlohmann::json a = nlohmann::json::array();
  for (int i = 0; i < s.ndim(); ++i) a.push_back(s[i]);
  return a;
}

// Writes to a file descriptor, hashing what it writes, failing on purpose after a byte count.
class Writer {
 public:
  Writer(int fd, const std::string& path, std::int64_t fail_after)
      : fd_(fd), path_(path), fail_after_(fail_after) {}

  void write(const void* data, std::size_t n, bool hash = true) {
    if (hash) hash_.update(data, n);
    const auto* p = static_cast<const unsigned char*>(data);
    while (n > 0) {
      std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 24);
      bool inject = false;
      if (fail_after_ >= 0 && written_ + chunk > static_cast<std::size_t>(fail_after_)) {
        chunk = static_cast<std::size_t>(fail_after_) - written_;
        inject = true;
      }
      while (chunk > 0) {
        const ssize_t w = ::write(fd_, p, chunk);
        if (w < 0) {
          if (errno == EINTR) continue;
          fail(path_, sys_error("write"));
        }
        p += w, n -= static_cast<std::size_t>(w), chunk -= static_cast<std::size_t>(w);
        written_ += static_cast<std::size_t>(w);
      }
      if (inject) {
        fail(path_, "injected write failure after " + std::to_string(written_) +
                        " bytes (SaveOptions::fail_after_bytes)");
      }
    }
  }
  void zeros(std::size_t n) {
    static const unsigned char kZero[kAlign] = {};
    while (n > 0) {
      const std::size_t c = std::min(n, kAlign);
      write(kZero, c);
      n -= c;
    }
  }
  std::uint64_t digest() const { return hash_.digest(); }

 private:
  int fd_;
  const std::string& path_;
  std::int64_t fail_after_;
  std::size_t written_ = 0;
  Hash64 hash_;
};

nlohmann::json meta_json(const TrainStateMeta& m) {
  nlohmann::json j;
  j["format"] = "memfit training state";
  j["model_spec"] = m.model_spec;
  j["dtype"] = m.dtype;
  j["optimizer"] = m.optimizer;
  j["options"] = m.options_json;
  j["steps"] = m.steps;
  j["attempted"] = m.attempted;
  j["scaler"] = {{"enabled", m.scaler_enabled},
                 {"scale", m.scaler.scale},
                 {"growth_tracker", m.scaler.growth_tracker}};
  j["rng"] = {{"s", m.rng.s},
              {"has_spare", m.rng.has_spare},
              {"spare_bits", std::bit_cast<std::uint32_t>(m.rng.spare)}};
  return j;
}

// An integer header value as T. nlohmann's get<T>() casts a float (1e300) or an out-of-range
// number straight to T, which is undefined behaviour; a header memfit did not write may hold
// one (the fuzzer's first finding here). The message becomes "bad header: ...".
template <class T>
T int_value(const nlohmann::json& v, const std::string& what) {
  const bool ok = v.is_number_unsigned()  ? std::in_range<T>(v.get<std::uint64_t>())
                  : v.is_number_integer() ? std::in_range<T>(v.get<std::int64_t>())
                                          : false;
  if (!ok) {
    throw std::out_of_range(what + " is " + v.dump() + "; valid: an integer from " +
                            std::to_string(std::numeric_limits<T>::min()) + " to " +
                            std::to_string(std::numeric_limits<T>::max()));
  }
  return v.get<T>();
}

template <class T>
T int_field(const nlohmann::json& j, const char* key) {
  return int_value<T>(j.at(key), std::string("'") + key + "'");
}

TrainStateMeta meta_from_json(const nlohmann::json& j) {
  TrainStateMeta m;
  m.model_spec = j.at("model_spec").get<std::string>();
  m.dtype = j.at("dtype").get<std::string>();
  m.optimizer = j.at("optimizer").get<std::string>();
  m.options_json = j.at("options").get<std::string>();
  m.steps = int_field<std::int64_t>(j, "steps");
  m.attempted = int_field<std::int64_t>(j, "attempted");
  const auto& sc = j.at("scaler");
  m.scaler_enabled = sc.at("enabled").get<bool>();
  m.scaler.scale = sc.at("scale").get<double>();
  m.scaler.growth_tracker = int_field<std::int64_t>(sc, "growth_tracker");
  const auto& r = j.at("rng");
  const auto& words = r.at("s");
  if (!words.is_array() || words.size() != m.rng.s.size()) {
    throw std::out_of_range("'rng.s' is " + words.dump() + "; valid: 4 unsigned 64-bit integers");
  }
  for (std::size_t k = 0; k < m.rng.s.size(); ++k) {
    m.rng.s[k] = int_value<std::uint64_t>(words[k], "'rng.s[" + std::to_string(k) + "]'");
  }
  m.rng.has_spare = r.at("has_spare").get<bool>();
  m.rng.spare = std::bit_cast<float>(int_field<std::uint32_t>(r, "spare_bits"));
  return m;
}

// Closes and removes the temporary file unless released (the rename happened).
}  // namespace

// ---- Hash64 -----------------------------------------------------------------------------------

void Hash64::stripe(const unsigned char* p) {
  for (int i = 0; i < 4; ++i) v_[i] = round64(v_[i], load64(p + 8 * i));
}

void Hash64::update(const void* data, std::size_t n) {
  if (n == 0) return;  // data may be null then (memcpy from null is undefined even for 0 bytes)
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (buffered_ > 0) {
    const std::size_t take = std::min(n, 32 - buffered_);
    std::memcpy(buf_ + buffered_, p, take);
    buffered_ += take, p += take, n -= take;
    if (buffered_ < 32) return;
    stripe(buf_);
    buffered_ = 0;
  }
  for (; n >= 32; p += 32, n -= 32) stripe(p);
  std::memcpy(buf_, p, n);
  buffered_ = n;
}

std::uint64_t Hash64::digest() const {
  std::uint64_t h;
  if (total_ >= 32) {
    h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge64(h, v_[i]);
  } else {
    h = kP5;  // seed 0
  }
  h += total_;
  const unsigned char* p = buf_;
  std::size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ round64(0, load64(p)), 27) * kP1 + kP4;
  if (n >= 4) {
    h = std::rotl(h ^ (std::uint64_t{load32(p)} * kP1), 23) * kP2 + kP3;
    p += 4, n -= 4;
  }
  for (; n > 0; ++p, --n) h = std::rotl(h ^ (std::uint64_t{*p} * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::uint64_t Hash64::of(const void* data, std::size_t n) {
  Hash64 h;
  h.update(data, n);
  return h.digest();
}

// ---- writing ----------------------------------------------------------------------------------

void write_train_state(const std::string& path, const TrainStateMeta& meta,
                       const std::vector<StateTensor>& tensors, Backend& backend, StreamId stream,
                       const SaveOptions& options) {
  if (path.empty()) throw TrainStateError("training state: empty file name");
  nlohmann::json header = meta_json(meta);
  nlohmann::json entries = nlohmann::json::array();
  std::set<std::string> names;
  std::size_t data_bytes = 0;
  std::size_t largest = 0;
  for (const StateTensor& t : tensors) {
    if (t.name.empty() || !names.insert(t.name).second) {
      fail(path, "entry '" + t.name + "': names must be unique and non-empty");
    }
    if (t.tensor.device() == Device::kMeta) {
      fail(path, "entry '" + t.name + "' is on the meta device: a dry run has no values to save");
    }
    if (!t.tensor.defined()) fail(path, "entry '" + t.name + "' has no memory");
    entries.push_back({{"name", t.name},
                       {"dtype", dtype_name(t.tensor.dtype())},
                       {"shape", shape_json(t.tensor.shape())},
                       {"offset", data_bytes},
                       {"nbytes", t.tensor.nbytes()}});
    data_bytes = checked_add(data_bytes, align_up(t.tensor.nbytes()), "training state size");
    largest = std::max(largest, t.tensor.nbytes());
  }
  header["entries"] = std::move(entries);
  const std::string text = header.dump();
  if (text.size() > UINT32_MAX) fail(path, "header too large");

  std::optional<AtomicFile> tmp;  // exclusive, unpredictable temporary name
  try {
    tmp.emplace(path);
  } catch (const IoError& e) {
    fail(path, e.what());
  }

  Writer w(tmp->fd(), path, options.fail_after_bytes);
  const std::uint32_t version = kTrainStateVersion;
  const auto hbytes = static_cast<std::uint32_t>(text.size());
  const std::uint64_t dbytes = data_bytes;
  w.write(kMagic, sizeof kMagic);
  w.write(&version, 4);
  w.write(&hbytes, 4);
  w.write(&dbytes, 8);
  w.write(text.data(), text.size());
  w.zeros(align_up(kPrefixBytes + text.size()) - (kPrefixBytes + text.size()));

  // One host staging buffer, reused: a device tensor goes through backend.copy, so this works
  // for device memory (CUDA) and host memory (CPU backend, pinned offload state) alike.
  std::vector<float> staging((largest + 3) / 4);
  for (const StateTensor& t : tensors) {
    const Tensor host(staging.data(), t.tensor.shape(), t.tensor.dtype(), Device::kCpu);
    backend.copy(stream, t.tensor, host);
    backend.synchronize(stream);
    const std::size_t n = t.tensor.nbytes();
    w.write(staging.data(), n);
    w.zeros(align_up(n) - n);
  }
  const std::uint64_t sum = w.digest();
  w.write(&sum, 8, /*hash=*/false);
  w.write(kEndMagic, sizeof kEndMagic, /*hash=*/false);

  // fsync, close, rename over `path`, fsync the directory (the rename is durable only once
  // the directory entry is).
  try {
    tmp->commit(options.fsync);
  } catch (const IoError& e) {
    fail(path, e.what());
  }
}

// ---- reading ----------------------------------------------------------------------------------

TrainStateFile TrainStateFile::read(const std::string& path) {
  // Only a regular file is read: a directory, FIFO or device is refused by name before
  // anything is read (a directory's lseek end once sized a huge buffer). No size limit beyond
  // the file's own: a state is as large as the model.
  BoundedRead r = try_read_file_bounded(path, SIZE_MAX, "training state");
  if (!r.error.empty()) throw TrainStateError(r.error + " (a training state written by --save)");
  return from_bytes(r.bytes, path);
}

TrainStateFile TrainStateFile::from_bytes(std::string_view bytes, const std::string& path) {
  TrainStateFile f;
  f.path_ = path;
  const auto* buf = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t size = bytes.size();
  if (size < kPrefixBytes + kSuffixBytes) {
    fail(path, "truncated: " + std::to_string(size) + " bytes, a training state has at least " +
                   std::to_string(kPrefixBytes + kSuffixBytes));
  }
  if (std::memcmp(buf, kMagic, 8) != 0) {
    fail(path, "not a memfit training state (bad magic; expected \"MFSTATE1\")");
  }
  const std::uint32_t version = load32(buf + 8);
  if (version != kTrainStateVersion) {
    fail(path, "format version " + std::to_string(version) + "; this memfit reads version " +
                   std::to_string(kTrainStateVersion));
  }
  const std::size_t hbytes = load32(buf + 12);
  const std::uint64_t dbytes = load64(buf + 16);
  const std::size_t data_at = align_up(kPrefixBytes + hbytes);
  const std::size_t expect = dbytes > size ? SIZE_MAX : data_at + dbytes + kSuffixBytes;
  if (expect != size) {
    fail(path, (size < expect ? "truncated: " : "trailing bytes: ") + std::to_string(size) +
                   " bytes, the header says " +
                   (expect == SIZE_MAX ? std::string("more") : std::to_string(expect)));
  }
  if (std::memcmp(buf + size - 8, kEndMagic, 8) != 0) fail(path, "bad end marker");
  const std::uint64_t stored = load64(buf + size - kSuffixBytes);
  const std::uint64_t computed = Hash64::of(buf, size - kSuffixBytes);
  if (stored != computed) {
    fail(path, "checksum mismatch (stored " + std::to_string(stored) + ", computed " +
                   std::to_string(computed) + "): the file is corrupt");
  }

  nlohmann::json header;
  try {
    header =
        nlohmann::json::parse(buf + kPrefixBytes, buf + kPrefixBytes + static_cast<long>(hbytes));
    f.meta_ = meta_from_json(header);
    std::set<std::string> names;
    std::size_t next = 0;  // entries are laid out in order without overlap
    for (const auto& e : header.at("entries")) {
      Entry en;
      en.name = e.at("name").get<std::string>();
      if (!names.insert(en.name).second) fail(path, "entry '" + en.name + "' appears twice");
      en.dtype = parse_dtype(e.at("dtype").get<std::string>());
      const auto& shape = e.at("shape");
      if (!shape.is_array() || shape.size() > static_cast<std::size_t>(kMaxDims)) {
        fail(path, "entry '" + en.name + "': shape " + shape.dump() +
                       "; valid: a list of at most " + std::to_string(kMaxDims) + " dims");
      }
      std::vector<std::int64_t> dims;
      for (const auto& d : shape) dims.push_back(int_value<std::int64_t>(d, "a dim"));
      en.shape = Shape::of(dims.data(), static_cast<int>(dims.size()));
      en.offset = int_field<std::size_t>(e, "offset");
      en.nbytes = int_field<std::size_t>(e, "nbytes");
      const std::size_t want = static_cast<std::size_t>(en.shape.numel()) * dtype_size(en.dtype);
      if (en.nbytes != want || en.offset < next || en.offset % kAlign != 0 || en.offset > dbytes ||
          en.nbytes > dbytes - en.offset) {
        fail(path, "entry '" + en.name + "': extent [" + std::to_string(en.offset) + ", +" +
                       std::to_string(en.nbytes) + ") does not fit its shape " + en.shape.str() +
                       " " + dtype_name(en.dtype) + " and the data section");
      }
      next = en.offset + en.nbytes;
      f.entries_.push_back(std::move(en));
    }
  } catch (const TrainStateError&) {
    throw;
  } catch (const std::exception& e) {
    // The checksum matched, so this is a file written by something else, not corruption.
    fail(path, std::string("bad header: ") + e.what());
  }
  f.data_.resize(static_cast<std::size_t>(dbytes));
  // memcpy from or to null is undefined even for 0 bytes (a state with no entries).
  if (!f.data_.empty()) std::memcpy(f.data_.data(), buf + data_at, f.data_.size());
  return f;
}

const TrainStateFile::Entry* TrainStateFile::find(std::string_view name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void TrainStateFile::restore(const std::vector<StateTensor>& targets, Backend& backend,
                             StreamId stream) const {
  std::set<std::string> wanted;
  for (const StateTensor& t : targets) {
    wanted.insert(t.name);
    const Entry* e = find(t.name);
    if (e == nullptr) fail(path_, "entry '" + t.name + "' is missing");
    if (e->dtype != t.tensor.dtype() || e->shape != t.tensor.shape()) {
      fail(path_, "entry '" + t.name + "' is " + e->shape.str() + " " + dtype_name(e->dtype) +
                      "; this model needs " + t.tensor.shape().str() + " " +
                      dtype_name(t.tensor.dtype()));
    }
  }
  for (const Entry& e : entries_) {
    if (wanted.count(e.name) == 0) {
      fail(path_, "entry '" + e.name + "' is not part of this model and optimizer");
    }
  }
  // Everything checked: from here on only copies, which a valid call cannot fail.
  for (const StateTensor& t : targets) {
    const Entry* e = find(t.name);
    // data_ comes from operator new (16-byte aligned) and offsets are multiples of 64.
    auto* p = const_cast<std::byte*>(data_.data() + e->offset);
    backend.copy(stream, Tensor(p, e->shape, e->dtype, Device::kCpu), t.tensor);
  }
  backend.synchronize(stream);
}

}  // namespace memfit
