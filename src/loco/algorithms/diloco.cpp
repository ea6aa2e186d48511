#include "loco/algorithms/diloco.h"

#include <fmt/format.h>

#include "loco/core/error.h"

namespace loco::algorithms {

DiLoCo::DiLoCo(comm::Group group, DiLoCoOptions options, Membership* membership)
    : StreamingDiLoCo(std::move(group), options.as_streaming(), membership, "diloco"), total_steps_(options.total_steps) {}

bool DiLoCo::round_ends_at(int64_t step) const { return step == total_steps_ || starts_at(0, step); }

}  // namespace loco::algorithms
