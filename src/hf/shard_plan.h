// Splitting a model file into shards the way Hugging Face does: tensors in
// order, a new shard when the next tensor would pass the size limit.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvs::hf {

// "5GB" (10^9), "500MB", "2GiB" (2^30), "123" bytes, ... ; throws naming `what`.
uint64_t parse_size(const std::string& text, const std::string& what);

// Groups of consecutive indices into `bytes`; a tensor bigger than the limit
// gets a shard of its own.
std::vector<std::vector<size_t>> plan_shards(const std::vector<uint64_t>& bytes, uint64_t limit);

// "model-00001-of-00003.safetensors"
std::string shard_file_name(size_t index, size_t count);

}  // namespace kvs::hf
