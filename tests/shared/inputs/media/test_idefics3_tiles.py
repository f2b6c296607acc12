"""The Idefics3 tiles (``shared.inputs.media.idefics3``) equal transformers' ``Idefics3ImageProcessorPil``: frames,
rows and columns, with splitting and without, for images smaller and larger than the resize and the tile."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.inputs.media.idefics3 import TileSettings, placeholder, tiles
from tests.workers.models.late_visual import sample_image

CONFIGS = [
    {"size": {"longest_edge": 112}, "max_image_size": {"longest_edge": 56}},
    {"size": {"longest_edge": 1456}, "max_image_size": {"longest_edge": 364}},  # the processor's defaults
    {"size": {"longest_edge": 112}, "max_image_size": {"longest_edge": 56}, "do_image_splitting": False},
]
SIZES = [(60, 45), (33, 80), (300, 200), (50, 50), (20, 700), (1100, 850)]


@pytest.mark.parametrize("config", CONFIGS)
def test_tiles_equal_the_pil_processor(config):
    from transformers import Idefics3ImageProcessorPil

    processor = Idefics3ImageProcessorPil(**config)
    settings = TileSettings.from_config(processor.to_dict())
    assert TileSettings.from_dict(settings.to_dict()) == settings
    seen = set()
    for i, (h, w) in enumerate(SIZES):
        image = sample_image(h, w, seed=i)
        theirs = processor(images=[image], return_row_col_info=True, return_tensors="np")
        frames, rows, cols = tiles(np.asarray(image), settings)
        assert (rows, cols) == (theirs["rows"][0][0], theirs["cols"][0][0])
        np.testing.assert_allclose(frames, theirs["pixel_values"][0], atol=1e-6, rtol=0)
        seen.add((rows, cols))
    assert len(seen) > 1 or not settings.split


def test_placeholder_is_the_processors_text(tmp_path):
    from transformers import AutoProcessor

    from tests.workers.models.late_visual import colmodernvbert_folder

    processor = AutoProcessor.from_pretrained(colmodernvbert_folder(tmp_path))
    for rows, cols in ((0, 0), (1, 2), (2, 2)):
        inputs = {"rows": [[rows]], "cols": [[cols]]}
        assert placeholder(rows, cols, "<image>", 4) == processor.replace_image_token(inputs, 0)
