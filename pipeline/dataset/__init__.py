"""The dataset: the writer and its write-ahead log, shards and recovery, and the reader that turns
committed shards into batches and whole episodes."""
