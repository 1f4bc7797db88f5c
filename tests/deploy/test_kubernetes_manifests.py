"""deploy/'s Kubernetes manifests: every YAML document is valid for Kubernetes' own schema
(strict: an unknown field fails), pod i of the Indexed Job runs ``rmq migrate --shard i/N`` once
Kubernetes has expanded its command, the prepare Job ranks the same pair once, every command
parses with rmq's real CLI, and the metrics port is the one Prometheus is told to scrape."""

from __future__ import annotations

import copy
import json
import re
import shlex
from typing import Any

import click
import pytest
from click.testing import CliRunner

from rm_qdrant.cli import cli
from rm_qdrant.core.ordering import BUCKETS, shard_buckets
from rm_qdrant.core.planning import parse_shard
from tests.deploy.manifests import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    ROOT,
    SCRAPE,
    SCRAPE_PORT,
    command_line,
    container_env,
    documents,
    flag_value,
    of_kind,
    one,
    parse_rmq,
    pod_templates,
    project_version,
    validate_builtin,
    validate_pod_template,
)

#: Kinds Kubernetes' schema does not know, each checked by its own test (test_rayjob.py).
CUSTOM = {("ray.io/v1", "RayJob")}
GUIDE = ROOT / "docs" / "guides" / "kubernetes.md"
INDEX_ARG = "$(JOB_COMPLETION_INDEX)/8"  # the shard Job's --shard, as written


def builtin_documents() -> list[Any]:
    return [
        d
        for d in documents()
        if isinstance(d.body, dict) and (d.body.get("apiVersion"), d.body.get("kind")) not in CUSTOM
    ]


def only_container(job: dict[str, Any]) -> dict[str, Any]:
    containers = job["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"job {job['metadata']['name']} has {len(containers)} containers"
    return containers[0]


def shard_pods(job: dict[str, Any]) -> list[tuple[list[str], dict[str, str]]]:
    """Each pod's argv and environment, as the Job controller and the kubelet make them."""
    container = only_container(job)
    pods = []
    for index in range(job["spec"]["completions"]):
        env = container_env(container, injected={"JOB_COMPLETION_INDEX": str(index)})
        pods.append((command_line(container, env), env))
    return pods


def check_shards(job: dict[str, Any]) -> None:
    """Pod i runs `rmq migrate --shard i/N`, N = completions = parallelism, and the N shards
    own every bucket of the gallery once."""
    spec = job["spec"]
    assert spec.get("completionMode") == "Indexed", "not an Indexed Job: no pod gets an index"
    count = spec["completions"]
    assert spec.get("parallelism") == count, f"parallelism {spec.get('parallelism')} is not N = {count}"
    assert not spec["template"]["spec"].get("initContainers"), "an initContainer runs in all N pods"
    owners: dict[int, int] = {}
    for index, (argv, env) in enumerate(shard_pods(job)):
        assert not any("$(" in arg for arg in argv), f"pod {index}: Kubernetes leaves {argv} unexpanded"
        parsed = parse_rmq(argv, env)
        assert parsed.command == "migrate" and not parsed.params["prepare"]
        shard = parsed.params["shard"]
        assert shard == f"{index}/{count}", f"pod {index} runs --shard {shard}"
        for bucket in shard_buckets(*parse_shard(shard)):
            assert bucket not in owners, f"bucket {bucket}: shards {owners[bucket]} and {index}"
            owners[bucket] = index
    assert sorted(owners) == list(range(BUCKETS))


@pytest.mark.parametrize("doc", documents(), ids=lambda d: d.id)
def test_every_document_is_a_named_object(doc):
    assert isinstance(doc.body, dict), f"{doc.id} is empty or not a mapping (a stray '---'?)"
    assert {"apiVersion", "kind", "metadata"} <= doc.body.keys(), doc.id
    assert doc.body["metadata"].get("name"), f"{doc.id} has no name"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("doc", builtin_documents(), ids=lambda d: d.id)
def test_builtin_kinds_are_valid_for_kubernetes(doc, version):
    validate_builtin(doc.body, version)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("where", "template"), pod_templates(), ids=[w for w, _ in pod_templates()])
def test_pod_templates_are_valid_for_kubernetes(where, template, version):
    validate_pod_template(template, version)


def test_the_recipe_has_a_config_a_prepare_job_and_an_indexed_job():
    assert one("ConfigMap", "rmq-migration")["data"]
    assert one("Job", "rmq-prepare") and one("Job", "rmq-migrate")


def test_the_strict_schema_refuses_a_misspelled_or_misplaced_field():
    job = copy.deepcopy(one("Job", "rmq-migrate"))
    job["spec"]["completionsMode"] = job["spec"].pop("completionMode")
    with pytest.raises(AssertionError, match="Additional properties"):
        validate_builtin(job, KUBERNETES_VERSIONS[0])
    template = copy.deepcopy(job["spec"]["template"])
    template["spec"]["containers"][0]["arg"] = template["spec"]["containers"][0].pop("args")
    with pytest.raises(AssertionError, match="Additional properties"):
        validate_pod_template(template, KUBERNETES_VERSIONS[0])


def test_pod_i_of_the_indexed_job_migrates_shard_i_of_n():
    check_shards(one("Job", "rmq-migrate"))


@pytest.mark.parametrize(
    "breaks",
    [
        pytest.param(lambda j: j["spec"].update(completions=6, parallelism=6), id="completions-not-N"),
        pytest.param(lambda j: j["spec"].update(parallelism=4), id="parallelism-not-N"),
        pytest.param(lambda j: j["spec"].pop("completionMode"), id="not-indexed"),
        pytest.param(lambda j: _replace_arg(j, INDEX_ARG, "$JOB_COMPLETION_INDEX/8"), id="shell-syntax"),
        pytest.param(lambda j: _replace_arg(j, INDEX_ARG, "$(JOB_INDEX)/8"), id="unknown-variable"),
        pytest.param(lambda j: _replace_arg(j, "--shard", "--shards"), id="renamed-flag"),
    ],
)
def test_the_shard_check_fails_on_a_broken_job(breaks):
    job = copy.deepcopy(one("Job", "rmq-migrate"))
    breaks(job)
    with pytest.raises((AssertionError, click.UsageError)):
        check_shards(job)


def _replace_arg(job: dict[str, Any], old: str, new: str) -> None:
    args = only_container(job)["args"]
    args[args.index(old)] = new


def test_prepare_runs_once_on_the_same_pair_and_store_as_the_shards():
    prepare = one("Job", "rmq-prepare")
    spec = prepare["spec"]
    assert spec.get("completionMode", "NonIndexed") == "NonIndexed"
    assert spec.get("completions", 1) == 1 and spec.get("parallelism", 1) == 1
    container = only_container(prepare)
    env = container_env(container)
    ranks = parse_rmq(command_line(container, env), env)
    assert ranks.command == "migrate" and ranks.params["prepare"] and ranks.params["shard"] is None
    argv, shard_env = shard_pods(one("Job", "rmq-migrate"))[0]
    shard = parse_rmq(argv, shard_env)
    assert ranks.root == shard.root  # the same server and key
    for same in ("name", "order", "seed"):  # a shard refuses an order the prepare did not rank
        assert ranks.params[same] == shard.params[same], same


def test_the_store_and_its_key_come_from_the_configmap_and_the_secret():
    config = one("ConfigMap", "rmq-migration")["data"]
    for job in of_kind("Job"):
        container = only_container(job)
        env = container_env(container)
        parsed = parse_rmq(command_line(container, env), env)
        assert parsed.root["qdrant"] == config["RMQ_QDRANT"] and "://" in parsed.root["qdrant"]
        assert parsed.params["name"] == config["RMQ_PAIR"]
        assert parsed.root["api_key"] == "<secret qdrant-api-key/api-key>", "the key is not from the Secret"


def metrics_pods() -> list[tuple[str, dict[str, Any], list[str]]]:
    """(where, pod template, the rmq argv) of every pod that runs an rmq command."""
    found = []
    for job in of_kind("Job"):
        container = only_container(job)
        found.append((job["metadata"]["name"], job["spec"]["template"], command_line(container, {})))
    for rayjob in of_kind("RayJob"):
        head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]  # the driver's pod
        found.append((rayjob["metadata"]["name"], head, shlex.split(rayjob["spec"]["entrypoint"])))
    return found


@pytest.mark.parametrize(("where", "template", "argv"), metrics_pods(), ids=[w for w, *_ in metrics_pods()])
def test_the_metrics_port_is_declared_and_scraped(where, template, argv):
    port = flag_value(argv, "--metrics-port")
    if port is None:
        assert "--prepare" in argv, f"{where}: a migration without --metrics-port"
        return
    ports = [p for c in template["spec"]["containers"] for p in c.get("ports", [])]
    declared = {p["containerPort"]: p.get("name") for p in ports}
    assert int(port) in declared, f"{where}: --metrics-port {port} is no container port"
    assert re.fullmatch(r"(rmq-)?metrics", declared[int(port)] or ""), declared[int(port)]
    annotations = template.get("metadata", {}).get("annotations", {})
    assert annotations.get(SCRAPE) == "true" and annotations.get(SCRAPE_PORT) == port, annotations


def test_metrics_port_is_an_option_of_rmq_migrate():
    options = {opt for p in cli.commands["migrate"].params for opt in getattr(p, "opts", ())}
    assert "--metrics-port" in options
    container = only_container(one("Job", "rmq-migrate"))
    env = container_env(container, injected={"JOB_COMPLETION_INDEX": "0"})
    assert parse_rmq(command_line(container, env), env).dropped == ()


def test_every_pod_runs_the_projects_image_of_this_version():
    images = {c["image"] for _, t in pod_templates() for c in t["spec"]["containers"]}
    assert len(images) == 1, f"the recipes run different images: {images}"
    assert images.pop().rsplit(":", 1)[1] == project_version()


def test_the_guide_applies_and_waits_on_what_deploy_holds():
    text = GUIDE.read_text(encoding="utf-8")
    applied = re.findall(r"kubectl (?:apply|create) -f (\S+)", text)
    assert applied, "the guide applies nothing"
    for path in applied:
        assert (ROOT / path).is_file(), f"the guide applies {path}, which does not exist"
    waited = re.findall(r"kubectl wait [^\n]*job/([a-z0-9-]+)", text)
    assert "rmq-prepare" in waited, "the guide does not wait for the prepare Job"
    assert {name for name in waited} <= {j["metadata"]["name"] for j in of_kind("Job")}
    assert {p.relative_to(ROOT).as_posix() for p in DEPLOY.rglob("*.yaml")} <= set(applied)


def _run(argv: list[str], env: dict[str, str]) -> Any:
    """A pod's command run in this process: rmq's CLI with the pod's environment."""
    parse_rmq(argv, {k: v for k, v in env.items() if v is not None})  # a bad flag fails here
    args = list(argv[1:])
    if "--metrics-port" in args:  # a fixed port would bind in the test process: not run here
        at = args.index("--metrics-port")
        del args[at : at + 2]
    return CliRunner().invoke(cli, args, env=env)


@pytest.mark.slow
def test_the_jobs_commands_migrate_the_whole_gallery_in_the_applied_order(
    rmq, models, image_folder, tmp_path
):
    """Each pod's command, expanded as Kubernetes expands it, run against a real store: a shard
    before the prepare Job refuses, and after it the N shards move every point once. The store
    is the embedded one (no server runs here), so the pods run one after another, and there is
    no key to send."""
    pair = one("ConfigMap", "rmq-migration")["data"]["RMQ_PAIR"]
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    rmq("init", "--name", pair, "--old-collection", "gallery", "--encoder", models.rm)
    here = {"RMQ_QDRANT": str(tmp_path / "q"), "QDRANT_API_KEY": None}
    shards = [(argv, {**env, **here}) for argv, env in shard_pods(one("Job", "rmq-migrate"))]
    early = _run(*shards[0])
    assert early.exit_code == 1 and "run 'rmq migrate --prepare'" in early.output
    prepare = only_container(one("Job", "rmq-prepare"))
    env = {**container_env(prepare), **here}
    assert _run(command_line(prepare, env), env).exit_code == 0
    moved = []
    for argv, env in shards:
        result = _run(argv, env)
        assert result.exit_code == 0, result.output
        moved.append(int(re.search(r"moved (\d+) points", result.output).group(1)))
    total = sum(p.is_file() for p in image_folder.rglob("*"))
    assert sum(moved) == total and sum(m > 0 for m in moved) > 1
    status = json.loads(rmq("status", "--name", pair, "--json").output)
    assert status["fraction"] == 1.0
