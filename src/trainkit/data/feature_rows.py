"""Rows of features, one sample per row: what a table's data option gives eval.py's predict= (read_for_prediction)."""

import csv
from pathlib import Path

import numpy as np
import torch


def read_feature_rows(path: str | Path, columns: int) -> torch.Tensor:
    """float32 [N, columns] from a CSV file (a first line that is not numbers, a header, is skipped) or a .npy array
    [N, columns] ([columns]: one row). A row of another length, or a value that is not a number, raises ValueError."""
    path = Path(path)
    if path.suffix.lower() == ".npy":
        array = np.load(path, allow_pickle=False)
        if array.ndim not in (1, 2):
            raise ValueError(f"holds an array of {array.ndim} dimensions; save rows of features, [N, {columns}]")
        numbered = list(enumerate(np.atleast_2d(array)))
    else:
        with path.open(newline="") as file:
            numbered = [(number, row) for number, row in enumerate(csv.reader(file), start=1) if row]
        if numbered and not all(_is_number(value) for value in numbered[0][1]):
            numbered = numbered[1:]  # the column names
    for number, row in numbered:
        if len(row) != columns:
            raise ValueError(f"row {number} has {len(row)} values, but the data's rows have {columns}")
    try:
        return torch.tensor(np.asarray([row for _, row in numbered], dtype=np.float32).reshape(-1, columns))
    except ValueError as error:
        raise ValueError(f"holds a value that is not a number ({error})") from error


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True
