#include "runtime/context_parallel.h"

#include <fmt/core.h>

#include <stdexcept>

namespace sluice::runtime {
namespace {

at::Tensor IndexTensor(const std::vector<int64_t>& v) {
  return torch::tensor(v, torch::kInt64);
}

// The all-gather as an autograd function: forward gathers, backward sums the gradient over the
// cp group and keeps this index's slice.
struct GatherFn : torch::autograd::Function<GatherFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local,
                            const CpGather* gather) {
    ctx->saved_data["gather"] = reinterpret_cast<int64_t>(gather);
    return gather->AllGather(local);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* gather = reinterpret_cast<const CpGather*>(ctx->saved_data["gather"].toInt());
    return {gather->ReduceSlice(grads[0]), at::Tensor()};
  }
};

}  // namespace

int64_t CpPaddedLength(int64_t seqlen, int64_t cp) {
  const int64_t unit = 2 * cp;
  return (seqlen + unit - 1) / unit * unit;
}

std::vector<int64_t> LocalPositions(int64_t padded, int64_t cp, int64_t index) {
  const int64_t chunk = padded / (2 * cp);
  std::vector<int64_t> out;
  out.reserve(2 * chunk);
  for (const int64_t c : {index, 2 * cp - 1 - index}) {
    for (int64_t i = 0; i < chunk; ++i) out.push_back(c * chunk + i);
  }
  return out;
}

std::vector<int64_t> GatherOrder(int64_t padded, int64_t cp) {
  std::vector<int64_t> out;
  out.reserve(padded);
  for (int64_t r = 0; r < cp; ++r) {
    const std::vector<int64_t> l = LocalPositions(padded, cp, r);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

TensorShape LocalShape(const TensorShape& shape, int64_t seqlen, int64_t cp) {
  if (cp == 1 || shape.size() < 2 || shape[1] != seqlen) return shape;
  TensorShape out = shape;
  out[1] = CpPaddedLength(seqlen, cp) / cp;
  return out;
}

MicroBatchInputs ShardMicroBatchInputs(const MicroBatchInputs& full, int64_t cp, int64_t index,
                                       const SequenceGather* gather) {
  const int64_t padded = full.tokens.size(1);
  SLUICE_CHECK(padded % (2 * cp) == 0);
  SLUICE_CHECK(!full.dec_tokens.defined());
  const at::Tensor local = IndexTensor(LocalPositions(padded, cp, index));
  const at::Tensor order = IndexTensor(GatherOrder(padded, cp));
  MicroBatchInputs in;
  in.shape = full.shape;
  in.loss_scale = full.loss_scale;
  in.tokens = full.tokens.index_select(1, local).contiguous();
  in.labels = full.labels.index_select(1, local).contiguous();
  in.positions = full.positions.index_select(1, local).contiguous();
  in.real = full.real.index_select(1, local).contiguous();
  in.self_mask = full.self_mask.index_select(2, local).index_select(3, order).contiguous();
  in.cp = gather;
  return in;
}

at::Tensor CpGather::Gather(const at::Tensor& local) const {
  return GatherFn::apply(local, this);
}

void CpGather::WaitFor(const Communicator::Handle& h, const char* what) const {
  watchdog_->BeginWait(what, comm_->cp_peers());
  Status s = comm_->Wait(h);
  watchdog_->EndWait();
  if (!s.ok()) {
    const std::string blame = watchdog_->Blame(comm_->cp_peers(), what);
    throw std::runtime_error(fmt::format("{} failed{}: {}", what,
                                         blame.empty() ? "" : " (" + blame + ")", s.message()));
  }
}

at::Tensor CpGather::AllGather(const at::Tensor& local) const {
  const at::Tensor in = local.detach().contiguous();
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < comm_->cp(); ++r) parts.push_back(torch::empty_like(in));
  StatusOr<Communicator::Handle> h = comm_->AllGatherCp(parts, in);
  if (!h.ok()) throw std::runtime_error(std::string(h.status().message()));
  WaitFor(*h, "the context-parallel all-gather of keys and values");
  return torch::cat(parts, 1);
}

at::Tensor CpGather::ReduceSlice(const at::Tensor& grad) const {
  const at::Tensor sum = grad.detach().contiguous().clone();
  StatusOr<Communicator::Handle> h = comm_->AllReduceCp(sum);
  if (!h.ok()) throw std::runtime_error(std::string(h.status().message()));
  WaitFor(*h, "the context-parallel all-reduce of key and value gradients");
  const int64_t l = sum.size(1) / comm_->cp();
  return sum.narrow(1, comm_->cp_index() * l, l).contiguous();
}

}  // namespace sluice::runtime
