"""Runtime: replica workers, thin Ray actor shells, executor, cluster start/connect."""
