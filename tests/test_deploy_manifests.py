"""The deployment manifests (compose, Kubernetes, Slurm) run the same compileq with the same settings.

docker-compose.yml is the one the stack test runs for real; the Kubernetes manifests and Slurm
scripts are checked against it, so a flag or variable renamed in one place fails here.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parents[1]
K8S = ROOT / "deploy" / "k8s"
SLURM = ROOT / "deploy" / "slurm"
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
WORKER_COMMANDS = {
    "gpu": SERVICES["worker"]["command"],
    "cpu": SERVICES["worker-cpu"]["command"],
}
SETTINGS = set(SERVICES["worker-cpu"]["environment"])


def k8s_objects() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def k8s_containers(kind: str | None = None) -> dict[str, dict[str, Any]]:
    """Every container of every workload, by ``<object name>/<container name>``."""
    found = {}
    for obj in k8s_objects():
        if kind and obj["kind"] != kind:
            continue
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []):
            found[f"{obj['metadata']['name']}/{c['name']}"] = c
    return found


def shell_commands(path: Path) -> list[list[str]]:
    """The script's commands as argv lists (continuation lines joined, comments dropped)."""
    text = path.read_text().replace("\\\n", " ")
    lines = [line.split(" #", 1)[0].strip() for line in text.splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


def compileq_argv(argv: list[str]) -> list[str]:
    """From ``compileq`` on, up to a shell operator (``srun ... compileq worker ... &``)."""
    start = argv.index("compileq")
    end = next((i for i, a in enumerate(argv) if a in ("&", "&&", "|", ";")), len(argv))
    return argv[start:end]


def test_the_compose_file_requires_the_secret_and_uses_two_redis_instances() -> None:
    assert SERVICES["worker-cpu"]["environment"]["COMPILEQ_SECRET"].startswith(
        "${COMPILEQ_SECRET:?"
    )
    assert "--maxmemory-policy noeviction" in SERVICES["broker"]["command"]
    assert "--maxmemory-policy allkeys-lru" in SERVICES["cache"]["command"]
    assert "--maxmemory " in SERVICES["cache"]["command"]
    # Every rank keeps a connection to each: Redis's default of 10,000 clients refuses a
    # 1,000-node start (docs/DEPLOY.md, Capacity).
    assert all("--maxclients 65000" in SERVICES[s]["command"] for s in ("broker", "cache"))


def test_only_flower_publishes_a_host_port_and_only_on_loopback() -> None:
    published = {name: s["ports"] for name, s in SERVICES.items() if s.get("ports")}
    assert published == {"flower": ["127.0.0.1:5555:5555"]}


def test_every_compose_service_has_a_restart_policy_and_long_running_ones_a_healthcheck() -> None:
    for name, service in SERVICES.items():
        assert "restart" in service, name
        if service["restart"] != "no" and name != "flower":
            assert "healthcheck" in service, name


def test_compose_accepts_the_file() -> None:
    plugin = shutil.which("docker") and subprocess.run(
        ["docker", "compose", "version"], capture_output=True
    )
    if not (shutil.which("docker-compose") or (plugin and plugin.returncode == 0)):
        if os.environ.get("CI"):
            pytest.fail("docker compose is required in CI (make docker installs it)")
        pytest.skip("neither docker compose nor docker-compose is installed")
    env = {k: v for k, v in os.environ.items() if k != "COMPILEQ_SECRET"}

    def config(*profile: str, **more: str) -> subprocess.CompletedProcess[str]:
        command = [str(ROOT / "docker" / "stack.sh"), "compose", *profile, "config"]
        return subprocess.run(command, env={**env, **more}, capture_output=True, text=True)

    without = config()
    assert without.returncode != 0 and "COMPILEQ_SECRET" in without.stderr
    cpu = config("--profile", "cpu", COMPILEQ_SECRET="s")
    assert cpu.returncode == 0, cpu.stderr
    gpu = config("--profile", "gpu", COMPILEQ_SECRET="s")
    assert gpu.returncode == 0, gpu.stderr
    assert gpu.stdout.count("capabilities:") >= 2 and "- gpu" in gpu.stdout


def test_kubernetes_workers_run_the_same_commands_as_the_compose_workers() -> None:
    containers = k8s_containers("Deployment")
    assert containers["compileq-worker-gpu/worker"]["command"] == WORKER_COMMANDS["gpu"]
    assert containers["compileq-worker-cpu/worker"]["command"] == WORKER_COMMANDS["cpu"]
    gpu = containers["compileq-worker-gpu/worker"]["resources"]["limits"]
    assert int(gpu["nvidia.com/gpu"]) >= 1


def test_every_kubernetes_compileq_container_has_the_compose_settings_and_the_secret() -> None:
    compileq = {n: c for n, c in k8s_containers().items() if c["image"] == "compileq"}
    assert len(compileq) == 3  # the GPU and CPU workers and the training job
    for name, container in compileq.items():
        env = {e["name"]: e for e in container["env"]}
        assert set(env) == SETTINGS, name
        ref = env["COMPILEQ_SECRET"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("compileq", "COMPILEQ_SECRET"), name
        assert "value" not in env["COMPILEQ_SECRET"], name


def test_kubernetes_redis_has_the_compose_eviction_policies() -> None:
    containers = k8s_containers("Deployment")
    broker = " ".join(containers["compileq-broker/redis"]["args"])
    cache = " ".join(containers["compileq-cache/redis"]["args"])
    assert "--maxmemory-policy noeviction" in broker
    assert "--maxmemory-policy allkeys-lru" in cache and "--maxmemory " in cache
    assert "--maxclients 65000" in broker and "--maxclients 65000" in cache
    services = {o["metadata"]["name"] for o in k8s_objects() if o["kind"] == "Service"}
    urls = {
        e["value"]
        for c in k8s_containers().values()
        for e in c.get("env", [])
        if e["name"] in ("COMPILEQ_BROKER_URL", "COMPILEQ_REDIS_URL")
    }
    assert {u.split("//")[1].split(":")[0] for u in urls} == services


def test_the_kubernetes_training_job_is_wrapped_in_compileq_run() -> None:
    job = k8s_containers("Job")["compileq-train-example/trainer"]
    assert job["command"][:3] == ["compileq", "run", "--"]


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests


def test_slurm_scripts_run_the_compose_worker_commands_and_wrap_training_in_compileq_run() -> None:
    workers, runs = [], []
    for script in sorted(SLURM.glob("*.sbatch")):
        for argv in shell_commands(script):
            if "compileq" in argv:
                cmd = compileq_argv(argv)
                (workers if cmd[1] == "worker" else runs).append(cmd)
                assert argv[0] == "srun", f"{script.name}: {argv}"  # one per node, by Slurm
    assert {tuple(w) for w in workers} == {tuple(c) for c in WORKER_COMMANDS.values()}
    assert runs and all(r[:3] == ["compileq", "run", "--"] for r in runs)


def test_slurm_scripts_set_the_compose_settings_and_require_the_secret() -> None:
    env_sh = (SLURM / "env.sh").read_text()
    exported = {
        argv[1].split("=", 1)[0] for argv in shell_commands(SLURM / "env.sh") if argv[0] == "export"
    }
    assert exported == SETTINGS
    assert "${COMPILEQ_SECRET:?" in env_sh
    # From the submit directory: sbatch runs a copy of the script from slurmd's spool directory,
    # so "$(dirname "$0")" would not find env.sh (tests/test_slurm.py runs them under Slurm).
    for script in SLURM.glob("*.sbatch"):
        assert 'source "${SLURM_SUBMIT_DIR:-.}/deploy/slurm/env.sh"' in script.read_text(), script


# -- the Kubernetes manifests against the Kubernetes API's own schemas -------------------------

#: The oldest and newest Kubernetes releases the manifests are checked against (schemas ship in
#: kubernetes-validate; strict: a misspelt or unknown field fails, not only a wrong type).
K8S_VERSIONS = ("1.30.0", "1.37.0")


def _k8s_objects() -> list[tuple[str, dict[str, Any]]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    objects = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            if doc:
                objects.append((f"{name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return objects


def test_every_resource_kustomize_applies_exists_and_nothing_else_lies_beside_them() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_kubernetes_manifests_validate_strictly_against_the_api_schemas(version: str) -> None:
    import kubernetes_validate

    objects = _k8s_objects()
    assert {doc["kind"] for _, doc in objects} >= {"Deployment", "Service", "Job"}
    for where, doc in objects:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{where} is not valid for Kubernetes {version}: {e}") from e


def test_the_schema_check_catches_a_misspelt_field() -> None:
    import copy

    import kubernetes_validate

    doc = next(d for _, d in _k8s_objects() if d["kind"] == "Deployment")
    broken = copy.deepcopy(doc)
    spec = broken["spec"]["template"]["spec"]
    spec["contaners"] = spec.pop("containers")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)
