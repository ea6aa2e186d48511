#include "loco/data/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>
#include <utility>

namespace loco::data::detail {
namespace {

bool is_white_space(utf8proc_int32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return true;
  if (cp == 0x180E || cp == 0x200B) return false;
  const utf8proc_category_t c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

// `text` without the white space at its end (`at_end`) or its start.
std::string trimmed(const std::string& text, bool at_end) {
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  const auto size = static_cast<utf8proc_ssize_t>(text.size());
  utf8proc_ssize_t first = -1, end = 0;  // the first character that is not white space, and the end of the last
  for (utf8proc_ssize_t i = 0; i < size;) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = std::max<utf8proc_ssize_t>(1, utf8proc_iterate(bytes + i, size - i, &cp));
    if (!is_white_space(cp)) {
      if (first < 0) first = i;
      end = i + n;
    }
    i += n;
  }
  if (first < 0) return {};
  return at_end ? text.substr(0, static_cast<size_t>(end)) : text.substr(static_cast<size_t>(first));
}

}  // namespace

void AddedTokens::add(AddedToken token) {
  if (token.content.empty()) return;
  by_first_byte[static_cast<unsigned char>(token.content[0])].push_back(tokens.size());
  tokens.push_back(std::move(token));
}

std::vector<Section> split_added(const std::string& text, const AddedTokens& added) {
  std::vector<Section> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* best = nullptr;
    for (size_t index : added.by_first_byte[static_cast<unsigned char>(text[i])]) {
      const AddedToken& t = added.tokens[index];
      if ((best == nullptr || t.content.size() > best->content.size()) && text.compare(i, t.content.size(), t.content) == 0) {
        best = &t;
      }
    }
    if (best == nullptr) {
      ++i;
      continue;
    }
    if (i > start) out.push_back({text.substr(start, i - start), nullptr});
    out.push_back({best->content, best});
    i += best->content.size();
    start = i;
  }
  if (start < text.size()) out.push_back({text.substr(start), nullptr});
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].token == nullptr) continue;
    if (out[i].token->lstrip && i > 0 && out[i - 1].token == nullptr) out[i - 1].text = trimmed(out[i - 1].text, true);
    if (out[i].token->rstrip && i + 1 < out.size() && out[i + 1].token == nullptr) {
      out[i + 1].text = trimmed(out[i + 1].text, false);
    }
  }
  return out;
}

}  // namespace loco::data::detail
