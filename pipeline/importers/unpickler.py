"""A pickle reader that admits numpy arrays and nothing else.

RLlib packs SampleBatch columns as base64 of LZ4 of a pickled ndarray (``ray.rllib.utils.
compression.pack``). Unpickling runs code named by the data, so a file from elsewhere could run
``os.system`` on load. This reader resolves only the few numpy callables that rebuild an ndarray
(the protocol-5 ``_frombuffer`` path and the older ``_reconstruct`` path, plus ``dtype``), refuses
every other global by name, and checks that what comes out is an ndarray of plain numbers.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

try:  # numpy >= 2
    from numpy._core import multiarray, numeric
except ImportError:  # numpy 1.26, which pyproject still admits
    from numpy.core import multiarray, numeric  # type: ignore[no-redef]

from pipeline.errors import DatasetError

# (module, name) in the pickle -> the object it may resolve to. numpy 2 renamed numpy.core to
# numpy._core; pickles from either side name their own, so both spellings map to the same objects
# (without importing the deprecated numpy.core alias).
_ALLOWED: dict[tuple[str, str], Any] = {}
for _core in ("numpy.core", "numpy._core"):
    _ALLOWED[(f"{_core}.numeric", "_frombuffer")] = numeric._frombuffer  # type: ignore[attr-defined]
    _ALLOWED[(f"{_core}.multiarray", "_reconstruct")] = multiarray._reconstruct
    _ALLOWED[(f"{_core}.multiarray", "scalar")] = multiarray.scalar
_ALLOWED[("numpy", "dtype")] = np.dtype
_ALLOWED[("numpy", "ndarray")] = np.ndarray


def _latin1_bytes(text: str, encoding: str) -> bytes:
    """Protocol 2 spells bytes as ``_codecs.encode(text, "latin1")``; no other codec is admitted."""
    if encoding != "latin1" or not isinstance(text, str):
        raise pickle.UnpicklingError(f"refused _codecs.encode with {encoding!r}")
    return text.encode("latin1")


_ALLOWED[("_codecs", "encode")] = _latin1_bytes


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refused to load {module}.{name}: only numpy arrays may be unpickled"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused a persistent id: only numpy arrays may be unpickled")


def load_ndarray(data: bytes, where: str) -> np.ndarray:
    """The ndarray pickled in ``data``; anything else is refused before any of it runs.

    Raises:
        DatasetError: naming ``where`` and what the pickle tried to load.
    """
    try:
        value = _NumpyOnlyUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
        raise DatasetError(f"{where}: {error}") from None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        got = f"array of {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
        raise DatasetError(f"{where}: expected a numeric numpy array, got {got}")
    return value
