"""The API keys file: tenants with keys or sha256 digests, priorities and quotas; errors name file, line and key."""
from __future__ import annotations

import argparse
import hashlib

import pytest

from poolgate.gateway import serve
from poolgate.gateway.config.tenants import load_tenants

GOOD = """\
[[tenants]]
name = "search"
keys = ["sk-search-0001"]
priority = 0
requests_per_minute = 600
max_concurrent = 8

[[tenants]]
name = "nightly"
key_sha256 = ["{digest}"]
priority = 10
tokens_per_minute = 100000
"""


def write(tmp_path, text: str) -> str:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    return str(path)


def test_keys_are_held_as_digests_with_each_tenants_settings(tmp_path):
    digest = hashlib.sha256(b"sk-nightly-0002").hexdigest()
    search, nightly = load_tenants(write(tmp_path, GOOD.format(digest=digest.upper())))
    assert search.name == "search" and search.key_sha256 == (hashlib.sha256(b"sk-search-0001").hexdigest(),)
    assert (search.priority, search.requests_per_minute, search.tokens_per_minute, search.max_concurrent) == \
        (0, 600, None, 8)
    assert nightly.key_sha256 == (digest,) and nightly.priority == 10 and nightly.tokens_per_minute == 100000
    assert "sk-search-0001" not in repr(search)


@pytest.mark.parametrize("text, message", [
    ('[[tenants]]\nname = "a"\n', r"keys.toml:1: tenants\[0\]: a tenant needs at least one of keys or key_sha256"),
    ('[[tenants]]\nname = "a"\nkeys = ["k-000001"]\n\n[[tenants]]\nname = "a"\nkeys = ["k-000002"]\n',
     r"keys.toml:6: tenants\[1\]\.name: tenant 'a' is named twice"),
    ('[[tenants]]\nname = "a"\nkeys = ["k-000001"]\n[[tenants]]\nname = "b"\nkeys = ["k-000001"]\n',
     r"tenants\[1\]: a key belongs to two tenants"),
    ('[[tenants]]\nname = "a"\nkey_sha256 = ["abc"]\n', r"keys.toml:3: tenants\[0\]\.key_sha256: .*64 hex digits"),
    ('[[tenants]]\nname = "a"\nkeys = ["k-000001"]\nrequests_per_minute = 0\n',
     r"keys.toml:4: tenants\[0\]\.requests_per_minute"),
    ('[[tenants]]\nname = "a"\nkeys = ["k-000001"]\ncolour = 1\n', r"tenants\[0\]\.colour"),
    ('tenants = 1\n', r"keys.toml:1: tenants"),
    ('[[tenants]]\nname = "a b"\nkeys = ["k-000001"]\n', r"tenants\[0\]\.name"),
])
def test_every_error_names_the_file_line_and_key(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_tenants(write(tmp_path, text))


def test_the_flag_and_the_config_key_read_the_file(tmp_path):
    path = write(tmp_path, GOOD.format(digest="0" * 64))
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    config = serve.config_from_args(parser.parse_args(["--api-keys-file", path]), {})
    assert [t.name for t in config.tenants] == ["search", "nightly"]
    (tmp_path / "serve.toml").write_text('api_keys_file = "keys.toml"\n[[models]]\n')
    config = serve.config_from_args(parser.parse_args(["--config", str(tmp_path / "serve.toml")]), {})
    assert [t.name for t in config.tenants] == ["search", "nightly"]


def test_the_api_key_may_come_from_the_environment():
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.config_from_args(parser.parse_args([]), {"POOLGATE_API_KEY": "sk-env"}).api_key == "sk-env"
    assert serve.config_from_args(parser.parse_args(["--api-key", "sk-flag"]),
                                  {"POOLGATE_API_KEY": "sk-env"}).api_key == "sk-flag"
