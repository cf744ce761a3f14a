// libFuzzer target: sce::LayoutStacker (docs/layout.md#table-layout) with arbitrary partition / SparseCore counts,
// table shapes and limits, and the split encoding (docs/preprocessing.md#split-encoding) round trip.
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/split_encoding.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  using sce_fuzz::Attr;
  if (in.ConsumeBool()) {
    const int level = static_cast<int>(Attr(in, 7));
    const int64_t bits = in.ConsumeIntegral<int64_t>();
    const std::vector<int32_t> points = sce::BinaryToBucketSplits(bits, level);
    if (level >= 1 && level <= sce::kMaxSplitLevel) {
      for (int32_t p : points) SCE_FUZZ_CHECK(p > 0 && p < (1 << level));
      const int num_bits = (1 << level) - 1;  // <= 63
      const int64_t mask = static_cast<int64_t>((uint64_t{1} << num_bits) - 1);
      SCE_FUZZ_CHECK(sce::BucketSplitsToBinary(points, level) == (bits & mask));
    }
    std::vector<int32_t> arbitrary = sce_fuzz::Ids(in, 8);
    (void)sce::BucketSplitsToBinary(arbitrary, level);
    return 0;
  }
  sce::StackerLimits limits;
  if (in.ConsumeBool()) {
    limits.activation_mem_bytes = Attr(in, 4096);
    limits.variable_shard_bytes = Attr(in, 1 << 20);
  }
  sce::LayoutStacker stacker(Attr(in, 4), Attr(in, 8), in.ConsumeBool(), limits);
  const int num_tables = in.ConsumeIntegralInRange<int>(0, 6);
  int added = 0;
  for (int i = 0; i < num_tables; ++i) {
    const std::string name = "t" + std::to_string(in.ConsumeIntegralInRange<int>(0, 4));
    const std::string group = in.ConsumeBool() ? "a" : "b";
    if (stacker.AddTable(name, Attr(in, 4096), Attr(in, 64), group, Attr(in, 64), Attr(in, 4))
            .ok()) {
      ++added;
    }
  }
  const std::vector<sce::TableLayout> layouts = stacker.GetLayouts();
  SCE_FUZZ_CHECK(static_cast<int>(layouts.size()) == added);
  for (const sce::TableLayout& t : layouts) {
    SCE_FUZZ_CHECK(t.padded_height >= t.height && t.padded_width >= t.width);
    SCE_FUZZ_CHECK(t.sparse_core_shard_rotation >= 0 &&
                   t.sparse_core_shard_rotation < t.num_sparse_cores);
  }
  return 0;
}
