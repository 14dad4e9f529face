"""The Serve YAML's args block: the shipped configs validate, mistakes fail with the field named."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gateway.config import AppConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture(autouse=True)
def scrape_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The production config requires a scrape key: the environment gives its SHA-256, as the RayService does."""
    monkeypatch.setenv("FLEETGATE_SCRAPE_KEY_SHA256", "ab" * 32)


@pytest.mark.parametrize("config_file", ["local.yaml", "gpu.yaml"])
def test_shipped_configs_validate(config_file: str) -> None:
    document = yaml.safe_load((DEPLOY / config_file).read_text())
    (application,) = document["applications"]
    assert application["import_path"] == "gateway.app:build_app"
    config = AppConfig.model_validate(application["args"])
    assert config.pools, "at least one replica pool"
    assert config.access.isolate_prefix_cache  # no tenant times another's prompts through the prefix cache


@pytest.mark.parametrize("config_file", ["local.yaml", "gpu.yaml"])
def test_shipped_configs_pass_vllms_checks_and_run_a_tool_call_parser_in_every_pool(config_file: str) -> None:
    """Agent clients send tools with tool_choice "auto" (the default), which vLLM serves only with both flags;
    each pool's arguments pass vLLM's parser and serve-time checks, and name a parser vLLM has (a misspelt
    one would stop the replicas only on the machine that runs them)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    (application,) = yaml.safe_load((DEPLOY / config_file).read_text())["applications"]
    config = AppConfig.model_validate(application["args"])
    for pool in config.pools:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(
            pool.engine.to_cli_args(config.model.path, config.model.name))
        validate_parsed_serve_args(args)
        assert args.enable_auto_tool_choice and args.tool_call_parser, pool.name
        assert ToolParserManager.get_tool_parser(args.tool_call_parser) is not None


def test_local_config_is_two_cpu_replicas_with_explicit_cpus() -> None:
    document = yaml.safe_load((DEPLOY / "local.yaml").read_text())
    assert document["http_options"] == {"host": "127.0.0.1", "port": 8000}
    config = AppConfig.model_validate(document["applications"][0]["args"])
    assert sum(pool.num_replicas for pool in config.pools) == 2
    assert all(pool.num_cpus > 0 and pool.num_gpus == 0 for pool in config.pools)
    assert config.gateway.num_cpus > 0
    assert config.model.build_tiny_model


def test_every_deployment_drains_its_streams_for_the_configured_time() -> None:
    """Serve's own 20 s would cut longer replies when an update or a scale-down stops a replica (its
    deployment options; the faults suite's test_scaling shows a stream outliving it)."""
    from gateway.app import build_app

    args = _minimal(gateway={"graceful_shutdown_timeout_s": 90},
                    pools=[{"name": "a"}, {"name": "b", "graceful_shutdown_timeout_s": 600}])
    gateway = build_app(args)._bound_deployment
    pools = {app._bound_deployment.name: app._bound_deployment for app in gateway.init_args[0].values()}
    drains = {d.name: d._deployment_config.graceful_shutdown_timeout_s for d in [gateway, *pools.values()]}
    assert drains == {"gateway": 90, "vllm-a": 300, "vllm-b": 600}


def _minimal(**overrides) -> dict:
    args = {"model": {"name": "m", "path": "models/m"}, "pools": [{"name": "default"}]}
    args.update(overrides)
    return args


def test_duplicate_pool_names_fail() -> None:
    with pytest.raises(ValidationError, match="pool names must be unique"):
        AppConfig.model_validate(_minimal(pools=[{"name": "a"}, {"name": "a"}]))


@pytest.mark.parametrize("num_gpus", [0, 1, 4])
def test_a_tensor_parallel_engine_without_its_gpus_fails_loudly(num_gpus: int) -> None:
    pool = {"name": "big", "num_gpus": num_gpus, "engine": {"tensor_parallel_size": 2}}
    with pytest.raises(ValidationError, match="set num_gpus to 2"):
        AppConfig.model_validate(_minimal(pools=[pool]))
    AppConfig.model_validate(_minimal(pools=[{**pool, "num_gpus": 2}]))
    AppConfig.model_validate(_minimal(pools=[{"name": "shared", "num_gpus": 0.5}]))  # one GPU, two engines


def test_misspelt_field_fails() -> None:
    with pytest.raises(ValidationError, match="num_replica"):
        AppConfig.model_validate(_minimal(pools=[{"name": "a", "num_replica": 2}]))


def test_relative_paths_resolve_against_the_start_directory(tmp_path: Path) -> None:
    config = AppConfig.model_validate(_minimal(model={"name": "m", "path": "m", "build_tiny_model": True}))
    resolved = config.with_absolute_paths(str(tmp_path))
    assert resolved.model.path == str(tmp_path / "m")
    assert resolved.cache_dir == str(tmp_path / ".cache" / "runtime")


def test_hub_id_is_left_alone(tmp_path: Path) -> None:
    config = AppConfig.model_validate(_minimal(model={"name": "m", "path": "org/model"}))
    assert config.with_absolute_paths(str(tmp_path)).model.path == "org/model"


def test_kuberay_rayservice_serves_the_gpu_config() -> None:
    service = yaml.safe_load((DEPLOY / "kuberay" / "rayservice.yaml").read_text())
    assert service["kind"] == "RayService"
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
    (application,) = serve_config["applications"]
    (gpu_application,) = yaml.safe_load((DEPLOY / "gpu.yaml").read_text())["applications"]
    AppConfig.model_validate(application["args"])
    gpu_args = gpu_application["args"]
    gpu_args["queue"].pop("redis_url")  # the manifest takes REDIS_URL from a Secret
    assert {**application["args"], "cache_dir": gpu_args["cache_dir"]} == gpu_args
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "REDIS_URL", "valueFrom": {"secretKeyRef": {"name": "fleetgate-redis", "key": "url"}}} in head["env"]
    assert any(m["mountPath"] == "/etc/fleetgate" for m in head["volumeMounts"])
    redis_docs = list(yaml.safe_load_all((DEPLOY / "kuberay" / "redis.yaml").read_text()))
    assert {d["kind"] for d in redis_docs} == {"Deployment", "Service"}


def _local_args() -> dict:
    return yaml.safe_load((DEPLOY / "local.yaml").read_text())["applications"][0]["args"]


def test_fcfs_engines_under_priority_bands_fail_loudly() -> None:
    args = _local_args()
    args["pools"][1]["engine"]["scheduling_policy"] = "fcfs"
    with pytest.raises(ValidationError, match="fcfs"):
        AppConfig.model_validate(args)


def test_pools_that_would_render_a_chat_differently_fail_loudly() -> None:
    args = _local_args()
    template = ["--chat-template", "/templates/tools.jinja"]
    args["pools"][0]["engine"]["extra_args"] = [*template, "--enable-prefix-caching"]
    with pytest.raises(ValidationError, match="pools disagree on how to render a chat"):
        AppConfig.model_validate(args)
    args["pools"][1]["engine"]["extra_args"] = ["--max-num-partial-prefills", "2", *template]  # other flags differ
    config = AppConfig.model_validate(args)
    assert config.replica_engine_args()[-3:] == [*template, "--enable-prefix-caching"]
    args["pools"][1]["engine"]["extra_args"] = ["--chat-template=/templates/tools.jinja"]  # spelt otherwise
    AppConfig.model_validate(args)
    args["pools"][1]["engine"]["extra_args"] = ["--chat-template=/templates/other.jinja"]
    with pytest.raises(ValidationError, match="pools disagree"):
        AppConfig.model_validate(args)
    # the hosts the replicas fetch media from decide which chats the gateway takes: every value counts
    args["pools"][0]["engine"]["extra_args"] = ["--allowed-media-domains", "a.example", "b.example", "--seed", "1"]
    args["pools"][1]["engine"]["extra_args"] = ["--allowed-media-domains", "a.example"]
    with pytest.raises(ValidationError, match="pools disagree"):
        AppConfig.model_validate(args)
    args["pools"][1]["engine"]["extra_args"] = ["--allowed-media-domains", "a.example", "b.example"]
    AppConfig.model_validate(args)


@pytest.mark.parametrize(("pool", "reserve", "message"), [
    (0, 1, "leave them out of its accepts"),  # the local latency pool has one replica
    (1, 1, "would change nothing"),  # the throughput pool prefers the longest class: it guards none
])
def test_a_reserve_that_cannot_do_what_it_says_fails_loudly(pool: int, reserve: int, message: str) -> None:
    args = _local_args()
    args["pools"][pool]["reserve"] = reserve
    with pytest.raises(ValidationError, match=message):
        AppConfig.model_validate(args)
    args["pools"][0]["num_replicas"] = 2
    args["pools"][1]["reserve"] = 0
    args["pools"][0]["reserve"] = 1
    assert AppConfig.model_validate(args).pools[0].reserve == 1


def test_a_reserve_on_a_pool_whose_twin_shares_its_placement_group_fails_loudly() -> None:
    args = _local_args()
    args["pools"][0]["num_replicas"] = 2
    args["pools"][0]["reserve"] = 1
    twin = {**args["pools"][0], "name": "latency-b", "reserve": 0}
    args["pools"].append(twin)
    with pytest.raises(ValidationError, match="'latency-b' accepts and prefers the same classes"):
        AppConfig.model_validate(args)
    twin["prefers"] = ["short", "long"]
    assert AppConfig.model_validate(args).pools[0].reserve == 1


def test_pools_that_disagree_on_the_context_length_fail_loudly() -> None:
    args = _local_args()
    args["pools"][0]["engine"]["max_model_len"] = 2048
    with pytest.raises(ValidationError, match="max_model_len"):
        AppConfig.model_validate(args)


def test_a_redis_url_from_the_environment_is_not_a_silent_override(monkeypatch, caplog) -> None:
    import fleet.config
    from fleet.config import QueueConfig

    monkeypatch.setattr(fleet.config, "_OVERRIDE_LOGGED", [])
    monkeypatch.setenv("REDIS_URL", "redis://:secret@elsewhere:6379/0")
    with caplog.at_level("WARNING"):
        assert QueueConfig(redis_url="redis://127.0.0.1:6379/0").resolved_redis_url().endswith("elsewhere:6379/0")
    assert "overrides queue.redis_url" in caplog.text and "secret" not in caplog.text


def test_the_production_config_refuses_to_start_with_metrics_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETGATE_SCRAPE_KEY_SHA256")
    args = yaml.safe_load((DEPLOY / "gpu.yaml").read_text())["applications"][0]["args"]
    with pytest.raises(ValidationError, match="FLEETGATE_SCRAPE_KEY_SHA256"):
        AppConfig.model_validate(args)
    assert AppConfig.model_validate(_local_args()).metrics.scrape_key_sha256 is None  # local: open, on 127.0.0.1
