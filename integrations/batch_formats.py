"""Batch formats of Ray Data's ``map_batches``: read a column as a list, write an array as a column.

A batch is a dict of numpy arrays (``batch_format="numpy"``), a pandas DataFrame or a pyarrow Table.
Written, an ``(n, width)`` array is one row vector per row: the dict keeps the 2-D array (Ray stores it as a
tensor column), pandas gets a column of ``(width,)`` arrays, and Arrow a ``fixed_size_list<float>[width]``
column (plain Arrow: a Parquet reader without Ray reads fixed-size float lists). pandas and pyarrow are
imported only by the batches that are theirs.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def format_of(batch: Any) -> str:
    """``numpy`` for a dict of arrays, else the batch's library (``pandas``, ``pyarrow``)."""
    kind = "numpy" if isinstance(batch, dict) else type(batch).__module__.partition(".")[0]
    if kind not in READ:
        raise TypeError(f"a batch is a dict of numpy arrays, a pandas DataFrame or a pyarrow Table, got {type(batch)}")
    return kind


def _column(names: list[str], name: str) -> None:
    if name not in names:
        raise KeyError(f"the batch has no column {name!r} (it has {', '.join(map(str, names))})")


def _read_numpy(batch: dict[str, np.ndarray], name: str) -> list[Any]:
    _column(list(batch), name)
    return np.asarray(batch[name]).tolist()


def _read_pandas(batch: Any, name: str) -> list[Any]:
    _column(list(batch.columns), name)
    return batch[name].tolist()


def _read_arrow(batch: Any, name: str) -> list[Any]:
    _column(batch.column_names, name)
    return batch.column(name).to_pylist()


def _write_numpy(batch: dict[str, np.ndarray], name: str, values: np.ndarray) -> dict[str, np.ndarray]:
    return {**batch, name: values}


def _write_pandas(batch: Any, name: str, values: np.ndarray) -> Any:
    return batch.assign(**{name: list(values) if values.ndim == 2 else values})


def _write_arrow(batch: Any, name: str, values: np.ndarray) -> Any:
    import pyarrow as pa

    if values.ndim == 2:  # (n, width): fixed_size_list<float> of width
        column = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
    else:
        column = pa.array(values.tolist() if values.dtype == object else values)
    if name in batch.column_names:
        return batch.set_column(batch.column_names.index(name), name, column)
    return batch.append_column(name, column)


READ = {"numpy": _read_numpy, "pandas": _read_pandas, "pyarrow": _read_arrow}
WRITE = {"numpy": _write_numpy, "pandas": _write_pandas, "pyarrow": _write_arrow}
