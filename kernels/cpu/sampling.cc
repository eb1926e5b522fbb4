#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace vamp::kernels::cpu {
namespace {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int32_t ArgMax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

// A row's largest value and log(sum_i exp(x[i] - max)) (in double): log_softmax(x)[i] is
// (x[i] - max_value) - log_sum.
struct RowNormaliser {
  float max_value;
  double log_sum;
};

RowNormaliser Normaliser(const float* x, int64_t n) {
  float max_value = x[0];
  for (int64_t i = 1; i < n; ++i) max_value = std::fmax(max_value, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - max_value));
  return {max_value, std::log(sum)};
}

float LogSoftmaxAt(const float* x, const RowNormaliser& norm, int64_t index) {
  return static_cast<float>(static_cast<double>(x[index] - norm.max_value) - norm.log_sum);
}

float LogSoftmaxAt(const float* x, int64_t n, int64_t index) {
  return LogSoftmaxAt(x, Normaliser(x, n), index);
}

}  // namespace

float UniformFromCounter(uint64_t seed, uint64_t draw_index) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ draw_index);
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

void SampleTokens(const float* logits, int64_t logits_stride, int64_t num_rows, int64_t vocab,
                  const float* temperatures, const int32_t* top_ks, const float* top_ps,
                  const uint64_t* seeds, const int64_t* draw_indices, int32_t* index_workspace,
                  float* value_workspace, int32_t* out_tokens, float* out_logprobs) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* row = logits + r * logits_stride;
    int32_t token;
    if (!(temperatures[r] > 0.0f)) {
      token = ArgMax(row, vocab);
    } else {
      int32_t* idx = index_workspace + r * vocab;
      float* prob = value_workspace + r * vocab;
      const float inv_t = 1.0f / temperatures[r];
      for (int64_t i = 0; i < vocab; ++i) idx[i] = static_cast<int32_t>(i);
      const int64_t k = (top_ks[r] > 0 && top_ks[r] < vocab) ? top_ks[r] : vocab;
      const bool need_order = k < vocab || top_ps[r] < 1.0f;
      if (need_order) {
        std::partial_sort(idx, idx + k, idx + vocab, [row](int32_t a, int32_t b) {
          return row[a] > row[b] || (row[a] == row[b] && a < b);
        });
      }
      // Softmax over the k candidates (idx[0] is the largest when ordered).
      float max_value = row[idx[0]];
      if (!need_order) {
        for (int64_t i = 1; i < k; ++i) max_value = std::fmax(max_value, row[i]);
      }
      double total = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        prob[i] = std::exp((row[idx[i]] - max_value) * inv_t);
        total += prob[i];
      }
      int64_t kept = k;
      if (top_ps[r] < 1.0f) {
        const double target = static_cast<double>(top_ps[r]) * total;
        double cumulative = 0.0;
        for (kept = 0; kept < k;) {
          cumulative += prob[kept++];
          if (cumulative >= target) break;
        }
        total = cumulative;
      }
      const double u = static_cast<double>(UniformFromCounter(seeds[r], draw_indices[r])) * total;
      double cumulative = 0.0;
      token = idx[kept - 1];  // rounding can leave u at the very top: the last kept token
      for (int64_t i = 0; i < kept; ++i) {
        cumulative += prob[i];
        if (cumulative > u) {
          token = idx[i];
          break;
        }
      }
    }
    out_tokens[r] = token;
    if (out_logprobs != nullptr) out_logprobs[r] = LogSoftmaxAt(row, vocab, token);
  }
}

void TopLogprobs(const float* logits, int64_t logits_stride, int64_t num_rows, int64_t vocab,
                 const int32_t* top_counts, int32_t max_k, int32_t* out_ids, float* out_logprobs,
                 const int32_t* tokens, float* out_token_logprobs) {
  std::vector<int32_t> top;
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* row = logits + r * logits_stride;
    const int64_t k = max_k > 0 ? top_counts[r] : 0;
    if (max_k > 0) {
      std::fill(out_ids + r * max_k, out_ids + (r + 1) * max_k, -1);
      std::fill(out_logprobs + r * max_k, out_logprobs + (r + 1) * max_k, 0.0f);
    }
    if (k <= 0 && tokens == nullptr) continue;
    const RowNormaliser norm = Normaliser(row, vocab);
    if (tokens != nullptr) out_token_logprobs[r] = LogSoftmaxAt(row, norm, tokens[r]);
    if (k <= 0) continue;
    // Keep the k best seen so far, in (logit descending, id ascending) order: a later id enters
    // only with a strictly larger logit than the current k-th.
    top.clear();
    for (int64_t i = 0; i < vocab; ++i) {
      if (static_cast<int64_t>(top.size()) == k && !(row[i] > row[top.back()])) continue;
      auto at = std::upper_bound(top.begin(), top.end(), static_cast<int32_t>(i),
                                 [row](int32_t a, int32_t b) { return row[a] > row[b]; });
      top.insert(at, static_cast<int32_t>(i));
      if (static_cast<int64_t>(top.size()) > k) top.pop_back();
    }
    for (int64_t j = 0; j < k; ++j) {
      out_ids[r * max_k + j] = top[j];
      out_logprobs[r * max_k + j] = LogSoftmaxAt(row, norm, top[j]);
    }
  }
}

void ProcessLogits(float* logits, int64_t logits_stride, int64_t num_rows, int64_t vocab,
                   const LogitsProcessing& p) {
  for (int64_t r = 0; r < num_rows; ++r) {
    float* row = logits + r * logits_stride;
    const float repetition = p.repetition_penalties[r];
    const float frequency = p.frequency_penalties[r];
    const float presence = p.presence_penalties[r];
    for (int32_t e = p.entry_offsets[r]; e < p.entry_offsets[r + 1]; ++e) {
      float& l = row[p.entry_tokens[e]];
      const int32_t count = p.entry_counts[e];
      if (p.entry_flags[e] & kLogitBanned) {
        l = -INFINITY;
        continue;
      }
      if ((p.entry_flags[e] & kLogitInPrompt) || count > 0) {
        l = l > 0.0f ? l / repetition : l * repetition;
      }
      l -= frequency * static_cast<float>(count) + presence * (count > 0 ? 1.0f : 0.0f);
    }
    const float min_p = p.min_ps[r];
    if (!(min_p > 0.0f && p.temperatures[r] > 0.0f)) continue;
    const float inv_t = 1.0f / p.temperatures[r];
    float max_value = row[0];
    for (int64_t i = 1; i < vocab; ++i) max_value = std::fmax(max_value, row[i]);
    for (int64_t i = 0; i < vocab; ++i) {
      if (std::exp((row[i] - max_value) * inv_t) < min_p) row[i] = -INFINITY;
    }
  }
}

}  // namespace vamp::kernels::cpu
