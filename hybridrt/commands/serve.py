"""`hybridrt serve MODEL [MODEL ...] [--route SPEC] [--host 127.0.0.1] [--port 8000] [--api-key KEY] ...`.

An OpenAI-compatible HTTP server (the `serve` extra). Each MODEL, a directory (served under its
name) or NAME=DIR, has its own engine, slots and prefix cache; `--route` adds names that choose
between them (serve/routes.py). /health is 503 while a model loads; SIGTERM drains, then stops.
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import Any

from ..graphs.manifest import read_manifest, verify_files
from ..serve.settings import EngineConfig, ServeConfig

ENGINE = EngineConfig()
SERVE = ServeConfig()


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (torch-free)")
    p.add_argument(
        "model",
        nargs="+",
        help="exported directory (holding hybridrt.json and model.onnx), or 'default'; NAME=DIR serves it as NAME",
    )
    p.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="SPEC",
        help="a routed name: NAME=length:SHORT,LONG,THRESHOLD (prompts under THRESHOLD tokens to SHORT) or "
        "NAME=split:MODEL:WEIGHT,MODEL:WEIGHT (sticky per `user`)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--grpc-port",
        type=int,
        metavar="P",
        help="also serve completions and chat over gRPC on --host:P (hybridrt/serve/hybridrt.proto, and "
        "grpc.health.v1); needs grpcio (pip install 'hybridrt[grpc]')",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("HYBRIDRT_API_KEY"),
        help="require Authorization: Bearer KEY on every route but /health and /openapi.json "
        "(default: $HYBRIDRT_API_KEY)",
    )
    p.add_argument(
        "--model-name", help="the model id clients send, with one MODEL (default: 'default' or the directory's name)"
    )
    p.add_argument(
        "--chat-template",
        help="a Jinja chat template file for /v1/chat/completions, over the one in the model's tokenizer config",
    )
    p.add_argument("--max-body-kb", type=int, default=SERVE.max_body_bytes // 1024)
    p.add_argument("--timeout", type=float, default=SERVE.request_timeout, help="seconds per request")
    p.add_argument("--provider", default="auto", help="auto, cpu, cuda, acl, xnnpack, or a full provider name")
    p.add_argument(
        "--device-id", type=int, metavar="N", help="the CUDA device to serve on (with --provider cuda or auto)"
    )
    p.add_argument("--threads", type=int, help="CPU intra-op threads")
    p.add_argument(
        "--assistant",
        help="exported draft model of the same tokenizer: a request alone in the server decodes speculatively",
    )
    p.add_argument("--log-level", default="info")
    _add_engine_options(p)
    _add_log_options(p)
    _add_ray_options(p)


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slots", type=int, default=ENGINE.slots, help="sequences decoded together (state slots)")
    p.add_argument("--chunk", type=int, default=ENGINE.chunk, help="prompt tokens prefilled per engine step")
    p.add_argument("--max-queue", type=int, default=ENGINE.max_queue, help="waiting requests before 429")
    p.add_argument(
        "--cache-mb",
        type=float,
        help="memory for the prefix state cache (0: off; default: a quarter of the memory available at start)",
    )
    p.add_argument(
        "--cache-dir",
        help="a directory where cached states go when memory is full and stay across restarts (default: none)",
    )
    p.add_argument("--cache-disk-mb", type=float, help="cap of --cache-dir (default: half its free space)")
    p.add_argument(
        "--cache-spacing",
        type=int,
        help="prompt tokens between stored states inside long prompts (default: about 16 a prompt, by its length)",
    )
    p.add_argument(
        "--cache-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="how cached states are kept: exact (float32), or bfloat16 at half the bytes (resumed requests close "
        "to, not equal to, cold ones)",
    )


def _add_ray_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ray Serve (pip install 'hybridrt[ray]')")
    g.add_argument(
        "--ray",
        action="store_true",
        help="serve as a Ray Serve application: replicas of this server behind one address, each request sent to "
        "the replica that holds its conversation's states",
    )
    g.add_argument("--replicas", type=int, default=1, help="engine replicas (the minimum, with --max-replicas)")
    g.add_argument("--max-replicas", type=int, help="autoscale between --replicas and this many replicas")
    g.add_argument(
        "--target-ongoing", type=float, default=2.0, help="requests in hand per replica that autoscaling aims at"
    )
    g.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves for each replica")
    g.add_argument(
        "--ray-address", help="a running cluster ('auto', or HOST:PORT of its head); default: start a local one"
    )
    g.add_argument("--ray-cpus", type=int, help="CPUs of the local cluster (default: every core)")
    g.add_argument(
        "--ray-router",
        choices=["affinity", "default"],
        default="affinity",
        help="affinity: a conversation's turns go to the replica holding its states; default: Ray's own choice",
    )
    g.add_argument(
        "--ray-state-moves",
        choices=["on", "off"],
        default="on",
        help="on (with affinity): a turn sent to another replica fetches its states from the holder where that beats "
        "prefilling them again",
    )


def _add_log_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-file",
        help="write the per-request JSON lines here (rotated at --log-file-mb, 5 old files kept; with --ray, one "
        "file per replica on its host, the replica's id before the suffix); default: stderr",
    )
    p.add_argument("--log-file-mb", type=float, default=100.0, help="size at which --log-file rotates")
    p.add_argument(
        "--log-prompts", type=int, default=0, metavar="N", help="put each prompt's first N characters in its log line"
    )


def run(args: argparse.Namespace) -> int:
    from ..serve.server import serve

    if args.ray:
        return _run_on_ray(args)
    from ..serve.request_log import configure

    configure(args.log_file, int(args.log_file_mb * 2**20))  # under --ray, each replica its own
    serve(app_from_args(args), args.host, args.port, args.log_level)
    return 0


def _run_on_ray(args: argparse.Namespace) -> int:
    """The same app in each Ray Serve replica (deploy/ray_serve.py). Flags are checked and the
    models found (the default model exported) here, before a cluster starts."""
    ray_serve, options = _ray_options(args)
    ray_serve.run(functools.partial(app_from_args, args), options, args.host, args.port)
    return 0


def ray_app(config: dict[str, Any]) -> Any:
    """Ray Serve's application builder, for a Serve config file or KubeRay's RayService
    (deploy/kuberay/): `import_path: hybridrt.commands.serve:ray_app` with `args: {argv: [MODEL,
    ...flags of hybridrt serve --ray]}`; the cluster, host and port are the config's."""
    from ..cli import build_parser

    argv = config.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        from ..errors import GraphError

        raise GraphError(f"ray_app's args need argv: a list of strings (MODEL and flags), got {argv!r}")
    args = build_parser().parse_args(["serve", *argv, "--ray"])
    ray_serve, options = _ray_options(args)
    return ray_serve.application(functools.partial(app_from_args, args), options)


def _ray_options(args: argparse.Namespace) -> tuple[Any, Any]:
    """deploy.ray_serve and the RayOptions of the checked flags (models rewritten as NAME=DIR, found once)."""
    from ..errors import GraphError

    try:
        from ..deploy import ray_serve
    except ImportError:
        raise GraphError("--ray needs Ray Serve: pip install 'hybridrt[ray]'") from None
    if args.grpc_port is not None:
        raise GraphError("--grpc-port is not served through Ray; drop it or serve without --ray")
    if args.ray_cpus is not None and args.ray_address is not None:
        raise GraphError("--ray-cpus sizes the local cluster; a running cluster (--ray-address) has its own CPUs")
    if args.replicas < 1 or (args.max_replicas is not None and args.max_replicas < args.replicas):
        raise GraphError(
            f"--replicas must be >= 1 and --max-replicas >= --replicas, got {args.replicas}, {args.max_replicas}"
        )
    served = served_models(args.model, args.model_name)
    for d in served.values():  # a missing or cut file said before a cluster starts (the replicas hash them)
        verify_files(d, read_manifest(d), hashes=False)
    args.model, args.model_name = [f"{name}={d}" for name, d in served.items()], None
    _serve_config(args, next(iter(served)))  # every flag of the app checked before the cluster starts
    options = ray_serve.RayOptions(
        replicas=args.replicas,
        max_replicas=args.max_replicas,
        target_ongoing=args.target_ongoing,
        cpus_per_replica=args.replica_cpus,
        address=args.ray_address,
        local_cpus=args.ray_cpus,
        router=args.ray_router,
        state_moves=args.ray_state_moves == "on",
        bound=args.slots,
        max_ongoing=args.slots + args.max_queue,
        shutdown_s=args.timeout,
        log_file=args.log_file,  # one file per replica: a rotating file is not shared between processes
        log_bytes=int(args.log_file_mb * 2**20),
    )
    return ray_serve, options


def app_from_args(args: argparse.Namespace) -> Any:
    """The server's ASGI app (its engines loading) from `hybridrt serve`'s flags; a Ray replica
    (deploy/ray_serve.py) builds its app here too, from the same flags."""
    from ..errors import GenerationError, GraphError
    from ..runtime import load, share_thread_pool
    from ..runtime.text import TOKENIZER
    from ..serve.routes import check_routes, parse_route
    from ..serve.server import build
    from .common import model_dir

    served = served_models(args.model, args.model_name)
    routes = [parse_route(spec) for spec in args.route]
    check_routes(routes, list(served))
    cache_bytes = None if args.cache_mb is None else int(args.cache_mb * 2**20)
    if len(served) > 1:
        cache_bytes = plan_memory(served, cache_bytes)
    engine = EngineConfig(
        args.slots,
        args.chunk,
        args.max_queue,
        cache_bytes,
        args.cache_dir,
        None if args.cache_disk_mb is None else int(args.cache_disk_mb * 2**20),
        args.cache_spacing,
        args.cache_dtype,
    )
    config = _serve_config(args, next(iter(served)))
    draft = None if args.assistant is None else model_dir(args.assistant, isolated=True)
    if draft is not None and len(served) > 1:
        raise GenerationError("--assistant serves one model; serve several without it")
    for d in (*served.values(), draft):
        if d is not None and not (d / TOKENIZER).is_file():  # the API speaks text
            raise GraphError(
                f"{d} has no {TOKENIZER}, and the server answers in text: copy the checkpoint's "
                f"{TOKENIZER} into it (or re-export from a checkpoint that has one)"
            )
    if draft is not None:  # two sessions taking turns: one thread pool for both
        share_thread_pool(args.threads or os.cpu_count() or 1, strict=False)
    from ..runtime.providers import device_provider

    provider = device_provider(args.provider, args.device_id)
    loaders: dict[str, Any] = {
        name: functools.partial(load, d, provider, threads=args.threads) for name, d in served.items()
    }
    _, app = build(
        loaders if len(loaders) > 1 else next(iter(loaders.values())),
        engine,
        config,
        None if draft is None else (lambda: load(draft, provider, threads=args.threads)),
        routes,
    )
    return app


def _serve_config(args: argparse.Namespace, default_name: str) -> ServeConfig:
    """The HTTP side's settings, and the request log's destination, from the flags."""
    from ..errors import GraphError
    from ..serve.chat import read_template

    template = None if args.chat_template is None else read_template(args.chat_template)
    if args.log_prompts < 0:
        raise GraphError(f"--log-prompts must be >= 0, got {args.log_prompts}")
    grpc_address = None
    if args.grpc_port is not None:
        if not 0 <= args.grpc_port < 65536:
            raise GraphError(f"--grpc-port must be a port number (0-65535), got {args.grpc_port}")
        try:
            import grpc  # noqa: F401
        except ImportError:
            raise GraphError("--grpc-port needs grpcio: pip install 'hybridrt[grpc]'") from None
        grpc_address = f"{args.host}:{args.grpc_port}"
    return ServeConfig(
        default_name,
        args.api_key,
        args.max_body_kb * 1024,
        args.timeout,
        chat_template=template,
        log_prompts=args.log_prompts,
        grpc_address=grpc_address,
    )


def served_models(specs: list[str], model_name: str | None) -> dict[str, Path]:
    """{served name: exported directory} from MODEL arguments (DIR, 'default' or NAME=DIR)."""
    from ..default_model import DEFAULT_NAME
    from ..errors import GenerationError
    from .common import model_dir

    if model_name is not None and len(specs) > 1:
        raise GenerationError("--model-name names the one MODEL; with several, write NAME=DIR")
    served: dict[str, Path] = {}
    for spec in specs:
        given, sep, path = spec.partition("=")
        raw = path if sep and given else spec
        # Exports the default model first if needed, in a child process: the server never holds torch.
        directory = model_dir(raw, isolated=True)
        name = given if sep and given else (DEFAULT_NAME if raw == DEFAULT_NAME else Path(raw).resolve().name)
        if name in served:
            raise GenerationError(f"two models are served as {name!r}: name them, NAME=DIR")
        served[name] = directory
    return {model_name: next(iter(served.values()))} if model_name is not None else served


def plan_memory(served: dict[str, Path], cache_bytes: int | None) -> int:
    """Each model's prefix cache budget when several are served, after refusing, before any
    loads, a set of models whose graphs do not fit in the memory available: the default budget
    (a quarter of what is available once the graphs are loaded) is shared between them."""
    from ..errors import GraphError
    from ..graphs.manifest import read_manifest
    from ..runtime.prefix_cache import available_memory

    weights = {}
    for name, directory in served.items():
        graph = read_manifest(directory).graph_file
        weights[name] = sum(p.stat().st_size for p in directory.iterdir() if p.name.startswith(graph))
    free = available_memory()
    total = sum(weights.values())
    if total > free:
        each = ", ".join(f"{n} {b / 2**20:.0f} MiB" for n, b in weights.items())
        raise GraphError(
            f"the {len(served)} models' graphs need {total / 2**20:.0f} MiB ({each}) and "
            f"{free / 2**20:.0f} MiB of memory is available; serve fewer or smaller (quantized) models"
        )
    if cache_bytes is not None:
        return cache_bytes
    return (free - total) // 4 // len(served)
