// The type tests/manifests/setup.sh turns into httproute.schema.json (ts-json-schema-generator): HTTPRoute v1 as
// @kubernetes-models/gateway-api 2.0.0 declares it, generated from Gateway API v1.5.1's CRDs, experimental channel
// included (HTTPRouteRule.sessionPersistence). Its interfaces list every field, so the schema rejects unknown ones
// (additionalProperties: false), which the package's own validators (crd_check.mjs) do not.
import type { IHTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute";

export type HTTPRoute = IHTTPRoute;
