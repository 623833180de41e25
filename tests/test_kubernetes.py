"""deploy/kubernetes: every manifest valid against the Kubernetes JSON schemas (bundled with
kubernetes-validate, checked with the network blocked), and consistent with `hybridrt serve`
and deploy/Dockerfile.serve."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml

from hybridrt.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
KUBE = DEPLOY / "kubernetes"
# The oldest Kubernetes release these manifests claim (autoscaling/v2 is GA from 1.23), and the newest bundled.
VERSIONS = ("1.27.0", kv.utils.latest_version())


def documents() -> dict[str, dict[str, Any]]:
    """name -> manifest, for every Kubernetes object in deploy/kubernetes (the kustomization aside)."""
    out = {}
    for path in sorted(KUBE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] != "Kustomization":
                out[path.name] = doc
    return out


def deployment() -> dict[str, Any]:
    return documents()["deployment.yaml"]


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_match_the_kubernetes_schemas(version: str, offline: None) -> None:
    docs = documents()
    assert set(docs) == {"deployment.yaml", "service.yaml", "hpa.yaml", "hpa-queue-depth.yaml"}
    for name, doc in docs.items():
        try:
            kv.validate(doc, version, strict=True)  # strict: unknown fields are errors too
        except kv.ValidationError as e:
            pytest.fail(f"{name} is not a valid Kubernetes {version} manifest: {e}")


def test_the_validator_rejects_a_broken_manifest(offline: None) -> None:
    """Guards the check itself: a misspelt field and a wrong type are both caught."""
    doc = copy.deepcopy(deployment())
    probe = doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    probe["paht"] = probe.pop("path")
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, VERSIONS[-1], strict=True)
    doc = copy.deepcopy(deployment())
    doc["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, VERSIONS[-1], strict=True)


def test_probes_ports_and_args_match_the_server() -> None:
    docs = documents()
    spec = docs["deployment.yaml"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert docs["service.yaml"]["spec"]["selector"] == spec["selector"]["matchLabels"]
    [container] = spec["template"]["spec"]["containers"]
    [port] = container["ports"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": port["name"]}
    assert docs["service.yaml"]["spec"]["ports"][0]["targetPort"] == port["name"]
    # The image's entrypoint plus the Deployment's args are a valid `hybridrt serve` command line.
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", (DEPLOY / "Dockerfile.serve").read_text(), re.M)
    assert entrypoint is not None
    argv = yaml.safe_load(entrypoint.group(1))
    assert argv[:2] == ["hybridrt", "serve"]
    args = build_parser().parse_args(argv[1:] + container["args"])
    assert args.port == port["containerPort"] and args.host == "0.0.0.0"
    assert args.threads == int(container["resources"]["requests"]["cpu"])  # one intra-op thread per requested core
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] > 30  # the server's graceful shutdown


def test_autoscalers_target_the_deployment_and_real_metrics() -> None:
    docs = documents()
    name = docs["deployment.yaml"]["metadata"]["name"]
    for hpa in (docs["hpa.yaml"], docs["hpa-queue-depth.yaml"]):
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    [cpu] = docs["hpa.yaml"]["spec"]["metrics"]
    assert cpu["resource"]["name"] == "cpu" and cpu["resource"]["target"]["type"] == "Utilization"
    [queue] = docs["hpa-queue-depth.yaml"]["spec"]["metrics"]
    from hybridrt.serve.metrics import Metrics

    gauges = {m.name for m in Metrics().registry.collect()}
    assert queue["pods"]["metric"]["name"] in gauges
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["deployment.yaml", "service.yaml", "hpa.yaml"]  # one autoscaler
