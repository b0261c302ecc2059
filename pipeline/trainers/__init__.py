"""Trainers that learn from rlpipe datasets: PPO and SAC online, BC, MARWIL and CQL offline.

One module per algorithm, each readable top to bottom; :mod:`~pipeline.trainers.trainer` says what
the loops need of them. This package imports nothing, so ``pipeline.trainers.command`` loads
without torch.
"""
