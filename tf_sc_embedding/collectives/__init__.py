"""Where the replicas live and how they talk: the replica group, every collective launch with its
timeout and the per-replica counters (`replica_group`)."""
