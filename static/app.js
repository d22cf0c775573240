// SAKURA app: small conveniences on top of Gradio (loaded with `defer` from <head>).
(function () {
  "use strict";
  // User study: S = similar, N = not similar (ignored while typing in a field).
  document.addEventListener("keydown", function (ev) {
    const t = ev.target;
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.isContentEditable)) return;
    const key = ev.key.toLowerCase();
    const id = key === "s" ? "vote-similar" : key === "n" ? "vote-not-similar" : null;
    if (!id) return;
    const btn = document.getElementById(id);
    if (btn && !btn.disabled && btn.offsetParent !== null) { ev.preventDefault(); btn.click(); }
  });
  // Edit page: once an edit starts, bring the status and live timeline into view if they are below the fold.
  document.addEventListener("click", function (ev) {
    const btn = ev.target && ev.target.closest && ev.target.closest("#run-btn");
    if (!btn) return;
    setTimeout(function () {
      const st = document.getElementById("status");
      if (!st) return;
      const r = st.getBoundingClientRect();
      if (r.top > window.innerHeight * 0.6 || r.bottom < 0) st.scrollIntoView({ behavior: "smooth", block: "start" });
    }, 300);
  });
})();
