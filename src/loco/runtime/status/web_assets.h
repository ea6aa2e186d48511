// The files of the coordinator's status page and of `loco report`'s HTML, compiled into the binary
// (cmake/web_assets.cmake): the page itself, its script and style, and uPlot, the charting library.
// Nothing is loaded from the internet.
#pragma once

#include <string_view>
#include <vector>

namespace loco::runtime {

struct WebAsset {
  std::string_view path;          // the URL path it is served under, e.g. "/assets/uPlot.min.js"
  std::string_view content_type;
  std::string_view content;
};

// The asset served at `path`, or nullptr.
const WebAsset* find_web_asset(std::string_view path);
std::vector<const WebAsset*> web_assets();

}  // namespace loco::runtime
