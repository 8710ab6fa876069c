// The router: the part of the address after '#' names the page (#/run/0/item/ID) and, after '?', its filters.
// Each page is drawn from the JSON of the same route (/api/run/0/item/ID): its JSON twin.

import { append, clear, h } from "af/dom.js";
import { exported, getJSON, NotFound } from "af/data.js";
import * as compare from "af/compare.js";
import * as home from "af/home.js";
import * as item from "af/item.js";
import * as run from "af/run.js";
import * as steps from "af/steps.js";
import * as train from "af/train.js";

const ROUTES = [
  [/^\/$/, home.render],
  [/^\/run\/(\d+)$/, run.render],
  [/^\/run\/(\d+)\/item\/([^/]+)$/, item.renderItem],
  [/^\/trajectory\/(\d+)$/, item.renderFile],
  [/^\/compare\/(\d+)\/(\d+)$/, compare.render],
  [/^\/compare\/(\d+)\/(\d+)\/item\/([^/]+)$/, compare.renderItem],
  [/^\/train\/(\d+)$/, train.render],
  [/^\/train\/(\d+)\/step\/(\d+)$/, steps.renderStep],
  [/^\/train\/(\d+)\/step\/(\d+)\/rollout\/([^/]+)$/, steps.renderRollout],
  [/^\/train\/(\d+)\/eval\/([^/]+)$/, steps.renderEval],
];
const POLL_MS = 2000;

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const live = document.getElementById("live");
const jsonLink = document.getElementById("json");
let current = 0;
let timers = [];
let index = null;

function context(route, params, token) {
  return {
    main,
    route,
    params,
    exported,
    alive: () => token === current,
    crumbs(list) {
      clear(crumbs);
      list.forEach(([label, href], i) => {
        if (i) crumbs.append(h("span", { class: "sep" }, "/"));
        crumbs.append(href ? h("a", { href }, label) : h("span", null, label));
      });
      document.title = `${list.map(([label]) => label).join(" / ")} · agentflow view`;
    },
    // Poll while the page is shown and visible (served pages only: an export is a snapshot).
    every(fn) {
      if (exported) return;
      let busy = false;
      timers.push(
        setInterval(async () => {
          if (busy || document.hidden || token !== current) return;
          busy = true;
          try {
            await fn();
          } catch (err) {
            console.warn("live update failed:", err);
          } finally {
            busy = false;
          }
        }, POLL_MS),
      );
    },
    // The "live" mark: this page follows a run that is still being written.
    live(on) {
      if (token === current) live.hidden = exported || !on;
    },
    // Keep filters in the address, so reload and the back button return to the same view. A page left
    // behind (a search's debounce firing after a link was followed) must not rewrite the new page's address,
    // even before the browser has dispatched that link's hashchange (the address has changed already).
    setParams(values) {
      if (token !== current || addressed()[0] !== route) return;
      const query = new URLSearchParams(Object.entries(values).filter(([, v]) => v !== "" && v !== null));
      const text = query.toString();
      history.replaceState(null, "", "#" + route + (text ? "?" + text : ""));
    },
  };
}

// The route and query the address names now.
function addressed() {
  const [path, query = ""] = location.hash.slice(1).split("?");
  return [path || "/", query];
}

async function show() {
  current += 1;
  const token = current;
  timers.forEach(clearInterval);
  timers = [];
  live.hidden = true;
  document.body.removeAttribute("data-ready");
  const [route, query] = addressed();
  index = index || (await getJSON("/"));
  if (route === "/" && index.home !== "/") {
    location.replace("#" + index.home);
    return;
  }
  jsonLink.hidden = exported;
  if (!exported) jsonLink.setAttribute("href", "/api" + route);
  const match = ROUTES.map(([pattern, page]) => [route.match(pattern), page]).find(([m]) => m);
  try {
    if (!match) throw new NotFound(`no page ${route}`);
    const [groups, page] = match;
    const args = groups.slice(1).map(decodeURIComponent);
    await page(context(route, new URLSearchParams(query), token), index, ...args);
  } catch (err) {
    if (token !== current) return;
    clear(main);
    append(main, [
      h("h1", null, err instanceof NotFound ? "Not found" : "Something went wrong"),
      h("p", { class: "error-text" }, String(err.message || err)),
      h("p", null, h("a", { href: "#/" }, "back to the start")),
    ]);
  }
  if (token === current) {
    document.body.dataset.ready = route;
    performance.mark("agentflow-view:ready");
    window.scrollTo(0, 0);
  }
}

window.addEventListener("hashchange", show);
show();
