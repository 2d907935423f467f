#include "plan/plan_json.h"

#include <fmt/core.h>

#include <array>
#include <cmath>
#include <limits>

#include "base/json_util.h"

namespace sluice {
namespace {

using nlohmann::json;

constexpr int64_t kMaxId = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxAmount = kPlanMaxAmount;
constexpr int64_t kMaxLen = kPlanMaxIndex;

constexpr std::string_view kRecomputeNames[] = {"none", "selective", "full"};
constexpr const std::string_view (&kCostKeys)[6] = kPlanCostKeys;

json ShapesToJson(const std::vector<TensorShape>& shapes) {
  json out = json::array();
  for (const TensorShape& t : shapes) out.push_back(t);
  return out;
}

json InstructionToJson(const Instruction& in) {
  json j = {{"op", OpKindName(in.op)}};
  auto opt = [&](const char* key, int64_t v) {
    if (v >= 0) j[key] = v;
  };
  opt("mb", in.microbatch);
  opt("stage", in.stage);
  opt("peer", in.peer);
  opt("tag", in.tag);
  opt("bucket", in.bucket);
  if (!in.shapes.empty()) j["shapes"] = ShapesToJson(in.shapes);
  if (!in.inputs.empty()) j["in"] = in.inputs;
  if (!in.outputs.empty()) j["out"] = in.outputs;
  if (in.bytes.count() != 0) j["bytes"] = in.bytes.count();
  if (in.recompute != Recompute::kNone) j["rc"] = RecomputeName(in.recompute);
  if (in.duration.nanos() != 0) j["ns"] = in.duration.nanos();
  opt("layer", in.layer);
  if (!in.group.empty()) j["group"] = in.group;
  if (!in.send_splits.empty()) j["send"] = in.send_splits;
  if (!in.recv_splits.empty()) j["recv"] = in.recv_splits;
  opt("seg", in.segment);
  opt("chunk", in.chunk);
  if (in.chunks > 0) j["chunks"] = in.chunks;
  return j;
}

json MicroBatchToJson(const PlanMicroBatch& mb) {
  json stages = json::array();
  for (const ChunkCost& c : mb.stages) {
    stages.push_back({{kCostKeys[0], c.forward.nanos()},
                      {kCostKeys[1], c.backward_input.nanos()},
                      {kCostKeys[2], c.backward_weight.nanos()},
                      {kCostKeys[3], c.stored.count()},
                      {kCostKeys[4], c.peak.count()},
                      {kCostKeys[5], c.stored_until_w.count()}});
  }
  json j = {{"rows", mb.rows},
            {"mbs", mb.shape.mbs},
            {"seqlen", mb.shape.seqlen},
            {"recompute", RecomputeName(mb.recompute)},
            {"stages", std::move(stages)}};
  if (mb.shape.dec_seqlen != 0) j["dec_seqlen"] = mb.shape.dec_seqlen;
  if (mb.varlen) j["varlen"] = true;
  if (!mb.seg_lens.empty()) j["seg_lens"] = mb.seg_lens;
  if (!mb.dec_seg_lens.empty()) j["dec_seg_lens"] = mb.dec_seg_lens;
  return j;
}

std::string Describe(const json& v) {
  const std::string s = JsonPreview(v);
  const char* type = v.is_number_integer() || v.is_number_unsigned() ? "integer"
                     : v.is_number_float()                           ? "number"
                                                                     : v.type_name();
  return fmt::format("{} {}", type, s);
}

// Reads whole numbers as JsonObjectReader does (4 and 4.0, not 4.5 or "4").
bool AsInt(const json& v, int64_t* out) {
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(kMaxId)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) >= 9e15) return false;
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

// Field-path errors in the form json_util.h uses; the path is built only on failure.
class Errors {
 public:
  explicit Errors(std::string_view source) : source_(source) {}
  const std::string& source() const { return source_; }

  Status At(const std::string& path, std::string_view problem) const {
    return InvalidArgumentError(fmt::format("{}: field '{}': {}", source_, path, problem));
  }
  template <typename PathFn>
  Status Int(const json& v, const PathFn& path, int64_t min, int64_t max, int64_t* out) const {
    if (AsInt(v, out) && *out >= min && *out <= max) return Status::Ok();
    return At(path(), fmt::format("must be an integer in [{}, {}], got {}", min, max, Describe(v)));
  }
  template <typename PathFn>
  Status Ints(const json& v, const PathFn& path, int64_t min, int64_t max,
              std::vector<int64_t>* out) const {
    if (!v.is_array()) return At(path(), fmt::format("must be an array, got {}", Describe(v)));
    out->resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      SLUICE_RETURN_IF_ERROR(Int(
          v[i], [&] { return fmt::format("{}[{}]", path(), i); }, min, max, &(*out)[i]));
    }
    return Status::Ok();
  }
  template <typename PathFn>
  Status Array(const json* v, const PathFn& path) const {
    if (v == nullptr) return At(path(), "is required (an array)");
    if (!v->is_array()) return At(path(), fmt::format("must be an array, got {}", Describe(*v)));
    return Status::Ok();
  }

 private:
  std::string source_;
};

Status ReadShapes(const Errors& e, const json& v, const std::string& path,
                  std::vector<TensorShape>* out) {
  if (!v.is_array())
    return e.At(path, fmt::format("must be an array of shapes, got {}", Describe(v)));
  out->resize(v.size());
  for (size_t t = 0; t < v.size(); ++t) {
    SLUICE_RETURN_IF_ERROR(e.Ints(
        v[t], [&] { return fmt::format("{}[{}]", path, t); }, 0, kMaxAmount, &(*out)[t]));
  }
  return Status::Ok();
}

// Instruction `index` of the list at `list_path` (paths are built only for messages).
Status ReadInstruction(const Errors& e, const json& j, const std::string& list_path, size_t index,
                       Instruction* in) {
  auto base = [&] { return fmt::format("{}[{}]", list_path, index); };
  auto path = [&](std::string_view key) { return fmt::format("{}.{}", base(), key); };
  if (!j.is_object()) return e.At(base(), fmt::format("must be an object, got {}", Describe(j)));
  bool has_op = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    auto p = [&] { return path(key); };
    if (key == "op") {
      const std::optional<OpKind> op =
          v.is_string() ? OpKindFromName(v.get_ref<const std::string&>()) : std::nullopt;
      if (!op)
        return e.At(p(), fmt::format("must be an op name (docs/formats.md), got {}", Describe(v)));
      in->op = *op;
      has_op = true;
    } else if (key == "mb") {
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxLen, &in->microbatch));
    } else if (key == "stage") {
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxLen, &in->stage));
    } else if (key == "peer") {
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxLen, &in->peer));
    } else if (key == "tag") {
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxId, &in->tag));
    } else if (key == "bucket") {
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxLen, &in->bucket));
    } else if (key == "shapes") {
      SLUICE_RETURN_IF_ERROR(ReadShapes(e, v, p(), &in->shapes));
    } else if (key == "in") {
      SLUICE_RETURN_IF_ERROR(e.Ints(v, p, 0, kMaxLen, &in->inputs));
    } else if (key == "out") {
      SLUICE_RETURN_IF_ERROR(e.Ints(v, p, 0, kMaxLen, &in->outputs));
    } else if (key == "bytes") {
      int64_t b = 0;
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxAmount, &b));
      in->bytes = Bytes::Of(b);
    } else if (key == "rc") {
      StatusOr<Recompute> rc = v.is_string() ? ParseRecompute(v.get_ref<const std::string&>())
                                             : StatusOr<Recompute>(InvalidArgumentError(""));
      if (!rc.ok() || *rc == Recompute::kNone) {
        return e.At(p(), fmt::format("must be 'selective' or 'full' (omit it for 'none'), got {}",
                                     Describe(v)));
      }
      in->recompute = *rc;
    } else if (key == "ns") {
      int64_t ns = 0;
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxAmount, &ns));
      in->duration = Duration::Nanos(ns);
    } else if (key == "layer") {
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxLen, &in->layer));
    } else if (key == "group") {
      SLUICE_RETURN_IF_ERROR(e.Ints(v, p, 0, kMaxLen, &in->group));
    } else if (key == "send") {
      SLUICE_RETURN_IF_ERROR(e.Ints(v, p, 0, kMaxAmount, &in->send_splits));
    } else if (key == "recv") {
      SLUICE_RETURN_IF_ERROR(e.Ints(v, p, 0, kMaxAmount, &in->recv_splits));
    } else if (key == "seg") {
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxLen, &in->segment));
    } else if (key == "chunk") {
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 0, kMaxLen, &in->chunk));
    } else if (key == "chunks") {
      SLUICE_RETURN_IF_ERROR(e.Int(v, p, 1, kMaxLen, &in->chunks));
    } else {
      return e.At(p(),
                  "unknown key; allowed: 'op', 'mb', 'stage', 'peer', 'tag', 'bucket', "
                  "'shapes', 'in', 'out', 'bytes', 'rc', 'ns', 'layer', 'group', 'send', 'recv', "
                  "'seg', 'chunk', 'chunks'");
    }
  }
  if (!has_op) return e.At(path("op"), "is required (an op name)");
  return Status::Ok();
}

Status ReadCost(const Errors& e, const json& j, const std::string& base, ChunkCost* c) {
  if (!j.is_object() || j.size() != 6) {
    return e.At(base, fmt::format("must be an object with exactly the keys '{}', '{}', '{}', "
                                  "'{}', '{}' and '{}'",
                                  kCostKeys[0], kCostKeys[1], kCostKeys[2], kCostKeys[3],
                                  kCostKeys[4], kCostKeys[5]));
  }
  std::array<int64_t, 6> v{};
  for (size_t k = 0; k < 6; ++k) {
    const auto it = j.find(kCostKeys[k]);
    auto p = [&] { return fmt::format("{}.{}", base, kCostKeys[k]); };
    if (it == j.end()) return e.At(p(), "is required (an integer)");
    SLUICE_RETURN_IF_ERROR(e.Int(*it, p, 0, kMaxAmount, &v[k]));
  }
  *c = {Duration::Nanos(v[0]), Duration::Nanos(v[1]), Duration::Nanos(v[2]),
        Bytes::Of(v[3]),       Bytes::Of(v[4]),       Bytes::Of(v[5])};
  return Status::Ok();
}

Status ReadMicroBatch(const Errors& e, const json& j, const std::string& base, PlanMicroBatch* mb) {
  JsonObjectReader r(j, e.source(), base);
  SLUICE_RETURN_IF_ERROR(r.status());
  SLUICE_RETURN_IF_ERROR(r.Int("mbs", &mb->shape.mbs, 1, kMaxLen));
  SLUICE_RETURN_IF_ERROR(r.Int("seqlen", &mb->shape.seqlen, 1, kMaxLen));
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("dec_seqlen", &mb->shape.dec_seqlen, 1, kMaxLen));
  SLUICE_RETURN_IF_ERROR(r.OptionalBool("varlen", &mb->varlen));
  std::string rc;
  SLUICE_RETURN_IF_ERROR(r.Enum("recompute", &rc, kRecomputeNames));
  mb->recompute = *ParseRecompute(rc);
  const json* rows = r.Child("rows");
  SLUICE_RETURN_IF_ERROR(e.Array(rows, [&] { return r.FieldPath("rows"); }));
  mb->rows.resize(rows->size());
  for (size_t i = 0; i < rows->size(); ++i) {
    SLUICE_RETURN_IF_ERROR(e.Ints((*rows)[i],
                                  [&] { return fmt::format("{}[{}]", r.FieldPath("rows"), i); },
                                  std::numeric_limits<int64_t>::min(), kMaxId, &mb->rows[i]));
  }
  for (const auto& field : {std::pair{"seg_lens", &mb->seg_lens},
                            std::pair{"dec_seg_lens", &mb->dec_seg_lens}}) {
    // Not a structured binding: lambdas cannot capture those before C++20 (clang-14).
    const char* const key = field.first;
    std::vector<std::vector<int64_t>>* const lens = field.second;
    const json* list = r.Child(key);
    if (list == nullptr) continue;
    SLUICE_RETURN_IF_ERROR(e.Array(list, [&] { return r.FieldPath(key); }));
    lens->resize(list->size());
    for (size_t i = 0; i < list->size(); ++i) {
      // A decoder segment may be empty (a sample without a target).
      SLUICE_RETURN_IF_ERROR(e.Ints((*list)[i],
                                    [&] { return fmt::format("{}[{}]", r.FieldPath(key), i); },
                                    lens == &mb->seg_lens ? 1 : 0, kMaxLen, &(*lens)[i]));
    }
  }
  const json* stages = r.Child("stages");
  SLUICE_RETURN_IF_ERROR(e.Array(stages, [&] { return r.FieldPath("stages"); }));
  mb->stages.resize(stages->size());
  for (size_t s = 0; s < stages->size(); ++s) {
    SLUICE_RETURN_IF_ERROR(
        ReadCost(e, (*stages)[s], fmt::format("{}[{}]", r.FieldPath("stages"), s), &mb->stages[s]));
  }
  return r.Finish();
}

Status ReadRank(const Errors& e, const json& j, const std::string& base, RankProgram* p) {
  JsonObjectReader r(j, e.source(), base);
  SLUICE_RETURN_IF_ERROR(r.status());
  SLUICE_RETURN_IF_ERROR(r.Int("rank", &p->rank, 0, kMaxLen));
  SLUICE_RETURN_IF_ERROR(r.Int("dp", &p->dp_index, 0, kMaxLen));
  SLUICE_RETURN_IF_ERROR(r.Int("pp", &p->pp_index, 0, kMaxLen));
  SLUICE_RETURN_IF_ERROR(r.Int("buffer_slots", &p->buffer_slots, 0, kMaxLen));
  const json* list = r.Child("instructions");
  SLUICE_RETURN_IF_ERROR(e.Array(list, [&] { return r.FieldPath("instructions"); }));
  p->instructions.resize(list->size());
  const std::string prefix = r.FieldPath("instructions");
  for (size_t i = 0; i < list->size(); ++i) {
    SLUICE_RETURN_IF_ERROR(ReadInstruction(e, (*list)[i], prefix, i, &p->instructions[i]));
  }
  return r.Finish();
}

}  // namespace

json PlanToJson(const ExecutionPlan& plan) {
  json dropped = json::array();
  for (const UnplacedSample& s : plan.dropped)
    dropped.push_back({{"id", s.id}, {"reason", s.reason}});
  json states = json::array();
  for (Bytes b : plan.model_states) states.push_back(b.count());
  json replicas = json::array();
  for (const PlanReplica& rep : plan.replicas) {
    json mbs = json::array();
    for (const PlanMicroBatch& mb : rep.micro_batches) mbs.push_back(MicroBatchToJson(mb));
    replicas.push_back({{"schedule", rep.schedule}, {"micro_batches", std::move(mbs)}});
  }
  json ranks = json::array();
  for (const RankProgram& p : plan.ranks) {
    json list = json::array();
    for (const Instruction& in : p.instructions) list.push_back(InstructionToJson(in));
    ranks.push_back({{"rank", p.rank},
                     {"dp", p.dp_index},
                     {"pp", p.pp_index},
                     {"buffer_slots", p.buffer_slots},
                     {"instructions", std::move(list)}});
  }
  json out = {{"format", kPlanFormat},
              {"model", ModelSpecToJson(plan.model)},
              {"cluster", ClusterSpecToJson(plan.cluster)},
              {"parallel", ParallelConfigToJson(plan.parallel)},
              {"cost_model", plan.cost_model},
              {"method", plan.method},
              {"sample_ids", plan.sample_ids},
              {"dropped", std::move(dropped)},
              {"model_states_bytes", std::move(states)},
              {"replicas", std::move(replicas)},
              {"ranks", std::move(ranks)}};
  if (plan.moe_slice_overhead.has_value()) {
    out["moe_slice_overhead_ns"] = plan.moe_slice_overhead->nanos();
  }
  return out;
}

StatusOr<ExecutionPlan> PlanFromJson(const json& j, std::string_view source) {
  const Errors e(source);
  JsonObjectReader r(j, std::string(source));
  SLUICE_RETURN_IF_ERROR(r.status());
  std::string format;
  SLUICE_RETURN_IF_ERROR(r.String("format", &format));
  if (format != kPlanFormat) {
    return r.Error("format", fmt::format("this build reads '{}', got '{}'", kPlanFormat, format));
  }
  ExecutionPlan plan;
  const json* model = r.Child("model");
  const json* cluster = r.Child("cluster");
  const json* parallel = r.Child("parallel");
  if (model == nullptr || cluster == nullptr || parallel == nullptr) {
    return r.Error(model == nullptr     ? "model"
                   : cluster == nullptr ? "cluster"
                                        : "parallel",
                   "is required (an object)");
  }
  SLUICE_ASSIGN_OR_RETURN(plan.model, ModelSpecFromJson(*model, fmt::format("{} (model)", source)));
  SLUICE_ASSIGN_OR_RETURN(plan.cluster,
                          ClusterSpecFromJson(*cluster, fmt::format("{} (cluster)", source)));
  SLUICE_ASSIGN_OR_RETURN(plan.parallel,
                          ParallelConfigFromJson(*parallel, fmt::format("{} (parallel)", source)));
  SLUICE_RETURN_IF_ERROR(r.String("cost_model", &plan.cost_model));
  int64_t slice_overhead_ns = -1;
  SLUICE_RETURN_IF_ERROR(r.OptionalInt("moe_slice_overhead_ns", &slice_overhead_ns, 0, kMaxAmount));
  if (slice_overhead_ns >= 0) plan.moe_slice_overhead = Duration::Nanos(slice_overhead_ns);
  SLUICE_RETURN_IF_ERROR(r.String("method", &plan.method));
  const json* ids = r.Child("sample_ids");
  SLUICE_RETURN_IF_ERROR(e.Array(ids, [] { return std::string("sample_ids"); }));
  SLUICE_RETURN_IF_ERROR(e.Ints(
      *ids, [] { return std::string("sample_ids"); }, std::numeric_limits<int64_t>::min(), kMaxId,
      &plan.sample_ids));
  const json* dropped = r.Child("dropped");
  SLUICE_RETURN_IF_ERROR(e.Array(dropped, [] { return std::string("dropped"); }));
  for (size_t i = 0; i < dropped->size(); ++i) {
    JsonObjectReader d((*dropped)[i], std::string(source), fmt::format("dropped[{}]", i));
    UnplacedSample s;
    SLUICE_RETURN_IF_ERROR(d.status());
    SLUICE_RETURN_IF_ERROR(d.Int("id", &s.id, std::numeric_limits<int64_t>::min(), kMaxId));
    SLUICE_RETURN_IF_ERROR(d.String("reason", &s.reason));
    SLUICE_RETURN_IF_ERROR(d.Finish());
    plan.dropped.push_back(std::move(s));
  }
  const json* states = r.Child("model_states_bytes");
  std::vector<int64_t> state_bytes;
  SLUICE_RETURN_IF_ERROR(e.Array(states, [] { return std::string("model_states_bytes"); }));
  SLUICE_RETURN_IF_ERROR(e.Ints(
      *states, [] { return std::string("model_states_bytes"); }, 0, kMaxAmount, &state_bytes));
  for (int64_t b : state_bytes) plan.model_states.push_back(Bytes::Of(b));
  const json* replicas = r.Child("replicas");
  SLUICE_RETURN_IF_ERROR(e.Array(replicas, [] { return std::string("replicas"); }));
  plan.replicas.resize(replicas->size());
  for (size_t d = 0; d < replicas->size(); ++d) {
    const std::string base = fmt::format("replicas[{}]", d);
    JsonObjectReader rr((*replicas)[d], std::string(source), base);
    SLUICE_RETURN_IF_ERROR(rr.status());
    SLUICE_RETURN_IF_ERROR(rr.String("schedule", &plan.replicas[d].schedule));
    const json* mbs = rr.Child("micro_batches");
    SLUICE_RETURN_IF_ERROR(e.Array(mbs, [&] { return rr.FieldPath("micro_batches"); }));
    auto& out = plan.replicas[d].micro_batches;
    out.resize(mbs->size());
    for (size_t i = 0; i < mbs->size(); ++i) {
      SLUICE_RETURN_IF_ERROR(
          ReadMicroBatch(e, (*mbs)[i], fmt::format("{}.micro_batches[{}]", base, i), &out[i]));
    }
    SLUICE_RETURN_IF_ERROR(rr.Finish());
  }
  const json* ranks = r.Child("ranks");
  SLUICE_RETURN_IF_ERROR(e.Array(ranks, [] { return std::string("ranks"); }));
  plan.ranks.resize(ranks->size());
  for (size_t i = 0; i < ranks->size(); ++i) {
    SLUICE_RETURN_IF_ERROR(ReadRank(e, (*ranks)[i], fmt::format("ranks[{}]", i), &plan.ranks[i]));
  }
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return plan;
}

std::string PlanToJsonText(const ExecutionPlan& plan, int indent) {
  // Strings that are not UTF-8 (which no reader produces) become U+FFFD instead of throwing.
  return PlanToJson(plan).dump(indent, ' ', false, json::error_handler_t::replace);
}

StatusOr<ExecutionPlan> PlanFromJsonText(std::string_view text, std::string_view source) {
  SLUICE_ASSIGN_OR_RETURN(const json j, ParseJson(text, source));
  return PlanFromJson(j, source);
}

Status WritePlanFile(const ExecutionPlan& plan, const std::string& path) {
  const std::string_view ext = ".msgpack";
  if (path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
    const std::vector<uint8_t> bytes = PlanToMsgpack(plan);
    return WriteStringToFile(
        path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }
  return WriteStringToFile(path, PlanToJsonText(plan) + "\n");
}

StatusOr<ExecutionPlan> ReadPlanFile(const std::string& path) {
  SLUICE_ASSIGN_OR_RETURN(const std::string contents, ReadFileToString(path, kMaxPlanFileBytes, "a plan file"));
  const size_t first = contents.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && contents[first] == '{') return PlanFromJsonText(contents, path);
  // MessagePack documents begin with a map (fixmap 0x80-0x8f, map16 0xde, map32 0xdf).
  const uint8_t lead = contents.empty() ? 0 : static_cast<uint8_t>(contents[0]);
  if ((lead & 0xf0) != 0x80 && lead != 0xde && lead != 0xdf) {
    return InvalidArgumentError(fmt::format(
        "{}: not a plan file: {}; allowed: a sluice-plan/1 plan as JSON (an object, '{{') or "
        "MessagePack (a map), as `sluice plan --out` writes",
        path,
        first == std::string::npos ? "the file is empty"
                                   : "it begins with neither '{' nor a MessagePack map"));
  }
  return PlanFromMsgpack(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(contents.data()), contents.size()),
      path);
}

}  // namespace sluice
