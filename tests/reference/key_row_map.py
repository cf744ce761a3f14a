"""Pure-Python reference of the key-to-row map's logical semantics (docs/dynamic_vocabulary.md):
which occurrences read a row, which keys are admitted in which order, refusals, and the exported
state. Physical rows are not modelled (they are internal); tests check them with invariants."""
import numpy as np


class ReferenceKeyRowMap:
    def __init__(self, capacity, admission_threshold=1, steps_to_live=0, pending_capacity=None):
        self.capacity = capacity
        self.threshold = admission_threshold
        self.ttl = steps_to_live
        self.pending_capacity = capacity if pending_capacity is None else pending_capacity
        self.held = {}      # key -> last seen step
        self.pending = {}   # key -> [count, last seen step]; insertion order is irrelevant
        self.last_step = -1

    def _expired(self, last_seen, step):
        return self.ttl > 0 and step - last_seen > self.ttl

    def _live(self, step):
        return sum(not self._expired(s, step) for s in self.held.values())

    def map_step(self, keys, step):
        """(has_row [n] bool, admitted keys in order, stats dict)."""
        self.last_step = step
        stats = dict(admitted_keys=0, refused_keys=0, unadmitted_ids=0, untracked_ids=0)
        has_row = np.zeros(len(keys), bool)
        admitted, deferred, refused, cleaned = [], [], set(), False
        for i, key in enumerate(int(k) for k in keys):
            if key in self.held:
                if not self._expired(self.held[key], step):
                    self.held[key] = step
                    has_row[i] = True
                    continue
                del self.held[key]
            admit, is_deferred = self.threshold == 1, False
            if not admit:
                if key not in self.pending:
                    if len(self.pending) >= self.pending_capacity:
                        if not cleaned:
                            cleaned = True
                            self.pending = {k: v for k, v in self.pending.items()
                                            if v[1] == step}
                        if len(self.pending) >= self.pending_capacity:
                            stats["untracked_ids"] += 1
                            stats["unadmitted_ids"] += 1
                            continue
                    self.pending[key] = [0, step]
                entry = self.pending[key]
                if self._expired(entry[1], step):
                    entry[0] = 0
                entry[1] = step
                entry[0] = min(entry[0] + 1, self.threshold)
                admit = entry[0] >= self.threshold
                is_deferred = not admit
            if admit:
                if self._live(step) < self.capacity:
                    self.held[key] = step
                    self.pending.pop(key, None)
                    admitted.append(key)
                    stats["admitted_keys"] += 1
                    has_row[i] = True
                    continue
                refused.add(key)
            if is_deferred:
                deferred.append(i)
            else:
                stats["unadmitted_ids"] += 1
        for i in deferred:
            has_row[i] = int(keys[i]) in self.held
            stats["unadmitted_ids"] += not has_row[i]
        stats["refused_keys"] = len(refused)
        return has_row, admitted, stats

    def export(self):
        """(last_step, keys, last_seen, pending_keys, pending_counts, pending_last_seen)."""
        held = sorted((k, s) for k, s in self.held.items()
                      if not self._expired(s, self.last_step))
        pending = sorted((k, c, s) for k, (c, s) in self.pending.items())
        return (self.last_step, [k for k, _ in held], [s for _, s in held],
                [k for k, _, _ in pending], [c for _, c, _ in pending],
                [s for _, _, s in pending])
