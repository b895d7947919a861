// Minimal .npy (NumPy format 1.0) writer for float32 arrays, so other tools
// can read kvshift's outputs with numpy.load.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

}  // namespace kvs
