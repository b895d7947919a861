#include "core/npy.h"

#include <string>

#include "core/fs.h"

namespace kvs {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  size_t n = 1;
  for (auto d : shape) {
    dims += std::to_string(d) + ", ";
    n *= static_cast<size_t>(d);
  }
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // (3,) keeps its comma, (3, 4) does not
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header + '\n' is padded to a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(data), n * sizeof(float));
  atomic_write_file(path, out);
}

}  // namespace kvs
