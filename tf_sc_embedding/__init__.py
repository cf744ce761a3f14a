"""tf_sc_embedding: TPUEmbeddingV2-style sharded embeddings whose SparseCore ops run on CPU."""
from tf_sc_embedding import layout, ops
from tf_sc_embedding.embedding import TPUEmbeddingV2

__all__ = ["TPUEmbeddingV2", "layout", "ops"]
__version__ = "0.1.0"
