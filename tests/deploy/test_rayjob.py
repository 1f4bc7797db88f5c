"""deploy/kuberay/rayjob.yaml: the RayJob's own fields against a JSON Schema of KubeRay's
ray.io/v1 API (its pod templates are checked against Kubernetes' schema in
test_kubernetes_manifests.py), its entrypoint parses with rmq's real CLI as `rmq migrate
--engine ray`, and the Ray cluster it starts has the CPUs the entrypoint's encoders and decoders
take, at the Ray version of the image."""

from __future__ import annotations

import copy
import shlex
from typing import Any

import click
import jsonschema
import pytest

from tests.deploy.manifests import (
    container_env,
    dockerfile_ray_version,
    one,
    parse_rmq,
)

# Written here for the RayJob fields this project's recipe uses, from KubeRay's documented API
# (ray-operator/apis/ray/v1: RayJobSpec, RayClusterSpec, HeadGroupSpec, WorkerGroupSpec); not
# KubeRay's CRD. Objects are closed (additionalProperties false), so a misspelled field fails as
# Kubernetes' strict schema makes it fail for built-in kinds. The pod templates are core/v1
# PodTemplateSpecs, validated with Kubernetes' own schema instead.
_START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}  # map[string]string
_COUNT = {"type": "integer", "minimum": 0}
_TEMPLATE = {"type": "object", "required": ["spec"]}
RAYJOB_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayJob"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["entrypoint", "rayClusterSpec"],
            "additionalProperties": False,
            "properties": {
                "entrypoint": {"type": "string", "minLength": 1},
                "shutdownAfterJobFinishes": {"type": "boolean"},
                "ttlSecondsAfterFinished": _COUNT,
                "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                "backoffLimit": _COUNT,
                "suspend": {"type": "boolean"},
                "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                "runtimeEnvYAML": {"type": "string"},
                "entrypointNumCpus": {"type": "number", "minimum": 0},
                "entrypointNumGpus": {"type": "number", "minimum": 0},
                "rayClusterSpec": {
                    "type": "object",
                    "required": ["headGroupSpec"],
                    "additionalProperties": False,
                    "properties": {
                        "rayVersion": {"type": "string"},
                        "enableInTreeAutoscaling": {"type": "boolean"},
                        "headGroupSpec": {
                            "type": "object",
                            "required": ["rayStartParams", "template"],
                            "additionalProperties": False,
                            "properties": {
                                "rayStartParams": _START_PARAMS,
                                "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                                "template": _TEMPLATE,
                            },
                        },
                        "workerGroupSpecs": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["groupName", "rayStartParams", "template"],
                                "additionalProperties": False,
                                "properties": {
                                    "groupName": {"type": "string", "minLength": 1},
                                    "replicas": _COUNT,
                                    "minReplicas": _COUNT,
                                    "maxReplicas": _COUNT,
                                    "rayStartParams": _START_PARAMS,
                                    "template": _TEMPLATE,
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def rayjob() -> dict[str, Any]:
    return one("RayJob", "rmq-migrate-ray")


def check_rayjob(body: dict[str, Any]) -> None:
    """KubeRay's API as RAYJOB_SCHEMA says, and its rules between fields."""
    jsonschema.Draft202012Validator(RAYJOB_SCHEMA).validate(body)
    spec = body["spec"]
    if spec.get("ttlSecondsAfterFinished", 0) > 0:  # KubeRay ignores the TTL otherwise
        assert spec.get("shutdownAfterJobFinishes"), "a TTL without shutdownAfterJobFinishes"
    for group in spec["rayClusterSpec"].get("workerGroupSpecs", []):
        low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
        replicas = group.get("replicas", low)
        assert low <= replicas <= high, (
            f"group {group['groupName']}: replicas {replicas} not in {low}..{high}"
        )


def cpus(quantity: str | int | float) -> float:
    """A Kubernetes CPU quantity (``8``, ``"500m"``) in CPUs."""
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def group_resources(group: dict[str, Any]) -> tuple[float, float]:
    """The CPUs and GPUs Ray sees in one pod of a group: rayStartParams' num-cpus/num-gpus,
    else the Ray container's limits (as KubeRay passes them to `ray start`)."""
    params = group.get("rayStartParams", {})
    limits = group["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
    cpu = cpus(params["num-cpus"]) if "num-cpus" in params else cpus(limits.get("cpu", 0))
    gpu = float(params.get("num-gpus", limits.get("nvidia.com/gpu", 0)))
    return cpu, gpu


def check_room(body: dict[str, Any], params: dict[str, Any]) -> None:
    """The cluster fits what the entrypoint asks: an encoder a CPU (rmq refuses a cluster with
    no CPU left to decode), the --decoders tasks a CPU each at once, and the GPUs it asks for."""
    cluster = body["spec"]["rayClusterSpec"]
    groups = [(cluster["headGroupSpec"], 1)]
    groups += [(g, g.get("replicas", g.get("minReplicas", 0))) for g in cluster.get("workerGroupSpecs", [])]
    have_cpu = sum(group_resources(g)[0] * n for g, n in groups)
    have_gpu = sum(group_resources(g)[1] * n for g, n in groups)
    encoders, decoders = params["encoders"] or 1, params["decoders"] or 2
    assert have_cpu >= encoders + decoders, f"{have_cpu:g} CPUs for {encoders} encoders + {decoders} decoders"
    assert have_gpu >= encoders * (params["gpus_per_encoder"] or 0), f"{have_gpu:g} GPUs"


def driver() -> tuple[list[str], dict[str, str]]:
    """The entrypoint's argv and the environment of the head pod's Ray container, where it runs."""
    body = rayjob()
    head = body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return shlex.split(body["spec"]["entrypoint"]), container_env(head)


def _head(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["rayClusterSpec"]["headGroupSpec"]


def _workers(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["rayClusterSpec"]["workerGroupSpecs"][0]


def test_the_rayjob_is_valid_for_kuberays_api():
    check_rayjob(rayjob())


@pytest.mark.parametrize(
    "breaks",
    [
        pytest.param(lambda s: s.update(shutdownAfterJobFinish=True), id="misspelled"),
        pytest.param(lambda s: _head(s)["rayStartParams"].update({"num-cpus": 0}), id="number-param"),
        pytest.param(lambda s: _workers(s).pop("groupName"), id="no-group-name"),
        pytest.param(lambda s: s.update(shutdownAfterJobFinishes=False), id="ttl-without-shutdown"),
        pytest.param(lambda s: _workers(s).update(maxReplicas=1), id="replicas-above-max"),
    ],
)
def test_the_rayjob_check_fails_on_a_broken_rayjob(breaks):
    body = copy.deepcopy(rayjob())
    breaks(body["spec"])
    with pytest.raises((AssertionError, jsonschema.ValidationError)):
        check_rayjob(body)


def test_the_entrypoint_is_rmq_migrate_on_the_ray_cluster_it_runs_on():
    argv, env = driver()
    parsed = parse_rmq(argv, env)
    assert parsed.command == "migrate" and parsed.params["engine"] == "ray"
    # `ray job submit` gives the driver RAY_ADDRESS: no address (or auto) finds this cluster
    assert parsed.params["ray_address"] in (None, "auto")
    assert parsed.params["shard"] is None and not parsed.params["prepare"]  # one driver ranks itself
    assert "://" in parsed.root["qdrant"] and parsed.root["api_key"] == "<secret qdrant-api-key/api-key>"


def test_the_cluster_has_the_cpus_the_encoders_and_decoders_take():
    argv, env = driver()
    check_room(rayjob(), parse_rmq(argv, env).params)


def test_the_room_check_fails_when_the_entrypoint_asks_for_more():
    argv, env = driver()
    params = parse_rmq(argv, env).params
    for more in ({"decoders": 64}, {"encoders": 20}, {"gpus_per_encoder": 1.0}):
        with pytest.raises(AssertionError):
            check_room(rayjob(), {**params, **more})


def test_a_renamed_ray_flag_fails_to_parse():
    argv, env = driver()
    renamed = ["--decode-tasks" if a == "--decoders" else a for a in argv]
    with pytest.raises(click.UsageError):
        parse_rmq(renamed, env)


def test_the_cluster_runs_the_ray_version_of_the_image():
    assert rayjob()["spec"]["rayClusterSpec"]["rayVersion"] == dockerfile_ray_version()
