"""The gateway's tokenizer (built from a worker's TokenizerFiles, no torch) tokenizes exactly as transformers does."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from poolgate.shared.inputs.tokenizer import TextEncoder
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.wire.messages import ChatInput, TextPair
from poolgate.workers.load.hf_tokenizer import files_of, read_tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "東京は日本の首都です。大阪は二番目に大きい都市です。",  # CJK: far more tokens than characters / 4
    "def f(x):\n    return {k: v ** 2 for k, v in x.items() if v}  # code",
    "Ça coûte 12,50 € — naïve façade",
]
TEMPLATE = ("{{ cls_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ sep_token }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.fixture(scope="module")
def hf():
    tokenizer = read_tokenizer(bundled_model_path())
    tokenizer.chat_template = TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def encoder(hf):
    return TextEncoder(files_of(hf))


def test_texts_with_and_without_truncation(hf, encoder):
    assert encoder.encode(TEXTS) == hf(TEXTS)["input_ids"]
    assert encoder.encode(TEXTS, add_special_tokens=False) == hf(TEXTS, add_special_tokens=False)["input_ids"]
    assert encoder.encode(TEXTS, max_tokens=7) == hf(TEXTS, truncation=True, max_length=7)["input_ids"]
    assert encoder.encode(TEXTS) == hf(TEXTS)["input_ids"]  # the truncating copy left the plain one alone


def test_pairs_are_cut_longest_first_with_their_token_types(hf, encoder):
    pairs = [TextPair(TEXTS[0], TEXTS[1]), TextPair(TEXTS[2], TEXTS[3])]
    got = encoder.encode_pairs(pairs, max_tokens=20)
    want = hf([p.text for p in pairs], [p.text_pair for p in pairs], truncation=True, max_length=20)
    assert got.ids == want["input_ids"] and got.type_ids == want["token_type_ids"]


def test_a_chat_renders_as_transformers_apply_chat_template(hf, encoder):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "東京?"}]
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert encoder.render_chat(ChatInput(messages, add_generation_prompt=True)) == want
    assert "[CLS]" in want and "[SEP]" in want  # the special tokens reached the template
    reply = [*messages, {"role": "assistant", "content": "Tokyo is"}]
    want = hf.apply_chat_template(reply, tokenize=False, continue_final_message=True)
    assert encoder.render_chat(ChatInput(reply, continue_final_message=True)) == want


def test_the_files_cross_the_wire_and_a_changed_file_is_refused(encoder):
    header, data = encoder.files.to_wire()
    assert data.dtype == np.uint8 and TokenizerFiles.from_wire(header, data) == encoder.files
    other = replace(encoder.files, do_lower_case=not encoder.files.do_lower_case)
    assert other.sha256 != encoder.files.sha256  # a setting is part of the hash, not only the file
    with pytest.raises(ValueError, match="sha256"):
        TokenizerFiles.from_wire(header, np.frombuffer(data.tobytes().replace(b"[UNK]", b"[UNX]"), np.uint8))


def test_the_gateway_side_tokenizes_without_importing_torch():
    script = f"""
import sys
from pathlib import Path
from poolgate.gateway.app import make_app
from poolgate.shared.inputs.front import Front
from poolgate.shared.inputs.tokenizer import TextEncoder
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.wire.messages import ChatInput
files = TokenizerFiles((Path({str(bundled_model_path())!r}) / "tokenizer.json").read_text(), chat_template="{{{{ messages[0]['content'] }}}}")
encoder = TextEncoder(files)
assert encoder.encode(["hello world"])[0][0] == 101
assert encoder.render_chat(ChatInput([{{"role": "user", "content": "hi"}}])) == "hi"
assert "torch" not in sys.modules, "torch was imported"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
