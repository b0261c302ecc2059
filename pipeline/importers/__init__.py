"""Importers: recordings made elsewhere, turned into rlpipe datasets.

One module per source family (:mod:`~pipeline.importers.rllib`, :mod:`~pipeline.importers.minari`,
:mod:`~pipeline.importers.d4rl`, :mod:`~pipeline.importers.table`), all feeding
:func:`pipeline.importers.transitions.write_dataset`, which decides where episodes end and how.
From Python, ``pipeline.importers.table.import_dataframe(frame, path, env_id=...)`` imports a
pandas DataFrame. Nothing is imported here, so ``rlpipe`` starts fast.
"""
