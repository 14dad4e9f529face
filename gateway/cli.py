"""The ``fleetgate`` command: manage the tenants file, watch the fleet.

    fleetgate tenants add-key FILE TENANT [--key-id ID] [--create]   make a key, store its hash, print it once
    fleetgate tenants revoke-key FILE TENANT KEY_ID                   remove a key
    fleetgate tenants check FILE [--config deploy/local.yaml]         validate the file against the bands
    fleetgate check CONFIG                                             what building the config would refuse
    fleetgate status [--config deploy/local.yaml] [--watch SECONDS]   bands, tenants, replicas, gateways

Editing keeps the file's comments and layout (ruamel.yaml) and replaces it atomically, so a gateway
reloading it never reads half a file.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gateway.tenants import ApiKey, Tenant, TenantsFile, hash_key, new_key

MIN_WATCH_S = 0.2  # a redraw reads the whole queue's state from Redis


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fleetgate``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, KeyError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # str(KeyError) adds quotes
        print(f"fleetgate: {message}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetgate", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(required=True)
    tenants = commands.add_parser("tenants", help="manage the tenants file").add_subparsers(required=True)

    add = tenants.add_parser("add-key", help="make an API key for a tenant; prints it once")
    add.add_argument("file")
    add.add_argument("tenant")
    add.add_argument("--key-id", help="name of the key (default: key-<date>-<random>)")
    add.add_argument("--create", action="store_true", help="add the tenant (weight 1, every band) if missing")
    add.set_defaults(run=_add_key)

    revoke = tenants.add_parser("revoke-key", help="remove one of a tenant's keys")
    revoke.add_argument("file")
    revoke.add_argument("tenant")
    revoke.add_argument("key_id")
    revoke.set_defaults(run=_revoke_key)

    check = tenants.add_parser("check", help="validate a tenants file")
    check.add_argument("file")
    check.add_argument("--config", default="deploy/local.yaml", help="Serve config whose bands to check against")
    check.set_defaults(run=_check)

    check_config = commands.add_parser("check", help="check a serve run config before deploying it")
    check_config.add_argument("config", help="the Serve config file (e.g. deploy/gpu.yaml)")
    check_config.set_defaults(run=_check_config)

    status = commands.add_parser("status", help="the live state of the global queue")
    status.add_argument("--config", default="deploy/local.yaml", help="Serve config (namespace, bands, Redis URL)")
    status.add_argument("--redis-url", help="Redis URL (default: REDIS_URL, else the config's)")
    status.add_argument("--watch", type=_watch_interval, metavar="SECONDS",
                        help=f"redraw every SECONDS (at least {MIN_WATCH_S}) until Ctrl-C")
    status.set_defaults(run=_status)
    return parser


def _watch_interval(text: str) -> float:
    """``--watch``'s interval: a number of seconds no shorter than MIN_WATCH_S (each redraw reads Redis)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not seconds >= MIN_WATCH_S:  # NaN too
        raise argparse.ArgumentTypeError(f"at least {MIN_WATCH_S} seconds, got {text}")
    return seconds


def _add_key(args: argparse.Namespace) -> int:
    document = _load_round_trip(args.file)
    tenants = document["tenants"]
    entry = next((t for t in tenants if t.get("id") == args.tenant), None)
    if entry is None:
        if not args.create:
            raise KeyError(f"no tenant {args.tenant!r} in {args.file} (use --create to add it)")
        Tenant(id=args.tenant)  # validates the id
        entry = {"id": args.tenant, "weight": 1, "api_keys": []}
        tenants.append(entry)
    key = new_key()
    key_id = args.key_id or f"key-{datetime.date.today():%Y%m%d}-{os.urandom(3).hex()}"
    record = ApiKey(id=key_id, sha256=hash_key(key), created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    if any(k.get("id") == key_id for k in entry.get("api_keys") or []):
        raise ValueError(f"tenant {args.tenant!r} already has a key named {key_id!r}")
    if entry.get("api_keys") is None:
        entry["api_keys"] = []
    entry["api_keys"].append(record.model_dump())
    _save_round_trip(args.file, document)
    print(key)
    print(f"# key {key_id!r} of tenant {args.tenant!r}: shown once, only its SHA-256 is stored", file=sys.stderr)
    return 0


def _revoke_key(args: argparse.Namespace) -> int:
    document = _load_round_trip(args.file)
    entry = next((t for t in document.get("tenants") or [] if t.get("id") == args.tenant), None)
    if entry is None:
        raise KeyError(f"no tenant {args.tenant!r} in {args.file}")
    keys = entry.get("api_keys") or []
    kept = [k for k in keys if k.get("id") != args.key_id]
    if len(kept) == len(keys):
        raise KeyError(f"tenant {args.tenant!r} has no key {args.key_id!r}")
    keys[:] = kept
    _save_round_trip(args.file, document)
    print(f"revoked key {args.key_id!r} of tenant {args.tenant!r}")
    return 0


def _check(args: argparse.Namespace) -> int:
    bands = _app_args(args.config)["queue"].band_names
    tenants = TenantsFile.read(args.file).check_bands(bands)
    keys = sum(len(t.api_keys) for t in tenants.tenants)
    print(f"{args.file}: {len(tenants.tenants)} tenants, {keys} keys, bands {bands}: ok")
    return 0


def _check_config(args: argparse.Namespace) -> int:
    from gateway.config_check import check_config

    problems, summaries = check_config(Path(args.config))
    for line in problems:
        print(f"fleetgate: {line}", file=sys.stderr)
    for line in summaries:
        print(f"{args.config}: {line}: ok")
    return 2 if problems else 0


def _status(args: argparse.Namespace) -> int:
    from redis.exceptions import RedisError

    from fleet.blocking import blocking
    from fleet.connection import global_queue, redis_client
    from fleet.metrics_board import MetricsBoard

    queue_config = _app_args(args.config)["queue"]
    url = args.redis_url or queue_config.resolved_redis_url()
    queue = blocking(lambda: global_queue(queue_config, redis_client(queue_config, url=url)))
    board = MetricsBoard(queue.client, queue.keys, ttl_s=1)
    while True:
        try:
            view = _status_view(queue, board, _redacted(url))
        except RedisError as exc:  # unreachable, refused, wrong password: say so, never a traceback
            problem = f"cannot read the global queue at {_redacted(url)}: {type(exc).__name__}: {exc}"
            if args.watch is None:
                print(f"fleetgate: {problem}", file=sys.stderr)
                return 1
            view = f"fleetgate status  {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M:%S} UTC\n\n{problem}"
        if args.watch is None:
            print(view)
            return 0
        print("\033[2J\033[H" + view, flush=True)  # watching: keep redrawing through an outage
        time.sleep(args.watch)


def _status_view(queue: Any, board: Any, shown_url: str) -> str:
    from gateway.status_view import render_status

    published = queue.run(board.read())
    sources = queue.run(board.live_sources())
    stale = _gateways_flagging(published, "fleetgate_tenants_file_stale")
    unguarded = _gateways_flagging(published, "fleetgate_header_guard_missing")
    snapshot = queue.snapshot()
    return render_status(snapshot, queue.keys.namespace, shown_url, sources, stale, lua_form=queue.lua.form,
                         unguarded=unguarded, open_requests=_gateway_gauge(published, "fleetgate_gateway_open_requests"))


def _gateways_flagging(published: list[tuple[dict[str, str], str]], gauge: str) -> list[str]:
    """The gateways whose published metrics set the 0/1 ``gauge`` to 1."""
    return [gateway for gateway, value in _gateway_gauge(published, gauge).items() if value == 1]


def _gateway_gauge(published: list[tuple[dict[str, str], str]], gauge: str) -> dict[str, float]:
    """Each gateway's value of the unlabelled ``gauge``, as it last published it."""
    values = {}
    for labels, text in published:
        if found := re.search(rf"^{gauge} (\S+)", text, re.MULTILINE):
            values[labels.get("gateway", "?")] = float(found.group(1))
    return values


def _app_args(config_file: str) -> dict[str, Any]:
    from gateway.config import AppConfig

    document = yaml.safe_load(_config_path(config_file).read_text())
    config = AppConfig.model_validate(document["applications"][0]["args"])
    return {"queue": config.queue, "access": config.access}


def _config_path(name: str) -> Path:
    """``name`` from here, else from the checkout this command was installed from (the default,
    deploy/local.yaml, then works from any directory)."""
    path = Path(name)
    if path.exists() or path.is_absolute():
        return path
    installed = Path(__file__).resolve().parents[1] / name
    if installed.exists():
        return installed
    raise FileNotFoundError(f"no Serve config at {name}: pass --config with the one the deployment runs")


def _redacted(url: str) -> str:
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def _round_trip_yaml() -> Any:
    from ruamel.yaml import YAML

    yaml_io = YAML()
    yaml_io.indent(mapping=2, sequence=4, offset=2)  # "  - id: ..." under "tenants:", as the shipped file
    return yaml_io


def _load_round_trip(path: str) -> Any:
    """The tenants file as ruamel.yaml reads it (comments kept), once it is known to be a valid one."""
    document = None
    if os.path.exists(path):
        TenantsFile.read(path)  # a file gateways would refuse is named as such, never half-edited
        document = _round_trip_yaml().load(Path(path).read_text())
    if document is None:  # no file, or an empty one
        document = _round_trip_yaml().load("tenants: []\n")
    if document.get("tenants") is None:
        document["tenants"] = []
    return document


def _save_round_trip(path: str, document: Any) -> None:
    from io import StringIO

    buffer = StringIO()
    _round_trip_yaml().dump(document, buffer)
    TenantsFile.model_validate(yaml.safe_load(buffer.getvalue()) or {})  # never write a file gateways would refuse
    target = Path(path).resolve()
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(buffer.getvalue())
    if target.exists():
        os.chmod(temporary, target.stat().st_mode & 0o777)
    os.replace(temporary, target)


if __name__ == "__main__":
    sys.exit(main())
