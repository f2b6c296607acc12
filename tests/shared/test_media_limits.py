"""The media limits: their flags (``--allowed-media-domains``, ``--max-images-per-request``, ``--max-image-pixels``,
``--max-media-bytes``), their config file keys, their checks, and the ``MediaLimits`` each pool carries."""
from __future__ import annotations

import argparse
import textwrap

import pytest

from poolgate.gateway import serve
from poolgate.gateway.config.file import ConfigError, load_config
from poolgate.shared.config.model_flags import add_model_arguments, media_limits, settings_from_args
from poolgate.shared.config.model_settings import ModelSettings
from poolgate.shared.domain.media_limits import DEFAULT_MAX_IMAGE_PIXELS, MediaLimits, media_host


def flags(*given: str) -> ModelSettings:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    return settings_from_args(parser.parse_args(list(given)))


def test_the_defaults_are_the_limits_defaults():
    limits = media_limits(flags())
    assert limits == MediaLimits()
    assert (limits.max_images_per_request, limits.max_image_pixels) == (16, DEFAULT_MAX_IMAGE_PIXELS)
    assert limits.allowed_media_domains == ()  # off: only data: URLs and base64


def test_the_flags_set_the_limits():
    limits = media_limits(flags("--allowed-media-domains", "Images.Example.com.", "[::1]", "--max-images-per-request",
                                "3", "--max-image-pixels", "1000", "--max-media-bytes", "2048", "--max-audio-seconds", "2.5",
                                "--allowed-media-domains", "10.0.0.7", "images.example.com", "bücher.example"))
    assert limits.allowed_media_domains == ("images.example.com", "::1", "10.0.0.7", "xn--bcher-kva.example")
    assert (limits.max_images_per_request, limits.max_image_pixels, limits.max_media_bytes) == (3, 1000, 2048)
    assert limits.max_audio_seconds == 2.5


@pytest.mark.parametrize("given", [("--max-images-per-request", "0"), ("--max-image-pixels", "-1"),
                                   ("--max-media-bytes", "x"), ("--max-audio-seconds", "0"),
                                   ("--allowed-media-domains",)])
def test_a_bad_flag_is_refused_naming_it(given, capsys):
    with pytest.raises(SystemExit):
        flags(*given)
    assert given[0] in capsys.readouterr().err


@pytest.mark.parametrize("host", ["https://example.com", "example.com:8080", "*.example.com", "user@example.com",
                                  "", "example..com", "a/b"])
def test_an_allowed_domain_must_be_an_exact_host(host):
    with pytest.raises(ValueError, match="--allowed-media-domains"):
        media_limits(flags("--allowed-media-domains", host))


def test_media_host_spells_names_and_addresses_one_way():
    assert media_host(" EXAMPLE.com. ") == "example.com"
    assert media_host("[0:0:0:0:0:0:0:1]") == "::1"
    assert media_host("10.0.0.7") == "10.0.0.7"
    assert media_host("münchen.de") == "xn--mnchen-3ya.de"


def load(text: str, tmp_path):
    path = tmp_path / "serve.toml"
    path.write_text(textwrap.dedent(text))
    parser = argparse.ArgumentParser(add_help=False)
    serve.add_arguments(parser)
    return load_config(str(path), parser, {})


def test_the_config_file_keys_reach_every_pool_local_and_remote(tmp_path):
    config = load("""\
        [[models]]
        name = "local"
        allowed_media_domains = ["images.example.com"]
        max_images_per_request = 4
        max_image_pixels = 4096
        [[models]]
        name = "far"
        max_media_bytes = 1000
        [[models.remote]]
        url = "unix:/tmp/w.sock"
        """, tmp_path)
    local, far = config.pools
    assert local.media == MediaLimits(max_images_per_request=4, max_image_pixels=4096,
                                      allowed_media_domains=("images.example.com",))
    assert far.media == MediaLimits(max_media_bytes=1000) and far.workers == ()


@pytest.mark.parametrize("text, where, message", [
    ("[[models]]\nmax_images_per_request = 0\n", "serve.toml:2: models[0].max_images_per_request", "must be >= 1"),
    ('[[models]]\nallowed_media_domains = "a.com"\n', "serve.toml:2: models[0].allowed_media_domains",
     "must be a list"),
    ('[[models]]\nallowed_media_domains = ["http://a.com/"]\n', "serve.toml:1: models[0]",
     "--allowed-media-domains: 'http://a.com/' is not a host name"),
])
def test_a_bad_key_names_its_line(tmp_path, text, where, message):
    with pytest.raises(ConfigError) as info:
        load(text, tmp_path)
    assert str(info.value).startswith(str(tmp_path / where)), str(info.value)
    assert message in str(info.value)


def test_the_command_line_sets_the_one_model_pool(tmp_path):
    parser = argparse.ArgumentParser(add_help=False)
    serve.add_arguments(parser)
    args = parser.parse_args(["--max-images-per-request", "2", "--allowed-media-domains", "a.example", "b.example"])
    (pool,) = serve.config_from_args(args, {}).pools
    assert pool.media == MediaLimits(max_images_per_request=2, allowed_media_domains=("a.example", "b.example"))
