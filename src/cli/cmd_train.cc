// `sluice train`: trains a model for real on libtorch + c10d, executing the planner's execution
// plans (src/runtime/, docs/runtime.md). Launched like torchrun launches (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or with --nproc N it starts N local ranks itself.
// Compiled only when the build has libtorch (SLUICE_WITH_TORCH); runtime/trainer.h is torch-free.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "cli/cli_common.h"
#include "cli/scenario_flags.h"
#include "passes/moe_overlap.h"
#include "planner/hetero.h"
#include "runtime/cpu_bind.h"
#include "runtime/host_allocator.h"
#include "runtime/launcher.h"
#include "runtime/trainer.h"
#include "trace/calibration.h"

namespace sluice::cli {
namespace {

struct TrainFlags {
  ScenarioFlags scenario;
  PlannerFlags planner;
  int64_t nproc = 0;
  double lr = 1e-3;
  std::string trace_dir;
  std::string metrics;
  std::string dump_dir;
  std::vector<std::string> plans;
  int64_t timeout_s = 300;
  int64_t threads = 0;
  int64_t lookahead = 2;
  std::string backend = "gloo";
  std::string fault;
  double link_delay_ms = 0;
  bool allow_partial = false;
  std::string run_id;
  std::string bind;
  std::string iface;
  std::string calibration;               // --calibration FILE
  std::string moe_overlap;               // --moe-overlap NAME (passes/moe_overlap.h), empty: off
  std::string replicas;                  // --replicas SPEC|FILE (heterogeneous replica groups)
  std::string host_allocator = "cache";  // --host-allocator (runtime/host_allocator.h)
  std::string cpu_bind = "none";         // --cpu-bind (runtime/cpu_bind.h)
  std::string layer_cut = "even";        // --layer-cut even | balanced
  const CLI::Option* parallel_option = nullptr;    // whether --parallel was given
  const CLI::Option* iterations_option = nullptr;  // whether --iterations was given
};

// --replicas: the groups, checked against what the other flags ask for and what the runtime
// runs (runtime/hetero_train.h).
StatusOr<HeteroConfig> ResolveTrainReplicas(const TrainFlags& f) {
  if (f.parallel_option != nullptr && f.parallel_option->count() > 0) {
    return InvalidArgumentError(
        "--replicas and --parallel: give one (--replicas 'dp=1,pp=2;dp=1,pp=1' sets every "
        "replica group's shape)");
  }
  const std::pair<bool, const char*> excluded[] = {
      {!f.plans.empty(), "--plan"},
      {f.planner.optimize_budget_ms > 0, "--optimize-budget-ms"},
      {!f.calibration.empty(), "--calibration"},
      {!f.moe_overlap.empty(), "--moe-overlap"},
      {f.allow_partial, "--allow-partial"}};
  for (const auto& [given, flag] : excluded) {
    if (given) {
      return InvalidArgumentError(fmt::format(
          "--replicas with {}: heterogeneous replicas are planned by rank 0 each iteration and "
          "train whole batches (leave out {})",
          flag, flag));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(HeteroConfig config, ResolveHetero(f.replicas, "--replicas"));
  SLUICE_RETURN_IF_ERROR(
      runtime::CheckHeteroRunnable(config, f.nproc > 0 ? f.nproc : config.devices(), "--replicas"));
  return config;
}

Status RunTrain(const TrainFlags& f) {
  SLUICE_ASSIGN_OR_RETURN(runtime::DistEnv env, runtime::ReadDistEnv());
  if (!f.plans.empty() && f.planner.optimize_budget_ms > 0) {
    return InvalidArgumentError(
        "--optimize-budget-ms with --plan: the plan files run as they are (train plans nothing); "
        "optimize them first with `sluice optimize PLAN --out FILE`, or leave out --plan");
  }
  // Outputs are checked before anything is planned or launched (and by every rank before the
  // rendezvous): rank 0 (or the launcher) writes the metrics, every rank its trace and dumps.
  if (!f.metrics.empty() && env.rank == 0) {
    std::vector<NamedInput> inputs = ScenarioInputs(f.scenario);
    for (const std::string& plan : f.plans) inputs.push_back({"--plan", plan});
    SLUICE_RETURN_IF_ERROR(CheckOutputFile("--metrics", f.metrics));
    SLUICE_RETURN_IF_ERROR(CheckNotAnInput("--metrics", f.metrics, inputs));
  }
  if (!f.trace_dir.empty()) SLUICE_RETURN_IF_ERROR(PrepareOutputDir("--trace-dir", f.trace_dir));
  if (!f.dump_dir.empty()) SLUICE_RETURN_IF_ERROR(PrepareOutputDir("--dump-dir", f.dump_dir));
  if (!f.run_id.empty()) env.run_id = f.run_id;
  if (!f.iface.empty()) env.gloo_iface = f.iface;
  env.bind_addr = f.bind;
  SLUICE_RETURN_IF_ERROR(ParseScheduleKind(f.planner.schedule).status());
  SLUICE_ASSIGN_OR_RETURN(const runtime::HostAllocator allocator,
                          runtime::ParseHostAllocator(f.host_allocator, "--host-allocator"));
  SLUICE_ASSIGN_OR_RETURN(const runtime::CpuBind cpu_bind,
                          runtime::ParseCpuBind(f.cpu_bind, "--cpu-bind"));
  // Read by the launcher and by every rank, so that a bad file fails before anything runs; rank
  // 0 applies it.
  std::optional<trace::Calibration> calibration;
  if (!f.calibration.empty()) {
    StatusOr<trace::Calibration> c = trace::ReadCalibrationFile(f.calibration);
    if (!c.ok()) return c.status().WithPrefix("--calibration");
    calibration = std::move(*c);
  }
  // Every rank (and the launcher, to fail fast on bad flags) resolves the same scenario and
  // builds the same planner (rank 0 plans with it).
  ScenarioFlags scenario_flags = f.scenario;
  std::optional<HeteroConfig> replicas;
  if (!f.replicas.empty()) {
    SLUICE_ASSIGN_OR_RETURN(replicas, ResolveTrainReplicas(f));
    // The scenario's own configuration only carries the devices; each group plans its own.
    scenario_flags.parallel = fmt::format("dp={}", replicas->devices());
  }
  if (scenario_flags.cluster == "cpu") {
    // The default target: this host's cores, as many "devices" as the configuration's ranks.
    SLUICE_ASSIGN_OR_RETURN(ParallelConfig par, ResolveParallel(scenario_flags.parallel));
    scenario_flags.cluster = fmt::format("cpu:{}", par.devices());
  }
  SLUICE_ASSIGN_OR_RETURN(Scenario sc, ResolveScenarioFlags(scenario_flags));
  std::string cut_line;
  if (f.layer_cut != "even" && f.layer_cut != "balanced") {
    return InvalidArgumentError(
        fmt::format("--layer-cut: '{}' is not a cut rule (allowed: even, balanced)", f.layer_cut));
  }
  if (f.layer_cut == "balanced") {
    if (replicas.has_value()) {
      return InvalidArgumentError(
          "--layer-cut balanced: heterogeneous replica groups (--replicas) cut their layers "
          "evenly (allowed with --replicas: even)");
    }
    if (!f.plans.empty()) {
      return InvalidArgumentError(
          "--layer-cut balanced: with --plan the plans carry their cut (give the run's cut with "
          "--parallel ...,layer_cut=N+N+...)");
    }
    // The run's first batches, from a fresh copy of the data (the run's own batcher stays at
    // its first batch). Every rank computes the same cut.
    SLUICE_ASSIGN_OR_RETURN(Scenario first, ResolveScenarioFlags(scenario_flags));
    const std::vector<GlobalBatch> batches = TakeLayerCutBatches(first);
    SLUICE_ASSIGN_OR_RETURN(
        cut_line, ApplyLayerCutFlag(f.layer_cut, &sc, scenario_flags, f.planner, batches));
  }
  SLUICE_ASSIGN_OR_RETURN(const Planner planner,
                          MakePlannerFromFlags(sc, scenario_flags, f.planner));
  std::optional<HeteroPlanner> hetero_planner;
  if (replicas.has_value()) {
    // The scenario's memory limit (or reserve) on every group that gives none.
    for (ParallelConfig& g : replicas->groups) {
      if (g.memory_limit.has_value() || g.memory_reserve.has_value()) continue;
      g.memory_limit = sc.memory_limit;
      if (!g.memory_limit.has_value()) g.memory_reserve = sc.memory_reserve;
    }
    HeteroPlannerOptions options;
    options.planner = planner.options();
    SLUICE_ASSIGN_OR_RETURN(hetero_planner, HeteroPlanner::Create(*sc.cost, *replicas, sc.cluster,
                                                                  options, "--replicas"));
  }
  runtime::TrainOptions o;
  if (!f.moe_overlap.empty()) {
    StatusOr<passes::MoeOverlap> overlap = passes::ParseMoeOverlap(f.moe_overlap, "--moe-overlap");
    if (!overlap.ok()) return overlap.status();
    if (!sc.model.moe.has_value() || sc.parallel->ep <= 1) {
      return InvalidArgumentError(fmt::format(
          "--moe-overlap {}: needs an MoE model with expert parallelism (--parallel ...,ep=N, N > "
          "1); model '{}' at ep {} has no all-to-all to overlap",
          f.moe_overlap, sc.model.name, sc.parallel->ep));
    }
    if (*overlap == passes::MoeOverlap::kTutel && f.planner.schedule == "zb-h1") {
      return InvalidArgumentError(
          "--moe-overlap tutel: the runtime runs capacity slices in forward and backward ops, "
          "not in a split backward (--schedule zb-h1 splits every backward into I and W, whose "
          "experts' weight gradients come from a tape that sliced experts do not write); use "
          "--schedule 1f1b, interleaved, gpipe or adaptive, or --moe-overlap none or dw");
    }
    if ((*overlap == passes::MoeOverlap::kMegatron ||
         *overlap == passes::MoeOverlap::kLancetMegatron) &&
        sc.parallel->pp > 1) {
      return InvalidArgumentError(fmt::format(
          "--moe-overlap {}: interleaves a backward with the next forward on one stage, so it "
          "needs pp = 1 (--parallel has pp = {}); use none, dw, partition or lancet with "
          "pipelines",
          f.moe_overlap, sc.parallel->pp));
    }
    // The runtime flattens a stage's gradients once its backward is complete, so the buckets
    // stay after the backward (a reduction overlapped with a segmented backward would be
    // deferred to there anyway): the plan that is simulated is the plan that runs.
    passes::MoeOverlapOptions mo;
    mo.overlap_grad_reduction = false;
    o.rewrite_plan = [overlap = *overlap, mo](ExecutionPlan* plan) -> std::string {
      StatusOr<passes::PassRecord> record = passes::MoeOverlapPass(overlap, mo).Run(plan);
      if (!record.ok())
        return fmt::format("--moe-overlap not applied: {}", record.status().message());
      if (!record->rejected.empty()) {
        return fmt::format("--moe-overlap not applied (the plan runs whole ops): {}",
                           record->rejected);
      }
      if (!record->degraded.empty()) {
        return fmt::format("--moe-overlap {} applied with less: {}",
                           passes::MoeOverlapName(overlap), record->degraded);
      }
      return "";
    };
  }
  if (f.link_delay_ms * 1e-3 >= static_cast<double>(f.timeout_s)) {
    return InvalidArgumentError(fmt::format(
        "--link-delay-ms {}: must be below --timeout ({} s), else every transfer times out",
        f.link_delay_ms, f.timeout_s));
  }
  o.link_delay = std::chrono::nanoseconds(std::llround(f.link_delay_ms * 1e6));
  if (!f.fault.empty()) {
    SLUICE_ASSIGN_OR_RETURN(o.fault, runtime::ParseFault(f.fault));
  }
  if (f.nproc > 0 && !env.launched) {
    if (env.world_size > 1) {
      return InvalidArgumentError(fmt::format(
          "--nproc {}: this process already is rank {} of {} (RANK/WORLD_SIZE are set); use "
          "either a launcher or --nproc",
          f.nproc, env.rank, env.world_size));
    }
    SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> argv, runtime::SelfCommandLine());
    runtime::LaunchOptions lo;
    lo.nproc = f.nproc;
    lo.master_addr = env.master_addr;
    lo.master_port = env.master_port;
    lo.run_id = f.run_id;  // "" = a fresh id per launch, so two launches never share a store
    return runtime::LaunchLocal(argv, lo);
  }
  if (f.nproc > 0 && env.world_size != f.nproc) {
    return InvalidArgumentError(
        fmt::format("--nproc {} but WORLD_SIZE is {}", f.nproc, env.world_size));
  }
  o.model = sc.model;
  o.parallel = *sc.parallel;
  o.planner = &planner;
  if (hetero_planner.has_value()) {
    o.replicas = hetero_planner->config();
    o.hetero_planner = &*hetero_planner;
  }
  o.batcher = &*sc.batcher;
  o.plan_files = f.plans;
  if (!f.plans.empty() && env.rank == 0) {
    // Plan files name samples by id; their lengths are the data's, clipped as batching clips.
    GlobalBatch batch;
    while (sc.batcher->Next(&batch)) {
      o.plan_samples.insert(o.plan_samples.end(), batch.samples.begin(), batch.samples.end());
    }
  }
  o.iterations = sc.iterations;
  if (!f.plans.empty()) {
    // One iteration per plan file, all of them, or the first --iterations when it is given (its
    // default, 20, does not cut a longer list of plans).
    const auto files = static_cast<int64_t>(f.plans.size());
    const bool given = f.iterations_option != nullptr && f.iterations_option->count() > 0;
    o.iterations = given && sc.iterations > 0 ? std::min(sc.iterations, files) : files;
  }
  o.max_seqlen = sc.max_seqlen;
  o.allow_partial = f.allow_partial;
  o.lookahead = f.lookahead;
  o.seed = f.scenario.seed;
  o.lr = f.lr;
  o.timeout = std::chrono::seconds(f.timeout_s);
  o.threads = f.threads;
  o.backend = f.backend;
  o.trace_dir = f.trace_dir;
  o.metrics_path = f.metrics;
  o.dump_dir = f.dump_dir;
  if (calibration.has_value()) {
    o.adjust_plan = [c = std::move(*calibration)](ExecutionPlan* plan) {
      trace::ApplyCalibration(c, plan);
    };
  }
  if (env.rank == 0) {
    // With --replicas the groups are named on their own line (the scenario's dp is a placeholder).
    fmt::print("{}\n", sc.Describe({.parallel = !hetero_planner.has_value()}));
    if (!cut_line.empty()) fmt::print("{}", cut_line);
    fmt::print("method:   {}, schedule {}{}\n", f.planner.method, f.planner.schedule,
               f.plans.empty() ? (f.planner.no_search ? "" : ", micro-batch order searched")
                               : fmt::format(", {} plan files", f.plans.size()));
    if (hetero_planner.has_value()) {
      std::string caps;
      for (size_t g = 0; g < hetero_planner->capacities().size(); ++g) {
        caps += fmt::format("{}{}", g ? " / " : "", hetero_planner->capacities()[g]);
      }
      fmt::print(
          "replicas: {} ({} replica groups on {} processes; longest sequence per group: {}; "
          "sequences routed by Hydraulis' stage 1, planner/hetero.h)\n",
          DescribeHetero(hetero_planner->config()), hetero_planner->config().groups.size(),
          hetero_planner->config().devices(), caps);
    }
    if (!f.calibration.empty()) {
      fmt::print(
          "calibration: {} (each plan's simulated time and peak memory, calibrated, "
          "beside the measured ones)\n",
          f.calibration);
    }
    std::fflush(stdout);
  }
  // Every rank, before its model exists (the launcher's own process never gets here).
  const std::string allocator_note = runtime::ConfigureHostAllocator(allocator);
  if (env.rank == 0) fmt::print("host allocator: {}\n", allocator_note);
  SLUICE_ASSIGN_OR_RETURN(const std::string bind_note,
                          runtime::BindCpus(cpu_bind, env.local_rank, env.local_world_size));
  if (env.rank == 0 && cpu_bind != runtime::CpuBind::kNone) {
    fmt::print("cpu binding: {}\n", bind_note);
  }
  std::fflush(stdout);
  return runtime::Train(o, env);
}

}  // namespace

void RegisterTrainCommands(CLI::App* app, RunState* state) {
  auto flags = std::make_shared<TrainFlags>();
  // Defaults for a CPU run of the tiny model; --cluster is the target the planner prices, by
  // default this host's cores (the cpu preset, one device per rank).
  flags->scenario.model = "gpt-tiny";
  flags->scenario.cluster = "cpu";
  flags->scenario.parallel = "pp=2";
  flags->scenario.tokens_per_batch = 4096;
  flags->scenario.max_seqlen = 512;
  flags->scenario.memory_limit_mb = 0;
  CLI::App* t = app->add_subcommand(
      "train",
      "Train for real on libtorch + c10d, executing the planner's plans (docs/runtime.md)");
  AddScenarioFlags(t, &flags->scenario);
  AddPlannerFlags(t, &flags->planner);
  flags->parallel_option = t->get_option("--parallel");
  flags->iterations_option = t->get_option("--iterations");
  t->add_option("--replicas", flags->replicas,
                "Heterogeneous replica groups instead of --parallel: groups separated by ';', "
                "each dp,pp,cp as --parallel (tp, ep, vpp 1, zero 0 or 1), e.g. "
                "'dp=1,pp=2;dp=1,pp=1' (3 processes), or a JSON file (docs/runtime.md); each "
                "batch's sequences are routed to the groups by length")
      ->type_name("SPEC|FILE");
  // The plans always run on this host's CPUs; --cluster and --memory-limit describe the target
  // the planner prices them for.
  t->get_option("--cluster")
      ->description(
          "The planner's target, which prices the plans (they run on this host's CPUs either "
          "way): PRESET:N or a JSON ClusterSpec file; cpu = this host's cores, one device per "
          "rank (dp x pp)");
  t->get_option("--memory-limit")
      ->description(
          "The planner's per-device budget in MB (10^6 bytes) on the --cluster target, used as "
          "given (not a limit on these processes); default: the device's memory less "
          "--memory-reserve");
  t->add_option("--calibration", flags->calibration,
                "Price every plan with a calibration file (sluice calibrate --out) and print its "
                "simulated iteration time and peak memory beside the measured ones (what runs, "
                "and the planner's choices, are unchanged)")
      ->type_name("FILE");
  t->add_option("--nproc", flags->nproc,
                "Start N local ranks (otherwise read torchrun's RANK, WORLD_SIZE, MASTER_ADDR, "
                "MASTER_PORT; default port 29500)")
      ->check(NumberCheck(1, false, 4096, "an integer in [1, 4096]"));
  t->add_option("--lr", flags->lr, "AdamW learning rate")
      ->check(NumberCheck(0, true, 1e3, "a number in (0, 1000]"))
      ->capture_default_str();
  t->add_option("--trace-dir", flags->trace_dir,
                "Write Chrome/Perfetto traces: trace-rank-R.json per rank and trace.json")
      ->type_name("DIR")
      ->check(PathCheck());
  t->add_option("--metrics", flags->metrics, "Write one JSON line per iteration")
      ->type_name("FILE")
      ->check(PathCheck());
  t->add_option("--timeout", flags->timeout_s,
                "Seconds a rank may wait for another (rendezvous, transfers, heartbeats) before "
                "every rank exits non-zero naming it")
      ->check(NumberCheck(1, false, 86400, "an integer in [1, 86400]"))
      ->capture_default_str();
  t->add_option("--moe-overlap", flags->moe_overlap,
                "Rewrite every plan with an MoE overlap pass before it runs "
                "(passes/moe_overlap.h): none (segmented, all-to-alls blocking), dw (Lancet's "
                "weight gradients in the backward all-to-alls' windows), megatron (pp 1: a "
                "backward interleaved with the next forward), tutel (each MoE block's "
                "dispatch, experts and combine cut into 4 capacity slices; not with zb-h1), "
                "partition (Lancet's forward partition: forwards cut into token slices of their "
                "rows where the DP finds it shorter), lancet (dw and partition) or "
                "lancet-megatron (pp 1: megatron's pairs, the unpaired forwards partitioned); the "
                "rewritten plan is simulated and its prediction printed beside the measured time "
                "(needs an MoE model and ep > 1)")
      ->type_name("NAME");
  t->add_option("--plan", flags->plans,
                "Execute these plan files (sluice plan --out), one per iteration, instead of "
                "planning: all of them, or the first --iterations when that is given")
      ->type_name("FILE");
  t->add_option("--dump-dir", flags->dump_dir,
                "Write each iteration's plan package and every rank's gradients (for checks)")
      ->type_name("DIR")
      ->check(PathCheck());
  t->add_option("--threads", flags->threads, "Intra-op threads per rank (0 = cores / local ranks)")
      ->check(IntegerCheck(0, 4096, "an integer in [0, 4096], 0 = cores / local ranks"))
      ->capture_default_str();
  t->add_option("--host-allocator", flags->host_allocator,
                "How freed CPU tensors are kept on every rank: cache (glibc's mmap and trim "
                "thresholds at 1 GiB: each iteration reuses the memory the last one freed "
                "instead of mapping and faulting it in again; steadier iteration times, resident "
                "memory at its high-water mark) or system (glibc's own policy); the "
                "MALLOC_*_ environment variables, when set, win")
      ->capture_default_str();
  t->add_option("--layer-cut", flags->layer_cut,
                "Layers per pipeline chunk: even (the same number each, or --parallel's "
                "layer_cut=...) or balanced (the cut `sluice plan --layer-cut balanced` chooses "
                "on the run's first 3 batches; every rank finds the same one)")
      ->type_name("even|balanced")
      ->capture_default_str();
  t->add_option("--cpu-bind", flags->cpu_bind,
                "none (the scheduler places every rank's threads) or cores (this machine's "
                "allowed CPUs cut into one contiguous part per local rank, each rank bound to its "
                "own, as torchrun's and numactl's core binding)")
      ->capture_default_str();
  t->add_option("--lookahead", flags->lookahead,
                "Plans rank 0 keeps ready beyond the running iteration")
      ->check(NumberCheck(1, false, 64, "an integer in [1, 64]"))
      ->capture_default_str();
  t->add_option("--backend", flags->backend, "gloo (CPU) or nccl (needs a CUDA libtorch build)")
      ->capture_default_str();
  t->add_option("--fault", flags->fault,
                "Testing aid: RANK:ITERATION:KIND injects a failure (exit, kill, stop, hang)")
      ->type_name("R:I:KIND");
  t->add_option("--link-delay-ms", flags->link_delay_ms,
                "Testing aid: every point-to-point send leaves MS later (a helper thread posts "
                "it; the sender computes on), as on a slower link; sluice replay --what-if "
                "link+=MSms predicts it")
      ->type_name("MS")
      ->check(NumberCheck(0, false, 10000, "a number of milliseconds in [0, 10000]"));
  t->add_flag("--allow-partial", flags->allow_partial,
              "Train plans that leave samples of their batch out (otherwise an error)");
  t->add_option("--run-id", flags->run_id,
                "Job id scoping every store key; the store refuses ranks of another id "
                "(default: SLUICE_RUN_ID, torchrun's TORCHELASTIC_RUN_ID, a fresh id with "
                "--nproc, else 'sluice')")
      ->type_name("ID")
      ->check([](const std::string& v) {
        return v.empty() || v.size() > 128 ? std::string("must be 1 to 128 characters") : "";
      });
  t->add_option("--bind", flags->bind,
                "This rank's address for the Gloo transfers (default: the local address that "
                "routes to MASTER_ADDR); rank 0's store binds MASTER_ADDR only")
      ->type_name("ADDR");
  t->add_option("--iface", flags->iface,
                "This rank's network interface for the Gloo transfers (as GLOO_SOCKET_IFNAME)")
      ->type_name("NAME");
  SetHandler(t, state, [flags] { return RunTrain(*flags); });
}

}  // namespace sluice::cli
