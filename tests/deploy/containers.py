"""Run a rendered pod's containers with Docker on the host network, as the kubelet would run them.

A container spec from the chart's manifests becomes a `docker run`: the same command, arguments and
environment (fieldRef values supplied, `$(VAR)` references expanded as Kubernetes does), the same user,
read-only root filesystem, dropped capabilities, ConfigMaps as read-only directories, emptyDirs as tmpfs
and claims as named volumes. Names and ports are the caller's business (TextMap), since on one host
every pod shares the loopback interface.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.deploy.engine import run


def pod_env(container: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, str]:
    """The container's environment: literal values with $(VAR) expanded, fieldRefs looked up in fields."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@dataclass
class Pod:
    """One pod of a rendered workload, run as Docker containers named after it."""

    name: str
    spec: dict[str, Any]  # the pod template's spec
    image: str
    fields: dict[str, str]
    workdir: Path
    rewrite: Callable[[str], str] = lambda text: text
    add_hosts: list[str] = field(default_factory=list)
    volumes: dict[str, str] = field(default_factory=dict)  # claim name -> docker volume
    configmaps: dict[str, Mapping[str, str]] = field(default_factory=dict)  # ConfigMap name -> data

    def docker_run(self, container: Mapping[str, Any], name: str, detach: bool) -> list[str]:
        """The `docker run` arguments that run container as the kubelet would in this pod."""
        security = {**self.spec.get("securityContext", {}), **container.get("securityContext", {})}
        args = ["docker", "run", "--name", name, "--network", "host", "--init=false"]
        args += ["-d"] if detach else []
        if "runAsUser" in security:
            args += ["--user", f"{security['runAsUser']}:{security.get('runAsGroup', security['runAsUser'])}"]
        if security.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        for cap in security.get("capabilities", {}).get("drop", []):
            args += ["--cap-drop", cap]
        if security.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        for host in self.add_hosts:
            args += ["--add-host", f"{host}:127.0.0.1"]
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            args += self._mount(volumes.get(mount["name"]), mount)
        for key, value in pod_env(container, self.fields).items():
            args += ["-e", f"{key}={self.rewrite(value)}"]
        command = [self.rewrite(c) for c in container.get("command", [])]
        if command:
            args += ["--entrypoint", command[0]]
        return [*args, self.image, *command[1:], *(self.rewrite(a) for a in container.get("args", []))]

    def _mount(self, volume: Mapping[str, Any] | None, mount: Mapping[str, Any]) -> list[str]:
        path = mount["mountPath"]
        if volume is None:  # a volumeClaimTemplate
            return ["-v", f"{self.volumes[mount['name']]}:{path}"]
        if "emptyDir" in volume:
            return ["--mount", f"type=tmpfs,destination={path},tmpfs-mode=1777"]
        if "configMap" in volume:
            directory = self.workdir / f"{self.name}-{volume['name']}"
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o755)
            for key, text in self.configmaps[volume["configMap"]["name"]].items():
                (directory / key).write_text(self.rewrite(text))
                (directory / key).chmod(0o644)
            return ["-v", f"{directory}:{path}:ro"]
        raise ValueError(f"volume kind not emulated: {volume}")

    def run_init_containers(self, timeout: float) -> None:
        for container in self.spec.get("initContainers", []):
            name = f"{self.name}-{container['name']}"
            try:
                run(self.docker_run(container, name, detach=False), timeout)
            finally:
                run(["docker", "rm", "-f", name], 60, check=False)

    def start(self) -> str:
        """Start the pod's (one) main container; returns its docker name."""
        (container,) = self.spec["containers"]
        run(self.docker_run(container, self.name, detach=True), 60)
        return self.name


def logs(name: str) -> str:
    done = run(["docker", "logs", name], 60, check=False)
    return done.stdout + done.stderr


def serving(port: int, timeout: float = 1.0) -> bool:
    """Whether grpc.health.v1 on 127.0.0.1:port answers SERVING, as the kubelet's grpc probe asks."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def wait_serving(name: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if serving(port):
            return
        state = run(["docker", "inspect", "-f", "{{.State.Running}}", name], 30, check=False).stdout.strip()
        if state == "false":
            raise RuntimeError(f"{name} exited:\n{logs(name)[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{name} not serving on {port} within {timeout} s:\n{logs(name)[-3000:]}")


def exit_code(name: str) -> int:
    return int(run(["docker", "inspect", "-f", "{{.State.ExitCode}}", name], 30).stdout.strip())


def remove(names: list[str], volumes: list[str]) -> None:
    if names:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, timeout=120, check=False)
    if volumes:
        subprocess.run(["docker", "volume", "rm", "-f", *volumes], capture_output=True, timeout=120, check=False)
