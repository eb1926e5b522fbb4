#include "bench/chart/paper_reference.h"

namespace vamp::chart {

std::vector<PaperPoint> PaperFigure9H100() {
  return {
      {"static", 16, 22.1, "22.1 ± 0.6 s, already beyond its boundary"},
      {"vamp-15", 24, 54.7, "54.7 ± 2.1 s, crossed its boundary"},
      {"vamp-20", 28, 63.5, "63.5 ± 2.1 s, crossed its boundary"},
      {"vamp-25", 16, -1, "3.0–3.9 s through c = 28"},
      {"vamp-25", 20, -1, "3.0–3.9 s"},
      {"vamp-25", 24, -1, "3.0–3.9 s"},
      {"vamp-25", 28, -1, "3.0–3.9 s"},
  };
}

}  // namespace vamp::chart
