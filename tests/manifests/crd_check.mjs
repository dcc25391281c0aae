// node crd_check.mjs NODE_DIR < documents.json
// Checks custom resources (a JSON array on stdin) with the validators the @kubernetes-models packages ship, compiled
// with ajv from the CRDs' OpenAPI schemas: types, enums, required fields, patterns, ranges, lengths. They do NOT reject
// unknown fields (httproute.schema.json does, for HTTPRoute). The Gateway API's kinds (@kubernetes-models/gateway-api)
// and the Prometheus Operator's (@kubernetes-models/prometheus-operator). Prints a JSON array of error lists, one per
// document. NODE_DIR is where tests/manifests/setup.sh installed the packages; their modules are imported by path, so
// this file runs from the checkout.
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const packages = { "gateway.networking.k8s.io": "gateway-api", "monitoring.coreos.com": "prometheus-operator" };
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const out = [];
for (const doc of JSON.parse(Buffer.concat(chunks).toString())) {
  const [group, version] = String(doc.apiVersion).split("/");
  const name = `${doc.apiVersion} ${doc.kind}`;
  let errors = [];
  if (!Object.hasOwn(packages, group) || ![version, doc.kind].every((part) => /^[A-Za-z0-9.-]+$/.test(String(part)))) {
    out.push([`no model for ${name}`]);
    continue;
  }
  const models = join(process.argv[2], "node_modules", "@kubernetes-models", packages[group]);
  try {
    const module = await import(pathToFileURL(join(models, group, version, `${doc.kind}.js`)).href);
    new module[doc.kind](doc).validate();
  } catch (error) {
    if (error.code === "ERR_MODULE_NOT_FOUND") errors = [`no model for ${name}`];
    else if (Array.isArray(error.errors)) errors = error.errors.map((e) => `${e.instancePath || "/"}: ${e.message}`);
    else errors = [String(error.message || error)];
  }
  out.push([...new Set(errors)]);
}
process.stdout.write(JSON.stringify(out));
