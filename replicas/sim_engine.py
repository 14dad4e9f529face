"""A simulated vLLM engine: vLLM V1's chunked-prefill scheduler driven by a calibrated step-time model.

It has no weights and no clock of its own. Each step it decides, as vLLM V1's scheduler does, which
requests run and how many tokens each gets, and says how long that step takes under a cost model; the
caller advances time (a discrete-event simulation in ``bench/des.py``, or ``asyncio.sleep`` in the
simulated Ray Serve replica). What it reproduces from vLLM V1 (``vllm/v1/core/sched/scheduler.py``):

* running requests are scheduled first, in order: a decoding request gets one token, a request still in
  its prefill gets its next chunk; then waiting requests are admitted while the step's token budget
  (``max_num_batched_tokens``) and ``max_num_seqs`` allow, their prefill chunked to what is left;
* ``long_prefill_token_threshold`` caps the tokens one request gets per step;
* ``fcfs`` admits waiting requests by arrival; ``priority`` by (priority, arrival), lower value first;
* the step that completes a prompt's prefill also samples its first output token.

It reports what vLLM's scheduler stats report (running, waiting, KV usage: the tokens its running requests
hold over ``kv_tokens``) and which requests have not started (waiting, or still prefilling), so the global
queue's gate sees from it what it sees from vLLM.

What it leaves out: KV-cache exhaustion and the preemption it causes (the usage is reported, never
enforced: size the KV cache so it does not run out, or read the figures as an upper bound), prefix caching
(benchmarks send fresh prompts), speculative decoding, and CPU-side overheads beyond the cost model's
constant term.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from policies.step_budget import StepBudget, step_budget


class StepCostModel(BaseModel):
    """Time of one engine step: ``base + per_token * tokens + per_seq * seqs + per_attention * pairs``.

    ``tokens`` are the tokens computed in the step (prefill chunks plus one per decode), ``seqs`` the
    requests in the batch, and ``pairs`` the attention work: for each request, its new tokens times the
    context they attend to (what is cached plus half the chunk), so a long prefill costs more than linearly.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_s: float = Field(ge=0, description="Fixed cost of a step (launch, sampling, scheduling).")
    per_token_s: float = Field(ge=0, description="Cost per computed token (the matmuls).")
    per_seq_s: float = Field(0.0, ge=0, description="Cost per request in the batch.")
    per_attention_s: float = Field(0.0, ge=0, description="Cost per (new token x context token) pair.")
    source: str = Field("", description="Where the figures come from.")

    def slowed(self, factor: float) -> "StepCostModel":
        """The same engine ``factor`` times slower (e.g. sharing its core with another)."""
        return self.model_copy(update={name: getattr(self, name) * factor for name in
                                       ("base_s", "per_token_s", "per_seq_s", "per_attention_s")})

    def step_s(self, batched_tokens: int, seqs: int, attention_pairs: float) -> float:
        """Seconds one step takes."""
        return (self.base_s + self.per_token_s * batched_tokens + self.per_seq_s * seqs
                + self.per_attention_s * attention_pairs)


# Calibrated on this project's machine (2 cores, AVX-512) against real vLLM 0.32 CPU serving the tiny local
# model with enforce_eager on one core: `python -m bench.calibrate` (relative-error least squares over decode
# steps at batch 1-64 and single prefills of 256-2000 tokens; every point within 11% of the fit).
CPU_TINY_MODEL = StepCostModel(
    base_s=0.003123, per_token_s=2.854e-05, per_seq_s=5.006e-05, per_attention_s=8.464e-09,
    source="python -m bench.calibrate on this machine: vLLM 0.32 CPU, tiny-llama, 1 core, enforce_eager",
)

# The bench model (replicas/tiny_model/build.py, size "bench": hidden 768, 8 layers) the same way, on one
# core: `python -m bench.calibrate --model bench` (bench/results/calibrate/bench-model.json).
CPU_BENCH_MODEL = StepCostModel(
    base_s=0.009305, per_token_s=0.0005559, per_seq_s=6.625e-05, per_attention_s=3.076e-07,
    source="python -m bench.calibrate --model bench on this machine: vLLM 0.32 CPU, 1 core, enforce_eager",
)

# Llama-3-8B (bf16) on one H100 SXM, from the roofline of published figures, not a measurement here:
# a step reads the 16 GB of weights at ~3.35 TB/s HBM3 (~4.8 ms) plus ~1.5 ms of launch and sampling
# overhead; each computed token costs 2 x 8e9 FLOPs at ~50% of 989 dense bf16 TFLOP/s (~32 us); each
# decoding request reads its KV cache, 128 KiB per context token (32 layers x 8 KV heads x 128 dims x K,V x
# 2 bytes), taken at a 2k-token context (~78 us); prefill attention costs 4 x 4096 x 32 FLOPs per token
# pair (~1 ns at that rate).
GPU_H100_LLAMA3_8B = StepCostModel(
    base_s=0.0063, per_token_s=0.000032, per_seq_s=0.000078, per_attention_s=1.0e-09,
    source="roofline from the H100 SXM datasheet (3.35 TB/s, 989 TFLOP/s bf16) for Llama-3-8B; not measured",
)

COST_MODELS = {"cpu-tiny": CPU_TINY_MODEL, "cpu-bench": CPU_BENCH_MODEL, "gpu-h100-llama3-8b": GPU_H100_LLAMA3_8B}


class SimEngineSettings(BaseModel):
    """The scheduler knobs the simulated engine honours (the same names as vLLM's engine arguments)."""

    model_config = ConfigDict(extra="ignore")  # a pool's full vLLM engine block may be passed as is

    max_num_batched_tokens: int = Field(2048, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    long_prefill_token_threshold: int = Field(0, ge=0, description="0: no per-request cap.")
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    guarded_step_tokens: int | None = Field(None, ge=1, description="The step while it holds only guarded work.")
    guarded_prefill_chunk: int = Field(0, ge=0)
    own_prompt_limit: int | None = Field(None, ge=1, exclude=True,  # set by the replica from its spec
                                         description="Longest prompt of its pool's own work, when it guards "
                                         "longer classes (policies/step_budget.py); None: one step.")

    def step_budget(self) -> StepBudget | None:
        """Its two steps, as the vLLM replica's scheduler picks them; None when it has one."""
        return step_budget(self.max_num_batched_tokens, self.long_prefill_token_threshold, self.guarded_step_tokens,
                           self.guarded_prefill_chunk, self.own_prompt_limit)


@dataclass
class SimRequest:
    """One request inside the simulated engine."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    arrival_s: float = 0.0
    computed: int = 0  # prompt tokens already prefilled
    generated: int = 0  # output tokens produced

    @property
    def prefilling(self) -> bool:
        """True until the whole prompt has been computed."""
        return self.computed < self.prompt_tokens

    @property
    def finished(self) -> bool:
        """True once every output token has been produced."""
        return self.generated >= self.output_tokens


@dataclass
class StepPlan:
    """What one step computes: (request, tokens) in batch order, and how long the step takes."""

    work: list[tuple[SimRequest, int]]
    duration_s: float
    admitted: list[SimRequest] = field(default_factory=list)  # left the waiting queue in this step


@dataclass
class StepOutcome:
    """What a finished step produced: requests that emitted a token, and those that finished."""

    emitted: list[SimRequest] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)


class SimEngine:
    """vLLM V1's scheduling loop over simulated requests; the caller owns time."""

    def __init__(self, settings: SimEngineSettings, cost: StepCostModel, kv_tokens: int = 0) -> None:
        self.settings = settings
        self._budget = settings.step_budget()
        self.cost = cost
        self.kv_tokens = kv_tokens
        self.running: list[SimRequest] = []
        self._waiting: list[tuple[tuple, SimRequest]] = []
        self._order = itertools.count()
        self._aborted: set[str] = set()

    @property
    def waiting(self) -> int:
        """Requests waiting for admission."""
        return len(self._waiting)

    @property
    def unfinished(self) -> int:
        """Requests running or waiting."""
        return len(self.running) + len(self._waiting)

    @property
    def unstarted(self) -> int:
        """Requests that have not produced a first token: waiting, or still prefilling."""
        return len(self._waiting) + sum(1 for request in self.running if request.prefilling)

    @property
    def unstarted_tokens(self) -> int:
        """Their prompt tokens, each up to the prefill chunk (``long_prefill_token_threshold``, or the budget)."""
        chunk = self.settings.long_prefill_token_threshold or self.settings.max_num_batched_tokens
        return (sum(min(request.prompt_tokens, chunk) for _, request in self._waiting)
                + sum(min(request.prompt_tokens, chunk) for request in self.running if request.prefilling))

    @property
    def kv_usage(self) -> float:
        """The share of ``kv_tokens`` its running requests hold (0 when no size is given)."""
        held = sum(request.computed + request.generated for request in self.running)
        return held / self.kv_tokens if self.kv_tokens else 0.0

    def has_work(self) -> bool:
        """True when a step would compute something."""
        return bool(self.running or self._waiting)

    def add(self, request: SimRequest) -> None:
        """Queue a request (it joins the next step the budget allows)."""
        if self.settings.scheduling_policy == "priority":
            key = (request.priority, request.arrival_s, next(self._order))
        else:
            key = (next(self._order),)
        heapq.heappush(self._waiting, (key, request))

    def abort(self, request_id: str) -> None:
        """Drop a request (its client went away); it leaves at the next step boundary."""
        self._aborted.add(request_id)

    def plan_step(self) -> StepPlan:
        """Choose this step's batch as vLLM V1 does and price it."""
        self._drop_aborted()
        budget, cap = self.settings.max_num_batched_tokens, self.settings.long_prefill_token_threshold
        if self._budget is not None:
            held = itertools.chain(self.running, (request for _, request in self._waiting))
            budget, cap = self._budget.for_prompts(request.prompt_tokens for request in held)
        if len(self.running) + len(self._waiting) <= 1:
            cap = 0  # as vLLM: the per-request cap protects others, so a lone request takes the whole budget
        cap = cap or budget
        work: list[tuple[SimRequest, int]] = []
        admitted: list[SimRequest] = []
        for request in self.running:
            if budget <= 0:
                break
            tokens = min(request.prompt_tokens - request.computed, budget, cap) if request.prefilling else 1
            work.append((request, tokens))
            budget -= tokens
        while budget > 0 and self._waiting and len(self.running) < self.settings.max_num_seqs:
            _, request = heapq.heappop(self._waiting)
            tokens = min(request.prompt_tokens - request.computed, budget, cap)
            self.running.append(request)
            admitted.append(request)
            work.append((request, tokens))
            budget -= tokens
        batched = sum(tokens for _, tokens in work)
        pairs = sum(tokens * (request.computed + request.generated + tokens / 2) for request, tokens in work)
        return StepPlan(work, self.cost.step_s(batched, len(work), pairs) if work else 0.0, admitted)

    def finish_step(self, plan: StepPlan) -> StepOutcome:
        """Apply a planned step: advance prefills, emit tokens, retire finished requests."""
        outcome = StepOutcome()
        for request, tokens in plan.work:
            if request.prefilling:
                request.computed += tokens
                if request.prefilling:
                    continue  # more chunks to go; no token yet
            request.generated += 1
            outcome.emitted.append(request)
            if request.finished:
                outcome.finished.append(request)
        if outcome.finished:
            done = {id(request) for request in outcome.finished}
            self.running = [request for request in self.running if id(request) not in done]
        return outcome

    def _drop_aborted(self) -> None:
        if not self._aborted:
            return
        self.running = [r for r in self.running if r.request_id not in self._aborted]
        kept = [(key, r) for key, r in self._waiting if r.request_id not in self._aborted]
        if len(kept) != len(self._waiting):
            heapq.heapify(kept)
            self._waiting = kept
        self._aborted.clear()


def simulate_alone(engine: SimEngine, requests: Iterable[SimRequest]) -> float:
    """Run ``requests`` (all present at time 0) to completion; return the simulated seconds taken."""
    for request in requests:
        engine.add(request)
    elapsed = 0.0
    while engine.has_work():
        plan = engine.plan_step()
        elapsed += plan.duration_s
        engine.finish_step(plan)
    return elapsed
