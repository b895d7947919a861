#include "train/model_io.h"

#include <cstring>

#include "core/error.h"

namespace kvs {

std::vector<StTensor> tensors_from_flat(const ParamLayout& layout, const std::vector<float>& flat,
                                        const std::string& prefix) {
  std::vector<StTensor> out;
  out.reserve(layout.tensors.size());
  for (const auto& t : layout.tensors) out.push_back(make_f32_tensor(prefix + t.name, t.shape, flat.data() + t.offset));
  return out;
}

void flat_from_tensors(const ParamLayout& layout, const std::vector<StTensor>& tensors, const std::string& prefix,
                       const std::string& file, std::vector<float>& flat) {
  flat.resize(layout.total);
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (const auto& t : layout.tensors) expected.emplace_back(prefix + t.name, t.shape);
  validate_model_tensors(tensors, expected, file);
  for (const auto& st : tensors) {
    const ParamTensor* t = layout.find(st.name.substr(prefix.size()));
    const std::vector<float> v = tensor_to_f32(st);
    std::memcpy(flat.data() + t->offset, v.data(), v.size() * sizeof(float));
  }
}

std::vector<StTensor> model_tensors(const Engine& e) {
  std::vector<float> flat(e.layout().total);
  e.read_params(flat.data());
  return tensors_from_flat(e.layout(), flat, "");
}

std::vector<StTensor> optimizer_tensors(const Engine& e) {
  std::vector<float> m(e.layout().total), v(e.layout().total);
  e.read_optimizer_state(m.data(), v.data());
  return optimizer_tensors(e.layout(), m, v);
}

std::vector<StTensor> optimizer_tensors(const ParamLayout& layout, const std::vector<float>& m,
                                        const std::vector<float>& v) {
  auto out = tensors_from_flat(layout, m, "exp_avg.");
  auto sq = tensors_from_flat(layout, v, "exp_avg_sq.");
  for (auto& t : sq) out.push_back(std::move(t));
  return out;
}

void load_model_tensors(Engine& e, const std::vector<StTensor>& tensors, const std::string& file) {
  std::vector<float> flat(e.layout().total);
  flat_from_tensors(e.layout(), tensors, "", file, flat);
  e.write_params(flat.data());
}

void moments_from_tensors(const ParamLayout& layout, const std::vector<StTensor>& tensors, const std::string& file,
                          std::vector<float>& exp_avg, std::vector<float>& exp_avg_sq) {
  std::vector<StTensor> m, v;
  for (const auto& t : tensors) {
    if (t.name.rfind("exp_avg_sq.", 0) == 0)
      v.push_back(t);
    else
      m.push_back(t);  // exp_avg.* and anything unexpected (reported by the check below)
  }
  flat_from_tensors(layout, m, "exp_avg.", file, exp_avg);
  flat_from_tensors(layout, v, "exp_avg_sq.", file, exp_avg_sq);
}

void load_optimizer_tensors(Engine& e, const std::vector<StTensor>& tensors, const std::string& file) {
  std::vector<float> fm, fv;
  moments_from_tensors(e.layout(), tensors, file, fm, fv);
  e.write_optimizer_state(fm.data(), fv.data());
}

LoadedCheckpoint read_checkpoint(const std::string& dir) {
  LoadedCheckpoint c;
  c.dir = dir;
  c.data = load_checkpoint(dir);
  c.model = model_from_hf_json(c.data.hf_config, dir + "/config.json");
  return c;
}

}  // namespace kvs
