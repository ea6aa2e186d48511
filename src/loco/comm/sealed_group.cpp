// The sealed data plane (group.h, DataPlane; docs/security.md, "The data plane"): a GroupImpl over
// another group of the same ranks (Gloo's) whose every message is sealed with AES-256-GCM.
//
// Forming. Each rank sends every peer a fresh 32-byte nonce, then a proof: HMAC(K, "proof", its
// rank, the peer's, the data plane, its nonce, the peer's), where K = HMAC(secret, "loco data
// plane v1", the group's name). A peer whose proof is wrong is refused (PeerError naming it), as a
// rank that never came is. The messages from rank a to rank b are sealed under HMAC(K, "send", a,
// b, a's nonce, b's nonce): a key fresh for every group, and another one for each direction.
//
// Messages. The payload, then GCM's 16-byte tag. GCM's 12-byte IV is the message's tag (4 bytes)
// and its count among the messages of that tag from that sender to that receiver (8 bytes), which
// both ends count alike: every rank posts a group's operations in the same order, and messages of
// one tag between two ranks are matched in order. So a message altered, injected, replayed (from
// this group or another) or delivered in another place fails its check. kAuthenticated passes the
// payload to GCM as additional data (it travels as it is); kEncrypted encrypts it. A receive is
// opened in its own buffer, and only a message that passed is copied into the caller's tensor.
//
// Collectives. A sealed group never uses the backend's collectives, which a seal cannot reach
// into: broadcast and all-gather are direct exchanges of sealed messages, and so is a sum of other
// types than fp32 (every rank gathers every rank's tensor and adds them in rank order); Group sums
// fp32 by its own direct all-reduce over the same sealed messages (Group::all_reduce_sealed).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/ranges.h>

#include "loco/comm/group.h"
#include "loco/comm/seal.h"
#include "loco/comm/staged.h"
#include "loco/core/crypto.h"
#include "loco/core/error.h"

namespace loco::comm {
namespace {

using sealing::Iv;
using sealing::kTagBytes;
// Tags of the sealed group's own messages, above the direct all-reduce's (all_reduce.cpp).
constexpr int64_t kHelloTag = int64_t{1} << 26;
constexpr int64_t kProofTag = kHelloTag + 1;
constexpr int64_t kBroadcastTag = kHelloTag + 2;
constexpr int64_t kGatherTag = kHelloTag + 3;
constexpr int64_t kSumTag = kHelloTag + 4;
constexpr int64_t kBroadcastPiece = int64_t{8} << 20;  // bytes

int64_t payload_bytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }
unsigned char* bytes(const torch::Tensor& t) { return static_cast<unsigned char*>(t.data_ptr()); }

torch::Tensor to_tensor(const std::string& s) {
  auto t = torch::empty({static_cast<int64_t>(s.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}
std::string to_text(const torch::Tensor& t) { return {reinterpret_cast<const char*>(bytes(t)), static_cast<size_t>(payload_bytes(t))}; }

class SealedGroup final : public PostingGroupImpl {
 public:
  SealedGroup(std::shared_ptr<GroupImpl> inner, const GroupOptions& options, Tamper tamper)
      : inner_(std::move(inner)), options_(options), tamper_(std::move(tamper)),
        encrypt_(options.data_plane == DataPlane::kEncrypted) {
    LOCO_CHECK(options.data_plane != DataPlane::kOpen, "a sealed group with an open data plane");
    prove_membership();
  }

  int64_t rank() const override { return inner_->rank(); }
  int64_t size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  bool sealed() const override { return true; }
  std::vector<int64_t> closed_peers() const override { return inner_->closed_peers(); }

  // A message's count is taken and the message posted under one lock, so that the order of the
  // counts is the order on the wire even if two threads were to post to one peer with one tag.
  std::unique_ptr<Posted> post_send(const torch::Tensor& tensor, int64_t peer, int64_t tag) override {
    check_tag(tag);
    const int64_t n = payload_bytes(tensor);
    auto sealed = torch::empty({n + kTagBytes}, torch::kUInt8);
    std::memcpy(bytes(sealed), bytes(tensor), static_cast<size_t>(n));
    std::lock_guard lock(mutex_);
    sealing::seal(send_keys_.at(static_cast<size_t>(peer)), sealing::iv_of(tag, sent_[{peer, tag}]++), encrypt_, bytes(sealed), n);
    if (tamper_) tamper_(sealed, peer, tag);
    return std::make_unique<Sending>(inner_->post_send(sealed, peer, tag), sealed);
  }
  std::unique_ptr<Posted> post_recv(torch::Tensor& tensor, int64_t peer, int64_t tag) override {
    check_tag(tag);
    auto sealed = torch::empty({payload_bytes(tensor) + kTagBytes}, torch::kUInt8);
    std::lock_guard lock(mutex_);
    const Iv iv = sealing::iv_of(tag, received_[{peer, tag}]++);
    return std::make_unique<Receiving>(*this, inner_->post_recv(sealed, peer, tag), sealed, tensor, peer, tag, iv);
  }


  // In pieces of kBroadcastPiece bytes, each sent to every rank before the next is sealed: the root
  // holds M - 1 sealed copies of a piece, not of the whole tensor (a joiner's state is the model's
  // several times over). Every receiver posts all its pieces at once.
  CommStats broadcast(torch::Tensor& tensor, int64_t root) override {
    const int64_t n = payload_bytes(tensor);
    const auto whole = torch::from_blob(tensor.data_ptr(), {n}, torch::kUInt8);
    const auto piece = [&](int64_t p) { return whole.narrow(0, p * kBroadcastPiece, std::min(kBroadcastPiece, n - p * kBroadcastPiece)); };
    const int64_t pieces = std::max<int64_t>(1, (n + kBroadcastPiece - 1) / kBroadcastPiece);
    CommStats stats;
    if (rank() == root) {
      for (int64_t p = 0; p < pieces; ++p) {
        std::vector<std::unique_ptr<Posted>> sending;
        for (int64_t q = 0; q < size(); ++q) {
          if (q != root) sending.push_back(post_send(piece(p), q, kBroadcastTag));
        }
        for (auto& s : sending) stats += s->wait();
      }
    } else {
      std::vector<torch::Tensor> views;
      std::vector<std::unique_ptr<Posted>> receiving;
      for (int64_t p = 0; p < pieces; ++p) receiving.push_back(post_recv(views.emplace_back(piece(p)), root, kBroadcastTag));
      for (auto& r : receiving) stats += r->wait();
    }
    stats.participants = size();
    return stats;
  }

  CommStats all_gather(const torch::Tensor& tensor, std::vector<torch::Tensor>& out) override {
    out.clear();
    for (int64_t q = 0; q < size(); ++q) out.push_back(q == rank() ? tensor.clone() : torch::empty_like(tensor));
    CommStats stats = exchange(tensor, out, kGatherTag);
    stats.participants = size();
    return stats;
  }

  // Any dtype: every rank gathers every rank's values and adds them in rank order.
  CommStats all_reduce_sum(std::vector<torch::Tensor>& tensors) override {
    if (tensors.empty()) return {0, 0, 0, size()};
    const auto flat = flatten(tensors);
    std::vector<torch::Tensor> all;
    for (int64_t q = 0; q < size(); ++q) all.push_back(q == rank() ? flat : torch::empty_like(flat));
    CommStats stats = exchange(flat, all, kSumTag);
    auto sum = torch::zeros_like(flat);
    for (const auto& part : all) sum.add_(part);
    unflatten(sum, tensors);
    stats.participants = size();
    stats.route = "gather";
    return stats;
  }

 private:
  // A posted send keeps its sealed copy alive until the send is done.
  class Sending final : public Posted {
   public:
    Sending(std::unique_ptr<Posted> inner, torch::Tensor sealed) : inner_(std::move(inner)), sealed_(std::move(sealed)) {}
    CommStats wait() override { return inner_->wait(); }

   private:
    std::unique_ptr<Posted> inner_;
    torch::Tensor sealed_;
  };

  // A posted receive opens its message when it has come, and only then writes the caller's tensor.
  class Receiving final : public Posted {
   public:
    Receiving(SealedGroup& group, std::unique_ptr<Posted> inner, torch::Tensor sealed, torch::Tensor out, int64_t peer,
              int64_t tag, Iv iv)
        : group_(group), inner_(std::move(inner)), sealed_(std::move(sealed)), out_(std::move(out)), peer_(peer),
          tag_(tag), iv_(iv) {}
    CommStats wait() override {
      CommStats stats = inner_->wait();
      const int64_t n = payload_bytes(out_);
      if (!sealing::open(group_.recv_keys_.at(static_cast<size_t>(peer_)), iv_, group_.encrypt_, bytes(sealed_), n)) {
        throw PeerError("comm", fmt::format("a message of {} bytes from rank {} (tag {}) in group '{}' (rank {} of {}) "
                                            "failed its {} check: altered, injected or replayed on the way (or the ranks "
                                            "disagree on this operation's size or order); refused, as a failed peer is", n, peer_, tag_, group_.options_.prefix, group_.rank(),
                                            group_.size(), to_string(group_.options_.data_plane)));
      }
      std::memcpy(bytes(out_), bytes(sealed_), static_cast<size_t>(n));
      return stats;
    }

   private:
    SealedGroup& group_;
    std::unique_ptr<Posted> inner_;
    torch::Tensor sealed_, out_;
    int64_t peer_, tag_;
    Iv iv_;
  };

  using Counts = std::map<std::pair<int64_t, int64_t>, uint64_t>;
  // The IV holds a tag's 32 bits, as Gloo does (its tags are ints): a larger one would share an IV.
  static void check_tag(int64_t tag) {
    LOCO_CHECK(tag >= 0 && tag <= INT32_MAX, "a message tag of {} does not fit the IV's 32 bits", tag);
  }

  // Sends `mine` to every other rank and receives rank q's into out[q], sealed.
  CommStats exchange(const torch::Tensor& mine, std::vector<torch::Tensor>& out, int64_t tag) {
    std::vector<std::unique_ptr<Posted>> receiving, sending;
    for (int64_t q = 0; q < size(); ++q) {
      if (q != rank()) receiving.push_back(post_recv(out[static_cast<size_t>(q)], q, tag));
    }
    for (int64_t q = 0; q < size(); ++q) {
      if (q != rank()) sending.push_back(post_send(mine, q, tag));
    }
    CommStats stats;
    for (auto& r : receiving) stats += r->wait();
    for (auto& s : sending) stats += s->wait();
    return stats;
  }

  // Sends to each other rank q its own message mine[q] and receives q's into theirs[q], unsealed
  // (the membership proof's two steps).
  void exchange_plain(const std::vector<std::string>& mine, std::vector<std::string>& theirs, int64_t tag) {
    std::vector<torch::Tensor> in(mine.size()), out(mine.size());
    std::vector<std::unique_ptr<Posted>> posted;
    for (int64_t q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      const auto i = static_cast<size_t>(q);
      in[i] = torch::empty({static_cast<int64_t>(mine[i].size())}, torch::kUInt8);
      posted.push_back(inner_->post_recv(in[i], q, tag));
    }
    for (int64_t q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      out[static_cast<size_t>(q)] = to_tensor(mine[static_cast<size_t>(q)]);
      posted.push_back(inner_->post_send(out[static_cast<size_t>(q)], q, tag));
    }
    for (auto& p : posted) p->wait();
    theirs.assign(mine.size(), "");
    for (int64_t q = 0; q < size(); ++q) {
      if (q != rank()) theirs[static_cast<size_t>(q)] = to_text(in[static_cast<size_t>(q)]);
    }
  }

  void prove_membership() {
    const auto m = static_cast<size_t>(size());
    const int64_t r = rank();
    const std::string key = sealing::group_key(options_.secret, options_.prefix);
    const std::string nonce = random_bytes(sealing::kNonceBytes);
    std::vector<std::string> theirs;
    exchange_plain(std::vector<std::string>(m, nonce), theirs, kHelloTag);
    const char* plane = to_string(options_.data_plane);
    std::vector<std::string> proofs(m), answers;
    for (int64_t q = 0; q < size(); ++q) {
      if (q != r) proofs[static_cast<size_t>(q)] = sealing::proof(key, r, q, plane, nonce, theirs[static_cast<size_t>(q)]);
    }
    exchange_plain(proofs, answers, kProofTag);
    std::vector<int64_t> refused;
    send_keys_.assign(m, "");
    recv_keys_.assign(m, "");
    for (int64_t q = 0; q < size(); ++q) {
      if (q == r) continue;
      const auto& their_nonce = theirs[static_cast<size_t>(q)];
      if (their_nonce.size() != sealing::kNonceBytes ||
          !same_secret(answers[static_cast<size_t>(q)], sealing::proof(key, q, r, plane, their_nonce, nonce))) {
        refused.push_back(q);
      }
      send_keys_[static_cast<size_t>(q)] = sealing::direction_key(key, r, q, nonce, their_nonce);
      recv_keys_[static_cast<size_t>(q)] = sealing::direction_key(key, q, r, their_nonce, nonce);
    }
    if (!refused.empty()) {
      throw PeerError("comm", fmt::format("group '{}' (rank {} of {}): rank(s) {} did not prove they hold the run's "
                                          "data-plane secret (a stranger, a worker of another run, or one with another "
                                          "join token or cluster.data_plane than '{}'): refused", options_.prefix, r,
                                          size(), fmt::join(refused, ", "), plane));
    }
  }

  std::shared_ptr<GroupImpl> inner_;
  GroupOptions options_;
  Tamper tamper_;
  bool encrypt_;
  std::vector<std::string> send_keys_, recv_keys_;  // by peer
  std::mutex mutex_;                                // guards the counts and the order of posts
  Counts sent_, received_;                          // (peer, tag) -> messages so far
};

}  // namespace

std::shared_ptr<GroupImpl> seal(std::shared_ptr<GroupImpl> inner, const GroupOptions& options, Tamper tamper) {
  options.validate();
  return std::make_shared<SealedGroup>(std::move(inner), options, std::move(tamper));
}

}  // namespace loco::comm
