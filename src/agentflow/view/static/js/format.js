// Numbers as people read them.

export const isNum = (x) => typeof x === "number" && Number.isFinite(x);

export function pct(x, digits = 1) {
  return isNum(x) ? `${(100 * x).toFixed(digits)}%` : "–";
}

export function signedPct(x) {
  return isNum(x) ? `${x >= 0 ? "+" : "−"}${Math.abs(100 * x).toFixed(1)}` : "–";
}

export function num(x, digits = 3) {
  if (!isNum(x)) return "–";
  if (Number.isInteger(x)) return x.toLocaleString();
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(2);
  return String(Number(x.toPrecision(digits)));
}

export function signed(x, digits = 2) {
  return isNum(x) ? `${x > 0 ? "+" : x < 0 ? "−" : "±"}${Math.abs(x).toFixed(digits)}` : "–";
}

export function secs(x) {
  if (!isNum(x)) return "–";
  if (x < 1) return `${Math.round(x * 1000)} ms`;
  if (x < 120) return `${x.toFixed(1)} s`;
  return `${Math.floor(x / 60)} min ${Math.round(x % 60)} s`;
}

export function int(x) {
  return isNum(x) ? Math.round(x).toLocaleString() : "–";
}

export function short(text, limit = 160) {
  text = String(text ?? "");
  return text.length > limit ? text.slice(0, limit) + "…" : text;
}

/** A gold answer as text: a list means any of them is right. */
export function goldText(gold) {
  if (typeof gold === "string") return gold;
  if (Array.isArray(gold) && gold.every((g) => typeof g === "string")) return gold.join(" | ");
  return gold === null || gold === undefined ? "" : JSON.stringify(gold);
}
