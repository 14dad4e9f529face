"""Calibrate the simulated engine's step-time model against the real vLLM engine on this machine.

    python -m bench.calibrate [--model tiny|bench|FOLDER] [--core 1] [--out FILE.json]

Runs vLLM (the CPU build here; any build works) on one core with the project's engine settings and times:
decode steps at several batch sizes (requests of 8 prompt tokens generating 96 tokens: the run's time over
its steps) and single prefill steps of several prompt lengths (one request, one output token, median of 5).
A least-squares fit (relative error) of ``step = base + per_token * tokens + per_seq * seqs + per_attention *
pairs`` (pairs: new tokens x the context they attend to) over those points gives the
:class:`replicas.sim_engine.StepCostModel` printed at the end (paste it into replicas/sim_engine.py).
Prompts are random token ids and prefix caching is off, so nothing is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from bench.models import ensure_model
from replicas.engine_dtype import cpu_flags, engine_dtype
from replicas.tiny_model.build import MODEL_SIZES


def main(argv: list[str] | None = None) -> int:
    """Measure, fit, print the fit as JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="a local model (tiny, bench; built if missing) or a folder")
    parser.add_argument("--out", help="also write the measured steps and the fit to this JSON file")
    parser.add_argument("--core", type=int, default=1, help="CPU core the engine's threads bind to")
    parser.add_argument("--decode-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    if args.model in MODEL_SIZES:
        args.model = str(ensure_model(args.model))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(args.core))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, dtype=engine_dtype("auto", True, cpu_flags()), enforce_eager=True,
              max_num_batched_tokens=2048, max_num_seqs=64, max_model_len=4096, enable_prefix_caching=False, kv_cache_memory_bytes=1 << 30)
    vocab = llm.get_tokenizer().vocab_size
    rng = random.Random(0)

    def prompts(count: int, length: int) -> list:
        return [TokensPrompt(prompt_token_ids=[rng.randrange(10, vocab) for _ in range(length)]) for _ in range(count)]

    def timed(count: int, length: int, output: int) -> float:
        params = SamplingParams(max_tokens=output, ignore_eos=True, temperature=0)
        batch = prompts(count, length)
        start = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - start

    timed(4, 64, 8)  # warm-up
    points: list[tuple[int, int, float, float]] = []  # (batched tokens, seqs, attention pairs, seconds per step)
    for batch in (1, 4, 16, 32, 64):
        seconds = timed(batch, 8, args.decode_tokens)
        mean_context = 8 + args.decode_tokens / 2
        points.append((batch, batch, batch * mean_context, seconds / args.decode_tokens))
    for length in (256, 512, 1024, 2000):
        seconds = statistics.median(timed(1, length, 1) for _ in range(5))
        points.append((length, 1, length * length / 2, seconds))
    matrix = np.array([[1.0, tokens, seqs, pairs] for tokens, seqs, pairs, _ in points])
    target = np.array([seconds for *_, seconds in points])
    weights = 1.0 / target  # relative error: the small decode steps matter as much as the big prefills
    solution, *_ = np.linalg.lstsq(matrix * weights[:, None], target * weights, rcond=None)
    names = ("base_s", "per_token_s", "per_seq_s", "per_attention_s")
    fit = {name: float(f"{max(value, 0.0):.4g}") for name, value in zip(names, solution)}
    for (tokens, seqs, pairs, seconds), row in zip(points, matrix):
        model = sum(fit[name] * x for name, x in zip(names, row))
        print(f"tokens={tokens:5d} seqs={seqs:3d} measured={seconds * 1000:8.2f} ms fit={model * 1000:8.2f} ms")
    print(json.dumps(fit))
    if args.out:
        steps = [{"batched_tokens": tokens, "seqs": seqs, "measured_ms": round(seconds * 1000, 3)}
                 for tokens, seqs, _, seconds in points]
        Path(args.out).write_text(json.dumps({"model": args.model, "core": args.core, "steps": steps, "fit": fit},
                                             indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
