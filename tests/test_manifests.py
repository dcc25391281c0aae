"""deploy/'s manifests, checked offline as a cluster and Envoy would read them.

Kubernetes' core kinds against the API's schemas (kubernetes-validate, strict: unknown fields are errors), the
HTTPRoute against Gateway API's (a strict schema generated from @kubernetes-models/gateway-api's types, and that
package's own validators, in node), Envoy's config as a v3 Bootstrap (envoy-data-plane); then the Deployment's settings
against each other and against gymhost; the Prometheus alerting rules with promtool (Debian's `prometheus`): checked,
and unit-tested on series that should and should not fire each. The tools live in a venv of their own with node's
beside it, built by tests/manifests/setup.sh: run this tier with `make test-manifests`.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .deployment import confined_deployment, seccomp_profile

pytestmark = [
    pytest.mark.unit,
    pytest.mark.manifests,
    # envoy-data-plane 2.2.0's models, under pydantic 2.12 and later (not ours to fix)
    pytest.mark.filterwarnings("ignore:Using `@model_validator` with mode='after' on a classmethod:DeprecationWarning"),
]

REPO = Path(__file__).resolve().parent.parent
KUBERNETES = REPO / "deploy" / "kubernetes" / "gymhost.yaml"
ENVOY = REPO / "deploy" / "envoy" / "envoy.yaml"
ALERTS = REPO / "deploy" / "prometheus" / "gymhost-alerts.yaml"
SOURCES = REPO / "tests" / "manifests"
TOOLS = Path(sys.prefix)  # the venv setup.sh built
NODE = TOOLS / "node"
SETUP_INPUTS = ("package.json", "httproute.ts", "podmonitor.ts", "tsconfig.json")  # copied into NODE by setup.sh
# The Kubernetes release the core kinds are checked against (kubernetes-validate 1.37.0 has schemas for 1.25 to 1.37).
KUBERNETES_VERSION = "1.33"
# The custom resources' API groups crd_check.mjs has models of (package.json's @kubernetes-models packages).
CRD_GROUPS = ("gateway.networking.k8s.io/", "monitoring.coreos.com/")
# The custom resources deploy/ uses that setup.sh made strict schemas of (NODE/<name>.schema.json).
STRICT_SCHEMAS = {
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor",
}

Document = dict[str, Any]


@pytest.fixture(scope="module", autouse=True)
def toolset() -> None:
    """This tier runs only in setup.sh's venv, with inputs as the checkout has them; anywhere else it fails."""
    rebuild = "run this tier with `make test-manifests` (it builds .venv-manifests with tests/manifests/setup.sh)"
    missing = [m for m in ("kubernetes_validate", "envoy_data_plane", "jsonschema", "yaml") if not _importable(m)]
    built = [NODE / "node_modules", *(NODE / f"{name}.schema.json" for name in STRICT_SCHEMAS.values())]
    missing += [str(path) for path in built if not path.exists()]
    missing += [] if shutil.which("node") else ["node"]
    if missing:
        pytest.fail(f"the manifests tier's tools are missing ({', '.join(missing)}): {rebuild}")
    built_from = {TOOLS / "requirements.txt": "requirements.txt"} | {NODE / n: n for n in SETUP_INPUTS}
    stale = [
        name
        for built, name in built_from.items()
        if not built.is_file() or built.read_bytes() != (SOURCES / name).read_bytes()
    ]
    if stale:
        pytest.fail(f"{TOOLS} was built from other tests/manifests/{', '.join(stale)}: rm -rf {TOOLS}, then {rebuild}")


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _load_all(path: Path) -> list[Document]:
    import yaml

    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _one(kind: str) -> Document:
    manifest = KUBERNETES.parent / "podmonitor.yaml" if kind == "PodMonitor" else KUBERNETES
    docs = [doc for doc in _load_all(manifest) if doc.get("kind") == kind]
    assert len(docs) == 1, f"{manifest.name} should have one {kind}, has {len(docs)}"
    return docs[0]


def _values(node: Any, key: str) -> Iterator[Any]:
    """Every value under ``key`` at any depth (``@type`` in Envoy's config, ``secretKeyRef`` in a pod spec)."""
    if isinstance(node, dict):
        if key in node:
            yield node[key]
        for value in node.values():
            yield from _values(value, key)
    elif isinstance(node, list):
        for value in node:
            yield from _values(value, key)


def _path(parts: Iterable[Any]) -> str:
    return ".".join(map(str, parts)) or "(top level)"


def core_errors(doc: Document) -> list[str]:
    """kubernetes-validate reports the first error only: enough to fail on."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{_path(error.path)}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [str(error.message)]
    return []


def strict_errors(doc: Document, schema: str) -> list[str]:
    """A strict schema (setup.sh's, from the package's types) rejects unknown fields, which the package's validators
    (``crd_errors``) do not; those check patterns, ranges and lengths."""
    import jsonschema

    strict = json.loads((NODE / f"{schema}.schema.json").read_text())
    errors = [
        f"schema: {_path(error.absolute_path)}: {error.message}"
        for error in jsonschema.Draft7Validator(strict).iter_errors(doc)
    ]
    return errors + crd_errors(doc)


def crd_errors(doc: Document) -> list[str]:
    """A custom resource checked by its @kubernetes-models package's validators (crd_check.mjs)."""
    checked = subprocess.run(
        ["node", str(SOURCES / "crd_check.mjs"), str(NODE)],
        input=json.dumps([doc]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, f"crd_check.mjs failed: {checked.stderr}"
    return [f"{doc['apiVersion'].split('/')[0]}: {error}" for error in json.loads(checked.stdout)[0]]


def kubernetes_errors(doc: Document) -> list[str]:
    strict = STRICT_SCHEMAS.get((str(doc.get("apiVersion")), str(doc.get("kind"))))
    if strict is not None:
        return strict_errors(doc, strict)
    if str(doc.get("apiVersion")).startswith(CRD_GROUPS):
        return crd_errors(doc)
    return core_errors(doc)  # any other kind without a schema here is reported, not passed


def envoy_errors(config: Document) -> list[str]:
    """A typed_config is read by its @type, which envoy-data-plane resolves only once that module is imported."""
    from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap

    errors = []
    for url in sorted(set(_values(config, "@type"))):
        try:
            importlib.import_module("envoy_data_plane." + url.rpartition("/")[2].rpartition(".")[0])
        except ImportError:
            errors.append(f"@type {url}: no such package in envoy-data-plane")
    if errors:
        return errors
    try:
        Bootstrap.from_dict(config)
    except Exception as error:  # KeyError (unknown field), ValueError (value), TypeError (@type): all are errors
        return [f"{type(error).__name__}: {error}"]
    return []


@pytest.mark.parametrize(
    "manifest",
    [KUBERNETES, *(KUBERNETES.parent / name for name in ("ingress-nginx.yaml", "podmonitor.yaml"))],
    ids=lambda p: p.name,
)
def test_kubernetes_manifests_validate(manifest: Path) -> None:
    docs = _load_all(manifest)
    assert docs, f"{manifest} has no documents"
    failures = {f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}": kubernetes_errors(doc) for doc in docs}
    assert not any(failures.values()), "\n".join(f"{name}: {e}" for name, errors in failures.items() for e in errors)


def test_alert_rules_are_valid_and_fire_on_what_they_should_only() -> None:
    """``promtool check rules``, then ``promtool test rules`` (gymhost-alerts.test.yaml: for each rule, series that
    should fire it and series that should not, with the labels and annotations each alert carries)."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool (Debian's prometheus) is needed: make test-manifests installs it"
    for command in ("check", "test"):
        target = ALERTS if command == "check" else ALERTS.with_suffix(".test.yaml")
        result = subprocess.run([promtool, command, "rules", target.name], cwd=ALERTS.parent, capture_output=True,
                                text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout + result.stderr


def test_every_alert_has_a_runbook_in_the_docs() -> None:
    rules = [rule for group in _load_all(ALERTS)[0]["groups"] for rule in group["rules"]]
    operating = (REPO / "docs" / "operating.md").read_text()
    assert len(rules) >= 6
    for rule in rules:
        anchor = rule["annotations"]["runbook"].partition("#")[2]
        assert anchor == rule["alert"].lower(), rule["annotations"]["runbook"]
        assert f"### {rule['alert']}" in operating, f"docs/operating.md has no runbook for {rule['alert']}"


def test_envoy_config_is_a_v3_bootstrap() -> None:
    assert envoy_errors(_load_all(ENVOY)[0]) == []


def _container(doc: Document) -> Document:
    return doc["spec"]["template"]["spec"]["containers"][0]


def _rule(doc: Document) -> Document:
    return doc["spec"]["rules"][0]


def _typed_config(doc: Document, message: str) -> Document:
    [config] = [c for c in _values(doc, "typed_config") if c["@type"].endswith("." + message)]
    return config


def _rename(mapping: Document, old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


# (what is checked, the mistake, what the user is told: each line must appear among the errors)
MISTAKES = [
    pytest.param(
        "Deployment",
        lambda d: _rename(_container(d), "readinessProbe", "readinesProbe"),
        ["spec.template.spec.containers.0: Additional properties are not allowed ('readinesProbe' was unexpected)"],
        id="Deployment readinesProbe",
    ),
    pytest.param(
        "Deployment",
        lambda d: d["spec"].update(replicas="three"),
        ["spec.replicas: 'three' is not of type 'integer'"],
        id="Deployment replicas: three",
    ),
    pytest.param(
        "ConfigMap",
        lambda d: _rename(d, "data", "dat"),
        ["(top level): Additional properties are not allowed ('dat' was unexpected)"],
        id="ConfigMap dat",
    ),
    pytest.param(
        "Service",
        lambda d: _rename(d["spec"]["ports"][0], "targetPort", "targetport"),
        ["spec.ports.0: Additional properties are not allowed ('targetport' was unexpected)"],
        id="Service targetport",
    ),
    pytest.param(
        "HTTPRoute",
        lambda d: _rename(_rule(d), "sessionPersistence", "sessionPersistance"),
        ["schema: spec.rules.0: Additional properties are not allowed ('sessionPersistance' was unexpected)"],
        id="HTTPRoute sessionPersistance",
    ),
    pytest.param(
        "HTTPRoute",
        lambda d: _rule(d)["sessionPersistence"].update(type="Cookies"),
        [
            "schema: spec.rules.0.sessionPersistence.type: 'Cookies' is not one of ['Cookie', 'Header']",
            "gateway.networking.k8s.io: /spec/rules/0/sessionPersistence/type: must be equal to one of the allowed "
            "values",
        ],
        id="HTTPRoute type: Cookies",
    ),
    pytest.param(
        "HTTPRoute",
        lambda d: _rule(d)["backendRefs"][0].update(port=70000),
        ["gateway.networking.k8s.io: /spec/rules/0/backendRefs/0/port: must be <= 65535"],
        id="HTTPRoute port 70000",
    ),
    pytest.param(
        "PodMonitor",
        lambda d: d["spec"]["podMetricsEndpoints"][0].update(scheme="htp"),
        ["monitoring.coreos.com: /spec/podMetricsEndpoints/0/scheme: must be equal to one of the allowed values"],
        id="PodMonitor scheme htp",
    ),
    pytest.param(
        "PodMonitor",
        lambda d: d["spec"].update(podMetricEndpoints=d["spec"].pop("podMetricsEndpoints")),
        ["schema: spec: Additional properties are not allowed ('podMetricEndpoints' was unexpected)"],
        id="PodMonitor podMetricEndpoints",
    ),
    pytest.param(
        "envoy",
        lambda d: _rename(d["static_resources"]["clusters"][0], "connect_timeout", "connect_timout"),
        ["KeyError: \"Unknown field 'connect_timout' in message Cluster."],
        id="Envoy connect_timout",
    ),
    pytest.param(
        "envoy",
        lambda d: _typed_config(d, "StatefulSession").update(strictt=False),
        ["KeyError: \"Unknown field 'strictt' in message StatefulSession."],
        id="Envoy strictt, in a typed_config",
    ),
    pytest.param(
        "envoy",
        lambda d: _typed_config(d, "StatefulSession").update(
            {"@type": _typed_config(d, "StatefulSession")["@type"] + "s"}
        ),
        ["TypeError: Can't unpack unregistered type: type.googleapis.com/", ".StatefulSessions"],
        id="Envoy @type StatefulSessions",
    ),
]


@pytest.mark.parametrize(("kind", "mistake", "reported"), MISTAKES)
def test_mistakes_are_reported(kind: str, mistake: Callable[[Document], None], reported: list[str]) -> None:
    """Each validator rejects a typical slip, so that the passing tests above cannot pass vacuously."""
    doc = copy.deepcopy(_load_all(ENVOY)[0] if kind == "envoy" else _one(kind))
    mistake(doc)
    errors = envoy_errors(doc) if kind == "envoy" else kubernetes_errors(doc)
    assert [line for line in reported if not any(line in error for error in errors)] == [], errors


def _flags(args: list[str]) -> dict[str, str]:
    return dict(arg.partition("=")[::2] for arg in args if arg.startswith("--"))


def test_deployment_outlasts_its_drain() -> None:
    """Kubernetes kills a pod at terminationGracePeriodSeconds; gymhost must drain and stop on its own before."""
    pod = _one("Deployment")["spec"]["template"]["spec"]
    flags = _flags(_container(_one("Deployment"))["args"])
    timeouts = ("--drain-timeout", "--graceful-timeout")
    assert set(timeouts) <= flags.keys(), f"the args should give {' and '.join(timeouts)} (as --name=seconds)"
    drain = sum(int(flags[name]) for name in timeouts)
    assert pod["terminationGracePeriodSeconds"] > drain, f"the grace period must exceed {drain}s"


def test_the_autoscaler_and_the_disruption_budget_govern_the_deployment() -> None:
    """The HorizontalPodAutoscaler scales the Deployment, which leaves its replica count to it; the budget selects its
    pods; a scale-in removes one replica at a time, no faster than a replica drains; the episodes metric it reads is
    the one prometheus-adapter serves and gymhost exports."""
    deployment, autoscaler, budget = _one("Deployment"), _one("HorizontalPodAutoscaler"), _one("PodDisruptionBudget")
    assert autoscaler["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert "replicas" not in deployment["spec"], "kubectl apply would reset the autoscaler's count"
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"]["maxUnavailable"] == 1
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    down = autoscaler["spec"]["behavior"]["scaleDown"]["policies"]
    assert all(policy["type"] == "Pods" and policy["value"] == 1 for policy in down)
    assert all(policy["periodSeconds"] >= grace for policy in down), "a replica removed before the last one drained"
    pods_metrics = [
        metric["pods"]["metric"]["name"] for metric in autoscaler["spec"]["metrics"] if metric["type"] == "Pods"
    ]
    adapter = _load_all(REPO / "deploy" / "prometheus" / "adapter-rules.yaml")[0]["rules"]
    served = {rule["name"]["as"] for rule in adapter}
    assert pods_metrics
    assert set(pods_metrics) <= served
    exported = (REPO / "src" / "gymhost" / "_metrics.py").read_text()
    assert all(f'"{name}"' in exported for name in pods_metrics), (
        "the autoscaler reads a metric gymhost does not export"
    )
    assert {"cpu"} <= {
        metric["resource"]["name"] for metric in autoscaler["spec"]["metrics"] if metric["type"] == "Resource"
    }


def test_the_ingress_alternative_routes_to_the_service_with_the_routes_cookie() -> None:
    """The Ingress sends everything to the Service the HTTPRoute does, keeping episodes on their replica by the same
    cookie name."""
    (ingress,) = _load_all(KUBERNETES.parent / "ingress-nginx.yaml")
    service, route = _one("Service"), _one("HTTPRoute")
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"]["name"] == service["metadata"]["name"]
    assert path["backend"]["service"]["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/affinity"] == "cookie"
    cookie = route["spec"]["rules"][0]["sessionPersistence"]["sessionName"]
    assert annotations["nginx.ingress.kubernetes.io/session-cookie-name"] == cookie


def test_the_pod_monitor_scrapes_the_deployments_pods_with_its_token() -> None:
    """The PodMonitor selects the Deployment's pods, scrapes their http port's /metrics with the token the
    Deployment reads from the same Secret key, and names the job as the alert rules select it."""
    monitor = _one("PodMonitor")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    deployment = _one("Deployment")
    assert monitor["spec"]["selector"] == deployment["spec"]["selector"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {port["name"] for port in _container(deployment)["ports"]}
    assert endpoint["path"] == "/metrics"
    token = next(e for e in _container(deployment)["env"] if e["name"] == "GYMHOST_TOKEN")
    assert endpoint["authorization"]["credentials"] == token["valueFrom"]["secretKeyRef"]
    job = deployment["spec"]["template"]["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert "gymhost" in job, "GymhostReplicaDown selects the job by a name that holds gymhost"


def test_deployment_probes() -> None:
    container = _container(_one("Deployment"))
    ports = {port.get("name") for port in container["ports"]} | {port["containerPort"] for port in container["ports"]}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        assert probe in container, f"the container has no {probe}"
        assert container[probe]["httpGet"]["path"] == path, probe
        assert container[probe]["httpGet"]["port"] in ports, f"{probe}'s port is not one the container declares"


def test_deployment_resources() -> None:
    resources = _container(_one("Deployment"))["resources"]
    assert {section: sorted(resources.get(section, {})) for section in ("requests", "limits")} == {
        "requests": ["cpu", "memory"],
        "limits": ["cpu", "memory"],
    }


def test_deployment_runs_unprivileged() -> None:
    """runAsNonRoot needs a numeric user when the image names its own; a read-only root needs a writable /tmp."""
    pod = _one("Deployment")["spec"]["template"]["spec"]
    container = _container(_one("Deployment"))
    security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    assert security.get("runAsNonRoot") is True, "runAsNonRoot should be true"
    assert type(security.get("runAsUser")) is int, "runAsUser should be a number"
    assert security["runAsUser"] > 0, "runAsUser should not be root's"
    assert security.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem should be true"
    tmp = [mount["name"] for mount in container.get("volumeMounts", []) if mount["mountPath"] == "/tmp"]
    assert tmp, "nothing is mounted at /tmp"
    assert tmp[0] in {volume["name"] for volume in pod.get("volumes", [])}


def test_secret_keys_are_created_by_the_documented_command() -> None:
    """The secretKeyRefs must name the Secret and keys the file's `kubectl create secret` comment creates."""
    comments = "\n".join(
        line.strip().lstrip("#").strip() for line in KUBERNETES.read_text().splitlines() if line.strip().startswith("#")
    )
    command = re.search(r"kubectl create secret generic (\S+)(.*)", re.sub(r"\\\n", " ", comments))
    assert command, f"{KUBERNETES.name} has no `kubectl create secret generic` comment"
    created = set(re.findall(r"--from-(?:literal|file)=([^=\s]+)=", command[2]))
    refs = list(_values(_one("Deployment"), "secretKeyRef"))
    assert refs, "the Deployment reads no Secret"
    missing = {(ref["name"], ref["key"]) for ref in refs} - {(command[1], key) for key in created}
    assert not missing, f"read but not created by `kubectl create secret generic {command[1]}`: {sorted(missing)}"


def test_image_is_this_version() -> None:
    version = re.search(r'^__version__ = "([^"]+)"$', (REPO / "src/gymhost/_version.py").read_text(), re.MULTILINE)
    assert version
    image = _container(_one("Deployment"))["image"]
    tag = image.rpartition("/")[2].partition("@")[0].partition(":")[2]
    assert tag == version[1], f"{image}: the tag should be gymhost's version, {version[1]}"


def test_env_yaml_is_mounted_at_the_working_directory() -> None:
    """Gym reads env.yaml from the working directory: the ConfigMap's key must land there."""
    import yaml

    configmap = _one("ConfigMap")
    assert isinstance(yaml.safe_load(configmap["data"]["env.yaml"]), dict), "env.yaml should be a mapping"
    pod = _one("Deployment")["spec"]["template"]["spec"]
    container = _container(_one("Deployment"))
    volumes = {v["name"] for v in pod["volumes"] if v.get("configMap", {}).get("name") == configmap["metadata"]["name"]}
    mounts = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in volumes and "subPath" not in m]
    assert container.get("workingDir") in mounts, f"the ConfigMap is mounted at {mounts}, not at the workingDir"


def test_the_confined_overlay_validates_and_asks_for_what_namespaces_need() -> None:
    """deploy/kubernetes/confined: gymhost.yaml's Deployment in a user namespace of its own, /proc unmasked, the
    shipped seccomp profile (one that lets bubblewrap make namespaces) and --sandbox strict; the container tier runs
    the image as it runs it."""
    deployment = confined_deployment()
    assert kubernetes_errors(deployment) == []
    pod = deployment["spec"]["template"]["spec"]
    assert pod["hostUsers"] is False
    assert _container(deployment)["securityContext"]["procMount"] == "Unmasked"
    assert {"name": "GYMHOST_SANDBOX", "value": "strict"} in _container(deployment)["env"]
    profile = seccomp_profile(deployment)
    assert profile is not None, pod["securityContext"]
    assert profile.is_file(), profile
    rules = json.loads(profile.read_text())
    allowed = {name for rule in rules["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for name in rule["names"]}
    assert {"clone", "clone3", "unshare", "mount", "pivot_root", "umount2"} <= allowed
    assert rules["defaultAction"] == "SCMP_ACT_ERRNO"
    # Everything else of the base Deployment stands: the overlay only adds to it.
    base = _one("Deployment")
    assert _container(deployment)["args"] == _container(base)["args"]
    assert pod["securityContext"]["runAsUser"] == base["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
