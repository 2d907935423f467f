#include "runtime/trainer.h"

#include <fmt/core.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>

#include "base/files.h"
#include "base/json_util.h"
#include "base/progress.h"
#include "plan/plan_json.h"
#include "plan/validate.h"
#include "runtime/batch_layout.h"
#include "runtime/comm.h"
#include "runtime/dump.h"
#include "runtime/executor.h"
#include "runtime/hetero_train.h"
#include "runtime/layout.h"
#include "runtime/memory_stats.h"
#include "runtime/model.h"
#include "runtime/plan_package.h"
#include "runtime/plan_service.h"
#include "runtime/token_source.h"
#include "runtime/trace_recorder.h"
#include "runtime/trainer_report.h"

namespace sluice::runtime {
namespace {

using Clock = std::chrono::steady_clock;

std::string StatsKey(int64_t i, int64_t r) { return fmt::format("sluice/stats/{}/{}", i, r); }
constexpr const char* kEpochKey = "sluice/epoch_ns";
constexpr const char* kDoneKey = "sluice/done";

// Peak resident memory of this process (VmHWM, bytes); 0 when unknown.
int64_t PeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream s(line.substr(6));
      int64_t kb = 0;
      s >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

// Restarts the VmHWM count (Linux: "5" > /proc/self/clear_refs); harmless when refused.
void ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  if (out) out << "5";
}

// Rank 0's planner thread: plans (or reads) iteration i's plan while rank 0 runs an earlier one
// and publishes it in the store, at most `lookahead` iterations ahead.
class Trainer {
 public:
  Trainer(const TrainOptions& o, const DistEnv& env) : o_(o), env_(env) {}

  Status Run() {
    SLUICE_RETURN_IF_ERROR(Setup());
    Status s = Loop();
    if (!s.ok()) {
      // A failure another rank posted first is the cause (this one may only have lost a peer).
      const StatusOr<std::optional<std::string>> read = watchdog_->ReadPostedFailure();
      const std::optional<std::string> posted = read.ok() ? *read : std::nullopt;
      if (!read.ok()) {
        // Nothing can be posted or read: rank 0, which serves the store, died or stopped, and
        // the peer this rank lost most likely went away because of it (a rank that loses the
        // store exits without being able to post why).
        s = Status(s.code(), fmt::format("{}; the rendezvous store served by rank 0 at {}:{} does "
                                         "not answer either: rank 0 died, stopped or hung, or "
                                         "the network failed ({})",
                                         s.message(), env_.master_addr, env_.master_port,
                                         read.status().message()));
      } else if (!posted) {
        watchdog_->Abort(fmt::format("rank {} failed: {}", env_.rank, s.message()));
      }
      watchdog_->Stop();
      // What ran before the failure is kept: this rank's trace, and rank 0's metrics lines.
      FlushAfterFailure();
      // Keep the connections (and on rank 0 the store) open a moment, so that ranks which would
      // only see this one vanish read the cause first. Also when the store is gone: the others
      // then notice that themselves (and name rank 0) instead of blaming this rank.
      std::this_thread::sleep_for(Watchdog::kLinger);
      // Leave the process groups and threads as they are: peers may be gone, and c10d teardown
      // would block on them. The process exits right after.
      (void)comm_.release();
      (void)cross_.release();
      if (service_) (void)service_.release();
      // The counting allocator stays installed: threads left running may still allocate.
      (void)memory_.release();
      // Bad input (a plan for another job) is found by every rank on its own: report it as such.
      if (posted && s.code() != StatusCode::kInvalidArgument) {
        return FailedPreconditionError(fmt::format("stopping: {}", *posted));
      }
      return s;
    }
    return Finish();
  }

 private:
  Status Setup() {
    // Heterogeneous replicas: this process's replica group is the job it runs (hetero_train.h).
    if (o_.replicas.has_value()) {
      SLUICE_RETURN_IF_ERROR(CheckHeteroRunnable(*o_.replicas, env_.world_size, "--replicas"));
      const GroupOf g = ProcessGroupOf(*o_.replicas, env_.rank);
      group_ = g.group;
      offset_ = g.offset;
      par_ = o_.replicas->groups[g.group];
    } else {
      par_ = o_.parallel;
    }
    const ParallelConfig& par = par_;
    // The launcher's RANK is where the process is (its device block: RANK - offset = block * cp +
    // cp index); the plan's process numbering is offset + plan rank * cp + cp index (comm.h), and
    // par.order says which plan rank each block holds (model/parallel_config.h). Block 0 holds
    // plan rank 0 in every order, so RANK 0 (the store's host) stays process 0.
    if (par.tp == 1 && env_.rank >= offset_ && env_.rank - offset_ < par.devices()) {
      const int64_t here = env_.rank - offset_;
      env_.rank = offset_ + par.RankOfBlock(here / par.cp) * par.cp + here % par.cp;
    }
    if (par.tp != 1) {
      return InvalidArgumentError(fmt::format(
          "--parallel: the runtime implements tp = 1 only (got tp = {}); tensor parallelism is "
          "planned and simulated but not executed",
          par.tp));
    }
    if (par.ep > 1 && (par.ep < 1 || par.dp % par.ep != 0)) {
      return InvalidArgumentError(fmt::format(
          "--parallel: ep = {} must divide dp = {} (an expert-parallel group is ep data-parallel "
          "replicas; allowed ep: divisors of dp that divide the model's experts)",
          par.ep, par.dp));
    }
    if (par.cp > 1 && (o_.model.is_encoder_decoder() || par.ep != 1)) {
      return InvalidArgumentError(fmt::format(
          "--parallel: cp = {} runs decoder-only models without expert parallelism only (this "
          "run: model '{}', ep = {}; allowed: cp = 1, or cp > 1 with a GPT model and ep = 1)",
          par.cp, o_.model.name, par.ep));
    }
    if (par.zero >= 2) {
      return InvalidArgumentError(fmt::format(
          "--parallel: zero = {} is not supported by the runtime (Gloo has no reduce-scatter); "
          "use zero = 0 or 1 (ZeRO-1 runs as replicated AdamW, the same arithmetic)",
          par.zero));
    }
    if (!o_.replicas.has_value() && env_.world_size != par.dp * par.pp * par.cp) {
      return InvalidArgumentError(fmt::format(
          "--parallel dp={} x pp={} x cp={} needs {} processes, but the job has {} (WORLD_SIZE "
          "or --nproc)",
          par.dp, par.pp, par.cp, par.dp * par.pp * par.cp, env_.world_size));
    }
    const Backend backend = o_.backend == "nccl" ? Backend::kNccl : Backend::kGloo;
    if (o_.backend != "gloo" && o_.backend != "nccl") {
      return InvalidArgumentError(fmt::format("--backend: '{}' (allowed: gloo, nccl)", o_.backend));
    }
    for (const std::string& dir : {o_.trace_dir, o_.dump_dir}) {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::create_directories(dir, ec);
      if (ec) return IoError(fmt::format("cannot create directory {}: {}", dir, ec.message()));
    }
    // Count tensor bytes from before the first parameter on: parameters, gradients, optimizer
    // states, activations and transfer buffers (the simulator's peak counts the same things).
    if (StatusOr<std::unique_ptr<CpuMemoryCounter>> counter = CpuMemoryCounter::Install();
        counter.ok()) {
      memory_ = std::move(*counter);
    } else if (env_.rank == 0) {
      fmt::print(stderr, "sluice train: peak tensor memory is not reported: {}\n",
                 counter.status().message());
    }
    // Validate the model before the rendezvous so that bad input fails fast on every rank.
    // Process = offset + plan rank * cp + cp index (comm.h).
    const int64_t local = env_.rank - offset_;
    const int64_t dp_index = local / par.cp / par.pp;
    SLUICE_ASSIGN_OR_RETURN(
        shard_,
        ModelShard::Create(o_.model, par.pp, par.vpp, local / par.cp % par.pp, o_.seed,
                           ExpertShard{.ep = par.ep, .index = dp_index % par.ep}, par.layer_cut));
    int64_t threads = o_.threads;
    if (threads <= 0) {
      const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
      threads = std::max<int64_t>(1, cores / std::max<int64_t>(1, env_.local_world_size));
    }
    torch::set_num_threads(static_cast<int>(threads));
    SLUICE_ASSIGN_OR_RETURN(
        comm_,
        Communicator::Create(
            env_, par, WordEmbeddingRanks(o_.model, par.pp, par.vpp, par.layer_cut), backend,
            o_.timeout, RankPlacement{offset_, group_ >= 0 ? fmt::format("g{}/", group_) : ""}));
    comm_->SetLinkDelay(o_.link_delay);
    // A common time origin for the traces: rank 0's steady clock (shared on one host).
    if (env_.rank == 0) {
      epoch_ = Clock::now();
      SLUICE_RETURN_IF_ERROR(
          comm_->store().SetString(kEpochKey, std::to_string(epoch_.time_since_epoch().count())));
    } else {
      SLUICE_ASSIGN_OR_RETURN(const std::string e, comm_->store().GetString(kEpochKey));
      epoch_ = Clock::time_point(Clock::duration(std::stoll(e)));
    }
    SLUICE_ASSIGN_OR_RETURN(watchdog_, Watchdog::Start(env_, o_.timeout));
    if (o_.replicas.has_value()) {
      SLUICE_ASSIGN_OR_RETURN(
          cross_, CrossGroupSync::Create(comm_.get(), watchdog_.get(), *shard_, *o_.replicas));
    }
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        shard_->Parameters(),
        torch::optim::AdamWOptions(o_.lr).betas({0.9, 0.95}).weight_decay(0.01));
    tokens_ = std::make_unique<TokenSource>(o_.model.vocab, o_.seed);
    trace_ = std::make_unique<TraceRecorder>(env_.rank, comm_->dp_index(), comm_->pp_index());
    executor_ = std::make_unique<Executor>(shard_.get(), comm_.get(), optimizer_.get(),
                                           watchdog_.get(), trace_.get(), tokens_.get(), epoch_);
    if (env_.rank == 0) {
      service_ = std::make_unique<PlanService>(o_, env_);
      SLUICE_RETURN_IF_ERROR(service_->Start());
      if (o_.print) {
        fmt::print(
            "runtime:  {} ranks ({}dp {} x pp {}{}{}{}), {} on {}, {} thread{} per rank, "
            "{} parameters on rank 0{}\n",
            env_.world_size,
            o_.replicas.has_value()
                ? fmt::format(
                      "replica groups {}; cross-group gradient sums on rank 0: {}; group 1: ",
                      DescribeHetero(*o_.replicas), cross_->groups())
                : "",
            par.dp, par.pp, par.vpp > 1 ? fmt::format(" x vpp {}", par.vpp) : "",
            par.cp > 1 ? fmt::format(" x cp {}", par.cp) : "",
            par.ep > 1 ? fmt::format(", ep {}", par.ep) : "", o_.backend,
            backend == Backend::kNccl ? "CUDA" : "CPU (fp32)", threads, threads == 1 ? "" : "s",
            shard_->NumParameters(),
            o_.link_delay.count() > 0
                ? fmt::format(", sends delayed {:.3f} ms (--link-delay-ms)",
                              static_cast<double>(o_.link_delay.count()) * 1e-6)
                : "");
        std::fflush(stdout);
      }
      if (!o_.metrics_path.empty()) {
        // Written as PATH.tmp-XXXXXX during the run and renamed onto PATH at the end (also after
        // a failure), so a previous metrics file is replaced only by a whole new one.
        StatusOr<AtomicFileWriter> w = AtomicFileWriter::Create(o_.metrics_path);
        if (!w.ok()) {
          return IoError(fmt::format("--metrics {}: {}", o_.metrics_path, w.status().message()));
        }
        metrics_.emplace(std::move(*w));
      }
      progress_ = std::make_unique<Progress>("training", o_.iterations, stderr, 2);
    }
    return Status::Ok();
  }

  StatusOr<PlanPackage> Fetch(int64_t i) {
    StoreClient& store = comm_->store();
    const int64_t g = group_;  // -1: homogeneous
    watchdog_->BeginWait(fmt::format("waiting for the plan of iteration {}", i), 0);
    StatusOr<std::vector<uint8_t>> bytes = store.Get(PlanKey(i, g));
    StatusOr<std::string> hash = bytes.ok() ? store.GetString(HashKey(i, g)) : bytes.status();
    watchdog_->EndWait();
    SLUICE_RETURN_IF_ERROR(bytes.status());
    SLUICE_RETURN_IF_ERROR(hash.status());
    const std::string source = fmt::format("plan of iteration {}", i);
    if (HashText(*bytes) != *hash) {
      return FailedPreconditionError(fmt::format(
          "{}: hash mismatch: received {}, rank 0 published {}", source, HashText(*bytes), *hash));
    }
    SLUICE_ASSIGN_OR_RETURN(const int64_t readers, store.Add(ReadKey(i, g), 1));
    if (readers == (g < 0 ? env_.world_size : par_.devices())) {
      SLUICE_RETURN_IF_ERROR(store.Delete(PlanKey(i, g)));
      SLUICE_RETURN_IF_ERROR(store.Delete(HashKey(i, g)));
      SLUICE_RETURN_IF_ERROR(store.Delete(ReadKey(i, g)));
    }
    if (env_.rank == offset_ && !o_.dump_dir.empty()) {  // rank 0, or a group's first process
      const std::string path = fmt::format("{}/{}", o_.dump_dir,
                                           g < 0 ? PackageDumpName(i) : GroupPackageDumpName(i, g));
      SLUICE_RETURN_IF_ERROR(WriteStringToFile(
          path, std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size())));
    }
    SLUICE_ASSIGN_OR_RETURN(PlanPackage p, DecodePackage(*bytes, source));
    if (env_.rank == offset_ && !o_.trace_dir.empty() && p.kind == PackageKind::kPlan) {
      // The plan as it ran (rewritten by --moe-overlap, adjusted by --calibration), which
      // `sluice calibrate` and `sluice replay` match the traces against.
      SLUICE_RETURN_IF_ERROR(
          WritePlanFile(p.plan, fmt::format("{}/{}", o_.trace_dir,
                                            g < 0 ? fmt::format("plan-{}.json", i)
                                                  : fmt::format("plan-{}-group-{}.json", i, g))));
    }
    return p;
  }

  Status DumpGrads(int64_t i) {
    std::vector<NamedValues> out;
    for (const auto& [name, p] : shard_->NamedParameters()) {
      NamedValues v;
      v.name = name;
      const at::Tensor g = p.grad().defined() ? p.grad().contiguous() : torch::zeros_like(p);
      v.values.assign(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
      out.push_back(std::move(v));
    }
    return WriteNamedValues(fmt::format("{}/{}", o_.dump_dir, GradDumpName(i, env_.rank)), out);
  }

  Status Loop() {
    for (int64_t i = 0;; ++i) {
      if (service_) {
        service_->Started(i);
        PrintNotes();
      }
      SLUICE_ASSIGN_OR_RETURN(PlanPackage p, Fetch(i));
      if (p.kind == PackageKind::kEnd) break;
      if (p.kind == PackageKind::kError) {
        return InvalidArgumentError(
            fmt::format("rank 0 could not plan iteration {}: {}", i, p.error));
      }
      const std::string source =
          o_.plan_files.empty() ? fmt::format("plan of iteration {}", i) : o_.plan_files[i];
      SLUICE_RETURN_IF_ERROR(CheckPlanMatches(
          p.plan,
          JobConfig{o_.model, par_, o_.replicas.has_value() ? par_.devices() : env_.world_size},
          source));
      if (!p.plan.dropped.empty() && !o_.allow_partial) {
        int64_t tokens = 0;
        for (const Sample& s : p.samples) tokens += s.tokens();
        int64_t lost = 0;
        for (const UnplacedSample& u : p.plan.dropped) {
          for (const Sample& s : p.samples) {
            if (s.id == u.id) lost += s.tokens();
          }
        }
        return InvalidArgumentError(fmt::format(
            "{}: the plan leaves {} sample{} of its batch out ({} of {} tokens; first: sample {}: "
            "{}); pass --allow-partial to train such plans",
            source, p.plan.dropped.size(), p.plan.dropped.size() == 1 ? "" : "s", lost, tokens,
            p.plan.dropped[0].id, p.plan.dropped[0].reason));
      }
      watchdog_->SetProgress(i, 0);
      InjectFault(o_.fault, env_.rank, i);
      const SampleTable samples = MakeSampleTable(p.samples);
      ResetPeakRss();
      if (memory_) memory_->ResetPeak();
      Executor::BeforeStep before_step;
      if (cross_ || !o_.dump_dir.empty()) {
        before_step = [this, i] {
          if (cross_) SLUICE_RETURN_IF_ERROR(cross_->Run(i));
          return o_.dump_dir.empty() ? Status::Ok() : DumpGrads(i);
        };
      }
      // A replica group runs part of the batch: its loss is normalised by the whole batch's
      // labels (hetero_train.h).
      const int64_t loss_labels =
          o_.replicas.has_value() ? GlobalBatchLabels(o_.model, p.samples) : 0;
      SLUICE_ASSIGN_OR_RETURN(IterationResult r,
                              executor_->Run(p.plan, samples, i, before_step, loss_labels));
      RankStats stats{
          r.loss,
          r.start_ns,
          r.end_ns,
          PeakRss(),
          r.compute.nanos(),
          r.waiting.nanos(),
          memory_ ? memory_->peak().count() : -1,
          r.moe_aux_loss,
          r.moe_assignments,
          r.moe_dropped,
          r.all_to_all.nanos(),
          comm_->pp_index() == 0 && comm_->cp_index() == 0
              ? static_cast<int64_t>(p.plan.replicas.at(comm_->dp_index()).micro_batches.size())
              : 0,
          r.all_to_all_span.nanos()};
      SLUICE_RETURN_IF_ERROR(comm_->store().SetString(StatsKey(i, env_.rank), StatsToText(stats)));
      if (env_.rank == 0) {
        IterationInfo info{i, p.batch_index, 0, 0, std::nullopt, std::nullopt};
        if (service_) {
          info.optimized = service_->TakeOptimization(i);
          info.predicted = service_->TakePrediction(i);
        }
        if (o_.replicas.has_value()) {  // every group's: the batch, micro-batches in Report
          for (const Sample& s : p.samples) info.tokens += s.tokens();
          info.micro_batches = -1;
        }
        for (const PlanReplica& rep : p.plan.replicas) {
          if (o_.replicas.has_value()) break;
          info.micro_batches += static_cast<int64_t>(rep.micro_batches.size());
          for (const PlanMicroBatch& mb : rep.micro_batches) {
            for (const auto& row : mb.rows) {
              for (const int64_t id : row) info.tokens += samples.at(id).tokens();
            }
          }
        }
        // Every rank has finished iteration i - 1 by now (rank 0's iteration i needed them).
        if (pending_) SLUICE_RETURN_IF_ERROR(Report(*pending_));
        pending_ = info;
      }
      ++iterations_;
    }
    if (env_.rank == 0 && pending_) SLUICE_RETURN_IF_ERROR(Report(*pending_));
    return Status::Ok();
  }

  void PrintNotes() {
    if (!o_.print) return;
    for (const std::string& note : service_->TakeNotes()) {
      progress_->Clear();
      fmt::print("{}\n", note);
    }
  }

  // Rank 0, --optimize-budget-ms: what the optimizer did over every plan it ran on.
  void PrintOptimizerSummary() {
    if (!service_) return;
    const std::string summary = OptimizerSummary(service_->optimizer_totals());
    if (!summary.empty()) fmt::print("{}\n", summary);
  }

  // Rank 0, --calibration: the calibrated simulator against what ran.
  void PrintPredictionSummary() {
    const std::string summary = predictions_.Summary(static_cast<bool>(o_.adjust_plan));
    if (!summary.empty()) fmt::print("{}\n", summary);
  }

  // Rank 0: collects every rank's figures of an iteration and prints its line.
  Status Report(IterationInfo info) {
    if (info.micro_batches < 0) info.micro_batches = 0;  // summed over the ranks below
    IterationFigures f;
    for (int64_t r = 0; r < env_.world_size; ++r) {
      watchdog_->BeginWait(fmt::format("the figures of iteration {}", info.iteration), r);
      StatusOr<std::string> text = comm_->store().GetString(StatsKey(info.iteration, r));
      watchdog_->EndWait();
      SLUICE_RETURN_IF_ERROR(text.status());
      SLUICE_RETURN_IF_ERROR(comm_->store().Delete(StatsKey(info.iteration, r)));
      SLUICE_ASSIGN_OR_RETURN(RankStats s, StatsFromText(*text));
      f.Add(r, s);
    }
    if (o_.replicas.has_value()) info.micro_batches += f.micro_batches;
    if (first_start_ns_ < 0) first_start_ns_ = f.start_ns;
    last_end_ns_ = f.end_ns;
    total_tokens_ += info.tokens;
    if (losses_.empty()) first_loss_ = f.loss;
    losses_.push_back(f.loss);
    const std::string predicted_text =
        info.predicted ? predictions_.Add(*info.predicted, f) : std::string();
    const bool moe = o_.model.moe.has_value();
    if (o_.print) {
      progress_->Clear();
      fmt::print("{}\n", IterationLine(info, f, moe, o_.parallel.ep, predicted_text));
      std::fflush(stdout);
      progress_->Add();
    }
    if (metrics_) {
      SLUICE_RETURN_IF_ERROR(metrics_->Append(MetricsLine(info, f, moe).dump() + "\n"));
    }
    return Status::Ok();
  }

  Status WriteTrace() {
    if (o_.trace_dir.empty()) return Status::Ok();
    return WriteStringToFile(fmt::format("{}/trace-rank-{}.json", o_.trace_dir, env_.rank),
                             trace_->ToChromeJson());
  }

  Status CommitMetrics() {
    if (!metrics_) return Status::Ok();
    Status s = metrics_->Commit();
    metrics_.reset();
    return s;
  }

  // Best effort after a failure: the messages go to stderr, the failure's own status is what
  // the command reports.
  void FlushAfterFailure() {
    if (trace_) {
      if (Status s = WriteTrace(); !s.ok()) {
        fmt::print(stderr,
                   "sluice train: rank {}: the trace of the failed run was not written: "
                   "{}\n",
                   env_.rank, s.message());
      } else if (!o_.trace_dir.empty()) {
        fmt::print(stderr,
                   "sluice train: rank {}: trace of what ran before the failure: "
                   "{}/trace-rank-{}.json\n",
                   env_.rank, o_.trace_dir, env_.rank);
      }
    }
    if (Status s = CommitMetrics(); !s.ok()) {
      fmt::print(stderr, "sluice train: the metrics of the failed run were not written: {}\n",
                 s.message());
    }
  }

  Status Finish() {
    SLUICE_RETURN_IF_ERROR(WriteTrace());
    SLUICE_RETURN_IF_ERROR(CommitMetrics());
    if (env_.rank != 0) {
      watchdog_->Finish();
      return comm_->store().Add(kDoneKey, 1).status();
    }
    // Rank 0 serves the store: wait until every other rank is done with it (the watchdog times
    // the wait and names a rank that never finishes).
    std::vector<int64_t> others;
    for (int64_t r = 1; r < env_.world_size; ++r) others.push_back(r);
    if (!others.empty()) watchdog_->BeginWait("waiting for the other ranks to finish", others);
    for (;;) {
      SLUICE_ASSIGN_OR_RETURN(const int64_t done, comm_->store().Add(kDoneKey, 0));
      if (done >= env_.world_size - 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    watchdog_->EndWait();
    watchdog_->Finish();
    std::string merged_path;
    if (!o_.trace_dir.empty()) {
      std::vector<std::string> docs;
      for (int64_t r = 0; r < env_.world_size; ++r) {
        SLUICE_ASSIGN_OR_RETURN(
            std::string d, ReadFileToString(fmt::format("{}/trace-rank-{}.json", o_.trace_dir, r)));
        docs.push_back(std::move(d));
      }
      SLUICE_ASSIGN_OR_RETURN(const std::string merged, MergeChromeTraces(docs));
      merged_path = fmt::format("{}/trace.json", o_.trace_dir);
      SLUICE_RETURN_IF_ERROR(WriteStringToFile(merged_path, merged));
    }
    if (o_.print) {
      progress_->Finish();
      PrintNotes();
      const double seconds = static_cast<double>(last_end_ns_ - first_start_ns_) * 1e-9;
      if (iterations_ == 0) {
        fmt::print("no iteration ran (no batch could be planned)\n");
      } else {
        fmt::print(
            "\ntrained {} iterations: {} real tokens in {:.2f} s = {:.0f} tokens/s; loss "
            "{:.4f} -> {:.4f} (the data's next-token entropy is {:.2f} nats)\n",
            iterations_, total_tokens_, seconds,
            seconds > 0 ? static_cast<double>(total_tokens_) / seconds : 0.0, first_loss_,
            losses_.back(), tokens_->ConditionalEntropy());
      }
      PrintOptimizerSummary();
      PrintPredictionSummary();
      if (!merged_path.empty()) {
        fmt::print("traces: {}/trace-rank-*.json, merged {}\n", o_.trace_dir, merged_path);
      }
    }
    return Status::Ok();
  }

  const TrainOptions& o_;
  DistEnv env_;  // Setup renumbers rank to the plan's process numbering (par.order)
  ParallelConfig par_;  // the job's, or this process's replica group's
  int64_t group_ = -1;  // heterogeneous replicas: this process's group (-1: homogeneous)
  int64_t offset_ = 0;  // the first process of the group
  // First member: destroyed last, after every tensor the trainer owns.
  std::unique_ptr<CpuMemoryCounter> memory_;
  std::unique_ptr<ModelShard> shard_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<TokenSource> tokens_;
  std::unique_ptr<TraceRecorder> trace_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<CrossGroupSync> cross_;  // heterogeneous replicas
  std::unique_ptr<PlanService> service_;
  std::unique_ptr<Progress> progress_;
  std::optional<AtomicFileWriter> metrics_;  // rank 0, with --metrics
  Clock::time_point epoch_;
  std::optional<IterationInfo> pending_;
  int64_t iterations_ = 0, total_tokens_ = 0;
  PredictionTotals predictions_;  // rank 0, --calibration
  int64_t first_start_ns_ = -1, last_end_ns_ = 0;
  double first_loss_ = 0;
  std::vector<double> losses_;
};

}  // namespace

Status Train(const TrainOptions& options, const DistEnv& env) {
  Trainer trainer(options, env);
  return trainer.Run();
}

}  // namespace sluice::runtime
