"""Policies: the checkpoint file format, and the numpy network that acts with one anywhere."""
