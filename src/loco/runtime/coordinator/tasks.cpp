#include "loco/runtime/coordinator/tasks.h"

#include <fmt/format.h>

#include "loco/core/error.h"

#include <algorithm>
#include <array>
#include <stdexcept>

namespace loco::runtime {
namespace {

TaskState state_from(const std::string& name) {
  const auto state = parse_task_state(name);
  if (!state || *state == TaskState::kWaiting) {
    throw std::invalid_argument(fmt::format("unknown task state '{}'", name.substr(0, 32)));
  }
  return *state;
}

}  // namespace

TaskRecord& TaskTable::at(int64_t id) {
  auto it = tasks_.find(id);
  LOCO_CHECK(it != tasks_.end(), "no task {}", id);
  return it->second;
}

void TaskTable::move(TaskRecord& record, TaskState to) {
  LOCO_CHECK(legal_transition(record.state, to), "task {} cannot go from {} to {}", record.task.id,
             to_string(record.state), to_string(to));
  record.state = to;
}

int64_t TaskTable::issue(protocol::Task task) {
  task.id = next_id_++;
  TaskRecord record;
  record.task = task;
  record.issued = 0;
  for (auto& [id, open] : tasks_) {
    if (open.state != TaskState::kOpen || open.task.shard != task.shard) continue;
    move(open, TaskState::kCancelled);
    record.issued = std::max(record.issued, open.issued);
  }
  tasks_.emplace(task.id, std::move(record));
  ++totals_.issued;
  return task.id;
}

void TaskTable::lease(int64_t id, int64_t member, std::optional<Clock::time_point> deadline) {
  auto& record = at(id);
  move(record, TaskState::kLeased);
  record.holder = member;
  record.deadline = deadline;
  if (++record.issued > 1) ++totals_.reissued;
}

void TaskTable::renew(int64_t member, Clock::time_point deadline) {
  for (auto& [id, record] : tasks_) {
    if (record.state == TaskState::kLeased && record.holder == member) record.deadline = deadline;
  }
}

std::vector<int64_t> TaskTable::release(int64_t member) {
  std::vector<int64_t> reopened;
  for (auto& [id, record] : tasks_) {
    if (record.state != TaskState::kLeased || record.holder != member) continue;
    move(record, TaskState::kOpen);
    record.holder = -1;
    record.deadline.reset();
    reopened.push_back(id);
  }
  return reopened;
}

std::vector<int64_t> TaskTable::expire(Clock::time_point now) {
  std::vector<int64_t> reopened;
  for (auto& [id, record] : tasks_) {
    if (record.state != TaskState::kLeased || !record.deadline || now <= *record.deadline) continue;
    move(record, TaskState::kOpen);
    record.holder = -1;
    record.deadline.reset();
    reopened.push_back(id);
  }
  return reopened;
}

void TaskTable::complete(int64_t id, int64_t member, const data::SamplerPosition& end) {
  auto it = tasks_.find(id);
  if (it == tasks_.end() || it->second.state != TaskState::kLeased || it->second.holder != member) {
    throw protocol::ProtocolError(fmt::format("member {} reports task {}, which is not leased to it", member, id));
  }
  move(it->second, TaskState::kDone);
  it->second.end = end;
  ++totals_.done;
}

void TaskTable::record_done(int64_t id, const data::SamplerPosition& end) {
  auto& record = at(id);
  if (record.state == TaskState::kDone) return;
  move(record, TaskState::kDone);
  record.end = end;
  ++totals_.done;
}

void TaskTable::cancel(int64_t id) {
  auto it = tasks_.find(id);
  if (it == tasks_.end()) return;
  auto& record = it->second;
  if (record.state == TaskState::kOpen || record.state == TaskState::kLeased) move(record, TaskState::kCancelled);
}

void TaskTable::cancel_before(int64_t version) {
  for (auto& [id, record] : tasks_) {
    if (record.task.version >= version) continue;
    if (record.state == TaskState::kOpen || record.state == TaskState::kLeased) move(record, TaskState::kCancelled);
  }
}

void TaskTable::cancel_pending() {
  for (auto& [id, record] : tasks_) {
    if (record.state == TaskState::kOpen || record.state == TaskState::kLeased) move(record, TaskState::kCancelled);
  }
}

void TaskTable::prune() {
  std::erase_if(tasks_, [](const auto& item) {
    return item.second.state == TaskState::kDone || item.second.state == TaskState::kCancelled;
  });
}

const TaskRecord* TaskTable::find(int64_t id) const {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : &it->second;
}

std::map<int64_t, const TaskRecord*> TaskTable::leased_to(int64_t member, int64_t version) const {
  std::map<int64_t, const TaskRecord*> out;
  for (const auto& [id, record] : tasks_) {
    if (record.state == TaskState::kLeased && record.holder == member && record.task.version == version) {
      out[record.task.shard] = &record;
    }
  }
  return out;
}

const TaskRecord* TaskTable::held(int64_t member, int64_t shard, int64_t version) const {
  const auto leased = leased_to(member, version);
  auto it = leased.find(shard);
  return it == leased.end() ? nullptr : it->second;
}

std::map<TaskState, int64_t> TaskTable::counts() const {
  std::map<TaskState, int64_t> out;
  for (const auto& [id, record] : tasks_) ++out[record.state];
  return out;
}

nlohmann::json TaskTable::save() const {
  nlohmann::json tasks = nlohmann::json::array();
  for (const auto& [id, r] : tasks_) {
    tasks.push_back({{"task", r.task.to_json()}, {"state", to_string(r.state)}, {"holder", r.holder},
                     {"issued", r.issued}, {"end", {r.end.epoch, r.end.cursor}}});
  }
  return {{"next_id", next_id_}, {"tasks", tasks},
          {"totals", {totals_.issued, totals_.reissued, totals_.done}}};
}

void TaskTable::load(const nlohmann::json& saved) {
  try {
    std::map<int64_t, TaskRecord> tasks;
    for (const auto& t : saved.at("tasks")) {
      TaskRecord r;
      r.task = protocol::Task::from_json(t.at("task"));
      r.state = state_from(t.at("state").get<std::string>());
      r.holder = protocol::saved_integer(t.at("holder"));
      r.issued = protocol::saved_integer(t.at("issued"));
      r.end = {protocol::saved_position(t.at("end").at(0)), protocol::saved_position(t.at("end").at(1))};
      if (r.task.id >= protocol::saved_integer(saved.at("next_id")) || !tasks.emplace(r.task.id, r).second) {
        throw std::invalid_argument(fmt::format("task {} is out of order or repeated", r.task.id));
      }
    }
    tasks_ = std::move(tasks);
    next_id_ = protocol::saved_integer(saved.at("next_id"));
    const auto& totals = saved.at("totals");
    totals_ = {protocol::saved_integer(totals.at(0)), protocol::saved_integer(totals.at(1)), protocol::saved_integer(totals.at(2))};
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format("malformed task table: {}", e.what()));
  } catch (const protocol::ProtocolError& e) {
    throw std::invalid_argument(fmt::format("malformed task table: {}", e.what()));
  }
}

}  // namespace loco::runtime
