"""``poolgate verify MODEL [model flags]``: the model's outputs in poolgate against its own library, per task and dtype.

Loads the model as ``poolgate serve`` would (the same model flags), once per
dtype (``--dtype auto``: float32 and the backend's fast dtype; else the one
given), and runs ``workers.tools.verify``'s fixed probe set against the
reference (sentence-transformers, or transformers with the model's pooling; a
media model's texts and synthetic images against transformers' own model and
processors: ``workers.tools.verify_media``).
Prints one line per task and dtype (worst cosine, max abs difference, batched
vs single) and exits 0 when every worst cosine reaches ``--threshold``, 1
when one does not, 2 when the model cannot be loaded. Imports without torch.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from poolgate.shared.config.model_flags import add_model_arguments, worker_config_from_args

DEFAULT_THRESHOLD = 0.999  # workers.tools.verify.DEFAULT_THRESHOLD (this module stays torch-free)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="the least worst-case cosine to the reference (and batched to single) that passes")


def _dtypes(cfg) -> list[str]:
    if cfg.dtype != "auto":
        return [cfg.dtype]
    from poolgate.workers.backends import get_backend

    fast = str(get_backend(cfg.backend).fast_dtype()).removeprefix("torch.")
    return ["float32"] + ([fast] if fast != "float32" else [])


def main(args: argparse.Namespace) -> int:
    try:
        cfg = worker_config_from_args(args)
        from poolgate.workers.load.build import load_model
        from poolgate.workers.load.media_build import media_family_of
        from poolgate.workers.load.st_config import read_spec
        from poolgate.workers.tools.verify import verify_loaded
        from poolgate.workers.tools.verify_media import verify_media

        media = media_family_of(cfg) is not None  # images in: texts and probe images (workers.tools.verify_media)
        spec, rows, skipped = None if media else read_spec(cfg), [], set()
        for dtype in _dtypes(cfg):
            loaded = load_model(replace(cfg, dtype=dtype))
            checks, missed = verify_media(loaded, cfg.model) if spec is None else verify_loaded(loaded, spec)
            rows += checks
            skipped.update(missed)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"poolgate verify: error: {exc}", file=sys.stderr)
        return 2
    print(f"poolgate verify {cfg.model}: {len(rows)} checks against the model's own library (float32)")
    for row in rows:
        print(row.line())
    if skipped:
        print(f"skipped (no reference in verify): {', '.join(sorted(skipped))}")
    failed = [r for r in rows if not r.passes(args.threshold)]
    print(f"{'FAIL' if failed or not rows else 'PASS'} (threshold {args.threshold})")
    return 1 if failed or not rows else 0
