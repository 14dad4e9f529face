"""The application's declarative config: the ``args`` block of the Ray Serve YAML, validated.

``serve run deploy/local.yaml`` hands the YAML ``args`` to :func:`gateway.app.build_app`, which validates
them with :class:`AppConfig` before any deployment starts, so a typo fails at once with the field named.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleet.config import QueueConfig
from gateway.request_parsing import ENGINE_XARGS
from replicas.cpu_binding import CpuBinding
from replicas.engine_settings import EngineSettings


class ModelSource(BaseModel):
    """The model every pool serves."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Served model name: what clients put in the request's `model` field.")
    path: str = Field(description="Hugging Face model folder (or hub id where a hub is reachable).")
    build_tiny_model: bool = Field(
        False, description="Build the tiny random-weight local model at `path` if it is not there yet."
    )
    chat_template_options: list[str] = Field(
        default_factory=list, description="Keys of `chat_template_kwargs` a request may set (options the model's "
        "own chat template reads, e.g. enable_thinking), each to a plain value. The template is the operator's: "
        "a request's own `chat_template`, or any other option, is a 400.",
    )
    extension_args: list[str] = Field(
        default_factory=list, description="Keys of `vllm_xargs` a request may set: arguments the engine's custom "
        "extensions read (e.g. a logits processor's). Any other key is a 400, and so is one vLLM itself reads "
        "(kv_transfer_params, ec_transfer_params, kv_cache_report_mode), which may not be listed.",
    )

    @field_validator("extension_args")
    @classmethod
    def _no_engine_args(cls, keys: list[str]) -> list[str]:
        reserved = sorted(set(keys) & ENGINE_XARGS)
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: vLLM itself reads these; a request may never set them")
        return keys
    simulated: Literal["cpu-tiny", "gpu-h100-llama3-8b"] | None = Field(
        None, description="Replace vLLM by the simulated engine with this cost model (replicas/sim_engine.py: "
        "cpu-tiny, gpu-h100-llama3-8b); the model's tokenizer is still used. For benchmarks at fleet scale.")
    simulated_time_scale: float = Field(
        1.0, ge=1.0, le=1000, description="Slow every simulated engine step by this factor (e.g. 10-20), so a fleet "
        "of simulated replicas is bound by its engines at a request rate the host can drive; every time it "
        "produces is this many times the modelled one.")


# Ray Serve's graceful_shutdown_timeout_s for the pools and the gateway: Serve's own default, 20 s, cuts any
# reply still running when a rolling update or a scale-down stops its replica (2,000 tokens at 10 ms each).
DRAIN_TIMEOUT_S = 300.0
DRAIN_DOC = ("How long a {what} that Serve stops (a rolling update, a scale-down) may keep serving the requests "
             "it holds before Serve kills it, cutting the streams still running; it takes no new work meanwhile, "
             "and leaves as soon as they end. Serve's own default, 20 s, cut any longer reply. 300 (default): "
             "8,000 tokens at 35 ms each. Set it above the longest reply you serve; Serve waits this long at "
             "most per replica it stops, so a stuck request slows an update by this much.")


class PoolConfig(BaseModel):
    """One pool of identical vLLM replicas (one Ray Serve deployment)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Pool name; deployment is vllm-<name>.")
    num_replicas: int = Field(1, ge=1, description="vLLM replicas in this pool.")
    num_cpus: float = Field(1.0, gt=0, description="Ray CPUs reserved per replica actor.")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per replica (set tensor_parallel_size to match).")
    max_ongoing_requests: int = Field(256, ge=1, description="Requests one replica accepts at once.")
    engine: EngineSettings = Field(default_factory=EngineSettings, description="vLLM engine settings.")
    cpu_binding: CpuBinding | None = Field(None, description="CPU builds: cores each replica binds to.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Ray custom resources per replica: pins a pool to the nodes that have them."
    )
    accepts: list[str] | None = Field(
        None, description="Length classes this pool may run at all (None: every class)."
    )
    prefers: list[str] = Field(
        default_factory=list,
        description="Length classes this pool is built for: placement tries it first for them; other "
        "accepted classes spill over onto it only when no preferring replica has room.",
    )
    reserve: int = Field(
        0, ge=0,
        description="Replicas of this pool kept empty while others take the longer classes it takes only when "
        "idle (its guarded classes, docs/global-queue.md), so a burst of its own work always finds a replica "
        "whose steps no long prompt lengthens. 0: any replica holding none of its own work may take them (fully "
        "work-conserving). Worth 1 in a latency pool of up to ~16 replicas: see docs/configuration.md.",
    )
    graceful_shutdown_timeout_s: float = Field(
        DRAIN_TIMEOUT_S, ge=0, description=DRAIN_DOC.format(what="replica"),
    )
    stream_batching_interval_ms: float = Field(
        50, ge=0, le=1000,
        description="A stream's tokens go from replica to client at most once per this interval, joined (the "
        "first token, and one after a quiet interval, go at once), so fewer Serve messages carry them: on 2 "
        "cores it cut the Serve proxy's and the gateway's CPU per streamed request by half. 50 (default) is "
        "Ray Serve LLM's own; 0: every token as its own message. See docs/configuration.md for what was "
        "measured.",
    )

    @model_validator(mode="after")
    def _gpus_for_tensor_parallelism(self) -> PoolConfig:
        # the engine's workers run on the GPUs Ray gives the replica's actor (vLLM's multiprocessing executor)
        size = self.engine.tensor_parallel_size
        if size > 1 and self.num_gpus != size:
            raise ValueError(f"pool {self.name!r}: tensor_parallel_size {size} runs each engine on {size} GPUs, "
                             f"which Ray gives its replica: set num_gpus to {size} (it is {self.num_gpus:g})")
        return self


class GatewayDeploymentConfig(BaseModel):
    """The ingress deployment's size."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = Field(1, ge=1, description="Gateway (ingress) replicas.")
    num_cpus: float = Field(0.25, gt=0, description="Ray CPUs reserved per gateway replica.")
    max_ongoing_requests: int = Field(
        2000, ge=1, description="Requests one gateway replica holds at once; Ray Serve queues the rest, first come "
        "first served, before any tenant is known.",
    )
    crowded_share: float = Field(
        0.9, gt=0, le=1, description="From this share of max_ongoing_requests open on a gateway replica, each tenant "
        "may hold at most an even split of that share among the tenants holding any (then 429 with Retry-After). "
        "A tenant alone stops there, so the rest of the replica stays free for the next tenant to arrive, which "
        "would otherwise queue in Ray Serve behind the flood, first come first served. 1: off.",
    )
    resources: dict[str, float] = Field(default_factory=dict, description="Ray custom resources per replica.")
    graceful_shutdown_timeout_s: float = Field(
        DRAIN_TIMEOUT_S, ge=0, description=DRAIN_DOC.format(what="gateway replica"),
    )
    max_body_bytes: int = Field(
        8 << 20, ge=1024, description="Largest request body accepted (then 413); bounds memory per request."
    )
    dense_body_values: int = Field(
        4096, ge=0, description="A body that could hold more JSON values than this (by its commas and brackets) "
        "is parsed and validated in a child process of the gateway replica (about 650 MB), not beside its event "
        "loop: JSON parsing and validation hold the GIL for the whole call, and a 2 MB chat of 60,000 content "
        "parts held it for 0.8 s, stalling every stream the replica relays. 0: every body in the replica's own "
        "process.",
    )
    max_chat_items: int = Field(
        4096, ge=0, description="Most messages, content parts and tool calls one chat may hold (then 400; 0: no "
        "limit). Each costs 4-36 µs of validation holding the GIL, at the gateway and again on the replica's event "
        "loop beside its streams, and a content part may render to no token, so the context does not bound them: "
        "100,000 empty text parts would fit any context and stall the replica for over a second.",
    )
    max_sequences_per_request: int | None = Field(
        None, ge=1, description="Most engine sequences one request may ask for (prompts of a batch times `n`; "
        "then 400). The queue grants a request one sequence slot, so more would fill an engine past its grant. "
        "Default: the smallest `max_num_seqs` of the pools, what one engine runs at once.",
    )
    max_prompt_logprob_entries: int = Field(
        4096, ge=0, description="Most prompt log-probability entries a request may ask for: its prompt tokens "
        "times one more than its `prompt_logprobs` (or, with `echo`, its `logprobs` / `top_logprobs`); then 400; "
        "0: no limit. The engine computes the whole vocabulary's log-probabilities at every prompt position, and "
        "its replica turns every entry into text before the first token: four 4,000-token prompts with "
        "`prompt_logprobs: 1` at once stalled the local streams for 0.36-1.2 s.",
    )
    max_output_logprob_entries: int = Field(
        4096, ge=0, description="Most output log-probability entries a reply that is not streamed may carry: its "
        "output tokens (`max_tokens`, or what the context leaves when the request takes its end of sequence away) "
        "times one more than its `logprobs` / `top_logprobs`, times its sequences; then 400; 0: no limit; streams "
        "are not limited. The reply is built whole at its end beside the replica's streams: four replies of "
        "1,500 tokens with `logprobs: 20` at once stretched the local streams' longest gap to 0.23-0.48 s "
        "(0.06-0.09 s without), four of 4,095 entries to 0.08-0.14 s.",
    )
    control_tokens_in_messages: Literal["refuse", "allow"] = Field(
        "refuse", description="A chat whose messages, tools or documents spell out one of the model's control "
        "tokens as text (`<|im_end|>`, `<|start_header_id|>`): `refuse` (400), or `allow`. The chat template "
        "renders messages between control tokens and vLLM tokenizes the result whole, so such text becomes the "
        "token itself, and whoever wrote the message (often a tenant's own end user) can end its turn and forge "
        "another role's. OpenAI's API reads it as text; vLLM cannot be told to. `allow` for tenants that send "
        "control tokens on purpose, or a tokenizer whose special tokens are common text (`<s>` of Llama 2).",
    )
    max_structured_output_bytes: int = Field(
        32 << 10, ge=0, description="Largest structured-output spec a request may send, as JSON (its "
        "`response_format`, `structured_outputs`, and its `tools` where `tool_choice` forces one; then 400; 0: no "
        "limit). The replica and its engine compile it to a grammar while that engine's streams wait: four "
        "324 KB schemas at once stalled the local streams for 1.1 s, one of 43 KB compiled in 0.3 s unnoticed.",
    )


class AccessConfig(BaseModel):
    """Who may call: the tenants file, and the explicit anonymous mode for local use."""

    model_config = ConfigDict(extra="forbid")

    tenants_file: str | None = Field(
        None, description="Tenants file (deploy/tenants.yaml): keys (hashed), weights, bands, models, rate limits."
    )
    allow_anonymous: bool = Field(
        False, description="Local use: a request without an Authorization header runs as anonymous_tenant."
    )
    anonymous_tenant: str = Field("anonymous", description="Tenant of anonymous requests (may be in the file).")
    trust_tenant_header: bool = Field(
        False, description="Local use, anonymous requests only: x-tenant-id names the tenant (no authentication)."
    )
    reload_interval_s: float = Field(2.0, gt=0, description="How often each gateway checks the file for changes.")
    isolate_prefix_cache: bool = Field(
        True, description="Give each tenant's requests their own vLLM prefix-cache salt (`cache_salt`, set by the "
        "gateway, a client's own replaced), so no tenant can time another's prompts through shared cache hits. "
        "Costs the cache hits tenants would share (a common system prompt): a fleet whose tenants trust each other "
        "may turn it off. A tenant's own requests share its cache either way.",
    )


SCRAPE_KEY_ENV = "FLEETGATE_SCRAPE_KEY_SHA256"


class MetricsConfig(BaseModel):
    """Prometheus metrics: every gateway and replica publishes its own; any gateway's /metrics shows all."""

    model_config = ConfigDict(extra="forbid")

    publish_interval_s: float = Field(2.0, gt=0, description="How often each process publishes to Redis.")
    tenant_labels: bool = Field(True, description="Label queue and request metrics by tenant.")
    max_tenant_labels: int = Field(
        1000, ge=0, description="Most tenant label values a gateway's metrics carry (each adds a series to every "
        "per-tenant family): past them, tenants share the label `_other`, first come first labelled; the queue "
        "gauges label the tenants with the most waiting. Bounds the series where tenants are many, or named by "
        "`x-tenant-id` in the trusted-header mode. 0: no limit.",
    )
    scrape_key_sha256: str | None = Field(
        default_factory=lambda: os.environ.get(SCRAPE_KEY_ENV) or None, pattern=r"^[0-9a-f]{64}$",
        description="When set, /metrics needs 'Authorization: Bearer <key>' with this SHA-256 (tenant keys do not "
        f"open it); unset, /metrics is open (keep it on the scrapers' network). Default: ${SCRAPE_KEY_ENV}.",
    )
    require_scrape_key: bool = Field(
        False, description="Refuse to start without a scrape key: /metrics shows every tenant's usage, so a "
        "production config (deploy/gpu.yaml) sets this and takes the key's SHA-256 from a Secret.",
    )

    @model_validator(mode="after")
    def _key_when_required(self) -> "MetricsConfig":
        if self.require_scrape_key and not self.scrape_key_sha256:
            raise ValueError(f"metrics.require_scrape_key is set but no scrape key is: set {SCRAPE_KEY_ENV} (the "
                             "SHA-256 of the key scrapers send) or metrics.scrape_key_sha256")
        return self


class AppConfig(BaseModel):
    """Everything ``build_app`` needs: the model, the replica pools and the gateway."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSource
    pools: list[PoolConfig] = Field(min_length=1, description="Replica pools; the first is the default.")
    gateway: GatewayDeploymentConfig = Field(default_factory=GatewayDeploymentConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig, description="The global queue.")
    access: AccessConfig = Field(default_factory=AccessConfig, description="Authentication and tenants.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Prometheus metrics.")
    cache_dir: str = Field(".cache/runtime", description="Where vLLM keeps compile caches and IPC sockets.")

    def sequence_limit(self) -> int:
        """Most engine sequences one request may ask for (``gateway.max_sequences_per_request``, or the smallest
        engine's ``max_num_seqs``)."""
        return self.gateway.max_sequences_per_request or min(pool.engine.max_num_seqs for pool in self.pools)

    def replica_engine_args(self) -> list[str]:
        """The vLLM CLI arguments of the first pool's replicas: the gateway renders chats as they do (a
        ``--chat-template`` in ``engine.extra_args`` included). Every pool serves the one model, and should
        render it alike."""
        return self.pools[0].engine.to_cli_args(self.model.path, self.model.name)

    @field_validator("pools")
    @classmethod
    def _unique_pool_names(cls, pools: list[PoolConfig]) -> list[PoolConfig]:
        names = [pool.name for pool in pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique, got {names}")
        return pools

    @model_validator(mode="after")
    def _every_length_class_has_a_pool(self) -> "AppConfig":
        classes = [c.name for c in self.queue.length_classes]
        for pool in self.pools:
            for name in (pool.accepts or []) + pool.prefers:
                if name not in classes:
                    raise ValueError(f"pool {pool.name!r} names length class {name!r}; classes are {classes}")
        for name in classes:
            if not any(pool.accepts is None or name in pool.accepts for pool in self.pools):
                raise ValueError(f"no pool accepts length class {name!r}: its requests could never run")
        return self

    @model_validator(mode="after")
    def _engines_agree_with_the_queue(self) -> "AppConfig":
        # silent misconfigurations made loud: vLLM ignores a non-zero priority under fcfs (the bands would
        # not reach the engines), and a prompt counted against one context length must fit every pool
        if len(self.queue.bands) > 1 and self.model.simulated is None:  # a simulated fcfs baseline is on purpose
            for pool in self.pools:
                if pool.engine.scheduling_policy == "fcfs":
                    raise ValueError(f"pool {pool.name!r} runs scheduling_policy fcfs, under which vLLM ignores the "
                                     "bands' priorities; set scheduling_policy: priority")
        chats = {pool.name: pool.engine.chat_args() for pool in self.pools}
        if any(args != chats[self.pools[0].name] for args in chats.values()):
            raise ValueError(f"pools disagree on how to render a chat in their extra_args {chats}: the gateway counts "
                             "a chat once, as the first pool renders it, and may place it on any pool; give every "
                             "pool the same")
        lengths = {pool.name: pool.engine.max_model_len for pool in self.pools}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"pools disagree on max_model_len {lengths}: requests are checked against one context "
                             "length and may be placed on any pool; give every pool the same")
        return self

    @model_validator(mode="after")
    def _reserves_leave_room(self) -> "AppConfig":
        from policies.placement import guarded_classes

        order = [c.name for c in self.queue.length_classes]
        for pool in (p for p in self.pools if p.reserve):
            if not guarded_classes(self.pool_accepts(pool), pool.prefers, order):
                raise ValueError(f"pool {pool.name!r} sets reserve {pool.reserve} but takes no class only while idle "
                                 "(one longer than every class it prefers), so the reserve would change nothing")
            if pool.reserve >= pool.num_replicas:
                raise ValueError(f"pool {pool.name!r} would keep all {pool.num_replicas} of its replicas free of the "
                                 f"longer classes (reserve {pool.reserve}); leave them out of its accepts instead")
            # the queue counts a reserve over the replicas that take and prefer the same classes (a placement
            # group), so a pool sharing its group with another would count the other pool's replicas as its own
            twins = [other.name for other in self.pools if other is not pool
                     and sorted(self.pool_accepts(other)) == sorted(self.pool_accepts(pool))
                     and sorted(other.prefers) == sorted(pool.prefers)]
            if twins:
                raise ValueError(f"pool {pool.name!r} sets reserve {pool.reserve} but pool {twins[0]!r} accepts and "
                                 "prefers the same classes, and a reserve counts every such replica; merge the two "
                                 "pools, or make their accepts or prefers differ")
        return self

    def pool_plan(self) -> list[tuple[str, list[str], list[str]]]:
        """(name, accepts, prefers) of every pool, in config order."""
        return [(pool.name, self.pool_accepts(pool), pool.prefers) for pool in self.pools]

    def pool_accepts(self, pool: PoolConfig) -> list[str]:
        """The length classes ``pool`` runs."""
        return pool.accepts if pool.accepts is not None else [c.name for c in self.queue.length_classes]

    def with_absolute_paths(self, base_dir: str) -> "AppConfig":
        """Resolve relative local paths against ``base_dir`` (the directory `serve run` started in).

        A model path that is not a local folder and has no path separator is left alone: a hub id.
        """
        tenants_file = self.access.tenants_file
        if tenants_file is not None:
            tenants_file = os.path.abspath(os.path.join(base_dir, tenants_file))
        model_path = self.model.path
        if self.model.build_tiny_model or os.path.exists(os.path.join(base_dir, model_path)):
            model_path = os.path.abspath(os.path.join(base_dir, model_path))
        return self.model_copy(
            update={
                "model": self.model.model_copy(update={"path": model_path}),
                "cache_dir": os.path.abspath(os.path.join(base_dir, self.cache_dir)),
                "access": self.access.model_copy(update={"tenants_file": tenants_file}),
            }
        )
