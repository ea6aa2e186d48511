#include "loco/algorithms/elastic_rounds.h"

namespace loco::algorithms {

RoundPlan ElasticRounds::begin(int64_t round, int64_t step, int64_t failed_epoch, const std::string& failure) {
  RoundPlan plan = membership_->begin_round(round, step, failed_epoch, failure);
  if (!plan.group.same_as(group_)) {
    bytes_before_ += group_.bytes_sent();
    group_ = plan.group;
  }
  return plan;
}

}  // namespace loco::algorithms
