// MessagePack form of sluice-plan/1 (plan_json.h): the JSON document, encoded and decoded
// directly between ExecutionPlan and bytes, without building a JSON tree for the bulky parts
// (micro-batches and instructions). The model, cluster and parallel objects go through their
// JSON forms (small). Any MessagePack encoding of the document is accepted: every integer width,
// whole floats where integers are due, keys in any order.
#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "plan/msgpack_codec.h"
#include "plan/plan_json.h"

namespace sluice {
namespace {

using nlohmann::json;

void WriteInstruction(MsgpackWriter& w, const Instruction& in) {
  const size_t n = 1 + (in.microbatch >= 0) + (in.stage >= 0) + (in.peer >= 0) + (in.tag >= 0) +
                   (in.bucket >= 0) + !in.shapes.empty() + !in.inputs.empty() +
                   !in.outputs.empty() + (in.bytes.count() != 0) +
                   (in.recompute != Recompute::kNone) + (in.duration.nanos() != 0) +
                   (in.layer >= 0) + !in.group.empty() + !in.send_splits.empty() +
                   !in.recv_splits.empty() + (in.segment >= 0) + (in.chunk >= 0) +
                   (in.chunks > 0);
  w.Map(n);
  w.Str("op");
  w.Str(OpKindName(in.op));
  auto opt = [&](std::string_view key, int64_t v) {
    if (v < 0) return;
    w.Str(key);
    w.Int(v);
  };
  opt("mb", in.microbatch);
  opt("stage", in.stage);
  opt("peer", in.peer);
  opt("tag", in.tag);
  opt("bucket", in.bucket);
  if (!in.shapes.empty()) {
    w.Str("shapes");
    w.Array(in.shapes.size());
    for (const TensorShape& t : in.shapes) w.Ints(t);
  }
  if (!in.inputs.empty()) {
    w.Str("in");
    w.Ints(in.inputs);
  }
  if (!in.outputs.empty()) {
    w.Str("out");
    w.Ints(in.outputs);
  }
  if (in.bytes.count() != 0) {
    w.Str("bytes");
    w.Int(in.bytes.count());
  }
  if (in.recompute != Recompute::kNone) {
    w.Str("rc");
    w.Str(RecomputeName(in.recompute));
  }
  if (in.duration.nanos() != 0) {
    w.Str("ns");
    w.Int(in.duration.nanos());
  }
  opt("layer", in.layer);
  for (const auto& [key, list] : {std::pair<std::string_view, const std::vector<int64_t>*>{
                                      "group", &in.group},
                                  {"send", &in.send_splits},
                                  {"recv", &in.recv_splits}}) {
    if (list->empty()) continue;
    w.Str(key);
    w.Ints(*list);
  }
  opt("seg", in.segment);
  opt("chunk", in.chunk);
  if (in.chunks > 0) opt("chunks", in.chunks);
}

void WriteMicroBatch(MsgpackWriter& w, const PlanMicroBatch& mb) {
  w.Map(5 + (mb.shape.dec_seqlen != 0) + mb.varlen + !mb.seg_lens.empty() +
        !mb.dec_seg_lens.empty());
  w.Str("rows");
  w.Array(mb.rows.size());
  for (const std::vector<int64_t>& row : mb.rows) w.Ints(row);
  w.Str("mbs");
  w.Int(mb.shape.mbs);
  w.Str("seqlen");
  w.Int(mb.shape.seqlen);
  if (mb.shape.dec_seqlen != 0) {
    w.Str("dec_seqlen");
    w.Int(mb.shape.dec_seqlen);
  }
  if (mb.varlen) {
    w.Str("varlen");
    w.Bool(true);
  }
  for (auto [key, lens] : {std::pair{"seg_lens", &mb.seg_lens},
                           std::pair{"dec_seg_lens", &mb.dec_seg_lens}}) {
    if (lens->empty()) continue;
    w.Str(key);
    w.Array(lens->size());
    for (const std::vector<int64_t>& row : *lens) w.Ints(row);
  }
  w.Str("recompute");
  w.Str(RecomputeName(mb.recompute));
  w.Str("stages");
  w.Array(mb.stages.size());
  for (const ChunkCost& c : mb.stages) {
    w.Map(6);
    const int64_t v[6] = {c.forward.nanos(), c.backward_input.nanos(), c.backward_weight.nanos(),
                          c.stored.count(),  c.peak.count(),           c.stored_until_w.count()};
    for (int k = 0; k < 6; ++k) {
      w.Str(kPlanCostKeys[k]);
      w.Int(v[k]);
    }
  }
}

// Messages in the JSON reader's form ("<source>: field '<path>': <problem>").
class Reader : public MsgpackReader {
 public:
  Reader(std::span<const uint8_t> bytes, std::string_view source)
      : MsgpackReader(bytes), source_(source) {}

  Status Error(const std::string& path, std::string_view problem) const {
    return InvalidArgumentError(fmt::format("{}: field '{}': {}", source_, path, problem));
  }
  Status Truncated() const {
    return InvalidArgumentError(fmt::format("{}: not a valid MessagePack document", source_));
  }

 private:
  std::string source_;
};

std::string Describe(std::string_view what) { return fmt::format("must be {}", what); }

template <typename PathFn>
Status ReadInt(Reader& r, const PathFn& path, int64_t min, int64_t max, int64_t* out) {
  if (r.Int(out) && *out >= min && *out <= max) return Status::Ok();
  return r.Error(path(), fmt::format("must be an integer in [{}, {}]", min, max));
}

template <typename PathFn>
Status ReadInts(Reader& r, const PathFn& path, int64_t min, int64_t max,
                std::vector<int64_t>* out) {
  size_t n = 0;
  if (!r.Container(false, &n)) return r.Error(path(), Describe("an array of integers"));
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    SLUICE_RETURN_IF_ERROR(ReadInt(
        r, [&] { return fmt::format("{}[{}]", path(), i); }, min, max, &(*out)[i]));
  }
  return Status::Ok();
}

template <typename PathFn>
Status ReadString(Reader& r, const PathFn& path, std::string* out) {
  std::string_view s;
  if (!r.Str(&s) || !ValidUtf8(s)) return r.Error(path(), Describe("a UTF-8 string"));
  *out = std::string(s);
  return Status::Ok();
}

Status ReadRecompute(Reader& r, const std::string& path, bool allow_none, Recompute* out) {
  std::string_view s;
  if (r.Str(&s)) {
    StatusOr<Recompute> rc = ParseRecompute(s);
    if (rc.ok() && (allow_none || *rc != Recompute::kNone)) {
      *out = *rc;
      return Status::Ok();
    }
  }
  return r.Error(path, allow_none ? "must be 'none', 'selective' or 'full'"
                                  : "must be 'selective' or 'full' (omit it for 'none')");
}

// Instruction `index` of the list at `list_path` (paths are built only for messages).
Status ReadInstruction(Reader& r, const std::string& list_path, size_t index, Instruction* in) {
  auto base = [&] { return fmt::format("{}[{}]", list_path, index); };
  size_t n = 0;
  if (!r.Container(true, &n)) return r.Error(base(), Describe("an object"));
  bool has_op = false;
  for (size_t k = 0; k < n; ++k) {
    std::string_view key;
    if (!r.Str(&key)) return r.Error(base(), "keys must be strings");
    auto p = [&] { return fmt::format("{}.{}", base(), key); };
    if (key == "op") {
      std::string_view name;
      const std::optional<OpKind> op = r.Str(&name) ? OpKindFromName(name) : std::nullopt;
      if (!op) return r.Error(p(), "must be an op name (docs/formats.md)");
      in->op = *op;
      has_op = true;
    } else if (key == "mb") {
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxIndex, &in->microbatch));
    } else if (key == "stage") {
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxIndex, &in->stage));
    } else if (key == "peer") {
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxIndex, &in->peer));
    } else if (key == "tag") {
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, std::numeric_limits<int64_t>::max(), &in->tag));
    } else if (key == "bucket") {
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxIndex, &in->bucket));
    } else if (key == "shapes") {
      size_t t = 0;
      if (!r.Container(false, &t)) return r.Error(p(), Describe("an array of shapes"));
      in->shapes.resize(t);
      for (size_t i = 0; i < t; ++i) {
        SLUICE_RETURN_IF_ERROR(ReadInts(
            r, [&] { return fmt::format("{}[{}]", p(), i); }, 0, kPlanMaxAmount, &in->shapes[i]));
      }
    } else if (key == "in") {
      SLUICE_RETURN_IF_ERROR(ReadInts(r, p, 0, kPlanMaxIndex, &in->inputs));
    } else if (key == "out") {
      SLUICE_RETURN_IF_ERROR(ReadInts(r, p, 0, kPlanMaxIndex, &in->outputs));
    } else if (key == "bytes") {
      int64_t b = 0;
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxAmount, &b));
      in->bytes = Bytes::Of(b);
    } else if (key == "rc") {
      SLUICE_RETURN_IF_ERROR(ReadRecompute(r, p(), false, &in->recompute));
    } else if (key == "ns") {
      int64_t ns = 0;
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxAmount, &ns));
      in->duration = Duration::Nanos(ns);
    } else if (key == "layer") {
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxIndex, &in->layer));
    } else if (key == "group") {
      SLUICE_RETURN_IF_ERROR(ReadInts(r, p, 0, kPlanMaxIndex, &in->group));
    } else if (key == "send") {
      SLUICE_RETURN_IF_ERROR(ReadInts(r, p, 0, kPlanMaxAmount, &in->send_splits));
    } else if (key == "recv") {
      SLUICE_RETURN_IF_ERROR(ReadInts(r, p, 0, kPlanMaxAmount, &in->recv_splits));
    } else if (key == "seg") {
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxIndex, &in->segment));
    } else if (key == "chunk") {
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxIndex, &in->chunk));
    } else if (key == "chunks") {
      SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 1, kPlanMaxIndex, &in->chunks));
    } else {
      return r.Error(p(),
                     "unknown key; allowed: 'op', 'mb', 'stage', 'peer', 'tag', 'bucket', "
                     "'shapes', 'in', 'out', 'bytes', 'rc', 'ns', 'layer', 'group', 'send', "
                     "'recv', 'seg', 'chunk', 'chunks'");
    }
  }
  if (!has_op) return r.Error(base() + ".op", "is required (an op name)");
  return Status::Ok();
}

// Reads a map whose keys are dispatched by `field(key, path, &known)` (`path()` builds the key's
// field path on demand; `known` = false for a key it does not take); `required` lists keys that
// must appear (at most 64).
template <typename Field>
Status ReadObject(Reader& r, const std::string& base,
                  std::initializer_list<std::string_view> required, const Field& field) {
  size_t n = 0;
  if (!r.Container(true, &n)) {
    return r.Error(base.empty() ? "(top level)" : base, Describe("an object"));
  }
  uint64_t seen = 0;
  std::vector<std::string_view> keys;  // a known key given twice is refused at its second place
  for (size_t k = 0; k < n; ++k) {
    std::string_view key;
    if (!r.Str(&key)) return r.Error(base, "keys must be strings");
    auto path = [&] { return base.empty() ? std::string(key) : fmt::format("{}.{}", base, key); };
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
      return r.Error(path(), "is given twice (each key may appear once)");
    }
    keys.push_back(key);
    bool known = true;
    SLUICE_RETURN_IF_ERROR(field(key, path, &known));
    if (!known) return r.Error(path(), "unknown key");
    size_t i = 0;
    for (std::string_view want : required) {
      if (want == key) seen |= uint64_t{1} << i;
      ++i;
    }
  }
  size_t i = 0;
  for (std::string_view want : required) {
    if ((seen & (uint64_t{1} << i)) == 0) {
      return r.Error(base.empty() ? std::string(want) : fmt::format("{}.{}", base, want),
                     "is required");
    }
    ++i;
  }
  return Status::Ok();
}

Status ReadMicroBatch(Reader& r, const std::string& base, PlanMicroBatch* mb) {
  return ReadObject(
      r, base, {"rows", "mbs", "seqlen", "recompute", "stages"},
      [&](std::string_view key, const auto& p, bool* known) -> Status {
        if (key == "rows") {
          size_t n = 0;
          if (!r.Container(false, &n)) return r.Error(p(), Describe("an array of rows"));
          mb->rows.resize(n);
          for (size_t i = 0; i < n; ++i) {
            SLUICE_RETURN_IF_ERROR(ReadInts(
                r, [&] { return fmt::format("{}[{}]", p(), i); },
                std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                &mb->rows[i]));
          }
          return Status::Ok();
        }
        if (key == "mbs") return ReadInt(r, p, 1, kPlanMaxIndex, &mb->shape.mbs);
        if (key == "seqlen") return ReadInt(r, p, 1, kPlanMaxIndex, &mb->shape.seqlen);
        if (key == "dec_seqlen") return ReadInt(r, p, 1, kPlanMaxIndex, &mb->shape.dec_seqlen);
        if (key == "varlen") {
          return r.Bool(&mb->varlen) ? Status::Ok() : r.Error(p(), Describe("a boolean"));
        }
        if (key == "seg_lens" || key == "dec_seg_lens") {
          std::vector<std::vector<int64_t>>* lens =
              key == "seg_lens" ? &mb->seg_lens : &mb->dec_seg_lens;
          size_t n = 0;
          if (!r.Container(false, &n)) return r.Error(p(), Describe("an array of rows"));
          lens->resize(n);
          for (size_t i = 0; i < n; ++i) {
            SLUICE_RETURN_IF_ERROR(ReadInts(
                r, [&] { return fmt::format("{}[{}]", p(), i); }, key == "seg_lens" ? 1 : 0,
                kPlanMaxIndex, &(*lens)[i]));
          }
          return Status::Ok();
        }
        if (key == "recompute") return ReadRecompute(r, p(), true, &mb->recompute);
        if (key != "stages") {
          *known = false;
          return Status::Ok();
        }
        size_t n = 0;
        if (!r.Container(false, &n)) return r.Error(p(), Describe("an array of stage costs"));
        mb->stages.resize(n);
        for (size_t s = 0; s < n; ++s) {
          int64_t v[6] = {};
          SLUICE_RETURN_IF_ERROR(
              ReadObject(r, fmt::format("{}[{}]", p(), s),
                         {kPlanCostKeys[0], kPlanCostKeys[1], kPlanCostKeys[2], kPlanCostKeys[3],
                          kPlanCostKeys[4], kPlanCostKeys[5]},
                         [&](std::string_view k, const auto& kp, bool* found) -> Status {
                           for (int i = 0; i < 6; ++i) {
                             if (k == kPlanCostKeys[i])
                               return ReadInt(r, kp, 0, kPlanMaxAmount, &v[i]);
                           }
                           *found = false;
                           return Status::Ok();
                         }));
          mb->stages[s] = {Duration::Nanos(v[0]), Duration::Nanos(v[1]), Duration::Nanos(v[2]),
                           Bytes::Of(v[3]),       Bytes::Of(v[4]),       Bytes::Of(v[5])};
        }
        return Status::Ok();
      });
}

Status ReadRank(Reader& r, const std::string& base, RankProgram* prog) {
  return ReadObject(
      r, base, {"rank", "dp", "pp", "buffer_slots", "instructions"},
      [&](std::string_view k, const auto& p, bool* found) -> Status {
        if (k == "rank") return ReadInt(r, p, 0, kPlanMaxIndex, &prog->rank);
        if (k == "dp") return ReadInt(r, p, 0, kPlanMaxIndex, &prog->dp_index);
        if (k == "pp") return ReadInt(r, p, 0, kPlanMaxIndex, &prog->pp_index);
        if (k == "buffer_slots") return ReadInt(r, p, 0, kPlanMaxIndex, &prog->buffer_slots);
        if (k != "instructions") {
          *found = false;
          return Status::Ok();
        }
        size_t m = 0;
        if (!r.Container(false, &m)) return r.Error(p(), Describe("an array"));
        prog->instructions.resize(m);
        const std::string prefix = p();
        for (size_t j = 0; j < m; ++j) {
          SLUICE_RETURN_IF_ERROR(ReadInstruction(r, prefix, j, &prog->instructions[j]));
        }
        return Status::Ok();
      });
}

Status ReadReplica(Reader& r, const std::string& base, PlanReplica* rep) {
  return ReadObject(r, base, {"schedule", "micro_batches"},
                    [&](std::string_view k, const auto& p, bool* found) -> Status {
                      if (k == "schedule") return ReadString(r, p, &rep->schedule);
                      if (k != "micro_batches") {
                        *found = false;
                        return Status::Ok();
                      }
                      size_t m = 0;
                      if (!r.Container(false, &m)) return r.Error(p(), Describe("an array"));
                      rep->micro_batches.resize(m);
                      for (size_t j = 0; j < m; ++j) {
                        SLUICE_RETURN_IF_ERROR(ReadMicroBatch(r, fmt::format("{}[{}]", p(), j),
                                                              &rep->micro_batches[j]));
                      }
                      return Status::Ok();
                    });
}

Status ReadDropped(Reader& r, const std::string& base, UnplacedSample* d) {
  return ReadObject(r, base, {"id", "reason"},
                    [&](std::string_view k, const auto& p, bool* found) -> Status {
                      if (k == "id") {
                        return ReadInt(r, p, std::numeric_limits<int64_t>::min(),
                                       std::numeric_limits<int64_t>::max(), &d->id);
                      }
                      if (k == "reason") return ReadString(r, p, &d->reason);
                      *found = false;
                      return Status::Ok();
                    });
}

// Reads an array of objects with `read_one(reader, path, item*)`.
template <typename T, typename ReadOne>
Status ReadArray(Reader& r, const std::string& path, std::vector<T>* out, const ReadOne& read_one) {
  size_t n = 0;
  if (!r.Container(false, &n)) return r.Error(path, Describe("an array"));
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    SLUICE_RETURN_IF_ERROR(read_one(r, fmt::format("{}[{}]", path, i), &(*out)[i]));
  }
  return Status::Ok();
}

}  // namespace

std::vector<uint8_t> PlanToMsgpack(const ExecutionPlan& plan) {
  std::vector<uint8_t> out;
  out.reserve(64 * 1024);
  MsgpackWriter w(&out);
  w.Map(plan.moe_slice_overhead.has_value() ? 12 : 11);
  w.Str("format");
  w.Str(kPlanFormat);
  w.Str("model");
  w.Json(ModelSpecToJson(plan.model));
  w.Str("cluster");
  w.Json(ClusterSpecToJson(plan.cluster));
  w.Str("parallel");
  w.Json(ParallelConfigToJson(plan.parallel));
  w.Str("cost_model");
  w.Str(plan.cost_model);
  if (plan.moe_slice_overhead.has_value()) {
    w.Str("moe_slice_overhead_ns");
    w.Int(plan.moe_slice_overhead->nanos());
  }
  w.Str("method");
  w.Str(plan.method);
  w.Str("sample_ids");
  w.Ints(plan.sample_ids);
  w.Str("dropped");
  w.Array(plan.dropped.size());
  for (const UnplacedSample& s : plan.dropped) {
    w.Map(2);
    w.Str("id");
    w.Int(s.id);
    w.Str("reason");
    w.Str(s.reason);
  }
  w.Str("model_states_bytes");
  w.Array(plan.model_states.size());
  for (Bytes b : plan.model_states) w.Int(b.count());
  w.Str("replicas");
  w.Array(plan.replicas.size());
  for (const PlanReplica& rep : plan.replicas) {
    w.Map(2);
    w.Str("schedule");
    w.Str(rep.schedule);
    w.Str("micro_batches");
    w.Array(rep.micro_batches.size());
    for (const PlanMicroBatch& mb : rep.micro_batches) WriteMicroBatch(w, mb);
  }
  w.Str("ranks");
  w.Array(plan.ranks.size());
  for (const RankProgram& p : plan.ranks) {
    w.Map(5);
    w.Str("rank");
    w.Int(p.rank);
    w.Str("dp");
    w.Int(p.dp_index);
    w.Str("pp");
    w.Int(p.pp_index);
    w.Str("buffer_slots");
    w.Int(p.buffer_slots);
    w.Str("instructions");
    w.Array(p.instructions.size());
    for (const Instruction& in : p.instructions) WriteInstruction(w, in);
  }
  return out;
}

StatusOr<ExecutionPlan> PlanFromMsgpack(std::span<const uint8_t> bytes, std::string_view source) {
  Reader r(bytes, source);
  ExecutionPlan plan;
  auto sub_json = [&](const std::string& path, auto from_json, auto* out) -> Status {
    json j;
    if (!r.Json(&j)) {
      if (!r.duplicate_key().empty()) {
        return r.Error(path, fmt::format("key '{}' is given twice (each key may appear once)",
                                         r.duplicate_key()));
      }
      return r.Error(path, Describe("an object"));
    }
    SLUICE_ASSIGN_OR_RETURN(*out, from_json(j, fmt::format("{} ({})", source, path)));
    return Status::Ok();
  };
  SLUICE_RETURN_IF_ERROR(ReadObject(
      r, "",
      {"format", "model", "cluster", "parallel", "cost_model", "method", "sample_ids", "dropped",
       "model_states_bytes", "replicas", "ranks"},
      [&](std::string_view key, const auto& p, bool* known) -> Status {
        if (key == "format") {
          std::string format;
          SLUICE_RETURN_IF_ERROR(ReadString(r, p, &format));
          if (format == kPlanFormat) return Status::Ok();
          return r.Error(p(), fmt::format("this build reads '{}', got '{}'", kPlanFormat, format));
        }
        if (key == "model") return sub_json(p(), ModelSpecFromJson, &plan.model);
        if (key == "cluster") return sub_json(p(), ClusterSpecFromJson, &plan.cluster);
        if (key == "parallel") return sub_json(p(), ParallelConfigFromJson, &plan.parallel);
        if (key == "cost_model") return ReadString(r, p, &plan.cost_model);
        if (key == "moe_slice_overhead_ns") {
          int64_t ns = 0;
          SLUICE_RETURN_IF_ERROR(ReadInt(r, p, 0, kPlanMaxAmount, &ns));
          plan.moe_slice_overhead = Duration::Nanos(ns);
          return Status::Ok();
        }
        if (key == "method") return ReadString(r, p, &plan.method);
        if (key == "sample_ids") {
          return ReadInts(r, p, std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max(), &plan.sample_ids);
        }
        if (key == "model_states_bytes") {
          std::vector<int64_t> v;
          SLUICE_RETURN_IF_ERROR(ReadInts(r, p, 0, kPlanMaxAmount, &v));
          for (int64_t b : v) plan.model_states.push_back(Bytes::Of(b));
          return Status::Ok();
        }
        if (key == "dropped") return ReadArray(r, p(), &plan.dropped, ReadDropped);
        if (key == "replicas") return ReadArray(r, p(), &plan.replicas, ReadReplica);
        if (key == "ranks") return ReadArray(r, p(), &plan.ranks, ReadRank);
        *known = false;
        return Status::Ok();
      }));
  if (!r.at_end()) return r.Truncated();
  return plan;
}

}  // namespace sluice
