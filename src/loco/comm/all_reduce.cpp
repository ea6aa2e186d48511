// Group's all-reduce algorithms (group.h, "All-reduce"): the direct gather and scatter with every
// receive posted first, the re-encoding ring, the choice between them by the measured link, and the
// round trip measured when a group connects.
#include "loco/comm/group.h"

#include <chrono>

#include "loco/comm/codec_kernels.h"
#include "loco/comm/staged.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

const char* to_string(ReduceAlgorithm algorithm) {
  switch (algorithm) {
    case ReduceAlgorithm::kAuto: return "auto";
    case ReduceAlgorithm::kGather: return "gather";
    case ReduceAlgorithm::kScatter: return "scatter";
    case ReduceAlgorithm::kRing: return "ring";
  }
  return "?";
}

const char* to_string(Combine combine) {
  switch (combine) {
    case Combine::kSum: return "sum";
    case Combine::kMedian: return "median";
    case Combine::kTrimmedMean: return "trimmed mean";
  }
  return "?";
}

double Tally::sum(size_t i) const {
  double total = 0;
  for (const auto& row : all) total += row.at(i);
  return total;
}

namespace {

// Tags of the direct all-reduce's messages: piece p of the first phase travels with tag p, of the
// second with kSecondPhase + p (so that pieces spread over the connections); the tally, and the
// round-trip measurement at connection, have tags of their own. Gloo matches messages between two
// ranks by tag, in order, so consecutive operations may reuse them.
constexpr int64_t kSecondPhase = int64_t{1} << 24;
constexpr int64_t kTallyTag = int64_t{1} << 25;
constexpr int64_t kPingTag = kTallyTag + 1;
// kAuto gathers for M > 2 only while the receive buffers stay this small: gathering keeps the
// M − 1 others' whole tensors in memory at once.
constexpr int64_t kGatherMemory = int64_t{64} << 20;

// Chunk c (taken modulo M) of a flat tensor cut into M runs of whole encoding blocks, so that
// encoding a chunk is encoding its blocks.
struct Chunks {
  torch::Tensor flat;
  int64_t m;
  torch::Tensor operator()(int64_t c) const {
    const int64_t n = flat.numel(), blocks = (n + kEncodingBlock - 1) / kEncodingBlock;
    c = ((c % m) + m) % m;
    const int64_t begin = std::min(n, c * blocks / m * kEncodingBlock);
    const int64_t end = std::min(n, (c + 1) * blocks / m * kEncodingBlock);
    return flat.narrow(0, begin, end - begin);
  }
};

// How values look on the wire: fp32 as they are, anything else encoded (comm/encoding.h).
struct Wire {
  Encoding encoding;
  bool raw() const { return encoding == Encoding::kFp32; }
  torch::Tensor buffer_for(const torch::Tensor& values) const {
    return raw() ? torch::empty({values.numel()}, torch::kFloat32)
                 : torch::empty({encoded_bytes(encoding, values.numel())}, torch::kUInt8);
  }
  // `zero`: send zeros instead (a rank whose values are not finite; every rank refuses afterwards).
  torch::Tensor encode_piece(const torch::Tensor& values, bool zero) const {
    if (zero) return raw() ? torch::zeros({values.numel()}) : comm::encode(torch::zeros({values.numel()}), encoding);
    return raw() ? values : comm::encode(values, encoding);
  }
  // target += weight · decode(bytes), the product rounded to fp32 before the sum (as x·w would be).
  void add(const torch::Tensor& bytes, double weight, torch::Tensor& target) const {
    if (weight == 1.0) {
      if (raw()) target.add_(bytes);
      else decode_add(bytes, encoding, target);
      return;
    }
    auto values = raw() ? bytes : decode(bytes, encoding, target.numel());
    target.add_(values.mul_(weight));
  }
  void assign(const torch::Tensor& bytes, torch::Tensor& target) const {
    target.copy_(raw() ? bytes : decode(bytes, encoding, target.numel()));
  }
};

std::vector<torch::Tensor> pieces_of(const torch::Tensor& values, int64_t piece) {
  std::vector<torch::Tensor> out;
  for (int64_t begin = 0; begin < values.numel(); begin += piece) {
    out.push_back(values.narrow(0, begin, std::min(piece, values.numel() - begin)));
  }
  return out;
}

// The values that are not finite in the ranks' contributions to a sum (each row's first number),
// counting only ranks whose weight is not 0: a rank weighted 0 is left out, whatever it holds.
int64_t not_finite_in_sum(const std::vector<std::vector<double>>& rows, const std::vector<double>& weights) {
  int64_t total = 0;
  for (size_t q = 0; q < rows.size(); ++q) {
    if (weights[q] != 0) total += static_cast<int64_t>(rows[q].at(0));
  }
  return total;
}

// The weights a tally gives, or ones.
std::vector<double> weights_of(Tally* tally, int64_t size) {
  if (tally == nullptr || !tally->weights) return std::vector<double>(static_cast<size_t>(size), 1.0);
  auto weights = tally->weights(tally->all);
  LOCO_CHECK(static_cast<int64_t>(weights.size()) == size, "a tally's weights gave {} factors for {} ranks", weights.size(), size);
  return weights;
}

}  // namespace

namespace {

// A few fp64 numbers from every rank to every other: posted at once, waited for by rows().
class PostedValues {
 public:
  PostedValues(GroupImpl& impl, const std::vector<double>& mine, int64_t tag) : impl_(impl) {
    const int64_t m = impl.size(), r = impl.rank();
    mine_ = torch::tensor(mine, torch::kFloat64);
    incoming_.resize(static_cast<size_t>(m));
    receiving_.resize(static_cast<size_t>(m));
    for (int64_t q = 0; q < m; ++q) {
      if (q == r) continue;
      incoming_[static_cast<size_t>(q)] = torch::empty_like(mine_);
      receiving_[static_cast<size_t>(q)] = impl.post_recv(incoming_[static_cast<size_t>(q)], q, tag);
    }
    for (int64_t k = 1; k < m; ++k) sending_.push_back(impl.post_send(mine_, (r + k) % m, tag));
  }
  // Every rank's numbers, in rank order; blocks until they have arrived.
  std::vector<std::vector<double>> rows(CommStats& stats) {
    std::vector<std::vector<double>> out;
    for (size_t q = 0; q < receiving_.size(); ++q) {
      const auto& values = q == static_cast<size_t>(impl_.rank()) ? mine_ : incoming_[q];
      if (receiving_[q]) stats += std::exchange(receiving_[q], nullptr)->wait();
      out.emplace_back(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
    }
    return out;
  }
  void finish(CommStats& stats) {
    for (auto& posted : sending_) stats += posted->wait();
    sending_.clear();
  }

 private:
  GroupImpl& impl_;
  torch::Tensor mine_;
  std::vector<torch::Tensor> incoming_;
  std::vector<std::unique_ptr<Posted>> receiving_, sending_;
};

}  // namespace

// One direct all-reduce (kGather or kScatter; see group.h), run by run(): every receive of both
// phases and the tally's is posted first, then the first phase's sends, so that no message waits
// for its receiver's announcement after the first.
class Group::Exchange {
 public:
  Exchange(Group& group, torch::Tensor flat, const ReduceOptions& options, Tally* tally, bool scatter)
      : group_(group), impl_(*group.impl_), flat_(std::move(flat)), wire_{options.encoding}, tally_(tally),
        scatter_(scatter), combine_(options.combine), trim_(options.trim), m_(group.size()), r_(group.rank()),
        chunk_{flat_, m_} {
    const int64_t piece = std::max(kEncodingBlock, options.piece_bytes / 4 / kEncodingBlock * kEncodingBlock);
    LOCO_CHECK((flat_.numel() + piece - 1) / piece < kSecondPhase, "an all-reduce of {} values in pieces of {}", flat_.numel(), piece);
    piece_ = piece;
  }

  CommStats run() {
    // Numbers first: how many values are not finite (encodings only: they have no code for them;
    // every rank refuses at the end, alike), the goodput this rank last measured, the caller's.
    not_finite_ = wire_.raw() ? 0 : kernels::count_not_finite(flat_.data_ptr<float>(), flat_.numel());
    std::vector<double> header{static_cast<double>(not_finite_), group_.counters_->measured_bps};
    if (tally_) header.insert(header.end(), tally_->mine.begin(), tally_->mine.end());
    result_ = torch::empty_like(flat_);
    if (scatter_) post_scatter_receives(); else post_gather_receives();
    PostedValues values(impl_, header, kTallyTag);
    if (scatter_) send_chunks(); else send_whole();
    auto rows = values.rows(stats_);
    every_rank_started_ = Clock::now();
    take_header(rows);
    if (scatter_) reduce_and_share(); else sum_everything();
    values.finish(stats_);
    if (total_not_finite_ > 0) {
      throw DataError("comm", fmt::format("all-reduce in {}: {} value(s) are NaN or Inf across the group ({} on this rank); "
                                          "they have no encoding (an outer gradient that is not finite means training "
                                          "diverged; hint: lower optim.lr or outer.lr)", to_string(wire_.encoding),
                                          total_not_finite_, not_finite_));
    }
    flat_.copy_(result_);
    learn_goodput();
    stats_.participants = m_;
    stats_.route = scatter_ ? "scatter" : "gather";
    return stats_;
  }

 private:
  using PostedList = std::vector<std::unique_ptr<Posted>>;
  struct Incoming {
    torch::Tensor bytes;                // the receive buffer
    torch::Tensor target;               // where its values go
    std::unique_ptr<Posted> posted;
  };

  void finish(std::unique_ptr<Posted>& posted) {
    const auto moved = std::exchange(posted, nullptr)->wait();
    group_.counters_->bytes_sent += moved.bytes_sent;  // as each piece completes, for readers of bytes_sent()
    stats_ += moved;
  }
  void finish_all(PostedList& list) {
    for (auto& posted : list) finish(posted);
    list.clear();
  }
  std::unique_ptr<Posted> receive(torch::Tensor& buffer, int64_t from, int64_t tag) { return impl_.post_recv(buffer, from, tag); }

  // kGather: every other rank's whole tensor, piece by piece.
  void post_gather_receives() {
    incoming_.resize(static_cast<size_t>(m_));
    const auto targets = pieces_of(flat_, piece_);
    for (int64_t q = 0; q < m_; ++q) {
      if (q == r_) continue;
      for (size_t p = 0; p < targets.size(); ++p) {
        auto& in = incoming_[static_cast<size_t>(q)].emplace_back(Incoming{wire_.buffer_for(targets[p]), {}, nullptr});
        in.posted = receive(in.bytes, q, static_cast<int64_t>(p));
      }
    }
  }
  void send_whole() {
    for (const auto& piece : pieces_of(flat_, piece_)) {
      auto bytes = own_.emplace_back(wire_.encode_piece(piece, not_finite_ > 0));
      for (int64_t k = 1; k < m_; ++k) sending_.push_back(impl_.post_send(bytes, (r_ + k) % m_, static_cast<int64_t>(own_.size() - 1)));
    }
  }
  // Σ_q w_q·decode(x_q) in rank order, this rank's own term decoded from the bytes it sent, so that
  // every rank adds the very same numbers.
  void sum_everything() {
    if (combine_ != Combine::kSum) return combine_everything();
    result_.zero_();
    const auto targets = pieces_of(result_, piece_);
    for (int64_t q = 0; q < m_; ++q) {
      for (size_t p = 0; p < targets.size(); ++p) {
        auto target = targets[p];
        const double weight = weights_[static_cast<size_t>(q)];
        if (q == r_) {
          if (weight != 0) wire_.add(own_[p], weight, target);
          continue;
        }
        auto& in = incoming_[static_cast<size_t>(q)][p];
        finish(in.posted);
        if (weight != 0) wire_.add(in.bytes, weight, target);
      }
    }
    finish_all(sending_);
  }

  // kGather with a robust combine: piece by piece, every counted rank's decoded term (this rank's
  // own decoded from the bytes it sent, as in the sum), combined value by value.
  void combine_everything() {
    const auto targets = pieces_of(result_, piece_);
    for (size_t p = 0; p < targets.size(); ++p) {
      auto terms = term_rows(targets[p].numel());
      for (int64_t q = 0, k = 0; q < m_; ++q) {
        const bool counted = weights_[static_cast<size_t>(q)] != 0;
        if (q == r_) {
          if (counted) decode_term(own_[p], terms, k++);
          continue;
        }
        auto& in = incoming_[static_cast<size_t>(q)][p];
        finish(in.posted);
        if (counted) decode_term(in.bytes, terms, k++);
      }
      combine_terms(terms, targets[p]);
    }
    finish_all(sending_);
  }
  void decode_term(const torch::Tensor& bytes, const torch::Tensor& terms, int64_t k) {
    auto row = terms[k];
    wire_.add(bytes, 1.0, row);
  }
  // One zeroed row of `values` per rank whose weight is not 0.
  torch::Tensor term_rows(int64_t values) const {
    const auto counted = std::count_if(weights_.begin(), weights_.end(), [](double w) { return w != 0; });
    return torch::zeros({counted, values}, torch::kFloat32);
  }
  // The median or trimmed mean of `terms`' rows, value by value, times the counted weights' sum.
  void combine_terms(const torch::Tensor& terms, torch::Tensor target) const {
    const int64_t k = terms.size(0);
    if (k == 0) return target.zero_(), void();
    double total = 0;
    for (const double w : weights_) total += w;
    const bool trimmed = combine_ == Combine::kTrimmedMean && k > 2 * trim_;
    const int64_t cut = trimmed ? trim_ : (k - 1) / 2, keep = trimmed ? k - 2 * trim_ : 2 - k % 2;
    if (k <= kernels::kMaxSortedTerms && target.is_contiguous()) {
      kernels::combine_sorted(terms.data_ptr<float>(), k, terms.size(1), cut, keep, target.data_ptr<float>());
    } else {
      target.copy_(std::get<0>(terms.sort(0)).narrow(0, cut, keep).mean(0));
    }
    if (total != 1.0) target.mul_(total);
  }

  // kScatter: the pieces of this rank's chunk from every other rank, and every other chunk's
  // reduced pieces from its owner (the second phase, posted now).
  void post_scatter_receives() {
    incoming_.resize(static_cast<size_t>(m_));
    shared_.resize(static_cast<size_t>(m_));
    const auto mine = pieces_of(chunk_(r_), piece_);
    for (int64_t q = 0; q < m_; ++q) {
      if (q == r_) continue;
      for (size_t p = 0; p < mine.size(); ++p) {
        auto& in = incoming_[static_cast<size_t>(q)].emplace_back(Incoming{wire_.buffer_for(mine[p]), {}, nullptr});
        in.posted = receive(in.bytes, q, static_cast<int64_t>(p));
      }
      const auto theirs = pieces_of(Chunks{result_, m_}(q), piece_);
      for (size_t p = 0; p < theirs.size(); ++p) {
        // fp32 lands where it belongs; encoded bytes are decoded there.
        auto& in = shared_[static_cast<size_t>(q)].emplace_back(
            Incoming{wire_.raw() ? theirs[p] : wire_.buffer_for(theirs[p]), theirs[p], nullptr});
        in.posted = receive(in.bytes, q, kSecondPhase + static_cast<int64_t>(p));
      }
    }
  }
  // Piece by piece, each to every other rank before the next: the owners can reduce a piece (and
  // send its sum on) as soon as it has arrived from everyone, while later pieces still travel.
  void send_chunks() {
    std::vector<std::vector<torch::Tensor>> theirs(static_cast<size_t>(m_));
    size_t most = 0;
    for (int64_t k = 1; k < m_; ++k) {
      theirs[static_cast<size_t>(k)] = pieces_of(chunk_((r_ + k) % m_), piece_);
      most = std::max(most, theirs[static_cast<size_t>(k)].size());
    }
    for (size_t p = 0; p < most; ++p) {
      for (int64_t k = 1; k < m_; ++k) {
        const auto& pieces = theirs[static_cast<size_t>(k)];
        if (p >= pieces.size()) continue;
        first_sends_.push_back(impl_.post_send(wire_.encode_piece(pieces[p], not_finite_ > 0), (r_ + k) % m_, static_cast<int64_t>(p)));
      }
    }
  }
  // The owner's sum of its chunk, piece by piece, in fp32 and rank order with its own values as
  // they are, each piece decoded as soon as it has arrived; each reduced piece is encoded once, sent
  // to every other rank at once (the two phases overlap: a piece's sum travels while later pieces
  // of the first phase still arrive), and taken (decoded) as this rank's result too.
  void reduce_and_share() {
    const auto own = pieces_of(chunk_(r_), piece_);
    const auto sums = pieces_of(Chunks{result_, m_}(r_), piece_);
    for (size_t p = 0; p < own.size(); ++p) {
      auto sum = sums[p];
      sum.zero_();
      if (combine_ != Combine::kSum) {
        auto terms = term_rows(sum.numel());
        for (int64_t q = 0, k = 0; q < m_; ++q) {
          const bool counted = weights_[static_cast<size_t>(q)] != 0;
          if (q == r_) {
            if (counted) terms[k++].copy_(own[p]);
            continue;
          }
          auto& in = incoming_[static_cast<size_t>(q)][p];
          finish(in.posted);
          if (counted) decode_term(in.bytes, terms, k++);
        }
        combine_terms(terms, sum);
      }
      for (int64_t q = 0; q < m_ && combine_ == Combine::kSum; ++q) {
        const double weight = weights_[static_cast<size_t>(q)];
        if (q == r_) {
          if (not_finite_ == 0 && weight != 0) sum.add_(weight == 1.0 ? own[p] : own[p] * weight);
          continue;
        }
        auto& in = incoming_[static_cast<size_t>(q)][p];
        finish(in.posted);
        if (weight != 0) wire_.add(in.bytes, weight, sum);
      }
      auto bytes = wire_.raw() ? sum : wire_.encode_piece(sum, total_not_finite_ > 0);
      for (int64_t k = 1; k < m_; ++k) sending_.push_back(impl_.post_send(bytes, (r_ + k) % m_, kSecondPhase + static_cast<int64_t>(p)));
      if (!wire_.raw()) wire_.assign(bytes, sum);
      own_.push_back(std::move(bytes));
    }
    finish_all(first_sends_);  // they read flat_, which the result overwrites at the end
    for (int64_t q = 0; q < m_; ++q) {
      for (auto& in : shared_[static_cast<size_t>(q)]) {
        finish(in.posted);
        if (!wire_.raw()) wire_.assign(in.bytes, in.target);
      }
    }
    finish_all(sending_);
  }

  // This rank's goodput, timed from when every rank's header had arrived (so that a rank that
  // started late is not counted as a slow link), less the one-way delay still ahead then (the
  // scatter's second phase); only when the bytes took clearly longer than that delay. It goes
  // out with this rank's next all-reduce.
  void learn_goodput() {
    const double seconds = std::chrono::duration<double>(Clock::now() - every_rank_started_).count();
    const double delay = scatter_ ? 0.5 * group_.counters_->link.round_trip_s : 0.0;
    if (seconds > 0.005 && seconds > 2 * delay && stats_.bytes_sent > 0) {
      group_.counters_->measured_bps = static_cast<double>(stats_.bytes_sent) * 8 / (seconds - delay);
    }
  }

  // The numbers every rank sent: the not-finite count, the goodput for the next choice, the tally.
  void take_header(const std::vector<std::vector<double>>& rows) {
    double least_bps = 0;
    for (const auto& row : rows) {
      if (row.at(1) > 0) least_bps = least_bps > 0 ? std::min(least_bps, row.at(1)) : row.at(1);
    }
    if (least_bps > 0) group_.counters_->link.goodput_bps = least_bps;
    if (tally_) {
      tally_->all.clear();
      for (const auto& row : rows) tally_->all.emplace_back(row.begin() + 2, row.end());
    }
    weights_ = weights_of(tally_, m_);
    if (tally_) tally_->applied = weights_;
    total_not_finite_ = not_finite_in_sum(rows, weights_);
  }

  Group& group_;
  GroupImpl& impl_;
  torch::Tensor flat_, result_;
  Wire wire_;
  Tally* tally_;
  bool scatter_;
  Combine combine_;
  int64_t trim_;
  int64_t m_, r_, piece_ = 0;
  Chunks chunk_;
  int64_t not_finite_ = 0, total_not_finite_ = 0;
  std::vector<double> weights_;
  std::vector<std::vector<Incoming>> incoming_, shared_;  // by sender
  std::vector<torch::Tensor> own_;                        // what this rank sent, by piece
  PostedList sending_;
  PostedList first_sends_;  // kScatter's first phase
  CommStats stats_;
  Clock::time_point every_rank_started_;
};

void Group::measure_round_trip() {
  // Two exchanges of one number with every other rank. An exchange takes each rank from its posts
  // to the last peer's message; the rank that starts last finds every announcement there already
  // and waits exactly one round trip (its own announcement out, the data back), so the least time
  // any rank measured in the first is the round trip. The second tells every rank every rank's.
  CommStats stats;
  const auto start = Clock::now();
  PostedValues first(*impl_, {0.0}, kPingTag);
  first.rows(stats);
  first.finish(stats);
  const double mine = std::chrono::duration<double>(Clock::now() - start).count();
  PostedValues second(*impl_, {mine}, kPingTag);
  double least = mine;
  for (const auto& row : second.rows(stats)) least = std::min(least, row.at(0));
  second.finish(stats);
  counters_->link.round_trip_s = least;
  counters_->bytes_sent += stats.bytes_sent;
}

ReduceAlgorithm Group::choose(int64_t bytes, Encoding encoding) const {
  const int64_t m = size();
  if (m <= 2) return ReduceAlgorithm::kGather;
  if (encoding != Encoding::kFp32) return ReduceAlgorithm::kScatter;  // deterministic (group.h)
  const auto& link = counters_->link;
  if (link.goodput_bps <= 0 || (m - 1) * bytes > kGatherMemory) return ReduceAlgorithm::kScatter;
  const double e = static_cast<double>(bytes) * 8 / link.goodput_bps;
  const double gather = link.round_trip_s + static_cast<double>(m - 1) * e;
  const double scatter = 1.5 * link.round_trip_s + 2.0 * static_cast<double>(m - 1) / static_cast<double>(m) * e;
  return gather < scatter ? ReduceAlgorithm::kGather : ReduceAlgorithm::kScatter;
}

CommStats Group::all_reduce_sum(torch::Tensor& tensor, const ReduceOptions& options, Tally* tally) {
  LOCO_CHECK(tensor.scalar_type() == torch::kFloat32, "an encoded all-reduce takes fp32, got {}",
             c10::toString(tensor.scalar_type()));
  LOCO_CHECK(options.piece_bytes > 0, "an all-reduce in pieces of {} bytes", options.piece_bytes);
  const auto start = Clock::now();  // the whole operation, encoding and decoding included
  Staged staged(tensor);
  auto flat = staged.staged.view({-1});
  CommStats stats;
  if (size() == 1) {
    double weight = 1.0;
    if (tally) {
      tally->all = {tally->mine};
      tally->applied = weights_of(tally, 1);
      weight = tally->applied[0];
    }
    if (weight == 0) {
      flat.zero_();  // left out, whatever it holds
    } else if (options.encoding != Encoding::kFp32) {
      const int64_t not_finite = kernels::count_not_finite(flat.data_ptr<float>(), flat.numel());
      if (not_finite > 0) {
        throw DataError("comm", fmt::format("all-reduce in {}: {} value(s) are NaN or Inf; they have no encoding (an outer "
                                            "gradient that is not finite means training diverged; hint: lower optim.lr "
                                            "or outer.lr)", to_string(options.encoding), not_finite));
      }
      flat.copy_(decode(encode(flat, options.encoding), options.encoding, flat.numel()));
    }
    if (weight != 1.0 && weight != 0) flat.mul_(weight);
    stats.participants = 1;
  } else {
    // Scatter and ring need a whole block per chunk; a tensor of fewer blocks than ranks is gathered.
    const bool chunks_fit = (flat.numel() + kEncodingBlock - 1) / kEncodingBlock >= size();
    auto algorithm = options.algorithm;
    if (algorithm == ReduceAlgorithm::kAuto) algorithm = choose(encoded_bytes(options.encoding, flat.numel()), options.encoding);
    if (algorithm == ReduceAlgorithm::kRing && (options.encoding == Encoding::kFp32 || options.combine != Combine::kSum)) {
      algorithm = ReduceAlgorithm::kScatter;
    }
    if (!chunks_fit) algorithm = ReduceAlgorithm::kGather;
    if (algorithm == ReduceAlgorithm::kRing) {
      stats = reduce_ring(flat, options.encoding, tally);
    } else {
      stats = Exchange(*this, flat, options, tally, algorithm == ReduceAlgorithm::kScatter).run();
    }
  }
  staged.write_back();
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stats.round_trip_s = counters_->link.round_trip_s;
  return stats;
}

namespace {

torch::Tensor encoded_buffer(Encoding encoding, const torch::Tensor& values) {
  return torch::empty({encoded_bytes(encoding, values.numel())}, torch::kUInt8);
}

// The all-gather that ends the ring: this rank holds chunk `owned`'s reduced sum, encoded; the
// encoded sums travel around the ring unchanged, and every rank, the owner included, takes the
// decoded bytes as the result, so all hold the same values.
CommStats ring_all_gather(Group& group, const Chunks& chunk, int64_t owned, torch::Tensor outgoing, Encoding encoding) {
  const int64_t m = group.size(), r = group.rank();
  chunk(owned).copy_(decode(outgoing, encoding, chunk(owned).numel()));
  CommStats stats;
  for (int64_t k = 0; k < m - 1; ++k) {
    auto target = chunk(owned - k - 1);
    auto incoming = encoded_buffer(encoding, target);
    stats += group.send_recv(outgoing, (r + 1) % m, incoming, (r + m - 1) % m, m + k);
    target.copy_(decode(incoming, encoding, target.numel()));
    outgoing = incoming;
  }
  return stats;
}

}  // namespace

CommStats Group::reduce_ring(torch::Tensor& flat, Encoding encoding, Tally* tally) {
  const int64_t m = size(), r = rank();
  // The numbers first, in an exchange of their own (a ring cannot weight at an owner: each rank
  // scales its own values before they go).
  const int64_t not_finite = kernels::count_not_finite(flat.data_ptr<float>(), flat.numel());
  std::vector<double> header{static_cast<double>(not_finite)};
  if (tally) header.insert(header.end(), tally->mine.begin(), tally->mine.end());
  CommStats stats;
  PostedValues values(*impl_, header, kTallyTag);
  const auto rows = values.rows(stats);
  values.finish(stats);
  auto work = flat.clone();
  std::vector<double> weights(static_cast<size_t>(m), 1.0);
  if (tally) {
    tally->all.clear();
    for (const auto& row : rows) tally->all.emplace_back(row.begin() + 1, row.end());
    tally->applied = weights = weights_of(tally, m);
    const double mine = weights[static_cast<size_t>(r)];
    if (mine == 0) work.zero_();
    else if (mine != 1.0) work.mul_(mine);
  }
  const int64_t total = not_finite_in_sum(rows, weights);
  if (total > 0) {
    throw DataError("comm", fmt::format("all-reduce in {}: {} value(s) are NaN or Inf across the group ({} on this rank); "
                                        "they have no encoding (an outer gradient that is not finite means training "
                                        "diverged; hint: lower optim.lr or outer.lr)", to_string(encoding), total, not_finite));
  }
  const Chunks chunk{work, m};
  const int64_t next = (r + 1) % m, previous = (r + m - 1) % m;
  // Reduce-scatter: at hop k, send the running sum of chunk r − k, receive that of chunk r − k − 1
  // and add this rank's own values to it. After M − 1 hops this rank holds chunk r + 1's sum.
  auto outgoing = encode(chunk(r), encoding);
  for (int64_t k = 0; k < m - 1; ++k) {
    auto target = chunk(r - k - 1);
    auto incoming = encoded_buffer(encoding, target);
    stats += send_recv(outgoing, next, incoming, previous, k);
    decode_add(incoming, encoding, target);
    outgoing = encode(target, encoding);
  }
  stats += ring_all_gather(*this, chunk, r + 1, outgoing, encoding);
  flat.copy_(work);
  stats.participants = m;
  stats.route = "ring";
  return stats;
}

}  // namespace loco::comm
