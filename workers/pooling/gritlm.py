"""GritLM (``GritLM``, vLLM's name until 0.28): a bidirectional Llama whose embedding averages only the text
after the instruction, normalized.

A GritLM checkpoint is a Llama (or, GritLM-7B itself, a Mistral: the config's
``model_type`` decides the block); served as ``GritLM`` it runs without the causal
mask and without a sliding window (``workers.models.decoder_config.ARCHITECTURE_SETTINGS``). Its prompts are
``<s><|user|>\\nINSTRUCTION\\n<|embed|>\\nTEXT`` or ``<s><|embed|>\\nTEXT``, and
``embed`` is the fp32 mean of the final states after the instruction, i.e. after
the first ``<|embed|>`` + newline, then L2-normalized. The marker is found on token
ids (``instruction_length``): its ids are what the model's own tokenizer makes of
``<|embed|>\\n`` at the start of a text and after a newline (a SentencePiece
tokenizer spells the two differently: ``▁<`` and ``<``), searched from the token
after BOS; the instruction ends where the first match ends. A sequence without
BOS leaves nothing out, one without the marker leaves out only BOS; each logs a
warning once per model. ``token_embed`` is every token's state, normalized.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead
from poolgate.workers.pooling.rows import RowSelector, per_sequence_counts
from poolgate.workers.pooling.sources import PoolerSources

log = logging.getLogger(__name__)
MARKER = "<|embed|>\n"  # the instruction ends after it
PROBE = "a"  # a word the marker follows in the second spelling: "a\n<|embed|>\n"
POOLING = "MEAN"
Patterns = tuple[tuple[int, ...], ...]  # the marker's spellings in token ids


def marker_patterns(tokenizer) -> Patterns:
    """The token ids ``MARKER`` becomes at a text's start and after a newline (with that newline)."""
    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    start, probe, after = ids(MARKER), ids(PROBE), ids(f"{PROBE}\n{MARKER}")
    patterns = [tuple(start)]
    if after[:len(probe)] == probe and len(after) > len(probe):
        patterns.append(tuple(after[len(probe):]))
    return tuple(dict.fromkeys(p for p in patterns if p))


def _first_end(ids: np.ndarray, pattern: Sequence[int]) -> int | None:
    """Where the first match of ``pattern`` in ``ids`` (searched from index 1) ends, or None."""
    n = len(pattern)
    if len(ids) - 1 < n:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(ids[1:], n)  # (len - n, n)
    hits = np.flatnonzero((windows == np.asarray(pattern)).all(axis=1))
    return int(hits[0]) + 1 + n if hits.size else None


NO_BOS = "no BOS token starts the prompt, so no instruction is left out of the mean (GritLM expects <s>)"
NO_MARKER = "no <|embed|> + newline in the prompt, so only BOS is left out of the mean (GritLM expects it)"


def instruction_length(ids: np.ndarray, bos: int | None, patterns: Patterns) -> tuple[int, str | None]:
    """How many leading tokens of one prompt are its instruction, and the warning when it has none."""
    if bos is None or len(ids) == 0 or ids[0] != bos:
        return 0, NO_BOS
    ends = [e for e in (_first_end(ids, p) for p in patterns) if e is not None]
    return (min(ends), None) if ends else (1, NO_MARKER)


def instruction_rows(bos: int | None, patterns: Patterns) -> RowSelector:
    """Keep each sequence's tokens after its instruction; warn when a prompt has none (``_warn``)."""
    seen: dict[str, int] = {}

    def select(ids: np.ndarray, lengths: list[int]) -> tuple[np.ndarray, list[int]]:
        keep, start = np.ones(len(ids), dtype=bool), 0  # (run tokens,)
        for length in lengths:
            skip, warning = instruction_length(ids[start:start + length], bos, patterns)
            if warning is not None:
                _warn(seen, warning)
            keep[start:start + skip] = False
            start += length
        return np.flatnonzero(keep), per_sequence_counts(keep, lengths)

    return select


def _warn(seen: dict[str, int], warning: str) -> None:
    """Log ``warning`` the 1st, 10th, 100th … time it comes up for this model, not for every prompt (the
    start-up warm-up, whose text has no marker, takes the first)."""
    n = seen[warning] = seen.get(warning, 0) + 1
    if n == 10 ** (len(str(n)) - 1):
        log.warning("GritLM: %s (%d prompt%s so far)", warning, n, "s" if n > 1 else "")


def gritlm_poolers(src: PoolerSources) -> DispatchPooler:
    """embed = normalize(fp32 mean after the instruction); token_embed = each token's state, normalized."""
    pooler = src.spec.pooler
    if pooler.sequence_pooling not in (None, POOLING):
        raise ValueError(f"GritLM pools embed with MEAN after its instruction; --pooler-config "
                         f"{pooler.sequence_pooling} is not one it runs")
    tokenizer = src.the_tokenizer("GritLM's instruction detection")
    rows = instruction_rows(tokenizer.bos_token_id, marker_patterns(tokenizer))
    normalize = True if src.spec.normalize is None else src.spec.normalize
    return DispatchPooler({
        "embed": Pooler(POOLING, EmbedHead(None, normalize, pooler.dimensions, l2_cut=src.ops.l2_cut), rows=rows),
        "token_embed": Pooler(pooler.token_pooling or "ALL", EmbedHead(None, normalize, l2_cut=src.ops.l2_cut)),
    }, active=pooler.task, ops=src.ops)
