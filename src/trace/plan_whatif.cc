#include "trace/plan_whatif.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "plan/instruction.h"
#include "trace/calibration.h"

namespace sluice::trace {
namespace {

int64_t MedianOf(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

const PlanMicroBatch* MicroBatchOf(const ExecutionPlan& plan, const RankProgram& program,
                                   const Instruction& in) {
  if (in.microbatch < 0 || program.dp_index < 0 ||
      program.dp_index >= static_cast<int64_t>(plan.replicas.size())) {
    return nullptr;
  }
  const auto& mbs = plan.replicas[program.dp_index].micro_batches;
  return in.microbatch < static_cast<int64_t>(mbs.size()) ? &mbs[in.microbatch] : nullptr;
}

std::string ShapeText(const PlanMicroBatch* mb) {
  if (mb == nullptr) return "-";
  return fmt::format("{}x{}+{}|{}", mb->shape.mbs, mb->shape.seqlen, mb->shape.dec_seqlen,
                     static_cast<int>(mb->recompute));
}

// The micro-batch itself: its sample rows and shape.
std::string IdentityText(const PlanMicroBatch* mb) {
  if (mb == nullptr) return "-";
  std::string out = ShapeText(mb);
  for (const auto& row : mb->rows) {
    out += '[';
    for (int64_t id : row) out += fmt::format("{},", id);
    out += ']';
  }
  return out;
}

// The same instruction in any plan of the batch (its micro-batch by identity, not index).
std::string ExactKey(OpKind op, const Instruction& in, const PlanMicroBatch* mb) {
  return fmt::format("{}|{}|{}|{}|{}", OpKindName(op), in.stage, in.peer, in.bucket,
                     IdentityText(mb));
}

// ExactKey, and for a free-buffer (whose slot differs between plans) the k-th free after the last
// other instruction (`after` its ExactKey, `frees` the frees since it; both updated).
std::string FreeAwareKey(const Instruction& in, const PlanMicroBatch* mb, std::string* after,
                         int64_t* frees) {
  if (in.op == OpKind::kFreeBuffer) return fmt::format("free {} after {}", (*frees)++, *after);
  *after = ExactKey(in.op, in, mb);
  *frees = 0;
  return *after;
}

std::string ClassKey(const Instruction& in, const PlanMicroBatch* mb) {
  if (in.op == OpKind::kFreeBuffer) return "free-buffer";
  return fmt::format("{}|{}|{}|{}", OpKindName(in.op), in.stage, in.peer, ShapeText(mb));
}

TraceOpKind KindOf(OpKind op) {
  if (IsCompute(op)) return TraceOpKind::kCompute;
  if (IsCommStart(op) || IsCollective(op)) return TraceOpKind::kCommPost;
  if (IsCommFinish(op)) return TraceOpKind::kCommWait;
  if (op == OpKind::kOptimizerStep) return TraceOpKind::kOptimizer;
  return TraceOpKind::kOther;
}

NodeKind NodeKindOf(TraceOpKind k) {
  switch (k) {
    case TraceOpKind::kCompute:
      return NodeKind::kCompute;
    case TraceOpKind::kCommPost:
      return NodeKind::kPost;
    case TraceOpKind::kCommWait:
      return NodeKind::kWait;
    case TraceOpKind::kOptimizer:
      return NodeKind::kOptimizer;
    case TraceOpKind::kOther:
      return NodeKind::kOther;
  }
  return NodeKind::kOther;
}

Status CheckSameRun(const ExecutionPlan& a, const ExecutionPlan& b, const std::string& file,
                    int64_t k) {
  auto bad = [&](const std::string& what) {
    return InvalidArgumentError(fmt::format(
        "--what-if-plan {}: {} than the plan iteration {} of the trace ran: a what-if plan must "
        "be for the same batch, model and parallel layout (another order or schedule)",
        file, what, k));
  };
  if (!(a.model == b.model)) {
    return bad(fmt::format("another model ('{}' vs '{}')", b.model.name, a.model.name));
  }
  if (!(a.parallel == b.parallel)) {
    return bad(fmt::format("another parallel layout (dp {} pp {} tp {} vpp {} vs dp {} pp {} tp "
                           "{} vpp {})",
                           b.parallel.dp, b.parallel.pp, b.parallel.tp, b.parallel.vpp,
                           a.parallel.dp, a.parallel.pp, a.parallel.tp, a.parallel.vpp));
  }
  if (a.sample_ids != b.sample_ids) {
    return bad(fmt::format("another batch ({} samples vs {}, not the same sample ids)",
                           b.sample_ids.size(), a.sample_ids.size()));
  }
  if (a.ranks.size() != b.ranks.size()) {
    return bad(fmt::format("another number of ranks ({} vs {})", b.ranks.size(), a.ranks.size()));
  }
  return Status::Ok();
}

// What A measured of one instruction: its node in A's graph.
struct RankIndex {
  std::map<std::pair<int64_t, std::string>, int32_t> exact;  // (iteration, ExactKey)
  std::map<std::pair<int64_t, std::string>, std::vector<int32_t>> class_iteration;
  std::map<std::string, std::vector<int32_t>> class_all;
  std::map<OpKind, std::vector<int64_t>> gaps;  // per op kind
  std::map<int64_t, std::pair<int64_t, int64_t>> span;  // iteration -> first start, last end
};

}  // namespace

StatusOr<PlanWhatIf> BuildPlanWhatIf(const Analysis& a, const std::vector<ExecutionPlan>& ran,
                                     const std::vector<ExecutionPlan>& what_if,
                                     const std::vector<std::string>& files) {
  if (what_if.size() != ran.size()) {
    return InvalidArgumentError(fmt::format(
        "--what-if-plan: {} file(s) given but --plan has {}: give one what-if plan per plan the "
        "run executed, in the same order",
        what_if.size(), ran.size()));
  }
  for (size_t k = 0; k < ran.size(); ++k) {
    SLUICE_RETURN_IF_ERROR(CheckSameRun(ran[k], what_if[k], files[k], static_cast<int64_t>(k)));
  }
  const TraceSet& set = a.set;
  for (size_t r = 0; r < set.ranks.size(); ++r) {
    if (set.ranks[r].rank != static_cast<int64_t>(r)) {
      return InvalidArgumentError(fmt::format(
          "{}: the trace's ranks are not 0..{} (rank {} missing): a what-if plan needs every "
          "rank's trace",
          set.ranks[r].source, set.ranks.size() - 1, r));
    }
  }
  // Ties the trace to its plans (errors name the event of a trace of another plan); its lines
  // price what the trace has no measurement of.
  FitOptions fit;
  fit.fit_link = false;
  fit.fit_iteration = false;
  SLUICE_ASSIGN_OR_RETURN(Calibration calibration, FitCalibration(a, ran, fit));
  std::map<std::pair<int64_t, std::string>, const OpCorrection*> lines;
  for (const OpCorrection& o : calibration.ops) lines[{o.stage, o.op}] = &o;

  // A's hub times as its per-iteration replay takes them, and the hub of each post.
  const std::vector<int64_t> fitted = FittedCommTimes(a.graph);
  std::vector<int32_t> rank_first(set.ranks.size() + 1, 0);
  for (size_t r = 0; r < set.ranks.size(); ++r) {
    rank_first[r + 1] = rank_first[r] + static_cast<int32_t>(set.ranks[r].ops.size());
  }
  std::unordered_map<int32_t, int32_t> hub_of_post;  // A's post node -> A's hub node
  for (size_t v = rank_first.back(); v < a.graph.nodes.size(); ++v) {
    const GraphNode& h = a.graph.nodes[v];
    for (int32_t e = h.first_pred; e < h.first_pred + h.num_preds; ++e) {
      if (a.graph.preds[e].kind == EdgeKind::kPost) hub_of_post[a.graph.preds[e].from] = v;
    }
    if (h.kind == NodeKind::kTransfer) {
      // An eager hub lists the send's post only: tie the receive's post too.
      const MessageMatch& m = a.matching.messages[h.op];
      hub_of_post[rank_first[m.dst] + set.ranks[m.dst].comms[m.recv].post] = v;
    }
  }
  auto hub_own = [&](int32_t v) {
    const GraphNode& h = a.graph.nodes[v];
    return h.waited ? h.own_ns : std::min(h.own_ns, fitted[v]);
  };
  auto hub_eager = [&](int32_t v) {
    const GraphNode& h = a.graph.nodes[v];
    return h.kind == NodeKind::kTransfer && h.num_preds == 1;
  };

  // Index A's ops (FitCalibration checked they are its plans' instructions, in order).
  std::vector<RankIndex> index(set.ranks.size());
  for (size_t r = 0; r < set.ranks.size(); ++r) {
    const RankTrace& rank = set.ranks[r];
    std::map<int64_t, int64_t> position;  // iteration -> instructions seen
    std::string after;                     // ExactKey of the last instruction but a free
    int64_t frees = 0;                     // frees since it
    for (size_t i = 0; i < rank.ops.size(); ++i) {
      const TraceOp& op = rank.ops[i];
      const int32_t v = rank_first[r] + static_cast<int32_t>(i);
      const GraphNode& n = a.graph.nodes[v];
      auto [it, fresh] = index[r].span.try_emplace(op.iteration, op.start_ns, op.end_ns);
      it->second.first = std::min(it->second.first, op.start_ns);
      it->second.second = std::max(it->second.second, op.end_ns);
      if (op.iteration < 0 || op.iteration >= static_cast<int64_t>(ran.size())) continue;
      const ExecutionPlan& plan = ran[op.iteration];
      const RankProgram& program = plan.ranks[r];
      const int64_t p = position[op.iteration]++;
      if (p >= static_cast<int64_t>(program.instructions.size())) continue;
      const Instruction& in = program.instructions[p];
      const PlanMicroBatch* mb = MicroBatchOf(plan, program, in);
      if (p == 0) after.clear(), frees = 0;
      index[r].exact[{op.iteration, FreeAwareKey(in, mb, &after, &frees)}] = v;
      const std::string cls = ClassKey(in, mb);
      index[r].class_iteration[{op.iteration, cls}].push_back(v);
      index[r].class_all[cls].push_back(v);
      if (n.stream_pred >= 0) index[r].gaps[in.op].push_back(n.gap_ns);
    }
  }

  PlanWhatIf out;
  PlanPricing& pricing = out.pricing;
  Graph& g = out.graph;
  std::vector<std::vector<GraphEdge>> preds;
  // B's post nodes of each message / collective, by what A's hub was.
  struct HubParts {
    std::vector<int32_t> posts;  // B nodes
    std::vector<int32_t> waits;
  };
  std::map<int32_t, HubParts> b_hubs;  // A's hub -> B's parts
  // B messages A has no hub for: (iteration, src, dst, tag) -> parts.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, HubParts> unmatched;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::string> unmatched_key;
  std::unordered_map<int32_t, HubParts*> parts_of_post;  // B's post node -> its hub's parts
  int64_t origin = INT64_MAX;
  for (size_t r = 0; r < set.ranks.size(); ++r) {
    RankTrace rt;
    rt.rank = static_cast<int64_t>(r);
    rt.source = fmt::format("what-if plan (rank {})", r);
    rt.format = TraceFormat::kSluice;
    rt.streams = {"compute"};
    const RankIndex& idx = index[r];
    int32_t prev = -1;
    for (size_t k = 0; k < what_if.size(); ++k) {
      const auto span = idx.span.find(static_cast<int64_t>(k));
      if (span == idx.span.end()) continue;  // an iteration the trace lacks: FitCalibration says
      const ExecutionPlan& plan = what_if[k];
      const RankProgram& program = plan.ranks[r];
      const int64_t it = static_cast<int64_t>(k);
      std::map<std::tuple<int64_t, int64_t, OpKind>, int32_t> compute_of;  // (stage, mb, op)
      std::map<std::pair<OpKind, int64_t>, int32_t> start_of_tag;          // (start op, tag)
      std::vector<int32_t> pending_collectives;
      std::string after;
      int64_t frees = 0;
      for (const Instruction& in : program.instructions) {
        const PlanMicroBatch* mb = MicroBatchOf(plan, program, in);
        const std::string own_key = FreeAwareKey(in, mb, &after, &frees);
        int64_t own = 0, gap = 0;
        auto from_node = [&](int32_t v) {
          own = a.graph.nodes[v].own_ns;
          gap = a.graph.nodes[v].gap_ns;
        };
        auto exact = [&](OpKind op) -> int32_t {
          auto e = idx.exact.find({it, ExactKey(op, in, mb)});
          return e == idx.exact.end() ? -1 : e->second;
        };
        bool priced = false;
        if (auto e = idx.exact.find({it, own_key}); e != idx.exact.end()) {
          from_node(e->second);
          ++pricing.measured;
          priced = true;
        }
        if (!priced) {
          const std::string cls = ClassKey(in, mb);
          const std::vector<int32_t>* members = nullptr;
          if (auto c = idx.class_iteration.find({it, cls}); c != idx.class_iteration.end()) {
            members = &c->second;
          } else if (auto c2 = idx.class_all.find(cls); c2 != idx.class_all.end()) {
            members = &c2->second;
          }
          if (members != nullptr) {
            std::vector<int64_t> owns, gaps;
            for (int32_t v : *members) {
              owns.push_back(a.graph.nodes[v].own_ns);
              gaps.push_back(a.graph.nodes[v].gap_ns);
            }
            own = MedianOf(owns);
            gap = MedianOf(gaps);
            ++pricing.by_class;
            priced = true;
          }
        }
        if (!priced && (in.op == OpKind::kBackwardInput || in.op == OpKind::kBackwardWeight)) {
          if (const int32_t v = exact(OpKind::kBackward); v >= 0) {
            // The two halves' planned durations split the measured whole.
            double mine = static_cast<double>(in.duration.nanos()), both = mine;
            const OpKind other = in.op == OpKind::kBackwardInput ? OpKind::kBackwardWeight
                                                                 : OpKind::kBackwardInput;
            for (const Instruction& x : program.instructions) {
              if (x.op == other && x.stage == in.stage && x.microbatch == in.microbatch) {
                both += static_cast<double>(x.duration.nanos());
              }
            }
            from_node(v);
            own = both > 0 ? std::llround(static_cast<double>(own) * mine / both) : own / 2;
            ++pricing.derived;
            priced = true;
          }
        } else if (!priced && in.op == OpKind::kBackward) {
          const int32_t vi = exact(OpKind::kBackwardInput), vw = exact(OpKind::kBackwardWeight);
          if (vi >= 0 && vw >= 0) {
            from_node(vi);
            own += a.graph.nodes[vw].own_ns;
            ++pricing.derived;
            priced = true;
          }
        }
        if (!priced) {
          const std::string op(OpKindName(in.op));
          const int64_t key = in.stage >= 0 && in.op != OpKind::kOptimizerStep ? in.stage
                                                                                : program.pp_index;
          auto line = lines.find({key, op});
          if (line == lines.end()) line = lines.find({-1, op});
          if (line != lines.end()) {
            own = std::llround(line->second->Predict(FeaturesOf(plan, program, in)));
            ++pricing.calibrated;
          } else {
            own = in.duration.nanos();
            ++pricing.plan;
          }
          if (auto gs = idx.gaps.find(in.op); gs != idx.gaps.end()) gap = MedianOf(gs->second);
          if (pricing.examples.size() < 8) {
            pricing.examples.push_back(fmt::format("rank {} iteration {} '{}' ({})", r, k,
                                                   InstructionText(in),
                                                   line != lines.end() ? "calibrated" : "plan"));
          }
        }
        // The op and its node.
        TraceOp op;
        op.name = InstructionText(in);
        op.label = std::string(OpKindName(in.op));
        op.kind = KindOf(in.op);
        op.iteration = it;
        op.microbatch = in.microbatch;
        op.stage = in.stage;
        op.bytes = in.bytes.count();
        op.start_ns = span->second.first;
        op.end_ns = span->second.second;
        const int32_t id = static_cast<int32_t>(g.nodes.size());
        GraphNode n;
        n.kind = NodeKindOf(op.kind);
        n.rank = rt.rank;
        n.stream = 0;
        n.op = static_cast<int32_t>(rt.ops.size());
        n.iteration = it;
        n.own_ns = std::max<int64_t>(0, own);
        n.measured_start_ns = op.start_ns;
        n.measured_end_ns = op.end_ns;
        origin = std::min(origin, op.start_ns);
        preds.emplace_back();
        if (prev >= 0) {
          n.stream_pred = prev;
          n.gap_ns = std::max<int64_t>(0, gap);
          preds.back().push_back({prev, EdgeKind::kStream});
        } else {
          n.release_ns = op.start_ns;
        }
        prev = id;
        g.nodes.push_back(n);
        rt.ops.push_back(std::move(op));
        // Data dependencies.
        if (IsCompute(in.op)) {
          const auto key = [&](OpKind o) { return std::make_tuple(in.stage, in.microbatch, o); };
          if (in.op == OpKind::kBackward || in.op == OpKind::kBackwardInput) {
            if (auto f = compute_of.find(key(OpKind::kForward)); f != compute_of.end()) {
              preds.back().push_back({f->second, EdgeKind::kData});
            }
          } else if (in.op == OpKind::kBackwardWeight) {
            if (auto f = compute_of.find(key(OpKind::kBackwardInput)); f != compute_of.end()) {
              preds.back().push_back({f->second, EdgeKind::kData});
            }
          }
          compute_of[key(in.op)] = id;
        }
        // Communication: the hub of A's same message or collective.
        if (IsCommStart(in.op) || IsCollective(in.op)) {
          start_of_tag[{in.op, in.tag}] = id;
          const int32_t av = exact(in.op);
          auto h = av >= 0 ? hub_of_post.find(av) : hub_of_post.end();
          if (IsCollective(in.op)) {
            if (h == hub_of_post.end()) {
              return InvalidArgumentError(fmt::format(
                  "--what-if-plan {}: rank {} iteration {} collective '{}' has no collective of "
                  "the trace with the same bucket and stage to take its time from",
                  files[k], r, k, InstructionText(in)));
            }
            b_hubs[h->second].posts.push_back(id);
            parts_of_post[id] = &b_hubs[h->second];
            pending_collectives.push_back(h->second);
          } else if (h != hub_of_post.end()) {
            b_hubs[h->second].posts.push_back(id);
            parts_of_post[id] = &b_hubs[h->second];
          } else {
            const bool send = IsSend(in.op);
            const auto key = std::make_tuple(it, send ? static_cast<int64_t>(r) : in.peer,
                                             send ? in.peer : static_cast<int64_t>(r), in.tag);
            unmatched[key].posts.push_back(id);
            parts_of_post[id] = &unmatched[key];
            unmatched_key[key] = in.op == OpKind::kSendActStart || in.op == OpKind::kRecvActStart
                                     ? "act"
                                     : "grad";
          }
        } else if (IsCommFinish(in.op)) {
          auto s = start_of_tag.find({StartOf(in.op), in.tag});
          if (s != start_of_tag.end()) {
            if (auto p = parts_of_post.find(s->second); p != parts_of_post.end()) {
              p->second->waits.push_back(id);
            }
          }
        } else if (in.op == OpKind::kOptimizerStep) {
          for (int32_t hub : pending_collectives) b_hubs[hub].waits.push_back(id);
          pending_collectives.clear();
        }
      }
    }
    out.set.ranks.push_back(std::move(rt));
  }
  // Hubs.
  auto add_hub = [&](NodeKind kind, int64_t rank, int64_t own, int64_t iteration,
                     const HubParts& parts, bool eager) {
    GraphNode h;
    h.kind = kind;
    h.rank = rank;
    h.iteration = iteration;
    h.own_ns = own;
    preds.emplace_back();
    const int32_t id = static_cast<int32_t>(g.nodes.size());
    for (size_t i = 0; i < parts.posts.size(); ++i) {
      // Eager: the send's post alone (the first part on the sender).
      if (eager && g.nodes[parts.posts[i]].rank == rank) continue;
      preds.back().push_back({parts.posts[i], EdgeKind::kPost});
    }
    g.nodes.push_back(h);
    for (int32_t w : parts.waits) preds[w].push_back({id, EdgeKind::kDone});
  };
  for (const auto& [hub, parts] : b_hubs) {
    const GraphNode& ah = a.graph.nodes[hub];
    add_hub(ah.kind, ah.rank, hub_own(hub), ah.iteration, parts, hub_eager(hub));
    if (ah.kind == NodeKind::kTransfer) {
      ++pricing.transfers_measured;
    } else {
      ++pricing.collectives;
    }
  }
  // Messages of B that A never sent (another micro-batch split): the median of A's transfers
  // between the same ranks with the same key.
  for (const auto& [key, parts] : unmatched) {
    const auto& [it, src, dst, tag] = key;
    std::vector<int64_t> owns;
    for (size_t v = rank_first.back(); v < a.graph.nodes.size(); ++v) {
      const GraphNode& h = a.graph.nodes[v];
      if (h.kind != NodeKind::kTransfer) continue;
      const MessageMatch& m = a.matching.messages[h.op];
      if (m.src == src && m.dst == dst &&
          set.ranks[m.src].comms[m.send].key == unmatched_key.at(key)) {
        owns.push_back(hub_own(static_cast<int32_t>(v)));
      }
    }
    add_hub(NodeKind::kTransfer, dst, MedianOf(owns), it, parts, false);
    ++pricing.transfers_by_class;
  }
  if (const int32_t v = FinishGraph(preds, &g); v >= 0) {
    const GraphNode& n = g.nodes[v];
    const std::string what =
        n.stream >= 0 ? fmt::format("rank {} '{}' (iteration {})", n.rank,
                                    out.set.ranks[n.rank].ops[n.op].name, n.iteration)
                      : fmt::format("a {} of iteration {}", NodeKindName(n.kind), n.iteration);
    return InvalidArgumentError(fmt::format(
        "--what-if-plan: the what-if plans' dependencies form a cycle through {} ({} of {} nodes "
        "ordered): the plan deadlocks",
        what, g.topo_order.size(), g.nodes.size()));
  }
  g.origin_ns = origin == INT64_MAX ? 0 : origin;
  return out;
}

Status ReplayPlanWhatIf(const PlanWhatIf& w, const std::vector<WhatIf>& what_if,
                        const std::string& name, Replays* r) {
  ReplayOptions o;
  o.what_if = what_if;  // transfers and collectives: A's per-iteration replay's, in the nodes
  SLUICE_ASSIGN_OR_RETURN(r->what_if_whole_run, Replay(w.graph, w.set, o));
  o.per_iteration = true;
  o.critical_path = false;
  SLUICE_ASSIGN_OR_RETURN(r->what_if_per_iteration, Replay(w.graph, w.set, o));
  r->what_if = what_if;
  r->what_if_plan = name;
  return Status::Ok();
}

std::string PricingText(const PlanPricing& p) {
  std::string out = fmt::format(
      "what-if plan priced from the trace: {} instructions measured (the same instruction), {} by "
      "their class's median, {} derived from measured backward halves or wholes, {} by the "
      "calibrated cost model, {} by the plan's own durations; {} transfers measured, {} by their "
      "link's median, {} collectives measured\n",
      p.measured, p.by_class, p.derived, p.calibrated, p.plan, p.transfers_measured,
      p.transfers_by_class, p.collectives);
  for (const std::string& e : p.examples) out += "  not measured: " + e + "\n";
  return out;
}

}  // namespace sluice::trace
