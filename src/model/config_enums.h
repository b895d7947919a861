// The values of the config's enum-valued keys (docs/CONFIG.md). Each enum has
// one table of its names, enum_names(E), and everything else comes from it:
// parsing (parse_enum, with the "must be ..." message listing the names in the
// table's order), to_json, fmt and ostream printing. Light on purpose (no
// config structs, no JSON parser), so engines and kernels can take these types.
#pragma once
#include <fmt/format.h>

#include <array>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace kvs {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

// device: the backend that trains.
enum class Device { Cpu, Cuda };
constexpr auto enum_names(Device) {
  using E = Device;
  return std::to_array<EnumName<E>>({{E::Cpu, "cpu"}, {E::Cuda, "cuda"}});
}

// model.position_encoding: rotary, or none at all (NoPE, the paper's Theorem 2 setting).
enum class PositionEncoding { Rope, None };
constexpr auto enum_names(PositionEncoding) {
  using E = PositionEncoding;
  return std::to_array<EnumName<E>>({{E::Rope, "rope"}, {E::None, "none"}});
}

// model.rope_scaling.rope_type: Hugging Face's names; "llama3" is Llama 3's
// frequency-dependent scaling (the other types of transformers are refused).
enum class RopeType { Default, Llama3 };
constexpr auto enum_names(RopeType) {
  using E = RopeType;
  return std::to_array<EnumName<E>>({{E::Default, "default"}, {E::Llama3, "llama3"}});
}

// model.kv_shift.parametrization: how the stored shift tensors become coefficients.
enum class ShiftParametrization { Free, SigmoidGate, Clamp01 };
constexpr auto enum_names(ShiftParametrization) {
  using E = ShiftParametrization;
  return std::to_array<EnumName<E>>({{E::Free, "free"}, {E::SigmoidGate, "sigmoid_gate"}, {E::Clamp01, "clamp01"}});
}

// model.document_boundaries: what a BOS token inside a packed sequence restarts.
enum class DocumentBoundaries { None, Shift, ShiftAndAttention };
constexpr auto enum_names(DocumentBoundaries) {
  using E = DocumentBoundaries;
  return std::to_array<EnumName<E>>(
      {{E::None, "none"}, {E::Shift, "shift"}, {E::ShiftAndAttention, "shift_and_attention"}});
}

// data.type: a generated task or token shards.
enum class DatasetType { Induction, Ngram, Hopk, Shards };
constexpr auto enum_names(DatasetType) {
  using E = DatasetType;
  return std::to_array<EnumName<E>>(
      {{E::Induction, "induction"}, {E::Ngram, "ngram"}, {E::Hopk, "hopk"}, {E::Shards, "shards"}});
}

// train.schedule: the learning rate after warmup (train/schedule.h).
enum class LrSchedule { Constant, Cosine, Linear, Wsd };
constexpr auto enum_names(LrSchedule) {
  using E = LrSchedule;
  return std::to_array<EnumName<E>>(
      {{E::Constant, "constant"}, {E::Cosine, "cosine"}, {E::Linear, "linear"}, {E::Wsd, "wsd"}});
}

// train.decay_shape: how "wsd" decays from lr to min_lr in its last train.decay_steps.
enum class LrDecayShape { Linear, Cosine, OneMinusSqrt };
constexpr auto enum_names(LrDecayShape) {
  using E = LrDecayShape;
  return std::to_array<EnumName<E>>({{E::Linear, "linear"}, {E::Cosine, "cosine"}, {E::OneMinusSqrt, "1-sqrt"}});
}

// train.recompute: which activations the CUDA engine recomputes in the backward.
enum class Recompute { None, Attention, Full };
constexpr auto enum_names(Recompute) {
  using E = Recompute;
  return std::to_array<EnumName<E>>({{E::None, "none"}, {E::Attention, "attention"}, {E::Full, "full"}});
}

// train.attention_backend: the CUDA engine's attention kernels. Flash: ours,
// on wgmma (the Hopper kernels) where the build and GPU have them
// (flash_hopper_available) and their self-check passes, on mma.sync
// elsewhere. FlashMma: ours on mma.sync everywhere. Cudnn: cuDNN's SDPA.
enum class AttentionImpl { Flash, Cudnn, FlashMma };
constexpr auto enum_names(AttentionImpl) {
  using E = AttentionImpl;
  return std::to_array<EnumName<E>>({{E::Flash, "flash"}, {E::Cudnn, "cudnn"}, {E::FlashMma, "flash-mma"}});
}

// train.stop_signal: besides SIGTERM and SIGINT, the signal that stops a run
// after a checkpoint (SLURM's --signal before a time limit; docs/RELIABILITY.md).
enum class StopSignal { Usr1, Usr2, Hup, None };
constexpr auto enum_names(StopSignal) {
  using E = StopSignal;
  return std::to_array<EnumName<E>>({{E::Usr1, "SIGUSR1"}, {E::Usr2, "SIGUSR2"}, {E::Hup, "SIGHUP"}, {E::None, "none"}});
}

// An enum with a name table (an enum_names overload that ADL finds).
template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) { enum_names(e); };

template <NamedEnum E>
constexpr std::string_view to_string(E e) {
  for (const auto& n : enum_names(e))
    if (n.value == e) return n.name;
  return "?";  // a value outside the enumerators (a cast integer)
}

template <NamedEnum E>
constexpr std::optional<E> enum_from_string(std::string_view name) {
  for (const auto& n : enum_names(E{}))
    if (n.name == name) return n.value;
  return std::nullopt;
}

// The names the way messages list them: "\"a\" or \"b\"", "\"a\", \"b\" or \"c\"".
template <NamedEnum E>
std::string enum_choices(char quote = '"') {
  const auto names = enum_names(E{});
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += quote;
    out += names[i].name;
    out += quote;
  }
  return out;
}

// `text` as an E, or kvs::Error "<origin>: <key>: must be \"a\" or \"b\", got \"<text>\"".
template <NamedEnum E>
E parse_enum(std::string_view text, std::string_view origin, std::string_view key) {
  if (auto e = enum_from_string<E>(text)) return *e;
  fail("{}: {}: must be {}, got \"{}\"", origin, key, enum_choices<E>(), text);
}

template <NamedEnum E>
std::ostream& operator<<(std::ostream& os, E e) {
  return os << to_string(e);
}

}  // namespace kvs

// fmt prints the name ("{}" of Device::Cuda is "cuda").
template <kvs::NamedEnum E>
struct fmt::formatter<E> : fmt::formatter<std::string_view> {
  template <class FormatContext>
  auto format(E e, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(kvs::to_string(e), ctx);
  }
};

// nlohmann::json writes the name. There is no from_json on purpose: reading
// goes through parse_enum, whose message names the key and the allowed values.
namespace nlohmann {
template <kvs::NamedEnum E>
struct adl_serializer<E> {
  template <class Json>
  static void to_json(Json& j, E e) {
    j = std::string(kvs::to_string(e));
  }
};
}  // namespace nlohmann
