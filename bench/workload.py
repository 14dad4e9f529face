"""The workload generator: one YAML file per scenario (bench/scenarios/), seeded, open-loop.

A scenario names tenants; each tenant has a weight, a band, an arrival process over an active window and
prompt / output length distributions, and may open every prompt with one of a few shared prefixes (a system
prompt, a document several questions are asked about) that a prefix cache can reuse. Prompt lengths are
fractions of the model's context when given as ``context_fraction`` (so the same scenario fits a 4k tiny
model and a 128k production model), or tokens.
``generate`` turns a scenario into the list of planned requests, sorted by send time; the same seed gives
the same list, so every system in a comparison gets the same arrivals and lengths.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class LengthDistribution(BaseModel):
    """Token counts: fixed, uniform, or lognormal (median, sigma), clipped to [min, max]."""

    model_config = ConfigDict(extra="forbid")

    dist: Literal["fixed", "uniform", "lognormal"] = "fixed"
    value: float | None = Field(None, gt=0, description="fixed: the length.")
    min: float = Field(1, gt=0)
    max: float = Field(1_000_000, gt=0)
    median: float | None = Field(None, gt=0, description="lognormal: the median.")
    sigma: float = Field(0.5, ge=0, description="lognormal: the spread.")
    context_fraction: bool = Field(
        False, description="value/min/max/median are fractions of the model's context, not tokens.")

    def draw(self, rng: random.Random, context: int) -> int:
        """One length in tokens."""
        scale = context if self.context_fraction else 1
        low, high = max(1, int(self.min * scale)), max(1, int(self.max * scale))
        if self.dist == "fixed":
            value = (self.value or self.min) * scale
        elif self.dist == "uniform":
            value = rng.uniform(low, high)
        else:
            value = rng.lognormvariate(0, self.sigma) * (self.median or self.min) * scale
        return int(min(max(value, low), high))


class ArrivalProcess(BaseModel):
    """Open-loop arrivals at ``rate`` req/s inside [start_s, end_s): Poisson, or gamma with a coefficient of
    variation above 1 for bursty traffic."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["poisson", "gamma"] = "poisson"
    rate: float = Field(gt=0, description="Mean requests per second while active.")
    cv: float = Field(1.0, gt=0, description="gamma: coefficient of variation of the gaps (1 = Poisson).")
    start_s: float = Field(0.0, ge=0)
    end_s: float | None = Field(None, description="None: until the scenario ends.")

    def times(self, rng: random.Random, duration_s: float, rate_scale: float) -> list[float]:
        """Send times (seconds from the start) inside the window."""
        rate = self.rate * rate_scale
        end = min(self.end_s if self.end_s is not None else duration_s, duration_s)
        shape = 1.0 / (self.cv ** 2) if self.kind == "gamma" else 1.0
        times, now = [], self.start_s
        while True:
            now += rng.gammavariate(shape, 1.0 / (rate * shape))
            if now >= end:
                return times
            times.append(now)


class SharedPrefix(BaseModel):
    """Every prompt of the tenant opens with one of ``groups`` prefixes (chosen uniformly), each of a length
    drawn once; the tenant's ``prompt`` distribution is then the part after it, fresh per request."""

    model_config = ConfigDict(extra="forbid")

    groups: int = Field(ge=1, description="Distinct prefixes the tenant's prompts share.")
    tokens: LengthDistribution = Field(description="Each prefix's length.")


class TenantLoad(BaseModel):
    """One tenant's traffic."""

    model_config = ConfigDict(extra="forbid")

    id: str
    weight: float = Field(1.0, gt=0)
    band: str = "standard"
    arrivals: list[ArrivalProcess] = Field(min_length=1)
    prompt: LengthDistribution
    output: LengthDistribution
    shared_prefix: SharedPrefix | None = None


class Slo(BaseModel):
    """The service objective goodput is measured against: TTFT per band, and time per output token."""

    model_config = ConfigDict(extra="forbid")

    ttft_s: dict[str, float] = Field(default_factory=lambda: {"interactive": 1.0, "standard": 5.0, "batch": 60.0})
    tpot_s: float = Field(0.25, gt=0, description="Mean gap between output tokens, per request.")


class Scenario(BaseModel):
    """A benchmark scenario, as written in bench/scenarios/<name>.yaml."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    seed: int = 1
    duration_s: float = Field(gt=0, description="Arrivals stop after this; the run waits for the tail.")
    context_tokens: int = Field(4096, ge=16, description="The model's context the fractions refer to.")
    tenants: list[TenantLoad] = Field(min_length=1)
    slo: Slo = Field(default_factory=Slo)
    fairness_window_s: float = Field(5.0, gt=0, description="Window for Jain's index over weighted service.")
    reference_without: list[str] = Field(
        default_factory=list, description="Tenants left out of the reference runs (the same load without them).")
    offered_load: float | None = Field(
        None, gt=0, description="Offered load as a multiple of the fleet's capacity for this mix: a live run "
                                "scales the rates to it on any host (bench/capacity.py), unless --rate-scale is given.")

    @model_validator(mode="after")
    def _unique_tenants(self) -> "Scenario":
        ids = [tenant.id for tenant in self.tenants]
        if len(set(ids)) != len(ids):
            raise ValueError(f"tenant ids must be unique: {ids}")
        return self

    @property
    def shares_prefixes(self) -> bool:
        """Whether any tenant's prompts open with shared prefixes (where prefix-aware routing matters)."""
        return any(tenant.shared_prefix is not None for tenant in self.tenants)

    def dilated(self, time_scale: float) -> "Scenario":
        """The scenario on engines ``time_scale`` times slower: its objectives and windows that much longer
        (its rates are divided and its duration multiplied by the caller, through ``generate``'s scales)."""
        slo = Slo(ttft_s={band: s * time_scale for band, s in self.slo.ttft_s.items()},
                  tpot_s=self.slo.tpot_s * time_scale)
        return self.model_copy(update={"slo": slo, "fairness_window_s": self.fairness_window_s * time_scale})

    @classmethod
    def load(cls, path: str | Path) -> "Scenario":
        """Read and validate a scenario file."""
        return cls.model_validate(yaml.safe_load(Path(path).read_text()))


class PlannedRequest(BaseModel):
    """One request of the workload: who sends it, when, and how big it is."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    tenant: str
    weight: float
    band: str
    send_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_id: str | None = None  # the shared prefix the prompt opens with (the same text in every system)
    prefix_tokens: int = 0  # of prompt_tokens


def generate(scenario: Scenario, rate_scale: float = 1.0, duration_scale: float = 1.0,
             context_tokens: int | None = None) -> list[PlannedRequest]:
    """The scenario's requests, sorted by send time (same seed, same list).

    ``rate_scale`` multiplies every rate (a fleet N times larger takes N times the load);
    ``duration_scale`` stretches the run and every window; ``context_tokens`` overrides the model context.
    Prompt plus output always fit the context; a shared prefix is cut to leave room for one fresh token.
    """
    rng = random.Random(scenario.seed)
    context = context_tokens or scenario.context_tokens
    duration = scenario.duration_s * duration_scale
    planned: list[PlannedRequest] = []
    for tenant in scenario.tenants:
        times: list[float] = []
        for process in tenant.arrivals:
            window = process.model_copy(update={
                "start_s": process.start_s * duration_scale,
                "end_s": None if process.end_s is None else process.end_s * duration_scale})
            times.extend(window.times(rng, duration, rate_scale))
        prefixes = _prefixes(scenario.name, tenant, rng, context)
        for index, send_s in enumerate(sorted(times)):
            output = tenant.output.draw(rng, context)
            prompt = min(tenant.prompt.draw(rng, context), context - output - 8)
            prefix_id, prefix = rng.choice(prefixes) if prefixes else (None, 0)
            prefix = min(prefix, context - output - 9)
            planned.append(PlannedRequest(request_id=f"{scenario.name}-{tenant.id}-{index}", tenant=tenant.id,
                                          weight=tenant.weight, band=tenant.band, send_s=send_s,
                                          prompt_tokens=max(1, min(prefix + prompt, context - output - 8)),
                                          output_tokens=output, prefix_id=prefix_id, prefix_tokens=max(0, prefix)))
    planned.sort(key=lambda request: (request.send_s, request.request_id))
    return planned


def _prefixes(scenario: str, tenant: TenantLoad, rng: random.Random, context: int) -> list[tuple[str, int]]:
    """(id, length) of the tenant's shared prefixes; none (and no draw, so other scenarios keep their
    sequence) for a tenant without them."""
    if tenant.shared_prefix is None:
        return []
    spec = tenant.shared_prefix
    return [(f"{scenario}-{tenant.id}-prefix-{group}", spec.tokens.draw(rng, context)) for group in range(spec.groups)]


def busiest_rate(workload: list[PlannedRequest], window_s: float = 1.0) -> float:
    """The most requests sent in any ``window_s`` of ``workload``, per second: what the host side (proxy,
    gateways, load client) must take in at the scenario's peak, against its average."""
    sends = sorted(request.send_s for request in workload)
    most, start = 0, 0
    for end, sent in enumerate(sends):
        while sent - sends[start] >= window_s:
            start += 1
        most = max(most, end - start + 1)
    return most / window_s
