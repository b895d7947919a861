// Reading and writing the safetensors format (Hugging Face): an 8-byte
// little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensor bytes. Used for model weights, optimizer
// state and test/debug batches.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvs {

enum class DType { F32, F64, BF16, F16, I32, I64, U16, U8 };

const char* dtype_name(DType d);          // "F32", "BF16", ...
DType dtype_from_name(const std::string& s, const std::string& origin);  // throws naming origin
size_t dtype_size(DType d);

struct StTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // numel * dtype_size

  int64_t numel() const;
};

StTensor make_f32_tensor(const std::string& name, const std::vector<int64_t>& shape, const float* data);
StTensor make_i32_tensor(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data);
// fp32 -> BF16 with round-to-nearest-even (NaN stays NaN, overflow gives inf),
// for compact exports.
StTensor make_bf16_tensor(const std::string& name, const std::vector<int64_t>& shape, const float* data);
// Scalar conversions used by the above (exposed for kernels and tests).
uint16_t f32_to_bf16(float x);   // round to nearest even, NaN preserved (quieted)
float bf16_to_f32(uint16_t h);   // exact: upper 16 bits of fp32
float f16_to_f32(uint16_t h);    // exact IEEE half incl. subnormals, inf, NaN
// Converts F32/F64/BF16/F16 data to fp32 (throws for integer dtypes).
std::vector<float> tensor_to_f32(const StTensor& t);
// Throws "<file>: tensor '<name>' element <i> is nan (<why>)" at the first NaN or infinity.
void check_finite_values(const std::vector<float>& v, const std::string& file, const std::string& name,
                         const char* why);
std::vector<int32_t> tensor_to_i32(const StTensor& t);  // from I32/I64/U16/U8 (range-checked)

// Writes atomically (temp file in the same directory, fsync, rename). Tensors are
// stored in the given order; metadata goes to "__metadata__".
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same file, with the data arriving tensor by tensor: `headers` give the
// names, dtypes and shapes (their bytes are not used), and write_data(i, sink)
// must write tensor i's bytes, exactly, into `sink`. For files larger than the
// memory at hand (train/tensor_stream.h).
using TensorDataWriter = std::function<void(size_t index, const std::function<void(const void*, size_t)>& sink)>;
void write_safetensors_streamed(const std::string& path, const std::vector<StTensor>& headers,
                                const TensorDataWriter& write_data,
                                const std::map<std::string, std::string>& metadata = {});
// Reads and validates the whole file: header size within the file, JSON well-formed,
// every dtype known, offsets contiguous, in range and matching shape*dtype size.
// Errors name the file (and the tensor).
std::vector<StTensor> read_safetensors(const std::string& path,
                                       std::map<std::string, std::string>* metadata = nullptr);

// One file opened for reading tensors, or runs of their elements, when asked:
// the header is read and validated as read_safetensors does, the data only on
// request, so a rank loads its slice of a checkpoint without holding the file.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& o) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) = delete;
  SafetensorsReader(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor's name, dtype and shape (bytes empty), in file order.
  const std::vector<StTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const StTensor* find(const std::string& name) const;  // nullptr if absent
  // All of tensor `t`'s bytes (t one of tensors()).
  std::vector<uint8_t> read_bytes(const StTensor& t) const;
  // Every tensor with its bytes, in file order (what read_safetensors returns).
  std::vector<StTensor> read_all() const;
  // Elements [first, first + n) of float tensor `t` (F32/F64/BF16/F16) as fp32.
  void read_f32(const StTensor& t, uint64_t first, uint64_t n, float* out) const;
  // Data bytes read so far (tests: a slice reads only its own part).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<StTensor> tensors_;
  std::vector<uint64_t> begin_;  // each tensor's first data byte, relative to data_start_
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  mutable uint64_t bytes_read_ = 0;
};

}  // namespace kvs
