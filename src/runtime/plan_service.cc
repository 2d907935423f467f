#include "runtime/plan_service.h"

#include <fmt/core.h>

#include <utility>

#include "plan/plan_json.h"
#include "plan/validate.h"
#include "runtime/comm.h"
#include "runtime/layout.h"

namespace sluice::runtime {

std::string PlanKey(int64_t i) { return fmt::format("sluice/plan/{}", i); }
std::string HashKey(int64_t i) { return fmt::format("sluice/plan/{}/hash", i); }
std::string ReadKey(int64_t i) { return fmt::format("sluice/plan/{}/read", i); }

std::string HashText(std::span<const uint8_t> bytes) {
  return fmt::format("{:016x}", Fnv1a64(bytes));
}

PlanService::PlanService(const TrainOptions& o, const DistEnv& env) : o_(o), env_(env) {}

PlanService::~PlanService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status PlanService::Start() {
  SLUICE_ASSIGN_OR_RETURN(store_, StoreClient::Connect(env_, o_.timeout));
  for (const Sample& s : o_.plan_samples) plan_samples_[s.id] = s;
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void PlanService::Started(int64_t i) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = i;
  }
  cv_.notify_all();
}

std::vector<std::string> PlanService::TakeNotes() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(notes_, {});
}

void PlanService::Loop() {
  const Planner* planner = o_.plan_files.empty() ? o_.planner : nullptr;
  for (int64_t i = 0;; ++i) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || i <= started_ + o_.lookahead; });
      if (stop_) return;
    }
    PlanPackage p = Next(i, planner);
    p.iteration = i;
    const std::vector<uint8_t> bytes = EncodePackage(p);
    // The hash goes first: whoever sees the plan key also finds its hash.
    if (!store_->SetString(HashKey(i), HashText(bytes)).ok() ||
        !store_->Set(PlanKey(i), bytes).ok()) {
      return;  // the store is gone; the watchdog reports it
    }
    if (p.kind != PackageKind::kPlan) return;
  }
}

PlanPackage PlanService::Next(int64_t i, const Planner* planner) {
  PlanPackage p;
  if (o_.iterations > 0 && i >= o_.iterations) {
    p.kind = PackageKind::kEnd;
    return p;
  }
  if (!o_.plan_files.empty()) {
    if (i >= static_cast<int64_t>(o_.plan_files.size())) {
      p.kind = PackageKind::kEnd;
      return p;
    }
    Status s = ReadPlanFileInto(o_.plan_files[i], &p);
    if (!s.ok()) {
      p.kind = PackageKind::kError;
      p.error = s.message();
    }
    return p;
  }
  GlobalBatch batch;
  while (o_.batcher->Next(&batch)) {
    StatusOr<PlanResult> r = planner->Plan(batch.samples);
    if (!r.ok()) {
      p.kind = PackageKind::kError;
      p.error = fmt::format("planning batch {}: {}", batch.index, r.status().message());
      return p;
    }
    if (r->outcome != PlanOutcome::kOk) {
      std::lock_guard<std::mutex> lock(mu_);
      notes_.push_back(fmt::format("batch {} skipped: {}: {}", batch.index,
                                   PlanOutcomeName(r->outcome), r->infeasible_reason));
      continue;
    }
    p.batch_index = batch.index;
    p.samples = batch.samples;
    p.plan = std::move(r->plan);
    return p;
  }
  p.kind = PackageKind::kEnd;
  return p;
}

Status PlanService::ReadPlanFileInto(const std::string& path, PlanPackage* p) {
  SLUICE_ASSIGN_OR_RETURN(p->plan, ReadPlanFile(path));
  Status valid = ValidatePlan(p->plan);
  if (!valid.ok()) return InvalidArgumentError(fmt::format("{}: {}", path, valid.message()));
  for (const int64_t id : p->plan.sample_ids) {
    const auto it = plan_samples_.find(id);
    if (it == plan_samples_.end()) {
      return InvalidArgumentError(
          fmt::format("{}: sample {} is not in --data (after --max-seqlen)", path, id));
    }
    p->samples.push_back(it->second);
  }
  return Status::Ok();
}

}  // namespace sluice::runtime
