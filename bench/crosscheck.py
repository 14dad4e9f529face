"""Check the benchmark's client against an independent one: vLLM's own ``vllm bench serve``.

    python -m bench.crosscheck [--system gateway] [--rate 2] [--prompts 60] [--input 128] [--output 64]

Brings one system up (as ``python -m bench live`` does), then, back to back against the same endpoint,
runs the same load twice: Poisson arrivals at ``--rate``, fixed prompt and output lengths, fresh random
prompts: once with vLLM's benchmark client (``vllm.benchmarks.serve``, its ``random`` dataset), once with
bench/client.py. Prints both clients' median and P99 TTFT and inter-token latency side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from bench.client import drive
from bench.live import LiveRunner, _shaper
from bench.metrics import percentile
from bench.workload import PlannedRequest


def _ours(runner: LiveRunner, system: str, rate: float, prompts: int, input_len: int, output_len: int) -> dict:
    import random

    rng, now, workload = random.Random(5), 0.0, []
    for index in range(prompts):
        now += rng.expovariate(rate)
        workload.append(PlannedRequest(request_id=f"x{index}", tenant="cross", weight=1.0, band="standard",
                                       send_s=now, prompt_tokens=input_len, output_tokens=output_len))
    records = asyncio.run(drive(runner.base_url, runner.model_name, workload, runner.prompts, _shaper(system),
                                lambda _: None))
    served = [r for r in records if r.ok]
    ttft = [r.ttft_s * 1000 for r in served]
    itl = [g * 1000 for r in served for g in r.gaps_s()]
    return {"completed": len(served), "median_ttft_ms": percentile(ttft, 50), "p99_ttft_ms": percentile(ttft, 99),
            "median_itl_ms": percentile(itl, 50), "p99_itl_ms": percentile(itl, 99)}


def _vllm(runner: LiveRunner, rate: float, prompts: int, input_len: int, output_len: int, out_dir: Path) -> dict:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", runner.base_url, "--endpoint", "/v1/completions",
        "--model", runner.model_name, "--tokenizer", str(runner.model_path), "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--random-range-ratio", "0", "--num-prompts", str(prompts),
        "--request-rate", str(rate), "--ignore-eos", "--seed", "5", "--percentile-metrics", "ttft,itl",
        "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(out_dir),
        "--result-filename", "vllm-bench-serve.json", "--disable-tqdm"])
    result = bench_serve(args)
    return {"completed": result.get("completed"), "median_ttft_ms": result.get("median_ttft_ms"),
            "p99_ttft_ms": result.get("p99_ttft_ms"), "median_itl_ms": result.get("median_itl_ms"),
            "p99_itl_ms": result.get("p99_itl_ms")}


def main(argv: list[str] | None = None) -> int:
    """Run both clients against one system and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", default="gateway")
    parser.add_argument("--model", default="tiny", help="tiny or bench (bench/models.py)")
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--prompts", type=int, default=60)
    parser.add_argument("--input", type=int, default=128)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench/results/crosscheck"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runner = LiveRunner(Path("deploy/local.yaml"), 512, args.out, model=args.model)
    try:
        runner.start(args.system)
        theirs = _vllm(runner, args.rate, args.prompts, args.input, args.output, args.out)
        ours = _ours(runner, args.system, args.rate, args.prompts, args.input, args.output)
    finally:
        runner.close()
    comparison = {"system": args.system, "load": vars(args) | {"out": str(args.out)},
                  "vllm_bench_serve": theirs, "bench_client": ours}
    (args.out / "crosscheck.json").write_text(json.dumps(comparison, indent=1))
    print(f"{'':18}{'vllm bench serve':>18}{'bench/client.py':>18}")
    for key in ("completed", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms"):
        a, b = theirs.get(key), ours.get(key)
        print(f"{key:18}{a if a is None else round(a, 2):>18}{b if b is None else round(b, 2):>18}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
