"""Where a training step's CPU goes, by phase, from a TensorFlow profiler trace.

`bench_multiworker.py --profile` traces worker 0's measured steps with `tf.profiler` and sums the
time of every op by kind into the phases of the exchange (BENCHMARKS.md, "Where a worker's CPU
goes"). Nested profiler events (the executor's and the function call's) are skipped, so the phases
add up to the CPU spent inside ops; what the process spends outside any op (TensorFlow's executor,
gRPC and its copies, idle threads) is the step's CPU minus that sum.

The trace is read with the XSpace protocol buffer that TensorFlow's wheel ships
(`tensorflow.tsl.profiler.protobuf.xplane_pb2`); no public API parses a trace.
"""
import collections
import glob
import os

# Phase -> the op types whose time it counts (ops of other types: "other ops").
PHASES = (
    ("preprocessing (stacked COO; one replica: COO to CSR, entries grouped for the lookup)",
     ("SceConvertFeaturesToStackedCooTensor", "SceConvertFeaturesToMinibatchSplits",
      "SceGetMinibatchesInCsrWithPhysicalReplica", "SceGetMinibatchSplitsWithPhysicalReplica",
      "RaggedTensorFromVariant", "SceGroupLookupEntries")),
    ("routing: unique ids by owner, with the partition statistics", ("SceRouteIdsToOwners",)),
    ("packing (rows straight from the variables), unpacking, owner CSR",
     ("ScePackReplicaChunks", "ScePackGatheredReplicaChunks", "SceUnpackReplicaChunks",
      "SceOwnerCsr")),
    ("gathers, pads, gradient interleave, activation split (where not fused)",
     ("GatherV2", "ConcatV2", "Pad", "SplitV", "Reshape", "StridedSlice")),
    ("collectives (launch and wait)", ("CollectiveAllToAllV2", "CollectiveGatherV2",
                                       "SceOnecclCollective", "SceOnecclRaggedAllToAll",
                                       "CollectiveReduceV2")),
    ("lookup: CSR kernel or segment sums (rows to activations, gradients to rows)",
     ("SceResourceSparseDenseMatmulWithCsrInput", "SceSparseDenseMatmulWithCsrInput",
      "SceResourceSparseDenseMatmulGrouped", "SceSparseDenseMatmulGrouped",
      "SceGatheredSegmentSum", "SceGatheredSegmentSumToFeatures",
      "SceGatheredSegmentSumFromFeatures")),
    ("fused update", ("SceResourceSparseDenseMatmulGradWithAdagradAndCsrInput",)),
    ("non-finite check", ("SceNonFiniteFlags", "SceRequireFiniteGradients")),
    ("benchmark's dense stand-in (mul, sum)", ("Mul", "Sum", "AddN")),
)
OTHER = "other ops"


def _op_times(trace_dir):
    """{op type: total ms} over the host planes of the newest trace under trace_dir."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=import-outside-toplevel
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))
    space = xplane_pb2.XSpace()
    with open(files[-1], "rb") as f:
        space.ParseFromString(f.read())
    times, counts = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                # Op events are "<op name>:<op type>"; runtime events ("ExecutorState::Process",
                # "EagerLocalExecute: <function>") enclose them and are skipped.
                if ":" in name and "::" not in name and ": " not in name:
                    times[name.rsplit(":", 1)[1]] += event.duration_ps / 1e9
                    counts[name.rsplit(":", 1)[1]] += 1
    return times, counts


def phase_breakdown(trace_dir, steps, cpu_ms_per_step):
    """[(phase, ms per step)]: the phases, other ops, and the CPU outside any op."""
    times, counts = _op_times(trace_dir)
    rows, counted = [], set()
    for phase, op_types in PHASES:
        rows.append((phase, sum(times[t] for t in op_types) / steps))
        counted.update(op_types)
    rows.append((OTHER, sum(ms for t, ms in times.items() if t not in counted) / steps))
    inside = sum(ms for _, ms in rows)
    rows.append(("outside any op: TensorFlow's executor, gRPC, threads", cpu_ms_per_step - inside))
    rows.append(("CPU per step of this worker", cpu_ms_per_step))
    if os.environ.get("SCE_PROFILE_OPS"):
        # Opt-in: every op type's own CPU per step, largest first (finer than the phases).
        rows.append((f"  ops run per step: {sum(counts.values()) / steps:.0f}", 0.0))
        for op_type, ms in times.most_common(int(os.environ["SCE_PROFILE_OPS"])):
            rows.append((f"  op {op_type} ({counts[op_type] / steps:.0f} per step)", ms / steps))
    return rows
