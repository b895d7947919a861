// The piece strings of a sentencepiece model file (tokenizer.model), read
// straight from its protobuf wire format (ModelProto field 1, SentencePiece
// field 1) so export needs no sentencepiece or protobuf library.
#pragma once
#include <string>
#include <vector>

namespace kvs::hf {

std::vector<std::string> read_sentencepiece_pieces(const std::string& path);

}  // namespace kvs::hf
