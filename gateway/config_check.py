"""Check a `serve run` config before it is deployed: what ``fleetgate check FILE`` prints.

Ray Serve builds the application in a task on the cluster: a config error there is a traceback in the logs,
retried, while `serve run` keeps waiting. This reads the same file here and says, one line per problem, what
building it would refuse (the gateway's config model, with its cross-checks) and whether the tenants file it
names loads against its bands.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

APP_IMPORT_PATH = "gateway.app:build_app"


def check_config(path: Path, base_dir: str | None = None) -> tuple[list[str], list[str]]:
    """(problems, summaries) for the config at ``path``; relative paths in it are read from ``base_dir``
    (default: the current directory, as `serve run` reads them). No problem: the config would build."""
    from gateway.config import AppConfig
    from gateway.tenants import TenantsFile

    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return [f"{path}: {exc}"], []
    applications = [app for app in (document or {}).get("applications") or []
                    if isinstance(app, dict) and app.get("import_path") == APP_IMPORT_PATH]
    if not applications:
        return [f"{path}: no application with import_path {APP_IMPORT_PATH}"], []
    problems: list[str] = []
    summaries: list[str] = []
    for index, application in enumerate(applications):
        where = f"applications[{index}] ({application.get('name', '?')})"
        try:
            config = AppConfig.model_validate(application.get("args") or {}).with_absolute_paths(
                base_dir or os.getcwd())
        except ValidationError as exc:
            problems.extend(f"{where}: {_location(error)}: {error['msg']}" for error in exc.errors())
            continue
        tenants = "no tenants file"
        if config.access.tenants_file is not None:
            try:
                loaded = TenantsFile.read(config.access.tenants_file).check_bands(config.queue.band_names)
                tenants = f"{len(loaded.tenants)} tenants"
            except (OSError, ValueError) as exc:
                problems.append(f"{where}: access.tenants_file: {exc}")
                continue
        pools = ", ".join(f"{pool.name} x{pool.num_replicas}" for pool in config.pools)
        summaries.append(f"{where}: model {config.model.name}, pools {pools}, bands {config.queue.band_names}, "
                         f"{tenants}")
    return problems, summaries


def _location(error: Any) -> str:
    return ".".join(["args", *(str(part) for part in error.get("loc", ()))])
