"""int8 linears (W8A8) against float32 on a sentence-transformers folder: does every vector stay at cosine >= 0.999?

The accuracy question behind an int8 CPU path, asked before any int8 kernel is written: each ``nn.Linear``'s
weight is rounded to int8 per output channel (symmetric) and its input to int8 per token (``sym``: symmetric;
``asym``: with a zero point), then multiplied in float32. That is what an int8 GEMM with those scales computes,
up to float32 rounding of its int32 sums, so the cosines are the int8 path's. A linear whose module name contains
the variant's ``keep`` string stays float32 (``""`` keeps none). The corpus is ``poolgate bench``'s synthetic
one; per variant the report gives the worst and mean cosine to sentence-transformers float32 and the count below
0.999 (the serving bar, docs/benchmarks.md "CPU peers").

    python -m poolgate.workers.tools.int8_probe --num-texts 2048 --schemes sym asym \\
        --keep "" .output.dense attention.self intermediate
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

BAR = 0.999
SCHEMES = ("sym", "asym")


def _symmetric(x: torch.Tensor) -> torch.Tensor:
    """``x`` on the int8 grid of each last-dim row's own scale (max |row| / 127), in float32."""
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
    return torch.round(x / scale).clamp(-127, 127) * scale


def int8_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` (out, in) on its int8 grid, one scale per output channel."""
    return _symmetric(w)


def int8_tokens(x: torch.Tensor, scheme: str) -> torch.Tensor:
    """``x`` (..., in) on each token's int8 grid: ``sym`` max |x| / 127; ``asym`` (max - min) / 255 with a zero
    point, as a u8 activation with s8 weights has it."""
    if scheme == "sym":
        return _symmetric(x)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = ((hi - lo) / 255).clamp_min(1e-12)
    zero = torch.round(-lo / scale)
    return (torch.round(x / scale) + zero).clamp(0, 255).sub(zero) * scale


def int8_linears(model: nn.Module, scheme: str, keep: str = "") -> list[str]:
    """Make ``model``'s linears W8A8 in place (weights rounded now, inputs by a pre-hook at every call), but those
    whose name contains ``keep`` (when not empty); returns the names made int8."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    done = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and not (keep and keep in name):
            with torch.no_grad():
                module.weight.copy_(int8_weight(module.weight))
            module.register_forward_pre_hook(lambda _m, args: (int8_tokens(args[0], scheme), *args[1:]))
            done.append(name)
    return done


def probe(model_path: str, texts: list[str], variants: list[tuple[str, str]], batch_size: int = 64) -> dict:
    """Per (scheme, keep) variant: the cosines of the W8A8 model's vectors to float32's over ``texts``."""
    from sentence_transformers import SentenceTransformer

    def encode(model: SentenceTransformer) -> torch.Tensor:
        return model.encode(texts, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=True)

    reference = encode(SentenceTransformer(model_path, device="cpu"))
    rows = []
    for scheme, keep in variants:
        model = SentenceTransformer(model_path, device="cpu")
        made = int8_linears(model, scheme, keep)
        cos = (encode(model) * reference).sum(-1)
        rows.append(
            {
                "scheme": scheme,
                "keep_float32": keep or None,
                "int8_linears": len(made),
                "worst_cosine": round(cos.min().item(), 6),
                "mean_cosine": round(cos.mean().item(), 6),
                f"below_{BAR}": int((cos < BAR).sum()),
                "accurate": bool(cos.min() >= BAR),
            }
        )
    return {"model": model_path, "texts": len(texts), "bar": BAR, "variants": rows}


def main(argv: list[str] | None = None) -> None:
    from poolgate.shared.config.models import bundled_model_path
    from poolgate.shared.domain.corpus import synthetic_corpus

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="sentence-transformers folder (default: the bundled MiniLM)")
    p.add_argument("--num-texts", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0, help="corpus seed (poolgate bench's default)")
    p.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    p.add_argument("--keep", nargs="+", default=[""], help="name substrings kept float32, one variant each")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = synthetic_corpus(args.num_texts, seed=args.seed)
    variants = [(scheme, keep) for keep in args.keep for scheme in args.schemes]
    print(json.dumps(probe(str(args.model or bundled_model_path()), texts, variants), indent=1))


if __name__ == "__main__":
    main()
