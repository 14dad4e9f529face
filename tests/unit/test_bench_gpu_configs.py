"""bench/gpu.sh's configs fit the GPUs found: every GPU used once, none twice, on one GPU or several."""

from __future__ import annotations

import pytest

from bench.gpu_configs import baseline_config, gateway_config
from gateway.config import AppConfig


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_the_pools_and_the_baseline_take_exactly_the_gpus_there_are(gpus: int) -> None:
    args = gateway_config(gpus)["applications"][0]["args"]
    config = AppConfig.model_validate(args)  # still a valid gateway config
    assert sum(pool.num_replicas * pool.num_gpus for pool in config.pools) == gpus
    assert all(pool.num_replicas >= 1 for pool in config.pools)
    assert config.pools[0].reserve == (1 if gpus >= 4 else 0)  # deploy/gpu.yaml's, where the pool has room
    baseline = baseline_config(gpus)["applications"][0]["args"]
    assert baseline["replicas"] == gpus and baseline["placement_group_config"]["bundles"] == [{"GPU": 1, "CPU": 2}]
    assert baseline["engine_kwargs"]["max_model_len"] == config.pools[0].engine.model_dump()["max_model_len"]
