// The participant's page: ask the server for the next pair, show it, send the answer, repeat.
(() => {
  const $ = (id) => document.getElementById(id);
  const yes = $("similar"), no = $("not-similar"), status = $("status"), bar = $("bar");
  let ticket = null, busy = false;

  function say(text) { status.textContent = text; }
  function enable(on) { yes.disabled = no.disabled = !on; }
  function load(img, src) {
    return new Promise((ok) => { img.onload = img.onerror = ok; img.src = src; });
  }

  async function next() {
    enable(false);
    ticket = null;
    let r;
    try { r = await fetch("/api/next", { headers: { accept: "application/json" } }); }
    catch (e) { say("The connection dropped; retrying…"); setTimeout(next, 3000); return; }
    const d = await r.json().catch(() => ({}));
    if (!r.ok) { say(d.error || "Something went wrong."); if (r.status === 401) location.href = "/"; return; }
    if (d.state === "preparing") { say(d.message); setTimeout(next, 5000); return; }
    if (d.state === "done") {
      bar.style.width = "100%";
      $("pair").style.display = "none";
      document.querySelector(".buttons").style.display = "none";
      say(`All ${d.total} answered — thank you! Your answers are saved; you can close this page.`);
      return;
    }
    await Promise.all([load($("left"), d.left), load($("right"), d.right)]);
    (d.prefetch || []).forEach((src) => { const i = new Image(); i.src = src; });
    ticket = d.ticket;
    bar.style.width = `${(100 * (d.position - 1)) / d.total}%`;
    say(`Pair ${d.position} of ${d.total}`);
    enable(true);
  }

  async function answer(similar) {
    if (!ticket || busy) return;
    busy = true;
    enable(false);
    try {
      const r = await fetch("/api/vote", {
        method: "POST", headers: { "content-type": "application/json", accept: "application/json" },
        body: JSON.stringify({ ticket, similar }),
      });
      if (!r.ok) {
        const d = await r.json().catch(() => ({}));
        if (r.status === 429) { say(d.error); enable(true); return; }
        say(d.error || "Your answer could not be saved.");
      }
      await next();
    } finally { busy = false; }
  }

  yes.addEventListener("click", () => answer(true));
  no.addEventListener("click", () => answer(false));
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT") return;
    if (e.key === "s" || e.key === "S") answer(true);
    if (e.key === "n" || e.key === "N") answer(false);
  });
  $("resume").addEventListener("focus", (e) => e.target.select());
  next();
})();
