(function () {
  "use strict";
  var root = document.documentElement, every = Number(root.dataset.refresh || 5) * 1000;
  var button = document.getElementById("refresh"), stale = document.getElementById("stale");
  var paused = false;
  root.dataset.live = "on";
  button.hidden = false;
  button.addEventListener("click", function () {
    paused = !paused;
    button.setAttribute("aria-pressed", String(paused));
    button.textContent = paused ? "Resume refresh" : "Pause refresh";
  });
  setInterval(function () {
    if (paused || document.hidden) return;
    fetch(location.href, { cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (text) {
        var next = new DOMParser().parseFromString(text, "text/html");
        document.getElementById("live").replaceWith(next.getElementById("live"));
        document.title = next.title;
        stale.hidden = true;
      })
      .catch(function () { stale.hidden = false; });
  }, every);
})();
