// Building the page. Every string becomes a text node and no code path parses HTML, so model text that
// contains <script> or markup is shown as the characters it is.

const SVG_NS = "http://www.w3.org/2000/svg";

function apply(el, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "href") el.setAttribute("href", String(value).startsWith("#") ? value : "#");
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** h("a", {href: "#/run/0", class: "x"}, "text", otherNode) */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  apply(el, props);
  return append(el, children);
}

/** The same for SVG elements. */
export function svg(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, props);
  return append(el, children);
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export function chip(text, kind = "", title = null) {
  return h("span", { class: `chip ${kind}`.trim(), title }, text);
}

export function section(title, ...children) {
  return h("section", { class: "block" }, h("h2", null, title), ...children);
}

/** Long text folded: the first lines, and a button that shows the rest. */
export function fold(text, { lines = 14, chars = 1600, kind = "" } = {}) {
  text = String(text ?? "");
  const all = text.split("\n");
  if (all.length <= lines && text.length <= chars) return h("pre", { class: `text ${kind}`.trim() }, text);
  let head = all.slice(0, lines).join("\n");
  if (head.length > chars) head = head.slice(0, chars);
  const pre = h("pre", { class: `text ${kind}`.trim() }, head + " …");
  const label = `show all (${all.length} lines, ${text.length.toLocaleString()} characters)`;
  const button = h("button", { class: "unfold", type: "button" }, label);
  button.addEventListener("click", () => {
    const open = button.dataset.open === "1";
    pre.textContent = open ? head + " …" : text;
    button.textContent = open ? label : "fold";
    button.dataset.open = open ? "0" : "1";
  });
  return h("div", { class: "fold" }, pre, button);
}

/** A key/value grid. pairs: [[label, value], ...]; empty values are left out. */
export function facts(pairs, { inline = false } = {}) {
  const dl = h("dl", { class: inline ? "facts inline" : "facts" });
  for (const [label, value] of pairs) {
    if (value === null || value === undefined || value === "") continue;
    dl.append(h("div", null, h("dt", null, label), h("dd", null, value)));
  }
  return dl;
}

/** A table; `num` lists the columns (by index) whose header sits right, over right-aligned numbers. */
export function table(headers, rows, { cls = "", num = [] } = {}) {
  return h(
    "table",
    { class: `grid ${cls}`.trim() },
    h(
      "thead",
      null,
      h(
        "tr",
        null,
        headers.map((x, i) => h("th", { class: num.includes(i) ? "num" : null }, x)),
      ),
    ),
    h("tbody", null, rows),
  );
}

export function message(text, kind = "muted") {
  return h("p", { class: kind }, text);
}
