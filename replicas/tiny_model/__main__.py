"""``python -m replicas.tiny_model DIR [--size tiny|bench] [--seed N] [--force]``: build a local model folder."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from replicas.tiny_model.build import MODEL_SIZES, build_tiny_model, is_built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replicas.tiny_model", description=__doc__)
    parser.add_argument("out_dir", help="folder to write the Hugging Face model into")
    parser.add_argument("--size", choices=sorted(MODEL_SIZES), default="tiny",
                        help="tiny: for tests; bench: engine-bound live benchmarks (tens of ms per step)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    parser.add_argument("--force", action="store_true", help="rebuild even if the folder is up to date")
    args = parser.parse_args(argv)
    spec = dataclasses.replace(MODEL_SIZES[args.size], seed=args.seed)
    if is_built(args.out_dir, spec) and not args.force:
        print(f"{args.size} model already built at {args.out_dir}")
        return 0
    path = build_tiny_model(args.out_dir, spec)
    print(f"{args.size} model written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
