"""The on-disk format of a delta (docs/deltas.md), readable with numpy and json alone.

This module imports neither TensorFlow nor the rest of the package, so a consumer without
TensorFlow can load it by path (or copy its reading half). Layout of one delta:

    <stream>/delta-<sequence:08d>-<run>/
        part-<w:05d>-of-<n:05d>/manifest.json   what the part holds (below)
        part-<w:05d>-of-<n:05d>/chain.txt       "<this position> <previous position> <n>",
                                                then "<file> <bytes> <farmhash64>" per file
        part-<w:05d>-of-<n:05d>/<table>.<array>.npy
        part-<w:05d>-of-<n:05d>.done            written last: the manifest's sha256

Each worker writes the part of the shards it holds (n = workers) into a temporary directory,
renames it into place and then writes its done marker; a delta is complete once every part's
marker exists, so a reader never sees half a delta. A position is "<run>:<sequence>": `run`
names one stream of deltas (a build or a restore starts a new one), `sequence` counts its deltas
from 1; position "<run>:0" is the state a run started from. Every delta names the position it
applies to (`previous`), which is how chains are checked.

Arrays (.npy, never pickled objects):
* `ids` (fixed tables): the ascending logical row ids as unsigned LEB128 varints of their gaps
  (the first id, then each difference), uint8; `decode_ids` reads them;
* `values`: [count, dim] rows in the table's storage dtype (bfloat16 as its uint16 bits);
* `slot_<name>`: [count, width] float32 optimizer slots (with optimizer state only);
* dynamic tables: `keys` (int64 [count], or for string keys `keys` uint8 bytes with
  `key_offsets` int64 [count + 1]), `tombstones` (keys removed since the previous delta, same
  encoding with `tombstone_offsets`), and with optimizer state `last_seen` (int64), the waiting
  keys `pending_keys` (int64 keys or string fingerprints), `pending_counts` and
  `pending_last_seen` (int64) and the maps' `last_step`, written whole.
"""
import hashlib
import io
import json
import os
import re
import shutil
import time
import uuid

import numpy as np

FORMAT = "tf_sc_embedding.delta"
VERSION = 1
MANIFEST = "manifest.json"
CHAIN = "chain.txt"
_DELTA_NAME = re.compile(r"^delta-(\d{8})-([0-9a-f]{32})$")
_PART_NAME = re.compile(r"^part-(\d{5})-of-(\d{5})$")
# The storage dtypes of rows and how their bits are kept in .npy files.
ROW_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
# Largest sizes a manifest may claim (a corrupted count must not allocate without bound).
MAX_COUNT = 1 << 40
MAX_WIDTH = 1 << 20


class DeltaError(ValueError):
    """A delta that cannot be read or applied; the message names the file and the problem."""


# ----------------------------------------------------------------------------- positions
def new_run():
    return uuid.uuid4().hex


def position(run, sequence):
    return f"{run}:{int(sequence)}"


def parse_position(text, where):
    match = re.fullmatch(r"([0-9a-f]{32}):(\d+)", str(text))
    if not match:
        raise DeltaError(f"{where}: {text!r} is not a delta position (<run>:<sequence>)")
    return match.group(1), int(match.group(2))


def delta_name(run, sequence):
    return f"delta-{int(sequence):08d}-{run}"


def part_name(worker, workers):
    return f"part-{int(worker):05d}-of-{int(workers):05d}"


# ----------------------------------------------------------------------------- ids
def encode_ids(ids):
    """Ascending distinct non-negative ids -> uint8 LEB128 varints of their gaps."""
    ids = np.asarray(ids, np.int64)
    if len(ids) == 0:
        return np.zeros(0, np.uint8)
    gaps = np.diff(ids, prepend=0).astype(np.uint64)
    nbytes = np.ones(len(gaps), np.int64)
    for k in range(1, 10):
        nbytes += gaps >= (np.uint64(1) << np.uint64(7 * k))
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.zeros(int(ends[-1]), np.uint8)
    for k in range(int(nbytes.max())):
        has = nbytes > k
        byte = (gaps[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (nbytes[has] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[has] + k] = (byte | more).astype(np.uint8)
    return out


def decode_ids(data, count, where="ids"):
    """The inverse of encode_ids; raises DeltaError unless `data` holds exactly `count` varints
    of ascending ids below 2^62."""
    data = np.asarray(data, np.uint8).reshape(-1)
    ends = np.flatnonzero(data < 0x80)
    if len(ends) != count or (len(data) and ends[-1] != len(data) - 1):
        raise DeltaError(f"{where}: holds {len(ends)} complete ids, the manifest says {count}")
    if count == 0:
        return np.zeros(0, np.int64)
    starts = np.concatenate([[0], ends[:-1] + 1])
    lengths = ends - starts + 1
    if lengths.max() > 9:
        raise DeltaError(f"{where}: an id gap is longer than 9 bytes")
    gaps = np.zeros(count, np.uint64)
    for k in range(int(lengths.max())):
        has = lengths > k
        gaps[has] |= (data[starts[has] + k] & np.uint8(0x7F)).astype(np.uint64) << np.uint64(7 * k)
    if np.any(gaps[1:] == 0) or np.any(gaps >= np.uint64(1 << 62)):
        raise DeltaError(f"{where}: ids must be distinct, ascending and below 2^62")
    ids = np.cumsum(gaps, dtype=np.uint64)
    if ids[-1] >= np.uint64(1 << 62):
        raise DeltaError(f"{where}: ids must be below 2^62")
    return ids.astype(np.int64)


def encode_strings(keys):
    """(bytes uint8, offsets int64 [n + 1]) of a sequence of bytes."""
    keys = [bytes(k) for k in keys]
    offsets = np.zeros(len(keys) + 1, np.int64)
    np.cumsum([len(k) for k in keys], out=offsets[1:])
    return np.frombuffer(b"".join(keys), np.uint8).copy(), offsets


def decode_strings(data, offsets, count, where):
    offsets = np.asarray(offsets, np.int64)
    if (len(offsets) != count + 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0) or
            offsets[-1] != len(data)):
        raise DeltaError(f"{where}: the key offsets do not describe {count} keys")
    raw = np.asarray(data, np.uint8).tobytes()
    return np.array([raw[offsets[i]:offsets[i + 1]] for i in range(count)], object)


# ----------------------------------------------------------------------------- writing
def _npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def write_part(stream, run, sequence, worker, workers, manifest, arrays, fingerprint=None):
    """Writes one worker's part of delta (run, sequence) under directory `stream` atomically.

    manifest: the part's manifest without its "files" entry; arrays: {file name: numpy array}.
    fingerprint(bytes) -> str, if given, is recorded per file (the serving model checks files
    with TensorFlow's farmhash fingerprint op). Returns the delta's directory."""
    delta = os.path.join(stream, delta_name(run, sequence))
    os.makedirs(delta, exist_ok=True)
    name = part_name(worker, workers)
    final = os.path.join(delta, name)
    temporary = os.path.join(delta, f".{name}.tmp-{uuid.uuid4().hex}")
    os.makedirs(temporary)
    try:
        files = {}
        for file_name, array in arrays.items():
            data = _npy_bytes(array)
            with open(os.path.join(temporary, file_name), "wb") as f:
                f.write(data)
            files[file_name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            if fingerprint is not None:
                files[file_name]["farmhash64"] = fingerprint(data)
        manifest = dict(manifest, files=files)
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        with open(os.path.join(temporary, MANIFEST), "wb") as f:
            f.write(text)
        with open(os.path.join(temporary, CHAIN), "w") as f:   # for readers without JSON
            f.write(f"{manifest['position']} {manifest['previous']} {workers}\n")
            for file_name, entry in sorted(files.items()):
                f.write(f"{file_name} {entry['bytes']} {entry.get('farmhash64', '-')}\n")
        for path in os.listdir(temporary):
            with open(os.path.join(temporary, path), "rb") as f:
                os.fsync(f.fileno())
        if os.path.exists(final):
            raise DeltaError(f"{final}: exists already (a delta is written once)")
        os.rename(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    marker = os.path.join(delta, name + ".done")
    with open(marker + ".tmp", "w") as f:
        f.write(hashlib.sha256(text).hexdigest() + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(marker + ".tmp", marker)
    return delta


# ----------------------------------------------------------------------------- reading
def list_deltas(stream):
    """The complete deltas under `stream`, as (sequence, run, path), in the order written (by
    creation time, then sequence); incomplete ones (a part still being written) are left out."""
    found = []
    for entry in os.listdir(stream) if os.path.isdir(stream) else ():
        match = _DELTA_NAME.match(entry)
        path = os.path.join(stream, entry)
        if match and is_complete(path):
            found.append((os.path.getmtime(path), int(match.group(1)), match.group(2), path))
    return [(s, r, p) for _, s, r, p in sorted(found, key=lambda f: (f[0], f[1]))]


def _parts_expected(delta):
    names = [n for n in os.listdir(delta) if _PART_NAME.match(n.removesuffix(".done"))]
    totals = {int(_PART_NAME.match(n.removesuffix(".done")).group(2)) for n in names}
    return names, totals


def is_complete(delta):
    """Whether every part of a delta directory has its done marker."""
    try:
        names, totals = _parts_expected(delta)
    except OSError:
        return False
    if len(totals) != 1:
        return False
    workers = totals.pop()
    return all(part_name(w, workers) + ".done" in names for w in range(workers))


class Part:
    """One part of a delta, read and checked: its manifest and lazily loaded, checked arrays."""

    def __init__(self, delta, name):
        self.path = os.path.join(delta, name)
        manifest_path = os.path.join(self.path, MANIFEST)
        try:
            with open(manifest_path, "rb") as f:
                text = f.read()
            with open(self.path + ".done") as f:
                marker = f.read().strip()
        except OSError as e:
            raise DeltaError(f"{manifest_path}: cannot be read ({e})") from None
        if hashlib.sha256(text).hexdigest() != marker:
            raise DeltaError(f"{manifest_path}: does not match its done marker (corrupted or "
                             "rewritten)")
        try:
            self.manifest = json.loads(text)
        except ValueError as e:
            raise DeltaError(f"{manifest_path}: is not JSON ({e})") from None
        check_manifest(self.manifest, manifest_path)

    def array(self, file_name, dtype, shape):
        """A file of the part, checked against the manifest's size and sha256 and the expected
        dtype and shape (a leading -1 in `shape` takes any length)."""
        where = os.path.join(self.path, file_name)
        entry = self.manifest["files"].get(file_name)
        if entry is None:
            raise DeltaError(f"{where}: missing from the manifest")
        try:
            with open(where, "rb") as f:
                data = f.read(int(entry["bytes"]) + 1)
        except OSError as e:
            raise DeltaError(f"{where}: cannot be read ({e})") from None
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise DeltaError(f"{where}: truncated or corrupted ({len(data)} bytes, the manifest "
                             f"says {entry['bytes']} with another sha256)")
        try:
            value = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as e:
            raise DeltaError(f"{where}: not a .npy array ({e})") from None
        expected = tuple(len(value) if s == -1 else s for s in shape)
        if value.dtype != np.dtype(dtype) or value.shape != expected:
            raise DeltaError(f"{where}: holds {value.dtype} {value.shape}, expected "
                             f"{np.dtype(dtype)} {expected}")
        return value


def _require(condition, where, problem):
    if not condition:
        raise DeltaError(f"{where}: {problem}")


def check_manifest(m, where):
    """Raises DeltaError unless `m` is a well-formed manifest of this format's version."""
    _require(isinstance(m, dict) and m.get("format") == FORMAT, where, "not a delta manifest")
    _require(m.get("version") == VERSION, where,
             f"format version {m.get('version')!r}, this reader reads {VERSION}")
    for key, kind in (("run", str), ("sequence", int), ("previous", str), ("position", str),
                      ("step", int), ("part", int), ("parts", int), ("optimizer_state", bool),
                      ("tables", dict), ("files", dict), ("created", float)):
        _require(isinstance(m.get(key), kind) and not (kind is int and isinstance(m[key], bool)),
                 where, f"'{key}' is missing or not a {kind.__name__}")
    parse_position(m["previous"], where)
    _require(m["position"] == position(m["run"], m["sequence"]) and m["sequence"] >= 1, where,
             "'position' is not '<run>:<sequence>'")
    _require(0 <= m["part"] < m["parts"] <= 1 << 16, where, "'part' is not below 'parts'")
    _require(0 <= m["step"] < 1 << 62, where, "'step' is out of range")
    _require(m.get("base") is None or isinstance(m["base"], str), where, "'base' is not a string")
    _require(all(isinstance(f, dict) and _is_int(f.get("bytes")) and f["bytes"] >= 0 and
                 isinstance(f.get("sha256"), str) for f in m["files"].values()), where,
             "'files' must give each file's bytes and sha256")
    for name, t in m["tables"].items():
        at = f"{where}: table '{name}'"
        _require(isinstance(t, dict) and _one_of(t.get("kind"), ("fixed", "dynamic")), at,
                 "'kind' must be 'fixed' or 'dynamic'")
        counts = ("rows", "stored_rows", "dim", "count")
        if t["kind"] == "dynamic":
            counts += ("keys", "tombstones") + (("pending",) if m["optimizer_state"] else ())
            _require(_one_of(t.get("key_dtype"), ("int64", "string")), at,
                     "'key_dtype' is missing")
            _require(not m["optimizer_state"] or _is_int(t.get("last_step")), at,
                     "'last_step' is missing")
        for key in counts:
            _require(_is_int(t.get(key)) and 0 <= t[key] <= MAX_COUNT, at,
                     f"'{key}' is missing or out of range")
        _require(t["dim"] <= MAX_WIDTH and _one_of(t.get("dtype"), ROW_DTYPES), at,
                 "'dim' or 'dtype' is out of range")
        _require(isinstance(t.get("optimizer"), str), at, "'optimizer' is missing")
        _require(isinstance(t.get("slots"), dict) and
                 all(_is_int(w) and 0 < w <= MAX_WIDTH for w in t["slots"].values()), at,
                 "'slots' must map slot names to widths")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _one_of(value, choices):
    return isinstance(value, str) and value in choices


def read_delta(delta):
    """The parts of a complete delta directory (checked manifests, consistent with each other),
    in part order; raises DeltaError naming the file and the problem."""
    _require(os.path.isdir(delta), delta, "no such delta directory")
    _require(is_complete(delta), delta, "incomplete: a part or its done marker is missing")
    _, totals = _parts_expected(delta)
    workers = totals.pop()
    parts = [Part(delta, part_name(w, workers)) for w in range(workers)]
    first = parts[0].manifest
    for part in parts:
        m = part.manifest
        same = all(m[k] == first[k] for k in ("run", "sequence", "previous", "step",
                                               "optimizer_state")) and m["parts"] == workers
        _require(same and m["part"] == parts.index(part), part.path,
                 "disagrees with part 0 on the run, sequence, step or part count")
        _require(_shapes(m) == _shapes(first), part.path, "disagrees with part 0 on the tables")
    match = _DELTA_NAME.match(os.path.basename(os.path.normpath(delta)))
    _require(match and int(match.group(1)) == first["sequence"] and
             match.group(2) == first["run"], delta,
             "its name does not match its manifests' run and sequence")
    return parts


def _shapes(manifest):
    return {name: (t["kind"], t["rows"], t["stored_rows"], t["dim"], t["dtype"],
                   tuple(sorted(t["slots"].items())), t.get("key_dtype"))
            for name, t in manifest["tables"].items()}


def row_values(part, name, table, count):
    """A part's rows of a table as float32 (bfloat16 bits widened exactly)."""
    raw = part.array(f"{name}.values.npy", ROW_DTYPES[table["dtype"]], (count, table["dim"]))
    if table["dtype"] == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def now():
    return float(time.time())
