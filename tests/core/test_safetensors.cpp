// Safetensors I/O and the crash-safe file helpers (core/safetensors.h, core/fs.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"
#include "core/fs.h"
#include "core/safetensors.h"

namespace {

namespace fs = std::filesystem;

using kvs::testing_util::error_of;
using kvs::testing_util::slurp;
using kvs::testing_util::spit;
using kvs::testing_util::TmpDir;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

// A raw safetensors file from a header string and a data region.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  spit(path, le64(header.size()) + header + data);
}

std::vector<uint8_t> pattern_bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + 31 * i + (i >> 3));
  return b;
}

kvs::StTensor raw_tensor(const std::string& name, kvs::DType d, std::vector<int64_t> shape, uint8_t seed) {
  kvs::StTensor t{name, d, std::move(shape), {}};
  t.bytes = pattern_bytes(static_cast<size_t>(t.numel()) * kvs::dtype_size(d), seed);
  return t;
}

uint32_t f32_bits(float x) { return std::bit_cast<uint32_t>(x); }
float bits_f32(uint32_t u) { return std::bit_cast<float>(u); }

bool have_python() { return ::access("/usr/bin/python3", X_OK) == 0; }

}  // namespace

// ---------------------------------------------------------------------------
// Round trips and the byte layout

TEST(Safetensors, RoundTripEveryDtypeWithMetadataAndZeroSize) {
  TmpDir dir;
  using kvs::DType;
  std::vector<kvs::StTensor> ts = {
      raw_tensor("z.f32", DType::F32, {2, 3}, 1),     raw_tensor("a.f64", DType::F64, {3}, 2),
      raw_tensor("m.bf16", DType::BF16, {4, 1}, 3),   raw_tensor("b.f16", DType::F16, {5}, 4),
      raw_tensor("i32", DType::I32, {2, 2}, 5),       raw_tensor("i64", DType::I64, {1, 1, 3}, 6),
      raw_tensor("u16", DType::U16, {7}, 7),          raw_tensor("u8", DType::U8, {3, 3}, 8),
      raw_tensor("empty", DType::F32, {0, 4}, 9),     raw_tensor("scalar", DType::F64, {}, 10),
      raw_tensor("empty2", DType::BF16, {0}, 11),
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"kvshift.step", "12"}, {"note", "\"quoted\" ünïcode"}};
  const std::string path = dir / "t.safetensors";
  kvs::write_safetensors(path, ts, meta);

  std::map<std::string, std::string> got_meta;
  auto got = kvs::read_safetensors(path, &got_meta);
  ASSERT_EQ(got.size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {  // file order == the order given to the writer
    EXPECT_EQ(got[i].name, ts[i].name);
    EXPECT_EQ(got[i].dtype, ts[i].dtype) << ts[i].name;
    EXPECT_EQ(got[i].shape, ts[i].shape) << ts[i].name;
    EXPECT_EQ(got[i].bytes, ts[i].bytes) << ts[i].name;
  }
  EXPECT_EQ(got_meta, meta);
  EXPECT_EQ(got[9].numel(), 1);  // scalar
  EXPECT_EQ(got[8].numel(), 0);

  // Nothing else left in the directory (no temp files).
  int n = 0;
  for (auto& e : fs::directory_iterator(dir.str())) n += (e.path().filename() != "t.safetensors");
  EXPECT_EQ(n, 0);
}

TEST(Safetensors, EmptyFileHasNoTensors) {
  TmpDir dir;
  kvs::write_safetensors(dir / "e.safetensors", {});
  std::map<std::string, std::string> meta{{"stale", "x"}};
  EXPECT_TRUE(kvs::read_safetensors(dir / "e.safetensors", &meta).empty());
  EXPECT_TRUE(meta.empty());
  EXPECT_EQ(slurp(dir / "e.safetensors"), le64(8) + "{}      ");
}

TEST(Safetensors, ByteLayoutMatchesTheFormat) {
  TmpDir dir;
  float w[6] = {1, 2, 3, 4, 5, 6};
  int32_t ids[3] = {7, -8, 9};
  std::vector<kvs::StTensor> ts = {kvs::make_f32_tensor("lm_head.weight", {2, 3}, w),
                                   kvs::make_i32_tensor("ids", {3}, ids),
                                   kvs::make_f32_tensor("b", {0}, nullptr)};
  const std::string path = dir / "l.safetensors";
  kvs::write_safetensors(path, ts);
  std::string f = slurp(path);
  ASSERT_GE(f.size(), 8u);
  uint64_t n;
  std::memcpy(&n, f.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header padded so the data starts 8-byte aligned";
  ASSERT_EQ(f.size(), 8 + n + 24 + 12);
  std::string header = f.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - 1 - last, 8u) << "padding is fewer than 8 spaces";
  auto j = nlohmann::ordered_json::parse(header);
  EXPECT_FALSE(j.contains("__metadata__")) << "no __metadata__ when there is none";
  std::vector<std::string> keys;
  for (auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"lm_head.weight", "ids", "b"}));
  EXPECT_EQ(j["lm_head.weight"]["dtype"], "F32");
  EXPECT_EQ(j["lm_head.weight"]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(j["lm_head.weight"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(j["ids"]["dtype"], "I32");
  EXPECT_EQ(j["ids"]["data_offsets"], nlohmann::json::array({24, 36}));
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({36, 36}));
  // Little-endian payload, contiguous from the start of the data region.
  EXPECT_EQ(std::memcmp(f.data() + 8 + n, w, 24), 0);
  const unsigned char neg8[4] = {0xf8, 0xff, 0xff, 0xff};
  EXPECT_EQ(std::memcmp(f.data() + 8 + n + 24 + 4, neg8, 4), 0);

  // With metadata, __metadata__ is present and maps strings to strings.
  kvs::write_safetensors(path, ts, {{"format", "pt"}});
  f = slurp(path);
  std::memcpy(&n, f.data(), 8);
  j = nlohmann::json::parse(f.substr(8, n));
  EXPECT_EQ(j["__metadata__"], (nlohmann::json{{"format", "pt"}}));
}

TEST(Safetensors, ReadsFileWrittenByPythonStdlib) {
  if (!have_python()) GTEST_SKIP() << "/usr/bin/python3 not available";
  TmpDir dir;
  const std::string script = dir / "w.py";
  const std::string path = dir / "py.safetensors";
  spit(script, R"PY(
import json, struct, sys
tensors = [
    ("model.w", "F32", [2, 3], struct.pack("<6f", 1, 2, 3, 4, 5, -6.5)),
    ("ids", "I64", [3], struct.pack("<3q", -1, 0, 2**31 - 1)),
    ("half", "F16", [3], struct.pack("<3H", 0x3C00, 0xC100, 0x0001)),
    ("bh", "BF16", [2], struct.pack("<2H", 0x3F80, 0xC020)),
    ("bytes", "U8", [4], bytes([0, 1, 254, 255])),
    ("u16", "U16", [1], struct.pack("<H", 65535)),
    ("empty", "F32", [0], b""),
    ("d", "F64", [], struct.pack("<d", 0.1)),
]
header = {"__metadata__": {"format": "pt", "source": "python"}}
off, data = 0, b""
for name, dt, shape, b in tensors:
    header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
    off += len(b)
    data += b
h = json.dumps(header).encode()  # unpadded: readers must accept any header length
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
)PY");
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " " + path).c_str()), 0);

  std::map<std::string, std::string> meta;
  auto ts = kvs::read_safetensors(path, &meta);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"format", "pt"}, {"source", "python"}}));
  ASSERT_EQ(ts.size(), 8u);
  EXPECT_EQ(ts[0].name, "model.w");
  EXPECT_EQ(ts[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(kvs::tensor_to_f32(ts[0]), (std::vector<float>{1, 2, 3, 4, 5, -6.5f}));
  EXPECT_EQ(ts[1].dtype, kvs::DType::I64);
  EXPECT_EQ(kvs::tensor_to_i32(ts[1]), (std::vector<int32_t>{-1, 0, 2147483647}));
  auto half = kvs::tensor_to_f32(ts[2]);
  EXPECT_EQ(half[0], 1.0f);
  EXPECT_EQ(half[1], -2.5f);
  EXPECT_EQ(half[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(kvs::tensor_to_f32(ts[3]), (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(kvs::tensor_to_i32(ts[4]), (std::vector<int32_t>{0, 1, 254, 255}));
  EXPECT_EQ(kvs::tensor_to_i32(ts[5]), (std::vector<int32_t>{65535}));
  EXPECT_EQ(ts[6].numel(), 0);
  EXPECT_TRUE(ts[7].shape.empty());
  EXPECT_EQ(kvs::tensor_to_f32(ts[7]), (std::vector<float>{0.1f}));
}

TEST(Safetensors, PythonStdlibReadsOurFile) {
  if (!have_python()) GTEST_SKIP() << "/usr/bin/python3 not available";
  TmpDir dir;
  float w[4] = {0.5f, -1.25f, 3.0f, 1e-3f};
  int32_t ids[2] = {-3, 70000};
  const std::string path = dir / "ours.safetensors";
  kvs::write_safetensors(path,
                         {kvs::make_f32_tensor("w", {2, 2}, w), kvs::make_i32_tensor("ids", {2}, ids),
                          kvs::make_bf16_tensor("wb", {4}, w)},
                         {{"k", "v"}});
  const std::string script = dir / "r.py";
  spit(script, R"PY(
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert n % 8 == 0, "header not padded to 8"
header = json.loads(raw[8:8 + n].decode("utf-8"))
data = raw[8 + n:]
assert header.pop("__metadata__") == {"k": "v"}
pos = 0
out = []
for name, e in header.items():
    b, end = e["data_offsets"]
    assert b == pos, "not contiguous"
    pos = end
    fmt = {"F32": "f", "I32": "i", "BF16": "H"}[e["dtype"]]
    vals = struct.unpack("<%d%s" % ((end - b) // struct.calcsize(fmt), fmt), data[b:end])
    out.append([name, e["dtype"], e["shape"], list(vals)])
assert pos == len(data), "data region not covered"
print(json.dumps(out))
)PY");
  const std::string out = dir / "out.json";
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " " + path + " > " + out).c_str()), 0);
  auto j = nlohmann::json::parse(slurp(out));
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0][0], "w");
  EXPECT_EQ(j[0][2], nlohmann::json::array({2, 2}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(j[0][3][i].get<float>(), w[i]);
  EXPECT_EQ(j[1][3], nlohmann::json::array({-3, 70000}));
  EXPECT_EQ(j[2][1], "BF16");
  EXPECT_EQ(j[2][3][0], 0x3F00);  // 0.5
  EXPECT_EQ(j[2][3][1], 0xBFA0);  // -1.25
  EXPECT_EQ(j[2][3][2], 0x4040);  // 3.0
}

TEST(Safetensors, ReadsEmbeddedKnownGoodFile) {
  // Hand-made: header {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} (54 bytes,
  // unpadded) followed by 1.0f, -2.0f.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(header.size(), 54u);
  const unsigned char bytes[] = {54, 0, 0, 0, 0, 0, 0, 0};
  const unsigned char data[] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};
  TmpDir dir;
  spit(dir / "k.safetensors", std::string(reinterpret_cast<const char*>(bytes), 8) + header +
                                  std::string(reinterpret_cast<const char*>(data), 8));
  auto ts = kvs::read_safetensors(dir / "k.safetensors");
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(kvs::tensor_to_f32(ts[0]), (std::vector<float>{1.0f, -2.0f}));
}

// ---------------------------------------------------------------------------
// Conversions

TEST(Safetensors, Bf16KnownBitPatterns) {
  EXPECT_EQ(kvs::f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(kvs::f32_to_bf16(-2.5f), 0xC020);
  EXPECT_EQ(kvs::f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(kvs::f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(kvs::f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(kvs::f32_to_bf16(-INFINITY), 0xFF80);
  // Ties go to even; above/below the tie round to nearest.
  EXPECT_EQ(kvs::f32_to_bf16(bits_f32(0x3F808000)), 0x3F80);  // tie, 0x3F80 even -> down
  EXPECT_EQ(kvs::f32_to_bf16(bits_f32(0x3F818000)), 0x3F82);  // tie, 0x3F81 odd -> up
  EXPECT_EQ(kvs::f32_to_bf16(bits_f32(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(kvs::f32_to_bf16(bits_f32(0x3F807FFF)), 0x3F80);  // just below the tie
  EXPECT_EQ(kvs::f32_to_bf16(bits_f32(0xBF818000)), 0xBF82);  // negative tie
  // Largest finite fp32 rounds up to inf; a subnormal stays subnormal.
  EXPECT_EQ(kvs::f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(kvs::f32_to_bf16(bits_f32(0x00010000)), 0x0001);
  EXPECT_EQ(kvs::f32_to_bf16(bits_f32(0x00018000)), 0x0002);  // subnormal tie to even
  // NaN stays NaN, even when its payload lives only in the dropped bits.
  EXPECT_TRUE(std::isnan(kvs::bf16_to_f32(kvs::f32_to_bf16(bits_f32(0x7F800001)))));
  EXPECT_TRUE(std::isnan(kvs::bf16_to_f32(kvs::f32_to_bf16(bits_f32(0xFFFFFFFF)))));
  EXPECT_TRUE(std::isnan(kvs::bf16_to_f32(kvs::f32_to_bf16(NAN))));
  EXPECT_EQ(kvs::f32_to_bf16(bits_f32(0x7FC00000)), 0x7FC0);

  EXPECT_EQ(kvs::bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(kvs::bf16_to_f32(0xC020), -2.5f);
  EXPECT_EQ(f32_bits(kvs::bf16_to_f32(0x0001)), 0x00010000u);
  EXPECT_EQ(kvs::bf16_to_f32(0xFF80), -INFINITY);
}

TEST(Safetensors, F16KnownBitPatterns) {
  EXPECT_EQ(kvs::f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(kvs::f16_to_f32(0xC100), -2.5f);
  EXPECT_EQ(kvs::f16_to_f32(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(kvs::f16_to_f32(0x8000)));
  EXPECT_EQ(kvs::f16_to_f32(0x0001), std::ldexp(1.0f, -24));        // smallest subnormal
  EXPECT_EQ(kvs::f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));     // largest subnormal
  EXPECT_EQ(kvs::f16_to_f32(0x8200), -std::ldexp(512.0f, -24));     // negative subnormal
  EXPECT_EQ(kvs::f16_to_f32(0x0400), std::ldexp(1.0f, -14));        // smallest normal
  EXPECT_EQ(kvs::f16_to_f32(0x7BFF), 65504.0f);                     // largest finite
  EXPECT_EQ(kvs::f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(kvs::f16_to_f32(0x7C00), INFINITY);
  EXPECT_EQ(kvs::f16_to_f32(0xFC00), -INFINITY);
  EXPECT_TRUE(std::isnan(kvs::f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(kvs::f16_to_f32(0x7C01)));  // signalling NaN stays NaN, not inf
}

TEST(Safetensors, TensorToF32FromEveryFloatDtype) {
  kvs::StTensor h{"h", kvs::DType::F16, {3}, {}};
  for (uint16_t v : {0x3C00, 0xC100, 0x0001}) h.bytes.insert(h.bytes.end(), {uint8_t(v & 0xff), uint8_t(v >> 8)});
  EXPECT_EQ(kvs::tensor_to_f32(h), (std::vector<float>{1.0f, -2.5f, std::ldexp(1.0f, -24)}));

  kvs::StTensor b{"b", kvs::DType::BF16, {2}, {0x80, 0x3F, 0x20, 0xC0}};
  EXPECT_EQ(kvs::tensor_to_f32(b), (std::vector<float>{1.0f, -2.5f}));

  double d[2] = {0.1, -1e300};
  kvs::StTensor f64{"d", kvs::DType::F64, {2}, std::vector<uint8_t>(16)};
  std::memcpy(f64.bytes.data(), d, 16);
  auto got = kvs::tensor_to_f32(f64);
  EXPECT_EQ(got[0], 0.1f);
  EXPECT_EQ(got[1], -INFINITY);

  float x[5] = {1.0f, -2.5f, 3.14159f, 1e-40f, 65504.0f};
  auto bt = kvs::make_bf16_tensor("x", {5}, x);
  EXPECT_EQ(bt.dtype, kvs::DType::BF16);
  EXPECT_EQ(bt.bytes.size(), 10u);
  auto back = kvs::tensor_to_f32(bt);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(back[i], x[i], std::fabs(x[i]) / 128 + std::ldexp(1.0f, -134)) << i;
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(f32_bits(back[3]), 0x00010000u);  // 1e-40 is subnormal: 0x000116C2 rounds to bf16 0x0001

  kvs::StTensor i32{"ids", kvs::DType::I32, {1}, {1, 0, 0, 0}};
  EXPECT_KVS_ERROR(kvs::tensor_to_f32(i32), "ids", "I32");
  kvs::StTensor bad{"bad", kvs::DType::F32, {3}, std::vector<uint8_t>(8)};
  EXPECT_KVS_ERROR(kvs::tensor_to_f32(bad), "bad", "8 bytes", "12");
}

// The reader behind checkpoint slices: any run of elements of any float
// dtype, as tensor_to_f32 gives the whole; errors name the file and tensor.
TEST(Safetensors, ReaderReadsRunsOfElementsAsF32) {
  TmpDir dir;
  const std::string path = dir / "r.safetensors";
  float x[12];
  for (int i = 0; i < 12; ++i) x[i] = 0.37f * static_cast<float>(i) - 1.5f;
  std::vector<kvs::StTensor> ts = {kvs::make_f32_tensor("f", {3, 4}, x), kvs::make_bf16_tensor("b", {12}, x),
                                   kvs::make_i32_tensor("ids", {1}, std::vector<int32_t>{7}.data())};
  kvs::StTensor h{"h", kvs::DType::F16, {3}, {}};
  for (uint16_t v : {0x3C00, 0xC100, 0x0001}) h.bytes.insert(h.bytes.end(), {uint8_t(v & 0xff), uint8_t(v >> 8)});
  ts.push_back(h);
  kvs::write_safetensors(path, ts, {{"k", "v"}});
  const kvs::SafetensorsReader r(path);
  EXPECT_EQ(r.metadata().at("k"), "v");
  ASSERT_EQ(r.tensors().size(), 4u);
  EXPECT_TRUE(r.tensors()[0].bytes.empty()) << "the header only, until asked";
  EXPECT_EQ(r.find("nope"), nullptr);
  EXPECT_EQ(r.bytes_read(), 0u);
  for (const char* name : {"f", "b", "h"}) {
    const kvs::StTensor& t = *r.find(name);
    const std::vector<float> whole = kvs::tensor_to_f32(kvs::read_safetensors(path)[&t - r.tensors().data()]);
    const uint64_t n = static_cast<uint64_t>(t.numel());
    for (uint64_t first = 0; first <= n; ++first)
      for (uint64_t k = 0; first + k <= n; ++k) {
        std::vector<float> got(k + 1, 99.0f);
        r.read_f32(t, first, k, got.data());
        for (uint64_t i = 0; i < k; ++i) ASSERT_EQ(got[i], whole[first + i]) << name << " " << first << "+" << i;
        ASSERT_EQ(got[k], 99.0f) << "wrote past the run";
      }
  }
  const uint64_t before = r.bytes_read();
  std::vector<float> two(2);
  r.read_f32(*r.find("b"), 5, 2, two.data());
  EXPECT_EQ(r.bytes_read() - before, 4u) << "two BF16 elements";
  EXPECT_KVS_ERROR(r.read_f32(*r.find("f"), 10, 3, two.data()), path, "'f'", "elements [10, 13)", "12");
  EXPECT_KVS_ERROR(r.read_f32(*r.find("ids"), 0, 1, two.data()), "'ids'", "I32");
  // Truncated after opening: a read past the end is an error naming the file, not garbage.
  ::truncate(path.c_str(), static_cast<off_t>(std::filesystem::file_size(path) - 4));
  EXPECT_KVS_ERROR(r.read_f32(*r.find("h"), 0, 3, two.data()), path, "file ended early");
}

TEST(Safetensors, TensorToI32RangeChecked) {
  int64_t v[3] = {-2147483648LL, 2147483647LL, 5};
  kvs::StTensor t{"ok", kvs::DType::I64, {3}, std::vector<uint8_t>(24)};
  std::memcpy(t.bytes.data(), v, 24);
  EXPECT_EQ(kvs::tensor_to_i32(t), (std::vector<int32_t>{-2147483647 - 1, 2147483647, 5}));
  int64_t big[2] = {1, 5000000000LL};
  kvs::StTensor b{"tokens", kvs::DType::I64, {2}, std::vector<uint8_t>(16)};
  std::memcpy(b.bytes.data(), big, 16);
  EXPECT_KVS_ERROR(kvs::tensor_to_i32(b), "tokens", "element 1", "5000000000");
  kvs::StTensor u16{"u", kvs::DType::U16, {2}, {0xff, 0xff, 0x01, 0x00}};
  EXPECT_EQ(kvs::tensor_to_i32(u16), (std::vector<int32_t>{65535, 1}));
  kvs::StTensor u8{"u8", kvs::DType::U8, {2}, {255, 7}};
  EXPECT_EQ(kvs::tensor_to_i32(u8), (std::vector<int32_t>{255, 7}));
  float f = 1.0f;
  EXPECT_KVS_ERROR(kvs::tensor_to_i32(kvs::make_f32_tensor("w", {1}, &f)), "w", "F32");
}

TEST(Safetensors, DtypeNamesAndSizes) {
  using kvs::DType;
  for (DType d : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U16, DType::U8})
    EXPECT_EQ(kvs::dtype_from_name(kvs::dtype_name(d), "x"), d);
  EXPECT_EQ(kvs::dtype_size(DType::BF16), 2u);
  EXPECT_EQ(kvs::dtype_size(DType::I64), 8u);
  EXPECT_KVS_ERROR(kvs::dtype_from_name("Q4", "my.origin"), "my.origin", "unknown dtype 'Q4'");
}

// ---------------------------------------------------------------------------
// Corruption: every error is one line naming the file (and the tensor)

TEST(Safetensors, CorruptFilesGiveErrorsNamingTheFile) {
  TmpDir dir;
  const std::string p = dir / "bad.safetensors";
  auto hdr = [](const std::string& body) { return "{" + body + "}"; };
  const std::string a24 = R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";

  EXPECT_KVS_ERROR(kvs::read_safetensors(dir / "nope.safetensors"), dir / "nope.safetensors", "cannot read");

  spit(p, "abc");
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "3 bytes", "at least 8");

  spit(p, le64(1000) + "{}");
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "header length 1000 exceeds");

  {  // Header length above the 100 MB sanity limit (sparse file, no real disk use).
    spit(p, le64(150'000'000) + "{}");
    fs::resize_file(p, 200'000'000);
    EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "implausibly large");
  }

  write_raw(p, "{\"a\": ", "");
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "not valid JSON");
  write_raw(p, "[1, 2]", "");
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "must be a JSON object");

  write_raw(p, hdr(R"("a":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]})"), "xx");
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'a'", "unknown dtype 'Q4'");
  write_raw(p, hdr(R"("a":{"shape":[2],"data_offsets":[0,8]})"), std::string(8, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'a'", "dtype");
  write_raw(p, hdr(R"("a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), std::string(8, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'a'", "shape");
  write_raw(p, hdr(R"("a":{"dtype":"F32","shape":"2","data_offsets":[0,8]})"), std::string(8, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'a'", "shape");
  write_raw(p, hdr(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0]})"), std::string(8, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'a'", "data_offsets");
  write_raw(p, hdr(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]})"), std::string(8, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'a'", "data_offsets");
  write_raw(p, hdr(R"("a": 5)"), "");
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'a'");
  write_raw(p, hdr(R"("__metadata__":{"k":1})"), "");
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "__metadata__", "'k'");

  // Offsets that disagree with the shape: the exact message.
  write_raw(p, hdr(R"("lm_head.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]})"), std::string(12, '\0'));
  EXPECT_EQ(error_of([&] { kvs::read_safetensors(p); }),
            p + ": tensor 'lm_head.weight': data_offsets [0, 12] do not match shape [2, 3] of F32 (24 bytes)");
  write_raw(p, hdr(R"("a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]})"), std::string(8, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'a'", "[8, 4]");

  // Truncated data: the offsets run past the end of the file.
  write_raw(p, hdr(a24), std::string(20, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'a'", "past the end");
  {  // A real file cut short, in the data and in the header.
    float w[6] = {};
    kvs::write_safetensors(p, {kvs::make_f32_tensor("w", {6}, w)});
    std::string full = slurp(p);
    spit(p, full.substr(0, full.size() - 1));
    EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "tensor 'w'");
    spit(p, full.substr(0, 20));
    EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "exceeds");
  }

  // Overlap, gap, trailing bytes.
  write_raw(p,
            hdr(a24 + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]})"),
            std::string(24, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "'b'", "overlap", "'a'");
  write_raw(p, hdr(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})"),
            std::string(8, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "overlap");
  write_raw(p,
            hdr(R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]})"),
            std::string(12, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "gap", "[4, 8)", "'b'");
  write_raw(p, hdr(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), std::string(8, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "gap", "[0, 4)");
  write_raw(p, hdr(a24), std::string(30, '\0'));
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "6 trailing bytes");

  // Duplicate names would silently drop a tensor.
  write_raw(p, hdr(R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]})"),
            "xy");
  EXPECT_KVS_ERROR(kvs::read_safetensors(p), p, "duplicate", "'a'");

  // Zero-size tensors sharing an offset are fine; padding spaces in the header are fine.
  write_raw(p,
            hdr(R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"f":{"dtype":"I64","shape":[0,5],"data_offsets":[4,4]})") +
                "   ",
            std::string(4, '\0'));
  auto ts = kvs::read_safetensors(p);
  ASSERT_EQ(ts.size(), 3u);
  EXPECT_EQ(ts[0].name, "a");
}

TEST(Safetensors, WriterRejectsInconsistentTensorsAndLeavesNoFile) {
  TmpDir dir;
  const std::string p = dir / "w.safetensors";
  kvs::StTensor bad{"x", kvs::DType::F32, {2, 2}, std::vector<uint8_t>(12)};
  EXPECT_KVS_ERROR(kvs::write_safetensors(p, {bad}), p, "tensor 'x'", "12 bytes");
  float f[1] = {1};
  EXPECT_KVS_ERROR(kvs::write_safetensors(p, {kvs::make_f32_tensor("a", {1}, f), kvs::make_f32_tensor("a", {1}, f)}), p,
               "duplicate", "'a'");
  EXPECT_KVS_ERROR(kvs::write_safetensors(p, {kvs::make_f32_tensor("__metadata__", {1}, f)}), p, "__metadata__");
  EXPECT_KVS_ERROR(kvs::write_safetensors(p, {kvs::make_f32_tensor("bad\xff", {1}, f)}), p, "UTF-8");
  EXPECT_TRUE(fs::is_empty(dir.str()));
  EXPECT_KVS_ERROR(kvs::write_safetensors(dir / "no/such/dir/x.safetensors", {}), dir / "no/such/dir/x.safetensors");
}

// ---------------------------------------------------------------------------
// fs helpers

TEST(Fs, AtomicWriteReplacesAndLeavesNoTemp) {
  TmpDir dir;
  const std::string p = dir / "f.txt";
  kvs::atomic_write_file(p, "first");
  EXPECT_EQ(kvs::read_file(p), "first");
  kvs::atomic_write_file(p, std::string("sec\0ond", 7));
  EXPECT_EQ(kvs::read_file(p), std::string("sec\0ond", 7));
  kvs::atomic_write_file(p, "");
  EXPECT_EQ(kvs::read_file(p), "");
  int n = 0;
  for (auto& e : fs::directory_iterator(dir.str())) n += (e.path().filename() != "f.txt");
  EXPECT_EQ(n, 0);
}

TEST(Fs, FailedStreamingWriteKeepsTheOldFile) {
  TmpDir dir;
  const std::string p = dir / "model.bin";
  kvs::atomic_write_file(p, "old contents");
  EXPECT_THROW(kvs::atomic_write_file_stream(p,
                                             [](const kvs::ByteSink& sink) {
                                               sink("new partial", 11);
                                               throw kvs::Error("simulated failure mid-write");
                                             }),
               kvs::Error);
  EXPECT_EQ(kvs::read_file(p), "old contents");
  EXPECT_FALSE(fs::exists(p + ".tmp." + std::to_string(::getpid())));
  kvs::atomic_write_file_stream(p, [](const kvs::ByteSink& sink) {
    sink("ab", 2);
    sink("cd", 2);
  });
  EXPECT_EQ(kvs::read_file(p), "abcd");
}

TEST(Fs, ErrorsNameThePath) {
  TmpDir dir;
  EXPECT_KVS_ERROR(kvs::read_file(dir / "missing"), dir / "missing", "cannot read", "No such file");
  EXPECT_KVS_ERROR(kvs::read_file(dir.str()), dir.str(), "cannot read");
  EXPECT_KVS_ERROR(kvs::atomic_write_file(dir / "nodir/x", "x"), dir / "nodir/x");
  EXPECT_KVS_ERROR(kvs::fsync_path(dir / "missing"), dir / "missing");
  kvs::make_dirs(dir / "a/b/c");
  EXPECT_TRUE(fs::is_directory(dir / "a/b/c"));
  kvs::make_dirs(dir / "a/b/c");  // already there: fine
  kvs::atomic_write_file(dir / "file", "x");
  EXPECT_KVS_ERROR(kvs::make_dirs(dir / "file/sub"), dir / "file/sub", "cannot create directory");
  EXPECT_KVS_ERROR(kvs::make_dirs(dir / "file"), dir / "file", "a file of that name is in the way");
  fs::create_directory_symlink(dir / "unmounted/scratch", dir / "link");  // a link to nothing
  EXPECT_KVS_ERROR(kvs::make_dirs(dir / "link"), dir / "link", "a symbolic link to " + (dir / "unmounted/scratch"),
                   "which does not exist");
  kvs::fsync_path(dir.str());
  kvs::fsync_path(dir / "file");
}
