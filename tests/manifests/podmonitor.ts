// The type tests/manifests/setup.sh turns into podmonitor.schema.json (ts-json-schema-generator): PodMonitor v1 as
// @kubernetes-models/prometheus-operator 6.0.0 declares it. Its interfaces list every field, so the schema rejects
// unknown ones (additionalProperties: false), which the package's own validators (crd_check.mjs) do not.
import type { IPodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";

export type PodMonitor = IPodMonitor;
