"""What the tests of deploy/ share: its YAML documents, Kubernetes' own schemas (offline, from
kubernetes-validate), a container's environment and ``$(VAR)`` expansion as the kubelet does
them, and rmq's real click CLI parsing a container's command."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import click
import kubernetes_validate
import yaml

from rm_qdrant.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

#: The Kubernetes versions every manifest must be valid for: 1.30, the oldest the recipe
#: supports (backoffLimitPerIndex and podFailurePolicy on by default since 1.29), and 1.33,
#: where backoffLimitPerIndex is GA. kubernetes-validate carries both schemas (no network).
KUBERNETES_VERSIONS = ("1.30", "1.33")

#: rmq options not in this branch's CLI yet: dropped before parsing while the option is missing.
#: --metrics-port is being added to `rmq migrate` on another branch; remove this once it merges.
PENDING_FLAGS: tuple[str, ...] = ()  # flags a manifest may use before rmq has them (none now)

#: Prometheus' annotation convention for scraping a pod (kubernetes_sd "pod" role).
SCRAPE = "prometheus.io/scrape"
SCRAPE_PORT = "prometheus.io/port"


@dataclass(frozen=True)
class Document:
    """One YAML document of a file under deploy/."""

    path: Path
    index: int
    body: Any

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(DEPLOY)}#{self.index}"


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def documents() -> list[Document]:
    """Every YAML document under deploy/ (an empty one, from a stray ``---``, included)."""
    found = []
    for path in yaml_files():
        with path.open(encoding="utf-8") as file:
            found += [Document(path, i, body) for i, body in enumerate(yaml.safe_load_all(file))]
    return found


def of_kind(kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d.body
        for d in documents()
        if isinstance(d.body, dict)
        and d.body.get("kind") == kind
        and (name is None or d.body["metadata"]["name"] == name)
    ]


def one(kind: str, name: str) -> dict[str, Any]:
    found = of_kind(kind, name)
    assert len(found) == 1, f"deploy/ holds {len(found)} {kind} named {name!r}, expected one"
    return found[0]


def validate_builtin(body: Mapping[str, Any], version: str) -> None:
    """Validate against Kubernetes ``version``'s schema, strict: an unknown field fails.

    Raises AssertionError naming the field and the rule (not the schema, which runs to pages).
    """
    try:
        kubernetes_validate.validate(dict(body), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path) or "(top)"
        name = body.get("metadata", {}).get("name")
        raise AssertionError(
            f"{body.get('kind')} {name}: {where}: {exc.message} (Kubernetes {version})"
        ) from None


def validate_pod_template(template: Mapping[str, Any], version: str) -> None:
    """A core/v1 PodTemplateSpec (a CRD's embedded one), validated as a PodTemplate object."""
    wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
    validate_builtin(wrapper, version)


def container_env(
    container: Mapping[str, Any], *, injected: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment the kubelet gives ``container``: ``envFrom`` ConfigMaps (read from deploy/),
    then ``env`` (it wins), then what the controller adds (``JOB_COMPLETION_INDEX``).

    A Secret's value is not in the repository: it stands as ``<secret NAME/KEY>``.
    """
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert "configMapRef" in source, f"envFrom {source} is not a ConfigMap"
        env.update(one("ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = f"<secret {ref['name']}/{ref['key']}>"
        elif "configMapKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["configMapKeyRef"]
            env[entry["name"]] = one("ConfigMap", ref["name"])["data"][ref["key"]]
    return {**env, **(injected or {})}


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` in a command or argument, as Kubernetes expands it (no shell): a defined
    variable's value, an undefined reference left as written, ``$$`` an escaped ``$``."""

    def value(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(value, text)


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The container's command and args, expanded: what the process gets as argv."""
    return [expand(str(a), env) for a in [*container.get("command", []), *container.get("args", [])]]


@dataclass(frozen=True)
class Parsed:
    """An rmq command line as click parsed it: the root's options and the subcommand's."""

    command: str
    root: dict[str, Any]
    params: dict[str, Any]
    dropped: tuple[str, ...]


def parse_rmq(argv: Sequence[str], env: Mapping[str, str]) -> Parsed:
    """Parse ``argv`` (``rmq ...``) with rmq's own click commands, in ``env`` alone (rmq reads
    --qdrant and --api-key from it), without running anything.

    Raises click's UsageError for an unknown option, a bad value or a missing one.
    """
    assert argv and argv[0] == "rmq", f"the container runs {argv[:1]}, not the rmq console script"
    root_args, name, rest = _split(list(argv[1:]))
    with _environment(env):
        root = cli.make_context("rmq", [*root_args, name])  # a group given no command shows help
        command = cli.get_command(root, name)
        assert command is not None, f"rmq has no command {name!r}"
        rest, dropped = _without_pending(command, rest)
        sub = command.make_context(name, rest, parent=root)
    return Parsed(name, dict(root.params), dict(sub.params), dropped)


def _split(args: list[str]) -> tuple[list[str], str, list[str]]:
    """``rmq``'s own options, the subcommand's name, and the subcommand's arguments."""
    takes_value = {
        opt
        for p in cli.params
        if isinstance(p, click.Option) and not p.is_flag and not p.count
        for opt in p.opts
    }
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in takes_value else 1
    assert i < len(args), f"no rmq subcommand in {args}"
    return args[:i], args[i], args[i + 1 :]


def _without_pending(command: click.Command, args: list[str]) -> tuple[list[str], tuple[str, ...]]:
    known = {opt for p in command.params for opt in getattr(p, "opts", ())}
    missing = [flag for flag in PENDING_FLAGS if flag not in known]
    kept: list[str] = []
    dropped: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in missing:
            dropped.append(arg)
            skip = True  # its value
        elif arg.split("=", 1)[0] in missing:
            dropped.append(arg.split("=", 1)[0])
        else:
            kept.append(arg)
    return kept, tuple(dropped)


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` over os.environ, less the variables rmq's options read (a developer's
    RMQ_QDRANT must not stand in for the manifest's)."""
    read = {v for p in cli.params if isinstance(p, click.Option) and p.envvar for v in _names(p.envvar)}
    base = {k: v for k, v in os.environ.items() if k not in read}
    with mock.patch.dict(os.environ, {**base, **env}, clear=True):
        yield


def _names(envvar: str | Sequence[str]) -> list[str]:
    return [envvar] if isinstance(envvar, str) else list(envvar)


def envvar_of(option: str) -> str:
    """The environment variable rmq reads for one of its own options (``--qdrant``)."""
    for param in cli.params:
        if isinstance(param, click.Option) and option in param.opts:
            assert isinstance(param.envvar, str), f"rmq {option} reads no single variable"
            return param.envvar
    raise AssertionError(f"rmq has no option {option}")


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value given to ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``), None if absent."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def pod_templates() -> list[tuple[str, dict[str, Any]]]:
    """Every pod template under deploy/: (where, template), Jobs' and the RayJob's groups'."""
    found = []
    for doc in documents():
        body = doc.body
        if not isinstance(body, dict):
            continue
        if body.get("kind") == "Job":
            found.append((f"{doc.id} Job", body["spec"]["template"]))
        if body.get("kind") == "RayJob":
            cluster = body["spec"]["rayClusterSpec"]
            found.append((f"{doc.id} head", cluster["headGroupSpec"]["template"]))
            for group in cluster.get("workerGroupSpecs", []):
                found.append((f"{doc.id} {group['groupName']}", group["template"]))
    return found


def project_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert match, "pyproject.toml has no version"
    return match.group(1)


def dockerfile_ray_version() -> str:
    text = (ROOT / "docker" / "Dockerfile").read_text(encoding="utf-8")
    match = re.search(r"^ARG RAY_VERSION=(\S+)$", text, re.M)
    assert match, "docker/Dockerfile sets no default RAY_VERSION"
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-", text, re.M), "the base is not Ray's image"
    return match.group(1)
