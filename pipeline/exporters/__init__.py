"""Exporters: rlpipe datasets written in other tools' formats (``rlpipe export``).

:mod:`~pipeline.exporters.minari` writes a Minari dataset. Nothing is imported here, so
``rlpipe`` starts fast.
"""
