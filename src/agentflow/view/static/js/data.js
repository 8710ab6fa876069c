// Where a page's JSON comes from: the server's /api/ (its JSON twin), or, in an exported file, the gzip'd
// answers written into the page by `agentflow view --export`.

const blob = document.getElementById("af-data");
export const exported = blob !== null;
const bundle = exported ? JSON.parse(blob.textContent) : null;
const unpacked = new Map();

export const enc = encodeURIComponent;

async function gunzip(base64) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

export class NotFound extends Error {}

/** The JSON answer of a route such as "/run/0" (query: live updates, served pages only). */
export async function getJSON(route, query = null) {
  if (exported) {
    if (!(route in bundle)) throw new NotFound(`${route} is not part of this export`);
    if (!unpacked.has(route)) unpacked.set(route, gunzip(bundle[route]));
    return unpacked.get(route);
  }
  const search = query ? "?" + new URLSearchParams(query) : "";
  const response = await fetch("/api" + route + search, { cache: "no-store" });
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (response.status === 404) throw new NotFound(body.error || "not found");
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}
