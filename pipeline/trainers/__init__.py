"""Trainers that learn from rlpipe datasets: PPO and SAC online, BC, MARWIL and CQL offline.

One module per algorithm (``ppo``, ``sac``, ``bc``, ``marwil``, ``cql``), each readable top to
bottom: config, networks, trainer with ``update(batch)``, ``state_dict()``,
``load_state_dict()`` and ``checkpoint(version)``: the ``Trainer`` protocol of ``trainer``, which
the loops take, with no base class. Shared pieces: ``returns`` (discounted returns and GAE),
``networks``, ``state`` (pickle-free trainer state), ``buffer``, ``evaluation``, ``loop`` and
``runlog`` (what ``rlpipe train`` runs), ``command`` (the CLI).

This package imports nothing itself, so ``pipeline.trainers.command`` loads without torch.
"""
