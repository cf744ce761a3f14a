"""Delta exports of changed rows and their application (docs/deltas.md)."""
