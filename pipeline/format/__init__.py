"""The format: where files live, what the manifest says, and how spaces and values become Arrow
columns of the step and episodes tables (``docs/format.md`` is the prose version)."""
