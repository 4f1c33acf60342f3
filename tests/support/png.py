"""Checking a report's pictures: real PNGs whose pixels hold the colour of every series drawn."""

from __future__ import annotations

import numpy as np
from matplotlib.image import imread

from hpctrain.observe.report import Picture

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(picture: Picture) -> None:
    """A real PNG of a sensible size, not blank, with the colour of every plotted series in its pixels."""
    assert picture.path.read_bytes()[:8] == PNG_SIGNATURE
    image = imread(picture.path)
    height, width = image.shape[:2]
    assert 400 <= height <= 2000 and 600 <= width <= 3000, image.shape
    rgb = np.round(image[..., :3] * 255).astype(int)
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 20, f"{picture.path.name} is nearly blank"
    for series in picture.series:
        target = np.array([int(series.color[i : i + 2], 16) for i in (1, 3, 5)])
        near = int((np.abs(rgb - target).max(axis=-1) <= 8).sum())
        assert near >= 30, f"{picture.path.name}: {series.label} ({series.color}) is not in the pixels"
