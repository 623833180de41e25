"""deploy/kuberay: the RayService's Serve config is valid for Ray Serve (its own schema), its
application builds from hybridrt.commands.serve:ray_app with the manifest's flags, and its head
and worker pod templates are valid Kubernetes pod templates (kubernetes-validate) — all offline."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml
from ray.serve.deployment import Application
from ray.serve.schema import ServeDeploySchema

import hybridrt
from hybridrt.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
MANIFEST = yaml.safe_load((DEPLOY / "kuberay" / "rayservice.yaml").read_text())


def _serve_config() -> ServeDeploySchema:
    return ServeDeploySchema.model_validate(yaml.safe_load(MANIFEST["spec"]["serveConfigV2"]))


def _pods() -> dict[str, dict[str, Any]]:
    cluster = MANIFEST["spec"]["rayClusterConfig"]
    pods = {"head": cluster["headGroupSpec"]["template"]}
    pods |= {g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}
    return pods


def test_the_serve_config_is_ray_serves_and_builds_hybridrts_application(default_onnx: Path) -> None:
    assert (MANIFEST["apiVersion"], MANIFEST["kind"]) == ("ray.io/v1", "RayService")
    config = _serve_config()
    (app,) = config.applications
    assert app.route_prefix == "/" and config.http_options.port == 8000
    module, name = app.import_path.split(":")
    builder = getattr(importlib.import_module(module), name)
    argv = list(app.args["argv"])
    assert argv[0] == "/model"  # where deploy/Dockerfile.ray puts the model
    build_parser().parse_args(["serve", *argv, "--ray"])  # hybridrt serve's own flags
    built = builder({"argv": [str(default_onnx), *argv[1:]]})
    assert isinstance(built, Application)
    front = built._bound_deployment  # Ray has no public accessor for a bound application's parts
    engine = front.init_args[0]._bound_deployment
    assert (front.name, engine.name) == ("front", "engine")
    flags = dict(zip(argv[1::2], argv[2::2]))
    assert engine.ray_actor_options["num_cpus"] == float(flags["--replica-cpus"])
    assert engine.max_ongoing_requests == int(flags["--slots"]) + 64  # slots + the default --max-queue


def test_a_builder_without_argv_or_with_a_bad_flag_says_so(default_onnx: Path) -> None:
    from hybridrt.commands.serve import ray_app

    with pytest.raises(hybridrt.HybridrtError, match="argv: a list of strings"):
        ray_app({"model": str(default_onnx)})
    with pytest.raises(hybridrt.HybridrtError, match="--max-replicas >= --replicas"):
        ray_app({"argv": [str(default_onnx), "--replicas", "3", "--max-replicas", "2"]})


@pytest.mark.parametrize("version", ["1.27.0", kv.utils.latest_version()])
def test_pod_templates_are_valid_kubernetes(version: str, offline: None) -> None:
    images = set()
    for group, template in _pods().items():
        doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"hybridrt-{group}"}}
        try:
            kv.validate(doc | {"template": template}, version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"the {group} group's pod template is not a valid Kubernetes {version} pod template: {e}")
        (container,) = template["spec"]["containers"]
        images.add(container["image"])
        threads = {e["name"]: e["value"] for e in container.get("env", [])}.get("HYBRIDRT_THREADS")
        assert threads == "1"  # one thread per replica CPU (--replica-cpus 1): onnxruntime reads no limit
    assert images == {"hybridrt-ray:latest"}  # head and workers run the same image
    broken = copy.deepcopy(_pods()["cpu"])
    broken["spec"]["containers"][0]["resources"]["limits"]["cpu"] = {"cores": 2}
    with pytest.raises(kv.ValidationError):
        kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": broken}, version)
