#include "runtime/plan_package.h"

#include <fmt/core.h>

#include <cstring>

#include "model/chunk_cut.h"
#include "plan/plan_json.h"

namespace sluice::runtime {
namespace {

constexpr char kMagic[4] = {'S', 'L', 'P', 'K'};
constexpr uint8_t kVersion = 1;

void PutI64(std::vector<uint8_t>* out, int64_t v) {
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(u >> (8 * i)));
}

class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, std::string_view source)
      : bytes_(bytes), source_(source) {}
  Status I64(int64_t* v, std::string_view what) {
    if (pos_ + 8 > bytes_.size()) return Truncated(what);
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(bytes_[pos_ + i]) << (8 * i);
    pos_ += 8;
    *v = static_cast<int64_t>(u);
    return Status::Ok();
  }
  Status U8(uint8_t* v, std::string_view what) {
    if (pos_ + 1 > bytes_.size()) return Truncated(what);
    *v = bytes_[pos_++];
    return Status::Ok();
  }
  Status Bytes(size_t n, std::span<const uint8_t>* out, std::string_view what) {
    if (pos_ + n > bytes_.size() || pos_ + n < pos_) return Truncated(what);
    *out = bytes_.subspan(pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  bool done() const { return pos_ == bytes_.size(); }
  Status Error(std::string_view problem) const {
    return InvalidArgumentError(fmt::format("{}: plan package: {}", source_, problem));
  }

 private:
  Status Truncated(std::string_view what) const {
    return Error(fmt::format("truncated at byte {} (reading {})", pos_, what));
  }
  std::span<const uint8_t> bytes_;
  std::string_view source_;
  size_t pos_ = 0;
};

// First differing key of two JSON objects, recursively: "layers" or "moe.top_k".
std::string FirstDifference(const nlohmann::json& a, const nlohmann::json& b,
                            const std::string& prefix, std::string* va, std::string* vb) {
  if (a.is_object() && b.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it) {
      const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
      if (!b.contains(it.key())) {
        *va = it.value().dump();
        *vb = "(absent)";
        return key;
      }
      std::string d = FirstDifference(it.value(), b.at(it.key()), key, va, vb);
      if (!d.empty()) return d;
    }
    for (auto it = b.begin(); it != b.end(); ++it) {
      if (!a.contains(it.key())) {
        *va = "(absent)";
        *vb = it.value().dump();
        return prefix.empty() ? it.key() : prefix + "." + it.key();
      }
    }
    return "";
  }
  if (a != b) {
    *va = a.dump();
    *vb = b.dump();
    return prefix;
  }
  return "";
}

}  // namespace

std::vector<uint8_t> EncodePackage(const PlanPackage& p) {
  std::vector<uint8_t> out(kMagic, kMagic + 4);
  out.push_back(kVersion);
  out.push_back(static_cast<uint8_t>(p.kind));
  PutI64(&out, p.iteration);
  PutI64(&out, p.batch_index);
  PutI64(&out, static_cast<int64_t>(p.samples.size()));
  for (const Sample& s : p.samples) {
    PutI64(&out, s.id);
    PutI64(&out, s.input_len);
    PutI64(&out, s.target_len);
  }
  std::vector<uint8_t> tail;
  if (p.kind == PackageKind::kPlan) tail = PlanToMsgpack(p.plan);
  if (p.kind == PackageKind::kError) tail.assign(p.error.begin(), p.error.end());
  PutI64(&out, static_cast<int64_t>(tail.size()));
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

StatusOr<PlanPackage> DecodePackage(std::span<const uint8_t> bytes, std::string_view source) {
  Reader r(bytes, source);
  std::span<const uint8_t> magic;
  SLUICE_RETURN_IF_ERROR(r.Bytes(4, &magic, "magic"));
  if (std::memcmp(magic.data(), kMagic, 4) != 0) return r.Error("bad magic (not a plan package)");
  uint8_t version = 0, kind = 0;
  SLUICE_RETURN_IF_ERROR(r.U8(&version, "version"));
  if (version != kVersion) {
    return r.Error(fmt::format("version {} (this build reads version {})", version, kVersion));
  }
  SLUICE_RETURN_IF_ERROR(r.U8(&kind, "kind"));
  if (kind > 2) return r.Error(fmt::format("kind {} (allowed: 0 plan, 1 end, 2 error)", kind));
  PlanPackage p;
  p.kind = static_cast<PackageKind>(kind);
  SLUICE_RETURN_IF_ERROR(r.I64(&p.iteration, "iteration"));
  SLUICE_RETURN_IF_ERROR(r.I64(&p.batch_index, "batch index"));
  int64_t n = 0;
  SLUICE_RETURN_IF_ERROR(r.I64(&n, "sample count"));
  if (n < 0 || n > static_cast<int64_t>(bytes.size() / 24)) {
    return r.Error(fmt::format("sample count {} does not fit the package", n));
  }
  p.samples.resize(static_cast<size_t>(n));
  for (Sample& s : p.samples) {
    SLUICE_RETURN_IF_ERROR(r.I64(&s.id, "sample id"));
    SLUICE_RETURN_IF_ERROR(r.I64(&s.input_len, "input_len"));
    SLUICE_RETURN_IF_ERROR(r.I64(&s.target_len, "target_len"));
    if (s.input_len < 0 || s.target_len < 0) {
      return r.Error(fmt::format("sample {} has negative lengths", s.id));
    }
  }
  int64_t len = 0;
  SLUICE_RETURN_IF_ERROR(r.I64(&len, "payload length"));
  if (len < 0) return r.Error("negative payload length");
  std::span<const uint8_t> tail;
  SLUICE_RETURN_IF_ERROR(r.Bytes(static_cast<size_t>(len), &tail, "payload"));
  if (!r.done()) return r.Error("trailing bytes after the payload");
  if (p.kind == PackageKind::kPlan) {
    SLUICE_ASSIGN_OR_RETURN(p.plan, PlanFromMsgpack(tail, source));
  } else if (p.kind == PackageKind::kError) {
    p.error.assign(tail.begin(), tail.end());
  } else if (!tail.empty()) {
    return r.Error("an end marker carries a payload");
  }
  return p;
}

Status CheckPlanMatches(const ExecutionPlan& plan, const JobConfig& job, std::string_view source) {
  std::string va, vb;
  // The name is a label; every other field changes what is trained.
  nlohmann::json plan_model = ModelSpecToJson(plan.model);
  nlohmann::json job_model = ModelSpecToJson(job.model);
  plan_model.erase("name");
  job_model.erase("name");
  const std::string model_field = FirstDifference(plan_model, job_model, "", &va, &vb);
  if (!model_field.empty()) {
    return InvalidArgumentError(fmt::format(
        "{}: field 'model.{}': the plan has {}, this run has {} (the plan was made for model "
        "'{}', this run trains '{}')",
        source, model_field, va, vb, plan.model.name, job.model.name));
  }
  const std::pair<const char*, int64_t> fields[] = {
      {"dp", plan.parallel.dp - job.parallel.dp},
      {"pp", plan.parallel.pp - job.parallel.pp},
      {"tp", plan.parallel.tp - job.parallel.tp},
      {"ep", plan.parallel.ep - job.parallel.ep},
      {"vpp", plan.parallel.vpp - job.parallel.vpp},
      {"zero", plan.parallel.zero - job.parallel.zero},
      {"cp", plan.parallel.cp - job.parallel.cp}};
  const int64_t plan_values[] = {plan.parallel.dp, plan.parallel.pp,  plan.parallel.tp,
                                 plan.parallel.ep, plan.parallel.vpp, plan.parallel.zero,
                                 plan.parallel.cp};
  for (size_t i = 0; i < std::size(fields); ++i) {
    if (fields[i].second != 0) {
      return InvalidArgumentError(
          fmt::format("{}: field 'parallel.{}': the plan has {}, this run has {}", source,
                      fields[i].first, plan_values[i], plan_values[i] - fields[i].second));
    }
  }
  if (plan.parallel.layer_cut != job.parallel.layer_cut) {
    return InvalidArgumentError(fmt::format(
        "{}: field 'parallel.layer_cut': the plan cuts the layers {}, this run {} (the model is "
        "sharded once per run; plan every batch with one cut)",
        source, DescribeLayerCut(plan.parallel.layer_cut),
        DescribeLayerCut(job.parallel.layer_cut)));
  }
  const int64_t need = plan.parallel.dp * plan.parallel.pp * plan.parallel.tp * plan.parallel.cp;
  if (need != job.world_size) {
    return InvalidArgumentError(
        fmt::format("{}: the plan needs dp * pp * tp * cp = {} processes, this job has {}", source,
                    need, job.world_size));
  }
  if (static_cast<int64_t>(plan.ranks.size()) != plan.parallel.dp * plan.parallel.pp ||
      static_cast<int64_t>(plan.replicas.size()) != plan.parallel.dp) {
    return InvalidArgumentError(
        fmt::format("{}: field 'ranks': {} rank programs and {} replicas for dp {} x pp {}", source,
                    plan.ranks.size(), plan.replicas.size(), plan.parallel.dp, plan.parallel.pp));
  }
  return Status::Ok();
}

}  // namespace sluice::runtime
