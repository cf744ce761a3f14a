"""Table layout: padding, stacking, mod sharding with rotation (spec §2), computed in C++."""
from tf_sc_embedding._core import LayoutStacker, TableLayout

__all__ = ["LayoutStacker", "TableLayout"]
