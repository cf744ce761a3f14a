"""tf_sc_embedding: TPUEmbeddingV2-style sharded embeddings whose SparseCore ops run on CPU."""
from tf_sc_embedding import ops
from tf_sc_embedding import layout

__all__ = ["ops", "layout"]
__version__ = "0.1.0"
