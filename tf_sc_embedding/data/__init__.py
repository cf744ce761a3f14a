"""Built-in synthetic data for benchmarks, tests and the main job."""
from tf_sc_embedding.data.criteo_like import CRITEO_LIKE_VOCABULARY_SIZES, CriteoLikeWorkload

__all__ = ["CRITEO_LIKE_VOCABULARY_SIZES", "CriteoLikeWorkload"]
