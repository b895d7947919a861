#include "train/rank_agreement.h"

#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "train/checkpoint_manifest.h"

namespace kvs {

bool same_on_every_rank(uint64_t h, dist::Communicator& comm) {
  if (comm.size() == 1) return true;
  const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
  double v[4] = {hi, lo, -hi, -lo};  // max of each half, and minus its min
  comm.all_reduce(v, 4, dist::DType::F64, dist::ReduceOp::Max);
  return v[0] == -v[2] && v[1] == -v[3];
}

void check_same_config_on_every_rank(const Config& config, dist::Communicator& comm) {
  if (comm.size() == 1) return;
  nlohmann::json j = to_json(config);
  if (j.contains("train") && j["train"].is_object()) j["train"].erase("threads");
  const uint64_t h = hash_name(j.dump());  // FNV-1a over the JSON text: the same on every rank's build
  KVS_CHECK(same_on_every_rank(h, comm),
            "rank {}/{}: the ranks were started with different configs (this rank's hash {:016x} is not every "
            "rank's): give every rank the same config file and --set overrides",
            comm.rank(), comm.size(), h);
}

uint64_t checkpoint_identity(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path manifest = fs::path(dir) / kManifestFile;
  std::error_code ec;
  if (fs::exists(manifest, ec)) return hash_name(read_file(manifest.string()));
  std::string what;
  for (const char* name : {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"}) {
    const auto size = fs::file_size(fs::path(dir) / name, ec);
    what += std::string(name) + ":" + (ec ? "-" : std::to_string(size)) + ";";
  }
  const fs::path state = fs::path(dir) / "trainer_state.json";
  if (fs::exists(state, ec)) what += read_file(state.string());
  return hash_name(what);
}

}  // namespace kvs
