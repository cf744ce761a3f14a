"""The tables: how they are laid out over SparseCores (`layout`, `feature_shapes`), the variables
that hold them (`table_storage`), their logical view whether built or pending a restore
(`logical_tables`), and open vocabularies (`dynamic_vocabulary`, `dynamic_shards`,
`dynamic_tables`). Below the step: nothing here runs a collective or knows an exchange."""
