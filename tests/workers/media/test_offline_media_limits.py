"""The offline API takes the media flags as keywords, as ``poolgate serve`` takes them: counted, capped, checked."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.inputs.media.synthetic import data_url
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.workers.offline import PoolingModel
from tests.workers.media.dual_encoders import make_dual, png


def picture(seed: int) -> MediaInput:
    return MediaInput((MediaRef("image", data_url(png(seed))),))  # 45 x 37


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip")
    make_dual(folder, "clip")
    return str(folder)


def test_the_media_flags_hold_in_the_offline_api(clip_folder):
    with PoolingModel(clip_folder, dtype="float32", max_images_per_request=2, max_image_pixels=45 * 37) as model:
        vectors = model.embed([picture(1), picture(2)])
        assert vectors.shape == (2, 24) and not np.allclose(vectors[0], vectors[1])
        with pytest.raises(InvalidRequest, match="holds 3 images and audio clips, over this server's "
                                                 "--max-images-per-request 2"):
            model.embed([picture(1), picture(2), picture(3)])
        big = MediaInput((MediaRef("image", data_url(png(4, 46, 37))),))
        with pytest.raises(InvalidRequest, match=r"46 x 37 = 1,702 pixels, over this server's --max-image-pixels 1,665"):
            model.embed([big])


def test_a_bad_allowed_domain_is_refused_before_loading(clip_folder):
    with pytest.raises(ValueError, match="--allowed-media-domains: 'https://a.example/' is not a host name"):
        PoolingModel(clip_folder, allowed_media_domains=["https://a.example/"])
