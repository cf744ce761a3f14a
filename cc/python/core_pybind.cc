// Python bindings (pybind11) for the TensorFlow-free pieces Python needs at construction time:
// the table layout stacker and the optimizer definitions that slot creation is derived from.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/layout.h"
#include "cc/core/optimizers.h"
#include "cc/core/split_encoding.h"

namespace py = pybind11;

namespace {

void ThrowIfError(const sce::Status& status) {
  if (!status.ok()) throw py::value_error(status.message());
}

struct DescribeOptimizers {
  py::list* out;
  template <typename Optimizer>
  void operator()() const {
    py::dict d;
    d["name"] = Optimizer::kName;
    d["op_name"] = Optimizer::kOpName;
    py::list slots;
    for (const char* slot : Optimizer::kSlots) slots.append(slot);
    d["slots"] = slots;
    py::list row_wise;
    for (sce::SlotShape shape : Optimizer::kSlotShapes) {
      row_wise.append(shape == sce::SlotShape::kRowWise);
    }
    d["row_wise_slots"] = row_wise;
    py::list hypers;
    for (const sce::HyperSpec& h : Optimizer::kHypers) {
      hypers.append(py::make_tuple(h.name, h.type == sce::HyperType::kBool       ? "bool"
                                           : h.type == sce::HyperType::kRowWidth ? "row_width"
                                                                                 : "float"));
    }
    d["hyperparameters"] = hypers;
    out->append(d);
  }
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "TensorFlow-free algorithms of tf_sc_embedding (layout stacking, definitions).";

  py::class_<sce::TableLayout>(m, "TableLayout")
      .def_readonly("table_name", &sce::TableLayout::table_name)
      .def_readonly("stacked_table_name", &sce::TableLayout::stacked_table_name)
      .def_readonly("num_sparse_cores", &sce::TableLayout::num_sparse_cores)
      .def_readonly("num_partitions", &sce::TableLayout::num_partitions)
      .def_readonly("height", &sce::TableLayout::height)
      .def_readonly("width", &sce::TableLayout::width)
      .def_readonly("padded_height", &sce::TableLayout::padded_height)
      .def_readonly("padded_width", &sce::TableLayout::padded_width)
      .def_readonly("sparse_core_shard_row_offset", &sce::TableLayout::sparse_core_shard_row_offset)
      .def_readonly("sparse_core_shard_rotation", &sce::TableLayout::sparse_core_shard_rotation)
      .def_readonly("total_rows_per_sparse_core_shard",
                    &sce::TableLayout::total_rows_per_sparse_core_shard)
      .def_readonly("per_sparse_core_batch_size", &sce::TableLayout::per_sparse_core_batch_size)
      .def_readonly("num_features", &sce::TableLayout::num_features)
      .def("__repr__", [](const sce::TableLayout& t) {
        return "TableLayout(table_name='" + t.table_name + "', stacked_table_name='" +
               t.stacked_table_name + "', padded_shape=[" + std::to_string(t.padded_height) +
               ", " + std::to_string(t.padded_width) + "], row_offset=" +
               std::to_string(t.sparse_core_shard_row_offset) +
               ", rotation=" + std::to_string(t.sparse_core_shard_rotation) + ")";
      });

  py::class_<sce::LayoutStacker>(m, "LayoutStacker")
      .def(py::init([](int64_t num_partitions, int64_t sparse_cores_per_partition,
                       bool disable_table_stacking, int64_t activation_mem_bytes_limit,
                       int64_t variable_shard_bytes_limit) {
             sce::StackerLimits limits;
             limits.activation_mem_bytes = activation_mem_bytes_limit;
             limits.variable_shard_bytes = variable_shard_bytes_limit;
             return sce::LayoutStacker(num_partitions, sparse_cores_per_partition,
                                       disable_table_stacking, limits);
           }),
           py::arg("num_partitions"), py::arg("sparse_cores_per_partition"),
           py::arg("disable_table_stacking") = false,
           py::arg("activation_mem_bytes_limit") = sce::StackerLimits().activation_mem_bytes,
           py::arg("variable_shard_bytes_limit") = sce::StackerLimits().variable_shard_bytes)
      .def(
          "add_table",
          [](sce::LayoutStacker& self, const std::string& name, int64_t height, int64_t width,
             const std::string& group, int64_t output_samples, int64_t num_features) {
            ThrowIfError(self.AddTable(name, height, width, group, output_samples, num_features));
          },
          py::arg("name"), py::arg("height"), py::arg("width"), py::arg("group"),
          py::arg("output_samples"), py::arg("num_features") = 1)
      .def("get_layouts", &sce::LayoutStacker::GetLayouts);

  m.def(
      "slot_row_width",
      [](bool row_wise, int64_t width) {
        return sce::SlotRowWidth(row_wise ? sce::SlotShape::kRowWise : sce::SlotShape::kElementWise,
                                 width);
      },
      py::arg("row_wise"), py::arg("width"));
  m.def("optimizer_definitions", [] {
    py::list out;
    sce::ForEachOptimizer(DescribeOptimizers{&out});
    return out;
  });
  auto check_level = [](int level) {
    if (level < 0 || level > sce::kMaxSplitLevel) {
      throw py::value_error("max_division_level must be in [0, " +
                            std::to_string(sce::kMaxSplitLevel) + "], got " +
                            std::to_string(level));
    }
  };
  m.def(
      "binary_to_bucket_splits",
      [check_level](int64_t bits, int level) {
        check_level(level);
        return sce::BinaryToBucketSplits(bits, level);
      },
      py::arg("bits"), py::arg("max_division_level") = sce::kDefaultMaxDivisionLevel);
  m.def(
      "bucket_splits_to_binary",
      [check_level](const std::vector<int32_t>& splits, int level) {
        check_level(level);
        for (int32_t point : splits) {
          if (point <= 0 || point >= (int32_t{1} << level)) {
            throw py::value_error("split point " + std::to_string(point) + " is not in (0, 2^" +
                                  std::to_string(level) + ")");
          }
        }
        return sce::BucketSplitsToBinary(splits, level);
      },
      py::arg("splits"), py::arg("max_division_level") = sce::kDefaultMaxDivisionLevel);
  // Bounds every op checks its attributes against (cc/core/checked_math.h).
  m.attr("MAX_SPARSE_CORES_PER_CHIP") = sce::kMaxSparseCoresPerChip;
  m.attr("MAX_REPLICAS") = sce::kMaxReplicas;
  m.attr("MAX_SHARDS") = sce::kMaxShards;
  m.attr("MAX_ALLOCATION_ELEMENTS") = sce::kMaxAllocationElements;
  // Defaults every layer shares (cc/core/constants.h is their one home).
  m.attr("DEFAULT_SPARSE_CORES_PER_REPLICA") = sce::kDefaultSparseCoresPerReplica;
  m.attr("DEFAULT_MAX_DIVISION_LEVEL") = sce::kDefaultMaxDivisionLevel;
  m.attr("MAX_DIVISION_LEVEL") = sce::kMaxSplitLevel;
}
