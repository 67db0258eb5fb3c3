"""Draws the sample in this folder from a clone of github.com/yannh/kubernetes-json-schema
(or a mirror of it): ``python sample.py PATH_TO_CLONE [VERSION]``. Takes the kinds listed
below from ``<VERSION>-standalone-strict/`` (every ``$ref`` inlined, objects closed with
``additionalProperties: false``, as kubeconform validates in strict mode) and writes each
as compact JSON (whitespace is the only change: the pretty-printed pod-template kinds are
twice the size). Instances are generated afterwards by ``scripts/corpus_instances.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The kinds people write by hand most, across the API groups; one file per kind (its
# group-version file). The pod-template kinds are large (the whole PodSpec inlined).
KINDS = [
    "pod-v1", "deployment-apps-v1", "statefulset-apps-v1", "job-batch-v1", "cronjob-batch-v1",
    "service-v1", "configmap-v1", "secret-v1", "serviceaccount-v1", "namespace-v1", "node-v1",
    "endpoints-v1", "persistentvolume-v1", "persistentvolumeclaim-v1", "limitrange-v1",
    "resourcequota-v1", "ingress-networking-v1", "ingressclass-networking-v1",
    "networkpolicy-networking-v1", "endpointslice-discovery-v1", "storageclass-storage-v1",
    "csidriver-storage-v1", "role-rbac-v1", "rolebinding-rbac-v1", "clusterrole-rbac-v1",
    "clusterrolebinding-rbac-v1", "horizontalpodautoscaler-autoscaling-v2",
    "poddisruptionbudget-policy-v1", "priorityclass-scheduling-v1", "runtimeclass-node-v1",
    "lease-coordination-v1", "event-events-v1", "customresourcedefinition-apiextensions-v1",
    "validatingwebhookconfiguration-admissionregistration-v1",
    "mutatingwebhookconfiguration-admissionregistration-v1", "certificatesigningrequest-certificates-v1",
    "apiservice-apiregistration-v1", "flowschema-flowcontrol-v1",
]


def main() -> None:
    repo, version = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "v1.32.2"
    out = HERE / "schemas"
    out.mkdir(exist_ok=True)
    for kind in KINDS:
        text = subprocess.run(["git", "-C", repo, "show", f"HEAD:{version}-standalone-strict/{kind}.json"],
                              check=True, capture_output=True, text=True).stdout
        schema = json.loads(text)
        (out / f"{kind}.json").write_text(json.dumps(schema, separators=(",", ":"), ensure_ascii=False) + "\n",
                                          encoding="utf-8")
    commit = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%H %cI"], check=True,
                            capture_output=True, text=True).stdout.split()
    print(f"{len(KINDS)} kinds of {version}; commit {commit[0]} ({commit[1]})")


if __name__ == "__main__":
    main()
