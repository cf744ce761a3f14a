"""tf_sc_embedding: TPUEmbeddingV2-style sharded embeddings whose SparseCore ops run on CPU."""
from tf_sc_embedding import ops
from tf_sc_embedding.tables import layout
from tf_sc_embedding.tables.dynamic_vocabulary import DynamicVocabulary
from tf_sc_embedding.embedding import TPUEmbeddingV2
from tf_sc_embedding.options import EmbeddingOptions
from tf_sc_embedding.optimizers.row_wise_adagrad import RowWiseAdagrad

__all__ = ["DynamicVocabulary", "EmbeddingLayer", "EmbeddingOptions", "RowWiseAdagrad", "TPUEmbeddingV2", "layout",
           "ops"]
__version__ = "0.1.0"


def __getattr__(name):
    # The Keras layer is imported on first use, so that importing the package does not import Keras.
    if name == "EmbeddingLayer":
        from tf_sc_embedding.keras.layer import EmbeddingLayer  # pylint: disable=import-outside-toplevel
        return EmbeddingLayer
    raise AttributeError(f"module 'tf_sc_embedding' has no attribute '{name}'")
