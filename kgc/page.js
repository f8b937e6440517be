// Shared by the pages kgc serve shows at / (kgc/linkpred/page.html, kgc/csts/page.html), served at /kgc.js.
const $ = (id) => document.getElementById(id);

// GET (no body) or POST JSON; a non-2xx answer throws an Error with the server's detail (e.data: its whole body).
async function call(path, body) {
  const opts = body === undefined ? {} :
    {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const r = await fetch(path, opts);
  const data = await r.json().catch(() => ({detail: r.statusText}));
  if (!r.ok) { const e = new Error(typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail));
               e.data = data; e.status = r.status; throw e; }
  return data;
}

// Resolves once GET /health says ready (onWait() each second before); throws the load error if loading failed.
async function waitReady(onWait) {
  for (;;) {
    const h = await (await fetch("/health")).json();
    if (h.status === "ready") return;
    if (h.status === "error") throw new Error(h.detail);
    if (onWait) onWait();
    await new Promise((ok) => setTimeout(ok, 1000));
  }
}
