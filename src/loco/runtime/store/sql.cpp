// sql.h's rows: values arrive as text from both databases and are converted here, checked.
#include "loco/runtime/store/sql.h"

#include <fmt/format.h>

#include "loco/core/error.h"

namespace loco::runtime::sql {

const std::string& Rows::text(size_t row, size_t column) const {
  const auto& value = rows.at(row).at(column);
  if (!value) throw DataError("registry", fmt::format("row {} column {} is NULL", row, column));
  return *value;
}

int64_t Rows::integer(size_t row, size_t column) const {
  const auto& t = text(row, column);
  try {
    size_t used = 0;
    const int64_t value = std::stoll(t, &used);
    if (used == t.size()) return value;
  } catch (const std::exception&) {
  }
  throw DataError("registry", fmt::format("row {} column {} is '{}', not an integer", row, column, t.substr(0, 40)));
}

double Rows::real(size_t row, size_t column) const {
  const auto& t = text(row, column);
  try {
    size_t used = 0;
    const double value = std::stod(t, &used);
    if (used == t.size()) return value;
  } catch (const std::exception&) {
  }
  throw DataError("registry", fmt::format("row {} column {} is '{}', not a number", row, column, t.substr(0, 40)));
}

}  // namespace loco::runtime::sql
