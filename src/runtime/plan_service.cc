#include "runtime/plan_service.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

#include "plan/plan_json.h"
#include "plan/validate.h"
#include "runtime/comm.h"
#include "runtime/layout.h"
#include "sim/simulator.h"

namespace sluice::runtime {

std::string PlanKey(int64_t i, int64_t group) {
  return group < 0 ? fmt::format("sluice/plan/{}", i) : fmt::format("sluice/plan/{}/g{}", i, group);
}
std::string HashKey(int64_t i, int64_t group) { return PlanKey(i, group) + "/hash"; }
std::string ReadKey(int64_t i, int64_t group) { return PlanKey(i, group) + "/read"; }

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

std::optional<IterationOptimization> PlanService::TakeOptimization(int64_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = optimizations_.find(i);
  if (it == optimizations_.end()) return std::nullopt;
  IterationOptimization o = it->second;
  optimizations_.erase(it);
  return o;
}

std::optional<IterationPrediction> PlanService::TakePrediction(int64_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = predictions_.find(i);
  if (it == predictions_.end()) return std::nullopt;
  IterationPrediction p = std::move(it->second);
  predictions_.erase(it);
  return p;
}

OptimizerTotals PlanService::optimizer_totals() {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
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
    if (p.kind == PackageKind::kPlan && (o_.adjust_plan || o_.rewrite_plan)) Predict(i, &p.plan);
    // Heterogeneous replicas: one package per replica group (its plan, the batch's samples);
    // an end or error package goes to every group.
    const int64_t groups =
        o_.hetero_planner != nullptr
            ? static_cast<int64_t>(o_.hetero_planner->config().groups.size())
            : 0;
    for (int64_t g = groups > 0 ? 0 : -1; g < std::max<int64_t>(groups, 0); ++g) {
      if (g > 0 && p.kind == PackageKind::kPlan) p.plan = std::move(group_plans_.at(g - 1));
      const std::vector<uint8_t> bytes = EncodePackage(p);
      // The hash goes first: whoever sees the plan key also finds its hash.
      if (!store_->SetString(HashKey(i, g), HashText(bytes)).ok() ||
          !store_->Set(PlanKey(i, g), bytes).ok()) {
        return;  // the store is gone; the watchdog reports it
      }
    }
    group_plans_.clear();
    if (p.kind != PackageKind::kPlan) return;
  }
}

void PlanService::Predict(int64_t i, ExecutionPlan* plan) {
  if (o_.adjust_plan) o_.adjust_plan(plan);
  if (o_.rewrite_plan) {
    const std::string note = o_.rewrite_plan(plan);
    if (!note.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      notes_.push_back(fmt::format("iteration {}: {}", i, note));
    }
  }
  SimOptions so;
  so.record_timeline = false;
  so.record_memory = false;
  Simulator sim(*plan, so);
  StatusOr<SimResult> r = sim.Run();
  std::lock_guard<std::mutex> lock(mu_);
  if (!r.ok() || r->outcome != SimOutcome::kOk) {
    notes_.push_back(
        fmt::format("iteration {}: no prediction: the adjusted plan does not simulate: {}", i,
                    r.ok() ? r->problem : r.status().message()));
    return;
  }
  IterationPrediction p;
  p.iteration_ms = r->iteration_time.millis();
  for (const RankSimStats& rank : r->ranks) {
    p.peak_bytes.push_back(rank.peak_memory.count());
    p.all_to_all_ms = std::max(p.all_to_all_ms, rank.all_to_all.millis());
    p.exposed_all_to_all_ms = std::max(p.exposed_all_to_all_ms, rank.exposed_all_to_all.millis());
  }
  predictions_[i] = std::move(p);
}

PlanPackage PlanService::Next(int64_t i, const Planner* planner) {
  PlanPackage p;
  if (!o_.plan_files.empty()) {
    if (i >= static_cast<int64_t>(o_.plan_files.size()) ||
        (o_.iterations > 0 && i >= o_.iterations)) {
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
  const int64_t replicas = o_.hetero_planner != nullptr ? o_.hetero_planner->config().replicas()
                                                        : o_.parallel.dp;
  // --iterations counts the batches considered, skipped ones too (as `sluice plan` does).
  while ((o_.iterations <= 0 || considered_ < o_.iterations) && o_.batcher->Next(&batch)) {
    ++considered_;
    // Every replica needs a micro-batch (it still takes part in the gradient sums): a batch with
    // fewer samples than replicas cannot be split, so it is skipped like an infeasible one.
    if (static_cast<int64_t>(batch.samples.size()) < replicas) {
      ++skipped_;
      const std::string why = fmt::format(
          "batch {}: it has {} sample{}, fewer than the {} replicas (each needs at least "
          "one; raise --tokens-per-batch)",
          batch.index, batch.samples.size(), batch.samples.size() == 1 ? "" : "s", replicas);
      if (first_skip_.empty()) {
        first_skip_ = why;
        std::lock_guard<std::mutex> lock(mu_);
        notes_.push_back(
            fmt::format("skipped {} (further skipped batches are counted in the "
                        "summary)",
                        why));
      }
      continue;
    }
    if (o_.hetero_planner != nullptr) {  // heterogeneous replicas (hetero_train.h)
      StatusOr<HeteroPlanResult> h = o_.hetero_planner->Plan(batch.samples);
      if (!h.ok()) {
        p.kind = PackageKind::kError;
        p.error = fmt::format("planning batch {}: {}", batch.index, h.status().message());
        return p;
      }
      if (h->outcome != PlanOutcome::kOk) {
        ++skipped_;
        if (first_skip_.empty()) {
          first_skip_ = fmt::format("batch {}: {}: {}", batch.index, PlanOutcomeName(h->outcome),
                                    h->infeasible_reason);
          std::lock_guard<std::mutex> lock(mu_);
          notes_.push_back(fmt::format(
              "batch {} skipped: {}: {} (further skipped batches are counted in the summary)",
              batch.index, PlanOutcomeName(h->outcome), h->infeasible_reason));
        }
        continue;
      }
      ++planned_;
      p.batch_index = batch.index;
      p.samples = batch.samples;
      p.plan = std::move(h->groups.at(0).plan);
      for (size_t g = 1; g < h->groups.size(); ++g) {
        group_plans_.push_back(std::move(h->groups[g].plan));
      }
      return p;
    }
    StatusOr<PlanResult> r = planner->Plan(batch.samples);
    if (!r.ok()) {
      p.kind = PackageKind::kError;
      p.error = fmt::format("planning batch {}: {}", batch.index, r.status().message());
      return p;
    }
    if (r->outcome != PlanOutcome::kOk) {
      ++skipped_;
      if (first_skip_.empty()) {
        first_skip_ = fmt::format("batch {}: {}: {}", batch.index, PlanOutcomeName(r->outcome),
                                  r->infeasible_reason);
        std::lock_guard<std::mutex> lock(mu_);
        notes_.push_back(fmt::format(
            "batch {} skipped: {}: {} (further skipped batches are counted in the summary)",
            batch.index, PlanOutcomeName(r->outcome), r->infeasible_reason));
      }
      continue;
    }
    ++planned_;
    if (r->optimized) {
      const PlanOptimization& opt = *r->optimized;
      const IterationOptimization io{opt.before.millis(), opt.after.millis(), opt.wall.millis(),
                                     static_cast<int64_t>(opt.passes.size()), opt.budget_hit};
      std::lock_guard<std::mutex> lock(mu_);
      optimizations_[i] = io;
      ++totals_.plans;
      totals_.changed += io.changes > 0 ? 1 : 0;
      totals_.budget_hit += io.budget_hit ? 1 : 0;
      totals_.before_ms += io.before_ms;
      totals_.after_ms += io.after_ms;
      totals_.wall_ms += io.wall_ms;
    }
    p.batch_index = batch.index;
    p.samples = batch.samples;
    p.plan = std::move(r->plan);
    return p;
  }
  if (planned_ == 0) {
    p.kind = PackageKind::kError;
    p.error = considered_ == 0
                  ? std::string("the data has no batch to train")
                  : fmt::format(
                        "nothing to train: all {} batch{} considered{} were skipped by the "
                        "planner (first: {}); raise --memory-limit, or lower --tokens-per-batch or "
                        "--max-seqlen",
                        considered_, considered_ == 1 ? "" : "es",
                        o_.iterations > 0 ? fmt::format(" (--iterations {})", o_.iterations) : "",
                        first_skip_);
    return p;
  }
  if (skipped_ > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    notes_.push_back(fmt::format("skipped {} of the {} batches considered (first: {})", skipped_,
                                 considered_, first_skip_));
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
  // A plan made with a larger --max-seqlen holds longer samples than this run's data has: its
  // samples would train clipped, silently fewer tokens than planned.
  for (size_t d = 0; d < p->plan.replicas.size(); ++d) {
    const std::vector<PlanMicroBatch>& mbs = p->plan.replicas[d].micro_batches;
    for (size_t k = 0; k < mbs.size(); ++k) {
      const int64_t len = std::max(mbs[k].shape.seqlen, mbs[k].shape.dec_seqlen);
      if (o_.max_seqlen > 0 && len > o_.max_seqlen) {
        return InvalidArgumentError(fmt::format(
            "{}: micro-batch {} of replica {} is {} tokens long, but this run clips samples at "
            "--max-seqlen {}: the plan was made with a larger --max-seqlen (at least {}); train "
            "it with the --max-seqlen it was planned with",
            path, k, d, len, o_.max_seqlen, len));
      }
    }
  }
  return Status::Ok();
}

}  // namespace sluice::runtime
