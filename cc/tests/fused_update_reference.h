// Test helpers shared by the core unit tests (cc/tests/core_test.cc) and the fused-update fuzz
// target (fuzz/fuzz_fused_update.cc): a random CSR of the shape the lookup and update kernels
// read, a table with slots to compare bit for bit, and the fused update written the obvious way.
// The reference is the oracle for sce::FusedUpdate; it lives here so both checks use the same one.
#ifndef SCE_CC_TESTS_FUSED_UPDATE_REFERENCE_H_
#define SCE_CC_TESTS_FUSED_UPDATE_REFERENCE_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cc/core/constants.h"
#include "cc/core/csr_view.h"
#include "cc/core/fused_update.h"

namespace sce_testing {

// Points a CsrView at CSR buffers owned by the caller (row pointers, and the equally long sample
// ids, token ids and gains); the view's other fields are the caller's.
inline void BindCsrBuffers(const std::vector<int32_t>& row_pointers,
                           const std::vector<int32_t>& samples,
                           const std::vector<int32_t>& tokens, const std::vector<float>& gains,
                           sce::CsrView* view) {
  view->row_pointers = row_pointers.data();
  view->num_row_pointers = static_cast<int64_t>(row_pointers.size());
  view->sample_ids = samples.data();
  view->token_ids = tokens.data();
  view->gains = gains.data();
  view->num_sample_ids = view->num_token_ids = view->num_gains =
      static_cast<int64_t>(tokens.size());
}

// A CSR over G source replicas x S SparseCores x M minibatches x S shards (one replica owns all
// shards) with random sorted tokens per segment (duplicates inside and across segments).
struct RandomCsr {
  std::vector<int32_t> row_pointers, samples, tokens;
  std::vector<float> gains;
  sce::CsrView view;
  // Segments hold 0 to max_entries entries (before padding).
  RandomCsr(uint32_t seed, int64_t G, int64_t S, int64_t M, int64_t R, int64_t samples_per_sc,
            bool sorted_segments = true, uint32_t max_entries = 11) {
    uint32_t state = seed * 2654435761u + 1;
    auto next = [&state](uint32_t n) {
      state = state * 1664525u + 1013904223u;
      return (state >> 8) % n;
    };
    const int64_t block = sce::RoundUp(S, 8);
    // Each source replica's buffers are built alone, then padded to the longest (equal chunks).
    std::vector<std::vector<int32_t>> chunk_tokens(G), chunk_samples(G);
    std::vector<std::vector<float>> chunk_gains(G);
    size_t longest = 0;
    for (int64_t g = 0; g < G; ++g) {
      std::vector<int32_t>& t = chunk_tokens[g];
      std::vector<int32_t>& sm = chunk_samples[g];
      std::vector<float>& gn = chunk_gains[g];
      for (int64_t s = 0; s < S; ++s) {
        for (int64_t b = 0; b < M; ++b) {
          for (int64_t p = 0; p < block; ++p) {
            if (p < S) {
              const int64_t count = next(max_entries + 1);
              std::vector<int32_t> segment;
              for (int64_t i = 0; i < count; ++i) segment.push_back(next(R));
              if (sorted_segments) std::sort(segment.begin(), segment.end());
              for (int32_t token : segment) {
                t.push_back(token);
                sm.push_back(static_cast<int32_t>(next(samples_per_sc)));
                gn.push_back(0.25f + 0.125f * static_cast<float>(next(9)));
              }
              while (t.size() % 8) {
                t.push_back(sce::kPad);
                sm.push_back(sce::kPad);
                gn.push_back(static_cast<float>(sce::kPad));
              }
            }
            row_pointers.push_back(static_cast<int32_t>(t.size()));
          }
        }
      }
      longest = std::max(longest, t.size());
    }
    for (int64_t g = 0; g < G; ++g) {
      chunk_tokens[g].resize(longest, sce::kPad);
      chunk_samples[g].resize(longest, sce::kPad);
      chunk_gains[g].resize(longest, static_cast<float>(sce::kPad));
      tokens.insert(tokens.end(), chunk_tokens[g].begin(), chunk_tokens[g].end());
      samples.insert(samples.end(), chunk_samples[g].begin(), chunk_samples[g].end());
      gains.insert(gains.end(), chunk_gains[g].begin(), chunk_gains[g].end());
    }
    BindCsrBuffers(row_pointers, samples, tokens, gains, &view);
    view.num_minibatches = M;
    view.num_sc_per_device = S;
    view.num_source_replicas = G;
    view.input_size = G * S * samples_per_sc;
    view.table_rows = S * R;
    view.table_name = "t";
  }
};

// A table and its slots with the values every fused-update comparison starts from; compared bit
// for bit. Not copyable: slot_pointers point into slots.
template <typename Optimizer>
struct TableAndSlots {
  std::vector<float> table;
  std::vector<std::vector<float>> slots;
  std::array<float*, Optimizer::kSlots.size()> slot_pointers;
  TableAndSlots(int64_t rows, int64_t dim) : table(rows * dim) {
    for (size_t i = 0; i < table.size(); ++i) table[i] = std::cos(0.11f * i);
    for (size_t k = 0; k < slot_pointers.size(); ++k) {
      slots.emplace_back(rows * sce::SlotRowWidth(Optimizer::kSlotShapes[k], dim), 0.1f);
    }
    for (size_t k = 0; k < slot_pointers.size(); ++k) slot_pointers[k] = slots[k].data();
  }
  TableAndSlots(const TableAndSlots&) = delete;
  TableAndSlots& operator=(const TableAndSlots&) = delete;
  bool SameBits(const TableAndSlots& other) const {
    bool same = std::memcmp(table.data(), other.table.data(), table.size() * 4) == 0;
    for (size_t k = 0; k < slots.size(); ++k) {
      same = same && std::memcmp(slots[k].data(), other.slots[k].data(), slots[k].size() * 4) == 0;
    }
    return same;
  }
};

// The fused update written the obvious way: every shard's contributions stable-sorted by token
// (std::stable_sort), summed row by row from zero in that order, then one optimizer step per row;
// rows with a flagged activation row or a non-finite gain are skipped when `bad` is given.
template <typename Optimizer>
int64_t ReferenceFusedUpdate(const sce::CsrView& view, const float* grads, int64_t dim,
                             float lr, const float* hypers, float* table,
                             const std::vector<float*>& slots, const uint8_t* bad,
                             const sce::Clip& clip = sce::Clip()) {
  int64_t skipped = 0;
  for (int64_t p = 0; p < view.local_shards(); ++p) {
    std::vector<sce::RowContribution> entries;
    for (int64_t sc = 0; sc < view.num_source_sparse_cores(); ++sc) {
      for (int64_t b = 0; b < view.num_minibatches; ++b) {
        int64_t begin, end;
        view.Segment(sc, b, view.first_local_shard + p, &begin, &end);
        for (int64_t i = begin; i < end; ++i) {
          if (view.token_ids[i] == sce::kPad || view.sample_ids[i] == sce::kPad) continue;
          entries.push_back({view.token_ids[i],
                             static_cast<int32_t>(sc * view.samples_per_sc() + view.sample_ids[i]),
                             view.gains[i]});
        }
      }
    }
    std::stable_sort(entries.begin(), entries.end(),
                     [](const sce::RowContribution& a, const sce::RowContribution& b) {
                       return a.token < b.token;
                     });
    for (size_t i = 0; i < entries.size();) {
      const int32_t token = entries[i].token;
      std::vector<float> sum(dim, 0.0f);
      bool skip = false;
      for (; i < entries.size() && entries[i].token == token; ++i) {
        const sce::RowContribution& e = entries[i];
        if (bad != nullptr && (bad[e.activation] || !std::isfinite(e.gain))) skip = true;
        if (skip) continue;
        for (int64_t j = 0; j < dim; ++j) sum[j] += e.gain * grads[e.activation * dim + j];
      }
      if (skip) {
        ++skipped;
        continue;
      }
      const int64_t row = p * view.rows_per_shard() + token;
      std::vector<float*> slot_rows;
      for (size_t k = 0; k < slots.size(); ++k) {
        slot_rows.push_back(slots[k] + row * sce::SlotRowWidth(Optimizer::kSlotShapes[k], dim));
      }
      slot_rows.push_back(nullptr);
      Optimizer::Apply(hypers, lr, sum.data(), table + row * dim, slot_rows.data(), dim, clip);
    }
  }
  return skipped;
}

}  // namespace sce_testing

#endif  // SCE_CC_TESTS_FUSED_UPDATE_REFERENCE_H_
