// sluice._sluice: thin pybind11 bindings over the planner and the simulator (docs/python.md).
//
// Specs come in through the same readers and validation the CLI uses (model/model_spec.h,
// cluster_spec.h, parallel_config.h), from a preset or flag text, a JSON file, or JSON text (the
// Python package turns a dict into JSON text). Every sluice Status that is not OK is raised as
// sluice.Error (a ValueError) carrying the Status message unchanged and its code name in `.code`.
// Planning and simulation release the GIL, so a background Python thread can plan while the
// training loop runs.
#include <fmt/core.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "cost/cost_factory.h"
#include "data/sample.h"
#include "model/cluster_spec.h"
#include "model/model_spec.h"
#include "model/parallel_config.h"
#include "plan/instruction.h"
#include "plan/memory_rule.h"
#include "plan/plan_json.h"
#include "plan/pytorch_csv.h"
#include "plan/validate.h"
#include "planner/planner.h"
#include "schedule/generators.h"
#include "sim/simulator.h"

namespace py = pybind11;

namespace sluice {
namespace {

// A non-OK Status on its way to Python (translated to sluice.Error below).
struct StatusError : std::runtime_error {
  explicit StatusError(const Status& s) : std::runtime_error(s.message()), code(s.code()) {}
  StatusCode code;
};

[[noreturn]] void Raise(const Status& s) { throw StatusError(s); }
void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}
template <typename T>
T Take(StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return std::move(v).value();
}

// JSON text from Python, parsed with the message naming `source`.
nlohmann::json ParseJson(const std::string& text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    Raise(InvalidArgumentError(fmt::format("{}: not valid JSON", source)));
  }
  return j;
}

// A planner with what it points into: the cost model lives as long as the planner.
struct PyPlanner {
  ModelSpec model;
  ClusterSpec cluster;
  ParallelConfig parallel;
  std::unique_ptr<CostModel> cost;
  std::optional<Planner> planner;
  int64_t max_seqlen = 0;
};

// One planned global batch, with the samples it was planned from (the simulator counts their
// real tokens).
struct PyPlan {
  PlanResult result;
  std::vector<Sample> samples;
};

std::shared_ptr<PyPlanner> MakePlanner(const ModelSpec& model, const ClusterSpec& cluster,
                                       const ParallelConfig& parallel, const std::string& method,
                                       const std::string& schedule, uint64_t seed,
                                       int64_t max_seqlen, const std::string& cost,
                                       bool search_order, const std::string& recompute) {
  auto p = std::make_shared<PyPlanner>();
  p->model = model;
  p->cluster = cluster;
  p->parallel = parallel;
  Check(CheckParallelFits(parallel, model, &cluster, "parallel"));
  if (max_seqlen == 0) max_seqlen = std::min<int64_t>(2048, model.max_position);
  if (max_seqlen < 1 || max_seqlen > model.max_position) {
    Raise(InvalidArgumentError(fmt::format(
        "max_seqlen: {} is not allowed for model '{}'; allowed: 1 .. {} (its max_position)",
        max_seqlen, model.name, model.max_position)));
  }
  p->max_seqlen = max_seqlen;
  StatusOr<ScheduleKind> kind_or = ParseScheduleKind(schedule);
  if (!kind_or.ok()) Raise(kind_or.status().WithPrefix("schedule"));
  const ScheduleKind kind = *kind_or;
  CostModelOptions cost_options;
  cost_options.kind = cost;
  StatusOr<std::unique_ptr<CostModel>> cm = MakeCostModel(p->model, p->cluster, cost_options);
  if (!cm.ok()) Raise(cm.status().WithPrefix("cost"));
  p->cost = std::move(cm).value();
  PlannerOptions options;
  options.method = method;
  options.schedule = kind;
  options.search_order = search_order;
  options.batching.seed = seed;
  options.batching.max_seqlen = max_seqlen;
  if (!recompute.empty()) {
    StatusOr<Recompute> r = ParseRecompute(recompute);
    if (!r.ok()) Raise(r.status().WithPrefix("recompute"));
    options.batching.recompute = *r;
  }
  StatusOr<Planner> planner = Planner::Create(*p->cost, p->parallel, p->cluster, options);
  if (!planner.ok()) Raise(planner.status().WithPrefix("planner"));
  p->planner.emplace(std::move(planner).value());
  return p;
}

// Samples from Python: lengths (decoder-only) or (input, target) pairs, with optional ids.
std::vector<Sample> SamplesOf(const PyPlanner& p, const std::vector<int64_t>& input_lens,
                              const std::vector<int64_t>& target_lens,
                              const std::vector<int64_t>& ids) {
  if (!target_lens.empty() && target_lens.size() != input_lens.size()) {
    Raise(InvalidArgumentError(
        fmt::format("target_lengths: {} values for {} lengths; allowed: one per sample",
                    target_lens.size(), input_lens.size())));
  }
  if (!ids.empty() && ids.size() != input_lens.size()) {
    Raise(InvalidArgumentError(fmt::format("ids: {} values for {} lengths; allowed: one per sample",
                                           ids.size(), input_lens.size())));
  }
  if (p.model.is_encoder_decoder() == target_lens.empty() && !input_lens.empty()) {
    Raise(InvalidArgumentError(fmt::format(
        "target_lengths: model '{}' is {}; {}", p.model.name, ModelKindName(p.model.kind),
        p.model.is_encoder_decoder() ? "give one target length per sample"
                                     : "give none (decoder-only samples have one length)")));
  }
  std::vector<Sample> samples(input_lens.size());
  for (size_t i = 0; i < input_lens.size(); ++i) {
    Sample& s = samples[i];
    s.id = ids.empty() ? static_cast<int64_t>(i) : ids[i];
    s.input_len = input_lens[i];
    s.target_len = target_lens.empty() ? 0 : target_lens[i];
    const int64_t limit = p.max_seqlen;
    const bool enc_dec = p.model.is_encoder_decoder();
    const bool too_long =
        enc_dec ? (s.input_len > limit || s.target_len > limit) : s.tokens() > limit;
    if (s.input_len < 1 || s.target_len < 0 || (enc_dec && s.target_len < 1)) {
      Raise(InvalidArgumentError(
          fmt::format("lengths[{}]: sample {} has length {}{}; allowed: lengths >= 1", i, s.id,
                      s.input_len, enc_dec ? fmt::format("+{}", s.target_len) : "")));
    }
    if (too_long) {
      Raise(InvalidArgumentError(fmt::format(
          "lengths[{}]: sample {} has {} tokens, over max_seqlen {}; clip or drop it first "
          "(sluice.torch.PlanningBatchSampler does, with long='clip'|'drop')",
          i, s.id, s.tokens(), limit)));
    }
  }
  return samples;
}

py::dict CostDict(const ChunkCost& c) {
  py::dict d;
  d["forward_ms"] = c.forward.millis();
  d["backward_input_ms"] = c.backward_input.millis();
  d["backward_weight_ms"] = c.backward_weight.millis();
  d["stored_bytes"] = c.stored.count();
  d["peak_bytes"] = c.peak.count();
  return d;
}

py::dict MicroBatchDict(const PlanMicroBatch& mb) {
  py::dict d;
  d["rows"] = mb.rows;
  std::vector<int64_t> ids;
  for (const auto& row : mb.rows) ids.insert(ids.end(), row.begin(), row.end());
  d["sample_ids"] = ids;
  d["mbs"] = mb.shape.mbs;
  d["seqlen"] = mb.shape.seqlen;
  d["dec_seqlen"] = mb.shape.dec_seqlen;
  d["varlen"] = mb.varlen;
  d["recompute"] = std::string(RecomputeName(mb.recompute));
  py::list stages;
  for (const ChunkCost& c : mb.stages) stages.append(CostDict(c));
  d["stages"] = stages;
  return d;
}

const ExecutionPlan& OkPlan(const PyPlan& p) {
  if (p.result.outcome != PlanOutcome::kOk) {
    Raise(FailedPreconditionError(fmt::format("the batch could not be planned ({}): {}",
                                              PlanOutcomeName(p.result.outcome),
                                              p.result.infeasible_reason)));
  }
  return p.result.plan;
}

int64_t CheckReplica(const ExecutionPlan& plan, int64_t replica) {
  if (replica < 0 || replica >= plan.dp()) {
    Raise(InvalidArgumentError(fmt::format(
        "replica: {} is not a replica of this plan (allowed: 0..{})", replica, plan.dp() - 1)));
  }
  return replica;
}

py::dict SimDict(const SimResult& r, const ExecutionPlan& plan) {
  py::dict d;
  d["outcome"] = std::string(SimOutcomeName(r.outcome));
  d["problem"] = r.problem;
  d["iteration_time_ms"] = r.iteration_time.millis();
  d["tokens_per_second"] = r.tokens_per_second;
  d["real_tokens"] = r.real_tokens;
  d["padded_tokens"] = r.padded_tokens;
  d["mfu"] = r.mfu;
  d["memory_exceeded"] = r.memory_exceeded;
  d["memory_limit_bytes"] = plan.memory_limit().count();
  std::vector<int64_t> peaks;
  std::vector<double> bubbles;
  double bubble_sum = 0;
  for (const RankSimStats& s : r.ranks) {
    peaks.push_back(s.peak_memory.count());
    const double b = r.iteration_time.nanos() > 0
                         ? static_cast<double>(s.bubble.nanos()) / r.iteration_time.nanos()
                         : 0.0;
    bubbles.push_back(b);
    bubble_sum += b;
  }
  d["peak_memory_bytes"] = peaks;           // [rank]
  d["bubble_fraction_per_rank"] = bubbles;  // [rank]: bubble / iteration time
  d["bubble_fraction"] = r.ranks.empty() ? 0.0 : bubble_sum / r.ranks.size();
  d["stage_imbalance"] = r.stage_imbalance;
  d["replica_imbalance"] = r.replica_imbalance;
  return d;
}

// One instruction as a dict with the plan file's field names (docs/formats.md), absent fields
// left out, plus "text" (InstructionText: the name profiler ranges and grids use).
py::dict InstructionDict(const Instruction& in) {
  py::dict d;
  d["op"] = std::string(OpKindName(in.op));
  d["text"] = InstructionText(in);
  if (in.microbatch >= 0) d["mb"] = in.microbatch;
  if (in.stage >= 0) d["stage"] = in.stage;
  if (in.peer >= 0) d["peer"] = in.peer;
  if (in.tag >= 0) d["tag"] = in.tag;
  if (in.bucket >= 0) d["bucket"] = in.bucket;
  if (!in.shapes.empty()) d["shapes"] = in.shapes;
  if (!in.inputs.empty()) d["in"] = in.inputs;
  if (!in.outputs.empty()) d["out"] = in.outputs;
  if (in.bytes.count() > 0) d["bytes"] = in.bytes.count();
  if (in.recompute != Recompute::kNone) d["rc"] = std::string(RecomputeName(in.recompute));
  if (in.duration.nanos() > 0) d["ns"] = in.duration.nanos();
  return d;
}

int64_t CheckRank(const ExecutionPlan& plan, int64_t rank) {
  if (rank < 0 || rank >= static_cast<int64_t>(plan.ranks.size())) {
    Raise(InvalidArgumentError(fmt::format("rank: {} is not a rank of this plan (allowed: 0..{})",
                                           rank, plan.ranks.size() - 1)));
  }
  return rank;
}

// A plan read back from PlanToMsgpack bytes, with the planner's figures that the file does not
// hold (PlanningBatchSampler's rank-0 planning ships them beside the bytes).
std::unique_ptr<PyPlan> PlanFromBytes(const py::bytes& data, double makespan_ms,
                                      double given_order_makespan_ms, double bubble_fraction,
                                      double planning_time_ms,
                                      const std::vector<int64_t>& peak_memory_bytes,
                                      const std::vector<std::pair<int64_t, int64_t>>& samples) {
  const std::string_view view = data;
  auto out = std::make_unique<PyPlan>();
  {
    py::gil_scoped_release release;
    const auto* begin = reinterpret_cast<const uint8_t*>(view.data());
    out->result.plan =
        Take(PlanFromMsgpack(std::span<const uint8_t>(begin, view.size()), "shared plan"));
  }
  PlanResult& r = out->result;
  r.outcome = PlanOutcome::kOk;
  r.batch_plan.method = r.plan.method;
  r.makespan = Duration::Nanos(static_cast<int64_t>(makespan_ms * 1e6));
  r.given_order_makespan = Duration::Nanos(static_cast<int64_t>(given_order_makespan_ms * 1e6));
  r.bubble_fraction = bubble_fraction;
  r.planning_time = Duration::Nanos(static_cast<int64_t>(planning_time_ms * 1e6));
  for (const int64_t b : peak_memory_bytes) r.peak_memory.push_back(Bytes::Of(b));
  for (const auto& [id, len] : samples) {
    Sample s;
    s.id = id;
    s.input_len = len;
    out->samples.push_back(s);
  }
  return out;
}

}  // namespace
}  // namespace sluice

PYBIND11_MODULE(_sluice, m) {
  using namespace sluice;
  m.doc() = "sluice: plan and simulate distributed training on variable-length data";
  m.attr("__version__") = SLUICE_PYTHON_VERSION;

  static py::exception<StatusError> error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object exc = py::handle(error.ptr())(e.what());
      exc.attr("code") = std::string(StatusCodeName(e.code));
      PyErr_SetObject(error.ptr(), exc.ptr());
    }
  });

  py::class_<ModelSpec>(m, "ModelSpec")
      .def_static(
          "preset", [](const std::string& name) { return Take(ModelPreset(name)); },
          py::arg("name"))
      .def_static(
          "resolve", [](const std::string& s) { return Take(ResolveModel(s)); },
          py::arg("name_or_file"))
      .def_static("_from_json_text",
                  [](const std::string& text, const std::string& source) {
                    return Take(ModelSpecFromJson(ParseJson(text, source), source));
                  })
      .def("_to_json_text", [](const ModelSpec& s) { return ModelSpecToJson(s).dump(); })
      .def_property_readonly("name", [](const ModelSpec& s) { return s.name; })
      .def_property_readonly("kind",
                             [](const ModelSpec& s) { return std::string(ModelKindName(s.kind)); })
      .def_property_readonly("layers", [](const ModelSpec& s) { return s.layers; })
      .def_property_readonly("hidden", [](const ModelSpec& s) { return s.hidden; })
      .def_property_readonly("heads", [](const ModelSpec& s) { return s.heads; })
      .def_property_readonly("vocab", [](const ModelSpec& s) { return s.vocab; })
      .def_property_readonly("max_position", [](const ModelSpec& s) { return s.max_position; })
      .def_property_readonly("is_encoder_decoder", &ModelSpec::is_encoder_decoder)
      .def("__eq__", [](const ModelSpec& a, const ModelSpec& b) { return a == b; })
      .def("__repr__",
           [](const ModelSpec& s) { return fmt::format("<sluice.ModelSpec '{}'>", s.name); });
  m.def("model_presets", &ModelPresetNames);

  py::class_<ClusterSpec>(m, "ClusterSpec")
      .def_static(
          "preset",
          [](const std::string& device, int64_t n) { return Take(ClusterPreset(device, n)); },
          py::arg("device"), py::arg("devices"))
      .def_static(
          "resolve", [](const std::string& s) { return Take(ResolveCluster(s)); },
          py::arg("preset_or_file"))
      .def_static("_from_json_text",
                  [](const std::string& text, const std::string& source) {
                    return Take(ClusterSpecFromJson(ParseJson(text, source), source));
                  })
      .def("_to_json_text", [](const ClusterSpec& s) { return ClusterSpecToJson(s).dump(); })
      .def_property_readonly("name", [](const ClusterSpec& s) { return s.name; })
      .def_property_readonly("devices", [](const ClusterSpec& s) { return s.num_devices(); })
      .def("__eq__", [](const ClusterSpec& a, const ClusterSpec& b) { return a == b; })
      .def("__repr__", [](const ClusterSpec& s) {
        return fmt::format("<sluice.ClusterSpec '{}' ({} devices)>", s.name, s.num_devices());
      });
  m.def("device_presets", &DevicePresetNames);

  py::class_<ParallelConfig>(m, "ParallelConfig")
      .def_static(
          "resolve", [](const std::string& s) { return Take(ResolveParallel(s)); },
          py::arg("spec_or_file"))
      .def_static("_from_json_text",
                  [](const std::string& text, const std::string& source) {
                    return Take(ParallelConfigFromJson(ParseJson(text, source), source));
                  })
      .def("_to_json_text", [](const ParallelConfig& s) { return ParallelConfigToJson(s).dump(); })
      .def_property_readonly("dp", [](const ParallelConfig& c) { return c.dp; })
      .def_property_readonly("pp", [](const ParallelConfig& c) { return c.pp; })
      .def_property_readonly("tp", [](const ParallelConfig& c) { return c.tp; })
      .def_property_readonly("ep", [](const ParallelConfig& c) { return c.ep; })
      .def_property_readonly("vpp", [](const ParallelConfig& c) { return c.vpp; })
      .def_property_readonly("zero", [](const ParallelConfig& c) { return c.zero; })
      .def_property_readonly("cp", [](const ParallelConfig& c) { return c.cp; })
      .def_property_readonly("layer_cut", [](const ParallelConfig& c) { return c.layer_cut; })
      .def_property_readonly(
          "order", [](const ParallelConfig& c) { return std::string(RankOrderName(c.order)); })
      .def_property_readonly("devices", &ParallelConfig::devices)
      .def("__eq__", [](const ParallelConfig& a, const ParallelConfig& b) { return a == b; })
      .def("__repr__", [](const ParallelConfig& c) {
        return fmt::format("<sluice.ParallelConfig dp={} pp={} tp={} ep={} vpp={} zero={}{}{}>",
                           c.dp, c.pp, c.tp, c.ep, c.vpp, c.zero,
                           c.cp > 1 ? fmt::format(" cp={}", c.cp) : "",
                           c.layer_cut.empty()
                               ? ""
                               : fmt::format(" layer_cut={}", fmt::join(c.layer_cut, "+")));
      });

  py::class_<PyPlanner, std::shared_ptr<PyPlanner>>(m, "_Planner")
      .def(py::init(&MakePlanner), py::arg("model"), py::arg("cluster"), py::arg("parallel"),
           py::arg("method"), py::arg("schedule"), py::arg("seed"), py::arg("max_seqlen"),
           py::arg("cost"), py::arg("search_order"), py::arg("recompute"))
      .def_property_readonly("model", [](const PyPlanner& p) { return p.model; })
      .def_property_readonly("cluster", [](const PyPlanner& p) { return p.cluster; })
      .def_property_readonly("parallel", [](const PyPlanner& p) { return p.parallel; })
      .def_property_readonly("max_seqlen", [](const PyPlanner& p) { return p.max_seqlen; })
      .def_property_readonly("cost_model", [](const PyPlanner& p) { return p.cost->Describe(); })
      .def_property_readonly(
          "memory_limit_bytes",
          [](const PyPlanner& p) { return p.parallel.MemoryLimit(p.cluster).count(); })
      .def(
          "plan",
          [](const PyPlanner& p, const std::vector<int64_t>& lengths,
             const std::vector<int64_t>& target_lengths, const std::vector<int64_t>& ids) {
            auto out = std::make_unique<PyPlan>();
            out->samples = SamplesOf(p, lengths, target_lengths, ids);
            StatusOr<PlanResult> r = [&] {
              py::gil_scoped_release release;
              return p.planner->Plan(out->samples);
            }();
            if (!r.ok()) Raise(r.status());
            out->result = std::move(r).value();
            return out;
          },
          py::arg("lengths"), py::arg("target_lengths"), py::arg("ids"));

  m.def("_plan_from_msgpack", &PlanFromBytes, py::arg("data"), py::arg("makespan_ms"),
        py::arg("given_order_makespan_ms"), py::arg("bubble_fraction"), py::arg("planning_time_ms"),
        py::arg("peak_memory_bytes"), py::arg("samples"));

  py::class_<PyPlan>(m, "_Plan")
      .def_property_readonly("ok",
                             [](const PyPlan& p) { return p.result.outcome == PlanOutcome::kOk; })
      .def_property_readonly(
          "outcome", [](const PyPlan& p) { return std::string(PlanOutcomeName(p.result.outcome)); })
      .def_property_readonly("infeasible_reason",
                             [](const PyPlan& p) { return p.result.infeasible_reason; })
      .def_property_readonly("method", [](const PyPlan& p) { return p.result.batch_plan.method; })
      .def_property_readonly("dp", [](const PyPlan& p) { return p.result.plan.dp(); })
      .def_property_readonly("pp", [](const PyPlan& p) { return p.result.plan.pp(); })
      .def_property_readonly("makespan_ms",
                             [](const PyPlan& p) { return p.result.makespan.millis(); })
      .def_property_readonly("given_order_makespan_ms",
                             [](const PyPlan& p) { return p.result.given_order_makespan.millis(); })
      .def_property_readonly("bubble_fraction",
                             [](const PyPlan& p) { return p.result.bubble_fraction; })
      .def_property_readonly("planning_time_ms",
                             [](const PyPlan& p) { return p.result.planning_time.millis(); })
      .def_property_readonly("peak_memory_bytes",
                             [](const PyPlan& p) {
                               std::vector<int64_t> v;
                               for (Bytes b : p.result.peak_memory) v.push_back(b.count());
                               return v;
                             })
      .def_property_readonly("memory_limit_bytes",
                             [](const PyPlan& p) { return OkPlan(p).memory_limit().count(); })
      .def_property_readonly("cost_model", [](const PyPlan& p) { return OkPlan(p).cost_model; })
      .def_property_readonly("sample_ids", [](const PyPlan& p) { return OkPlan(p).sample_ids; })
      .def_property_readonly("dropped",
                             [](const PyPlan& p) {
                               std::vector<std::pair<int64_t, std::string>> v;
                               for (const UnplacedSample& u : OkPlan(p).dropped)
                                 v.emplace_back(u.id, u.reason);
                               return v;
                             })
      .def(
          "micro_batches",
          [](const PyPlan& p, int64_t replica) {
            const ExecutionPlan& plan = OkPlan(p);
            py::list out;
            for (const PlanMicroBatch& mb :
                 plan.replicas[CheckReplica(plan, replica)].micro_batches) {
              out.append(MicroBatchDict(mb));
            }
            return out;
          },
          py::arg("replica"))
      .def(
          "schedule",
          [](const PyPlan& p, int64_t replica) {
            const ExecutionPlan& plan = OkPlan(p);
            return plan.replicas[CheckReplica(plan, replica)].schedule;
          },
          py::arg("replica"))
      .def_property_readonly("num_ranks", [](const PyPlan& p) { return OkPlan(p).ranks.size(); })
      .def(
          "instructions",
          [](const PyPlan& p, int64_t rank) {
            const ExecutionPlan& plan = OkPlan(p);
            std::vector<std::string> v;
            for (const Instruction& in : plan.ranks[CheckRank(plan, rank)].instructions)
              v.push_back(InstructionText(in));
            return v;
          },
          py::arg("rank"))
      .def(
          "program",
          [](const PyPlan& p, int64_t rank) {
            const ExecutionPlan& plan = OkPlan(p);
            const RankProgram& prog = plan.ranks[CheckRank(plan, rank)];
            py::dict d;
            d["rank"] = prog.rank;
            d["dp"] = prog.dp_index;
            d["pp"] = prog.pp_index;
            d["buffer_slots"] = prog.buffer_slots;
            py::list list;
            for (const Instruction& in : prog.instructions) list.append(InstructionDict(in));
            d["instructions"] = list;
            return d;
          },
          py::arg("rank"))
      .def_property_readonly("vpp", [](const PyPlan& p) { return OkPlan(p).vpp(); })
      .def_property_readonly("zero", [](const PyPlan& p) { return OkPlan(p).parallel.zero; })
      .def_property_readonly("tp", [](const PyPlan& p) { return OkPlan(p).parallel.tp; })
      .def_property_readonly("model", [](const PyPlan& p) { return OkPlan(p).model; })
      .def_property_readonly("samples",
                             [](const PyPlan& p) {
                               std::vector<std::pair<int64_t, int64_t>> v;
                               for (const Sample& s : p.samples) v.emplace_back(s.id, s.tokens());
                               return v;
                             })
      .def("to_msgpack",
           [](const PyPlan& p) {
             const std::vector<uint8_t> bytes = PlanToMsgpack(OkPlan(p));
             return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
           })
      .def(
          "to_json", [](const PyPlan& p, int indent) { return PlanToJsonText(OkPlan(p), indent); },
          py::arg("indent") = -1)
      .def(
          "to_csv",
          [](const PyPlan& p, int64_t replica, bool comms) {
            const ExecutionPlan& plan = OkPlan(p);
            PipelineOrder order = PipelineOrderOf(plan, CheckReplica(plan, replica), comms);
            if (!comms) {
              for (auto& row : order.ranks) {
                std::erase_if(row, [](const PipeAction& a) {
                  return a.op != PipeOp::kForward && a.op != PipeOp::kBackward &&
                         a.op != PipeOp::kBackwardInput && a.op != PipeOp::kBackwardWeight;
                });
              }
            }
            return PipelineOrderToCsv(order);
          },
          py::arg("replica") = 0, py::arg("comms") = false)
      .def(
          "write",
          [](const PyPlan& p, const std::string& path) { Check(WritePlanFile(OkPlan(p), path)); },
          py::arg("path"))
      .def("validate", [](const PyPlan& p) { Check(ValidatePlan(OkPlan(p))); })
      .def(
          "simulate",
          [](const PyPlan& p, const std::string& collectives) {
            const ExecutionPlan& plan = OkPlan(p);
            SimOptions options;
            if (collectives == "stepwise") {
              options.collectives = CollectiveMode::kStepwise;
            } else if (collectives == "closed-form") {
              options.collectives = CollectiveMode::kClosedForm;
            } else {
              Raise(InvalidArgumentError(
                  fmt::format("collectives: '{}' is not allowed; allowed: stepwise, closed-form",
                              collectives)));
            }
            options.record_timeline = false;
            options.record_memory = false;
            options.samples = p.samples;
            StatusOr<SimResult> r = [&] {
              py::gil_scoped_release release;
              return Simulate(plan, options);
            }();
            if (!r.ok()) Raise(r.status());
            return SimDict(*r, plan);
          },
          py::arg("collectives") = "stepwise");
}
