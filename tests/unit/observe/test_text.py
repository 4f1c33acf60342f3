"""Plain-text tables (hpctrain.observe.text): columns as wide as their widest cell, some right-aligned."""

from __future__ import annotations

from hpctrain.observe.text import table


def test_columns_fit_their_cells() -> None:
    printed = table(["#", "name", "loss"], [["1", "a", "2.5"], ["10", "longer", "0.25"]], right=(0, 2))
    assert printed.splitlines() == [
        " #  name    loss",
        " 1  a        2.5",
        "10  longer  0.25",
    ]
