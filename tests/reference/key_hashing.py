"""Pure-numpy reference of the key hashes of open vocabularies (cc/core/key_row_map.cc): the owner
shard of a key and the numbers in (0, 1) a new row's initial values are drawn from."""
import math
import statistics

import numpy as np

_MASK = (1 << 64) - 1
_OWNER_SALT = 0x9E3779B97F4A7C15
_VALUE_SALT = 0x94D049BB133111EB
_COLUMN_MULTIPLIER = 0xC2B2AE3D27D4EB4F


def mix64(x):
    """MurmurHash3's 64-bit finalizer, on Python integers."""
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _MASK
    return x ^ (x >> 33)


def owner_shard(key, num_shards):
    """The owner shard of an int64 key (or a string's fingerprint)."""
    return 0 if num_shards <= 1 else (mix64((int(key) & _MASK) ^ _OWNER_SALT) * num_shards) >> 64


def keyed_uniform(seed, key, column):
    """The number in (0, 1) of (seed, key, column): (2k + 1) / 2^24 from 23 bits of a mix."""
    key_mix = mix64((int(key) & _MASK) ^ _VALUE_SALT)
    z = mix64(key_mix ^ (int(seed) & _MASK) ^ ((int(column) * _COLUMN_MULTIPLIER) & _MASK))
    return np.float32((2 * (z >> 41) + 1) / float(1 << 24))


def keyed_value(seed, key, column, distribution, a, b):
    """A new row's initial value (cc/core/key_values.h): the keyed uniform u turned into
    `distribution` by its inverse distribution function, in double precision."""
    u = float(keyed_uniform(seed, key, column))
    if distribution == "uniform":
        return np.float32(a + (b - a) * u)
    if distribution == "truncated_normal":   # the probabilities within two standard deviations
        edge = 0.5 * math.erfc(2.0 / math.sqrt(2.0))
        u = edge + (1.0 - 2.0 * edge) * u
    return np.float32(a + b * statistics.NormalDist().inv_cdf(u))
