#include "runtime/executor.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>

#include "plan/instruction.h"
#include "plan/moe_segments.h"
#include "runtime/context_parallel.h"
#include "runtime/grad_reduction.h"
#include "runtime/layout.h"
#include "runtime/moe_exchange.h"
#include "runtime/p2p_transfers.h"
#include "runtime/segmented_ops.h"

namespace sluice::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using Tensors = std::vector<at::Tensor>;

// What a forward left for its backward.
struct StageRun {
  Tensors inputs;        // autograd leaves (stage > 0) or token tensors (stage 0)
  at::Tensor labels;     // last stage
  Tensors outputs;       // graph-connected outputs (or the loss on the last stage)
  at::Tensor aux_loss;   // MoE load-balancing loss of the chunk (undefined when none)
  // recompute "full" at ep > 1: the forward's all-to-alls and what they received, for the replay.
  const std::vector<const Instruction*>* a2a_forward = nullptr;
  std::vector<at::Tensor> a2a_received;
  bool replay = false;   // recompute "full": outputs carry no graph until replayed
  Tensors grad_outputs;  // the gradients of `outputs` (backward-input reads them)
  // Split backward (backward-input, then backward-weight): the ops the forward recorded and,
  // after backward-input, the gradients of their outputs (model.h, WeightGradTape).
  std::unique_ptr<WeightGradTape> tape;
};

class IterationRun {
 public:
  IterationRun(ModelShard* shard, Communicator* comm, torch::optim::Optimizer* optimizer,
               Watchdog* watchdog, TraceRecorder* trace, const TokenSource* tokens,
               Clock::time_point epoch, const ExecutionPlan& plan, const SampleTable& samples,
               int64_t iteration, int64_t loss_labels)
      : shard_(*shard),
        comm_(*comm),
        optimizer_(*optimizer),
        watchdog_(*watchdog),
        trace_(*trace),
        tokens_(*tokens),
        epoch_(epoch),
        plan_(plan),
        samples_(samples),
        iteration_(iteration),
        loss_labels_(loss_labels),
        rank_(comm->rank()),
        program_(plan.ranks[comm->plan_rank()]),
        replica_(plan.replicas[program_.dp_index]),
        num_stages_(plan.num_stages()),
        p2p_(*comm, *watchdog, *trace, epoch, iteration, [this] { return Now(); }),
        exchange_(
            *comm, *watchdog, *trace, [this] { return Now(); }, iteration),
        cp_gather_(comm, watchdog),
        grads_(*shard, *comm, *watchdog, *trace, iteration, [this] { return Now(); }),
        segmented_(program_, *comm, *watchdog, *trace, [this] { return Now(); }, iteration,
                   [this](const Instruction& whole, const std::vector<const Instruction*>* a2a) {
                     return whole.op == OpKind::kForward ? Forward(whole, a2a)
                                                         : Backward(whole, a2a);
                   }) {}

  StatusOr<IterationResult> Run(const Executor::BeforeStep& before_step) {
    IterationResult result;
    result.start_ns = Now();
    before_step_ = &before_step;
    int64_t labels = loss_labels_;
    if (labels <= 0) {
      SLUICE_ASSIGN_OR_RETURN(labels, GlobalLabelTokens(plan_, samples_));
    }
    loss_scale_ = 1.0 / static_cast<double>(std::max<int64_t>(labels, 1));
    SLUICE_RETURN_IF_ERROR(grads_.Prepare(program_));
    for (const Instruction& in : program_.instructions) {
      if (in.op == OpKind::kBackwardInput) split_.insert(Key(in));
    }
    SLUICE_RETURN_IF_ERROR(AttachAllToAlls(program_, comm_.ep_group(), segmented_, &a2a_of_, &last_backward_));
    slots_.assign(static_cast<size_t>(program_.buffer_slots), Tensors{});
    for (size_t i = 0; i < program_.instructions.size(); ++i) {
      const Instruction& in = program_.instructions[i];
      pc_ = static_cast<int64_t>(i);
      watchdog_.SetProgress(iteration_, static_cast<int64_t>(i));
      const int64_t start = Now();
      Status s;
      try {
        s = Execute(in);
      } catch (const std::exception& e) {
        s = InternalError(e.what());
      }
      if (!s.ok()) {
        return Status(s.code(), fmt::format("rank {}, iteration {}, instruction {} ({}): {}",
                                            rank_, iteration_, i, InstructionText(in),
                                            s.message()));
      }
      const int64_t end = Now();
      TraceEvent e = Event(in, TraceStream::kCompute, start, end);
      e.bytes = last_bytes_;
      last_bytes_ = 0;
      trace_.Add(std::move(e));
      if (IsCompute(in.op)) compute_ns_ += end - start;
      if (IsCommFinish(in.op) || in.op == OpKind::kOptimizerStep ||
          in.op == OpKind::kAllToAllWait) {
        wait_ns_ += end - start;
      }
      if (Status f = grads_.PostDeferred(static_cast<int64_t>(i), last_backward_); !f.ok()) {
        return Status(f.code(), fmt::format("rank {}, iteration {}, instruction {} ({}): {}",
                                            rank_, iteration_, i, InstructionText(in),
                                            f.message()));
      }
    }
    if (!runs_.empty() || p2p_.in_flight() > 0 || grads_.outstanding() > 0 ||
        segmented_.running() > 0 || segmented_.posted() > 0) {
      return InternalError(fmt::format(
          "rank {}: the program ended with {} stage runs, {} transfers, {} reductions, {} "
          "segmented ops and {} posted all-to-alls outstanding",
          rank_, runs_.size(), p2p_.in_flight(), grads_.outstanding(), segmented_.running(),
          segmented_.posted()));
    }
    result.loss = loss_;
    result.instructions = static_cast<int64_t>(program_.instructions.size());
    result.end_ns = Now();
    result.compute = Duration::Nanos(compute_ns_);
    result.waiting = Duration::Nanos(wait_ns_);
    result.moe_aux_loss = aux_loss_;
    result.moe_assignments = moe_assignments_;
    result.moe_dropped = moe_dropped_;
    result.all_to_all = Duration::Nanos(exchange_.nanos() + segmented_.exposed_ns());
    result.all_to_all_span = Duration::Nanos(exchange_.nanos() + segmented_.span_ns());
    return result;
  }

 private:
  int64_t Now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - epoch_).count();
  }

  TraceEvent Event(const Instruction& in, TraceStream stream, int64_t start, int64_t end) const {
    TraceEvent e;
    e.name = InstructionText(in);
    e.op = std::string(OpKindName(in.op));
    e.stream = stream;
    e.iteration = iteration_;
    e.microbatch = in.microbatch;
    e.stage = in.stage;
    e.peer = in.peer;
    e.start_ns = start;
    e.end_ns = end;
    return e;
  }

  Status Execute(const Instruction& in) {
    switch (in.op) {
      case OpKind::kLoadInput: return LoadInput(in);
      case OpKind::kForward:
        return in.segment >= 0 ? segmented_.Piece(in, pc_) : Forward(in, AllToAllsOfCurrent());
      case OpKind::kBackward:
      case OpKind::kBackwardInput:
        return in.segment >= 0 ? segmented_.Piece(in, pc_) : Backward(in, AllToAllsOfCurrent());
      case OpKind::kBackwardWeight: return in.segment >= 0 ? WeightPiece(in) : BackwardWeight(in);
      case OpKind::kSendActStart:
      case OpKind::kSendGradStart: return SendStart(in);
      case OpKind::kRecvActStart:
      case OpKind::kRecvGradStart: return RecvStart(in);
      case OpKind::kSendActFinish:
      case OpKind::kSendGradFinish:
      case OpKind::kRecvActFinish:
      case OpKind::kRecvGradFinish: return p2p_.Finish(in);
      case OpKind::kFreeBuffer:
        SLUICE_RETURN_IF_ERROR(CheckSlot(in.inputs.at(0)));
        slots_[in.inputs[0]].clear();
        return Status::Ok();
      case OpKind::kAllReduceGrad:
        return grads_.AllReduce(in, pc_, last_backward_, &last_bytes_);
      case OpKind::kReduceScatterGrad:
      case OpKind::kAllGatherParams:
        return InvalidArgumentError(
            "ZeRO-2/3 reductions are not supported by the runtime (use zero = 0 or 1)");
      case OpKind::kOptimizerStep: return Step();
      case OpKind::kAllToAllWait: return segmented_.Wait(in);
      case OpKind::kAllToAllDispatch:
      case OpKind::kAllToAllCombine:
        if (segmented_.OwnsAllToAll(pc_)) return segmented_.PostAllToAll(in, pc_, &last_bytes_);
        if (!exchange_.Performed(&in)) {
          return InvalidArgumentError(
              "this all-to-all was not performed by the compute op it belongs to (the op before "
              "it of the same micro-batch and stage; plan/instruction.h \"MoE all-to-all\")");
        }
        return Status::Ok();
    }
    return InternalError("unknown op");
  }

  // The all-to-alls of the instruction being executed (null when it has none).
  const std::vector<const Instruction*>* AllToAllsOfCurrent() const {
    const auto it = a2a_of_.find(pc_);
    return it == a2a_of_.end() ? nullptr : &it->second;
  }

  Status CheckSlot(int64_t slot) const {
    if (slot < 0 || slot >= static_cast<int64_t>(slots_.size())) {
      return InvalidArgumentError(
          fmt::format("slot {} is outside the program's {} slots", slot, slots_.size()));
    }
    return Status::Ok();
  }

  // The tensors of `slots`, concatenated in order.
  StatusOr<Tensors> Read(const std::vector<int64_t>& slots) const {
    Tensors out;
    for (const int64_t s : slots) {
      SLUICE_RETURN_IF_ERROR(CheckSlot(s));
      if (slots_[s].empty()) return InvalidArgumentError(fmt::format("slot {} is empty", s));
      out.insert(out.end(), slots_[s].begin(), slots_[s].end());
    }
    return out;
  }

  Status Write(const Instruction& in, Tensors tensors) {
    if (in.outputs.size() != 1) {
      return InvalidArgumentError(
          fmt::format("expected one output slot, the instruction has {}", in.outputs.size()));
    }
    SLUICE_RETURN_IF_ERROR(CheckSlot(in.outputs[0]));
    if (!slots_[in.outputs[0]].empty()) {
      return InvalidArgumentError(fmt::format("output slot {} is still in use", in.outputs[0]));
    }
    slots_[in.outputs[0]] = std::move(tensors);
    return Status::Ok();
  }

  static Status CheckShapes(const Tensors& tensors, const std::vector<TensorShape>& shapes,
                            std::string_view what) {
    if (tensors.size() != shapes.size()) {
      return InvalidArgumentError(fmt::format("{}: {} tensors, the plan says {}", what,
                                              tensors.size(), shapes.size()));
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto sizes = tensors[i].sizes();
      if (std::vector<int64_t>(sizes.begin(), sizes.end()) != shapes[i]) {
        return InvalidArgumentError(fmt::format("{}: tensor {} has shape [{}], the plan says [{}]",
                                                what, i, fmt::join(sizes.begin(), sizes.end(), ", "),
                                                fmt::join(shapes[i], ", ")));
      }
    }
    return Status::Ok();
  }

  StatusOr<const MicroBatchInputs*> Inputs(int64_t mb) {
    if (mb < 0 || mb >= static_cast<int64_t>(replica_.micro_batches.size())) {
      return InvalidArgumentError(fmt::format("micro-batch {} is not in the replica", mb));
    }
    auto it = inputs_.find(mb);
    if (it == inputs_.end()) {
      SLUICE_ASSIGN_OR_RETURN(MicroBatchLayout layout,
                              LayoutMicroBatch(plan_.model, replica_.micro_batches[mb], samples_));
      if (comm_.cp() == 1) {
        it = inputs_
                 .emplace(mb, BuildMicroBatchInputs(plan_.model, layout, tokens_, loss_scale_))
                 .first;
      } else {  // this process's share of the tokens, at a length that 2 * cp divides
        if (plan_.model.is_encoder_decoder()) {
          return InvalidArgumentError("context parallelism runs decoder-only models only");
        }
        layout.shape.seqlen = CpPaddedLength(layout.shape.seqlen, comm_.cp());
        const MicroBatchInputs full = BuildMicroBatchInputs(plan_.model, layout, tokens_,
                                                            loss_scale_);
        it = inputs_
                 .emplace(mb, ShardMicroBatchInputs(full, comm_.cp(), comm_.cp_index(),
                                                    &cp_gather_))
                 .first;
      }
    }
    return &it->second;
  }

  // The plan's shapes of micro-batch `mb` as this process holds them (context_parallel.h).
  std::vector<TensorShape> Local(const std::vector<TensorShape>& shapes, int64_t mb) const {
    if (comm_.cp() == 1 || mb < 0 || mb >= static_cast<int64_t>(replica_.micro_batches.size())) {
      return shapes;
    }
    std::vector<TensorShape> out;
    for (const TensorShape& s : shapes) {
      out.push_back(LocalShape(s, replica_.micro_batches[mb].shape.seqlen, comm_.cp()));
    }
    return out;
  }

  StatusOr<const Chunk*> ChunkOf(int64_t stage) const {
    if (!shard_.HasChunk(stage)) {
      return InvalidArgumentError(
          fmt::format("stage {} does not run on pipeline rank {}", stage, comm_.pp_index()));
    }
    return &shard_.chunk(stage);
  }

  Status LoadInput(const Instruction& in) {
    SLUICE_ASSIGN_OR_RETURN(const MicroBatchInputs* mb, Inputs(in.microbatch));
    Tensors t;
    if (in.stage == 0) {
      t.push_back(mb->tokens);
      if (plan_.model.is_encoder_decoder()) t.push_back(mb->dec_tokens);
    }
    if (in.stage == num_stages_ - 1) t.push_back(mb->labels);
    SLUICE_RETURN_IF_ERROR(CheckShapes(t, Local(in.shapes, in.microbatch), "loaded tensors"));
    for (const at::Tensor& x : t) last_bytes_ += x.numel() * x.element_size();
    return Write(in, std::move(t));
  }

  // `a2a`: the op's all-to-alls in order (null when it has none).
  Status Forward(const Instruction& in, const std::vector<const Instruction*>* a2a) {
    SLUICE_ASSIGN_OR_RETURN(const Chunk* chunk, ChunkOf(in.stage));
    SLUICE_ASSIGN_OR_RETURN(const MicroBatchInputs* mb, Inputs(in.microbatch));
    SLUICE_ASSIGN_OR_RETURN(Tensors tensors, Read(in.inputs));
    const bool last = in.stage == num_stages_ - 1;
    StageRun run;
    if (last) {
      run.labels = tensors.back();
      tensors.pop_back();
    }
    for (const at::Tensor& t : tensors) {
      run.inputs.push_back(in.stage == 0 ? t : t.detach().requires_grad_(true));
    }
    run.replay = in.recompute == Recompute::kFull;
    if (split_.count(Key(in)) > 0) run.tape = std::make_unique<WeightGradTape>();
    Tensors outputs;
    MoeContext moe;
    moe.exchange = &exchange_;
    MoeContext* moe_ptr = chunk->has_moe() ? &moe : nullptr;
    exchange_.Begin(a2a, run.tape.get());
    if (in.chunks > 0 && in.segment < 0) {  // token slices (segmented_ops.h)
      SLUICE_ASSIGN_OR_RETURN(
          outputs, TokenSlicedForward(*chunk, plan_.model, in.chunks, *mb, run.inputs, run.labels,
                                      in.recompute == Recompute::kSelective, run.tape.get(),
                                      &exchange_, in.stage == num_stages_ - 1, &moe));
    } else if (run.replay) {
      run.a2a_forward = a2a;
      exchange_.Record(&run.a2a_received);
      torch::NoGradGuard no_grad;
      outputs = chunk->Forward(run.inputs, run.labels, *mb, false, nullptr, moe_ptr);
    } else {
      outputs = chunk->Forward(run.inputs, run.labels, *mb, in.recompute == Recompute::kSelective,
                               run.tape.get(), moe_ptr);
    }
    SLUICE_RETURN_IF_ERROR(exchange_.End("forward"));
    if (moe.aux_loss.defined()) {
      aux_loss_ += moe.aux_loss.item<double>();
      run.aux_loss = moe.aux_loss;
    }
    moe_assignments_ += moe.assignments;
    moe_dropped_ += moe.dropped;
    if (last) {
      loss_ += outputs.at(0).item<double>();
    } else {
      SLUICE_RETURN_IF_ERROR(
          CheckShapes(outputs, Local(in.shapes, in.microbatch), "stage outputs"));
      SLUICE_RETURN_IF_ERROR(Write(in, outputs));
    }
    run.outputs = std::move(outputs);
    if (!runs_.emplace(Key(in), std::move(run)).second) {
      return InvalidArgumentError("the micro-batch already ran forward on this stage");
    }
    return Status::Ok();
  }

  static std::pair<int64_t, int64_t> Key(const Instruction& in) {
    return {in.microbatch, in.stage};
  }

  Status Backward(const Instruction& in, const std::vector<const Instruction*>* a2a) {
    SLUICE_ASSIGN_OR_RETURN(const Chunk* chunk, ChunkOf(in.stage));
    auto it = runs_.find(Key(in));
    if (it == runs_.end()) return InvalidArgumentError("backward before its forward");
    StageRun& run = it->second;
    const bool last = in.stage == num_stages_ - 1;
    if (run.replay) {  // recompute "full": replay the forward with a graph
      SLUICE_ASSIGN_OR_RETURN(const MicroBatchInputs* mb, Inputs(in.microbatch));
      MoeContext moe;
      moe.exchange = &exchange_;
      exchange_.BeginReplay(run.a2a_forward, &run.a2a_received, run.tape.get());
      run.outputs = chunk->Forward(run.inputs, run.labels, *mb, false, run.tape.get(),
                                   chunk->has_moe() ? &moe : nullptr);
      SLUICE_RETURN_IF_ERROR(exchange_.End("replayed forward"));
      run.a2a_received.clear();
      run.aux_loss = moe.aux_loss;
      run.replay = false;
    }
    if (last) {
      run.grad_outputs = {torch::ones_like(run.outputs.at(0))};
    } else {
      if (in.inputs.empty()) return InvalidArgumentError("no gradient slot");
      SLUICE_ASSIGN_OR_RETURN(run.grad_outputs, Read({in.inputs.back()}));
      SLUICE_RETURN_IF_ERROR(
          CheckShapes(run.grad_outputs,
                      Local(BoundaryShapes(plan_.model, replica_.micro_batches[in.microbatch].shape,
                                           in.stage, plan_.parallel),
                            in.microbatch),
                      "output gradients"));
    }
    const Tensors leaves = in.stage == 0 ? Tensors{} : run.inputs;
    // The MoE load-balancing loss is part of the objective: differentiated with the outputs.
    Tensors outputs = run.outputs, grad_outputs = run.grad_outputs;
    if (run.aux_loss.defined() && run.aux_loss.requires_grad()) {
      outputs.push_back(run.aux_loss);
      grad_outputs.push_back(torch::ones_like(run.aux_loss));
    }
    run.aux_loss = at::Tensor();
    Tensors input_grads;
    exchange_.Begin(a2a);
    if (in.op == OpKind::kBackward) {
      Tensors targets = leaves;
      for (const at::Tensor& p : chunk->parameters()) targets.push_back(p);
      torch::autograd::backward(outputs, grad_outputs, /*retain_graph=*/false,
                                /*create_graph=*/false, targets);
      SLUICE_RETURN_IF_ERROR(exchange_.End("backward"));
      for (const at::Tensor& x : leaves) input_grads.push_back(x.grad());
    } else {
      // One pass: input gradients, the recorded linear layers' output gradients (their weights
      // wait for backward-weight) and the other parameters' gradients (model.h, WeightGradTape).
      if (!run.tape) return InternalError("backward-input without a recorded forward");
      input_grads = run.tape->InputGradients(outputs, grad_outputs, leaves, chunk->parameters());
      SLUICE_RETURN_IF_ERROR(exchange_.End("backward-input"));
      // The graph is gone: keep only what backward-weight reads.
      run.outputs.clear();
      run.grad_outputs.clear();
      run.inputs.clear();
    }
    if (in.stage > 0) {
      for (size_t i = 0; i < input_grads.size(); ++i) {
        if (!input_grads[i].defined()) input_grads[i] = torch::zeros_like(leaves[i]);
      }
      SLUICE_RETURN_IF_ERROR(
          CheckShapes(input_grads, Local(in.shapes, in.microbatch), "input gradients"));
      SLUICE_RETURN_IF_ERROR(Write(in, std::move(input_grads)));
    }
    if (in.op == OpKind::kBackward) runs_.erase(it);
    return Status::Ok();
  }

  Status BackwardWeight(const Instruction& in) {
    SLUICE_RETURN_IF_ERROR(ChunkOf(in.stage).status());
    auto it = runs_.find(Key(in));
    if (it == runs_.end() || !it->second.tape || !it->second.tape->pending()) {
      return InvalidArgumentError("backward-weight before its backward-input");
    }
    it->second.tape->AccumulateWeightGrads();
    runs_.erase(it);
    return Status::Ok();
  }

  // W piece j: the weight gradients of I's segment j, which is the forward's segment 2k - j.
  Status WeightPiece(const Instruction& in) {
    auto it = runs_.find(Key(in));
    if (it == runs_.end() || !it->second.tape || !it->second.tape->pending()) {
      return InvalidArgumentError("backward-weight before its backward-input");
    }
    const int64_t segments = NumSegments(plan_, in.stage);
    if (in.segment >= segments) {
      return InvalidArgumentError(
          fmt::format("segment {} of a stage with {} segments", in.segment, segments));
    }
    it->second.tape->AccumulateWeightGrads(segments - 1 - in.segment);
    if ((segmented_.Role(pc_) & kLastPiece) != 0) {
      if (segmented_.Running({1, in.microbatch, in.stage})) {
        return InvalidArgumentError("the last backward-weight piece before its backward-input "
                                    "completed");
      }
      if (it->second.tape->pending()) it->second.tape->AccumulateWeightGrads();
      runs_.erase(it);
    }
    return Status::Ok();
  }

  Status SendStart(const Instruction& in) {
    SLUICE_ASSIGN_OR_RETURN(Tensors tensors, Read(in.inputs));
    SLUICE_RETURN_IF_ERROR(CheckShapes(tensors, Local(in.shapes, in.microbatch), "sent tensors"));
    return p2p_.Send(in, tensors, &last_bytes_);
  }

  Status RecvStart(const Instruction& in) {
    return p2p_.Recv(
        in, Local(in.shapes, in.microbatch),
        [&](Tensors views) { return Write(in, std::move(views)); }, &last_bytes_);
  }

  Status Step() {
    SLUICE_RETURN_IF_ERROR(grads_.Finish());
    torch::NoGradGuard no_grad;
    if (*before_step_) SLUICE_RETURN_IF_ERROR((*before_step_)());
    optimizer_.step();
    for (const at::Tensor& p : shard_.Parameters()) {
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
    return Status::Ok();
  }

  ModelShard& shard_;
  Communicator& comm_;
  torch::optim::Optimizer& optimizer_;
  Watchdog& watchdog_;
  TraceRecorder& trace_;
  const TokenSource& tokens_;
  Clock::time_point epoch_;
  const ExecutionPlan& plan_;
  const SampleTable& samples_;
  const int64_t iteration_;
  const int64_t loss_labels_;  // 0: the plan's (GlobalLabelTokens)
  const int64_t rank_;
  const RankProgram& program_;
  const PlanReplica& replica_;
  const int64_t num_stages_;
  const Executor::BeforeStep* before_step_ = nullptr;

  double loss_scale_ = 1.0;
  double loss_ = 0;
  int64_t compute_ns_ = 0, wait_ns_ = 0;
  int64_t last_bytes_ = 0;  // bytes the instruction being recorded moved or loaded
  std::vector<Tensors> slots_;
  std::map<int64_t, MicroBatchInputs> inputs_;
  std::map<std::pair<int64_t, int64_t>, StageRun> runs_;
  std::set<std::pair<int64_t, int64_t>> split_;  // (micro-batch, stage) with a split backward
  PipelineTransfers p2p_;
  PlanExchange exchange_;
  CpGather cp_gather_;
  int64_t pc_ = -1;                                            // the instruction being executed
  std::map<int64_t, std::vector<const Instruction*>> a2a_of_;  // compute op -> its all-to-alls
  double aux_loss_ = 0;
  int64_t moe_assignments_ = 0, moe_dropped_ = 0;
  // Each stage's last backward instruction (buckets posted before it wait for it).
  std::map<int64_t, int64_t> last_backward_;
  GradientReduction grads_;
  // Last: destroyed first, aborting any fiber still suspended while the state it uses exists.
  SegmentedOps segmented_;
};

}  // namespace

StatusOr<IterationResult> Executor::Run(const ExecutionPlan& plan, const SampleTable& samples,
                                        int64_t iteration, const BeforeStep& before_step,
                                        int64_t loss_labels) {
  if (comm_->plan_rank() >= static_cast<int64_t>(plan.ranks.size())) {
    return InvalidArgumentError(
        fmt::format("the plan has no program for rank {}", comm_->plan_rank()));
  }
  IterationRun run(shard_, comm_, optimizer_, watchdog_, trace_, tokens_, epoch_, plan, samples,
                   iteration, loss_labels);
  return run.Run(before_step);
}

}  // namespace sluice::runtime
