"""The ``rlpipe`` command line, and the commands that only read a dataset (inspect, replay)."""
