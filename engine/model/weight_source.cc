#include "engine/model/weight_source.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace vamp {
namespace {

class SafetensorsSource : public WeightSource {
 public:
  absl::Status AddFile(const std::string& path) {
    VAMP_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    for (const TensorInfo& t : file->tensors()) {
      auto [it, inserted] = tensors_.emplace(t.name, &t);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' appears in both '",
                                                       FileOf(t.name), "' and '", path, "'"));
      }
      file_of_.emplace(t.name, path);
    }
    files_.push_back(std::move(file));
    return absl::OkStatus();
  }

  bool Has(const std::string& name) const override { return tensors_.count(name) > 0; }

  absl::Status Read(const std::string& name, absl::Span<const int64_t> shape,
                    absl::Span<const DimRange> ranges, float* out) override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      return absl::NotFoundError(absl::StrCat("checkpoint has no tensor '", name, "'"));
    }
    const TensorInfo& t = *it->second;
    if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in '", FileOf(name),
                                                     "' has shape ", ShapeString(t.shape),
                                                     ", expected ", ShapeString(shape)));
    }
    {
      absl::MutexLock lock(&mu_);
      read_.insert(name);
    }
    absl::Status s = ReadTensorSliceAsFloat(t, ranges, out);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(s.message(), " (in '", FileOf(name), "')"));
    }
    return absl::OkStatus();
  }

  std::vector<std::string> UnreadTensors() const override {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> unread;
    for (const auto& [name, info] : tensors_) {
      if (read_.count(name) == 0) unread.push_back(name);
    }
    return unread;
  }

 private:
  std::string FileOf(const std::string& name) const {
    auto it = file_of_.find(name);
    return it == file_of_.end() ? std::string() : it->second;
  }

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> tensors_;
  std::map<std::string, std::string> file_of_;
  mutable absl::Mutex mu_;
  std::set<std::string> read_ ABSL_GUARDED_BY(mu_);
};

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<std::vector<std::string>> FilesFromIndex(const std::string& dir,
                                                        const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  nlohmann::json root = nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("'", index_path, "' is not a JSON object"));
  }
  auto map = root.find("weight_map");
  if (map == root.end() || !map->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", index_path, "': field 'weight_map' is missing or not an object"));
  }
  std::set<std::string> files;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", index_path, "': weight_map entry '", it.key(), "' is not a file name"));
    }
    const std::string file = it.value().get<std::string>();
    // File names only: the index may not point outside the checkpoint directory.
    if (file.empty() || absl::StrContains(file, "/") || file == "." || file == "..") {
      return absl::InvalidArgumentError(absl::StrCat("'", index_path, "': weight_map entry '",
                                                     it.key(), "' names a bad file '", file, "'"));
    }
    files.insert(file);
  }
  std::vector<std::string> paths;
  for (const std::string& f : files) paths.push_back(dir + "/" + f);
  return paths;
}

// Dummy slices of at least this many elements per thread are filled in parallel, by at most
// kMaxFillThreads threads.
constexpr int64_t kElementsPerFillThread = int64_t{1} << 18;
constexpr size_t kMaxFillThreads = 16;

// splitmix64 finaliser: the counter-based generator of the dummy weights.
inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class DummySource : public WeightSource {
 public:
  explicit DummySource(uint64_t seed) : seed_(seed) {}

  bool Has(const std::string& name) const override { return true; }

  absl::Status Read(const std::string& name, absl::Span<const int64_t> shape,
                    absl::Span<const DimRange> ranges, float* out) override {
    if (ranges.size() != shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': slice rank mismatch"));
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      if (ranges[d].begin < 0 || ranges[d].begin > ranges[d].end || ranges[d].end > shape[d]) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "': slice outside ", ShapeString(shape)));
      }
      if (ranges[d].begin == ranges[d].end) return absl::OkStatus();
    }
    const bool is_norm = absl::EndsWith(name, "norm.weight");
    const float bound =
        shape.empty() ? 1.0f
                      : 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(1, shape.back())));
    uint64_t name_hash = seed_;
    for (unsigned char c : name) name_hash = Mix(name_hash ^ c);
    const size_t rank = shape.size();
    std::vector<int64_t> stride(rank, 1);
    for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
    // The slice as runs of contiguous elements (the last dimension's range): each run's flat
    // index in the tensor and its offset in `out`.
    const int64_t run = rank == 0 ? 1 : ranges[rank - 1].end - ranges[rank - 1].begin;
    std::vector<int64_t> run_flat;
    std::vector<int64_t> index(rank);
    for (size_t d = 0; d < rank; ++d) index[d] = ranges[d].begin;
    for (bool more = true; more;) {
      int64_t flat = 0;
      for (size_t d = 0; d < rank; ++d) flat += index[d] * stride[d];
      run_flat.push_back(flat);
      more = false;
      for (size_t d = rank - 1; rank > 1 && d-- > 0;) {
        if (++index[d] < ranges[d].end) {
          more = true;
          break;
        }
        index[d] = ranges[d].begin;
      }
    }
    // Element values depend only on (seed, name, flat index), so the runs can be filled in any
    // order: large slices (a 30B-parameter dummy model has ~30 G elements) use several threads.
    auto fill = [&](size_t first, size_t last) {
      for (size_t r = first; r < last; ++r) {
        float* o = out + static_cast<int64_t>(r) * run;
        for (int64_t i = 0; i < run; ++i) {
          if (is_norm) {
            o[i] = 1.0f;
          } else {
            const uint64_t bits = Mix(name_hash ^ static_cast<uint64_t>(run_flat[r] + i));
            const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
            o[i] = (2.0f * u - 1.0f) * bound;
          }
        }
      }
    };
    const int64_t elements = static_cast<int64_t>(run_flat.size()) * run;
    const size_t threads = std::min<size_t>(
        {std::max(1u, std::thread::hardware_concurrency()), kMaxFillThreads, run_flat.size(),
         static_cast<size_t>(elements / kElementsPerFillThread) + 1});
    if (threads <= 1) {
      fill(0, run_flat.size());
      return absl::OkStatus();
    }
    std::vector<std::thread> workers;
    const size_t per = (run_flat.size() + threads - 1) / threads;
    for (size_t t = 0; t < threads; ++t) {
      const size_t first = t * per, last = std::min(run_flat.size(), first + per);
      if (first < last) workers.emplace_back(fill, first, last);
    }
    for (std::thread& w : workers) w.join();
    return absl::OkStatus();
  }

  std::vector<std::string> UnreadTensors() const override { return {}; }

 private:
  uint64_t seed_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<WeightSource>> OpenSafetensorsCheckpoint(const std::string& dir) {
  std::vector<std::string> paths;
  if (!IsDirectory(dir)) {
    paths.push_back(dir);
  } else {
    const std::string index = dir + "/model.safetensors.index.json";
    struct stat st;
    if (::stat(index.c_str(), &st) == 0) {
      VAMP_ASSIGN_OR_RETURN(paths, FilesFromIndex(dir, index));
    } else {
      DIR* d = ::opendir(dir.c_str());
      if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot list '", dir, "'"));
      while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (absl::EndsWith(name, ".safetensors")) paths.push_back(dir + "/" + name);
      }
      ::closedir(d);
      std::sort(paths.begin(), paths.end());
    }
    if (paths.empty()) {
      return absl::NotFoundError(absl::StrCat("no *.safetensors files in '", dir, "'"));
    }
  }
  auto source = std::make_unique<SafetensorsSource>();
  for (const std::string& p : paths) VAMP_RETURN_IF_ERROR(source->AddFile(p));
  return source;
}

std::unique_ptr<WeightSource> CreateDummyWeightSource(uint64_t seed) {
  return std::make_unique<DummySource>(seed);
}

}  // namespace vamp
