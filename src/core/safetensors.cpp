#include "core/safetensors.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/fs.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace kvs {
namespace {

using ojson = nlohmann::ordered_json;

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // 100 MB, as the reference reader

std::string shape_str(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// Byte size of a tensor, or fails (naming `origin`) on a negative dim or overflow.
uint64_t checked_nbytes(const std::vector<int64_t>& shape, DType d, const std::string& origin) {
  uint64_t n = 1;
  const uint64_t limit = std::numeric_limits<uint64_t>::max() / 8;
  for (int64_t s : shape) {
    KVS_CHECK(s >= 0, "{}: negative dimension in shape {}", origin, shape_str(shape));
    KVS_CHECK(s == 0 || n <= limit / static_cast<uint64_t>(s), "{}: shape {} is too large", origin, shape_str(shape));
    n *= static_cast<uint64_t>(s);
  }
  return n * dtype_size(d);
}

void check_bytes(const StTensor& t) {
  uint64_t want = checked_nbytes(t.shape, t.dtype, fmt::format("tensor '{}'", t.name));
  KVS_CHECK(t.bytes.size() == want, "tensor '{}': has {} bytes of data, expected {} for shape {} of {}", t.name,
            t.bytes.size(), want, shape_str(t.shape), dtype_name(t.dtype));
}

template <class T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pread_all(int fd, void* dst, uint64_t size, uint64_t offset, const std::string& path) {
  auto* p = static_cast<uint8_t*>(dst);
  while (size > 0) {
    size_t chunk = size < (uint64_t(1) << 30) ? size : (size_t(1) << 30);
    ssize_t n = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("{}: cannot read: {}", path, std::strerror(errno));
    }
    KVS_CHECK(n > 0, "{}: cannot read: file ended early (truncated while reading?)", path);
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
}

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
  }
  return "?";
}

DType dtype_from_name(const std::string& s, const std::string& origin) {
  static const DType all[] = {DType::F32, DType::F64, DType::BF16, DType::F16,
                              DType::I32, DType::I64, DType::U16,  DType::U8};
  for (DType d : all)
    if (s == dtype_name(d)) return d;
  fail("{}: unknown dtype '{}' (supported: F32, F64, BF16, F16, I32, I64, U16, U8)", origin, s);
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::BF16:
    case DType::F16:
    case DType::U16: return 2;
    case DType::U8: return 1;
  }
  return 0;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// ---------------------------------------------------------------------------
// Scalar conversions

uint16_t f32_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; overflows to inf correctly
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in fp32.
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf / NaN (payload kept)
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// ---------------------------------------------------------------------------
// Tensor constructors and conversions

StTensor make_f32_tensor(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  StTensor t{name, DType::F32, shape, {}};
  t.bytes.resize(checked_nbytes(shape, DType::F32, fmt::format("tensor '{}'", name)));
  if (!t.bytes.empty()) std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}

StTensor make_i32_tensor(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data) {
  StTensor t{name, DType::I32, shape, {}};
  t.bytes.resize(checked_nbytes(shape, DType::I32, fmt::format("tensor '{}'", name)));
  if (!t.bytes.empty()) std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}

StTensor make_bf16_tensor(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  StTensor t{name, DType::BF16, shape, {}};
  t.bytes.resize(checked_nbytes(shape, DType::BF16, fmt::format("tensor '{}'", name)));
  const size_t n = t.bytes.size() / 2;
  for (size_t i = 0; i < n; ++i) {
    uint16_t h = f32_to_bf16(data[i]);
    std::memcpy(t.bytes.data() + 2 * i, &h, 2);
  }
  return t;
}

namespace {

// n elements of a float dtype at p, as fp32.
void convert_to_f32(DType d, const uint8_t* p, size_t n, float* out, const std::string& name) {
  switch (d) {
    case DType::F32:
      if (n) std::memcpy(out, p, n * 4);
      break;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(load_le<double>(p + 8 * i));
      break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load_le<uint16_t>(p + 2 * i));
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_le<uint16_t>(p + 2 * i));
      break;
    default:
      fail("tensor '{}': cannot convert {} to fp32 (expected F32, F64, BF16 or F16)", name, dtype_name(d));
  }
}

}  // namespace

void check_finite_values(const std::vector<float>& v, const std::string& file, const std::string& name,
                         const char* why) {
  for (size_t i = 0; i < v.size(); ++i)
    KVS_CHECK(std::isfinite(v[i]), "{}: tensor '{}' element {} is {} ({})", file, name, i, v[i], why);
}

std::vector<float> tensor_to_f32(const StTensor& t) {
  check_bytes(t);
  std::vector<float> out(t.bytes.size() / dtype_size(t.dtype));
  convert_to_f32(t.dtype, t.bytes.data(), out.size(), out.data(), t.name);
  return out;
}

std::vector<int32_t> tensor_to_i32(const StTensor& t) {
  check_bytes(t);
  const size_t n = t.bytes.size() / dtype_size(t.dtype);
  const uint8_t* p = t.bytes.data();
  std::vector<int32_t> out(n);
  switch (t.dtype) {
    case DType::I32:
      if (n) std::memcpy(out.data(), p, n * 4);
      break;
    case DType::I64:
      for (size_t i = 0; i < n; ++i) {
        int64_t v = load_le<int64_t>(p + 8 * i);
        KVS_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
                  "tensor '{}': element {} = {} does not fit in int32", t.name, i, v);
        out[i] = static_cast<int32_t>(v);
      }
      break;
    case DType::U16:
      for (size_t i = 0; i < n; ++i) out[i] = load_le<uint16_t>(p + 2 * i);
      break;
    case DType::U8:
      for (size_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    default:
      fail("tensor '{}': cannot convert {} to int32 (expected I32, I64, U16 or U8)", t.name, dtype_name(t.dtype));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Writer

void write_safetensors_streamed(const std::string& path, const std::vector<StTensor>& headers,
                                const TensorDataWriter& write_data,
                                const std::map<std::string, std::string>& metadata) {
  ojson header = ojson::object();
  if (!metadata.empty()) {
    ojson m = ojson::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> names;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const StTensor& t : headers) {
    KVS_CHECK(t.name != "__metadata__", "{}: cannot write: '__metadata__' is reserved and cannot name a tensor", path);
    KVS_CHECK(names.insert(t.name).second, "{}: cannot write: duplicate tensor name '{}'", path, t.name);
    const uint64_t nbytes = checked_nbytes(t.shape, t.dtype, fmt::format("{}: cannot write: tensor '{}'", path, t.name));
    ojson e = ojson::object();
    e["dtype"] = dtype_name(t.dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {offset, offset + nbytes};
    header[t.name] = std::move(e);
    offset += nbytes;
    sizes.push_back(nbytes);
  }
  std::string hs;
  try {
    hs = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: cannot write: a tensor name or metadata entry is not valid UTF-8 ({})", path, one_line_error_text(e));
  }
  // Pad with spaces so the data region starts 8-byte aligned (as the reference writer).
  hs.append((8 - hs.size() % 8) % 8, ' ');
  uint8_t len_le[8];
  const uint64_t n = hs.size();
  std::memcpy(len_le, &n, 8);

  atomic_write_file_stream(path, [&](const ByteSink& sink) {
    sink(len_le, 8);
    sink(hs.data(), hs.size());
    for (size_t i = 0; i < headers.size(); ++i) {
      uint64_t written = 0;
      write_data(i, [&](const void* data, size_t size) {
        KVS_CHECK(written + size <= sizes[i], "{}: cannot write: tensor '{}' got more than its {} bytes of data", path,
                  headers[i].name, sizes[i]);
        written += size;
        if (size) sink(data, size);
      });
      KVS_CHECK(written == sizes[i], "{}: cannot write: tensor '{}' got {} bytes of data, expected {}", path,
                headers[i].name, written, sizes[i]);
    }
  });
}

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  for (const StTensor& t : tensors) {
    const uint64_t nbytes = checked_nbytes(t.shape, t.dtype, fmt::format("{}: cannot write: tensor '{}'", path, t.name));
    KVS_CHECK(t.bytes.size() == nbytes, "{}: cannot write: tensor '{}' has {} bytes of data, expected {} for shape {} of {}",
              path, t.name, t.bytes.size(), nbytes, shape_str(t.shape), dtype_name(t.dtype));
  }
  write_safetensors_streamed(
      path, tensors, [&](size_t i, const auto& sink) { sink(tensors[i].bytes.data(), tensors[i].bytes.size()); },
      metadata);
}

// ---------------------------------------------------------------------------
// Reader

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail("{}: cannot read: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail("{}: cannot read: {}", path, std::strerror(errno));
  KVS_CHECK(!S_ISDIR(st.st_mode), "{}: cannot read: is a directory", path);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  KVS_CHECK(file_size >= 8, "{}: not a safetensors file: {} bytes, expected at least 8 (the header length)", path,
            file_size);

  uint8_t len_le[8];
  pread_all(fd.fd, len_le, 8, 0, path);
  const uint64_t hlen = load_le<uint64_t>(len_le);
  KVS_CHECK(hlen <= file_size - 8,
            "{}: header length {} exceeds the {} bytes after the length field (truncated or not a safetensors file)",
            path, hlen, file_size - 8);
  KVS_CHECK(hlen <= kMaxHeaderBytes, "{}: header length {} is implausibly large (limit {} bytes)", path, hlen,
            kMaxHeaderBytes);
  std::string hs(hlen, '\0');
  pread_all(fd.fd, hs.data(), hlen, 8, path);
  const uint64_t data_start = 8 + hlen;
  const uint64_t data_size = file_size - data_start;

  // Parse, noting duplicate top-level keys (nlohmann would silently keep one).
  std::set<std::string> seen;
  std::string duplicate;
  ojson header;
  try {
    header = ojson::parse(hs, [&](int depth, ojson::parse_event_t ev, ojson& parsed) {
      if (depth == 1 && ev == ojson::parse_event_t::key && parsed.is_string()) {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
      }
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    fail("{}: header is not valid JSON: {}", path, one_line_error_text(e));
  }
  KVS_CHECK(header.is_object(), "{}: header must be a JSON object, got {}", path, header.type_name());
  KVS_CHECK(duplicate.empty(), "{}: duplicate tensor name '{}' in header", path, duplicate);

  struct Entry {
    StTensor t;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  std::map<std::string, std::string> meta;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      KVS_CHECK(v.is_object(), "{}: __metadata__ must be an object of strings, got {}", path, v.type_name());
      for (const auto& [k, mv] : v.items()) {
        KVS_CHECK(mv.is_string(), "{}: __metadata__ entry '{}' must be a string, got {}", path, k, mv.type_name());
        meta[k] = mv.get<std::string>();
      }
      continue;
    }
    const std::string origin = fmt::format("{}: tensor '{}'", path, name);
    KVS_CHECK(v.is_object(), "{}: entry must be an object with dtype, shape, data_offsets", origin);
    KVS_CHECK(v.contains("dtype") && v["dtype"].is_string(), "{}: missing or non-string 'dtype'", origin);
    KVS_CHECK(v.contains("shape") && v["shape"].is_array(), "{}: missing 'shape' or it is not an array", origin);
    KVS_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
              "{}: missing 'data_offsets' or it is not a [begin, end] pair", origin);
    Entry e;
    e.t.name = name;
    e.t.dtype = dtype_from_name(v["dtype"].get<std::string>(), origin);
    for (const auto& d : v["shape"]) {
      KVS_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                "{}: shape must be an array of non-negative integers, got {}", origin, v["shape"].dump());
      uint64_t du = d.get<uint64_t>();
      KVS_CHECK(du <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "{}: shape {} is too large", origin,
                v["shape"].dump());
      e.t.shape.push_back(static_cast<int64_t>(du));
    }
    for (const auto& o : v["data_offsets"])
      KVS_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
                "{}: data_offsets must be two non-negative integers, got {}", origin, v["data_offsets"].dump());
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    const uint64_t nbytes = checked_nbytes(e.t.shape, e.t.dtype, origin);
    KVS_CHECK(e.begin <= e.end && e.end - e.begin == nbytes,
              "{}: data_offsets [{}, {}] do not match shape {} of {} ({} bytes)", origin, e.begin, e.end,
              shape_str(e.t.shape), dtype_name(e.t.dtype), nbytes);
    KVS_CHECK(e.end <= data_size, "{}: data_offsets [{}, {}] extend past the end of the data region ({} bytes)", origin,
              e.begin, e.end, data_size);
    entries.push_back(std::move(e));
  }

  // The data region must be exactly tiled by the tensors: no overlap, no gap.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    KVS_CHECK(e.begin >= pos, "{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", path, e.t.name,
              e.begin, e.end, prev ? prev->t.name : "", prev ? prev->begin : 0, prev ? prev->end : 0);
    KVS_CHECK(e.begin == pos, "{}: gap in the data region: bytes [{}, {}) before tensor '{}' belong to no tensor", path,
              pos, e.begin, e.t.name);
    pos = e.end;
    prev = &e;
  }
  KVS_CHECK(pos == data_size, "{}: data region has {} trailing bytes after offset {} that belong to no tensor", path,
            data_size - pos, pos);

  for (Entry& e : entries) {
    index_[e.t.name] = tensors_.size();
    begin_.push_back(e.begin);
    tensors_.push_back(std::move(e.t));
  }
  metadata_ = std::move(meta);
  data_start_ = data_start;
  fd_ = fd.fd;
  fd.fd = -1;  // kept open for the reads to come
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      data_start_(o.data_start_),
      tensors_(std::move(o.tensors_)),
      begin_(std::move(o.begin_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)),
      bytes_read_(o.bytes_read_) {}

const StTensor* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<uint8_t> SafetensorsReader::read_bytes(const StTensor& t) const {
  const size_t i = static_cast<size_t>(&t - tensors_.data());
  KVS_CHECK(i < tensors_.size(), "{}: read_bytes: '{}' is not one of this file's tensors", path_, t.name);
  std::vector<uint8_t> bytes(checked_nbytes(t.shape, t.dtype, t.name));
  if (!bytes.empty()) pread_all(fd_, bytes.data(), bytes.size(), data_start_ + begin_[i], path_);
  bytes_read_ += bytes.size();
  return bytes;
}

void SafetensorsReader::read_f32(const StTensor& t, uint64_t first, uint64_t n, float* out) const {
  const size_t i = static_cast<size_t>(&t - tensors_.data());
  KVS_CHECK(i < tensors_.size(), "{}: read_f32: '{}' is not one of this file's tensors", path_, t.name);
  KVS_CHECK(first <= static_cast<uint64_t>(t.numel()) && n <= static_cast<uint64_t>(t.numel()) - first,
            "{}: tensor '{}': elements [{}, {}) are outside its {}", path_, t.name, first, first + n, t.numel());
  if (n == 0) return;
  const size_t size = dtype_size(t.dtype);
  const uint64_t at = data_start_ + begin_[i] + first * size;
  if (t.dtype == DType::F32) {
    pread_all(fd_, out, n * 4, at, path_);
  } else {
    std::vector<uint8_t> raw(n * size);
    pread_all(fd_, raw.data(), raw.size(), at, path_);
    convert_to_f32(t.dtype, raw.data(), n, out, t.name);
  }
  bytes_read_ += n * size;
}

std::vector<StTensor> SafetensorsReader::read_all() const {
  std::vector<StTensor> out = tensors_;
  for (size_t i = 0; i < out.size(); ++i) out[i].bytes = read_bytes(tensors_[i]);
  return out;
}

std::vector<StTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const SafetensorsReader r(path);
  if (metadata) *metadata = r.metadata();
  return r.read_all();
}

}  // namespace kvs
